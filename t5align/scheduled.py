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


def _task_names(mixture_or_task_name: str) -> tuple[str, ...]:
  """The tasks of a registered seqio task or mixture; any other name (no seqio, or a JSONL
  file's task name) stands for itself."""
  try:
    import seqio  # pylint: disable=g-import-not-at-top
    found = seqio.get_mixture_or_task(mixture_or_task_name)
  except (ImportError, ValueError):
    return (mixture_or_task_name,)
  return tuple(t.name for t in seqio.get_subtasks(found))


@functools.cache
def task_schedule(path: str, strategy: str | None = None, task: str | None = None,
                  allow_pooled: bool = False) -> schedule_lib.TemperatureSchedule:
  """The schedule one run applies to every example of `task` (a seqio task or mixture name).

  A file with per-task calibrations (`TemperatureSchedule.tasks`) gives the task's own entry, as
  `t5align.eval` applies it; a task without one is refused (`for_task`), or given the pooled
  entry with a warning when `allow_pooled` (ALLOW_SCHEDULE_MISMATCH).

  Raises:
    ValueError: the file has per-task entries and `task` is None, or `task` is a mixture holding
      tasks with entries: one network applies one schedule to all of its examples, so it cannot
      give each task its own, and pooling them silently would evaluate another temperature.
  """
  schedule = cached_schedule(path, strategy)
  if not schedule.tasks:
    return schedule
  if task is None:
    raise ValueError(
        f'temperature schedule {path} holds per-task calibrations '
        f'({", ".join(sorted(schedule.tasks))}); name the task it is applied to '
        '(ScheduledTransformer.schedule_task; gin/t5x/schedule.gin binds it to '
        'MIXTURE_OR_TASK_NAME), so that the task\'s own temperatures are used.')
  names = _task_names(task)
  source = f'temperature schedule {path} (SCHEDULE_PATH)'
  if len(names) == 1:
    return schedule.for_task(names[0], allow_pooled=allow_pooled, source=source)
  own = [t for t in names if t in schedule.tasks]
  if own:
    raise ValueError(
        f'temperature schedule {path} holds per-task calibrations for {", ".join(own)}, tasks '
        f'of the mixture {task!r}; one t5x run (t5x.eval, t5x.infer) applies one schedule to '
        'all its examples and would give them the pooled temperatures. Evaluate each task in '
        f'its own run (e.g. --gin.MIXTURE_OR_TASK_NAME=\\"{own[0]}\\"), or use `python -m '
        't5align.eval`, which applies every task its own entry.')
  # None of the mixture's tasks has an entry: refused, or pooled when allowed.
  return schedule.for_task(task, allow_pooled=allow_pooled, source=source)


class ScheduledTransformer(network.Transformer):
  """`network.Transformer` whose encoder temperature comes per example from a schedule file.

  For callers that never pass `temperature` (t5x's EncoderDecoderModel calls `encode(tokens)`):
  each row's tau is `schedule.temperatures(encoder_input_tokens)`, from its non-pad length, with
  the schedule `task_schedule(schedule_path, schedule_strategy, schedule_task,
  allow_schedule_mismatch)` (a file with per-task entries: `schedule_task`'s own). Parameters
  and signatures are the parent's; an explicit `temperature` still wins. The schedule is read,
  and checked against the task, when the module is built (gin configures it before t5x
  restores the checkpoint), and a strategy calibrated with a bias rule gives the encoder that
  rule (`TemperatureSchedule.model_config`).
  """

  schedule_path: str | None = None
  schedule_strategy: str | None = None
  schedule_task: str | None = None
  allow_schedule_mismatch: bool = False

  def __post_init__(self):
    if self.schedule_path:
      schedule = task_schedule(self.schedule_path, self.schedule_strategy, self.schedule_task,
                               self.allow_schedule_mismatch)
      # The strategy's bias rule, if it calibrated one (static in the encoder).
      object.__setattr__(self, 'config', schedule.model_config(self.config))
    super().__post_init__()

  def encode(self, encoder_input_tokens, encoder_segment_ids=None, enable_dropout=True,
             temperature=None):
    if temperature is None and self.schedule_path:
      temperature = task_schedule(self.schedule_path, self.schedule_strategy,
                                  self.schedule_task, self.allow_schedule_mismatch
                                  ).temperatures(encoder_input_tokens)
    return super().encode(encoder_input_tokens, encoder_segment_ids=encoder_segment_ids,
                          enable_dropout=enable_dropout, temperature=temperature)
