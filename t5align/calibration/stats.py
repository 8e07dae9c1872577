"""Encoder attention statistics at candidate temperatures, and the inputs they are measured on.

`encoder_attention_stats`: mean row P_max and entropy per layer and head for many taus in one
vmapped (on CPU: mapped one tau at a time, see `default_tau_chunk`), optionally sharded call;
`layer0_sorted_logits`: layer 0's average sorted logit vector (for the closed forms); `Memo`:
both remembered per (weights, inputs). Statistics are means over non-pad query rows (per head),
heads (per layer) and layers (pooled), in float32 on device and float64 on the host. Axis
letters as in attention/reference.py; `t` indexes candidate temperatures.
"""
from __future__ import annotations

import functools
import hashlib
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t5align.attention import reference
from t5align import network
from t5align import partitioning
from t5align.runtime import batching
from t5align.runtime import validate


class AttentionStats(NamedTuple):
  """Mean row statistics per candidate temperature (float64 numpy)."""

  layer_pmax: np.ndarray  # [t, n]
  layer_entropy: np.ndarray  # [t, n]
  pmax: np.ndarray  # [t], pooled over layers x heads x rows
  entropy: np.ndarray  # [t]
  rows: int  # non-pad query rows in the batch
  head_pmax: np.ndarray  # [t, n, h], per head: means over the rows only
  head_entropy: np.ndarray  # [t, n, h]

  def values(self, statistic: str, layer: int | None = None) -> np.ndarray:
    """`[t]` values of 'pmax' or 'entropy', pooled or of one layer."""
    if layer is None:
      return getattr(self, statistic)
    return getattr(self, f'layer_{statistic}')[:, layer]


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


def default_tau_chunk(backend: str | None = None) -> int | None:
  """Candidate taus computed at once (vmapped) per device: 1 on CPU, all (None) elsewhere.

  On CPU a vmapped batch of taus multiplies every attention tile's working set by the batch and
  pushes it out of cache, so one after another in the same compiled call (`lax.map`) is faster
  there (docs/performance/cpu.md); accelerators gain from the batch.
  """
  return 1 if (backend or jax.default_backend()) == 'cpu' else None


@functools.lru_cache(maxsize=32)
def sweep_fn(config: network.T5Config, mesh: Mesh | None, tau_chunk: int | None,
             parts: tuple[str, ...] = ('decoder', 'encoder', 'token_embedder')) -> Callable:
  """jit of per-example row-statistic sums per layer and head for `[t, n, 1 or h]` taus:
  `(params, tokens [b, l], taus) -> sums`, the compiled sweep of `encoder_attention_stats`
  (`sweep_program` gives it with its arguments).

  `parts`: the top-level keys of the params it is called with (the encoder needs 'encoder' and
  'token_embedder' only, so a tree without the decoder is enough).

  The taus are vmapped: all at once with `tau_chunk` None, else `tau_chunk` at a time in a
  `lax.map` inside the same call (per device, over the device's share of the taus).
  With a ('tau', 'data', 'model') mesh: parameters sharded over 'model' by their logical axes,
  examples over 'data', candidate taus over 'tau' (`spmd_axis_name`, so the layers' activation
  constraints gain the 'tau' axis too); the small sums come back replicated.
  """
  model = network.Transformer(config)
  n = config.num_encoder_layers

  def one_tau(params, tokens, tau):
    # tau [n, 1 or h], passed as [1, n, 1 or h] so that it never reads as one per example.
    _, state = model.apply({'params': params}, tokens, method='encode', enable_dropout=False,
                           temperature=tau[None], mutable=['intermediates'])
    sums = network.encoder_row_stats(state['intermediates'], n)
    # [n, b, h] -> [b, n, h]
    return {'pmax_sum': jnp.transpose(sums['pmax_sum'], (1, 0, 2)),
            'entropy_sum': jnp.transpose(sums['entropy_sum'], (1, 0, 2)),
            'rows': sums['rows']}  # [b]

  groups = mesh.shape['tau'] if mesh is not None else 1
  spmd = dict(spmd_axis_name='tau') if mesh is not None else {}

  def all_taus(params, tokens, taus):
    if tau_chunk is None:
      return jax.vmap(one_tau, in_axes=(None, None, 0), **spmd)(params, tokens, taus)
    # [t, n, k] -> [groups, t / groups, n, k]: vmap over the groups (one per 'tau' device),
    # lax.map over each group's taus, tau_chunk at a time.
    grouped = taus.reshape(groups, -1, *taus.shape[1:])
    per_group = lambda g: jax.lax.map(lambda tau: one_tau(params, tokens, tau), g,
                                      batch_size=tau_chunk)
    out = jax.vmap(per_group, **spmd)(grouped)
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), out)

  if mesh is None:
    return jax.jit(all_taus)
  shardings = partitioning.param_shardings(config, mesh)
  return partitioning.partition(
      all_taus, mesh, in_shardings=({k: shardings[k] for k in parts},
                                    partitioning.batch_sharding(mesh, 2), tau_sharding(mesh)),
      out_shardings=partitioning.replicated(mesh))


