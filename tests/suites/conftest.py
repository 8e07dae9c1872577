"""Fixtures the suites' test modules share: seqio with the tasks registered on the shipped
vocabulary, and TFDS' `scrolls` mocked to read given rows (SCROLLS has no files of its own)."""
from __future__ import annotations

import pathlib

import pytest

from seqio_tasks import scrolls

SHIPPED_VOCABULARY = (pathlib.Path(__file__).resolve().parents[2] / 't5align' / 'shipped'
                      / 'retrieval_t5' / 'sentencepiece.model')


@pytest.fixture
def seqio_env(monkeypatch):
  """seqio with the tasks registered on the shipped vocabulary, and no TFDS builder memoized
  from another test."""
  seqio = pytest.importorskip('seqio')
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(SHIPPED_VOCABULARY))
  monkeypatch.setattr(seqio.utils.LazyTfdsLoader, '_MEMOIZED_BUILDERS', {})
  from seqio_tasks import tasks  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  return seqio


@pytest.fixture
def mock_scrolls(seqio_env):
  """`mock_scrolls({(config, split): rows})`: TFDS `scrolls` mocked to read those rows."""
  tf = pytest.importorskip('tensorflow')
  tfds = pytest.importorskip('tensorflow_datasets')
  seen = []

  def start(rows_by_split):
    def as_dataset(builder, split, **kwargs):
      del kwargs
      key = (builder.builder_config.name, str(split))
      seen.append((builder.name, str(builder.version), *key))
      rows = rows_by_split[key]
      return tf.data.Dataset.from_generator(
          lambda: iter(rows),
          output_signature={k: tf.TensorSpec([], tf.string) for k in scrolls.FEATURES})
    return tfds.testing.mock_data(as_dataset_fn=as_dataset,
                                  policy=tfds.testing.MockPolicy.USE_CODE)
  start.seen = seen
  return start
