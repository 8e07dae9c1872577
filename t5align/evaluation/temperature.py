"""The encoder temperature of an evaluation run: one constant, or a schedule giving one per example.

numpy only (no JAX): a schedule's per-example temperatures come back as numpy arrays.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from t5align import labels
from t5align.runtime import validate


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

  def describe(self) -> dict[str, Any]:
    """JSON-able settings for run.json and metrics.json."""
    if self.schedule is not None:
      return {'label': self.label, 'schedule_strategy': self.schedule.strategy,
              'schedule': self.schedule.to_dict()}
    return {'label': self.label, 'temperature': self.constant}
