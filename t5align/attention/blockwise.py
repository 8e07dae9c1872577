"""Blockwise ('blockwise') self-attention: online softmax over key blocks, bias built per block.

Pure JAX. Queries are processed one block at a time (`lax.map`) and, for each, keys one block at a
time (`lax.scan`) with flash-attention accumulators, so the largest intermediate is `[b, h, block_q,
block_k]`: memory is O(L * block), never `[L, L]`. Each tile takes one of five paths (`tile_kinds`,
a `lax.switch`): a tile wholly beyond the band `far` of the diagonal ('far': nearly every tile at
long lengths) has one relative-position bias per head, folded into the row's softmax shift, not
added per element; a near tile adds a window of the bias of every offset
(`reference.bias_by_offset`, one contiguous copy per row); a tile whose queries and keys all share
one segment gets no per-element mask; one where none do is skipped. The tile's tempered logits `(q.k
+ bias) / tau` are never materialized: `softmax_tile` shifts each row by its largest raw logit and
tempers inside the exponential, and sums the entropy term as a dot. The values' sum (for fully
masked rows) is taken once per call. Block sizes are arguments (`Options`, from
T5Config.attention_options); None picks `default_blocks()` for the backend. On CPU a batch
whose tiles would outgrow the cache (`CPU_TILE_ELEMENTS`) is attended a few examples at a time
(`default_batch_block`, a `lax.map` over chunks of the batch). Same math as 'reference' (see
reference.py): `softmax((q.k + relpos_bias + mask_bias) / tau)` in float32. Attention dropout
(training) uses t5x's `[b, h, 1, l]` key mask drawn once from the module's rng, sliced per key
block, so it drops exactly the keys 'reference' (and t5x) drop.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from t5align.attention import reference

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Options:
  """'blockwise' tiles (keywords of `blockwise_attention`); None: `default_blocks()`."""

  block_q: int | None = None
  block_k: int | None = None


def default_blocks(backend: str | None = None) -> tuple[int, int]:
  """`(block_q, block_k)` for `backend` (default: `reference.target_platform()`, the traced
  program's): measured on CPU, 512 x 512 elsewhere.

  CPU: 256 queries x 512 keys (a `[h, 256, 512]` float32 tile stays in cache; larger tiles
  measured slower on a 2-core machine, smaller ones no faster); accelerators: 512 x 512, large
  enough for their matmuls.
  """
  if (backend or reference.target_platform()) == 'cpu':
    return 256, 512
  return 512, 512


# CPU: the elements of one `[b, h, block_q, block_k]` tile that stay in cache. Past it, examples
# are attended one chunk at a time (`default_batch_block`).
CPU_TILE_ELEMENTS = 2 ** 20


def default_batch_block(batch: int, heads: int, block_q: int, block_k: int,
                        backend: str | None = None) -> int:
  """Examples attended at once: all on accelerators; on CPU as many as keep a tile within
  `CPU_TILE_ELEMENTS` (at least one): on CPU a batch's tiles past it leave the cache, and fewer
  examples at a time run faster than smaller tiles (docs/performance/cpu.md).
  """
  if (backend or reference.target_platform()) != 'cpu':
    return batch
  return max(1, min(batch, CPU_TILE_ELEMENTS // (heads * block_q * block_k)))


def round_up(x: int, multiple: int) -> int:
  """The smallest multiple of `multiple` that is >= `x`: the kernels' own `batching.round_up`
  (the attention modules import nothing of t5align but each other)."""
  return -(-x // multiple) * multiple


def _pad_axis(x: Array, length: int, axis: int) -> Array:
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, length - x.shape[axis])
  return jnp.pad(x, pad)


# Kinds of `[block_q, block_k]` tile (`tile_kinds`), one `lax.switch` branch each.
SKIP, NEAR_MASKED, NEAR, FAR_MASKED, FAR = range(5)


def tile_kinds(q_ids: Array, k_ids: Array, block_q: int, block_k: int,
               bidirectional: bool, far: int = reference.MAX_DISTANCE
               ) -> tuple[Array, np.ndarray]:
  """The kind of every tile, and whether a far tile lies right of its queries.

  Position (static): a tile whose every offset `key - query` is beyond `far` on one
  side ('far') has one relative-position bias per head, the table's first (left) or last
  (right) column, so it needs no per-element lookup; at long lengths nearly every tile is far.
  Mask (from the segment ids): a tile whose queries and keys all belong to one segment (no
  padding, and for a causal mask, every key at or before every query) needs no per-element mask;
  one where no query can see any key (their segment ranges are disjoint, all padding, or wholly
  in the future) is skipped. A tile neither is 'masked', computed as 'reference' would.

  Args:
    q_ids: int `[nq, c, block_q]` segment ids of the query blocks (0 = padding).
    k_ids: int `[nk, c, block_k]` segment ids of the key blocks (internal padding: 0).
    block_q: queries per block.
    block_k: keys per block.
    bidirectional: no causal mask.
    far: the bias band's half-width (`reference.OffsetMap.far`; T5's MAX_DISTANCE).

  Returns:
    int32 `[nq, nk]` kinds (SKIP, NEAR_MASKED, NEAR, FAR_MASKED, FAR) and bool `[nq, nk]`
    (numpy) True where a far tile's keys lie right of its queries.
  """
  nq, nk = q_ids.shape[0], k_ids.shape[0]
  q_first = np.arange(nq)[:, None] * block_q  # [nq, 1]
  k_first = np.arange(nk)[None, :] * block_k  # [1, nk]
  q_last, k_last = q_first + block_q - 1, k_first + block_k - 1
  far_left = q_first - k_last >= far  # [nq, nk]
  far_right = k_first - q_last >= far  # [nq, nk]

  def summary(ids):
    """`[n, c, block]` -> per block and example: one segment throughout, its id, id range."""
    real = ids > 0
    one = jnp.all(ids == ids[..., :1], axis=-1) & real[..., 0]  # [n, c]
    big = jnp.iinfo(jnp.int32).max
    lo = jnp.min(jnp.where(real, ids, big), axis=-1)  # [n, c]; big: all padding.
    hi = jnp.max(jnp.where(real, ids, 0), axis=-1)  # [n, c]
    return one, ids[..., 0], lo, hi

  q_one, q_id, q_lo, q_hi = (x[:, None] for x in summary(q_ids))  # [nq, 1, c]
  k_one, k_id, k_lo, k_hi = (x[None] for x in summary(k_ids))  # [1, nk, c]
  # [nq, nk]: every (query, key) pair in one segment / no pair in one segment, in every example.
  full = jnp.all(q_one & k_one & (q_id == k_id), axis=-1)
  # NOTE: disjoint id ranges imply no shared segment (ranges of all-padding blocks are empty).
  none = jnp.all((q_hi < k_lo) | (k_hi < q_lo), axis=-1)
  if not bidirectional:
    full = full & (k_last <= q_first)  # every key at or before every query
    none = none | (k_first > q_last)  # every key after every query
  far = far_left | far_right
  kinds = jnp.where(full, jnp.where(far, FAR, NEAR), jnp.where(far, FAR_MASKED, NEAR_MASKED))
  return jnp.where(none, SKIP, kinds).astype(jnp.int32), far_right


def init_carry(shape: tuple[int, ...], depth: int, lanes: int | None = None):
  """Empty accumulators `(m, l, c, acc, v_sum)` for query rows of `shape` (e.g. `[b, h, q]`).

  `lanes`: None keeps the row statistics m, l, c as `shape`; a number keeps them as
  `shape + (lanes,)`, each row's value repeated over `lanes` (the layout of a TPU kernel's
  `[block_q, 128]` scratch: `_rows` then tiles a statistic against a `[q, k]` block instead
  of broadcasting a `[q]` vector across lanes, which Mosaic does with cross-lane permutes.
  libtpu's static schedule of pallas_tpu's unmasked 512 x 512 v5e tile, written both ways and
  read with `benchmarks/tpu_kernel_bench.py --llo`: 2,705 bundles with `[q]` statistics, 1,561
  repeated over 128 lanes).
  """
  rows = shape if lanes is None else shape + (lanes,)
  zeros = jnp.zeros(rows, jnp.float32)
  return (jnp.full(rows, -jnp.inf, jnp.float32), zeros, zeros,
          jnp.zeros(shape + (depth,), jnp.float32), jnp.zeros(shape[:-1] + (depth,), jnp.float32))


def _rows(x: Array, width: int, repeated: bool) -> Array:
  """A row statistic against `[..., q, width]`: `[..., q]` -> `[..., q, 1]`, or (`repeated`,
  see `init_carry`) `[..., q, lanes]` tiled or cut to `width`."""
  if not repeated:
    return x[..., None]
  lanes = x.shape[-1]
  if lanes in (1, width):
    return x
  reps = -(-width // lanes)
  if reps > 1:
    x = jnp.tile(x, (1,) * (x.ndim - 1) + (reps,))
  return x if width % lanes == 0 else x[..., :width]


def softmax_tile(carry, x: Array, v: Array, p_dtype: jnp.dtype, *, scale: Array | float = 1.0,
                 offset: Array | float = 0.0, allowed: Array | None = None,
                 dropout: Array | None = None, stats: bool = True, dot_stats: bool = False):
  """One key tile of the online softmax whose tempered logits are `x * scale + offset`.

  Accumulators (float32, `(m, l, c, acc)`; see `online_softmax_step`): m `[..., q]` running max of
  the tempered logits over allowed keys, l = sum exp(s - m), c = sum exp(s - m) (s - m),
  acc `[..., q, d]` = sum exp(s - m) v. Each row is shifted by its largest allowed raw logit of
  the tile (`x_ref`) before tempering: `s - m = (x - x_ref) * scale + r` with the row's
  `r = x_ref * scale + offset - m <= 0`, so exp and the entropy term see small numbers, and
  c = sum p (x - x_ref) * scale + r l does not cancel.

  Args:
    carry: (m, l, c, acc).
    x: `[..., q, k]` float32 logits before tempering (q.k, plus the relative-position bias unless
      it is one value per row, then in `offset`).
    v: `[..., k, d]` values.
    p_dtype: dtype of the probabilities multiplied with `v`.
    scale: 1 / tau, broadcastable to the rows `[..., q]`.
    offset: tempered bias shared by a whole row of the tile, broadcastable to `[..., q]`.
    allowed: bool, broadcastable to `x`; False for masked keys. None: every key is allowed (no
      per-element select).
    dropout: optional `[..., 1, k]` attention-dropout multiplier; it scales what reaches `v`
      only (never l or c: the softmax and its statistics are taken before dropout).
    stats: update c (for the entropy); False leaves it as it is.
    dot_stats: take the row sums of products `sum_k p (x - x_ref)` as an einsum, which XLA CPU
      runs as a dot, instead of a multiply and a sum (what a Triton kernel can lower): on CPU
      the dot is several times faster (docs/performance/cpu.md).

  Returns:
    The updated `(m, l, c, acc)`.
  """
  m, l, c, acc = carry
  scale, offset = jnp.asarray(scale, jnp.float32), jnp.asarray(offset, jnp.float32)
  if allowed is None:
    x_ref = jnp.max(x, axis=-1)  # [..., q]
  else:
    x_ref = jnp.max(jnp.where(allowed, x, -jnp.inf), axis=-1)  # [..., q]; -inf: none allowed.
  m_new = jnp.maximum(m, x_ref * scale + offset)  # [..., q]
  m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # [..., q]; no allowed key yet.
  alpha = jnp.exp(m - m_safe)  # [..., q]; 0 while m = -inf.
  if allowed is not None:
    x_ref = jnp.where(x_ref == -jnp.inf, 0.0, x_ref)
  r = x_ref * scale + offset - m_safe  # [..., q]; 0 on the rows whose max is in this tile.
  y = x - x_ref[..., None]  # [..., q, k]; <= 0 on allowed keys.
  p = jnp.exp(y * scale[..., None] + r[..., None])  # [..., q, k]
  if allowed is not None:
    p = jnp.where(allowed, p, 0.0)
  l_tile = jnp.sum(p, axis=-1)  # [..., q]
  l_new = alpha * l + l_tile
  if stats:
    if dot_stats:
      # [..., q, k] x [..., q, k] -> [..., q]
      py = jnp.einsum('...qk,...qk->...q', p, y, preferred_element_type=jnp.float32,
                      precision=reference.dot_precision(p, y))
    else:
      py = jnp.sum(p * y, axis=-1)
    # NOTE: rescaling c to the new max: sum e^(s-m_new)(s-m_new) = alpha (c + (m - m_new) l).
    c_old = c + jnp.where(l > 0, m - m_safe, 0.0) * l
    c = alpha * c_old + py * scale + r * l_tile
  p_v = p if dropout is None else p * dropout  # [..., q, k]
  # [..., q, k] x [..., k, d] -> [..., q, d]
  p_v = p_v.astype(p_dtype)
  pv = jnp.einsum('...qk,...kd->...qd', p_v, v, preferred_element_type=jnp.float32,
                  precision=reference.dot_precision(p_v, v))
  return m_new, l_new, c, alpha[..., None] * acc + pv


def online_softmax_step(carry, s: Array, allowed: Array | None, v: Array, k_valid: Array | None,
                        p_dtype: jnp.dtype, dropout: Array | None = None, stats: bool = True):
  """One key block of the online softmax, tempered logits given (`softmax_tile`, plus v_sum).

  Accumulators (float32): m `[..., q]` max over allowed keys, l = sum exp(s - m),
  c = sum exp(s - m) (s - m), acc `[..., q, d]` = sum exp(s - m) v, and v_sum `[..., d]` = sum v
  over all real keys (for fully masked rows). `c` is `w - m l` (w of `attention`'s derivation of
  the row statistics), kept relative to the running max: H = log l - c / l does not cancel. m, l
  and c may instead be `[..., q, lanes]`, each row repeated over lanes (`init_carry(..., lanes=)`).

  NOTE: 'reference' adds -1e10 to masked logits. Whenever a row has an allowed key, exp underflows
  to exactly 0 on the masked ones (for any tau < ~1e8), and a row without one is uniform over all
  keys. Both cases are computed here explicitly, never with 1e10-scale numbers, whose exponent
  arguments a compiler may round differently in different fusions (FMA) and turn into inf/NaN.

  Args:
    carry: (m, l, c, acc, v_sum).
    s: `[..., q, k]` tempered float32 logits (without the mask).
    allowed: bool, broadcastable to `s`; False for masked keys. None: every key is allowed (a
      block without padding, segment boundary or causal cut; no selects at all).
    v: `[..., k, d]` values.
    k_valid: bool `[k]`; False for keys added by internal padding (excluded entirely). None:
      every key is real.
    p_dtype: dtype of the probabilities multiplied with `v`.
    dropout: optional `[..., 1, k]` float32 attention-dropout multiplier (keep / keep_prob) of
      the block's keys. It scales what reaches `v` (acc and v_sum), never l or c: the softmax is
      normalized, and its statistics taken, before dropout.
    stats: update c (for the entropy); False leaves it as it is (outputs only).

  Returns:
    The updated carry.
  """
  m, l, c, acc, v_sum = carry
  repeated = m.ndim == s.ndim  # [..., q, lanes] row statistics.
  row_max = functools.partial(jnp.max, axis=-1, keepdims=repeated)
  row_sum = functools.partial(jnp.sum, axis=-1, keepdims=repeated)
  if k_valid is not None:
    allowed = k_valid if allowed is None else allowed & k_valid
  masked = lambda x, fill: x if allowed is None else jnp.where(allowed, x, fill)
  m_new = jnp.maximum(m, row_max(masked(s, -jnp.inf)))  # [..., q]
  m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # [..., q]; no allowed key yet.
  alpha = jnp.exp(m - m_safe)  # [..., q]; 0 while m = -inf.
  shifted = masked(s - _rows(m_safe, s.shape[-1], repeated), 0.0)  # [..., q, k]
  p = masked(jnp.exp(shifted), 0.0)  # [..., q, k]
  # NOTE: rescaling c to the new max: sum e^(s-m_new)(s-m_new) = alpha (c + (m - m_new) l).
  c_old = c + jnp.where(l > 0, m - m_safe, 0.0) * l
  l_new = alpha * l + row_sum(p)
  c_new = alpha * c_old + row_sum(p * shifted) if stats else c
  p_v = p if dropout is None else p * dropout  # [..., q, k]
  # [..., q, k] x [..., k, d] -> [..., q, d]
  p_v = p_v.astype(p_dtype)
  pv = jnp.einsum('...qk,...kd->...qd', p_v, v, preferred_element_type=jnp.float32,
                  precision=reference.dot_precision(p_v, v))
  acc_new = _rows(alpha, acc.shape[-1], repeated) * acc + pv
  return m_new, l_new, c_new, acc_new, v_sum + _value_sum(v, k_valid, dropout)


def _value_sum(v: Array, k_valid: Array | None, dropout: Array | None) -> Array:
  """`[..., k, d]` values -> `[..., d]` sum over the real (`k_valid`; None: all) keys, dropout
  applied."""
  v_real = v.astype(jnp.float32)  # [..., k, d]
  if k_valid is not None:
    v_real = jnp.where(k_valid[..., None], v_real, 0.0)
  if dropout is None:
    # [..., k, d] -> [..., d]
    return jnp.sum(v_real, axis=-2)
  # [..., 1, k] x [..., k, d] -> [..., d]
  return jnp.einsum('...k,...kd->...d', dropout[..., 0, :], v_real,
                    precision=reference.dot_precision(dropout, v_real))


def finalize(carry, length: int) -> tuple[Array, Array, Array]:
  """Output, P_max and entropy from the accumulators after all `length` keys.

  Rows with allowed keys: `acc / l`, P_max = 1 / l, H = log l - c / l. Fully masked rows are
  uniform over all keys, as in t5x: mean of v, P_max = 1 / length, H = log(length). P_max and
  entropy have the shape of the carry's row statistics (`[..., q]` or `[..., q, lanes]`).
  """
  _, l, c, acc, v_sum = carry
  repeated = l.ndim == acc.ndim
  width = acc.shape[-1]
  some = l > 0  # [..., q]
  l_safe = jnp.where(some, l, 1.0)
  # [..., q, d]
  out = jnp.where(_rows(some, width, repeated), acc / _rows(l_safe, width, repeated),
                  v_sum[..., None, :] / length)
  pmax = jnp.where(some, 1.0 / l_safe, 1.0 / length)
  entropy = jnp.where(some, jnp.log(l_safe) - c / l_safe, np.float32(np.log(length)))
  return out, pmax, entropy


@functools.partial(jax.jit, static_argnames=(
    'bidirectional', 'dtype', 'float32_logits', 'with_stats', 'block_q', 'block_k',
    'batch_block', 'dropout_rate', 'backend', 'offset_map'))
def blockwise_attention(
    query: Array,
    key: Array,
    value: Array,
    *,
    rel_embedding: Array,
    segment_ids: Array,
    temperature: Array | None = None,
    bidirectional: bool = True,
    dtype: jnp.dtype = jnp.float32,
    float32_logits: bool = False,
    with_stats: bool = False,
    block_q: int | None = None,
    block_k: int | None = None,
    batch_block: int | None = None,
    dropout_rng: Array | None = None,
    dropout_rate: float = 0.0,
    backend: str | None = None,
    offset_map: reference.OffsetMap = reference.OffsetMap(),
) -> tuple[Array, reference.RowStats | None]:
  """Self-attention with the T5 bias built block by block (see `dispatch.self_attention`).

  Args:
    query: `[b, l, h, d]`.
    key: `[b, l, h, d]`.
    value: `[b, l, h, d]`.
    rel_embedding: `[h, num_buckets]` relative-position table.
    segment_ids: int `[b, l]`; 0 marks padding.
    temperature: per example and head, broadcastable to `[b, h]`
      (`reference.head_temperature`); None for 1.
    bidirectional: encoder (True) or causal (False).
    dtype: dtype of the probabilities used against `value`.
    float32_logits: compute q.k in float32.
    with_stats: also return per-row P_max and entropy.
    block_q: queries per block (lengths are padded internally to a multiple); None: the
      backend's `default_blocks()`.
    block_k: keys per block; None: the backend's default.
    batch_block: examples attended at once (a `lax.map` over chunks of the batch); None:
      `default_batch_block` (all of them but on CPU). Results agree to float32 rounding.
    dropout_rng: PRNG key, enables attention dropout: t5x's `[b, h, 1, l]` mask, drawn once
      with `reference.dropout_multiplier` (the same keys 'reference' drops for the same rng) and
      sliced per key block.
    dropout_rate: attention dropout rate.
    backend: the platform compiled for, which picks the default blocks and batch chunks; None:
      jax's default backend (the dispatch passes the mesh's platform: `reference.target_platform`).
    offset_map: how offsets are read in the bias table (`reference.OffsetMap`; the default: as
      trained); its `far` is the band of near tiles.

  Returns:
    `[b, l, h, d]` output and optional RowStats `[b, h, l]`.
  """
  batch, length, heads, depth = query.shape
  tau = reference.head_temperature(temperature, batch, heads)  # [1 or b, 1 or h]
  if float32_logits:
    query, key = query.astype(jnp.float32), key.astype(jnp.float32)
  qk_dtype = jnp.result_type(query.dtype, key.dtype)
  out_dtype = jnp.result_type(dtype, value.dtype)
  lut = reference.bias_by_offset(rel_embedding.astype(jnp.float32), bidirectional, offset_map)
  far = offset_map.far
  default_q, default_k = default_blocks(backend)
  bq, bk = min(block_q or default_q, length), min(block_k or default_k, length)
  len_q, len_k = round_up(length, bq), round_up(length, bk)
  nq, nk = len_q // bq, len_k // bk
  # [len_k]; keys added here are excluded entirely (t5x's own padding keys stay, masked).
  k_valid = np.arange(len_k) < length
  k_starts = jnp.arange(nk, dtype=jnp.int32) * bk
  q_starts = jnp.arange(nq, dtype=jnp.int32) * bq
  multiplier = None
  if dropout_rng is not None and dropout_rate > 0.0:
    # [b, h, 1, l] -> [b, h, 1, len_k]
    multiplier = _pad_axis(reference.dropout_multiplier(
        dropout_rng, dropout_rate, (batch, heads, length, length), jnp.float32), len_k, 3)

  def attend(q, k, v, ids, tau, mult):
    """[c, l, h, d] q, k, v, [c, l] ids, [c or 1, h or 1] tau, [c, h, 1, len_k] mult ->
    [c, len_q, h, d] float32-accumulated output and [c, h, len_q] P_max and entropy (c examples).
    """
    c = q.shape[0]

    # [c, l, h, d] -> [n, c, h, block, d]
    def to_blocks(x, padded, block):
      x = _pad_axis(jnp.transpose(x, (0, 2, 1, 3)), padded, 2)  # [c, h, padded, d]
      return jnp.moveaxis(x.reshape(c, heads, padded // block, block, depth), 2, 0)

    q_blocks = to_blocks(q, len_q, bq)
    k_blocks, v_blocks = to_blocks(k, len_k, bk), to_blocks(v, len_k, bk)
    ids = ids.astype(jnp.int32)
    # [c, l] -> [n, c, block]
    q_ids = jnp.moveaxis(_pad_axis(ids, len_q, 1).reshape(c, nq, bq), 1, 0)
    k_ids = jnp.moveaxis(_pad_axis(ids, len_k, 1).reshape(c, nk, bk), 1, 0)
    kinds, right = tile_kinds(q_ids, k_ids, bq, bk, bidirectional, far)  # [nq, nk] each
    # The bias of every offset a near tile holds (`tile_kinds`: within `far` + block of the
    # diagonal), from `line_start` on: [h, 2 * (far + bq + bk)].
    line_start = -(far + bq + bk)
    offsets = np.arange(line_start, -line_start, dtype=np.int32)
    line = jnp.take(lut, np.clip(offsets, -far, far) + far, axis=1)
    scale = 1.0 / tau[:, :, None]  # [c or 1, h or 1, 1]
    # [h] -> [1, h, 1] tempered bias of far tiles, left and right of their queries.
    far_bias = [lut[None, :, col, None] * scale for col in (0, -1)]
    # [c, h, 1, len_k] -> [nk, c, h, 1, bk]
    k_dropout = (None if mult is None
                 else jnp.moveaxis(mult.reshape(c, heads, 1, nk, bk), 3, 0))
    # Every real key's value, summed once (fully masked rows attend uniformly): [c, h, d].
    v_sum = _value_sum(jnp.moveaxis(v_blocks, 0, 2).reshape(c, heads, len_k, depth),
                       jnp.asarray(k_valid), mult)

    def one_query_block(args):
      qb, qb_ids, q_start, qb_kinds, qb_right = args  # [c, h, bq, d], [c, bq], [], [nk], [nk]
      q_pos = q_start + jnp.arange(bq, dtype=jnp.int32)  # [bq]

      def step(carry, xs):
        kb, vb, kb_ids, k_start, kind, is_right, kb_dropout = xs

        def tile(near: bool, masked: bool):
          def attend_tile(carry):
            # [c, h, bq, d] x [c, h, bk, d] -> [c, h, bq, bk]
            x = jnp.einsum('bhqd,bhkd->bhqk', qb, kb, preferred_element_type=jnp.float32,
                           precision=reference.dot_precision(qb, kb))
            # NOTE: rounded to the dtype 'reference' computes q.k in (no-op for float32).
            x = x.astype(qk_dtype).astype(jnp.float32)
            offset = 0.0
            if near:
              # Row i of the tile holds offsets k_start - q_start - i + [0, bk): a window of
              # `line` (a contiguous copy per row, no per-element lookup).
              starts = k_start - q_start - line_start - jnp.arange(bq, dtype=jnp.int32)  # [bq]
              window = lambda start: jax.lax.dynamic_slice_in_dim(line, start, bk, axis=1)
              # [h, n] -> [h, bq, bk]
              x = x + jax.vmap(window, out_axes=1)(starts)[None]
            else:
              offset = jnp.where(is_right, far_bias[1], far_bias[0])  # [c or 1, h, 1]
            allowed = None
            if masked:
              allowed = reference.mask_from_ids(qb_ids, kb_ids)  # [c, 1, bq, bk]
              if not bidirectional:
                k_pos = k_start + jnp.arange(bk, dtype=jnp.int32)  # [bk]
                allowed = allowed & (k_pos[None, :] <= q_pos[:, None])
            return softmax_tile(carry, x, vb, dtype, scale=scale, offset=offset,
                                allowed=allowed, dropout=kb_dropout, stats=with_stats,
                                dot_stats=True)
          return attend_tile

        branches = [lambda carry: carry, tile(True, True), tile(True, False), tile(False, True),
                    tile(False, False)]  # SKIP, NEAR_MASKED, NEAR, FAR_MASKED, FAR
        return jax.lax.switch(kind, branches, carry), None

      init = init_carry((c, heads, bq), depth)[:4]
      carry, _ = jax.lax.scan(
          step, init, (k_blocks, v_blocks, k_ids, k_starts, qb_kinds, qb_right, k_dropout))
      return finalize((*carry, v_sum), length)

    # [nq, c, h, bq, d], [nq, c, h, bq], [nq, c, h, bq]
    out, pmax, entropy = jax.lax.map(one_query_block,
                                     (q_blocks, q_ids, q_starts, kinds, jnp.asarray(right)))
    # [nq, c, h, bq, d] -> [c, len_q, h, d]; [nq, c, h, bq] -> [c, h, len_q]
    to_rows = lambda x: jnp.transpose(x, (1, 2, 0, 3)).reshape(c, heads, len_q)
    return (jnp.transpose(out, (1, 0, 3, 2, 4)).reshape(c, len_q, heads, depth),
            to_rows(pmax), to_rows(entropy))

  chunk = min(batch_block or default_batch_block(batch, heads, bq, bk, backend), batch)
  if chunk >= batch:
    out, pmax, entropy = attend(query, key, value, segment_ids, tau, multiplier)
  else:
    # Chunks of `chunk` examples, one after another; the batch padded with masked examples.
    padded = round_up(batch, chunk)
    split = lambda x: _pad_axis(x, padded, 0).reshape((padded // chunk, chunk) + x.shape[1:])
    args = [query, key, value, segment_ids, jnp.broadcast_to(tau, (batch, tau.shape[1])),
            multiplier]
    out, pmax, entropy = jax.lax.map(
        lambda xs: attend(*xs), [None if x is None else split(x) for x in args])
    # [n, chunk, ...] -> [b, ...]
    out, pmax, entropy = (x.reshape((padded,) + x.shape[2:])[:batch]
                          for x in (out, pmax, entropy))
  out = out[:, :length].astype(out_dtype)
  if not with_stats:
    return out, None
  return out, reference.RowStats(pmax=pmax[..., :length], entropy=entropy[..., :length])
