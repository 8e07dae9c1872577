"""seqio_tasks.tasks.ConfiguredVocabulary: equal vocabularies hash equal (Python's hash/eq
contract)."""
from __future__ import annotations

import pytest

from t5align import vocabularies

pytestmark = pytest.mark.tensorflow

seqio = pytest.importorskip('seqio')


@pytest.fixture
def tasks():
  from seqio_tasks import tasks as module  # pylint: disable=g-import-not-at-top
  return module


def test_sentencepiece_path_equal_instances_hash_equal(tasks, monkeypatch, tmp_path):
  monkeypatch.setenv(tasks.ENV_VOCABULARY, str(tmp_path / 'a.model'))  # Never opened here.
  one, two = tasks.ConfiguredVocabulary(), tasks.ConfiguredVocabulary()
  assert one == two and hash(one) == hash(two)
  assert len({one, two}) == 1
  assert one == seqio.SentencePieceVocabulary(str(tmp_path / 'a.model'))
  before = hash(one)
  monkeypatch.setenv(tasks.ENV_VOCABULARY, str(tmp_path / 'b.model'))
  assert one == two and hash(one) == hash(two) != before  # Both follow the path in use.
  assert one != seqio.SentencePieceVocabulary(str(tmp_path / 'a.model'))


def test_hf_tokenizer_path_equal_instances_hash_equal(tasks, monkeypatch, tmp_path):
  from model.vocabularies_test import train_bpe  # pylint: disable=g-import-not-at-top
  path = train_bpe(tmp_path / 'bpe')['json']
  monkeypatch.setenv(tasks.ENV_VOCABULARY, path)
  one, two = tasks.ConfiguredVocabulary(), tasks.ConfiguredVocabulary()
  assert one == one and one == two and hash(one) == hash(two)
  delegate = vocabularies.as_seqio(vocabularies.load_vocabulary(path))
  assert one == delegate and hash(one) == hash(delegate)
