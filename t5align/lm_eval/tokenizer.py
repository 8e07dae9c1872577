"""The lm-eval model's tokenizer: a HuggingFace tokenizer (what lm-eval's hf backend runs, through
`transformers.AutoTokenizer`) or a SentencePiece model (t5x's vocabularies), behind the calls
lm-eval's `TemplateLM` makes, with HF's rules for special tokens (`load`)."""
from __future__ import annotations

import os
from typing import Any, Sequence

from t5align.lm_eval import sources
from t5align import vocabularies


class Tokenizer:
  """What the model needs of a tokenizer: `encode` (with EOS unless told not to, as HF's T5
  tokenizers add it), `decode` (special tokens dropped), the EOS / BOS ids, and how many ids it
  can produce (`size`, checked against the checkpoint's embedding rows)."""

  name: str
  eos_id: int
  bos_id: int | None
  pad_id: int
  size: int

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    raise NotImplementedError

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    raise NotImplementedError


class HuggingFaceTokenizer(Tokenizer):
  """A `transformers` tokenizer (a folder or a hub id), called as lm-eval's hf backend calls
  it."""

  def __init__(self, name: str, revision: str | None = None):
    try:
      import transformers  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError(f'tokenizer {name} is a HuggingFace tokenizer, which needs transformers: '
                        "pip install 't5align[lm_eval]'.") from e
    self.name = name
    try:
      self._tok = transformers.AutoTokenizer.from_pretrained(
          name, **({'revision': revision} if revision else {}))
    except (OSError, ValueError) as e:
      raise ValueError(f'tokenizer {name}: transformers cannot load it as a tokenizer ({e}).'
                       ) from e
    if self._tok.eos_token_id is None:
      raise ValueError(f'tokenizer {name} has no EOS token, which T5 ends its inputs and its '
                       'generations with.')
    self.eos_id = int(self._tok.eos_token_id)
    self.bos_id = None if self._tok.bos_token_id is None else int(self._tok.bos_token_id)
    self.pad_id = int(self._tok.pad_token_id if self._tok.pad_token_id is not None else 0)
    self.size = len(self._tok)

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model (`vocabularies.SentencePieceVocabulary`): encoding appends EOS, as
  HF's T5 tokenizer does; decoding drops padding and ends at EOS."""

  def __init__(self, path: str):
    self.name = path
    self._vocab = vocabularies.SentencePieceVocabulary(path, what='tokenizer')
    self.eos_id, self.bos_id, self.pad_id = self._vocab.eos_id, None, self._vocab.pad_id
    self.size = self._vocab.vocab_size

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    return self._vocab.encode(text) + ([self.eos_id] if add_special_tokens else [])

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    if skip_special_tokens:
      return self._vocab.decode(ids)
    return self._vocab._sp.decode([int(i) for i in ids])  # pylint: disable=protected-access

  @property
  def vocabulary(self) -> vocabularies.Vocabulary:
    return self._vocab


def load(spec: str | None, checkpoint: str, revision: str | None = None) -> Tokenizer:
  """The tokenizer `spec` names (None: the checkpoint's own, `sources.own_tokenizer`): a
  SentencePiece model file, an HF tokenizer folder, or a hub id.

  Raises:
    ValueError: no tokenizer given and the checkpoint carries none; a file of no known form.
  """
  if spec is None:
    spec = sources.own_tokenizer(checkpoint)
    if spec is None:
      raise ValueError(
          f'pretrained={checkpoint} carries no tokenizer (no HF tokenizer files, no '
          f'{sources.SENTENCEPIECE_FILE} beside it): pass tokenizer=, e.g. the SentencePiece '
          'model it was trained with (Flan-T5: '
          'gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model, copied locally) or '
          'an HF tokenizer (google/flan-t5-xl).')
  if os.path.isfile(spec):
    if spec.endswith('.json'):
      spec = os.path.dirname(os.path.abspath(spec)) or '.'
    else:
      return SentencePieceTokenizer(spec)
  if os.path.isdir(spec) and not any(
      os.path.isfile(os.path.join(spec, n)) for n in sources.HF_TOKENIZER_FILES):
    models = sorted(n for n in os.listdir(spec) if n.endswith('.model'))
    if len(models) != 1:
      raise ValueError(f'tokenizer {spec} is a folder with neither an HF tokenizer '
                       f'({", ".join(sources.HF_TOKENIZER_FILES)}) nor one SentencePiece '
                       f'*.model (it has {sorted(os.listdir(spec))[:20]}).')
    return SentencePieceTokenizer(os.path.join(spec, models[0]))
  if not os.path.isdir(spec) and not sources.is_hub_id(spec):
    raise FileNotFoundError(f'tokenizer={spec!r}: no such file or folder, nor a hub id.')
  return HuggingFaceTokenizer(spec, revision)


def describe(tokenizer: Tokenizer) -> dict[str, Any]:
  """The tokenizer, for lm-eval's results."""
  return {'tokenizer': tokenizer.name, 'tokenizer_kind': type(tokenizer).__name__,
          'tokenizer_size': tokenizer.size, 'eos_id': tokenizer.eos_id}
