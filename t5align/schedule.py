"""Temperature schedules: calibrated taus for several lengths and strategies, saved as JSON.

A schedule maps an input's non-pad length L to a temperature by linear interpolation in log L
between its calibrated lengths. Below the smallest length it uses the L_tr anchor (tau = 1 at
L_tr, so inputs no longer than L_tr run untouched); above the largest it holds the last value
(no extrapolation: it could reach tau <= 0). Per-layer and per-head strategies interpolate each
layer (and head) alike.

Use at inference:
  schedule = load_schedule('schedule.json', strategy='pmax')
  tau = schedule.temperatures(tokens)        # [batch, 1], [batch, layers] or [batch, layers, heads]
  model.apply(..., tokens, method='encode', temperature=tau)
or from gin: `temperature_schedule = @t5align.schedule.load_schedule()` with
`t5align.schedule.load_schedule.path = '...'`.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import TYPE_CHECKING, Any, Mapping

import gin
import jax
import jax.numpy as jnp
import numpy as np

from t5align.attention import reference
from t5align import labels
from t5align.runtime import fileio
from t5align.runtime import outputs
from t5align.runtime import validate

if TYPE_CHECKING:  # Annotations only: the schedule's data needs no model at run time.
  pass

FORMAT = 't5align.temperature_schedule.v2'
# Format 1 (to 0.2.0): no `bias_rule` per calibration (every calibration used T5's bias).
FORMAT_1 = 't5align.temperature_schedule.v1'

Tau = float | tuple[float, ...] | tuple[tuple[float, ...], ...]  # scalar, [n] or [n, h]


@dataclasses.dataclass(frozen=True)
class Calibration:
  """One chosen temperature and the numbers that justify it (JSON-able via `asdict`)."""

  strategy: str
  length: int  # L_ex
  reference_length: int  # L_tr
  # A tuple (one per layer) for per-layer strategies, `[layers][heads]` tuples for per-head ones.
  tau: Tau
  target: Tau | None = None  # statistic at L_tr, tau = 1 (of the encoder, each layer or head)
  achieved: Tau | None = None  # statistic at L_ex, chosen tau
  clamped: bool = False  # the target lay outside the searched range, or tau was clamped to 1
  details: dict = dataclasses.field(default_factory=dict)
  note: str = ''  # why `clamped` is set, in words (shown under `TemperatureSchedule.table`)
  # The encoder's relative-bias rule with this tau (`reference.BIAS_RULES`), resolved from the
  # lengths: s = L_tr / L ('interpolate'), e = L / L_tr ('extend'); 'none': T5's bias.
  bias_rule: str = 'none'


def _need(mapping: Any, key: str, kind: Any, source: str, where: str) -> Any:
  """`mapping[key]`, which must be of `kind`; errors name `source` and `where`."""
  if not isinstance(mapping, Mapping) or key not in mapping:
    raise ValueError(f'{source}: {where} has no key {key!r}.')
  if not isinstance(mapping[key], kind) or isinstance(mapping[key], bool) and kind is not bool:
    names = kind.__name__ if isinstance(kind, type) else '/'.join(k.__name__ for k in kind)
    raise ValueError(f'{source}: {where}[{key!r}] must be {names}; got {mapping[key]!r}.')
  return mapping[key]


def calibration_from_dict(item: Mapping[str, Any], source: str,
                          where: str = 'calibration') -> Calibration:
  """A `Calibration` from its JSON form (`dataclasses.asdict`); errors name `source`, `where`."""
  _need(item, 'strategy', str, source, where)
  _need(item, 'length', int, source, where)
  _need(item, 'reference_length', int, source, where)
  _need(item, 'tau', (int, float, list), source, where)
  if 'bias_rule' in item and item['bias_rule'] not in reference.BIAS_RULES:
    raise ValueError(f'{source}: {where}[\'bias_rule\'] must be one of {reference.BIAS_RULES}; '
                     f'got {item["bias_rule"]!r}.')
  fields = {f.name for f in dataclasses.fields(Calibration)}
  item = {k: v for k, v in item.items() if k in fields}
  for key in ('tau', 'target', 'achieved'):
    if key == 'tau' or item.get(key) is not None:
      item[key] = _taus(item[key], source, where, key)
  return Calibration(**item)


def _taus(value: Any, source: str, where: str, key: str) -> Any:
  """A number, a list of numbers (per layer) or of equal-length lists (per layer and head),
  as `Calibration` holds it (nested tuples); a target's or achieved statistic's numbers finite
  (a schedule is written without NaN or inf, so one there is an edit or corruption)."""
  number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
  flat = value if isinstance(value, list) else [value]
  flat = [x for v in flat for x in (v if isinstance(v, list) else [v])]
  bad = [v for v in flat if number(v) and not math.isfinite(v)]
  if bad and key != 'tau':  # A tau's range is checked with the schedule's (`validate`).
    raise ValueError(f'{source}: {where}[{key!r}] holds {bad[0]!r}; every number there must be '
                     'finite (calibrate writes no NaN or inf).')
  if number(value):
    return value
  if isinstance(value, list) and value and all(number(v) for v in value):
    return tuple(value)
  if (isinstance(value, list) and value and all(
      isinstance(v, list) and v and all(number(x) for x in v) for v in value)
      and len({len(v) for v in value}) == 1):
    return tuple(tuple(v) for v in value)
  raise ValueError(f'{source}: {where}[{key!r}] must be a number, a list of numbers (one per '
                   'layer) or a list of equal-length lists of numbers (one per layer and '
                   f'head); got {value!r}.')


@dataclasses.dataclass(frozen=True)
class TemperatureSchedule:
  """Calibrations per strategy (sorted by length), the strategy applied, and provenance."""

  reference_length: int
  calibrations: Mapping[str, tuple[Calibration, ...]]
  strategy: str
  provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  # Per-task calibrations ({task: {strategy: calibrations}}), each calibrated on that task's own
  # inputs as the paper does; `calibrations` is then the pooled fallback (`for_task`).
  tasks: Mapping[str, Mapping[str, tuple[Calibration, ...]]] = dataclasses.field(
      default_factory=dict)

  def __post_init__(self):
    if not self.calibrations:
      raise ValueError('a schedule needs at least one strategy.')
    cals = {}
    for name, items in self.calibrations.items():
      validate.schedule_lengths([c.length for c in items], self.reference_length,
                                f'strategy {name!r}')
      items = tuple(sorted(items, key=lambda c: c.length))
      lengths = [c.length for c in items]
      if not items or len(set(lengths)) != len(lengths):
        raise ValueError(f'strategy {name!r}: need distinct calibrated lengths; got {lengths}.')
      if any(c.strategy != name or c.reference_length != self.reference_length for c in items):
        raise ValueError(f'strategy {name!r}: every calibration must have strategy {name!r} and '
                         f'reference_length {self.reference_length}.')
      shapes = {np.shape(c.tau) for c in items}
      if len(shapes) != 1:
        raise ValueError(f'strategy {name!r} mixes tau shapes {sorted(shapes)}; every length '
                         'needs the same: scalar, [layers] or [layers, heads].')
      if len(next(iter(shapes))) > 2:
        raise ValueError(f'strategy {name!r}: taus of shape {next(iter(shapes))}; expected a '
                         'scalar, [layers] or [layers, heads].')
      validate.temperature_array([np.ravel(c.tau) for c in items], f'{name} taus')
      cals[name] = items
    object.__setattr__(self, 'calibrations', cals)
    if self.strategy not in cals:
      raise ValueError(f'strategy={self.strategy!r}; this schedule has {sorted(cals)}.')
    tasks = {}
    for task, task_cals in self.tasks.items():
      try:  # Validated as a schedule of its own.
        tasks[task] = TemperatureSchedule(self.reference_length, task_cals,
                                          self.strategy).calibrations
      except ValueError as e:
        raise ValueError(f'task {task!r}: {e}') from e
    object.__setattr__(self, 'tasks', tasks)

  @property
  def strategies(self) -> tuple[str, ...]:
    return tuple(self.calibrations)

  def with_strategy(self, strategy: str) -> TemperatureSchedule:
    """The same schedule applying `strategy`."""
    return dataclasses.replace(self, strategy=strategy)

  def for_task(self, task: str, *, allow_pooled: bool = False, source: str = 'the schedule',
               allow_with: str = '--gin.ALLOW_SCHEDULE_MISMATCH=True') -> TemperatureSchedule:
    """The schedule calibrated on `task`'s inputs (a file without per-task entries: itself).

    Raises:
      ValueError: naming `source`, the task and the tasks it has, when it has per-task entries
        and none for `task`: its pooled temperatures were calibrated on other tasks' inputs.
        With `allow_pooled` (the user's explicit choice, `allow_with` in the message) the pooled
        schedule is returned instead, with a warning.
    """
    if task in self.tasks:
      return TemperatureSchedule(self.reference_length, self.tasks[task], self.strategy,
                                 {**self.provenance, 'task': task})
    if self.tasks:
      words = (f'{source} has no calibration for task {task!r} (it has '
               f'{", ".join(sorted(self.tasks))})')
      if not allow_pooled:
        raise ValueError(f'{words}: its pooled temperatures were calibrated on those tasks\' '
                         'inputs. Calibrate this task (with the others: calibrate\'s '
                         f'SEQIO_TASK), or set {allow_with} to apply the pooled ones.')
      warnings.warn(f'{words}; using its pooled calibrations ({allow_with}).', stacklevel=2)
    return self

  def task_comparison(self, strategy: str | None = None) -> list[dict[str, Any]]:
    """Per task and calibrated length: the task's tau, the pooled schedule's tau there, and
    their difference (scalar strategies; per-layer and per-head taus are averaged)."""
    strategy = strategy or self.strategy
    rows = []
    for task, cals in self.tasks.items():
      for c in cals.get(strategy, ()):
        own = float(np.mean(c.tau))
        pooled = float(np.mean(self.tau_for_length(c.length, strategy)))
        rows.append({'task': task, 'strategy': strategy, 'length': c.length, 'tau_task': own,
                     'tau_pooled': pooled, 'difference': own - pooled})
    return rows

  def task_table(self, strategy: str | None = None) -> str:
    """Plain-text per-task vs pooled temperatures (`task_comparison`)."""
    rows = self.task_comparison(strategy)
    head = f'{"task":<32}{"L_ex":>8}{"tau task":>10}{"tau pooled":>12}{"diff":>8}'
    label = labels.strategy_label(strategy or self.strategy)
    lines = [f'Per-task vs pooled temperatures ({label}, '
             f'L_tr = {self.reference_length})', head, '-' * len(head)]
    lines += [f'{r["task"]:<32}{r["length"]:>8}{r["tau_task"]:>10.3f}{r["tau_pooled"]:>12.3f}'
              f'{r["difference"]:>+8.3f}' for r in rows]
    return '\n'.join(lines)

  def points(self, strategy: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Interpolation knots: lengths `[m]` and taus `[m]`, `[m, layers]` or `[m, layers, heads]`,
    with the L_tr anchor."""
    items = self.calibrations[strategy or self.strategy]
    lengths = np.array([c.length for c in items], np.float64)
    taus = np.array([c.tau for c in items], np.float64)
    if lengths[0] > self.reference_length:
      lengths = np.concatenate([[self.reference_length], lengths])
      taus = np.concatenate([np.ones_like(taus[:1]), taus])
    return lengths, taus

  def tau_for_length(self, length: Any, strategy: str | None = None) -> np.ndarray:
    """Taus for lengths `[...]`: `[...]` (scalar strategies), `[..., layers]` (per-layer) or
    `[..., layers, heads]` (per-head)."""
    x = np.log(np.maximum(np.asarray(length, np.float64), 1.0))
    lengths, taus = self.points(strategy)
    if taus.ndim == 1:
      return np.interp(x, np.log(lengths), taus)
    columns = taus.reshape(len(taus), -1).T  # [m, layers(, heads)] -> [c, m]
    # [...] -> [..., c] -> [..., layers(, heads)]
    out = np.stack([np.interp(x, np.log(lengths), col) for col in columns], axis=-1)
    return out.reshape(np.shape(x) + taus.shape[1:])

  def encode_temperature(self, length: int, strategy: str | None = None) -> float | np.ndarray:
    """The `temperature=` of `network.Transformer.encode` for inputs of `length` tokens: a float
    (scalar strategies), float32 `[1, layers]` (per-layer) or `[1, layers, heads]` (per-head);
    never ambiguous with one value per example."""
    tau = self.tau_for_length(length, strategy)
    return float(tau) if np.ndim(tau) == 0 else np.asarray(tau, np.float32)[None]

  def temperatures(self, tokens: Any, strategy: str | None = None) -> jax.Array:
    """Per-example temperatures from each row's non-pad length (traceable under jit).

    Args:
      tokens: int `[b, l]` encoder inputs, 0 = padding.
      strategy: which strategy; the schedule's own by default.

    Returns:
      float32 `[b, 1]` (scalar strategies), `[b, layers]` (per-layer) or `[b, layers, heads]`
      (per-head), ready for `encode`'s `temperature=`. NOTE: at least 2-D, so it never reads as
      one value per layer when b == layers.
    """
    lengths, taus = self.points(strategy)
    # [b, l] -> [b]
    x = jnp.log(jnp.maximum(jnp.sum(jnp.asarray(tokens) > 0, axis=-1), 1).astype(jnp.float32))
    xp = jnp.asarray(np.log(lengths), jnp.float32)
    fp = jnp.asarray(taus.reshape(len(taus), -1), jnp.float32)  # [m, 1 or layers(* heads)]
    # [b] x [m] x [m, c] -> [b, c]
    out = jnp.stack([jnp.interp(x, xp, fp[:, j]) for j in range(fp.shape[1])], axis=-1)
    # [b, layers * heads] -> [b, layers, heads] (per-head); [b, 1 or layers] stays.
    return out.reshape(out.shape[:1] + taus.shape[1:]) if taus.ndim == 3 else out

  def to_dict(self) -> dict[str, Any]:
    return outputs.jsonable({
        'format': FORMAT,
        'reference_length': self.reference_length,
        'strategy': self.strategy,
        'calibrations': {k: [dataclasses.asdict(c) for c in v]
                         for k, v in self.calibrations.items()},
        'provenance': dict(self.provenance),
        # Optional: files without it (and readers that ignore it) keep working.
        **({'tasks': {t: {k: [dataclasses.asdict(c) for c in v] for k, v in cals.items()}
                      for t, cals in self.tasks.items()}} if self.tasks else {}),
    }, what='a schedule')

  @classmethod
  def from_dict(cls, data: Mapping[str, Any], source: str = 'schedule') -> TemperatureSchedule:
    """The schedule of a `to_dict` mapping; errors name `source` (the file) and the key at fault."""
    def need(mapping, key, kind, where):
      return _need(mapping, key, kind, source, where)

    data = upgrade(data, source)

    def make(item, where):
      return calibration_from_dict(item, source, where)

    cals = need(data, 'calibrations', dict, 'the file')
    items = {}
    for name, value in cals.items():
      if not isinstance(value, list):
        raise ValueError(f'{source}: calibrations[{name!r}] must be a list; got {value!r}.')
      items[name] = tuple(make(c, f'calibrations[{name!r}][{i}]') for i, c in enumerate(value))
    tasks = {}
    for task, task_cals in data.get('tasks', {}).items():
      if not isinstance(task_cals, dict):
        raise ValueError(f'{source}: tasks[{task!r}] must be an object; got {task_cals!r}.')
      tasks[task] = {}
      for name, value in task_cals.items():
        if not isinstance(value, list):
          raise ValueError(f'{source}: tasks[{task!r}][{name!r}] must be a list; got {value!r}.')
        tasks[task][name] = tuple(make(c, f'tasks[{task!r}][{name!r}][{i}]')
                                  for i, c in enumerate(value))
    try:
      return cls(reference_length=need(data, 'reference_length', int, 'the file'),
                 strategy=need(data, 'strategy', str, 'the file'), calibrations=items,
                 provenance=data.get('provenance', {}), tasks=tasks)
    except ValueError as e:
      if str(e).startswith(source):
        raise
      raise ValueError(f'{source}: {e}') from e

  def bias_rule(self, length: int, strategy: str | None = None) -> str:
    """The bias rule (`reference.BIAS_RULES`) of `strategy` for inputs `length` tokens wide:
    that of the calibrated length nearest in log length ('none' at and below L_tr). A rule is
    static in the compiled encoder, so one holds per input width: a 'bias=joint' strategy that
    chose different rules at different lengths applies its neighbour's."""
    if length <= self.reference_length:
      return 'none'
    items = self.calibrations[strategy or self.strategy]
    return min(items, key=lambda c: abs(math.log(c.length / length))).bias_rule

  def model_config(self, config: Any, length: int | None = None) -> Any:
    """`config` (a `network.T5Config`) with this schedule's bias rule for inputs `length` tokens
    wide (`bias_rule`), resolved from L_tr / L at each input's width; as it is where the rule is
    'none'. `length` None (a caller that does not know the width: t5x's model, built before its
    data): the strategy's one rule, refused if its calibrations differ. A rule given both ways
    (the config's `encoder_bias_rule`, e.g. gin's BIAS_RULE, and the schedule's) is refused,
    naming both."""
    if length is None:
      kinds = sorted({c.bias_rule for c in self.calibrations[self.strategy]})
      if len(kinds) > 1:
        raise ValueError(
            f'schedule strategy {self.strategy!r} chose the bias rules {kinds} at different '
            'lengths, and this model applies one to every input: calibrate at the one length '
            "evaluated (per task), or run `python -m t5align.eval`, which applies each width's.")
      kind = kinds[0]
    else:
      kind = self.bias_rule(length)
    rule = reference.BiasRule(kind, reference_length=self.reference_length)
    own = config.encoder_bias_rule
    if kind == 'none' or own == rule:  # (A module rebuilt from its clone has it already.)
      return config
    if config.has_bias_rule:
      raise ValueError(
          f'the model sets a bias rule (T5Config.encoder_bias_rule={own!r}, e.g. BIAS_RULE) and '
          f'the schedule strategy {self.strategy!r} calibrated its own ({kind!r}): set one of '
          'them.')
    return dataclasses.replace(config, encoder_bias_rule=rule)

  def save(self, path: str) -> None:
    """Writes JSON atomically (a temporary file in the same folder, then os.replace)."""
    fileio.write_json_atomic(path, self.to_dict(), allow_nan=False, sort_keys=False)

  def table(self) -> str:
    """Plain-text table in the layout of the paper's appendix temperature tables."""
    lengths = sorted({c.length for v in self.calibrations.values() for c in v})
    head = f'{"Strategy":<24}' + ''.join(f'{L:>8}' for L in lengths)
    lines = [f'Temperatures (L_tr = {self.reference_length}; * = target outside the searched '
             'range, or a closed form clamped to 1)', head, '-' * len(head)]
    for name, items in self.calibrations.items():
      digits = 2 if name in ('pmax', 'entropy', 'log_length') else 3
      by_length = {c.length: c for c in items}
      # Per-layer and per-head strategies: one row per layer (a per-head row: its heads' mean).
      per_head = np.ndim(items[0].tau) == 2
      rows = range(len(items[0].tau)) if np.ndim(items[0].tau) else [None]
      for layer in rows:
        label = labels.strategy_label(name) + ('' if layer is None else f' L{layer}') + (
            ' mean' if per_head else '')
        cells = []
        for L in lengths:
          c = by_length.get(L)
          tau = None if c is None else (c.tau if layer is None else float(np.mean(c.tau[layer])))
          cells.append(f'{"-":>8}' if c is None else
                       f'{tau:>{7}.{digits}f}{"*" if c.clamped else " "}')
        lines.append(f'{label:<24}' + ''.join(cells))
    notes = [f'  * {labels.strategy_label(name)} at {c.length}: {c.note}' for name, items in
             self.calibrations.items() for c in items if c.clamped and c.note]
    return '\n'.join(lines + notes)


def upgrade(data: Any, source: str) -> Mapping[str, Any]:
  """A schedule file's mapping in today's format (`FORMAT`), read from format 1 or 2; the file
  itself is left as it is. Format 1 calibrations have no `bias_rule`, so they read with
  `Calibration.bias_rule`'s default, 'none' (T5's bias, the only one then)."""
  found = data.get('format') if isinstance(data, Mapping) else type(data).__name__
  if found == FORMAT:
    return data
  if found != FORMAT_1:
    raise ValueError(f'{source}: not a temperature schedule (format {found!r}, expected '
                     f'{FORMAT!r} or {FORMAT_1!r}).')
  return {**data, 'format': FORMAT}


@gin.configurable(module='t5align.schedule')
def load_schedule(path: str = gin.REQUIRED, strategy: str | None = None) -> TemperatureSchedule:
  """Reads a schedule JSON file; `strategy` selects the strategy applied (default: saved one)."""
  if not fileio.exists(path):
    raise FileNotFoundError(f'temperature schedule {path} does not exist.')
  data = outputs.read_json(path, 'temperature schedule')
  schedule = TemperatureSchedule.from_dict(data, source=f'temperature schedule {path}')
  return schedule.with_strategy(strategy) if strategy else schedule
