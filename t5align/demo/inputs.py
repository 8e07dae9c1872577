"""The demo's inputs: each task's held-out prompts filled to a length, drawn with the seeds of
the calibration samples (`CALIBRATION_SEED`) or of the evaluation examples (`EVAL_SEED`, never
the same); `task_calibration_inputs` pairs them as the per-task calibration takes them.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from t5align.runtime import batching
from t5align.shipped import train_data

CALIBRATION_SEED = 7  # Calibration samples and evaluation examples never share a seed.
EVAL_SEED = 2000


def calibration_tokens(vocab, length: int, per_task: int, seed: int = CALIBRATION_SEED
                       ) -> np.ndarray:
  """`[tasks * per_task, length]` int32 held-out prompts of every task filled to `length`.

  A prompt fills to at most `length` tokens (whole sentences/records); the rest is padding.
  """
  return np.concatenate([task_prompts(vocab, task, length, per_task, seed)
                         for task in train_data.TASKS])


def task_prompts(vocab, task: str, length: int, count: int, seed: int = CALIBRATION_SEED
                 ) -> np.ndarray:
  """`[count, length]` int32: a task's held-out prompts filled to `length` (0-padded)."""
  rows = [ex.input_ids for ex in train_data.eval_examples(task, vocab, length, count, seed)]
  return batching.pad_tokens(rows, multiple=length, min_length=length)


def task_calibration_inputs(vocab, task: str, lengths: Sequence[int], reference_length: int,
                            per_task: int | Mapping[int, int], seed: int = CALIBRATION_SEED,
                            num_references: int | None = None) -> list[tuple]:
  """Per length L_ex: (`[n_L, L_ex]` the task's held-out prompts filled to L_ex,
  `[n_ref, L_tr]` the same task's prompts at L_tr), for `calibration.calibrate_tasks`: the
  paper's per-task calibration, its L_tr reference being the task at its training length.

  `per_task`: n_L, one count for every length or {L_ex: count}; `num_references`: n_ref
  (default: `per_task` if it is one count).
  """
  counts = per_task if isinstance(per_task, Mapping) else {L: per_task for L in lengths}
  if num_references is None:
    if isinstance(per_task, Mapping):
      raise ValueError('num_references is needed when per_task is a mapping.')
    num_references = per_task
  reference = task_prompts(vocab, task, reference_length, num_references, seed)
  return [(task_prompts(vocab, task, L, counts[L], seed), reference) for L in lengths]
