"""Calibration runs: every (length, strategy) of a `TemperatureSchedule` (`build_schedule`), or
per task (`calibrate_tasks`), sharing one `stats.Memo`; calibrate's resumable progress log
(`CalibrationLog`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from t5align.calibration import stats
from t5align.calibration import strategies as strategies_lib
from t5align import partitioning
from t5align import run_identity
from t5align.runtime import fileio
from t5align.runtime import outputs
from t5align.runtime import records
from t5align import schedule

if TYPE_CHECKING:
  from t5align import network


def _sweep_order(strategies: Sequence[str]) -> list[str]:
  """`strategies` in the order one length computes them: Algorithm 1's grids first, so the
  continuous and per-layer searches start from their shared sweep (`stats.Memo`)."""
  rank = {'grid': 0, 'closed_form': 1, 'bisect': 2}
  return sorted(strategies, key=lambda s: rank[strategies_lib.parse_strategy(s)[1]])


def build_schedule(
    params: Any,
    config: network.T5Config,
    tokens: Any,
    lengths: Sequence[int],
    strategies: Sequence[str],
    *,
    reference_length: int = 512,
    reference_tokens: Any = None,
    provenance: Mapping[str, Any] | None = None,
    progress: Callable[[int, int, schedule.Calibration], None] | None = None,
    previous: Mapping[str, schedule.Calibration] | None = None,
    record: Callable[[str | None, schedule.Calibration], None] | None = None,
    settings: strategies_lib.SearchSettings | None = None,
    memo: stats.Memo | None = None,
) -> schedule.TemperatureSchedule:
  """Calibrates every (length, strategy) pair on the same documents.

  Args:
    params: the T5X 'params' tree.
    config: the model config.
    tokens: int `[b, >= max(lengths)]` samples; each length uses them cut to it.
    lengths: target lengths L_ex (each >= reference_length).
    strategies: names from `strategies_lib.STRATEGIES`; the first is applied by default.
    reference_length: L_tr.
    reference_tokens: separate `[b', L_tr]` reference samples; None cuts `tokens` to L_tr.
    provenance: extra facts to record (checkpoint, source, seed, ...).
    progress: called as `progress(done, total, calibration)` after each pair.
    previous: calibrations an interrupted run made, by `calibration_key` (task None), taken as
      they are (`_resumed`: a grid strategy whose sweep a continuous search still needs is
      made again), so the schedule equals an uninterrupted run's.
    record: called as `record(None, calibration)` for each new calibration, as it finishes
      (`CalibrationLog.add`).
    settings: how every calibration searches and computes (`strategies.SearchSettings`).
    memo: results shared by every pair (a new `stats.Memo` if None).

  Returns:
    The schedule, its provenance holding lengths, strategies, sample counts and settings.
  """
  tokens = stats.check_tokens(tokens)
  lengths = sorted({int(L) for L in lengths})
  if not lengths or not strategies:
    raise ValueError('need at least one length and one strategy.')
  if lengths[-1] > tokens.shape[1]:
    raise ValueError(f'samples have {tokens.shape[1]} positions; the longest length is '
                     f'{lengths[-1]}.')
  for L in lengths:
    stats.check_lengths(L, reference_length)
  for s in strategies:
    strategies_lib.parse_strategy(s)
  settings = settings or strategies_lib.SearchSettings()
  memo = memo or stats.Memo()
  params = partitioning.place_params(params, config, settings.mesh)
  cals = {s: [] for s in strategies}
  total = len(lengths) * len(strategies)
  for i, L in enumerate(lengths):
    cut = stats.cut_to_length(tokens, L, settings.eos_id)
    done = _resumed(previous, None, strategies, L)
    for j, s in enumerate(_sweep_order(strategies)):
      c = done.get(s) or strategies_lib.calibrate(
          params, config, cut, s, reference_tokens=reference_tokens,
          reference_length=reference_length, settings=settings, memo=memo)
      cals[s].append(c)
      if record is not None and s not in done and calibration_key(None, s, L) not in (
          previous or {}):
        record(None, c)
      if progress is not None:
        progress(i * len(strategies) + j + 1, total, c)
  record = {
      'lengths': lengths, 'strategies': list(strategies), 'reference_length': reference_length,
      'num_samples': int(tokens.shape[0]), 'sample_width': int(tokens.shape[1]),
      'samples_sha256': hashlib.sha256(tokens.tobytes()).hexdigest(),  # int32 [b, width]
      'reference': 'same documents cut to L_tr' if reference_tokens is None else
                   f'{len(reference_tokens)} separate samples',
      'settings': settings.record(), **(provenance or {})}
  return schedule.TemperatureSchedule(reference_length=reference_length, strategy=strategies[0],
                             calibrations={k: tuple(v) for k, v in cals.items()},
                             provenance=record)


def calibrate_tasks(
    params: Any,
    config: network.T5Config,
    task_inputs: Mapping[str, tuple[Any, Any]],
    strategies: Sequence[str],
    *,
    reference_length: int,
    progress: Callable[[int, int, schedule.Calibration], None] | None = None,
    previous: Mapping[str, schedule.Calibration] | None = None,
    record: Callable[[str | None, schedule.Calibration], None] | None = None,
    settings: strategies_lib.SearchSettings | None = None,
    memo: stats.Memo | None = None,
) -> dict[str, dict[str, tuple[schedule.Calibration, ...]]]:
  """Per-task calibration, as the paper does it: each task on its own inputs.

  Args:
    params: the T5X 'params' tree.
    config: the model config.
    task_inputs: {task: (tokens, reference_tokens)}: int `[b, L_ex]` whole task inputs (0-padded;
      L_ex = the width, i.e. the longest) and `[b', <= L_tr]` the same task at L_tr (its setting
      nearest L_tr, or its examples cut by `stats.cut_at_boundary`); or {task: a list of
      such pairs}, one per L_ex (distinct widths).
    strategies: names from `strategies_lib.STRATEGIES`.
    reference_length: L_tr.
    progress: called as `progress(done, total, calibration)`.
    previous: as `build_schedule`'s, per (task, L_ex).
    record: as `build_schedule`'s, per (task, L_ex).
    settings: how every calibration searches and computes (`strategies.SearchSettings`).
    memo: results shared by every calibration (a new `stats.Memo` if None).

  Returns:
    {task: {strategy: (calibration,)}}, ready for `TemperatureSchedule(tasks=...)`.
  """
  settings = settings or strategies_lib.SearchSettings()
  memo = memo or stats.Memo()
  params = partitioning.place_params(params, config, settings.mesh)
  pairs = {t: v if isinstance(v, list) else [v] for t, v in task_inputs.items()}
  out, done, total = {}, 0, sum(len(v) for v in pairs.values()) * len(strategies)
  for task, items in pairs.items():
    out[task] = {s: [] for s in strategies}
    for tokens, reference in items:
      length = int(np.shape(tokens)[1])
      resumed = _resumed(previous, task, strategies, length)
      for s in _sweep_order(strategies):
        try:
          c = resumed.get(s) or strategies_lib.calibrate(
              params, config, tokens, s, reference_tokens=reference,
              reference_length=reference_length, settings=settings, memo=memo)
        except ValueError as e:
          raise ValueError(f'task {task!r}: {e}') from e
        if record is not None and s not in resumed and calibration_key(task, s, length) not in (
            previous or {}):
          record(task, c)
        out[task][s].append(c)
        done += 1
        if progress is not None:
          progress(done, total, c)
  return {t: {s: tuple(v) for s, v in cals.items()} for t, cals in out.items()}


def calibration_key(task: str | None, strategy: str, length: int) -> str:
  """The key of one calibration of a run: pooled (task None) or a task's, at one length."""
  return f'{task or ""}|{strategy}|{int(length)}'


