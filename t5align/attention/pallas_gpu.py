"""Pallas GPU ('pallas' on GPU, 'pallas_gpu') self-attention kernel with the T5 bias in-kernel.

Grid `(batch * heads, query blocks)`; each program keeps one `[block_q, d]` query tile and loops
over key tiles with the online softmax of blockwise.py, returning the output and per-row P_max and
entropy. The bias never leaves the kernel: beyond the band's half-width `far`
(`reference.OffsetMap.far`, T5's MAX_DISTANCE unless a bias rule widens it) every offset shares
the last bucket of its side, so key tiles entirely left or right of the band `|key - query| < far`
use one constant per head and side; tiles touching the band select the bias of each offset from
the bucket's step function (`reference.bucket_steps`). Three loops (far left, band, far right)
with bounds from the program id replace per-tile branching.

Backend: Triton, chosen explicitly with `pltriton.CompilerParams` (jax's default Pallas GPU
backend is Mosaic GPU, which this kernel's whole-sequence K/V blocks would overflow in shared
memory). On CPU the kernel runs in interpret mode (the dispatch, layers.py, asks for it);
tests also lower it for CUDA without a GPU
(`attention_test.test_pallas_kernel_lowers_to_triton_for_cuda`), which checks every operation
against Triton's lowering rules. Compiling and timing it need a GPU
(`benchmarks/attention_bench.py --preset gpu` checks it against 'reference' first).
- block_q, block_k and head_dim must be powers of 2 and >= 16 (tl.dot tiles); head_dim = 64 for
  Flan-T5. Lengths are padded internally to a multiple of the blocks.
- The table lookup is a chain of selects, one per step of the bucket function (31 for T5's 32
  bidirectional buckets; Triton has no gather), paid only on band tiles.
- The table row and tau travel as one `[64]` float32 vector per (batch, head) program.
- Defaults (`default_blocks`, where T5Config.attention_options sets none): block_q = block_k = 64,
  num_warps = 4, num_stages = 2; the benchmarks' `--pallas-configs` measure others.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton
import jax.numpy as jnp

from t5align.attention import blockwise
from t5align.attention import reference

Array = jax.Array

_PARAMS = 64  # Per-program float32 vector: table row [0, 32), tau at 32, zeros after.


@dataclasses.dataclass(frozen=True)
class Options:
  """'pallas_gpu' tiles and Triton launch parameters (keywords of `pallas_attention`; set in
  T5Config.attention_options); None: `default_blocks()`."""

  block_q: int | None = None
  block_k: int | None = None
  num_warps: int = 4
  num_stages: int = 2


def default_blocks(backend: str | None = None) -> tuple[int, int]:
  """`(block_q, block_k)` of the kernel: 64 x 64 on every backend."""
  del backend
  return 64, 64


def _scalar(vector: Array, index: int) -> Array:
  """`vector[index]` for a static index as a masked sum (lowers without gathers)."""
  return jnp.sum(jnp.where(jnp.arange(vector.shape[0]) == index, vector, 0.0))


def _kernel(q_ref, k_ref, v_ref, ids_ref, params_ref, o_ref, pmax_ref, entropy_ref, *,
            length: int, block_q: int, block_k: int, bidirectional: bool,
            offset_map: reference.OffsetMap, qk_dtype, p_dtype):
  """One (batch * head, query block) program; refs are its blocks (see `pallas_attention`)."""
  qi = pl.program_id(1)
  padded = k_ref.shape[0]
  num_k_blocks = padded // block_k
  num_buckets = reference.NUM_BUCKETS
  q_start = qi * block_q
  q = q_ref[...]  # [bq, d]
  q_ids = ids_ref[pl.ds(q_start, block_q)]  # [bq]
  params = params_ref[...]  # [_PARAMS]
  table = [_scalar(params, n) for n in range(num_buckets)]
  tau = _scalar(params, num_buckets)
  q_pos = q_start + jnp.arange(block_q, dtype=jnp.int32)  # [bq]

  # NOTE: |key - query| >= far lands in the last bucket of its side.
  far = offset_map.far
  steps = reference.bucket_steps(bidirectional, num_buckets, offset_map)
  left_bias, right_bias = table[steps[0][1]], table[steps[-1][1]]

  def band_bias(offsets):
    """`[bq, bk]` relpos bias from offsets: the bucket's step function as selects (no gather)."""
    bias = jnp.full(offsets.shape, left_bias)
    for offset, bucket in steps[1:]:
      bias = jnp.where(offsets >= offset, table[bucket], bias)
    return bias

  def make_body(relpos):
    def body(j, carry):
      k_start = j * block_k
      k = k_ref[pl.ds(k_start, block_k), :]  # [bk, d]
      v = v_ref[pl.ds(k_start, block_k), :]  # [bk, d]
      k_ids = ids_ref[pl.ds(k_start, block_k)]  # [bk]
      k_pos = k_start + jnp.arange(block_k, dtype=jnp.int32)  # [bk]
      # [bq, d] x [bk, d] -> [bq, bk]
      qk = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                               preferred_element_type=jnp.float32,
                               precision=reference.dot_precision(q, k))
      qk = qk.astype(qk_dtype).astype(jnp.float32)
      offsets = k_pos[None, :] - q_pos[:, None]  # [bq, bk]
      allowed = (q_ids[:, None] == k_ids[None, :]) & (q_ids[:, None] > 0) & (k_ids[None, :] > 0)
      if not bidirectional:
        allowed = allowed & (offsets <= 0)
      s = (qk + relpos(offsets)) / tau  # [bq, bk]
      k_valid = k_pos < length  # [bk]; keys added by internal padding are excluded.
      return blockwise.online_softmax_step(carry, s, allowed, v, k_valid, p_dtype)
    return body

  # Key blocks [0, lo) lie entirely at offsets <= -far, [hi, nk) entirely at offsets >= far.
  # NOTE: lax.div (non-negative operands) rather than `//`, which Triton lowering may reject.
  lo = jnp.minimum(jax.lax.div(jnp.maximum(q_start - far + 1, 0), block_k), num_k_blocks)
  hi = jnp.clip(jax.lax.div(q_start + block_q - 2 + far + block_k, block_k), lo, num_k_blocks)
  carry = blockwise.init_carry((block_q,), q.shape[-1])
  carry = jax.lax.fori_loop(0, lo, make_body(lambda o: jnp.full(o.shape, left_bias)), carry)
  carry = jax.lax.fori_loop(lo, hi, make_body(band_bias), carry)
  carry = jax.lax.fori_loop(hi, num_k_blocks, make_body(lambda o: jnp.full(o.shape, right_bias)),
                            carry)
  out, pmax, entropy = blockwise.finalize(carry, length)
  o_ref[...] = out.astype(o_ref.dtype)
  pmax_ref[...] = pmax
  entropy_ref[...] = entropy


