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

This module is the strategy level (`calibrate`), over `search`, `stats` and `closed_form` (see
the package's docstring).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from jax.sharding import Mesh

from t5align.calibration import closed_form as closed_form_lib
from t5align.calibration import search as search_lib
from t5align.calibration import stats as stats_lib
from t5align import network
from t5align import partitioning
from t5align import schedule


# T5's SentencePiece EOS: the default of the library calls below; pass another vocabulary's
# `eos_id` (e.g. 2 for CodeT5's BPE) where it differs.
T5_EOS_ID = 1
STATISTICS = ('pmax', 'entropy')
STRATEGIES = ('pmax', 'entropy', 'pmax_bisect', 'entropy_bisect', 'pmax_per_layer',
              'entropy_per_layer', 'pmax_per_head', 'entropy_per_head', 'log_length', 'prop1',
              'prop2')
# What one calibration's tau covers (`parse_strategy`): the whole encoder, each layer, each head.
SCOPES = ('encoder', 'layer', 'head')


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


def _align(params, config, tokens, statistic, target_stats, *, search, scope, grid, bracket,
           tol, points, memo, stats_kwargs) -> tuple[Any, Any, bool, dict]:
  """Searches tau (or per-layer or per-head taus) so the statistic at `tokens` matches
  `target_stats`."""
  increasing = statistic == 'entropy'  # flatter with larger tau: entropy up, P_max down.
  # Algorithm 1's sweep at this length, if this run already made it (the grid strategies share
  # it): it warm-starts the continuous searches. Layer 0's statistic depends on layer 0's tau
  # only, so the sweep (every layer at the grid tau) also warm-starts the per-layer search, and
  # each layer-0 head's statistic on its own tau only: the per-head search too.
  sweep = memo.computed_stats(params, config, tokens, grid) if search == 'bisect' else None
  grid_taus = np.asarray(grid, np.float64)
  stats = lambda taus: memo.attention_stats(params, config, tokens, taus, **stats_kwargs)

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
    grid: Sequence[float] = search_lib.PAPER_GRID,
    bracket: tuple[float, float] = (0.05, 1.0),
    tol: float = 1e-3,
    points: int | None = None,
    mesh: Mesh | None = None,
    batch_size: int | None = None,
    tau_batch_size: int | None = None,
    eos_id: int | None = T5_EOS_ID,
    chunk: int = 128,
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
    grid: Algorithm 1's candidate taus (grid strategies).
    bracket: tau interval of the continuous search.
    tol: bracket width at which the continuous search stops.
    points: taus per search round (default: the mesh's 'tau' size, else 2).
    mesh: optional ('tau', 'data', 'model') mesh for `encoder_attention_stats`.
    batch_size: examples per call.
    tau_batch_size: candidate taus per call.
    eos_id: id that ends a row cut to L_tr (None: leave cut rows as they are).
    chunk: query chunk of the layer-0 sorted-logit computation (closed forms).
    memo: results shared with other calls on the same model (see `Memo`); None: a fresh one.

  Returns:
    A Calibration with the chosen tau, the target and achieved statistic and search details.
  """
  statistic, search, scope = parse_strategy(strategy)
  tokens = stats_lib.check_tokens(tokens)
  length = tokens.shape[1]
  if reference_tokens is not None:
    reference_tokens = stats_lib.check_tokens(reference_tokens, 'reference_tokens')
    reference_length = reference_length or reference_tokens.shape[1]
  reference_length = reference_length or 512
  stats_lib.check_lengths(length, reference_length)
  if reference_tokens is None:
    reference_tokens = stats_lib.cut_to_length(tokens, reference_length, eos_id)
  common = dict(strategy=strategy, length=length, reference_length=reference_length)
  memo = memo if memo is not None else stats_lib.Memo()
  params = partitioning.place_params(params, config, mesh)
  if strategy == 'log_length':
    return schedule.Calibration(tau=closed_form_lib.log_length_tau(length, reference_length),
                                **common)
  stats_kwargs = dict(mesh=mesh, batch_size=batch_size, tau_batch_size=tau_batch_size)
  if search == 'closed_form':
    ref = closed_form_lib.summarize_logit_vector(
        memo.sorted_logits(params, config, reference_tokens, chunk))
    ext = closed_form_lib.summarize_logit_vector(memo.sorted_logits(params, config, tokens, chunk))
    details = {'reference': ref._asdict(), 'extrapolation': ext._asdict()}
    p_tr = None
    if strategy == 'prop1':
      p_tr = closed_form_lib.reference_pmax(memo.attention_stats(
          params, config, reference_tokens, [1.0], **stats_kwargs))
      details['p_tr'] = p_tr
    try:
      tau, note, details['unclamped_tau'] = closed_form_lib.closed_form_tau(
          strategy, reference_length, length, ref.sigma, ext.sigma, p_tr)
    except ValueError as e:
      raise ValueError(f'{e} (L_ex={length}, L_tr={reference_length}, details={details})') from e
    return schedule.Calibration(tau=tau, clamped=bool(note), note=note, details=details, **common)
  if points is None:
    # Two taus per round (trisection) share one compiled shape with the bracket's two ends.
    points = mesh.shape['tau'] if mesh is not None else 2
  target_stats = memo.attention_stats(params, config, reference_tokens, [1.0], **stats_kwargs)
  tau, achieved, clamped, details = _align(
      params, config, tokens, statistic, target_stats, search=search, scope=scope,
      grid=grid, bracket=bracket, tol=tol, points=points, memo=memo, stats_kwargs=stats_kwargs)
  prefix = {'encoder': '', 'layer': 'layer_', 'head': 'head_'}[scope]
  target = _as_float(getattr(target_stats, f'{prefix}{statistic}')[0])
  return schedule.Calibration(tau=tau, target=target, achieved=achieved, clamped=clamped,
                     note='target outside the searched range' if clamped else '',
                     details=details, **common)
