"""Attention alignment: choose encoder softmax temperatures for long inputs (paper Alg. 1, Props. 1-2).

Strategies (`STRATEGIES`), each giving tau for a target length L_ex from a reference length L_tr:
  'pmax', 'entropy'        Algorithm 1: tau on the grid 1.0, 0.95, ..., 0.5 whose mean statistic at
                           L_ex is closest to the mean statistic at L_tr with tau = 1.
  'pmax_bisect', ...       the same alignment solved continuously (bisection to `tol`).
  'pmax_per_layer', ...    one tau per layer, layers in order: layer i's tau is searched with layers
                           < i already at their chosen taus (the paper's future work).
  'log_length'             tau = log_{L_ex} L_tr (length-only baseline).
  'prop1', 'prop2'         closed forms from layer 0's average sorted logit vector.

Statistics are means over layers x heads x non-pad query rows, in float32 on device and float64 on
the host. Axis letters as in attention.py; `t` indexes candidate temperatures.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t5align import attention
from t5align import network
from t5align import partitioning
from t5align import validate

# T5's SentencePiece EOS: the default of the library calls below; pass another vocabulary's
# `eos_id` (e.g. 2 for CodeT5's BPE) where it differs.
T5_EOS_ID = 1
PAPER_GRID = tuple(round(1.0 - 0.05 * i, 2) for i in range(11))  # 1.0, 0.95, ..., 0.5
STATISTICS = ('pmax', 'entropy')
STRATEGIES = ('pmax', 'entropy', 'pmax_bisect', 'entropy_bisect', 'pmax_per_layer',
              'entropy_per_layer', 'log_length', 'prop1', 'prop2')


class AttentionStats(NamedTuple):
  """Mean row statistics per candidate temperature (float64 numpy)."""

  layer_pmax: np.ndarray  # [t, n]
  layer_entropy: np.ndarray  # [t, n]
  pmax: np.ndarray  # [t], pooled over layers x heads x rows
  entropy: np.ndarray  # [t]
  rows: int  # non-pad query rows in the batch

  def values(self, statistic: str, layer: int | None = None) -> np.ndarray:
    """`[t]` values of 'pmax' or 'entropy', pooled or of one layer."""
    if layer is None:
      return getattr(self, statistic)
    return getattr(self, f'layer_{statistic}')[:, layer]


@dataclasses.dataclass(frozen=True)
class Calibration:
  """One chosen temperature and the numbers that justify it (JSON-able via `asdict`)."""

  strategy: str
  length: int  # L_ex
  reference_length: int  # L_tr
  tau: float | tuple[float, ...]  # a tuple (one per layer) for per-layer strategies
  target: float | tuple[float, ...] | None = None  # statistic at L_tr, tau = 1
  achieved: float | tuple[float, ...] | None = None  # statistic at L_ex, chosen tau
  clamped: bool = False  # the target lay outside the searched range, or tau was clamped to 1
  details: dict = dataclasses.field(default_factory=dict)
  note: str = ''  # why `clamped` is set, in words (shown under `TemperatureSchedule.table`)


# ---------------------------------------------------------------------------------------------
# Validation.


def check_taus(temperatures: Any, name: str = 'temperatures') -> np.ndarray:
  """float64 `[t]` or `[t, n]` temperatures; ValueError unless non-empty and valid (see
  `validate.temperatures`)."""
  taus = np.asarray(temperatures, dtype=np.float64)
  if taus.ndim == 0:
    taus = taus[None]
  if taus.ndim > 2 or taus.shape[0] == 0:
    raise ValueError(f'{name} must be a non-empty [t] or [t, layers] array; got shape '
                     f'{taus.shape}.')
  return validate.temperatures(taus, name)


def check_tokens(tokens: Any, name: str = 'tokens') -> np.ndarray:
  """int32 `[b, l]` token ids with at least one non-pad token; raises ValueError otherwise."""
  tokens = np.asarray(tokens)
  if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
    raise ValueError(f'{name} must be a non-empty [batch, length] array; got shape '
                     f'{tokens.shape}.')
  if not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(f'{name} must hold integer token ids; got {tokens.dtype}.')
  if not np.any(tokens > 0):
    raise ValueError(f'{name} has no non-pad tokens (every id is 0).')
  return tokens.astype(np.int32)


def check_lengths(length: int, reference_length: int) -> None:
  """Raises ValueError unless 2 <= L_tr <= L_ex (alignment sharpens inputs longer than L_tr)."""
  if reference_length < 2:
    raise ValueError(f'reference length L_tr={reference_length} must be >= 2.')
  if length < reference_length:
    raise ValueError(f'L_ex={length} is shorter than L_tr={reference_length}; alignment is for '
                     f'inputs longer than the reference (shorter ones use tau = 1).')


def cut_to_length(tokens: Any, length: int, eos_id: int | None) -> np.ndarray:
  """The first `length` positions of each row; a row cut short ends with `eos_id` again (the
  vocabulary's EOS, e.g. `vocabularies.Vocabulary.eos_id`; None leaves cut rows as they are)."""
  tokens = np.asarray(tokens)
  if not 0 < length <= tokens.shape[1]:
    raise ValueError(f'cannot cut tokens of width {tokens.shape[1]} to length {length}.')
  out = tokens[:, :length].copy()
  if eos_id is not None:
    cut = np.any(tokens[:, length:] > 0, axis=1)
    last = np.maximum(np.sum(out > 0, axis=1) - 1, 0)
    out[cut, last[cut]] = eos_id
  return out


def cut_at_boundary(tokens: Any, length: int, boundary_ids: Sequence[int] = (),
                    eos_id: int | None = 1) -> np.ndarray:
  """Each row's beginning, cut after its last boundary token so it fits `length` with EOS.

  The L_tr reference for a task with no setting near L_tr (Algorithm 1 requires "a short
  sequence of length L_tr"): the same example, shortened at a document / sentence boundary
  (`boundary_ids`, e.g. the vocabulary's ids of pieces ending a sentence or line) rather than
  mid-sentence. A row with no boundary in range is cut at `length` as `cut_to_length` does; a
  row already short enough is kept whole. Returns int32 `[b, length]` (0-padded).
  """
  tokens = check_tokens(tokens)
  if length < 2:
    raise ValueError(f'length={length} must be >= 2.')
  boundary = np.isin(tokens, np.asarray(list(boundary_ids), np.int64))
  out = np.zeros((len(tokens), length), np.int32)
  for i, row in enumerate(tokens):
    row = row[row > 0]
    if len(row) <= length:
      out[i, :len(row)] = row
      continue
    room = length - (eos_id is not None)
    ends = np.flatnonzero(boundary[i, :room])  # tokens[i] has its non-pad tokens first
    keep = int(ends[-1]) + 1 if ends.size else room
    out[i, :keep] = row[:keep]
    if eos_id is not None:
      out[i, keep] = eos_id
  return out


# ---------------------------------------------------------------------------------------------
# Statistics over candidate temperatures (vmapped, optionally sharded).


@functools.lru_cache(maxsize=32)
def _stats_fn(config: network.T5Config, mesh: Mesh | None) -> Callable:
  """jit(vmap over taus) of per-example, per-layer row-statistic sums (summed over heads).

  With a ('tau', 'data', 'model') mesh: parameters sharded over 'model' by their logical axes,
  examples over 'data', candidate taus over 'tau' (`spmd_axis_name`, so the layers' activation
  constraints gain the 'tau' axis too); the small sums come back replicated.
  """
  model = network.Transformer(config)
  n = config.num_encoder_layers

  def one_tau(params, tokens, tau):
    # tau [n], passed as [1, n] so that it never reads as one value per example.
    _, state = model.apply({'params': params}, tokens, method='encode', enable_dropout=False,
                           temperature=tau[None, :], mutable=['intermediates'])
    sums = network.encoder_row_stats(state['intermediates'], n)
    # [n, b, h] -> [b, n]
    return {'pmax_sum': jnp.sum(sums['pmax_sum'], axis=2).T,
            'entropy_sum': jnp.sum(sums['entropy_sum'], axis=2).T,
            'rows': sums['rows']}  # [b]

  if mesh is None:
    return jax.jit(jax.vmap(one_tau, in_axes=(None, None, 0)))
  fn = jax.vmap(one_tau, in_axes=(None, None, 0), spmd_axis_name='tau')
  return partitioning.partition(
      fn, mesh, in_shardings=(partitioning.param_shardings(config, mesh),
                              partitioning.batch_sharding(mesh, 2), _tau_sharding(mesh)),
      out_shardings=partitioning.replicated(mesh))


def _tau_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P('tau', None))


