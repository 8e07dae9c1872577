"""Pallas TPU (Mosaic) self-attention kernel ('pallas' on TPU) with the T5 bias built in-kernel.

The math of 'reference' (reference.py): `softmax((q.k + relpos_bias + mask_bias) / tau)` in
float32, q.k in the inputs' dtype with float32 accumulation, fully masked (padding) query rows
uniform over all keys, and per-row P_max and entropy from the same pass, tiled as 'blockwise'
(`blockwise.online_softmax_step`) so that no `[L, L]` array reaches HBM. docs/architecture.md
describes its grid, the bias, the skipped tiles and what is verified.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp
import numpy as np

from t5align.attention import blockwise
from t5align.attention import reference

Array = jax.Array

LANES = 128  # TPU vector lanes: block sizes are multiples of it, pieces of the bias 128 x 128.
_NO_ID = np.iinfo(np.int32).max  # Smallest id of a block without a real token.
# Elementwise FLOPs per (query, key) pair of an unmasked tile (`_kernel`'s `attend`, then
# `blockwise.online_softmax_step`): add the bias, scale by 1 / tau, row max, subtract the max,
# row sum of p, p to the value dtype; with statistics also p * (s - m) and its row sum.
_ELEMENTWISE_PER_PAIR = 6
_STATS_PER_PAIR = 2


@dataclasses.dataclass(frozen=True)
class Options:
  """'pallas_tpu' tiles and VMEM limit (keywords of `pallas_tpu_attention`; set in
  T5Config.attention_options); None: `default_blocks()` and
  Mosaic's default scoped VMEM limit (a third of it, at least `BAND_VMEM_BYTES`, may hold one
  head's bias band)."""

  block_q: int | None = None
  block_k: int | None = None
  vmem_limit_bytes: int | None = None


# VMEM the band tiles of one head may take (float32, `_band`'s count x block_q x block_k): a
# third of the smallest default scoped limit (16 MiB), leaving the rest to q, k, v and the
# accumulators. T5's own band at 512 x 512 takes 3 MiB.
BAND_VMEM_BYTES = 16 * 2 ** 20 // 3


def band_bytes(block_q: int, block_k: int, far: int) -> int:
  """VMEM of one head's band tiles (`_band`) for blocks `block_q` x `block_k`."""
  return _band(block_q, block_k, far)[2] * block_q * block_k * 4


def default_blocks(device_kind: str | None = None,
                   far: int = reference.MAX_DISTANCE) -> tuple[int, int]:
  """`(block_q, block_k)`: 512 x 512 on every TPU generation (`device_kind` for future tuning);
  for a band widened by a bias rule (`reference.OffsetMap.far`), the largest square blocks of
  512, 256 or 128 whose band tiles fit `BAND_VMEM_BYTES` (at 16k tokens with L_tr = 512, s =
  1/32: 128 x 128, 4.1 MiB; 512 x 512 would take 17 MiB, more than the scoped limit).

  Chosen from what Mosaic reports, not from timings (no TPU ran the kernel). Scoped VMEM of the
  kernel at 8,192 tokens, head_dim 64, bfloat16, statistics on (`python -m
  benchmarks.tpu_kernel_bench --topology T --lengths 8192 --impls pallas_tpu --blocks BQ BK`):
  512 x 512 takes 6.3-7.4 MB on v4, v5e, v5p and v6e, within every default limit (16 MiB; v6e
  32 MiB); 512 x 1024 takes 13.6-16.2 MB on v5e, v5p and v6e and exceeds v4's; 1024 x 1024
  takes 25.8 MB on v6e and exceeds the others'. A larger tile schedules no faster per (query,
  key) pair: libtpu's static schedule of an unmasked v5e tile (`--llo --blocks BQ BK`) is 6.0
  bundles per 1,000 pairs at 512 x 512 and 6.1 at 512 x 1024; larger query blocks would only
  re-read k and v less often. T5Config.attention_options sets others.
  """
  del device_kind
  for block in (512, 256, 128):
    if band_bytes(block, block, far) <= BAND_VMEM_BYTES:
      return block, block
  return LANES, LANES


