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
import hashlib
import os
import warnings
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from t5align import calibration
from t5align.runtime import fileio
from t5align import labels
from t5align.runtime import outputs
from t5align import partitioning
from t5align.evaluation import predictions
from t5align import run_identity
from t5align.runtime import validate

if TYPE_CHECKING:  # Annotations only: the schedule's data needs no model at run time.
  from t5align import network

FORMAT = 't5align.temperature_schedule.v1'


def _need(mapping: Any, key: str, kind: Any, source: str, where: str) -> Any:
  """`mapping[key]`, which must be of `kind`; errors name `source` and `where`."""
  if not isinstance(mapping, Mapping) or key not in mapping:
    raise ValueError(f'{source}: {where} has no key {key!r}.')
  if not isinstance(mapping[key], kind) or isinstance(mapping[key], bool) and kind is not bool:
    names = kind.__name__ if isinstance(kind, type) else '/'.join(k.__name__ for k in kind)
    raise ValueError(f'{source}: {where}[{key!r}] must be {names}; got {mapping[key]!r}.')
  return mapping[key]


def calibration_from_dict(item: Mapping[str, Any], source: str,
                          where: str = 'calibration') -> calibration.Calibration:
  """A `Calibration` from its JSON form (`dataclasses.asdict`); errors name `source`, `where`."""
  _need(item, 'strategy', str, source, where)
  _need(item, 'length', int, source, where)
  _need(item, 'reference_length', int, source, where)
  _need(item, 'tau', (int, float, list), source, where)
  fields = {f.name for f in dataclasses.fields(calibration.Calibration)}
  item = {k: v for k, v in item.items() if k in fields}
  for key in ('tau', 'target', 'achieved'):
    if key == 'tau' or item.get(key) is not None:
      item[key] = _taus(item[key], source, where, key)
  return calibration.Calibration(**item)


