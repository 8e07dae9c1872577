"""Attention alignment: encoder softmax temperatures for long inputs (paper Alg. 1, Props. 1-2).

Strategies (`STRATEGIES`), each giving tau for a target length L_ex from a reference length L_tr:
  'pmax', 'entropy'        Algorithm 1: tau on the grid 1.0, 0.95, ..., 0.5 whose mean statistic at
                           L_ex is closest to the mean statistic at L_tr with tau = 1.
  'pmax_bisect', ...       the same alignment solved continuously (to `tol` in tau).
  'pmax_per_layer', ...    one tau per layer, layers in order: layer i's tau is searched with layers
                           < i already at their chosen taus (the paper's future work).
  'pmax_per_head', ...     one tau per head of each layer, each head aligned to its own L_tr
                           statistic: layers in order, a layer's heads searched together (each
                           head's statistic depends on its own tau and the layers before only;
                           `search_lib.align_heads`).
  'log_length'             tau = log_{L_ex} L_tr (length-only baseline).
  'prop1', 'prop2'         closed forms from layer 0's average sorted logit vector.
  'infoscale_head',        training-free temperatures of other work, from L_ex, L_tr and the
  'infoscale_model',       attention's shape only (`closed_form.FORMULAS`, sources in each
  'llama4_length',         function's docstring): InfoScale with d = d_h or heads x d_h, Llama 4's
  'yarn_mscale'            length term floored at L_tr, YaRN's 1 / (0.1 ln(L_ex / L_tr) + 1)^2.

Options, appended to a name with ':' (`parse_name`; any order, each at most once):
  'from_layer=K'           the temperature applies from encoder layer K on (tau = 1 below; the
                           statistic matched is pooled over layers K.. only); for the
                           encoder-wide strategies (not the per-layer / per-head ones).
  'floor'                  never flatter than trained: tau = min(tau, 1), 1 at L_tr (the
                           entropy-aware form of Zhang et al. 2024).
  'bias=RULE'              a relative-bias rule of the encoder (`reference.BiasRule`:
                           'interpolate', s = L_tr / L; 'extend', e = L / L_tr) on while tau is
                           calibrated and applied; 'bias=joint' chooses the rule with tau
                           (Algorithm 1 over (rule, tau) pairs, for 'pmax' and 'entropy').
  and the base 'none' (tau = 1), for a bias rule alone: 'none:bias=interpolate'.
e.g. 'pmax:from_layer=1:floor', 'entropy:bias=joint', 'log_length:bias=extend'.

This module is the strategy level (`calibrate`), over `search`, `stats` and `closed_form` (see
the package's docstring).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import numpy as np
from jax.sharding import Mesh

from t5align.attention import reference
from t5align.calibration import closed_form as closed_form_lib
from t5align.calibration import search as search_lib
from t5align.calibration import stats as stats_lib
from t5align import network
from t5align import partitioning
from t5align import schedule
from t5align import fields
from t5align.runtime import validate


# T5's SentencePiece EOS: the default of the library calls below; pass another vocabulary's
# `eos_id` (e.g. 2 for CodeT5's BPE) where it differs.
T5_EOS_ID = 1
STATISTICS = ('pmax', 'entropy')
STRATEGIES = ('pmax', 'entropy', 'pmax_bisect', 'entropy_bisect', 'pmax_per_layer',
              'entropy_per_layer', 'pmax_per_head', 'entropy_per_head', 'log_length', 'prop1',
              'prop2', 'infoscale_head', 'infoscale_model', 'llama4_length', 'yarn_mscale')
# What one calibration's tau covers (`parse_strategy`): the whole encoder, each layer, each head.
SCOPES = ('encoder', 'layer', 'head')
NONE = 'none'  # The base of a bias rule alone (tau = 1).
JOINT = 'joint'  # bias=joint: the rule chosen with tau.
# The rules 'bias=joint' chooses among, in the order ties are broken.
JOINT_RULES = reference.BIAS_RULES


class Spec(NamedTuple):
  """A strategy name parsed (`parse_name`): its base strategy and options."""

  base: str  # one of STRATEGIES, or NONE
  from_layer: int = 0
  floor: bool = False
  bias: str = 'none'  # one of reference.BIAS_RULES, or JOINT

  @property
  def name(self) -> str:
    """The canonical name: the base, then from_layer, floor and bias in that order."""
    parts = [self.base]
    if self.from_layer:
      parts.append(f'from_layer={self.from_layer}')
    if self.floor:
      parts.append('floor')
    if self.bias != 'none':
      parts.append(f'bias={self.bias}')
    return ':'.join(parts)

  def bias_rule(self, reference_length: int, kind: str | None = None) -> reference.BiasRule:
    """The rule resolved from the lengths (`kind`: the one chosen for 'bias=joint')."""
    kind = kind or self.bias
    if kind == JOINT:
      raise ValueError('bias=joint names no rule until it is calibrated.')
    return reference.BiasRule(kind, reference_length=reference_length)


def parse_name(strategy: Any) -> Spec:
  """A strategy name and its options (module docstring); ValueError names the part at fault."""
  if not isinstance(strategy, str):
    raise ValueError(f'strategy={strategy!r}: expected a name such as {STRATEGIES[0]!r}.')
  base, *options = strategy.split(':')
  if base not in STRATEGIES and base != NONE:
    where = '' if base == strategy else f' (in {strategy!r})'
    raise ValueError(f'{base!r} is not a strategy{where}; expected one of '
                     f'{STRATEGIES + (NONE,)}, then options (from_layer=K, floor, bias=RULE).')
  fields: dict[str, Any] = {}
  for option in options:
    key, eq, value = option.partition('=')
    if key in fields:
      raise ValueError(f'strategy={strategy!r} gives {key!r} twice.')
    if key == 'from_layer' and eq and value.isdigit() and int(value) >= 1:
      fields[key] = int(value)
    elif key == 'floor' and not eq:
      fields[key] = True
    elif key == 'bias' and value in reference.BIAS_RULES[1:] + (JOINT,):
      fields[key] = value
    else:
      raise ValueError(
          f'strategy={strategy!r}: option {option!r}; expected from_layer=K (K >= 1), floor or '
          f'bias=RULE (RULE one of {reference.BIAS_RULES[1:] + (JOINT,)}).')
  spec = Spec(base, **fields)
  _, search, scope = _base_kind(base)
  if spec.from_layer and scope != 'encoder':
    raise ValueError(f'strategy={strategy!r}: from_layer is for the encoder-wide strategies; '
                     f'{base!r} already gives each layer its own tau.')
  if spec.bias == JOINT and search != 'grid':
    raise ValueError(f"strategy={strategy!r}: bias=joint extends Algorithm 1's grid search; "
                     f'use it with {STATISTICS}.')
  if base == NONE and spec.bias == 'none':
    raise ValueError(f"strategy={strategy!r}: 'none' (tau = 1) takes a bias rule, e.g. "
                     "'none:bias=interpolate'.")
  return spec


def is_strategy(name: Any) -> bool:
  """Whether `name` is a strategy name with valid options (`parse_name`)."""
  try:
    parse_name(name)
  except ValueError:
    return False
  return True


def _temperatures(values: Any, name: str, ndim: int) -> tuple[float, ...]:
  """A tuple or list of `ndim`-D temperatures (numbers, not text), as floats."""
  if not isinstance(values, (tuple, list)) or not values or any(
      isinstance(v, (str, bytes, bool)) for v in np.ravel(np.asarray(values, object))):
    raise fields.Refused()
  taus = validate.temperatures(values, name)
  if taus.ndim != ndim:
    raise fields.Refused(f'shape {taus.shape}')
  return tuple(taus.tolist())


def _bracket(values: Any) -> tuple[float, float]:
  if not isinstance(values, (tuple, list)) or len(values) != 2:
    raise fields.Refused()
  low, high = _temperatures(values, 'bracket', ndim=1)
  if not low < high:
    raise fields.Refused()
  return low, high


@dataclasses.dataclass(frozen=True)
class SearchSettings:
  """How calibrations search and compute (not what they align): one object per job.

  Attributes:
    grid: Algorithm 1's candidate taus (grid strategies).
    bracket: tau interval of the continuous searches.
    tol: bracket width at which a continuous search stops.
    points: taus per search round (None: the mesh's 'tau' size, else 2).
    mesh: optional ('tau', 'data', 'model') mesh of the statistics sweeps.
    batch_size: examples per call (None: all at once).
    tau_batch_size: candidate taus per call (None: all at once).
    eos_id: id that ends a row cut to L_tr (None: leave cut rows as they are).
    chunk: query chunk of the layer-0 sorted-logit computation (closed forms).

  gin builds it for `jobs.CalibrationJob.search` (gin/calibrate.gin: BATCH_SIZE,
  TAU_BATCH_SIZE); the job sets `mesh` (MESH_SHAPE) and `eos_id` (the inputs' vocabulary).
  """

  grid: tuple[float, ...] = fields.setting(search_lib.PAPER_GRID, check=fields.by(
      'a non-empty tuple of temperatures (finite, > 0)',
      lambda v: _temperatures(v, 'grid', ndim=1)))
  bracket: tuple[float, float] = fields.setting((0.05, 1.0), check=fields.by(
      'two temperatures (low, high), low < high', _bracket))
  tol: float = fields.setting(1e-3, check=fields.number(0, above=True))
  points: int | None = fields.setting(None, check=fields.optional(
      fields.integer(1), "None (the mesh's 'tau' size, else 2)"))
  mesh: Mesh | None = fields.setting(None, check=fields.optional(fields.instance(
      Mesh, 'a jax.sharding.Mesh')), unrecorded="set by the run from MESH_SHAPE (recorded as "
                                                 "'mesh_shape')")
  batch_size: int | None = fields.setting(
      None, check=fields.optional(fields.integer(1), 'None (all at once)'),
      unrecorded='examples are computed independently of their batch')
  tau_batch_size: int | None = fields.setting(
      None, check=fields.optional(fields.integer(1), 'None (all at once)'),
      unrecorded='candidate taus are computed independently of their batch')
  eos_id: int | None = fields.setting(
      T5_EOS_ID, check=fields.optional(fields.integer(0), 'None (cut rows left as they are)'),
      unrecorded="set by the run from the inputs' vocabulary, whose content is recorded")
  chunk: int = fields.setting(128, check=fields.integer(1),
                              unrecorded='the same values, computed in chunks')

  GIN_NAME: ClassVar[str] = 'calibration.SearchSettings'

  def __post_init__(self):
    fields.check_fields(self)

  @property
  def search_points(self) -> int:
    """Taus per round of a continuous search: two (trisection) share one compiled shape with
    the bracket's two ends; with a mesh, one per 'tau' device."""
    if self.points is not None:
      return self.points
    return self.mesh.shape['tau'] if self.mesh is not None else 2

  def stats_kwargs(self) -> dict[str, Any]:
    """The keywords of `Memo.attention_stats` / `stats.encoder_attention_stats`."""
    return dict(mesh=self.mesh, batch_size=self.batch_size, tau_batch_size=self.tau_batch_size)

  def record(self) -> dict[str, Any]:
    """JSON-able form for a schedule's provenance (the mesh as its axis sizes)."""
    fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    fields['mesh'] = None if self.mesh is None else dict(self.mesh.shape)
    return fields


def parse_strategy(strategy: str) -> tuple[str, str, str]:
  """(statistic, search, scope in `SCOPES`) of a name's base (options: `parse_name`):
  'pmax_per_layer' -> ('pmax', 'bisect', 'layer'); 'entropy:bias=joint' -> ('entropy', 'grid',
  'encoder'); 'prop1' -> ('prop1', 'closed_form', 'encoder'); 'none:...' -> ('none',
  'closed_form', 'encoder')."""
  return _base_kind(parse_name(strategy).base)


def _base_kind(strategy: str) -> tuple[str, str, str]:
  if strategy == NONE:
    return NONE, 'closed_form', 'encoder'
  base, _, variant = strategy.partition('_')
  if base not in STATISTICS:
    return strategy, 'closed_form', 'encoder'
  scope = {'per_layer': 'layer', 'per_head': 'head'}.get(variant, 'encoder')
  return base, ('grid' if not variant else 'bisect'), scope


def _as_float(x: Any) -> schedule.Tau:
  """A float, or nested tuples of floats (JSON-able, hashable) of a `[]`, `[n]` or `[n, h]`."""
  x = np.asarray(x, np.float64)
  if x.ndim == 0:
    return float(x)
  return tuple(_as_float(v) for v in x)


def _align(params, config, tokens, statistic, target_stats, *, search: str, scope: str,
           settings: SearchSettings, memo: stats_lib.Memo) -> tuple[Any, Any, bool, dict]:
  """Searches tau (or per-layer or per-head taus) so the statistic at `tokens` matches
  `target_stats`."""
  increasing = statistic == 'entropy'  # flatter with larger tau: entropy up, P_max down.
  # Algorithm 1's sweep at this length, if this run already made it (the grid strategies share
  # it): it warm-starts the continuous searches. Layer 0's statistic depends on layer 0's tau
  # only, so the sweep (every layer at the grid tau) also warm-starts the per-layer search, and
  # each layer-0 head's statistic on its own tau only: the per-head search too.
  grid, bracket, tol, points = (settings.grid, settings.bracket, settings.tol,
                                settings.search_points)
  sweep = memo.computed_stats(params, config, tokens, grid) if search == 'bisect' else None
  grid_taus = np.asarray(grid, np.float64)
  stats = lambda taus: memo.attention_stats(params, config, tokens, taus,
                                            **settings.stats_kwargs())

  def run_search(evaluate, target, known=None):
    if search == 'grid':
      return search_lib.grid_search(evaluate, target, grid)
    return search_lib.bisect_search(evaluate, target, increasing=increasing, bracket=bracket,
                                    tol=tol, points=points, known=known)

  if scope == 'head':
    head = f'head_{statistic}'  # Per-head strategies search continuously (`parse_strategy`).
    steps = lambda target, known, guess: search_lib.bisect_steps(
        target, increasing=increasing, bracket=bracket, tol=tol, points=points, known=known,
        guess=guess)
    chosen, values, infos = search_lib.align_heads(
        lambda rows: getattr(stats(rows), head), getattr(target_stats, head)[0], steps=steps,
        known_first=(grid_taus, getattr(sweep, head)) if sweep is not None else None)
    clamped = any(info.pop('clamped') for layer in infos for info in layer['heads'])
    return _as_float(chosen), _as_float(values), clamped, {'layers': infos}
  if scope == 'encoder':
    known = (grid_taus, sweep.values(statistic)) if sweep is not None else None
    tau, value, info = run_search(lambda taus: stats(taus).values(statistic),
                                  float(target_stats.values(statistic)[0]), known)
    return tau, value, info.pop('clamped'), info
  layer = f'layer_{statistic}'
  chosen, values, infos = search_lib.align_layers(
      lambda rows: getattr(stats(rows), layer), getattr(target_stats, layer)[0].tolist(),
      increasing=increasing, search=run_search,
      known_first=(grid_taus, getattr(sweep, layer)) if sweep is not None else None)
  clamped = any(info.pop('clamped') for info in infos)
  return chosen, values, clamped, {'layers': infos}


def _layers_from(tau: Any, from_layer: int, num_layers: int) -> Any:
  """An encoder-wide tau as one per layer, 1 below `from_layer` (as it is when 0)."""
  if not from_layer:
    return tau
  return (1.0,) * from_layer + (float(tau),) * (num_layers - from_layer)


def _floored(tau: Any) -> Any:
  """`min(tau, 1)` of every value (the nested form kept)."""
  if isinstance(tau, tuple):
    return tuple(_floored(t) for t in tau)
  return min(float(tau), 1.0)


def _candidates(taus: Any, from_layer: int, num_layers: int) -> np.ndarray:
  """Candidate taus as the sweep takes them: `[t]` as they are, or from layer `from_layer` on
  `[t, n]` rows (1 below it)."""
  if not from_layer:
    return np.asarray(taus, np.float64)
  return np.asarray([_layers_from(t, from_layer, num_layers) for t in np.ravel(taus)])


def _from_layer_values(stats: stats_lib.AttentionStats, statistic: str,
                       from_layer: int) -> np.ndarray:
  """`[t]` statistic pooled over layers `from_layer`.. (all of them when 0)."""
  if not from_layer:
    return stats.values(statistic)
  return np.mean(getattr(stats, f'layer_{statistic}')[:, from_layer:], axis=1)


def _joint(params, config, tokens, statistic: str, target: float, spec: Spec,
           reference_length: int, settings: SearchSettings, memo: stats_lib.Memo
           ) -> tuple[str, float, float, bool, dict]:
  """Algorithm 1 over (bias rule, tau) pairs: every rule of `JOINT_RULES` with every grid tau,
  the pair whose statistic is closest to `target` (ties: the first rule, then the first tau).
  One vmapped sweep of the grid per rule (a rule sets the bias's band, a static shape)."""
  grid = np.asarray(settings.grid, np.float64)
  taus = _candidates(grid, spec.from_layer, config.num_encoder_layers)
  values = {}
  for kind in JOINT_RULES:
    ruled = dataclasses.replace(config, encoder_bias_rule=spec.bias_rule(reference_length, kind))
    values[kind] = _from_layer_values(
        memo.attention_stats(params, ruled, tokens, taus, **settings.stats_kwargs()),
        statistic, spec.from_layer)
  table = np.stack([values[k] for k in JOINT_RULES])  # [rules, grid]
  rule_index, tau_index = np.unravel_index(np.argmin(np.abs(table - target)), table.shape)
  kind, tau = JOINT_RULES[rule_index], float(grid[tau_index])
  # Clamped: the target lies beyond every pair's statistic.
  clamped = not (table.min() <= target <= table.max())
  details = {'grid': grid.tolist(), 'pairs': {k: v.tolist() for k, v in values.items()}}
  return kind, tau, float(table[rule_index, tau_index]), clamped, details


def calibrate(
    params: Any,
    config: network.T5Config,
    tokens: Any,
    strategy: str = 'pmax',
    *,
    reference_tokens: Any = None,
    reference_length: int | None = None,
    settings: SearchSettings | None = None,
    memo: stats_lib.Memo | None = None,
) -> schedule.Calibration:
  """Chooses the encoder temperature for inputs like `tokens` (one strategy, one length).

  Args:
    params: the T5X 'params' tree.
    config: the model config (its own `encoder_bias_rule` must be 'none': a strategy's
      'bias=RULE' option sets the rule it is calibrated with).
    tokens: int `[b, L_ex]` samples at the target length; L_ex is the array's width.
    strategy: one of `STRATEGIES`, with options (`parse_name`).
    reference_tokens: int `[b', L_tr]` reference samples; if None, `tokens` cut to
      `reference_length` (the same documents, as in the paper).
    reference_length: L_tr; defaults to `reference_tokens`' width, else 512.
    settings: how to search and compute (`SearchSettings`); None: the defaults.
    memo: results shared with other calls on the same model (see `Memo`); None: a fresh one.

  Returns:
    A Calibration with the chosen tau (and bias rule), the target and achieved statistic and
    search details.
  """
  spec = parse_name(strategy)
  statistic, search, scope = _base_kind(spec.base)
  if config.has_bias_rule:
    raise ValueError(
        f'T5Config.encoder_bias_rule={config.encoder_bias_rule!r}: calibrate with the model as '
        "trained and give the rule in the strategy's name instead "
        f"({spec.base + ':bias=interpolate'!r}), so that the schedule records it.")
  if spec.from_layer >= config.num_encoder_layers:
    raise ValueError(f'strategy={strategy!r}: from_layer={spec.from_layer}, but the model has '
                     f'{config.num_encoder_layers} encoder layers (0..'
                     f'{config.num_encoder_layers - 1}).')
  settings = settings or SearchSettings()
  tokens = stats_lib.check_tokens(tokens)
  length = tokens.shape[1]
  if reference_tokens is not None:
    reference_tokens = stats_lib.check_tokens(reference_tokens, 'reference_tokens')
    reference_length = reference_length or reference_tokens.shape[1]
  reference_length = reference_length or 512
  stats_lib.check_lengths(length, reference_length)
  if reference_tokens is None:
    reference_tokens = stats_lib.cut_to_length(tokens, reference_length, settings.eos_id)
  bias = spec.bias if spec.bias != JOINT else 'none'
  common = dict(strategy=strategy, length=length, reference_length=reference_length)

  def finish(calibration: schedule.Calibration) -> schedule.Calibration:
    """The options applied to the base's calibration: from_layer, floor, the bias rule."""
    tau = _layers_from(calibration.tau, spec.from_layer, config.num_encoder_layers)
    if spec.floor:
      tau = 1.0 if length == reference_length else _floored(tau)
    return dataclasses.replace(calibration, tau=tau,
                               bias_rule=calibration.bias_rule if spec.bias == JOINT else bias)

  if spec.base == NONE:
    return finish(schedule.Calibration(tau=1.0, **common))
  if spec.base in closed_form_lib.FORMULAS:  # Data-free: no encoder pass.
    tau, details = closed_form_lib.formula_tau(spec.base, length, reference_length,
                                               num_heads=config.num_heads,
                                               head_dim=config.head_dim)
    return finish(schedule.Calibration(tau=tau, details=details, **common))
  memo = memo if memo is not None else stats_lib.Memo()
  params = partitioning.place_params(params, config, settings.mesh)
  # The model at L_ex with the strategy's bias rule (at L_tr every rule is T5's bias).
  ruled = (config if bias == 'none' else
           dataclasses.replace(config, encoder_bias_rule=spec.bias_rule(reference_length)))
  if search == 'closed_form':
    ref = closed_form_lib.summarize_logit_vector(
        memo.sorted_logits(params, config, reference_tokens, settings.chunk))
    ext = closed_form_lib.summarize_logit_vector(
        memo.sorted_logits(params, ruled, tokens, settings.chunk))
    details = {'reference': ref._asdict(), 'extrapolation': ext._asdict()}
    p_tr = None
    if spec.base == 'prop1':
      p_tr = closed_form_lib.reference_pmax(memo.attention_stats(
          params, config, reference_tokens, [1.0], **settings.stats_kwargs()))
      details['p_tr'] = p_tr
    try:
      tau, note, details['unclamped_tau'] = closed_form_lib.closed_form_tau(
          spec.base, reference_length, length, ref.sigma, ext.sigma, p_tr)
    except ValueError as e:
      raise ValueError(f'{e} (L_ex={length}, L_tr={reference_length}, details={details})') from e
    return finish(schedule.Calibration(tau=tau, clamped=bool(note), note=note, details=details,
                                       **common))
  target_stats = memo.attention_stats(params, config, reference_tokens, [1.0],
                                      **settings.stats_kwargs())
  if spec.bias == JOINT:
    target = float(_from_layer_values(target_stats, statistic, spec.from_layer)[0])
    kind, tau, achieved, clamped, details = _joint(
        params, config, tokens, statistic, target, spec, reference_length, settings, memo)
    return finish(schedule.Calibration(
        tau=tau, target=target, achieved=achieved, clamped=clamped, bias_rule=kind,
        note='target outside the searched range' if clamped else '', details=details,
        **common))
  if spec.from_layer:
    return finish(_align_from_layer(params, ruled, tokens, statistic, target_stats, spec,
                                    search=search, settings=settings, memo=memo, **common))
  tau, achieved, clamped, details = _align(
      params, ruled, tokens, statistic, target_stats, search=search, scope=scope,
      settings=settings, memo=memo)
  prefix = {'encoder': '', 'layer': 'layer_', 'head': 'head_'}[scope]
  target = _as_float(getattr(target_stats, f'{prefix}{statistic}')[0])
  return finish(schedule.Calibration(
      tau=tau, target=target, achieved=achieved, clamped=clamped,
      note='target outside the searched range' if clamped else '', details=details, **common))


def _align_from_layer(params, config, tokens, statistic, target_stats, spec: Spec, *,
                      search: str, settings: SearchSettings, memo: stats_lib.Memo,
                      **common) -> schedule.Calibration:
  """An encoder-wide tau searched for layers `spec.from_layer`.. (tau = 1 below), matching the
  statistic pooled over those layers."""
  num_layers, k = config.num_encoder_layers, spec.from_layer
  target = float(_from_layer_values(target_stats, statistic, k)[0])

  def evaluate(taus: np.ndarray) -> np.ndarray:
    return _from_layer_values(memo.attention_stats(
        params, config, tokens, _candidates(taus, k, num_layers), **settings.stats_kwargs()),
        statistic, k)

  if search == 'grid':
    tau, achieved, info = search_lib.grid_search(evaluate, target, settings.grid)
  else:
    tau, achieved, info = search_lib.bisect_search(
        evaluate, target, increasing=statistic == 'entropy', bracket=settings.bracket,
        tol=settings.tol, points=settings.search_points)
  clamped = info.pop('clamped')
  return schedule.Calibration(tau=tau, target=target, achieved=achieved, clamped=clamped,
                              note='target outside the searched range' if clamped else '',
                              details=info, **common)
