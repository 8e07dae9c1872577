"""A `network.Transformer` whose encoder temperature comes per example from a schedule file.

For callers that cannot pass `temperature`: t5x.eval through gin/t5x/schedule.gin.
"""
from __future__ import annotations

import functools

from t5align import network
# Imported here, not lazily: it registers a gin configurable, which gin refuses after its config
# is locked (t5x.eval locks it before the model first runs).
from t5align import schedule as schedule_lib


@functools.cache
def cached_schedule(path: str, strategy: str | None = None) -> schedule_lib.TemperatureSchedule:
  return schedule_lib.load_schedule(path, strategy)


class ScheduledTransformer(network.Transformer):
  """`network.Transformer` whose encoder temperature comes per example from a schedule file.

  For callers that never pass `temperature` (t5x's EncoderDecoderModel calls `encode(tokens)`):
  each row's tau is `schedule.temperatures(encoder_input_tokens)`, from its non-pad length.
  Parameters and signatures are the parent's; an explicit `temperature` still wins.
  """

  schedule_path: str | None = None
  schedule_strategy: str | None = None

  def encode(self, encoder_input_tokens, encoder_segment_ids=None, enable_dropout=True,
             temperature=None):
    if temperature is None and self.schedule_path:
      temperature = cached_schedule(self.schedule_path, self.schedule_strategy).temperatures(
          encoder_input_tokens)
    return super().encode(encoder_input_tokens, encoder_segment_ids=encoder_segment_ids,
                          enable_dropout=enable_dropout, temperature=temperature)