def _taus(value: Any, source: str, where: str, key: str) -> Any:
  """A number, a list of numbers (per layer) or of equal-length lists (per layer and head),
  as `Calibration` holds it (nested tuples)."""
  number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
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
  calibrations: Mapping[str, tuple[calibration.Calibration, ...]]
  strategy: str
  provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  # Per-task calibrations ({task: {strategy: calibrations}}), each calibrated on that task's own
  # inputs as the paper does; `calibrations` is then the pooled fallback (`for_task`).
  tasks: Mapping[str, Mapping[str, tuple[calibration.Calibration, ...]]] = dataclasses.field(
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

  def for_task(self, task: str) -> TemperatureSchedule:
    """The schedule calibrated on `task`'s inputs; the pooled one, with a warning, if none."""
    if task in self.tasks:
      return TemperatureSchedule(self.reference_length, self.tasks[task], self.strategy,
                                 {**self.provenance, 'task': task})
    if self.tasks:
      warnings.warn(f'the schedule has no calibration for task {task!r} (it has '
                    f'{sorted(self.tasks)}); using its pooled calibrations.', stacklevel=2)
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

    if not isinstance(data, Mapping) or data.get('format') != FORMAT:
      found = data.get('format') if isinstance(data, Mapping) else type(data).__name__
      raise ValueError(f'{source}: not a temperature schedule (format {found!r}, expected '
                       f'{FORMAT!r}).')

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


@gin.configurable(module='t5align.schedule')
def load_schedule(path: str = gin.REQUIRED, strategy: str | None = None) -> TemperatureSchedule:
  """Reads a schedule JSON file; `strategy` selects the strategy applied (default: saved one)."""
  if not fileio.exists(path):
    raise FileNotFoundError(f'temperature schedule {path} does not exist.')
  data = outputs.read_json(path, 'temperature schedule')
  schedule = TemperatureSchedule.from_dict(data, source=f'temperature schedule {path}')
  return schedule.with_strategy(strategy) if strategy else schedule


def _sweep_order(strategies: Sequence[str]) -> list[str]:
  """`strategies` in the order one length computes them: Algorithm 1's grids first, so the
  continuous and per-layer searches start from their shared sweep (`calibration.Memo`)."""
  rank = {'grid': 0, 'closed_form': 1, 'bisect': 2}
  return sorted(strategies, key=lambda s: rank[calibration.parse_strategy(s)[1]])


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
    progress: Callable[[int, int, calibration.Calibration], None] | None = None,
    previous: Mapping[str, calibration.Calibration] | None = None,
    record: Callable[[str | None, calibration.Calibration], None] | None = None,
    **calibrate_kwargs,
) -> TemperatureSchedule:
  """Calibrates every (length, strategy) pair on the same documents.

  Args:
    params: the T5X 'params' tree.
    config: the model config.
    tokens: int `[b, >= max(lengths)]` samples; each length uses them cut to it.
    lengths: target lengths L_ex (each >= reference_length).
    strategies: names from `calibration.STRATEGIES`; the first is applied by default.
    reference_length: L_tr.
    reference_tokens: separate `[b', L_tr]` reference samples; None cuts `tokens` to L_tr.
    provenance: extra facts to record (checkpoint, source, seed, ...).
    progress: called as `progress(done, total, calibration)` after each pair.
    previous: calibrations an interrupted run made, by `calibration_key` (task None), taken as
      they are (`_resumed`: a grid strategy whose sweep a continuous search still needs is
      made again), so the schedule equals an uninterrupted run's.
    record: called as `record(None, calibration)` for each new calibration, as it finishes
      (`CalibrationLog.add`).
    **calibrate_kwargs: passed to `calibration.calibrate` (grid, tol, mesh, batch_size, memo,
      ...); every pair shares one `calibration.Memo` (a new one unless `memo` is given).

  Returns:
    The schedule, its provenance holding lengths, strategies, sample counts and settings.
  """
  tokens = calibration.check_tokens(tokens)
  lengths = sorted({int(L) for L in lengths})
  if not lengths or not strategies:
    raise ValueError('need at least one length and one strategy.')
  if lengths[-1] > tokens.shape[1]:
    raise ValueError(f'samples have {tokens.shape[1]} positions; the longest length is '
                     f'{lengths[-1]}.')
  for L in lengths:
    calibration.check_lengths(L, reference_length)
  for s in strategies:
    calibration.parse_strategy(s)
  params = partitioning.place_params(params, config, calibrate_kwargs.get('mesh'))
  calibrate_kwargs['memo'] = calibrate_kwargs.get('memo') or calibration.Memo()
  cals = {s: [] for s in strategies}
  total = len(lengths) * len(strategies)
  eos_id = calibrate_kwargs.get('eos_id', 1)
  for i, L in enumerate(lengths):
    cut = calibration.cut_to_length(tokens, L, eos_id)
    done = _resumed(previous, None, strategies, L)
    for j, s in enumerate(_sweep_order(strategies)):
      c = done.get(s) or calibration.calibrate(
          params, config, cut, s, reference_tokens=reference_tokens,
          reference_length=reference_length, **calibrate_kwargs)
      cals[s].append(c)
      if record is not None and s not in done and calibration_key(None, s, L) not in (
          previous or {}):
        record(None, c)
      if progress is not None:
        progress(i * len(strategies) + j + 1, total, c)
  settings = {k: v for k, v in calibrate_kwargs.items() if k not in ('mesh', 'memo')}
  if calibrate_kwargs.get('mesh') is not None:
    settings['mesh'] = dict(calibrate_kwargs['mesh'].shape)
  record = {
      'lengths': lengths, 'strategies': list(strategies), 'reference_length': reference_length,
      'num_samples': int(tokens.shape[0]), 'sample_width': int(tokens.shape[1]),
      'samples_sha256': hashlib.sha256(tokens.tobytes()).hexdigest(),  # int32 [b, width]
      'reference': 'same documents cut to L_tr' if reference_tokens is None else
                   f'{len(reference_tokens)} separate samples',
      'settings': settings, **(provenance or {})}
  return TemperatureSchedule(reference_length=reference_length, strategy=strategies[0],
                             calibrations={k: tuple(v) for k, v in cals.items()},
                             provenance=record)


