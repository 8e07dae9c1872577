"""Each lm-eval request's encoder temperature: a constant, a schedule's tau at its context's
length (as `t5align.eval` applies one), or a temperature calibrated per task and length bucket
on the requests' own contexts (`Calibrated`: Algorithm 1 or a training-free rule, once per
bucket, as the paper calibrates per task).

Every policy gives float32 `[m, 1]`, `[m, layers]` or `[m, layers, heads]` taus for m contexts
(`taus`) and says what it applied, for lm-eval's results (`describe`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np

from t5align import calibration
from t5align.calibration import samples as samples_lib
from t5align.calibration import stats
from t5align import memory
from t5align import network
from t5align import partitioning
from t5align.runtime import validate
from t5align import schedule as schedule_lib

POOLED = 'pooled'


def _shaped(taus: np.ndarray, count: int) -> np.ndarray:
  """float32 `[count, 1 | layers (, heads)]` of per-context taus `[count]`, `[count, layers]`
  or `[count, layers, heads]`."""
  taus = np.asarray(taus, np.float32)
  validate.temperatures(taus, 'temperatures')
  return taus.reshape(count, 1) if taus.ndim == 1 else taus


class Policy:
  """How each request's temperature is chosen."""

  def taus(self, contexts: Sequence[np.ndarray], tasks: Sequence[str]) -> np.ndarray:
    raise NotImplementedError

  def describe(self) -> dict[str, Any]:
    raise NotImplementedError


@dataclasses.dataclass
class Constant(Policy):
  """One temperature for every request: a number, one per layer, or `[layers][heads]`."""

  tau: Any

  def taus(self, contexts, tasks):
    tau = np.asarray(self.tau, np.float32)
    return _shaped(np.broadcast_to(tau, (len(contexts), *tau.shape)), len(contexts))

  def describe(self):
    return {'temperature': self.tau}


@dataclasses.dataclass
class Scheduled(Policy):
  """A schedule file's taus, interpolated at each context's length; a schedule with per-task
  entries applies the request's task's (or `task`'s, or its pooled entry for `POOLED`)."""

  schedule: schedule_lib.TemperatureSchedule
  path: str
  task: str | None = None
  used: dict[str, str] = dataclasses.field(default_factory=dict)  # lm-eval task -> entry
  # Entry name -> its schedule, built (and validated) once, not per request.
  entries: dict[str, schedule_lib.TemperatureSchedule] = dataclasses.field(default_factory=dict)

  def _entry(self, task: str) -> schedule_lib.TemperatureSchedule:
    chosen = self.task or (task if task in self.schedule.tasks else None)
    if chosen is None and self.schedule.tasks:
      raise ValueError(
          f'schedule {self.path} holds per-task calibrations '
          f'({", ".join(sorted(self.schedule.tasks))}) and none for lm-eval task {task!r}: name '
          f'the entry to apply with schedule_task=NAME, or schedule_task={POOLED} for its pooled '
          'calibrations.')
    self.used[task] = chosen = chosen or POOLED
    if chosen not in self.entries:
      self.entries[chosen] = (self.schedule if chosen == POOLED
                              else self.schedule.for_task(chosen))
    return self.entries[chosen]

  def taus(self, contexts, tasks):
    lengths = np.array([len(c) for c in contexts], np.float64)
    out = [self._entry(t).tau_for_length(length) for t, length in zip(tasks, lengths)]
    return _shaped(np.asarray(out), len(contexts))

  def describe(self):
    return {'schedule': self.path, 'schedule_strategy': self.schedule.strategy,
            'schedule_entries': dict(self.used)}


def bucket(length: int) -> int:
  """A context's calibration bucket: the power of two that bounds its length from above (the
  bucket of 2^k holds lengths 2^(k-1)+1 .. 2^k)."""
  return 1 << max(0, math.ceil(math.log2(max(length, 1))))