def _params_mesh(params: Any) -> Mesh | None:
  """The mesh `params` were placed on by `partitioning.place_params`, if any."""
  sharding = getattr(jax.tree.leaves(params)[0], 'sharding', None)
  return sharding.mesh if isinstance(sharding, NamedSharding) else None


def _pad_rows(x: np.ndarray, size: int, fill: np.ndarray | float) -> np.ndarray:
  """Pads axis 0 to `size` with copies of `fill` (a row or a scalar)."""
  extra = size - x.shape[0]
  if extra <= 0:
    return x
  return np.concatenate([x, np.broadcast_to(np.asarray(fill, x.dtype), (extra,) + x.shape[1:])])


def length_groups(tokens: np.ndarray) -> list[np.ndarray]:
  """Splits `[b, l]` tokens into groups of equal non-pad width, each trimmed to that width.

  NOTE: trimming skips the compute on padding, and keeps padded query rows (whose float32 row
  statistics are not finite under jit at tau != 1, and would poison the masked sums) out of the
  encoder. Statistics of non-pad rows are unchanged: padding keys get probability exactly 0.
  """
  nonpad = tokens > 0
  width = np.where(nonpad.any(1), tokens.shape[1] - np.argmax(nonpad[:, ::-1], axis=1), 0)
  return [tokens[width == w, :w] for w in np.unique(width) if w > 0]


