"""The optimizer: AdamW or Adafactor (T5's) with a learning-rate schedule, one hashable config."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import optax

from t5align import fields

OPTIMIZERS = ('adamw', 'adafactor')
LEARNING_RATE_SCHEDULES = ('cosine', 'wsd', 'constant')


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW or Adafactor with a learning-rate schedule.

  Schedules, over the run's `total_steps` (`make`): 'cosine' (linear warmup, cosine decay to 10%
  of the peak at the last step) or 'wsd'
  (warmup, stable at the peak, then linear decay to 10% over the last `decay_fraction` of the
  steps; it keeps the peak rate while the model first learns to retrieve) or 'constant' (warmup,
  then the peak: t5x's fine-tuning rate, 1e-3 with Adafactor). AdamW clips the global
  gradient norm at `clip_norm` (None: no clipping); Adafactor is T5's (factored second
  moments, updates scaled by each parameter's RMS, update clipping at 1.0). Hashable, so the
  jitted `train_step` takes it as a static argument and reuses compilations.

  gin builds it for `jobs.TrainJob.optimizer` (gin/runs/*.gin: LEARNING_RATE, WARMUP_STEPS,
  OPTIMIZER, SCHEDULE); the job's NUM_STEPS is `total_steps`.
  """

  learning_rate: float = fields.setting(1e-3, check=fields.number(0, above=True))
  warmup_steps: int = fields.setting(100, check=fields.integer(0))
  weight_decay: float = fields.setting(0.0, check=fields.number(0))
  clip_norm: float | None = fields.setting(
      1.0, check=fields.optional(fields.number(0, above=True), 'None (no clipping)'))
  name: str = fields.setting('adamw', check=fields.text(OPTIMIZERS))
  schedule: str = fields.setting('cosine', check=fields.text(LEARNING_RATE_SCHEDULES))
  decay_fraction: float = fields.setting(0.2, check=fields.number(0, above=True, maximum=1))

  GIN_NAME: ClassVar[str] = 'training.OptimizerConfig'

  def __post_init__(self):
    fields.check_fields(self)

  def learning_rate_schedule(self, total_steps: int) -> optax.Schedule:
    """The learning rate at each step of a run of `total_steps`."""
    peak, end = self.learning_rate, 0.1 * self.learning_rate
    total = max(total_steps, self.warmup_steps + 1)
    if self.schedule == 'cosine':
      return optax.warmup_cosine_decay_schedule(0.0, peak, self.warmup_steps, total,
                                                end_value=end)
    if self.schedule == 'wsd':
      decay = max(1, int(self.decay_fraction * total))
      stable = max(0, total - self.warmup_steps - decay)
      return optax.join_schedules(
          [optax.linear_schedule(0.0, peak, self.warmup_steps),
           optax.constant_schedule(peak),
           optax.linear_schedule(peak, end, decay)],
          [self.warmup_steps, self.warmup_steps + stable])
    if self.schedule == 'constant':
      if not self.warmup_steps:
        return optax.constant_schedule(peak)
      return optax.join_schedules([optax.linear_schedule(0.0, peak, self.warmup_steps),
                                   optax.constant_schedule(peak)], [self.warmup_steps])
    raise ValueError(f"schedule={self.schedule!r}; expected 'cosine', 'wsd' or 'constant'.")

  def make(self, total_steps: int) -> optax.GradientTransformation:
    """The optimizer of a run of `total_steps`."""
    schedule = self.learning_rate_schedule(total_steps)
    if self.name == 'adamw':
      clip = (optax.identity() if self.clip_norm is None
              else optax.clip_by_global_norm(self.clip_norm))
      return optax.chain(clip, optax.adamw(schedule, b1=0.9, b2=0.98,
                                           weight_decay=self.weight_decay))
    if self.name == 'adafactor':
      return optax.adafactor(schedule, decay_rate=0.8, clipping_threshold=1.0,
                             multiply_by_parameter_scale=True,
                             weight_decay_rate=self.weight_decay or None)
    raise ValueError(f"optimizer name={self.name!r}; expected 'adamw' or 'adafactor'.")
