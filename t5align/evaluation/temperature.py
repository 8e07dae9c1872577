"""The encoder temperature of an evaluation run: one constant, or a schedule giving one per example.

`Temperature` is numpy only: a schedule's per-example temperatures come back as numpy arrays.
`make_temperature` makes one from a run's settings (TEMPERATURE, SCHEDULE_PATH), checked against
the model's layers and heads; `task_temperature` picks a schedule's entry for a task.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax.numpy as jnp
import numpy as np

from t5align import labels
from t5align.runtime import validate
from t5align import schedule as schedule_lib


@dataclasses.dataclass(frozen=True)
class Temperature:
  """The encoder temperature of a run: one constant, or a schedule giving one per example.

  A constant is a float, a tuple (one per layer) or a tuple of tuples (`[layers][heads]`).
  """

  constant: float | tuple[float, ...] | tuple[tuple[float, ...], ...] | None = None
  schedule: Any = None  # a t5align.schedule.TemperatureSchedule
  label: str = ''

  def __post_init__(self):
    if (self.constant is None) == (self.schedule is None):
      raise ValueError('give exactly one of a constant temperature and a schedule.')
    if not self.label:
      object.__setattr__(self, 'label', self.default_label())

  def default_label(self) -> str:
    if self.schedule is not None:
      return labels.strategy_label(self.schedule.strategy)
    if np.ndim(self.constant) == 2:
      layers, heads = np.shape(self.constant)
      return f'tau = [{layers} x {heads}] per head (mean {float(np.mean(self.constant)):.3g})'
    values = np.ravel(self.constant)
    if values.size > 1:
      return 'tau = (' + ', '.join(f'{v:g}' for v in values) + ')'
    return f'tau = {float(values[0]):g}'

  def taus(self, tokens: np.ndarray) -> np.ndarray:
    """float32 `[b, 1]`, `[b, layers]` or `[b, layers, heads]` temperatures for `[b, l]`
    encoder tokens."""
    if self.schedule is not None:
      taus = np.array(self.schedule.temperatures(tokens), np.float32)
      validate.temperatures(taus, f'schedule temperatures ({self.schedule.strategy})')
      return taus
    tau = np.asarray(self.constant, np.float32)
    # [] or [layers] -> [1, 1 or layers]; [layers, heads] -> [1, layers, heads]
    tau = tau[None] if tau.ndim == 2 else tau.reshape(1, -1)
    return np.repeat(tau, tokens.shape[0], axis=0)

  def model_config(self, config: Any, length: int) -> Any:
    """`config` for inputs up to `length` tokens: with the schedule's bias rule there
    (`TemperatureSchedule.model_config`), else as it is."""
    return config if self.schedule is None else self.schedule.model_config(config, length)

  def describe(self) -> dict[str, Any]:
    """JSON-able settings for run.json and metrics.json."""
    if self.schedule is not None:
      return {'label': self.label, 'schedule_strategy': self.schedule.strategy,
              'schedule': self.schedule.to_dict()}
    return {'label': self.label, 'temperature': self.constant}


def make_temperature(config: Any, temperature: Any = None,
                     schedule_path: str | None = None, schedule_strategy: str | None = None,
                     label: str | None = None, model: str = 'the model'
                     ) -> Temperature:
  """A constant (the override, else the config's) or a schedule file's temperatures, checked
  against the model's encoder layers (`config`, a `network.T5Config`; `model` names it in
  errors, e.g. its checkpoint)."""
  layers = config.num_encoder_layers
  if temperature is not None and schedule_path:
    raise ValueError('set TEMPERATURE or SCHEDULE_PATH, not both.')
  if schedule_path:
    schedule = schedule_lib.load_schedule(schedule_path, schedule_strategy)
    calibrated = schedule.provenance.get('dtype')
    if calibrated and jnp.dtype(calibrated) != jnp.dtype(config.dtype):
      warnings.warn(f'{schedule_path} was calibrated with {calibrated} activations; this model '
                    f'computes in {jnp.dtype(config.dtype).name}: its taus are for other logits '
                    '(calibrate with the same ACTIVATION_DTYPE).', stacklevel=2)
    fits = {(), (layers,), (layers, config.num_heads)}
    for task, cals in [('', schedule.calibrations), *schedule.tasks.items()]:
      shapes = {np.shape(c.tau) for c in cals[schedule.strategy]}
      if shapes - fits:
        shape = max(shapes - fits)
        raise ValueError(
            f'temperature schedule {schedule_path} (SCHEDULE_PATH): strategy '
            f'{schedule.strategy!r}{f" of task {task!r}" if task else ""} has '
            + (f'{shape[0]} per-layer taus' if len(shape) == 1 else
               f'[{shape[0]}][{shape[1]}] per-layer, per-head taus')
            + f' but {model} has {layers} encoder layers of {config.num_heads} heads: '
            'calibrate it for this model.')
    return Temperature(schedule=schedule, label=label or '')
  if schedule_strategy:
    raise ValueError('SCHEDULE_STRATEGY needs SCHEDULE_PATH.')
  if temperature is None:  # Checked against the model by `network.T5Config`.
    temperature = config.encoder_attention_temperature
  else:
    temperature = validate.temperature_setting(temperature, 'TEMPERATURE', layers, model,
                                               config.num_heads)
  temp = Temperature(constant=temperature, label=label or '')
  if not label and config.has_bias_rule:
    # The model's own bias rule (gin's BIAS_RULE) names the row too: rows differ by it.
    words = '; '.join(dict.fromkeys(r.describe() for r in config.encoder_bias_rules))
    temp = dataclasses.replace(temp, label=f'{temp.label} (bias {words})')
  return temp


def task_temperature(temp: Temperature, task: str, *, allow_pooled: bool = False,
                     source: str = 'the schedule') -> Temperature:
  """A schedule's entry calibrated on `task` (paper: per task and setting), else as given; a
  schedule with per-task entries but none for `task` is refused, naming `source`, unless
  `allow_pooled` (its pooled calibrations, with a warning: `TemperatureSchedule.for_task`)."""
  if temp.schedule is None:
    return temp
  return dataclasses.replace(temp, schedule=temp.schedule.for_task(
      task, allow_pooled=allow_pooled, source=source))
