"""Trainable seqio tasks: the shipped retrieval T5's synthetic training data (`train_data`).

Imported by gin/t5x/finetune.gin (not by `seqio_tasks`, which imports nothing of t5align but
its vocabularies).

Registered (with seqio) as
  t5align_train_retrieval   the shipped model's mixture (gin/runs/train_retrieval.gin's MIX)
  t5align_train_passkey     passkey retrieval, plain and with decoys
  t5align_train_lines       line retrieval (LongEval's prompt)
  t5align_train_kv          key-value retrieval (Lost in the Middle's prompt)
each with the splits
  'train'       an endless stream: example i is `train_data.train_example(vocab, mix, seed, i)`,
                inputs filled to a budget of at most `input_length` tokens (with EOS), skewed to
                short ones by `length_power`, with at least `min_units` lines / key-value pairs,
                as the shipped model was trained;
  'validation'  `validation_examples` held-out examples per task at `input_length` tokens.
Shuffled with a buffer of SHUFFLE_BUFFER_SIZE examples when a split is read with shuffle=True
(t5x.train does); the seqio seed then also picks where the 'train' stream starts, so each run
sees other examples (t5x's finetune.gin passes seed None: a new one per run).

Examples are text ('inputs', 'targets') tokenized by seqio with the tasks' vocabulary
(`seqio_tasks.vocabulary_path`), whose token counts also size the inputs: use the vocabulary of
the model being trained (gin/t5x/finetune.gin sets the shipped one).
"""
from __future__ import annotations

import json
from typing import Iterator

import gin
import numpy as np
import seqio
import tensorflow as tf

from seqio_tasks import catalog
from seqio_tasks import metrics
from seqio_tasks import tasks

SHUFFLE_BUFFER_SIZE = 1000
# Task name (without the prefix) -> train_data mixture weights ('lines_near' is training-only:
# it has no validation examples).
MIXES = {
    'train_retrieval': {'passkey': 0.5, 'passkey_decoys': 0.5, 'lines': 3.0, 'lines_near': 2.0,
                        'kv': 1.5},
    'train_passkey': {'passkey': 1.0, 'passkey_decoys': 1.0},
    'train_lines': {'lines': 1.0, 'lines_near': 1.0},
    'train_kv': {'kv': 1.0},
}
# The shipped model's fewest lines / key-value pairs per training example (`train_data.Mix`).
MIN_UNITS = {'lines': 2, 'lines_near': 2, 'kv': 2}
_VALIDATION_SEED = 1000  # As gin/runs/train_retrieval.gin's eval_seed: not a training stream.


@gin.configurable(module='seqio_tasks')
def training_options(*, seed: int = 0, input_length: int = 256, length_power: float = 2.0,
                     min_units: dict | None = None, validation_examples: int = 50) -> dict:
  """The training tasks' stream seed, input budget (L_tr), length skew, fewest units per task
  (None: `MIN_UNITS`, the shipped model's) and validation size."""
  return dict(seed=seed, input_length=input_length, length_power=length_power,
              min_units=dict(MIN_UNITS if min_units is None else min_units),
              validation_examples=validation_examples)


def _examples(name: str, split: str, start: int) -> Iterator[dict]:
  from t5align.shipped import train_data  # pylint: disable=g-import-not-at-top
  opts = training_options()
  vocab = tasks.VOCABULARY  # seqio's: `encode(text)` and `eos_id`, as train_data needs.
  weights = MIXES[name]
  if split == 'train':
    mix = train_data.Mix(weights, length_power=opts['length_power'], min_units=opts['min_units'])
    index = start
    while True:
      yield _record(name, index, train_data.train_example(vocab, mix, opts['seed'], index,
                                                          max_length=opts['input_length']))
      index += 1
  for task in (t for t in train_data.TASKS if t in weights):
    for i, ex in enumerate(train_data.eval_examples(
        task, vocab, opts['input_length'], opts['validation_examples'], _VALIDATION_SEED)):
      yield _record(f'{name}/{task}', i, ex)


def _record(prefix: str, index: int, ex) -> dict:
  from t5align.shipped import train_data  # pylint: disable=g-import-not-at-top
  meta = dict(ex.meta, family=train_data.FAMILY[ex.task])
  return {'id': f'{prefix}/{index}', 'inputs': ex.inputs, 'targets': ex.targets,
          'meta': json.dumps(meta)}


def accuracy(targets, predictions) -> dict[str, float]:
  """seqio metric: % of examples right, each scored by its own family (`meta['family']`)."""
  scores = [metrics.score_example(t['meta']['family'], t, p)['accuracy']
            for t, p in zip(targets, predictions)]
  return {'accuracy': 100.0 * float(np.mean(scores))}


def _dataset_fn(name: str):
  def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
    del shuffle_files  # One generated source; seqio's shuffle buffer mixes the examples.
    if split not in ('train', 'validation'):
      raise ValueError(f"{catalog.PREFIX}{name} has splits 'train' and 'validation'; got "
                       f'{split!r}.')
    # A seeded start in the endless stream, so runs with different seeds see other examples.
    start = 0 if seed is None or split != 'train' else int(
        np.random.default_rng(seed).integers(0, 2**31))
    text = tf.TensorSpec([], tf.string)
    return tf.data.Dataset.from_generator(
        lambda: _examples(name, split, start),
        output_signature={'id': text, 'inputs': text, 'targets': text, 'meta': text})
  return dataset_fn


def register() -> None:
  """Adds the training tasks that are not registered yet."""
  present = set(seqio.TaskRegistry.names())
  for name in MIXES:
    if catalog.PREFIX + name in present:
      continue
    seqio.TaskRegistry.add(
        catalog.PREFIX + name,
        source=seqio.FunctionDataSource(_dataset_fn(name), splits=['train', 'validation']),
        preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
        output_features=tasks.output_features(),
        postprocess_fn=metrics.postprocess,
        metric_fns=[accuracy],
        shuffle_buffer_size=SHUFFLE_BUFFER_SIZE)


register()