def sweep_program(params: Any, config: network.T5Config, *, length: int, batch_size: int,
                  taus: int, mesh: Mesh | None = None,
                  tau_chunk: int | None | str = 'auto') -> tuple[Callable, tuple[Any, ...]]:
  """The sweep `encoder_attention_stats` calls for `batch_size` samples of `length` tokens and
  `taus` candidates per call, and its abstract arguments `(params, tokens [b, l], taus
  [t, n, 1])` as the run places them (`params` placed on `mesh`: no copy when already placed;
  sizes rounded up to the mesh's 'data' and 'tau' axes)."""
  tau_axis, data_axis = (mesh.shape['tau'], mesh.shape['data']) if mesh is not None else (1, 1)
  tau_chunk = default_tau_chunk() if tau_chunk == 'auto' else tau_chunk
  if not isinstance(jax.tree.leaves(params)[0], jax.ShapeDtypeStruct):  # Abstract: as given.
    params = partitioning.place_params(params, config, mesh)
  rows = (batching.round_up(batch_size, data_axis), length)
  # [t, n, 1]: the form `encoder_attention_stats` calls the sweep with (one tau per layer).
  cands = (batching.round_up(taus, tau_axis), config.num_encoder_layers, 1)
  if mesh is None:
    args = (jax.ShapeDtypeStruct(rows, jnp.int32), jax.ShapeDtypeStruct(cands, jnp.float32))
  else:
    args = (jax.ShapeDtypeStruct(rows, jnp.int32, sharding=partitioning.batch_sharding(mesh, 2)),
            jax.ShapeDtypeStruct(cands, jnp.float32, sharding=tau_sharding(mesh)))
  return sweep_fn(config, mesh, tau_chunk, tuple(sorted(params))), (params, *args)


def tau_sharding(mesh: Mesh) -> NamedSharding:
  """The `[t, n]` candidate temperatures: over 'tau'."""
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


