"""Runs one NVIDIA/RULER script with only its tokenizer selection replaced (golden samples).

RULER's scripts do `from tokenizer import select_tokenizer`; this registers a module `tokenizer`
whose `select_tokenizer(type, path)` returns a SentencePiece wrapper over the .model file at
`path` whose `text_to_tokens` is `encode_as_pieces`: what RULER's 'nemo' type (NeMo's
SentencePieceTokenizer) returns, without NeMo. Everything else runs as upstream wrote it.
Usage (as `python` on PATH, so that prepare.py's `python {script} ...` comes here):
  python ruler_shim.py SCRIPT ARGS...
$RULER_SHIM_TIMEOUT (seconds, default 0: none) ends a script that upstream would run forever.
"""
import os
import runpy
import signal
import sys
import types

import sentencepiece


class _SentencePiece:

  def __init__(self, model_path):
    self.tokenizer = sentencepiece.SentencePieceProcessor(model_file=model_path)

  def text_to_tokens(self, text):
    return self.tokenizer.encode_as_pieces(text)

  def tokens_to_text(self, tokens):
    return self.tokenizer.decode_pieces(tokens)


def select_tokenizer(tokenizer_type, tokenizer_path):
  del tokenizer_type
  return _SentencePiece(tokenizer_path)


def main():
  signal.alarm(int(os.environ.get('RULER_SHIM_TIMEOUT', '0')))
  module = types.ModuleType('tokenizer')
  module.select_tokenizer = select_tokenizer
  sys.modules['tokenizer'] = module
  script = sys.argv[1]
  sys.argv = sys.argv[1:]
  sys.path.insert(0, os.path.dirname(script))  # as `python SCRIPT` puts the script's folder
  runpy.run_path(script, run_name='__main__')


if __name__ == '__main__':
  main()