def calibrate_tasks(
    params: Any,
    config: network.T5Config,
    task_inputs: Mapping[str, tuple[Any, Any]],
    strategies: Sequence[str],
    *,
    reference_length: int,
    progress: Callable[[int, int, calibration.Calibration], None] | None = None,
    previous: Mapping[str, calibration.Calibration] | None = None,
    record: Callable[[str | None, calibration.Calibration], None] | None = None,
    **calibrate_kwargs,
) -> dict[str, dict[str, tuple[calibration.Calibration, ...]]]:
  """Per-task calibration, as the paper does it: each task on its own inputs.

  Args:
    params: the T5X 'params' tree.
    config: the model config.
    task_inputs: {task: (tokens, reference_tokens)}: int `[b, L_ex]` whole task inputs (0-padded;
      L_ex = the width, i.e. the longest) and `[b', <= L_tr]` the same task at L_tr (its setting
      nearest L_tr, or its examples cut by `calibration.cut_at_boundary`); or {task: a list of
      such pairs}, one per L_ex (distinct widths).
    strategies: names from `calibration.STRATEGIES`.
    reference_length: L_tr.
    progress: called as `progress(done, total, calibration)`.
    previous, record: as `build_schedule`'s, per (task, L_ex).
    **calibrate_kwargs: passed to `calibration.calibrate` (a shared Memo unless `memo` given).

  Returns:
    {task: {strategy: (calibration,)}}, ready for `TemperatureSchedule(tasks=...)`.
  """
  calibrate_kwargs['memo'] = calibrate_kwargs.get('memo') or calibration.Memo()
  params = partitioning.place_params(params, config, calibrate_kwargs.get('mesh'))
  pairs = {t: v if isinstance(v, list) else [v] for t, v in task_inputs.items()}
  out, done, total = {}, 0, sum(len(v) for v in pairs.values()) * len(strategies)
  for task, items in pairs.items():
    out[task] = {s: [] for s in strategies}
    for tokens, reference in items:
      length = int(np.shape(tokens)[1])
      resumed = _resumed(previous, task, strategies, length)
      for s in _sweep_order(strategies):
        try:
          c = resumed.get(s) or calibration.calibrate(
              params, config, tokens, s, reference_tokens=reference,
              reference_length=reference_length, **calibrate_kwargs)
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


def _resumed(previous: Mapping[str, calibration.Calibration] | None, task: str | None,
             strategies: Sequence[str], length: int) -> dict[str, calibration.Calibration]:
  """{strategy: calibration} of `previous` at (`task`, `length`) to take as they are: all found,
  except the grid strategies' when a continuous search there is still to do (it starts from
  their sweep, which is then made again, as in one uninterrupted run)."""
  found = {s: (previous or {}).get(calibration_key(task, s, length)) for s in strategies}
  searches = any(c is None and calibration.parse_strategy(s)[1] == 'bisect'
                 for s, c in found.items())
  return {s: c for s, c in found.items()
          if c is not None and not (searches and calibration.parse_strategy(s)[1] == 'grid')}


class CalibrationLog:
  """The calibrations a run has finished, one JSON line each, appended and fsynced as each one
  finishes (`predictions.PredictionLog`): a rerun after a kill or a failed write (a full disk)
  redoes none of them.

  Its first record, written with the first calibration, is the run identity (`run_identity`);
  the log of a run with another identity is refused, naming the differing fields.
  """

  def __init__(self, path: str, identity: Mapping[str, Any]):
    self.path = path
    self._log = predictions.PredictionLog(path, key='key')
    self._identity = None  # To write with the first calibration.
    if self.done():
      recorded = self._log.records.get('identity')
      run_identity.check_same(
          None if recorded is None else recorded.get('identity'), identity,
          what=f'calibration progress {path}',
          hint=f'Rerun with the settings it was made with, or delete {path} to start over.')
      return
    if len(self._log):  # An identity alone: its run made nothing.
      self.remove()
      self._log = predictions.PredictionLog(path, key='key')
    self._identity = {'key': 'identity', 'identity': dict(identity)}

  def done(self) -> dict[str, dict[str, Any]]:
    """{`calibration_key`: the calibration as JSON} of every logged calibration."""
    return {k: r['calibration'] for k, r in self._log.records.items() if k != 'identity'}

  def add(self, task: str | None, c: calibration.Calibration) -> None:
    """Appends `c` (`task`'s, or pooled: None) in one write."""
    record = {'key': calibration_key(task, c.strategy, c.length), 'task': task,
              'calibration': outputs.jsonable(dataclasses.asdict(c), what=self.path)}
    self._log.append([self._identity, record] if self._identity else [record])
    self._identity = None

  def remove(self) -> None:
    """Deletes the log (the run's schedule is written)."""
    if fileio.is_remote(self.path):
      fileio.write_atomic(self.path, b'')  # Object stores: an empty log holds nothing.
    elif os.path.exists(self.path):
      os.remove(self.path)


def resumed_calibrations(done: Mapping[str, Mapping[str, Any]], source: str
                         ) -> dict[str, calibration.Calibration]:
  """`CalibrationLog.done()` as `Calibration`s, for `build_schedule`'s `previous`."""
  return {k: calibration_from_dict(v, source, k) for k, v in done.items()}