def _resumed(previous: Mapping[str, schedule.Calibration] | None, task: str | None,
             strategies: Sequence[str], length: int) -> dict[str, schedule.Calibration]:
  """{strategy: calibration} of `previous` at (`task`, `length`) to take as they are: all found,
  except the grid strategies' when a continuous search there is still to do (it starts from
  their sweep, which is then made again, as in one uninterrupted run)."""
  found = {s: (previous or {}).get(calibration_key(task, s, length)) for s in strategies}
  searches = any(c is None and strategies_lib.parse_strategy(s)[1] == 'bisect'
                 for s, c in found.items())
  return {s: c for s, c in found.items()
          if c is not None and not (searches and strategies_lib.parse_strategy(s)[1] == 'grid')}


class CalibrationLog:
  """The calibrations a run has finished, one JSON line each, appended and fsynced as each one
  finishes (`records.RecordLog`): a rerun after a kill or a failed write (a full disk)
  redoes none of them.

  Its first record, written with the first calibration, is the run identity (`run_identity`;
  `kind`: what made it, `run_identity.KINDS`, for reading a header of an earlier format); the
  log of a run with another identity is refused, naming the differing fields.
  """

  def __init__(self, path: str, identity: Mapping[str, Any], *, kind: str):
    self.path = path
    self._log = records.RecordLog(path, key='key')
    self._identity = None  # To write with the first calibration.
    if self.done():
      recorded = self._log.records.get('identity')
      run_identity.check_same(
          None if recorded is None else recorded.get('identity'), identity, kind=kind,
          what=f'calibration progress {path}',
          hint=f'Rerun with the settings it was made with, or delete {path} to start over.')
      return
    if len(self._log):  # An identity alone: its run made nothing.
      self.remove()
      self._log = records.RecordLog(path, key='key')
    self._identity = {'key': 'identity', 'identity': dict(identity)}

  def done(self) -> dict[str, dict[str, Any]]:
    """{`calibration_key`: the calibration as JSON} of every logged calibration."""
    return {k: r['calibration'] for k, r in self._log.records.items() if k != 'identity'}

  def add(self, task: str | None, c: schedule.Calibration) -> None:
    """Appends `c` (`task`'s, or pooled: None) in one write."""
    record = {'key': calibration_key(task, c.strategy, c.length), 'task': task,
              'calibration': outputs.jsonable(dataclasses.asdict(c), what=self.path)}
    self._log.append([self._identity, record] if self._identity else [record])
    self._identity = None

  def remove(self) -> None:
    """Deletes the log (the run's schedule is written)."""
    remove_log(self.path)


def remove_log(path: str) -> None:
  """Deletes a calibration log (on an object store, empties it: an empty log holds nothing)."""
  if fileio.is_remote(path):
    fileio.write_atomic(path, b'')
  elif os.path.exists(path):
    os.remove(path)


def resumed_calibrations(done: Mapping[str, Mapping[str, Any]], source: str
                         ) -> dict[str, schedule.Calibration]:
  """`CalibrationLog.done()` as `Calibration`s, for `build_schedule`'s `previous`."""
  return {k: schedule.calibration_from_dict(v, source, k) for k, v in done.items()}
