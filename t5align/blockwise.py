"""Blockwise ('blockwise') self-attention: online softmax over key blocks, bias built per block.

Pure JAX. Queries are processed one block at a time (`lax.map`) and, for each, keys one block at a
time (`lax.scan`) with flash-attention accumulators, so the largest intermediate is
`[b, h, block_q, block_k]`: memory is O(L * block), never `[L, L]`. The relative-position bias of a
tile is one lookup in `attention.bias_by_offset` (`[heads, 2 * MAX_DISTANCE + 1]`, built once per
call from the `[heads, 32]` table: every offset beyond `MAX_DISTANCE` shares its side's last
bucket), so no tile computes buckets, and a tile lying wholly beyond `MAX_DISTANCE` adds one
value per head without a lookup; the padding/segment mask comes from the segment ids.
Block sizes are arguments (`Options`, from T5Config.attention_block_q / _k); None picks
`default_blocks()` for the backend. On CPU a batch whose tiles would outgrow the cache
(`CPU_TILE_ELEMENTS`) is attended a few examples at a time (`default_batch_block`, a `lax.map`
over chunks of the batch). Same math as 'reference' (see attention.py):
`softmax((q.k + relpos_bias + mask_bias) / tau)` in float32. Attention dropout (training) uses
t5x's `[b, h, 1, l]` key mask drawn once from the module's rng, sliced per key block, so it drops
exactly the keys 'reference' (and t5x) drop.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from t5align import attention

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Options:
  """'blockwise' tiles (keywords of `blockwise_attention`); None: `default_blocks()`."""

  block_q: int | None = None
  block_k: int | None = None


def default_blocks(backend: str | None = None) -> tuple[int, int]:
  """`(block_q, block_k)` for `backend` (default: `attention.target_platform()`, the traced
  program's): measured on CPU, 512 x 512 elsewhere.

  CPU: 256 queries x 512 keys (a `[h, 256, 512]` float32 tile stays in cache; larger tiles
  measured slower on a 2-core machine, smaller ones no faster); accelerators: 512 x 512, large
  enough for their matmuls.
  """
  if (backend or attention.target_platform()) == 'cpu':
    return 256, 512
  return 512, 512


# CPU: the elements of one `[b, h, block_q, block_k]` tile that stay in cache. Past it, examples
# are attended one chunk at a time (`default_batch_block`).
CPU_TILE_ELEMENTS = 2 ** 20


def default_batch_block(batch: int, heads: int, block_q: int, block_k: int,
                        backend: str | None = None) -> int:
  """Examples attended at once: all on accelerators; on CPU as many as keep a tile within
  `CPU_TILE_ELEMENTS` (at least one).

  Measured on the shipped retrieval T5 (8 heads) at 4096 tokens, 2-core CPU: 0.59 s per example
  for a batch of 50 in 256 x 512 tiles, 0.36 s with 64 x 64 tiles, 0.28 s one example at a time
  in 256 x 512 tiles.
  """
  if (backend or attention.target_platform()) != 'cpu':
    return batch
  return max(1, min(batch, CPU_TILE_ELEMENTS // (heads * block_q * block_k)))


def _round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


def _pad_axis(x: Array, length: int, axis: int) -> Array:
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, length - x.shape[axis])
  return jnp.pad(x, pad)


def block_logits(
    q: Array, k: Array, qk_dtype: jnp.dtype, bias_by_offset: Array, q_ids: Array, k_ids: Array,
    q_start: Array, k_start: Array, bidirectional: bool) -> tuple[Array, Array]:
  """Unmasked logits (q.k + relpos bias, before tau) and mask of one `[block_q, block_k]` tile.

  Args:
    q: `[b, h, bq, d]` queries.
    k: `[b, h, bk, d]` keys.
    qk_dtype: dtype in which q.k is rounded ('reference' computes it in the input dtype).
    bias_by_offset: `[h, 2 * MAX_DISTANCE + 1]` float32, `attention.bias_by_offset`.
    q_ids: int `[b, bq]` segment ids of the queries.
    k_ids: int `[b, bk]` segment ids of the keys.
    q_start: position of the first query of the tile.
    k_start: position of the first key of the tile.
    bidirectional: no causal mask (an encoder).

  Returns:
    float32 `[b, h, bq, bk]` logits and bool `[b, 1, bq, bk]` mask (True = may attend).
  """
  bq, bk = q.shape[2], k.shape[2]
  # [b, h, bq, d] x [b, h, bk, d] -> [b, h, bq, bk]
  qk = jnp.einsum('bhqd,bhkd->bhqk', q, k, preferred_element_type=jnp.float32)
  # NOTE: rounded to the dtype 'reference' computes q.k in (a no-op for float32 inputs).
  qk = qk.astype(qk_dtype).astype(jnp.float32)
  q_pos = q_start + jnp.arange(bq, dtype=jnp.int32)  # [bq]
  k_pos = k_start + jnp.arange(bk, dtype=jnp.int32)  # [bk]
  # [b, 1, bq, bk]
  mask = attention.mask_from_ids(q_ids, k_ids)
  if not bidirectional:
    mask = mask & (k_pos[None, :] <= q_pos[:, None])

  def near():
    # [h, 2 * MAX_DISTANCE + 1] -> [h, bq, bk]
    relpos = jnp.take(bias_by_offset, attention.offset_index(q_pos, k_pos), axis=1)
    # [b, h, bq, bk] + [1, h, bq, bk] -> [b, h, bq, bk]
    return qk + relpos[None]

  # A tile whose every offset is beyond MAX_DISTANCE on one side has one bias per head (the
  # table's first or last column): added as [1, h, 1, 1], no per-element lookup. At long
  # lengths nearly every tile is such a tile.
  far_left = q_start - (k_start + bk - 1) >= attention.MAX_DISTANCE
  far_right = k_start - (q_start + bq - 1) >= attention.MAX_DISTANCE
  branch = jnp.where(far_right, 2, jnp.where(far_left, 1, 0))
  logits = jax.lax.switch(branch, (near, lambda: qk + bias_by_offset[None, :, 0, None, None],
                                   lambda: qk + bias_by_offset[None, :, -1, None, None]))
  return logits, mask


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
  if width % lanes == 0:
    return jnp.tile(x, (1,) * (x.ndim - 1) + (width // lanes,))
  if lanes % width:
    raise ValueError(f'row statistics over {lanes} lanes do not fit a width of {width}.')
  return x[..., :width]


def online_softmax_step(carry, s: Array, allowed: Array | None, v: Array, k_valid: Array | None,
                        p_dtype: jnp.dtype, dropout: Array | None = None, stats: bool = True):
  """One key block of the online softmax.

  Accumulators (float32): m `[..., q]` max over allowed keys, l = sum exp(s - m),
  c = sum exp(s - m) (s - m), acc `[..., q, d]` = sum exp(s - m) v, and v_sum `[..., d]` = sum v
  over all real keys (for fully masked rows). `c` is `w - m l` of REFERENCE sec. 2, kept relative
  to the running max: H = log l - c / l does not cancel. m, l and c may instead be
  `[..., q, lanes]`, each row repeated over lanes (`init_carry(..., lanes=)`).

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
  pv = jnp.einsum('...qk,...kd->...qd', p_v.astype(p_dtype), v,
                  preferred_element_type=jnp.float32)
  acc_new = _rows(alpha, acc.shape[-1], repeated) * acc + pv
  v_real = v.astype(jnp.float32)  # [..., k, d]
  if k_valid is not None:
    v_real = jnp.where(k_valid[..., None], v_real, 0.0)
  if dropout is None:
    # [..., k, d] -> [..., d]
    v_sum = v_sum + jnp.sum(v_real, axis=-2)
  else:
    # [..., 1, k] x [..., k, d] -> [..., d]
    v_sum = v_sum + jnp.einsum('...k,...kd->...d', dropout[..., 0, :], v_real)
  return m_new, l_new, c_new, acc_new, v_sum


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
    'batch_block', 'dropout_rate', 'backend'))
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
) -> tuple[Array, attention.RowStats | None]:
  """Self-attention with the T5 bias built block by block (see `layers.self_attention`).

  Args:
    query: `[b, l, h, d]`.
    key: `[b, l, h, d]`.
    value: `[b, l, h, d]`.
    rel_embedding: `[h, num_buckets]` relative-position table.
    segment_ids: int `[b, l]`; 0 marks padding.
    temperature: per example and head, broadcastable to `[b, h]`
      (`attention.head_temperature`); None for 1.
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
      with `attention.dropout_multiplier` (the same keys 'reference' drops for the same rng) and
      sliced per key block.
    dropout_rate: attention dropout rate.
    backend: the platform compiled for, which picks the default blocks and batch chunks; None:
      jax's default backend (the dispatch passes the mesh's platform: `attention.target_platform`).

  Returns:
    `[b, l, h, d]` output and optional RowStats `[b, h, l]`.
  """
  batch, length, heads, depth = query.shape
  tau = attention.head_temperature(temperature, batch, heads)  # [1 or b, 1 or h]
  if float32_logits:
    query, key = query.astype(jnp.float32), key.astype(jnp.float32)
  qk_dtype = jnp.result_type(query.dtype, key.dtype)
  out_dtype = jnp.result_type(dtype, value.dtype)
  lut = attention.bias_by_offset(rel_embedding.astype(jnp.float32), bidirectional)
  default_q, default_k = default_blocks(backend)
  bq, bk = min(block_q or default_q, length), min(block_k or default_k, length)
  len_q, len_k = _round_up(length, bq), _round_up(length, bk)
  nq, nk = len_q // bq, len_k // bk
  # [nk, bk]; keys added here are excluded entirely (t5x's own padding keys stay, masked).
  k_valid = (np.arange(len_k) < length).reshape(nk, bk)
  k_starts = jnp.arange(nk, dtype=jnp.int32) * bk
  q_starts = jnp.arange(nq, dtype=jnp.int32) * bq
  multiplier = None
  if dropout_rng is not None and dropout_rate > 0.0:
    # [b, h, 1, l] -> [b, h, 1, len_k]
    multiplier = _pad_axis(attention.dropout_multiplier(
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
    tau4 = tau[:, :, None, None]  # [c or 1, h or 1, 1, 1]
    # [c, h, 1, len_k] -> [nk, c, h, 1, bk]
    k_dropout = (None if mult is None
                 else jnp.moveaxis(mult.reshape(c, heads, 1, nk, bk), 3, 0))

    def one_query_block(args):
      qb, qb_ids, q_start = args  # [c, h, bq, d], [c, bq], []

      def step(carry, xs):
        kb, vb, kb_ids, kb_valid, k_start, kb_dropout = xs
        # [c, h, bq, bk], [c, 1, bq, bk]
        logits, allowed = block_logits(qb, kb, qk_dtype, lut, qb_ids, kb_ids, q_start, k_start,
                                       bidirectional)
        s = logits / tau4
        return online_softmax_step(carry, s, allowed, vb, kb_valid, dtype, kb_dropout,
                                   with_stats), None

      init = init_carry((c, heads, bq), depth)
      carry, _ = jax.lax.scan(
          step, init, (k_blocks, v_blocks, k_ids, k_valid, k_starts, k_dropout))
      return finalize(carry, length)

    # [nq, c, h, bq, d], [nq, c, h, bq], [nq, c, h, bq]
    out, pmax, entropy = jax.lax.map(one_query_block, (q_blocks, q_ids, q_starts))
    # [nq, c, h, bq, d] -> [c, len_q, h, d]; [nq, c, h, bq] -> [c, h, len_q]
    to_rows = lambda x: jnp.transpose(x, (1, 2, 0, 3)).reshape(c, heads, len_q)
    return (jnp.transpose(out, (1, 0, 3, 2, 4)).reshape(c, len_q, heads, depth),
            to_rows(pmax), to_rows(entropy))

  chunk = min(batch_block or default_batch_block(batch, heads, bq, bk, backend), batch)
  if chunk >= batch:
    out, pmax, entropy = attend(query, key, value, segment_ids, tau, multiplier)
  else:
    # Chunks of `chunk` examples, one after another; the batch padded with masked examples.
    padded = _round_up(batch, chunk)
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
  return out, attention.RowStats(pmax=pmax[..., :length], entropy=entropy[..., :length])
