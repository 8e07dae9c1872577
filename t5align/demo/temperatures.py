"""The demo's temperatures: each tuned task calibrated on its own prompts (`calibrate_per_task`,
with the demo's `calibration_settings`), how much they move over sampling seeds
(`calibration_spread`), and the temperature a report row gives the encoder at a length.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from jax.sharding import Mesh
import numpy as np

from t5align import calibration
from t5align import schedule as schedule_lib
from t5align.demo import planning


def calibration_settings(mesh: Mesh | None = None) -> calibration.SearchSettings:
  """How the demo's calibrations compute: one candidate tau per call, the sweeps' examples split
  over `mesh`'s 'data' axis (None: one device)."""
  return calibration.SearchSettings(mesh=mesh, tau_batch_size=1)


def calibrate_per_task(params, config, prompts: Mapping[str, Mapping[int, np.ndarray]],
                       references: Mapping[str, np.ndarray], plan: planning.Plan, *,
                       settings: calibration.SearchSettings, memo: calibration.Memo,
                       progress: Callable[[calibration.Calibration, str], None],
                       seed: int | None = None, previous: Mapping[str, Any] | None = None,
                       record: Callable[[str, calibration.Calibration], None] | None = None
                       ) -> dict[str, dict[str, tuple[calibration.Calibration, ...]]]:
  """Each tuned task calibrated on its own prompts at every L_ex against its own at L_tr,
  longest length first (so the progress estimate measures the dominant work first).

  Resumable with `seed`, `previous` and `record` (`calibration.calibrate_tasks`'): each
  calibration is keyed 'TASK@seed', taken from `previous` when there, else made and recorded.
  """
  out = {task: {s: [] for s in plan.strategies} for task in prompts}
  for L in reversed(plan.lengths):
    for task in prompts:
      name = task if seed is None else f'{task}@{seed}'
      found = calibration.calibrate_tasks(
          params, config, {name: (prompts[task][L], references[task])}, plan.strategies,
          reference_length=plan.reference_length, settings=settings, memo=memo,
          progress=lambda d, t, c, task=task: progress(c, task), previous=previous,
          record=record)
      for s, items in found[name].items():
        out[task][s].extend(items)
  return {t: {s: tuple(v) for s, v in cals.items()} for t, cals in out.items()}


def calibration_spread(per_seed: Sequence[Mapping[str, Mapping[str, Sequence[Any]]]]
                       ) -> dict[str, dict[str, dict[str, Any]]]:
  """{task: {strategy: {L: {'taus': [per seed], 'spread': max - min (largest over layers)}}}}
  of the calibrations of several sampling seeds (`calibrate_per_task` results)."""
  out = {}
  for task, cals in per_seed[0].items():
    for s, items in cals.items():
      for c in items:
        taus = [np.ravel(next(x.tau for x in seed[task][s] if x.length == c.length)).tolist()
                for seed in per_seed]
        values = np.asarray(taus, np.float64)  # [seeds, layers or 1]
        out.setdefault(task, {}).setdefault(s, {})[str(c.length)] = {
            'taus': [t[0] if len(t) == 1 else t for t in taus],
            'spread': float(np.max(values.max(0) - values.min(0)))}
  return out


def row_temperature(schedule: schedule_lib.TemperatureSchedule, row: str, length: int
                    ) -> float | np.ndarray:
  """The encoder temperature of a report row at `length`: 1, or the strategy's calibrated tau
  (a per-layer tau as `[1, layers]`, a per-head one as `[1, layers, heads]`: never ambiguous)."""
  return 1.0 if row == 'tau=1' else schedule.encode_temperature(length, row)


def encoder_temperature(tau: Any, layers: int) -> np.ndarray:
  """float32 `[1, layers]` for a scalar or per-layer tau (which the encoder applies alike, so one
  compiled decoder per length serves both); a `[1, layers, heads]` tau as it is."""
  tau = np.asarray(tau, np.float32)
  return tau if tau.ndim == 3 else np.broadcast_to(tau.reshape(1, -1), (1, layers)).copy()