def _band(block_q: int, block_k: int, far: int) -> tuple[int, int, int]:
  """`(first, step, count)`: the values of `k_start - q_start` of tiles touching the band.

  A tile's offsets `key - query` span `[delta - block_q + 1, delta + block_k - 1]`; it touches
  the band `|offset| < far` (`reference.OffsetMap.far`) iff `-(block_k + far - 1) < delta <
  block_q + far - 1`, and deltas are multiples of `gcd(block_q, block_k)`.
  """
  step = math.gcd(block_q, block_k)
  first = -((block_k + far - 2) // step) * step
  last = ((block_q + far - 2) // step) * step
  return first, step, (last - first) // step + 1


def _bias_piece(table_ref, head, base: int, thresholds, rows: int, cols: int) -> Array:
  """Relative bias of a `[rows, cols]` piece whose element (i, j) has offset `base + j - i`.

  Args:
    table_ref: SMEM `[heads * num_buckets]` float32 bucket table.
    head: the head (traced scalar).
    base: static offset of the piece's first element.
    thresholds: `((offset, bucket), ...)`: the bucket of every offset from the first entry's
      offset on, changing at each listed offset (ascending); see `reference.bucket_steps`.
    rows, cols: static piece shape.
  """
  lo, hi = base - rows + 1, base + cols - 1
  nb = reference.NUM_BUCKETS
  start = [b for o, b in thresholds if o <= lo][-1]
  piece = jnp.full((rows, cols), table_ref[head * nb + start], jnp.float32)
  changes = [(o, b) for o, b in thresholds if lo < o <= hi]
  if changes:
    offsets = (base + jax.lax.broadcasted_iota(jnp.int32, (rows, cols), 1)
               - jax.lax.broadcasted_iota(jnp.int32, (rows, cols), 0))
    for o, b in changes:
      piece = jnp.where(offsets >= o, table_ref[head * nb + b], piece)
  return piece


def _kernel(table_ref, inv_tau_ref, q_lo_ref, q_hi_ref, q_one_ref, k_lo_ref, k_hi_ref,
            k_one_ref, k_first_ref, k_last_ref,  # scalar prefetch (SMEM)
            q_ref, k_ref, v_ref, q_ids_ref, k_ids_ref, v_sum_ref,  # inputs (VMEM blocks)
            o_ref, *refs,  # outputs (`stats_ref` if with_stats), then scratch
            heads: int, length: int, block_q: int, block_k: int, bidirectional: bool,
            offset_map: reference.OffsetMap, qk_dtype, p_dtype, with_stats: bool):
  """One (example * head, query block, key block) tile; refs as laid out by
  `pallas_tpu_attention`."""
  stats_ref = refs[0] if with_stats else None
  band_ref, q_col_ref, m_ref, l_ref, c_ref, acc_ref = refs[-6:]
  bh, qi, ki = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  b, h = jax.lax.div(bh, heads), jax.lax.rem(bh, heads)
  nq, nk = pl.num_programs(1), pl.num_programs(2)
  far = offset_map.far
  first, step, count = _band(block_q, block_k, far)
  nb = reference.NUM_BUCKETS
  thresholds = reference.bucket_steps(bidirectional, nb, offset_map)
  far_left = table_ref[h * nb + thresholds[0][1]]
  far_right = table_ref[h * nb + thresholds[-1][1]]

  @pl.when((qi == 0) & (ki == 0))
  def build_band():
    # The band tiles of this head, 128 x 128 pieces at a time (static offsets).
    for j in range(count):
      delta = first + j * step
      for r in range(0, block_q, LANES):
        for c in range(0, block_k, LANES):
          band_ref[j, r:r + LANES, c:c + LANES] = _bias_piece(
              table_ref, h, delta + c - r, thresholds, LANES, LANES)

  @pl.when(ki == 0)
  def init():
    m, l, c, acc, _ = blockwise.init_carry((block_q,), acc_ref.shape[-1], lanes=LANES)
    m_ref[...], l_ref[...], c_ref[...], acc_ref[...] = m, l, c, acc
    # The query block's ids as columns repeated over the lanes (a [1, bq] row transposed), -1
    # on padding so that no key id equals them.
    q_ids = jnp.broadcast_to(q_ids_ref[...], (LANES, block_q)).T  # [bq, 128]
    q_col_ref[...] = jnp.where(q_ids > 0, q_ids, -1)

  q_start, k_start = qi * block_q, ki * block_k
  qb, kb = b * nq + qi, b * nk + ki  # Rows of the per-block tables.
  # Any (query, key) pair with equal ids: the id ranges of the two blocks meet.
  live = jnp.maximum(q_lo_ref[qb], k_lo_ref[kb]) <= jnp.minimum(q_hi_ref[qb], k_hi_ref[kb])
  # Every pair allowed: one segment on both sides, no padding, no causal cut.
  whole = (q_one_ref[qb] > 0) & (q_one_ref[qb] == k_one_ref[kb])
  if not bidirectional:
    live = live & (k_start <= q_start + block_q - 1)
    whole = whole & (k_start + block_k - 1 <= q_start)
  delta = k_start - q_start
  in_band = (delta > -(block_k + far - 1)) & (delta < block_q + far - 1)

  def attend(bias, masked: bool):
    """Online-softmax update of the accumulators with this tile (`bias()` its relpos bias)."""
    # [bq, d] x [bk, d] -> [bq, bk], float32 accumulation.
    q, k = q_ref[...], k_ref[...]  # [bq, d], [bk, d]
    qk = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32,
                             precision=reference.dot_precision(q, k))
    # NOTE: rounded to the dtype 'reference' computes q.k in (a no-op for float32 inputs).
    qk = qk.astype(qk_dtype).astype(jnp.float32)
    s = (qk + bias()) * inv_tau_ref[bh]  # [bq, bk]
    allowed = None
    if masked:
      # [bq, 128] tiled == [1, bk] -> [bq, bk]
      allowed = jnp.tile(q_col_ref[...], (1, block_k // LANES)) == k_ids_ref[...]
      if not bidirectional:
        rows = q_start + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
        cols = k_start + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
        allowed = allowed & (cols <= rows)
    # Row statistics stay [bq, 128], each row repeated over the lanes (see `blockwise.init_carry`).
    carry = (m_ref[...], l_ref[...], c_ref[...], acc_ref[...],
             jnp.zeros((acc_ref.shape[-1],), jnp.float32))  # v_sum: unused here.
    m, l, c, acc, _ = blockwise.online_softmax_step(
        carry, s, allowed, v_ref[...], None, p_dtype, stats=with_stats)
    m_ref[...], l_ref[...], acc_ref[...] = m, l, acc
    if with_stats:
      c_ref[...] = c

  band_bias = lambda: band_ref[jax.lax.div(jnp.maximum(delta - first, 0), step)]
  far_bias = lambda: jnp.where(delta < 0, far_left, far_right)
  for bias, bias_cond in ((band_bias, in_band), (far_bias, ~in_band)):
    for masked, mask_cond in ((False, whole), (True, ~whole)):
      pl.when(live & bias_cond & mask_cond)(functools.partial(attend, bias, masked))

  @pl.when(ki == nk - 1)
  def finish():
    carry = (m_ref[...], l_ref[...], c_ref[...], acc_ref[...], v_sum_ref[0])
    out, pmax, entropy = blockwise.finalize(carry, length)  # [bq, d], [bq, 128], [bq, 128]
    o_ref[...] = out.astype(o_ref.dtype)
    if with_stats:
      # [bq, 128] repeated rows -> a lane-dense [2, bq] block, by one transpose.
      rows = jnp.concatenate([pmax, entropy], axis=1).T  # [2 * 128, bq]
      stats_ref[...] = jnp.concatenate([rows[0:1], rows[LANES:LANES + 1]], axis=0)


def _block_ranges(ids: Array, size: int) -> tuple[Array, Array, Array]:
  """Per block of `size` positions: smallest and largest real id, and the id if the block is
  one segment without padding (else -1). `[b, n * size]` -> three int32 `[b * n]`."""
  blocks = ids.reshape(ids.shape[0], -1, size)  # [b, n, size]
  lo = jnp.min(jnp.where(blocks > 0, blocks, _NO_ID), axis=-1)  # [b, n]
  hi = jnp.max(blocks, axis=-1)
  one = jnp.where((lo == hi) & jnp.all(blocks > 0, axis=-1), lo, -1)
  return lo.reshape(-1), hi.reshape(-1), one.reshape(-1)


def _cost(batch: int, heads: int, padded: int, depth: int, block_q: int, block_k: int, *,
          bidirectional: bool, with_stats: bool, qk_bytes: int, v_bytes: int,
          out_bytes: int) -> pl.CostEstimate:
  """The whole kernel call's work when no tile is skipped for its ids (an upper bound otherwise).

  Mosaic reports no cost for a kernel (XLA's analysis then counts it as unknown), so this is
  given to `pallas_call`. Per (example, head) and (query, key) pair of the visited tiles: FLOPs
  2 d for q.k and as many for p.v, plus the softmax's elementwise work as XLA's analysis would
  count it for an unmasked tile (`_ELEMENTWISE_PER_PAIR`); one exp. HBM bytes: each query block's
  q and ids and its output (and statistics) once, the k, v and ids of every key block it visits,
  v's sum; per call the SMEM tables (bias buckets, 1 / tau, the per-block id ranges). Causal
  attention visits the tiles on or below the diagonal. Not counted: a masked tile's compares and
  selects, and the band tiles' bias, built once per (example, head) in VMEM (about `3 * block_q
  * block_k` selects per threshold crossed). `*_bytes`: itemsizes of q and k, v, and the output.
  """
  nq, nk = padded // block_q, padded // block_k
  tiles = nq * nk
  if not bidirectional:
    tiles = sum(min(nk, (qi * block_q + block_q - 1) // block_k + 1) for qi in range(nq))
  pairs = tiles * block_q * block_k
  per_pair = 4 * depth + _ELEMENTWISE_PER_PAIR + (_STATS_PER_PAIR if with_stats else 0)
  rows = padded * (depth * (qk_bytes + out_bytes) + 4 + (2 * 4 if with_stats else 0))
  keys = tiles * block_k * (depth * (qk_bytes + v_bytes) + 4)
  # bias buckets [h * 32] and 1 / tau [b * h] float32; q_lo, q_hi, q_one, k_first, k_last
  # [b * nq] and k_lo, k_hi, k_one [b * nk] int32.
  tables = 4 * (heads * reference.NUM_BUCKETS + batch * heads + batch * (5 * nq + 3 * nk))
  return pl.CostEstimate(flops=batch * heads * per_pair * pairs,
                         transcendentals=batch * heads * pairs,
                         bytes_accessed=batch * heads * (rows + keys + depth * 4) + tables)


@functools.partial(jax.jit, static_argnames=(
    'bidirectional', 'dtype', 'float32_logits', 'with_stats', 'block_q', 'block_k', 'interpret',
    'vmem_limit_bytes', 'offset_map'))
def pallas_tpu_attention(
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
    interpret: bool = False,
    vmem_limit_bytes: int | None = None,
    offset_map: reference.OffsetMap = reference.OffsetMap(),
) -> tuple[Array, reference.RowStats | None]:
  """Self-attention with in-kernel T5 bias.

  Args:
    query, key, value, rel_embedding, segment_ids, temperature, bidirectional, dtype,
      float32_logits, with_stats: as `blockwise.blockwise_attention`.
    block_q: queries per tile, a multiple of 128; None: `default_blocks()`. Lengths are padded
      internally to a multiple of both blocks; a block longer than the padded input is cut.
    block_k: keys per tile, a multiple of 128; None: the default.
    interpret: run as plain JAX (Pallas interpret mode, on CPU).
    vmem_limit_bytes: Mosaic's scoped VMEM limit; None: the compiler's default.
    offset_map: how offsets are read in the bias table (`reference.OffsetMap`); its band
      `|offset| < far` sets how many band tiles the head's VMEM holds.

  Returns:
    `[b, l, h, d]` output and optional RowStats `[b, h, l]`.
  """
  batch, length, heads, depth = query.shape
  default_q, default_k = default_blocks(far=offset_map.far)
  block_q, block_k = block_q or default_q, block_k or default_k
  for name, size in (('block_q', block_q), ('block_k', block_k)):
    if size % LANES:
      raise ValueError(f'{name}={size}: the TPU kernel takes multiples of {LANES}.')
  # NOTE: no block longer than the input rounded up to 128 (short inputs, tests).
  fit = blockwise.round_up(length, LANES)
  block_q, block_k = min(block_q, fit), min(block_k, fit)
  band = band_bytes(block_q, block_k, offset_map.far)
  allowed = max(BAND_VMEM_BYTES, (vmem_limit_bytes or 0) // 3)
  if band > allowed:
    raise ValueError(
        f'pallas_tpu blocks {block_q} x {block_k}: the bias band of {offset_map} (|offset| < '
        f'{offset_map.far}) takes {band / 2 ** 20:.1f} MiB of VMEM per head, over the '
        f'{allowed / 2 ** 20:.1f} MiB it may (a third of the scoped limit); give smaller blocks '
        '(pallas_tpu.Options(block_q=, block_k=); None picks ones that fit) or a larger '
        'vmem_limit_bytes.')
  multiple = math.lcm(block_q, block_k)
  padded = blockwise.round_up(length, multiple)
  nq, nk = padded // block_q, padded // block_k
  # [1 or b, 1 or h] -> [b * h]
  inv_tau = 1.0 / jnp.broadcast_to(reference.head_temperature(temperature, batch, heads),
                                   (batch, heads)).reshape(-1)
  if float32_logits:
    query, key = query.astype(jnp.float32), key.astype(jnp.float32)
  qk_dtype = jnp.result_type(query.dtype, key.dtype)
  out_dtype = jnp.result_type(dtype, value.dtype)

  # [b, l, h, d] -> [b, h, padded, d]
  to_heads = lambda x: jnp.pad(jnp.transpose(x, (0, 2, 1, 3)),
                               [(0, 0), (0, 0), (0, padded - length), (0, 0)])
  ids = jnp.pad(segment_ids.astype(jnp.int32), [(0, 0), (0, padded - length)])  # [b, padded]
  q_ranges, k_ranges = _block_ranges(ids, block_q), _block_ranges(ids, block_k)
  # [b, nq, nk]: tiles with a possibly allowed pair; per query block the first and last of them
  # (the key blocks fetched: the index map clamps to this range).
  q_lo, q_hi = (x.reshape(batch, nq, 1) for x in q_ranges[:2])
  k_lo, k_hi = (x.reshape(batch, 1, nk) for x in k_ranges[:2])
  live = jnp.maximum(q_lo, k_lo) <= jnp.minimum(q_hi, k_hi)
  if not bidirectional:
    q_end = jnp.arange(nq)[:, None] * block_q + block_q - 1
    live = live & (jnp.arange(nk)[None, :] * block_k <= q_end)
  some = jnp.any(live, axis=-1)  # [b, nq]; a padding-only query block visits no tile.
  k_first = jnp.where(some, jnp.argmax(live, axis=-1), 0).astype(jnp.int32).reshape(-1)
  k_last = jnp.where(some, nk - 1 - jnp.argmax(live[..., ::-1], axis=-1), 0)
  k_last = k_last.astype(jnp.int32).reshape(-1)  # [b * nq]
  # Sum of v over the real keys (fully masked rows average it): [b, h, 1, d].
  v_sum = jnp.sum(value.astype(jnp.float32), axis=1)[:, :, None, :]
  table = rel_embedding.astype(jnp.float32).reshape(-1)  # [h * num_buckets]
  if rel_embedding.shape[-1] != reference.NUM_BUCKETS:
    raise ValueError(f'rel_embedding has {rel_embedding.shape[-1]} buckets; the TPU kernel '
                     f'takes {reference.NUM_BUCKETS}.')

  def q_map(bh, i, j, *prefetch):
    del j, prefetch
    return jax.lax.div(bh, heads), jax.lax.rem(bh, heads), i, 0

  def kv_map(bh, i, j, *prefetch):
    k_first_ref, k_last_ref = prefetch[-2:]
    b = jax.lax.div(bh, heads)
    j = jnp.clip(j, k_first_ref[b * nq + i], k_last_ref[b * nq + i])
    return b, jax.lax.rem(bh, heads), j, 0

  def q_ids_map(bh, i, j, *prefetch):
    del j, prefetch
    return jax.lax.div(bh, heads), 0, i

  def k_ids_map(bh, i, j, *prefetch):
    b, _, j, _ = kv_map(bh, i, j, *prefetch)
    return b, 0, j

  def v_sum_map(bh, i, j, *prefetch):
    del i, j, prefetch
    return jax.lax.div(bh, heads), jax.lax.rem(bh, heads), 0, 0

  def stats_map(bh, i, j, *prefetch):
    del j, prefetch
    return jax.lax.div(bh, heads), jax.lax.rem(bh, heads), 0, i

  kernel = functools.partial(
      _kernel, heads=heads, length=length, block_q=block_q, block_k=block_k,
      bidirectional=bidirectional, offset_map=offset_map, qk_dtype=qk_dtype, p_dtype=dtype,
      with_stats=with_stats)
  _, _, count = _band(block_q, block_k, offset_map.far)
  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=10,
      grid=(batch * heads, nq, nk),
      in_specs=[
          pl.BlockSpec((None, None, block_q, depth), q_map),
          pl.BlockSpec((None, None, block_k, depth), kv_map),
          pl.BlockSpec((None, None, block_k, depth), kv_map),
          pl.BlockSpec((None, 1, block_q), q_ids_map),
          pl.BlockSpec((None, 1, block_k), k_ids_map),
          pl.BlockSpec((None, None, 1, depth), v_sum_map),
      ],
      out_specs=[pl.BlockSpec((None, None, block_q, depth), q_map)] + (
          [pl.BlockSpec((None, None, 2, block_q), stats_map)] if with_stats else []),
      scratch_shapes=[
          pltpu.VMEM((count, block_q, block_k), jnp.float32),  # band tiles of the head
          pltpu.VMEM((block_q, LANES), jnp.int32),  # the query block's ids as columns
          pltpu.VMEM((block_q, LANES), jnp.float32),  # m (rows repeated over the lanes)
          pltpu.VMEM((block_q, LANES), jnp.float32),  # l
          pltpu.VMEM((block_q, LANES), jnp.float32),  # c
          pltpu.VMEM((block_q, depth), jnp.float32),  # acc
      ])
  out, *stats = pl.pallas_call(
      kernel,
      grid_spec=grid_spec,
      out_shape=[jax.ShapeDtypeStruct((batch, heads, padded, depth), out_dtype)] + (
          [jax.ShapeDtypeStruct((batch, heads, 2, padded), jnp.float32)] if with_stats else []),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=('parallel', 'arbitrary', 'arbitrary'),
          vmem_limit_bytes=vmem_limit_bytes),
      cost_estimate=_cost(
          batch, heads, padded, depth, block_q, block_k, bidirectional=bidirectional,
          with_stats=with_stats, qk_bytes=jnp.dtype(qk_dtype).itemsize,
          v_bytes=value.dtype.itemsize, out_bytes=jnp.dtype(out_dtype).itemsize),
      interpret=interpret,
      name='t5_relpos_attention_tpu',
  )(table, inv_tau, *q_ranges, *k_ranges, k_first, k_last,
    to_heads(query), to_heads(key), to_heads(value),
    ids[:, None, :], ids[:, None, :], v_sum)
  out = jnp.transpose(out[:, :, :length], (0, 2, 1, 3))  # [b, h, padded, d] -> [b, l, h, d]
  if not with_stats:
    return out, None
  stats = stats[0]  # [b, h, 2, padded]
  return out, reference.RowStats(pmax=stats[:, :, 0, :length], entropy=stats[:, :, 1, :length])
