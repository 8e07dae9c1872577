"""The demo's output folder and what makes it resumable: its lock (`claim_outputs`), results.json
saved cell by cell (`Results`, refusing the results of another run), the predictions of each
evaluated cell, the run identity that decides whether a saved schedule.json is reused, and the
calibrations finished before schedule.json is written (`calibration_progress`, as calibrate keeps
them).
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from t5align import calibration
from t5align import network
from t5align import run_identity
from t5align import schedule as schedule_lib
from t5align.demo import planning
from t5align.runtime import fileio
from t5align.runtime import multihost
from t5align.runtime import outputs
from t5align.shipped import assets


@contextlib.contextmanager
def claim_outputs(output_dir: str):
  """Locks the output folder and its schedule.json with the per-file lock calibrate takes on
  its OUTPUT_PATH, so a calibration writing the same file and the demo exclude each other."""
  with outputs.claim(output_dir, '--output_dir'), outputs.claim(
      os.path.join(output_dir, 'schedule.json'), '--output_dir schedule.json', is_file=True):
    yield


class Results:
  """results.json: settings plus one accuracy cell per (row, task, length), saved as it grows."""

  def __init__(self, path: str, settings: Mapping[str, Any]):
    self.path = path
    settings = json.loads(json.dumps(settings))
    self.data = multihost.read_on_writer(lambda: self._read(settings), f'reading {path}')

  def _read(self, settings: Mapping[str, Any]) -> dict[str, Any]:
    if not fileio.exists(self.path):
      return {'settings': settings, 'accuracy': {}}
    old = outputs.read_json(self.path, 'demo results')
    if not isinstance(old, dict) or not isinstance(old.get('accuracy'), dict):
      raise ValueError(f'demo results {self.path} lack an "accuracy" object; delete the file to '
                       'start over.')
    # The settings hold the run identity: the model's and vocabulary's content, not their paths.
    run_identity.check_same(old.get('settings'), settings, kind='demo',
                            what=f'demo results {self.path}',
                            hint='Use another --output_dir, or delete it to start over.',
                            ignore=(*run_identity.INFORMATIONAL, 'model_dir'),
                            checkpoint_setting='--model_dir')
    return old

  def _save(self) -> None:
    multihost.on_writer(lambda: fileio.write_json_atomic(self.path, self.data, sort_keys=False),
                        f'writing {self.path}')

  def get(self, row: str, task: str, length: int) -> float | None:
    return self.data['accuracy'].get(row, {}).get(task, {}).get(str(length))

  def put(self, row: str, task: str, length: int, value: float) -> None:
    self.put_cells([(row, task, length, value)])

  def put_cells(self, cells: Sequence[tuple[str, str, int, float]]) -> None:
    """Stores (row, task, length, accuracy) cells; one write of the file for all of them."""
    for row, task, length, value in cells:
      self.data['accuracy'].setdefault(row, {}).setdefault(task, {})[str(length)] = value
    self._save()

  def put_section(self, key: str, value: Any) -> None:
    self.data[key] = value
    self._save()


def predictions_path(output_dir: str, row: str, length: int, task: str) -> str:
  """predictions/<row>_<length>_<task>.jsonl: an evaluated cell's per-example records."""
  return os.path.join(output_dir, 'predictions', f'{row}_{length}_{task}.jsonl')


def write_predictions(output_dir: str, row: str, length: int,
                      records: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
  """One JSONL file per (row, length, task) cell, written atomically (`heldout` records)."""
  def write():
    for task, items in records.items():
      path = predictions_path(output_dir, row, length, task)
      fileio.makedirs(os.path.dirname(path))
      fileio.write_atomic(path, ''.join(json.dumps(r, sort_keys=True) + '\n' for r in items))
  multihost.on_writer(write, f'writing {output_dir}/predictions')


def copy_predictions(output_dir: str, source_row: str, row: str, length: int,
                     task: str) -> None:
  """A cell evaluated once for two rows (the same temperature and bias rule): `row`'s file is
  `source_row`'s, so every row of a cell has its per-example records (paired comparisons read
  them: benchmarks/ranking.py)."""
  def write():
    source = predictions_path(output_dir, source_row, length, task)
    fileio.write_atomic(predictions_path(output_dir, row, length, task),
                        fileio.read_bytes(source))
  multihost.on_writer(write, f'writing {output_dir}/predictions')


def calibration_identity(settings: planning.DemoSettings, plan: planning.Plan,
                         config: network.T5Config, prompts, references) -> dict[str, Any]:
  """The run identity of a calibration (`run_identity.make`): the checkpoint's and vocabulary's
  content fingerprints, lengths, strategies, tasks, the prompts (counts, seeds and a fingerprint
  of their tokens), dtypes and the attention implementation."""
  tokens = [x for p, r in zip(prompts, references) for task in plan.tuned_tasks
            for x in (*p[task].values(), r[task])]
  return run_identity.make(
      checkpoint=assets.checkpoint_dir(settings.model_dir),
      vocabulary=os.path.join(settings.model_dir, assets.VOCAB_FILE), facts={
          'reference_length': plan.reference_length, 'lengths': list(plan.lengths),
          'strategies': list(plan.strategies), 'tasks': list(plan.tuned_tasks),
          'pooled_strategies': list(plan.pooled),
          'prompts_per_length': {str(L): n for L, n in plan.samples.items()},
          'num_references': plan.num_references, 'seeds': list(plan.seeds),
          'prompts_sha256': run_identity.array_fingerprint(tokens),
          'dtype': np.dtype(config.dtype).name, 'params_dtype': 'float32',
          'attention_impl': settings.attention_impl})


def reusable_schedule(path: str, saved: Mapping[str, Any], identity: Mapping[str, Any],
                      log: Callable[[str], None]) -> schedule_lib.TemperatureSchedule | None:
  """The schedule saved at `path` if its provenance's run identity ('identity') is `identity`
  (`run_identity.check_same`: checkpoint and vocabulary content, lengths, strategies, tasks,
  prompts, seeds, dtypes, attention); else None, after logging each differing field (the caller
  recalibrates and replaces it)."""
  recorded = (saved.get('provenance') or {}).get('identity')
  try:
    run_identity.check_same(recorded, identity, kind='demo',
                            what=f'temperature schedule {path}',
                            hint='Recalibrating; the new calibration replaces it.',
                            checkpoint_setting='--model_dir')
  except run_identity.RunMismatchError as e:
    log(str(e))
    return None
  return schedule_lib.TemperatureSchedule.from_dict(saved, source=path)


def calibration_progress_path(output_dir: str) -> str:
  """schedule.json.partial.jsonl: the calibrations finished until schedule.json is written (as
  calibrate keeps OUTPUT_PATH.partial.jsonl)."""
  return os.path.join(output_dir, 'schedule.json.partial.jsonl')


def calibration_progress(path: str, identity: Mapping[str, Any], log: Callable[[str], None]
                         ) -> calibration.CalibrationLog:
  """The calibration log at `path` (`calibration.CalibrationLog`: one fsynced line per finished
  calibration), resumed when its run identity is `identity`; one of another calibration is
  logged with its differing fields and started over, as a saved schedule.json of another one is
  replaced (`reusable_schedule`)."""
  try:
    return calibration.CalibrationLog(path, identity, kind='demo')
  except run_identity.RunMismatchError as e:
    fields = ', '.join(e.fields) or 'no run identity recorded'
    log(f'calibration progress {path} is of another calibration ({fields}); calibrating anew.')
  calibration.remove_log(path)
  return calibration.CalibrationLog(path, identity, kind='demo')