def length_groups(tokens: np.ndarray, multiple: int = 1) -> list[np.ndarray]:
  """Splits `[b, l]` tokens into groups by non-pad width rounded up to `multiple` (at most l),
  each trimmed to that width.

  NOTE: trimming skips the compute on padding: statistics of non-pad rows are unchanged (padding
  keys get probability exactly 0), and padded query rows are excluded from the sums by a select
  in the attention layer (their float32 statistics are finite, but no part of the mean). A
  `multiple` > 1 trades a little padding for fewer shapes (each shape is one compilation).
  """
  validate.positive_int(multiple, 'multiple')
  nonpad = tokens > 0
  width = np.where(nonpad.any(1), tokens.shape[1] - np.argmax(nonpad[:, ::-1], axis=1), 0)
  width = np.where(width > 0, np.minimum(batching.round_up(width, multiple), tokens.shape[1]), 0)
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
    width_multiple: int = 128,
    tau_chunk: int | None | str = 'auto',
) -> AttentionStats:
  """Mean encoder row P_max and entropy for every candidate temperature.

  One jit-compiled call vmaps the encoder over the candidates (`tau_chunk` at a time). With
  `mesh` (axes 'tau', 'data', 'model'; see `partitioning.calibration_mesh`) the parameters
  shard over 'model', the candidates over 'tau' (padded with 1.0 to the axis size) and the
  batch over 'data' (padded with weight-0 copies of a row); results equal one device's. Examples
  are run in groups of equal non-pad width, rounded up to `width_multiple` (`length_groups`),
  one compilation per width.

  Args:
    params: the T5X 'params' tree, or its 'encoder' and 'token_embedder' alone.
    config: the model config.
    tokens: int `[b, l]` encoder inputs, 0 = (trailing) padding.
    temperatures: `[t]` (one tau for every layer), `[t, n]` (one per layer) or `[t, n, h]`
      (one per layer and head), finite and > 0.
    mesh: optional device mesh.
    batch_size: examples per call (sums accumulate across calls); a whole group if None.
    tau_batch_size: candidates per call, to bound memory (`t x b x h x l x l` probabilities).
    width_multiple: examples are grouped by non-pad width rounded up to this (`length_groups`).
    tau_chunk: candidates vmapped at once within a call (the rest follow in a `lax.map`); None:
      all of them; 'auto': `default_tau_chunk()` for the backend. Results agree to float32
      rounding (the demo's sweeps: within 2e-7 relative).

  Returns:
    AttentionStats with `[t, n, h]` per-head, `[t, n]` per-layer and `[t]` pooled means.
  """
  taus = validate.temperature_array(temperatures).astype(np.float32)
  tokens = check_tokens(tokens)
  n, h = config.num_encoder_layers, config.num_heads
  if taus.shape[1:] not in ((), (n,), (n, h)):
    raise ValueError(f'temperatures of shape {taus.shape}: expected [t], [t, {n}] per-layer or '
                     f'[t, {n}, {h}] per-head values.')
  # [t] or [t, n] -> [t, n, 1]: one compiled form for both (a scalar tau equals the same tau on
  # every layer); [t, n, h] stays (a second form, for per-head taus only).
  taus = np.broadcast_to(taus.reshape(len(taus), -1, 1) if taus.ndim < 3 else taus,
                         (len(taus), n, h if taus.ndim == 3 else 1))
  if tau_chunk == 'auto':
    tau_chunk = default_tau_chunk()
  elif tau_chunk is not None:
    validate.positive_int(tau_chunk, 'tau_chunk')
  fn = sweep_fn(config, mesh, tau_chunk, tuple(sorted(params)))
  tau_axis, data_axis = (mesh.shape['tau'], mesh.shape['data']) if mesh is not None else (1, 1)
  params = partitioning.place_params(params, config, mesh)  # No copy when already placed.
  tb = batching.round_up(tau_batch_size or len(taus), tau_axis)
  sums = np.zeros((2, len(taus), n, h))
  rows = 0.0
  for group in length_groups(tokens, width_multiple):
    bb = batching.round_up(batch_size or len(group), data_axis)
    for b0 in range(0, len(group), bb):
      batch = group[b0:b0 + bb]
      weight = _pad_rows(np.ones(len(batch)), bb, 0.0)  # [bb]; 0 on padded copies
      batch = _pad_rows(batch, bb, batch[0])
      for t0 in range(0, len(taus), tb):
        k = min(tb, len(taus) - t0)
        candidates = _pad_rows(taus[t0:t0 + tb], tb, 1.0)
        if mesh is not None:  # Global arrays; each process copies only its devices' slices.
          args = (partitioning.global_array(batch, partitioning.batch_sharding(mesh, 2)),
                  partitioning.global_array(candidates, tau_sharding(mesh)))
        else:
          args = (batch, candidates)
        out = jax.device_get(fn(params, *args))
        if t0 == 0:
          rows += float(np.dot(out['rows'][0], weight))
        for i, key in enumerate(('pmax_sum', 'entropy_sum')):
          # [t, b, n, h] x [b] -> [t, n, h]
          sums[i, t0:t0 + k] += np.einsum('tbnh,b->tnh', np.asarray(out[key][:k], np.float64),
                                          weight)
  # [2, t, n, h] -> [t, n, 1, h]: the whole input as one example's sums over `rows` rows.
  return _mean_stats(sums[0][:, :, None], sums[1][:, :, None], np.array([rows]))


