"""MODEL_DIR/train_log.jsonl: a training run's records (losses every LOG_EVERY steps, resumes,
skips, held-out results), appended and logged, read back over every run segment, and cut back
to the last checkpoint when a killed run resumes."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

from absl import logging

from t5align.runtime import fileio

FILE = 'train_log.jsonl'


def path(model_dir: str) -> str:
  """MODEL_DIR/train_log.jsonl."""
  return os.path.join(model_dir, FILE)


def append(model_dir: str, record: Mapping[str, Any]) -> None:
  """Appends `record` as one JSON line and logs that line (INFO)."""
  line = json.dumps(record, sort_keys=True)
  logging.info('%s', line)
  with open(path(model_dir), 'a') as f:
    f.write(line + '\n')


def drop_steps_after(model_dir: str, step: int) -> None:
  """Rewrites train_log.jsonl without the records of steps after `step` (a killed run's, after
  its last checkpoint, which this run trains again), so no step is logged twice."""
  file = path(model_dir)
  if not os.path.exists(file):
    return
  with open(file, encoding='utf-8') as f:
    lines = f.read().splitlines()
  kept = [line for line in lines if json.loads(line).get('step', 0) <= step]
  if len(kept) < len(lines):
    fileio.write_atomic(file, ''.join(line + '\n' for line in kept))
    logging.info('%s: dropped %d record(s) of steps after %d (the last checkpoint), trained '
                 'again now', file, len(lines) - len(kept), step)


def logged_training(model_dir: str) -> dict[str, float]:
  """From train_log.jsonl, over every run segment (resumes included): the last logged 'loss' and
  'token_accuracy', and 'loop_s', the training loop's wall time (each record's mean step time
  times the steps it covers)."""
  out = {'loss': float('nan'), 'token_accuracy': float('nan'), 'loop_s': 0.0}
  file = path(model_dir)
  if not os.path.exists(file):
    return out
  previous = 0
  with open(file, encoding='utf-8') as f:
    for n, line in enumerate(f, 1):
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f'{file}:{n}: not a JSON record ({e}).') from e
      if record.get('event') == 'resume':
        previous = record['step']
      elif 'loss' in record and 'step' in record:
        out['loop_s'] += record['step_s'] * (record['step'] - previous)
        out['loss'], out['token_accuracy'] = record['loss'], record['token_accuracy']
        previous = record['step']
  return out


def logged_trimming(model_dir: str) -> dict[str, int]:
  """From train_log.jsonl (every segment): how many examples fine-tuning cut to the feature
  lengths, {'inputs', 'targets', 'examples'} (an example counts once whatever it lost)."""
  out = {'inputs': 0, 'targets': 0, 'examples': 0}
  file = path(model_dir)
  if os.path.exists(file):
    with open(file, encoding='utf-8') as f:
      for line in f:
        record = json.loads(line)
        for key in out:
          out[key] += int(record.get(f'{key}_trimmed', 0))
  return out
