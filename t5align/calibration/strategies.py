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

This module is the strategy level (`calibrate`), over `search`, `stats` and `closed_form` (see
the package's docstring).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from jax.sharding import Mesh

from t5align.calibration import closed_form as closed_form_lib
from t5align.calibration import search as search_lib
from t5align.calibration import stats as stats_lib
from t5align import network
from t5align import partitioning
from t5align import run_identity
from t5align import schedule


# T5's SentencePiece EOS: the default of the library calls below; pass another vocabulary's
# `eos_id` (e.g. 2 for CodeT5's BPE) where it differs.
T5_EOS_ID = 1
STATISTICS = ('pmax', 'entropy')
STRATEGIES = ('pmax', 'entropy', 'pmax_bisect', 'entropy_bisect', 'pmax_per_layer',
              'entropy_per_layer', 'pmax_per_head', 'entropy_per_head', 'log_length', 'prop1',
              'prop2', 'infoscale_head', 'infoscale_model', 'llama4_length', 'yarn_mscale')
# What one calibration's tau covers (`parse_strategy`): the whole encoder, each layer, each head.
SCOPES = ('encoder', 'layer', 'head')


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

  grid: tuple[float, ...] = search_lib.PAPER_GRID
  bracket: tuple[float, float] = (0.05, 1.0)
  tol: float = 1e-3
  points: int | None = None
  mesh: Mesh | None = run_identity.unrecorded(
      "set by the run from MESH_SHAPE (recorded as 'mesh_shape')", None)
  batch_size: int | None = run_identity.unrecorded(
      'examples are computed independently of their batch', None)
  tau_batch_size: int | None = run_identity.unrecorded(
      'candidate taus are computed independently of their batch', None)
  eos_id: int | None = run_identity.unrecorded(
      "set by the run from the inputs' vocabulary, whose content is recorded", T5_EOS_ID)
  chunk: int = run_identity.unrecorded('the same values, computed in chunks', 128)

  def __post_init__(self):
    object.__setattr__(self, 'grid', tuple(float(t) for t in self.grid))
    object.__setattr__(self, 'bracket', tuple(float(t) for t in self.bracket))

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
  """(statistic, search, scope in `SCOPES`): 'pmax_per_layer' -> ('pmax', 'bisect', 'layer');
  'entropy' -> ('entropy', 'grid', 'encoder'); 'prop1' -> ('prop1', 'closed_form', 'encoder')."""
  if strategy not in STRATEGIES:
    raise ValueError(f'strategy={strategy!r}; expected one of {STRATEGIES}.')
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
    config: the model config.
    tokens: int `[b, L_ex]` samples at the target length; L_ex is the array's width.
    strategy: one of `STRATEGIES`.
    reference_tokens: int `[b', L_tr]` reference samples; if None, `tokens` cut to
      `reference_length` (the same documents, as in the paper).
    reference_length: L_tr; defaults to `reference_tokens`' width, else 512.
    settings: how to search and compute (`SearchSettings`); None: the defaults.
    memo: results shared with other calls on the same model (see `Memo`); None: a fresh one.

  Returns:
    A Calibration with the chosen tau, the target and achieved statistic and search details.
  """
  statistic, search, scope = parse_strategy(strategy)
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
  common = dict(strategy=strategy, length=length, reference_length=reference_length)
  if strategy in closed_form_lib.FORMULAS:  # Data-free: no encoder pass.
    tau, details = closed_form_lib.formula_tau(strategy, length, reference_length,
                                               num_heads=config.num_heads,
                                               head_dim=config.head_dim)
    return schedule.Calibration(tau=tau, details=details, **common)
  memo = memo if memo is not None else stats_lib.Memo()
  params = partitioning.place_params(params, config, settings.mesh)
  if search == 'closed_form':
    ref = closed_form_lib.summarize_logit_vector(
        memo.sorted_logits(params, config, reference_tokens, settings.chunk))
    ext = closed_form_lib.summarize_logit_vector(
        memo.sorted_logits(params, config, tokens, settings.chunk))
    details = {'reference': ref._asdict(), 'extrapolation': ext._asdict()}
    p_tr = None
    if strategy == 'prop1':
      p_tr = closed_form_lib.reference_pmax(memo.attention_stats(
          params, config, reference_tokens, [1.0], **settings.stats_kwargs()))
      details['p_tr'] = p_tr
    try:
      tau, note, details['unclamped_tau'] = closed_form_lib.closed_form_tau(
          strategy, reference_length, length, ref.sigma, ext.sigma, p_tr)
    except ValueError as e:
      raise ValueError(f'{e} (L_ex={length}, L_tr={reference_length}, details={details})') from e
    return schedule.Calibration(tau=tau, clamped=bool(note), note=note, details=details, **common)
  target_stats = memo.attention_stats(params, config, reference_tokens, [1.0],
                                      **settings.stats_kwargs())
  tau, achieved, clamped, details = _align(
      params, config, tokens, statistic, target_stats, search=search, scope=scope,
      settings=settings, memo=memo)
  prefix = {'encoder': '', 'layer': 'layer_', 'head': 'head_'}[scope]
  target = _as_float(getattr(target_stats, f'{prefix}{statistic}')[0])
  return schedule.Calibration(tau=tau, target=target, achieved=achieved, clamped=clamped,
                     note='target outside the searched range' if clamped else '',
                     details=details, **common)