def _mean_stats(pmax_sum: np.ndarray, entropy_sum: np.ndarray,
                rows: np.ndarray) -> AttentionStats:
  """`AttentionStats` of `[t, n, g, h]` float64 sums over `[g]` row counts, averaged by
  `network.mean_row_stats` (each row weighs the same)."""
  means = network.mean_row_stats({'pmax_sum': pmax_sum, 'entropy_sum': entropy_sum,
                                  'rows': rows})
  return AttentionStats(means['layer_pmax'], means['layer_entropy'], means['pmax'],
                        means['entropy'], int(rows.sum()), means['head_pmax'],
                        means['head_entropy'])


@functools.lru_cache(maxsize=16)
def _sorted_logits_fn(config: network.T5Config, chunk: int, mesh: Mesh | None) -> Callable:
  model = network.Transformer(config)
  # NOTE: on one CPU device the rows are sorted by numpy (a callback), much faster than XLA's
  # CPU sort (docs/performance/cpu.md); the sorted values are the same.
  host = mesh is None and jax.default_backend() == 'cpu'

  def sort_descending(x):
    if not host:
      return jnp.sort(x, axis=-1, descending=True)
    return jax.pure_callback(lambda a: -np.sort(-np.asarray(a), axis=-1),
                             jax.ShapeDtypeStruct(x.shape, x.dtype), x)

  def fn(params, tokens):
    _, state = model.apply({'params': params}, tokens, method='encode', enable_dropout=False,
                           temperature=1.0, mutable=['attention_inputs'])
    layer0 = state['attention_inputs']['encoder']['layers_0']['attention']
    # [b, l, h, d]
    q = layer0['projected_query'][0].astype(jnp.float32)
    k = layer0['projected_key'][0].astype(jnp.float32)
    table = jnp.asarray(params['encoder']['relpos_bias']['rel_embedding'], jnp.float32)
    b, l, h, _ = q.shape
    offset_map = network.encoder_offset_map(config, 0, l)  # layer 0's bias rule at this length
    valid = tokens > 0  # [b, l]
    chunks = batching.ceil_div(l, chunk)
    q = jnp.pad(q, ((0, 0), (0, chunks * chunk - l), (0, 0), (0, 0)))
    valid_q = jnp.pad(valid, ((0, 0), (0, chunks * chunk - l))).astype(jnp.float32)

    def body(total, start):
      qc = jax.lax.dynamic_slice_in_dim(q, start, chunk, axis=1)  # [b, c, h, d]
      # [b, c, h, d] x [b, l, h, d] -> [b, h, c, l], plus the [1, h, c, l] relative bias.
      logits = jnp.einsum('bqhd,bkhd->bhqk', qc, k, precision=reference.dot_precision(qc, k))
      logits += reference.relative_position_bias(table, chunk, l, True, q_offset=start,
                                                 offset_map=offset_map)
      logits = jnp.where(valid[:, None, None, :], logits, -jnp.inf)
      ranked = sort_descending(logits)  # padding keys sort last
      ranked = jnp.where(jnp.isfinite(ranked), ranked, 0.0)
      vq = jax.lax.dynamic_slice_in_dim(valid_q, start, chunk, axis=1)  # [b, c]
      return total + jnp.einsum('bhqk,bq->bk', ranked, vq,
                                precision=reference.dot_precision(ranked, vq)), None

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
  needs them all again. Keys are the weights (a content fingerprint: `params_fingerprint`), the
  config, the token and tau arrays (by content) and the chunk, so one Memo serves several sets
  of weights without mixing them up. Batch and mesh settings only change how a result is
  computed, so they are not part of the key.
  """

  def __init__(self):
    self._results: dict[tuple, Any] = {}
    # Fingerprints by the identity of the leaves they were computed from. The leaves are kept
    # (alive) beside their fingerprint, so an id is never reused by other weights meanwhile.
    self._params: dict[tuple[int, ...], tuple[list, str]] = {}
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

  def _params_key(self, params: Any) -> str:
    leaves = jax.tree.leaves(params)
    ids = tuple(map(id, leaves))
    if ids not in self._params:  # Placing weights on a device keeps the leaves of placed ones.
      self._params[ids] = (leaves, params_fingerprint(params))
    return self._params[ids][1]

  def attention_stats(self, params: Any, config: network.T5Config, tokens: Any,
                      temperatures: Any, mesh: Mesh | None = None, **kwargs) -> AttentionStats:
    """`encoder_attention_stats(params, config, tokens, temperatures, mesh, **kwargs)`."""
    tokens = check_tokens(tokens)
    taus = validate.temperature_array(temperatures).astype(np.float32)
    return self._get(self._stats_key(params, config, tokens, taus),
                     lambda: encoder_attention_stats(params, config, tokens, taus, mesh,
                                                     **kwargs))

  def _stats_key(self, params: Any, config: network.T5Config, tokens: np.ndarray,
                 taus: np.ndarray) -> tuple:
    return ('stats', self._params_key(params), config, self._fingerprint(tokens),
            self._fingerprint(taus))

  def pooled_stats(self, params: Any, config: network.T5Config, groups: Sequence[Any],
                   temperatures: Any, mesh: Mesh | None = None, **kwargs) -> AttentionStats:
    """`attention_stats` of the rows of several token arrays together, from each array's own
    (remembered or computed) result: each head's mean weighted by the arrays' row counts.

    Equal to one call on the arrays concatenated (to float64 rounding: the same per-row sums,
    added in another order); when the arrays have one width, that concatenation's result is
    remembered too, so a later `attention_stats` (e.g. `calibration.calibrate` on the pooled
    prompts) computes nothing. E.g. per-task sweeps pooled over the tasks.
    """
    parts = [self.attention_stats(params, config, g, temperatures, mesh, **kwargs)
             for g in groups]
    if not parts:
      raise ValueError('pooled_stats needs at least one token array.')
    rows = np.array([p.rows for p in parts], np.float64)  # [g]
    # Each array's per-head sums (its means times its rows): [g, t, n, h] x [g] -> [t, n, g, h].
    sums = [np.einsum('gtnh,g->tngh', np.stack([getattr(p, key) for p in parts]), rows)
            for key in ('head_pmax', 'head_entropy')]
    stats = _mean_stats(sums[0], sums[1], rows)
    if len({np.shape(g)[1] for g in groups}) == 1:
      tokens = np.concatenate([check_tokens(g) for g in groups])
      taus = validate.temperature_array(temperatures).astype(np.float32)
      self._results.setdefault(self._stats_key(params, config, tokens, taus), stats)
    return stats

  def computed_stats(self, params: Any, config: network.T5Config, tokens: Any,
                     temperatures: Any) -> AttentionStats | None:
    """The remembered result of `attention_stats` for these inputs, or None (computes nothing)."""
    key = self._stats_key(params, config, check_tokens(tokens),
                          validate.temperature_array(temperatures).astype(np.float32))
    return self._results.get(key)

  def sorted_logits(self, params: Any, config: network.T5Config, tokens: Any,
                    chunk: int = 128) -> np.ndarray:
    """`layer0_sorted_logits(params, config, tokens, chunk)`."""
    tokens = check_tokens(tokens)
    key = ('layer0', self._params_key(params), config, self._fingerprint(tokens), chunk)
    return self._get(key, lambda: layer0_sorted_logits(params, config, tokens, chunk))


def params_fingerprint(params: Any) -> str:
  """sha256 hex digest of a params tree: its paths, shapes, dtypes and every value.

  Leaves on several processes (not fully addressable) are reduced on device to two sums (plain
  and position-weighted), the same on every process; the others are hashed byte for byte.
  """
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    digest.update(f'{jax.tree_util.keystr(path)}:{np.shape(leaf)}:{leaf.dtype}'.encode())
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      digest.update(np.asarray(jax.device_get(_checksums(leaf)), np.float64).tobytes())
    else:
      digest.update(np.ascontiguousarray(jax.device_get(leaf)).tobytes())
  return digest.hexdigest()


@jax.jit
def _checksums(x: jax.Array) -> jax.Array:
  flat = x.reshape(-1).astype(jnp.float32)
  weights = jnp.cos(jnp.arange(flat.size, dtype=jnp.float32))
  return jnp.stack([jnp.sum(flat), jnp.sum(flat * weights)])