@dataclasses.dataclass
class Calibrated(Policy):
  """A strategy calibrated per (task, bucket) on the first `samples` contexts of that bucket
  that reach it, each against the same contexts cut at a boundary before L_tr
  (`samples.task_inputs`, as `t5align.calibrate` calibrates a JSONL file's tasks); contexts of
  at most L_tr tokens keep tau = 1.

  `calibrate` is `(name, tokens [b, L_ex], reference [b', <= L_tr]) -> Calibration`.
  """

  strategy: str
  reference_length: int
  samples: int
  calibrate: Callable[[str, np.ndarray, np.ndarray], schedule_lib.Calibration]
  boundaries: Callable[[], Sequence[int]]
  eos_id: int
  done: dict[tuple[str, int], schedule_lib.Calibration] = dataclasses.field(default_factory=dict)
  counts: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)  # samples used

  def _calibrate(self, contexts, tasks) -> None:
    """Calibrates each (task, bucket) the contexts reach that has no calibration yet."""
    waiting: dict[tuple[str, int], list[np.ndarray]] = {}
    for context, task in zip(contexts, tasks):
      if len(context) <= self.reference_length:
        continue
      key = (task, bucket(len(context)))
      if key in self.done:
        continue
      rows = waiting.setdefault(key, [])
      if len(rows) < self.samples and not any(np.array_equal(context, r) for r in rows):
        rows.append(np.asarray(context, np.int32))
    for (task, top), rows in sorted(waiting.items()):
      tokens, reference = samples_lib.task_inputs(rows, self.reference_length, self.eos_id,
                                                  self.boundaries())
      self.done[(task, top)] = self.calibrate(f'{task}/{top}', tokens, reference)
      self.counts[(task, top)] = len(rows)

  def taus(self, contexts, tasks):
    self._calibrate(contexts, tasks)
    shape = np.shape(next(iter(self.done.values())).tau) if self.done else ()
    out = []
    for context, task in zip(contexts, tasks):
      c = (self.done[(task, bucket(len(context)))]
           if len(context) > self.reference_length else None)
      out.append(np.ones(shape) if c is None else np.asarray(c.tau, np.float64))
    return _shaped(np.asarray(out), len(contexts))

  def describe(self):
    return {'calibrate': self.strategy, 'reference_length': self.reference_length,
            'calibrate_samples': self.samples, 'calibrations': [
                {'task': task, 'bucket': f'{top // 2 + 1}..{top}', 'length': c.length,
                 'samples': self.counts[(task, top)], 'tau': c.tau, 'target': c.target,
                 'achieved': c.achieved, 'clamped': c.clamped}
                for (task, top), c in sorted(self.done.items())]}


def calibrator(params: Any, config: network.T5Config, mesh: Any, strategy: str,
               reference_length: int, eos_id: int
               ) -> Callable[[str, np.ndarray, np.ndarray], schedule_lib.Calibration]:
  """`(name, tokens, reference) -> Calibration` of `strategy` as `t5align.calibrate` computes it:
  its search settings (the paper's grid, one sample per call) and, for `config`'s 'auto'
  attention, its blockwise attention (the materialized one is slow to give statistics on a
  CPU), on a ('tau', 'data', 'model') mesh over `mesh`'s devices; a search's widest sweep is
  checked against the device's memory before it runs."""
  cal_mesh = partitioning.calibration_mesh(1, mesh.shape['data'], mesh.shape['model'],
                                           devices=list(mesh.devices.flat))
  settings = calibration.SearchSettings(batch_size=1, mesh=cal_mesh, eos_id=eos_id)
  if config.attention_impl == 'auto':
    config = dataclasses.replace(config, attention_impl='blockwise')
  memo = calibration.Memo()
  sweeps = calibration.parse_strategy(strategy)[1] in ('grid', 'bisect')

  def run(name: str, tokens: np.ndarray, reference: np.ndarray) -> schedule_lib.Calibration:
    if sweeps:
      fn, args = stats.sweep_program(params, config, length=tokens.shape[1],
                                     batch_size=settings.batch_size, taus=len(settings.grid),
                                     mesh=cal_mesh)
      memory.check_compiled(
          memory.Compiled.of(fn.lower(*args).compile(),
                             parameter_bytes=memory.per_device_bytes(args[0]),
                             input_bytes=memory.per_device_bytes(args[1:])),
          hints=[f"num_partitions (devices on the 'model' axis, now {mesh.shape['model']}) "
                 'higher', 'max_length lower'],
          what=f'Calibrating {name} ({tokens.shape[0]} contexts of up to {tokens.shape[1]} '
               'tokens)')
    (cal,), = calibration.calibrate_tasks(
        params, config, {name: (tokens, reference)}, [strategy],
        reference_length=reference_length, settings=settings, memo=memo)[name].values()
    return cal

  return run