def encoder_attention_stats(
    params: Any,
    config: network.T5Config,
    tokens: Any,
    temperatures: Any,
    mesh: Mesh | None = None,
    *,
    batch_size: int | None = None,
    tau_batch_size: int | None = None,
) -> AttentionStats:
  """Mean encoder row P_max and entropy for every candidate temperature.

  One jit-compiled call vmaps the encoder over the candidates. With `mesh` (axes 'tau', 'data',
  'model'; see `partitioning.calibration_mesh`) the parameters shard over 'model', the
  candidates over 'tau' (padded with 1.0 to the axis size) and the batch over 'data' (padded
  with weight-0 copies of a row); results equal one device's. Examples
  are run in groups of equal non-pad length (`length_groups`), one compilation per length.

  Args:
    params: the T5X 'params' tree.
    config: the model config.
    tokens: int `[b, l]` encoder inputs, 0 = (trailing) padding.
    temperatures: `[t]` (one tau for every layer) or `[t, n]` (one per layer), finite and > 0.
    mesh: optional device mesh.
    batch_size: examples per call (sums accumulate across calls); a whole group if None.
    tau_batch_size: candidates per call, to bound memory (`t x b x h x l x l` probabilities).

  Returns:
    AttentionStats with `[t, n]` per-layer and `[t]` pooled means.
  """
  taus = check_taus(temperatures).astype(np.float32)
  tokens = check_tokens(tokens)
  n = config.num_encoder_layers
  if taus.ndim == 2 and taus.shape[1] != n:
    raise ValueError(f'temperatures of shape {taus.shape}: expected [t, {n}] per-layer values.')
  # [t] -> [t, n]: one compiled form for both (a scalar tau equals the same tau on every layer).
  taus = np.broadcast_to(taus.reshape(len(taus), -1), (len(taus), n))
  fn = _stats_fn(config, mesh)
  tau_axis, data_axis = (mesh.shape['tau'], mesh.shape['data']) if mesh is not None else (1, 1)
  params = partitioning.place_params(params, config, mesh)  # No copy when already placed.
  tb = -(-(tau_batch_size or len(taus)) // tau_axis) * tau_axis
  sums = np.zeros((2, len(taus), n))
  rows = 0.0
  for group in length_groups(tokens):
    bb = -(-(batch_size or len(group)) // data_axis) * data_axis
    for b0 in range(0, len(group), bb):
      batch = group[b0:b0 + bb]
      weight = _pad_rows(np.ones(len(batch)), bb, 0.0)  # [bb]; 0 on padded copies
      batch = _pad_rows(batch, bb, batch[0])
      for t0 in range(0, len(taus), tb):
        k = min(tb, len(taus) - t0)
        candidates = _pad_rows(taus[t0:t0 + tb], tb, 1.0)
        if mesh is not None:  # Global arrays; each process copies only its devices' slices.
          args = (partitioning.global_array(batch, partitioning.batch_sharding(mesh, 2)),
                  partitioning.global_array(candidates, _tau_sharding(mesh)))
        else:
          args = (batch, candidates)
        out = jax.device_get(fn(params, *args))
        if t0 == 0:
          rows += float(np.dot(out['rows'][0], weight))
        for i, key in enumerate(('pmax_sum', 'entropy_sum')):
          # [t, b, n] x [b] -> [t, n]
          sums[i, t0:t0 + k] += np.einsum('tbn,b->tn', np.asarray(out[key][:k], np.float64), weight)
  layer = sums / (rows * config.num_heads)
  return AttentionStats(layer[0], layer[1], layer[0].mean(1), layer[1].mean(1), int(rows))


# ---------------------------------------------------------------------------------------------
# Searches over tau (Algorithm 1's grid, and bisection).


def grid_search(evaluate: Callable[[np.ndarray], np.ndarray], target: float,
                grid: Sequence[float] = PAPER_GRID) -> tuple[float, float, dict]:
  """Algorithm 1: the grid tau whose statistic is closest to `target` (first on ties).

  Returns:
    (tau, its statistic, details); details['clamped'] is True when no grid interval holds the
    target (the target lies beyond every grid value).
  """
  grid = check_taus(grid, 'grid')
  if grid.ndim != 1:
    raise ValueError(f'grid must be 1-D; got shape {grid.shape}.')
  values = evaluate(grid)
  i = int(np.argmin(np.abs(values - target)))
  clamped = bool(np.all(values > target) or np.all(values < target))
  return float(grid[i]), float(values[i]), {'grid': grid.tolist(), 'values': values.tolist(),
                                            'clamped': clamped}


def bisect_search(evaluate: Callable[[np.ndarray], np.ndarray], target: float, *,
                  increasing: bool, bracket: tuple[float, float] = (0.05, 1.0),
                  tol: float = 1e-3, points: int = 1,
                  known: tuple[Sequence[float], Sequence[float]] | None = None
                  ) -> tuple[float, float, dict]:
  """Solves statistic(tau) = target for a monotone statistic, to `tol` in tau.

  Each round evaluates `points` interior taus in one call (1 = bisection; more use a 'tau' mesh
  axis) and keeps the sub-interval holding the crossing. The answer is the end of the final
  interval (width <= tol) whose statistic is nearer the target. A target outside the bracket's
  values returns the nearer end with details['clamped'] = True.

  `known` = (taus, values) already computed (e.g. Algorithm 1's grid) warm-starts the search
  without changing its path: a round whose every point lies on a side of the crossing that a
  known value already implies (monotonicity) is decided without a call. Only the taus evaluated
  are the ones the search would have evaluated anyway, in the same `points`-sized calls.

  Returns:
    (tau, its statistic, details); details['calls'] counts the calls made.
  """
  lo, hi = (float(x) for x in check_taus(bracket, 'bracket'))
  if not (lo < hi and tol > 0 and points >= 1):
    raise ValueError(f'need bracket lo < hi, tol > 0, points >= 1; got {bracket}, {tol}, {points}.')
  sign = 1.0 if increasing else -1.0  # sign * (value - target) increases with tau.
  known_taus, known_above = np.zeros(0), np.zeros(0, bool)
  if known is not None:
    known_taus = np.asarray(known[0], np.float64)
    known_above = sign * (np.asarray(known[1], np.float64) - target) >= 0

  def implied(x: float) -> bool | None:
    """Whether sign * (statistic(x) - target) >= 0 follows from a known value (None: not)."""
    if np.any(known_above & (known_taus <= x)):
      return True
    if np.any(~known_above & (known_taus >= x)):
      return False
    return None

  values: dict[float, float] = {}
  calls = 0

  def evaluate_all(xs: np.ndarray) -> None:
    nonlocal calls
    values.update(zip(xs.tolist(), np.asarray(evaluate(xs), np.float64).tolist()))
    calls += 1

  def above(x: float) -> bool:
    return sign * (values[x] - target) >= 0 if x in values else implied(x)

  if implied(lo) is None or implied(hi) is None:
    evaluate_all(np.array([lo, hi]))
  if above(lo) or not above(hi):
    tau = lo if above(lo) else hi
    if tau not in values:
      evaluate_all(np.array([lo, hi]))
    return tau, float(values[tau]), {'bracket': [lo, hi], 'calls': calls, 'clamped': True}
  while hi - lo > tol:
    xs = np.linspace(lo, hi, points + 2)[1:-1]
    if any(implied(x) is None for x in xs.tolist()):
      evaluate_all(xs)
    signs = [above(x) for x in xs.tolist()]
    i = signs.index(True) if True in signs else len(xs)
    if i > 0:
      lo = float(xs[i - 1])
    if i < len(xs):
      hi = float(xs[i])
  if lo not in values or hi not in values:
    evaluate_all(np.array([lo, hi]))
  v_lo, v_hi = values[lo], values[hi]
  tau, value = (lo, v_lo) if abs(v_lo - target) <= abs(v_hi - target) else (hi, v_hi)
  return float(tau), float(value), {'bracket': [float(lo), float(hi)], 'calls': calls,
                                    'clamped': False}


# ---------------------------------------------------------------------------------------------
# Closed forms (Propositions 1-2) and layer 0's average sorted logit vector.


class LogitSummary(NamedTuple):
  """Summary of an average sorted logit vector (Assumption 1: its entries ~ N(0, sigma^2))."""

  sigma: float  # std of the entries
  vector_pmax: float  # max probability of softmax(vector); NOT Prop. 1's P_tr (`reference_pmax`)
  lmax: float  # largest entry minus the mean (paper Table 7's l_max)
  length: int


def reference_pmax(reference_stats: AttentionStats) -> float:
  """Proposition 1's P_tr: layer 0's mean row P_max at L_tr, tau = 1.

  REFERENCE.md sec. 1: "P_tr = layer-0 mean P_max at L_tr". In the paper P_max^tr is the
  statistic of Sec. 4 (the mean over logit vectors of each vector's max probability), and for the
  propositions "we evaluate P_max^tr and sigma_tr at the training length ... considering only the
  0-th layer" (App. A.4): so the mean over layer 0's heads x non-pad query rows, as Algorithm 1
  measures it, not the max probability of softmax(average sorted logit vector)
  (`LogitSummary.vector_pmax`, which the paper never uses as P_tr).

  Args:
    reference_stats: `encoder_attention_stats` of the L_tr inputs whose first temperature is 1.
  """
  return float(reference_stats.layer_pmax[0, 0])


def clamp_tau(tau: float) -> tuple[float, str]:
  """Clamps a closed-form tau to (0, 1]: (tau, '') or (1.0, a note saying it was clamped).

  Alignment sharpens (tau < 1); a closed form above 1 (e.g. Prop. 1's closest approach when the
  quadratic has no real root) would flatten attention further, so it is clamped to 1 and marked.
  A tau <= 0 or non-finite has no meaning and raises ValueError.
  """
  if not np.isfinite(tau) or tau <= 0:
    raise ValueError(f'tau={tau} is not in (0, 1].')
  if tau > 1.0:
    return 1.0, f'closed form gave tau={tau:.4g} > 1; clamped to 1'
  return float(tau), ''


def log_length_tau(length: Any, reference_length: int) -> np.ndarray | float:
  """Length-only baseline tau = log L_tr / log L_ex (Yao et al. 2021; Su 2021)."""
  length = np.asarray(length, np.float64)
  if np.any(length < 2) or reference_length < 2:
    raise ValueError(f'lengths must be >= 2; got L_ex={length.tolist()}, L_tr={reference_length}.')
  tau = math.log(reference_length) / np.log(length)
  return float(tau) if tau.ndim == 0 else tau


def prop1_tau(reference_length, length, sigma_tr, sigma_ex, pmax_tr, closest: bool = False):
  """Proposition 1 (P_max): the larger root of A tau^2 - B tau + C = 0.

  A = log L_ex + log P_tr, B = log L_tr + log P_tr + sigma_tr^2 / 2, C = sigma_ex^2 / 2, with
  P_tr = `pmax_tr` as `reference_pmax` defines it. `calibrate` clamps the result to (0, 1].
  Where no real root exists the model's P_ex(tau) never reaches P_tr: the result is NaN, or with
  `closest` the tau that brings P_ex nearest to it (its maximum, tau = 2C / B). Broadcasts.
  """
  a = np.log(np.asarray(length, np.float64)) + np.log(pmax_tr)
  b = math.log(reference_length) + np.log(pmax_tr) + np.square(sigma_tr) / 2
  c = np.square(np.asarray(sigma_ex, np.float64)) / 2
  disc = b * b - 4 * a * c
  with np.errstate(invalid='ignore', divide='ignore'):
    tau = np.where((disc >= 0) & (a > 0), (b + np.sqrt(np.maximum(disc, 0))) / (2 * a), np.nan)
    if closest:
      tau = np.where(np.isnan(tau) & (b > 0), 2 * c / b, tau)
  return float(tau) if tau.ndim == 0 else tau


def prop2_tau(reference_length, length, sigma_tr, sigma_ex):
  """Proposition 2 (entropy): tau = sigma_ex / sqrt(sigma_tr^2 + 2 log(L_ex / L_tr))."""
  ratio = np.asarray(length, np.float64) / reference_length
  tau = np.asarray(sigma_ex, np.float64) / np.sqrt(np.square(sigma_tr) + 2 * np.log(ratio))
  return float(tau) if tau.ndim == 0 else tau


def closed_form_tau(strategy: str, reference_length: int, length: int, sigma_tr: float,
                    sigma_ex: float, p_tr: float | None = None) -> tuple[float, str, float]:
  """Prop. 1 ('prop1', needs P_tr) or Prop. 2 ('prop2') tau, clamped to (0, 1].

  Returns:
    (tau in (0, 1], a note that is '' unless the closed form was replaced or clamped, the tau
    before clamping). Prop. 1 without a real root takes its closest approach 2C/B (noted).
    Raises ValueError where no positive tau exists.
  """
  notes = []
  if strategy == 'prop1':
    tau = prop1_tau(reference_length, length, sigma_tr, sigma_ex, p_tr)
    if np.isnan(tau):  # P_ex(tau) never reaches P_tr: take the closest approach, and say so.
      tau = prop1_tau(reference_length, length, sigma_tr, sigma_ex, p_tr, closest=True)
      notes.append('Prop. 1 has no real root; closest approach 2C/B used')
  elif strategy == 'prop2':
    tau = prop2_tau(reference_length, length, sigma_tr, sigma_ex)
  else:
    raise ValueError(f'strategy={strategy!r} has no closed form; expected prop1 or prop2.')
  if not np.isfinite(tau) or tau <= 0:
    raise ValueError(f'{strategy} has no positive solution (tau={tau}, sigma_tr={sigma_tr:.4g}, '
                     f'sigma_ex={sigma_ex:.4g}, P_tr={p_tr}).')
  clamped, note = clamp_tau(float(tau))
  return clamped, '; '.join(notes + ([note] if note else [])), float(tau)


def summarize_logit_vector(vector: Any) -> LogitSummary:
  """sigma, softmax max-probability and centred max of an average sorted logit vector."""
  v = np.asarray(vector, np.float64)
  return LogitSummary(sigma=float(np.std(v)),
                      vector_pmax=float(1.0 / np.sum(np.exp(v - v.max()))),
                      lmax=float(v.max() - v.mean()), length=int(v.size))


@functools.lru_cache(maxsize=16)
def _sorted_logits_fn(config: network.T5Config, chunk: int, mesh: Mesh | None) -> Callable:
  model = network.Transformer(config)

  def fn(params, tokens):
    _, state = model.apply({'params': params}, tokens, method='encode', enable_dropout=False,
                           temperature=1.0, mutable=['attention_inputs'])
    layer0 = state['attention_inputs']['encoder']['layers_0']['attention']
    # [b, l, h, d]
    q = layer0['projected_query'][0].astype(jnp.float32)
    k = layer0['projected_key'][0].astype(jnp.float32)
    table = jnp.asarray(params['encoder']['relpos_bias']['rel_embedding'], jnp.float32)
    b, l, h, _ = q.shape
    valid = tokens > 0  # [b, l]
    chunks = -(-l // chunk)
    q = jnp.pad(q, ((0, 0), (0, chunks * chunk - l), (0, 0), (0, 0)))
    valid_q = jnp.pad(valid, ((0, 0), (0, chunks * chunk - l))).astype(jnp.float32)

    def body(total, start):
      qc = jax.lax.dynamic_slice_in_dim(q, start, chunk, axis=1)  # [b, c, h, d]
      # [b, c, h, d] x [b, l, h, d] -> [b, h, c, l], plus the [1, h, c, l] relative bias.
      logits = jnp.einsum('bqhd,bkhd->bhqk', qc, k)
      logits += attention.relative_position_bias(table, chunk, l, True, q_offset=start)
      logits = jnp.where(valid[:, None, None, :], logits, -jnp.inf)
      ranked = jnp.sort(logits, axis=-1, descending=True)  # padding keys sort last
      ranked = jnp.where(jnp.isfinite(ranked), ranked, 0.0)
      vq = jax.lax.dynamic_slice_in_dim(valid_q, start, chunk, axis=1)  # [b, c]
      return total + jnp.einsum('bhqk,bq->bk', ranked, vq), None

    total, _ = jax.lax.scan(body, jnp.zeros((b, l), jnp.float32),
                            jnp.arange(chunks, dtype=jnp.int32) * chunk)
    n_valid = jnp.sum(valid, axis=1)  # [b]
    return total / jnp.maximum(n_valid * h, 1)[:, None], n_valid  # [b, l], [b]

  if mesh is None:
    return jax.jit(fn)
  return partitioning.partition(
      fn, mesh, in_shardings=(partitioning.param_shardings(config, mesh),
                              partitioning.replicated(mesh)),
      out_shardings=partitioning.replicated(mesh))


def layer0_sorted_logits(params: Any, config: network.T5Config, tokens: Any,
                         chunk: int = 128) -> np.ndarray:
  """Layer 0's average sorted logit vector (paper Sec. 6.1), tau = 1.

  Each of the h x L_b logit vectors (q.k + relative bias over the L_b non-pad keys) of example b
  is sorted in decreasing order; they are averaged, computed `chunk` queries at a time so memory
  is `b x h x chunk x l`. Examples of different lengths are merged on a common quantile grid of
  the longest length (linear interpolation), weighted by their row counts.

  Returns:
    float64 `[L]` decreasing vector.
  """
  tokens = check_tokens(tokens)
  chunk = max(1, min(chunk, tokens.shape[1]))
  mesh = _params_mesh(params)  # Parameters placed on a mesh stay there.
  if mesh is not None:
    tokens = partitioning.global_array(tokens, partitioning.replicated(mesh))
  per_example, n_valid = jax.device_get(_sorted_logits_fn(config, chunk, mesh)(params, tokens))
  per_example, n_valid = np.asarray(per_example, np.float64), np.asarray(n_valid)
  keep = n_valid > 0
  per_example, n_valid = per_example[keep], n_valid[keep]
  size = int(n_valid.max())
  grid = (np.arange(size) + 0.5) / size
  merged = [np.interp(grid, (np.arange(m) + 0.5) / m, v[:m]) if m != size else v[:m]
            for v, m in zip(per_example, n_valid)]
  return np.average(np.stack(merged), axis=0, weights=n_valid.astype(np.float64))


class Memo:
  """Remembers `encoder_attention_stats` and `layer0_sorted_logits` results by their inputs.

  A run that asks the same question more than once computes it once: in `build_schedule` the
  P_max and entropy grids sweep the same taus over the same samples, every statistic strategy
  needs the same L_tr target, Props. 1-2 share the layer-0 logit vectors, and the analysis
  needs them all again. Keys are the config, the token and tau arrays (by content) and the
  chunk; not the params: use one Memo per set of weights. Batch and mesh settings only change
  how a result is computed, so they are not part of the key.
  """

  def __init__(self):
    self._results: dict[tuple, Any] = {}
    self.hits = 0

  def _get(self, key: tuple, compute: Callable[[], Any]) -> Any:
    if key in self._results:
      self.hits += 1
    else:
      self._results[key] = compute()
    return self._results[key]

  @staticmethod
  def _fingerprint(x: np.ndarray) -> tuple:
    return x.dtype.str, x.shape, hashlib.sha256(np.ascontiguousarray(x).tobytes()).digest()

  def attention_stats(self, params: Any, config: network.T5Config, tokens: Any,
                      temperatures: Any, mesh: Mesh | None = None, **kwargs) -> AttentionStats:
    """`encoder_attention_stats(params, config, tokens, temperatures, mesh, **kwargs)`."""
    tokens, taus = check_tokens(tokens), check_taus(temperatures).astype(np.float32)
    return self._get(self._stats_key(config, tokens, taus),
                     lambda: encoder_attention_stats(params, config, tokens, taus, mesh,
                                                     **kwargs))

  def _stats_key(self, config: network.T5Config, tokens: np.ndarray, taus: np.ndarray) -> tuple:
    return ('stats', config, self._fingerprint(tokens), self._fingerprint(taus))

  def computed_stats(self, config: network.T5Config, tokens: Any,
                     temperatures: Any) -> AttentionStats | None:
    """The remembered result of `attention_stats` for these inputs, or None (computes nothing)."""
    key = self._stats_key(config, check_tokens(tokens),
                          check_taus(temperatures).astype(np.float32))
    return self._results.get(key)

  def sorted_logits(self, params: Any, config: network.T5Config, tokens: Any,
                    chunk: int = 128) -> np.ndarray:
    """`layer0_sorted_logits(params, config, tokens, chunk)`."""
    tokens = check_tokens(tokens)
    key = ('layer0', config, self._fingerprint(tokens), chunk)
    return self._get(key, lambda: layer0_sorted_logits(params, config, tokens, chunk))


# ---------------------------------------------------------------------------------------------
# Strategies.


def parse_strategy(strategy: str) -> tuple[str, str, bool]:
  """'pmax_per_layer' -> ('pmax', 'bisect', True); 'entropy' -> ('entropy', 'grid', False)."""
  if strategy not in STRATEGIES:
    raise ValueError(f'strategy={strategy!r}; expected one of {STRATEGIES}.')
  base, _, variant = strategy.partition('_')
  if base not in STATISTICS:
    return strategy, 'closed_form', False
  return base, ('grid' if not variant else 'bisect'), variant == 'per_layer'


def _as_float(x: Any) -> float | tuple[float, ...]:
  x = np.asarray(x, np.float64)
  return float(x) if x.ndim == 0 else tuple(float(v) for v in x)


def _align(params, config, tokens, statistic, target_stats, *, search, per_layer, grid, bracket,
           tol, points, memo, stats_kwargs) -> tuple[Any, Any, bool, dict]:
  """Searches tau (or per-layer taus) so the statistic at `tokens` matches `target_stats`."""
  n = config.num_encoder_layers
  increasing = statistic == 'entropy'  # flatter with larger tau: entropy up, P_max down.

  # Algorithm 1's sweep at this length, if this run already made it (the grid strategies share
  # it): it warm-starts the continuous searches. Layer 0's statistic depends on layer 0's tau
  # only, so the sweep (every layer at the grid tau) also brackets the per-layer search's layer 0.
  sweep = memo.computed_stats(config, tokens, grid) if search == 'bisect' else None

  def run_search(evaluate, target, layer=None):
    if search == 'grid':
      return grid_search(evaluate, target, grid)
    known = None
    if sweep is not None and (layer is None or layer == 0):
      known = (np.asarray(grid, np.float64), sweep.values(statistic, layer))
    return bisect_search(evaluate, target, increasing=increasing, bracket=bracket, tol=tol,
                         points=points, known=known)

  if not per_layer:
    evaluate = lambda taus: memo.attention_stats(
        params, config, tokens, taus, **stats_kwargs).values(statistic)
    tau, value, info = run_search(evaluate, float(target_stats.values(statistic)[0]))
    return tau, value, info.pop('clamped'), info

  chosen, values, infos = [], [], []
  for i in range(n):
    def evaluate(taus, i=i):
      # [t, n]: layers < i at their chosen taus, layers >= i at the candidate. Layers > i cannot
      # change layer i's statistic, so each layer's value at its choice is final.
      rows = np.concatenate([np.tile(chosen, (len(taus), 1)), np.tile(taus[:, None], n - i)], 1)
      return memo.attention_stats(params, config, tokens, rows, **stats_kwargs).values(
          statistic, layer=i)
    tau, value, info = run_search(evaluate, float(target_stats.values(statistic, layer=i)[0]),
                                  layer=i)
    chosen.append(tau)
    values.append(value)
    infos.append(info)
  clamped = any(info.pop('clamped') for info in infos)
  return tuple(chosen), tuple(values), clamped, {'layers': infos}


def calibrate(
    params: Any,
    config: network.T5Config,
    tokens: Any,
    strategy: str = 'pmax',
    *,
    reference_tokens: Any = None,
    reference_length: int | None = None,
    grid: Sequence[float] = PAPER_GRID,
    bracket: tuple[float, float] = (0.05, 1.0),
    tol: float = 1e-3,
    points: int | None = None,
    mesh: Mesh | None = None,
    batch_size: int | None = None,
    tau_batch_size: int | None = None,
    eos_id: int | None = T5_EOS_ID,
    chunk: int = 128,
    memo: Memo | None = None,
) -> Calibration:
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
  statistic, search, per_layer = parse_strategy(strategy)
  tokens = check_tokens(tokens)
  length = tokens.shape[1]
  if reference_tokens is not None:
    reference_tokens = check_tokens(reference_tokens, 'reference_tokens')
    reference_length = reference_length or reference_tokens.shape[1]
  reference_length = reference_length or 512
  check_lengths(length, reference_length)
  if reference_tokens is None:
    reference_tokens = cut_to_length(tokens, reference_length, eos_id)
  common = dict(strategy=strategy, length=length, reference_length=reference_length)
  memo = memo if memo is not None else Memo()
  params = partitioning.place_params(params, config, mesh)
  if strategy == 'log_length':
    return Calibration(tau=log_length_tau(length, reference_length), **common)
  stats_kwargs = dict(mesh=mesh, batch_size=batch_size, tau_batch_size=tau_batch_size)
  if search == 'closed_form':
    ref = summarize_logit_vector(memo.sorted_logits(params, config, reference_tokens, chunk))
    ext = summarize_logit_vector(memo.sorted_logits(params, config, tokens, chunk))
    details = {'reference': ref._asdict(), 'extrapolation': ext._asdict()}
    p_tr = None
    if strategy == 'prop1':
      p_tr = reference_pmax(memo.attention_stats(params, config, reference_tokens, [1.0],
                                                 **stats_kwargs))
      details['p_tr'] = p_tr
    try:
      tau, note, details['unclamped_tau'] = closed_form_tau(
          strategy, reference_length, length, ref.sigma, ext.sigma, p_tr)
    except ValueError as e:
      raise ValueError(f'{e} (L_ex={length}, L_tr={reference_length}, details={details})') from e
    return Calibration(tau=tau, clamped=bool(note), note=note, details=details, **common)
  if points is None:
    # Two taus per round (trisection) share one compiled shape with the bracket's two ends.
    points = mesh.shape['tau'] if mesh is not None else 2
  target_stats = memo.attention_stats(params, config, reference_tokens, [1.0], **stats_kwargs)
  tau, achieved, clamped, details = _align(
      params, config, tokens, statistic, target_stats, search=search, per_layer=per_layer,
      grid=grid, bracket=bracket, tol=tol, points=points, memo=memo, stats_kwargs=stats_kwargs)
  target = (_as_float(getattr(target_stats, f'layer_{statistic}')[0]) if per_layer
            else float(target_stats.values(statistic)[0]))
  return Calibration(tau=tau, target=target, achieved=achieved, clamped=clamped,
                     note='target outside the searched range' if clamped else '',
                     details=details, **common)