@functools.partial(jax.jit, static_argnames=(
    'bidirectional', 'dtype', 'float32_logits', 'with_stats', 'block_q', 'block_k', 'num_warps',
    'num_stages', 'interpret', 'offset_map'))
def pallas_attention(
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
    num_warps: int = 4,
    num_stages: int = 2,
    interpret: bool = False,
    offset_map: reference.OffsetMap = reference.OffsetMap(),
) -> tuple[Array, reference.RowStats | None]:
  """Self-attention with in-kernel T5 bias (arguments as `blockwise.blockwise_attention`).

  `block_q` / `block_k` None: `default_blocks()`; `num_warps` / `num_stages`: Triton's launch
  parameters; `interpret`: run as plain JAX (Pallas interpret mode, on CPU).

  Returns:
    `[b, l, h, d]` output and optional RowStats `[b, h, l]`.
  """
  batch, length, heads, depth = query.shape
  block_q, block_k = block_q or default_blocks()[0], block_k or default_blocks()[1]
  for name, size in (('block_q', block_q), ('block_k', block_k)):
    if size & (size - 1):
      raise ValueError(f'{name}={size} must be a power of 2.')
  # [1 or b, 1 or h] -> [b, h]
  tau = jnp.broadcast_to(reference.head_temperature(temperature, batch, heads), (batch, heads))
  if float32_logits:
    query, key = query.astype(jnp.float32), key.astype(jnp.float32)
  qk_dtype = jnp.result_type(query.dtype, key.dtype)
  out_dtype = jnp.result_type(dtype, value.dtype)
  padded = blockwise.round_up(length, max(block_q, block_k))
  pad = lambda x: jnp.pad(x, [(0, 0), (0, padded - length)] + [(0, 0)] * (x.ndim - 2))
  query, key, value = pad(query), pad(key), pad(value)  # [b, padded, h, d]
  ids = pad(segment_ids.astype(jnp.int32))  # [b, padded]
  # [h, 32], [b, h] -> [b * h, _PARAMS]
  table = jnp.broadcast_to(rel_embedding.astype(jnp.float32),
                           (batch, heads, reference.NUM_BUCKETS))
  tau_col = tau[:, :, None]  # [b, h, 1]
  params = jnp.concatenate([table, tau_col], axis=-1)
  params = jnp.pad(params, [(0, 0), (0, 0), (0, _PARAMS - params.shape[-1])])
  params = params.reshape(batch * heads, _PARAMS)

  b_of = lambda i: jax.lax.div(i, heads)
  h_of = lambda i: jax.lax.rem(i, heads)
  kernel = functools.partial(
      _kernel, length=length, block_q=block_q, block_k=block_k, bidirectional=bidirectional,
      offset_map=offset_map, qk_dtype=qk_dtype, p_dtype=dtype)
  full = lambda: pl.BlockSpec((None, padded, None, depth), lambda i, j: (b_of(i), 0, h_of(i), 0))
  out, pmax, entropy = pl.pallas_call(
      kernel,
      grid=(batch * heads, padded // block_q),
      in_specs=[
          pl.BlockSpec((None, block_q, None, depth), lambda i, j: (b_of(i), j, h_of(i), 0)),
          full(), full(),
          pl.BlockSpec((None, padded), lambda i, j: (b_of(i), 0)),
          pl.BlockSpec((None, _PARAMS), lambda i, j: (i, 0)),
      ],
      out_specs=[
          pl.BlockSpec((None, block_q, None, depth), lambda i, j: (b_of(i), j, h_of(i), 0)),
          pl.BlockSpec((None, None, block_q), lambda i, j: (b_of(i), h_of(i), j)),
          pl.BlockSpec((None, None, block_q), lambda i, j: (b_of(i), h_of(i), j)),
      ],
      out_shape=[
          jax.ShapeDtypeStruct((batch, padded, heads, depth), out_dtype),
          jax.ShapeDtypeStruct((batch, heads, padded), jnp.float32),
          jax.ShapeDtypeStruct((batch, heads, padded), jnp.float32),
      ],
      interpret=interpret,
      # Triton, not Mosaic GPU (jax 0.10's default Pallas GPU backend).
      compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      name='t5_relpos_attention',
  )(query, key, value, ids, params)
  out = out[:, :length]  # [b, padded, h, d] -> [b, l, h, d]
  if not with_stats:
    return out, None
  return out, reference.RowStats(pmax=pmax[..., :length], entropy=entropy[..., :length])
