"""Folded into `t5align.vocabularies` (one `Vocabulary`, one `decode`); the former names stay
importable from here for callers not yet moved (`from t5align import vocab`)."""
from __future__ import annotations

from t5align import vocabularies
from t5align.vocabularies import EOS_ID
from t5align.vocabularies import PAD_ID
from t5align.vocabularies import train_sentencepiece

__all__ = ['EOS_ID', 'PAD_ID', 'UNK_ID', 'Vocabulary', 'train_sentencepiece']
UNK_ID = vocabularies.UNK_ID


class Vocabulary(vocabularies.SentencePieceVocabulary):
  """`vocabularies.SentencePieceVocabulary(path, t5_ids=True)`, under its former name."""

  def __init__(self, path: str):
    super().__init__(path, t5_ids=True)
