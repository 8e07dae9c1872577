"""A small SentencePiece vocabulary: training from text, T5's special ids (pad 0, eos 1, unk 2)."""
from __future__ import annotations

import io
from typing import Iterable, Sequence

import sentencepiece as spm

from t5align import fileio

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2


class Vocabulary:
  """SentencePiece model with T5's conventions; `encode` adds no EOS (callers append it).

  Satisfies `seqio_tasks.catalog.Tokenizer` (`encode(text) -> ids`, `eos_id`).
  """

  pad_id = PAD_ID
  eos_id = EOS_ID
  unk_id = UNK_ID

  def __init__(self, path: str):
    self.path = str(path)
    self._sp = spm.SentencePieceProcessor(model_file=self.path)
    ids = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id())
    if ids != (PAD_ID, EOS_ID, UNK_ID):
      raise ValueError(f'{self.path}: (pad, eos, unk) ids are {ids}; T5 needs '
                       f'{(PAD_ID, EOS_ID, UNK_ID)}.')

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def decode(self, ids: Sequence[int]) -> str:
    """Decodes up to the first EOS; padding (0) is dropped, ids past the vocabulary (a model's
    embedding rows are rounded up, e.g. to 1024) read as unk."""
    out = []
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i != PAD_ID:
        out.append(i if i < self.vocab_size else UNK_ID)
    return self._sp.decode(out)


def train_sentencepiece(texts: Iterable[str], path: str, vocab_size: int) -> Vocabulary:
  """Trains a BPE SentencePiece model on `texts` and writes it to `path` atomically.

  Digits are split (`split_digits=True`) so a model copies numbers digit by digit; every character
  of `texts` is covered. Training is deterministic for the same texts (one thread, no sampling).
  NOTE: BPE, not T5's unigram: on prompt text dominated by filler and hex digits, unigram keeps
  the rarer instruction words in pieces (227 vs 129 tokens for the smallest line-retrieval
  prompt), which would leave little of a 256-token budget for the retrieval content.

  Args:
    texts: training sentences (each is one line of the trainer's input; newlines become spaces,
      as SentencePiece's default normalization does to any input).
    path: where to write the `.model` file.
    vocab_size: upper bound on the number of pieces (fewer if the text has fewer).

  Returns:
    The trained `Vocabulary`.
  """
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=(t.replace('\n', ' ') for t in texts), model_writer=model,
      vocab_size=vocab_size, hard_vocab_limit=False, model_type='bpe',
      character_coverage=1.0, split_digits=True, pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID,
      bos_id=-1, num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
      max_sentence_length=1 << 16, minloglevel=2)
  fileio.write_atomic(path, model.getvalue())
  return Vocabulary(path)
