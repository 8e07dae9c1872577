"""The encoder temperature of an evaluation run: one constant, or a schedule giving one per example.

numpy only (no JAX): a schedule's per-example temperatures come back as numpy arrays.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from t5align import labels
from t5align import validate


@dataclasses.dataclass(frozen=True)
class Temperature:
  """The encoder temperature of a run: one constant, or a schedule giving one per example."""

  constant: float | tuple[float, ...] | None = None
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
    values = np.ravel(self.constant)
    if values.size > 1:
      return 'tau = (' + ', '.join(f'{v:g}' for v in values) + ')'
    return f'tau = {float(values[0]):g}'

  def taus(self, tokens: np.ndarray) -> np.ndarray:
    """float32 `[b, 1]` or `[b, layers]` temperatures for `[b, l]` encoder tokens."""
    if self.schedule is not None:
      taus = np.array(self.schedule.temperatures(tokens), np.float32)
      validate.temperatures(taus, f'schedule temperatures ({self.schedule.strategy})')
      return taus
    tau = np.asarray(self.constant, np.float32).reshape(1, -1)
    return np.repeat(tau, tokens.shape[0], axis=0)

  def describe(self) -> dict[str, Any]:
    """JSON-able settings for run.json and metrics.json."""
    if self.schedule is not None:
      return {'label': self.label, 'schedule_strategy': self.schedule.strategy,
              'schedule': self.schedule.to_dict()}
    return {'label': self.label, 'temperature': self.constant}
