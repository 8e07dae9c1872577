"""Fine-tuning data: fixed-shape batches from a seqio task's or mixture's 'train' split, cut to
the feature lengths as seqio cuts them for t5x (`trim`), the cut examples counted.

seqio is imported inside functions only.
"""
from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np

from t5align import run_identity
from t5align.shipped import train_data

FEATURES = ('inputs', 'targets')


def _unwrapped(fn: Any) -> Any:
  while isinstance(fn, functools.partial):
    fn = fn.func
  return fn


def _eos_after_trim(task: Any, name: str) -> bool:
  """Whether seqio, given feature lengths, cuts `task`'s features keeping EOS last (its
  preprocessors hold `append_eos_after_trim`) rather than at the length (`append_eos`, or none).

  Raises:
    ValueError: for a preprocessor (other than append_eos_after_trim) that takes the feature
      lengths (span corruption, packing): `SeqioBatches` reads the task without them.
  """
  import seqio  # pylint: disable=g-import-not-at-top
  import inspect  # pylint: disable=g-import-not-at-top
  after = False
  for p in task.preprocessors:
    fn = _unwrapped(p)
    if fn is seqio.preprocessors.append_eos_after_trim:
      after = True
    elif callable(p) and not isinstance(p, seqio.CacheDatasetPlaceholder):
      try:
        parameters = inspect.signature(p).parameters
      except (TypeError, ValueError):
        continue
      if 'sequence_length' in parameters:
        raise ValueError(
            f'MIXTURE_OR_TASK_NAME={name!r}: task {task.name!r} has the preprocessor '
            f'{getattr(fn, "__name__", fn)!r}, which depends on the feature lengths; t5align.train '
            'reads a task without them (to count what the lengths cut) and cuts afterwards, as '
            'seqio does, which covers tokenize/append_eos(_after_trim) tasks only. Fine-tune '
            'this one with t5x.train (gin/t5x/finetune.gin).')
  return after


def trim(tokens: np.ndarray, length: int, eos_id: int | None) -> tuple[np.ndarray, bool]:
  """seqio's cut of one feature at `length` (what t5x trains on): with `eos_id` (the task appends
  EOS after trimming) the first `length` - 1 tokens and EOS, else the first `length`.

  Returns:
    (tokens int32 `[<= length]`, whether anything was cut).
  """
  tokens = np.asarray(tokens, np.int32)  # [n]
  if len(tokens) <= length:
    return tokens, False
  if eos_id is None:
    return tokens[:length], True
  return np.concatenate([tokens[:length - 1], np.asarray([eos_id], np.int32)]), True


class SeqioBatches:
  """Fixed-shape training batches from a seqio task's or mixture's 'train' split.

  The stream is seqio's, as t5x.train reads it: `get_dataset(split='train', shuffle=True,
  seed=seed, num_epochs=None)` (TFDS file order and seqio's shuffle buffer seeded, a mixture's
  sampling by its rates seeded; tf.data is deterministic), so run k's example i is the same in
  every run with that seed. A run resuming at step s skips the first s * batch_size examples
  (`start`): they are read and preprocessed again, not trained on (the time is logged).
  NOTE: chosen over a stateless index order, which would need the whole split tokenized in memory
  up front (NarrativeQA's books) and a reimplementation of seqio's mixing.

  Each example's 'inputs' and 'targets' are cut to `input_length` / `target_length` as seqio cuts
  them for t5x (`trim`: feature lengths trim, they do not refuse), and the cut examples counted
  (`trimmed`); batches are padded to `[batch_size, input_length]` / `[batch_size,
  target_length]` (one shape: one compilation), decoder inputs the targets shifted right.
  """

  def __init__(self, name: str, *, seed: int, batch_size: int, input_length: int,
               target_length: int):
    import seqio  # pylint: disable=g-import-not-at-top
    import seqio_tasks  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
    try:
      self.provider = seqio.get_mixture_or_task(name)
    except ValueError as e:
      raise ValueError(
          f'MIXTURE_OR_TASK_NAME={name!r}: no such seqio task or mixture ({e}). Tasks are '
          "seqio_tasks' and those of the modules the gin files import (gin/runs/finetune.gin "
          'imports t5align.shipped.seqio_training: t5align_train_*); import the module that '
          'registers yours there, as t5x.train does with MIXTURE_OR_TASK_MODULE.') from e
    self.name, self.batch_size = name, batch_size
    self.lengths = {'inputs': input_length, 'targets': target_length}
    tasks = seqio.get_subtasks(self.provider)
    features = self.provider.output_features
    missing = [k for k in FEATURES if k not in features]
    if missing:
      raise ValueError(f'MIXTURE_OR_TASK_NAME={name!r}: no output feature(s) {missing} (it has '
                       f'{sorted(features)}); t5align.train fine-tunes encoder-decoder tasks.')
    no_train = [t.name for t in tasks if 'train' not in t.splits]
    if no_train:
      raise ValueError(f'MIXTURE_OR_TASK_NAME={name!r}: task(s) {no_train} have no train split.')
    self.vocabulary = features['targets'].vocabulary
    inputs_vocabulary = features['inputs'].vocabulary
    if inputs_vocabulary is not self.vocabulary and (run_identity.vocabulary_files(
        inputs_vocabulary) != run_identity.vocabulary_files(self.vocabulary)):
      raise ValueError(f'MIXTURE_OR_TASK_NAME={name!r}: its inputs and targets have different '
                       'vocabularies; the model shares one embedding.')
    rules = {_eos_after_trim(t, name) for t in tasks}
    if len(rules) > 1:
      raise ValueError(f'MIXTURE_OR_TASK_NAME={name!r}: its tasks cut features differently '
                       '(some append EOS after trimming, some do not).')
    after = rules.pop()
    self.eos = {k: self.vocabulary.eos_id if after and features[k].add_eos else None
                for k in FEATURES}
    self.trimmed = {'inputs': 0, 'targets': 0, 'examples': 0}
    self.seed, self.skipped, self._examples = seed, 0, None

  def start(self, step: int) -> 'SeqioBatches':
    """Opens the stream at training step `step` (its first `step` * batch_size examples are
    skipped lazily: the first batch reads them)."""
    # No feature lengths: untrimmed tokens, cut here (`trim`) to count what is cut.
    dataset = self.provider.get_dataset(
        None, split='train', shuffle=True, seed=self.seed, num_epochs=None,
        trim_output_features=False, try_in_mem_cache=False)
    self.skipped = step * self.batch_size
    self._examples = dataset.skip(self.skipped).as_numpy_iterator()
    return self

  def _example(self) -> Any:
    example = next(self._examples)
    out, cut = {}, False
    for key in FEATURES:
      out[key], was_cut = trim(example[key], self.lengths[key], self.eos[key])
      self.trimmed[key] += was_cut
      cut |= was_cut
    self.trimmed['examples'] += cut
    return types.SimpleNamespace(input_ids=out['inputs'], target_ids=out['targets'],
                                 task=self.name)

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    """int32 {'encoder_input_tokens': `[batch_size, input_length]`, 'decoder_input_tokens',
    'decoder_target_tokens': `[batch_size, target_length]`}, 0 = padding."""
    examples = [self._example() for _ in range(self.batch_size)]
    return train_data.batch_arrays(examples, self.lengths['inputs'], self.lengths['targets'])
