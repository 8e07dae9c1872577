"""Pallas Mosaic GPU ('pallas_mgpu') self-attention for Hopper (sm_90), T5 bias and temperature.

The structure of jax's FlashAttention-3 kernel for Hopper
(`jax.experimental.pallas.ops.gpu.attention_mgpu`), with the T5 parts of this project's contract
(attention/reference.py): `softmax((q.k + relpos_bias + mask) / tau)` in float32, row statistics
P_max and entropy from the same pass, fully masked (padding) rows uniform over the real keys.

Launch: grid `(heads, query tiles, batch)`, three warpgroups per block. Warpgroups 0 and 1 each
own `block_q` query rows (a query tile is `2 * block_q` rows) and run the online softmax with
wgmma (q.k and p.v, float32 accumulators in registers); warpgroup 2 streams the key and value
tiles (and the keys' segment ids) by TMA into a ring of `max_concurrent_steps` shared-memory slots,
each slot guarded by a 'loaded' barrier (TMA -> compute) and a 'consumed' barrier (both compute
warpgroups -> TMA). With `use_schedule_barrier` the two compute warpgroups take turns on the
tensor cores (one runs its softmax while the other's wgmma runs), as in FlashAttention-3.

T5 bias: a key tile wholly beyond the band's half-width `far` (`reference.OffsetMap.far`: T5's
MAX_DISTANCE unless a bias rule widens it) of every query of a warpgroup's rows ('far') takes one
bias per head and side, folded with the temperature into one per-row offset (no per-element
work). The key tiles touching the band `|key - query| < far` are the same few per query block:
a tile's bias depends only on `delta = k_start - q_start`, so the wrapper builds the `n_deltas`
distinct band tiles of every head (plain jnp, `band_bias_tiles`, `[h, n_deltas, block_q,
block_k]` float32; 6 tiles at 64 x 128 with T5's band) and the kernel copies the one a band tile
needs by TMA into a per-warpgroup buffer. Each compute warpgroup walks its key tiles in three
loops (far left, band, far right) whose bounds follow from its first query.

Temperature: `1 / tau` (scalar, per example or per example and head) and `log2(e)` fold into one
per-(example, head) scale, so the kernel takes `exp2` of `x * scale + offset`; far offsets are
`bias * scale`. Row maxima, `l` and the entropy accumulator `c` are kept in base-2 units (c is
converted once at the end): P_max = 1 / l, entropy = log l - ln(2) c / l.

Masks: the tiles' kinds are classified outside the kernel from per-block segment-id summaries
(`mask_kinds`, per example and per `block_q` query block): a tile with no (query, key) pair in
one segment is skipped (its K/V are still streamed, since the other warpgroup may need them), a
tile whose queries and keys all lie in one segment takes no mask, any other compares the query
ids (a row vector) with the key ids (a column vector, streamed with the keys) elementwise. Masked
logits become `-2e30` against a running max that starts at `-1e30`: `exp2` is then exactly 0 for
them (and `0 * -2e30 = 0` in the entropy sum), while a row that has seen no allowed key yet keeps
`l = 0` without NaNs. Rows of padding (segment id 0) are set afterwards, in the wrapper, to the
uniform attention of t5x (mean of the values over the real length, P_max = 1 / length,
entropy = log length); every other row sees at least itself.

Numerics: q.k is rounded to the input dtype before the bias is added, as 'reference' computes
its logits in that dtype (unless `float32_logits`); probabilities reach p.v in the input dtype
(bfloat16 or float16). With `approx_math` (the default on a GPU) exp2 and the division take the
hardware's approximate instructions.

Refused with a ValueError (use 'pallas_gpu' or 'blockwise'): float32 inputs or float32 `dtype`
(wgmma has no full-precision float32, and the project's contract is that float32 computes in
float32); the causal decoder (`bidirectional=False`); head dims that are not a multiple of 64.
Lengths are padded internally to a multiple of `2 * block_q` and `block_k` (padding keys are
masked by their segment id 0, and excluded from the padding rows' uniform average).

On CPU the kernel runs in Mosaic GPU's interpret mode (`interpret=True`), which simulates the
warpgroups, barriers and TMA copies; there p.v (and with jax < 0.12 q.k) is a plain dot of the
same shared-memory tiles, as the interpreter has no wgmma with a register operand (nor, before
0.12, with a transposed one). Interpret mode needs an XLA CPU client of several threads (`NPROC`
>= 8 where there are fewer cores; see tests/attention/pallas_mgpu_test.py) and takes about a
minute for 300 tokens. tests/attention/pallas_mgpu_test.py also lowers the real kernel for sm_90
without a GPU.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import re

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np

from t5align.attention import blockwise
from t5align.attention import reference

Array = jax.Array

# Kinds of (query block, key tile) by mask, the kernel's `lax.switch` index.
SKIP, MASKED, FULL = 0, 1, 2

_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)
_M_INIT = -1e30  # Running max before any allowed key (base-2 units).
_MASKED = -2e30  # A masked logit (base-2 units): exp2(_MASKED - m) == 0 for any m >= _M_INIT.
_COMPUTE_WGS = 2
# jax < 0.12: Mosaic GPU's interpret mode cannot read a transposed wgmma operand (q.k^T's key
# tile): interpreting, q.k is then a plain dot of the same shared-memory tiles.
_INTERPRET_NO_TRANSPOSED_WGMMA = jax.__version_info__ < (0, 12)


@dataclasses.dataclass(frozen=True)
class Options:
  """'pallas_mgpu' tiles and launch parameters (keywords of `pallas_mgpu_attention`).

  block_q: query rows of each of the two compute warpgroups (a multiple of 64; a block of the
    grid holds `2 * block_q` rows); None: `default_blocks()`.
  block_k: keys per tile streamed by TMA (a multiple of 64); None: `default_blocks()`.
  max_concurrent_steps: key/value tiles in flight (shared-memory ring slots, >= 2).
  use_schedule_barrier: the two compute warpgroups alternate on the tensor cores.
  """

  block_q: int | None = None
  block_k: int | None = None
  max_concurrent_steps: int = 2
  use_schedule_barrier: bool = True


# Device kinds of Hopper GPUs (sm_90: H100, H200, H800, H20, GH200), as jax names them.
_HOPPER = re.compile(r'\bG?H(100|200|800|20)\b')


def applies(device_kind: str, input_dtype, dtype, head_dim: int, bidirectional: bool) -> bool:
  """Whether this kernel runs a call: a Hopper GPU, bfloat16 / float16 inputs computed in their
  own dtype, a head dim that is a multiple of 64, the encoder (bidirectional). 'pallas' on a GPU
  is this kernel where it applies, else 'pallas_gpu' (`dispatch.resolve`)."""
  half = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
  return (bool(_HOPPER.search(device_kind)) and jnp.dtype(input_dtype) in half
          and jnp.dtype(dtype) == jnp.dtype(input_dtype) and head_dim > 0 and head_dim % 64 == 0
          and bidirectional)


def default_blocks(backend: str | None = None) -> tuple[int, int]:
  """`(block_q, block_k)`: 64 x 128, the tiles of jax's FlashAttention-3 kernel for head_dim 64
  (128 query rows per block of the grid). On an H200 at 16k x 32 heads the fastest measured with
  64 x 64 and 128 x 64 (docs/performance/gpu.md); 128 x 128 did not compile."""
  del backend
  return 64, 128


def _load(ref, layout, interpret: bool):
  """`plgpu.load(ref, layout=layout)` across jax versions (0.10 takes an index argument).

  Interpreting, a plain read: layouts mean nothing there, and jax 0.10's GPU interpret mode has
  no rule for `plgpu.load`.
  """
  if interpret:
    return ref[...]
  if 'idx' in inspect.signature(plgpu.load).parameters:
    return plgpu.load(ref, (), layout=layout)
  return plgpu.load(ref, layout=layout)


def _cast(x, layout, interpret: bool):
  """`plgpu.layout_cast(x, layout)`; interpreting, `x` (jax 0.10's GPU interpret mode has no
  rule for it, and layouts mean nothing there)."""
  return x if interpret else plgpu.layout_cast(x, layout)


def _transposed(ref):
  """`ref` viewed as its transpose (2-D), across jax versions."""
  if 'transpose_ref' in vars(plgpu):  # jax < 0.12 (later: deprecated, `ref.transpose`).
    return plgpu.transpose_ref(ref, (1, 0))
  return ref.transpose((1, 0))


def band_deltas(block_q: int, block_k: int, far: int = reference.MAX_DISTANCE) -> np.ndarray:
  """The `k_start - q_start` of every band tile (one touching `|key - query| < far`) of query
  blocks of `block_q` and key tiles of `block_k`, ascending (int32 numpy)."""
  g = math.gcd(block_q, block_k)
  # Band: -(far - 1 + block_k) < delta < far - 1 + block_q.
  lo = -((far - 1 + block_k) // g) * g
  if lo <= -(far - 1 + block_k):
    lo += g
  hi = ((far - 2 + block_q) // g) * g
  return np.arange(lo, hi + 1, g, dtype=np.int32)


def band_bias_tiles(rel_embedding: Array, block_q: int, block_k: int, bidirectional: bool,
                    offset_map: reference.OffsetMap = reference.OffsetMap()) -> Array:
  """`[h, n_deltas, block_q, block_k]` float32: the relative-position bias of each band tile
  (`band_deltas`), `bias[i, j] = bias_by_offset[clip(delta + j - i)]`."""
  lut = reference.bias_by_offset(rel_embedding.astype(jnp.float32), bidirectional, offset_map)
  far = offset_map.far
  deltas = band_deltas(block_q, block_k, far)
  offsets = (deltas[:, None, None] + np.arange(block_k)[None, None, :]
             - np.arange(block_q)[None, :, None])  # [n, bq, bk]
  return jnp.take(lut, np.clip(offsets, -far, far) + far, axis=1)  # [h, n, bq, bk]


def mask_kinds(ids: Array, block_q: int, block_k: int) -> Array:
  """Kind (SKIP, MASKED, FULL) of every (query block, key tile), per example.

  Args:
    ids: int32 `[b, padded]` segment ids (0 = padding), `padded` a multiple of both blocks.

  Returns:
    int32 `[b, padded // block_q, padded // block_k]`.
  """
  batch, padded = ids.shape

  def summary(block):
    x = ids.reshape(batch, padded // block, block)
    real = x > 0
    one = jnp.all(x == x[..., :1], axis=-1) & real[..., 0]  # one segment, no padding
    lo = jnp.min(jnp.where(real, x, jnp.iinfo(jnp.int32).max), axis=-1)
    hi = jnp.max(jnp.where(real, x, 0), axis=-1)
    return one, x[..., 0], lo, hi

  q_one, q_id, q_lo, q_hi = (a[:, :, None] for a in summary(block_q))
  k_one, k_id, k_lo, k_hi = (a[:, None, :] for a in summary(block_k))
  full = q_one & k_one & (q_id == k_id)
  none = (q_hi < k_lo) | (k_hi < q_lo)  # disjoint id ranges (all-padding blocks: empty)
  return jnp.where(none, SKIP, jnp.where(full, FULL, MASKED)).astype(jnp.int32)


def _check_supported(query, key, value, dtype, bidirectional, block_q, block_k, steps):
  for x in (query, key, value):
    if jnp.dtype(x.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
      raise ValueError(
          f"attention_impl='pallas_mgpu' takes bfloat16 or float16 inputs (wgmma), got "
          f"{x.dtype}: float32 computes in float32 in this project, which wgmma cannot; use "
          "'pallas_gpu' or 'blockwise' for float32.")
  if jnp.dtype(dtype) != jnp.dtype(value.dtype):
    raise ValueError(
        f"attention_impl='pallas_mgpu' computes its probabilities in the inputs' dtype "
        f"({value.dtype}), but dtype={jnp.dtype(dtype).name}: use 'pallas_gpu' or 'blockwise' "
        'for float32 probabilities.')
  if not bidirectional:
    raise ValueError("attention_impl='pallas_mgpu' is the encoder's (bidirectional) kernel; "
                     "use 'pallas_gpu' or 'blockwise' for causal attention.")
  if query.shape[-1] % 64:
    raise ValueError(f"attention_impl='pallas_mgpu' needs a head dim that is a multiple of 64, "
                     f"got {query.shape[-1]}; use 'pallas_gpu' or 'blockwise'.")
  for name, size in (('block_q', block_q), ('block_k', block_k)):
    if size % 64:
      raise ValueError(f'{name}={size} must be a multiple of 64.')
  if steps < 2:
    raise ValueError(f'max_concurrent_steps={steps} must be at least 2.')


def _make_kernel(*, block_q, block_k, depth, nk, steps, with_stats, round_qk, in_dtype,
                 schedule_barrier, delta_lo, delta_step, far, interpret):
  """The kernel body `(q, k, v, ids, kinds, params, band, out[, pmax, entropy])`; `far` is the
  bias band's half-width (`reference.OffsetMap.far`)."""
  wgmma_layout = plgpu.Layout.WGMMA
  row_layout, col_layout = wgmma_layout.reduce(1), wgmma_layout.reduce(0)
  rows = lambda x: lax.broadcast_in_dim(x, (block_q, block_k), [0])
  cols = lambda x: lax.broadcast_in_dim(x, (block_q, block_k), [1])

  def kernel(q_ref, k_ref, v_ref, ids_ref, kinds_ref, params_ref, band_ref, out_ref, stats_ref,
             scoped):
    batch, head = lax.axis_index('batch'), lax.axis_index('heads')
    wg = lax.axis_index('wg')
    smem, loaded, setup, consumed, sched = scoped
    qo_smem, k_smem, v_smem, kid_smem, qid_smem, kinds_smem, params_smem, bias_smem, st_smem = smem
    k_loaded, v_loaded, kid_loaded = loaded
    q_bar, qid_bar, kinds_bar, params_bar, bias_bar = setup
    k_consumed, v_consumed = consumed

    def schedule():
      if schedule_barrier:
        plgpu.barrier_arrive(sched)
        plgpu.barrier_wait(sched)

    @pl.when(wg < _COMPUTE_WGS)
    def _compute():
      plgpu.set_max_registers(232, action='increase')
      q_base = lax.axis_index('q_seq') * (_COMPUTE_WGS * block_q) + wg * block_q
      q_block = lax.axis_index('q_seq') * _COMPUTE_WGS + wg
      qo = qo_smem.at[wg]
      plgpu.copy_gmem_to_smem(q_ref.at[batch, pl.ds(q_base, block_q), head], qo, q_bar.at[wg])
      plgpu.copy_gmem_to_smem(ids_ref.at[batch, pl.ds(q_base, block_q)], qid_smem.at[wg],
                              qid_bar.at[wg])
      plgpu.copy_gmem_to_smem(kinds_ref.at[batch, q_block], kinds_smem.at[wg], kinds_bar.at[wg])
      plgpu.copy_gmem_to_smem(params_ref.at[batch, head], params_smem.at[wg], params_bar.at[wg])
      for bar in (q_bar, qid_bar, kinds_bar, params_bar):
        plgpu.barrier_wait(bar.at[wg])
      params = params_smem.at[wg]
      scale = _load(params.at[0], row_layout, interpret)  # log2(e) / tau
      left = _load(params.at[1], row_layout, interpret)
      right = _load(params.at[2], row_layout, interpret)
      q_ids = _load(qid_smem.at[wg], row_layout, interpret)

      m = _cast(jnp.full((block_q,), _M_INIT, jnp.float32), row_layout, interpret)
      l = _cast(jnp.full((block_q,), 0.0, jnp.float32), row_layout, interpret)
      c = _cast(jnp.full((block_q,), 0.0, jnp.float32), row_layout, interpret)
      acc = _cast(jnp.full((block_q, depth), 0.0, jnp.float32), wgmma_layout, interpret)

      def tile(slot, kv, carry, *, region, masked):
        """One key tile of the online softmax (region 'left', 'band' or 'right')."""
        acc, m, l, c = carry
        if region == 'band':
          # NOTE: a warpgroup barrier (in commit_smem) before the TMA overwrites the buffer
          # that every warp of this warpgroup read in its previous band tile.
          plgpu.commit_smem()
          delta_index = lax.div(kv * block_k - q_base - delta_lo, delta_step)
          plgpu.copy_gmem_to_smem(band_ref.at[head, delta_index], bias_smem.at[wg],
                                  bias_bar.at[wg])

        def compute_qk(acc_ref):
          plgpu.wgmma(acc_ref, qo, _transposed(k_smem.at[slot]))
          schedule()
          return acc_ref[...]

        if interpret and _INTERPRET_NO_TRANSPOSED_WGMMA:
          # [bq, d] x [bk, d] -> [bq, bk] from the same shared-memory tiles.
          x = lax.dot_general(qo[...], k_smem.at[slot][...], (((1,), (1,)), ((), ())),
                              preferred_element_type=jnp.float32)
          schedule()
        else:
          x = pl.run_scoped(compute_qk, plgpu.ACC((block_q, block_k), jnp.float32))
        if round_qk:  # 'reference' computes its logits in the inputs' dtype.
          x = x.astype(in_dtype).astype(jnp.float32)
        if region == 'band':
          plgpu.barrier_wait(bias_bar.at[wg])
          bias = _load(bias_smem.at[wg], wgmma_layout, interpret)
          t = (x + bias) * rows(scale)
        else:
          t = x * rows(scale) + rows(left if region == 'left' else right)
        if masked:
          k_ids = _load(kid_smem.at[slot], col_layout, interpret)
          t = jnp.where(rows(q_ids) == cols(k_ids), t, _MASKED)
        plgpu.barrier_arrive(k_consumed.at[slot])
        m_new = jnp.maximum(m, t.max(axis=1))
        alpha = jnp.exp2(m - m_new)
        d = t - rows(m_new)
        p = jnp.exp2(d)
        l_tile = p.sum(axis=1)
        if with_stats:
          # Rescaled to the new max: sum p' (t - m_new) = alpha (c + (m - m_new) l) + ...
          c = alpha * (c + (m - m_new) * l) + (p * d).sum(axis=1)
        l = alpha * l + l_tile
        acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
        p16 = p.astype(in_dtype)
        if schedule_barrier:
          plgpu.barrier_arrive(sched)
        plgpu.barrier_wait(v_loaded.at[slot])
        if schedule_barrier:
          plgpu.barrier_wait(sched)

        def compute_pv(acc_ref):
          plgpu.wgmma(acc_ref, p16, v_smem.at[slot])

        if interpret:
          # Mosaic GPU's interpret mode has no wgmma with a register operand (p), nor (jax 0.10)
          # `pl.run_state`: a plain dot.
          acc = acc + lax.dot_general(p16, v_smem.at[slot][...], (((1,), (0,)), ((), ())),
                                      preferred_element_type=jnp.float32)
        else:
          # wgmma accumulates into the rescaled registers' accumulator.
          acc = pl.run_state(compute_pv)(plgpu.ACC.init(acc))
        plgpu.barrier_arrive(v_consumed.at[slot])
        return acc, m_new, l, c

      def skip(slot, carry):
        schedule()
        plgpu.barrier_arrive(k_consumed.at[slot])
        schedule()
        plgpu.barrier_wait(v_loaded.at[slot])
        plgpu.barrier_arrive(v_consumed.at[slot])
        return carry

      def loop(region):
        def body(kv, carry):
          slot = lax.rem(kv, jnp.int32(steps))
          plgpu.barrier_wait(k_loaded.at[slot])
          plgpu.barrier_wait(kid_loaded.at[slot])
          kind = kinds_smem[wg, kv]
          branches = [functools.partial(skip, slot),
                      functools.partial(tile, slot, kv, region=region, masked=True),
                      functools.partial(tile, slot, kv, region=region, masked=False)]
          return lax.switch(kind, branches, carry)
        return body

      # Key tiles [0, lo) lie at offsets <= -far from every query of these rows, [hi, nk) at
      # offsets >= far (non-negative operands: lax.div is floor division).
      lo = jnp.minimum(lax.div(jnp.maximum(q_base - far + 1, 0), jnp.int32(block_k)), nk)
      hi = jnp.clip(lax.div(q_base + block_q - 2 + far + block_k, jnp.int32(block_k)), lo, nk)
      pl.when(wg == 1)(schedule)
      carry = (acc, m, l, c)
      carry = lax.fori_loop(0, lo, loop('left'), carry)
      carry = lax.fori_loop(lo, hi, loop('band'), carry)
      carry = lax.fori_loop(hi, nk, loop('right'), carry)
      acc, m, l, c = carry
      pl.when(wg == 0)(schedule)

      # Rows without an allowed key (segment id 0) keep l = 0; the wrapper replaces them.
      l_safe = jnp.where(l > 0.0, l, 1.0)
      inv = 1.0 / l_safe
      qo[...] = (acc * lax.broadcast_in_dim(inv, acc.shape, [0])).astype(in_dtype)
      if with_stats:
        st = st_smem.at[wg]
        st.at[0][...] = inv
        st.at[1][...] = jnp.log(l_safe) - (c * _LN2) * inv
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(qo, out_ref.at[batch, pl.ds(q_base, block_q), head])
      if with_stats:
        pmax_ref, entropy_ref = stats_ref
        plgpu.copy_smem_to_gmem(st.at[0], pmax_ref.at[batch, head, pl.ds(q_base, block_q)])
        plgpu.copy_smem_to_gmem(st.at[1], entropy_ref.at[batch, head, pl.ds(q_base, block_q)])
      plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == _COMPUTE_WGS)
    def _memory():
      plgpu.set_max_registers(40, action='decrease')

      def load_k(step, slot):
        keys = pl.ds(step * block_k, block_k)
        plgpu.copy_gmem_to_smem(k_ref.at[batch, keys, head], k_smem.at[slot], k_loaded.at[slot])
        plgpu.copy_gmem_to_smem(ids_ref.at[batch, keys], kid_smem.at[slot], kid_loaded.at[slot])

      def load_v(step, slot):
        keys = pl.ds(step * block_k, block_k)
        plgpu.copy_gmem_to_smem(v_ref.at[batch, keys, head], v_smem.at[slot], v_loaded.at[slot])

      for i in range(steps):
        load_k(i, i)
        load_v(i, i)

      @pl.loop(0, nk - steps)
      def _stream(kv):
        step = kv + steps
        slot = lax.rem(kv, jnp.int32(steps))
        plgpu.barrier_wait(k_consumed.at[slot])
        load_k(step, slot)
        plgpu.barrier_wait(v_consumed.at[slot])
        load_v(step, slot)

      # Observes the last tiles' 'consumed' phases too (nothing follows; interpret mode checks
      # that every waiter of a barrier saw all its phases).
      @pl.loop(nk - steps, nk)
      def _drain(kv):
        slot = lax.rem(kv, jnp.int32(steps))
        plgpu.barrier_wait(k_consumed.at[slot])
        plgpu.barrier_wait(v_consumed.at[slot])

  return kernel


@functools.partial(jax.jit, static_argnames=(
    'bidirectional', 'dtype', 'float32_logits', 'with_stats', 'block_q', 'block_k',
    'max_concurrent_steps', 'use_schedule_barrier', 'interpret', 'approx_math', 'offset_map'))
def pallas_mgpu_attention(
    query: Array,
    key: Array,
    value: Array,
    *,
    rel_embedding: Array,
    segment_ids: Array,
    temperature: Array | None = None,
    bidirectional: bool = True,
    dtype: jnp.dtype = jnp.bfloat16,
    float32_logits: bool = False,
    with_stats: bool = False,
    block_q: int | None = None,
    block_k: int | None = None,
    max_concurrent_steps: int = 2,
    use_schedule_barrier: bool = True,
    interpret: bool = False,
    approx_math: bool | None = None,
    offset_map: reference.OffsetMap = reference.OffsetMap(),
) -> tuple[Array, reference.RowStats | None]:
  """Self-attention with the T5 bias on Hopper (arguments as `pallas_gpu.pallas_attention`).

  `block_q` / `block_k` None: `default_blocks()`; `max_concurrent_steps`,
  `use_schedule_barrier`: see `Options`; `interpret`: run in Mosaic GPU's interpret mode (CPU);
  `approx_math`: the hardware's approximate exp2 and division (None: on a GPU, not when
  interpreting). `float32_logits`: q.k is kept in float32 (wgmma's accumulator) instead of
  rounded to the inputs' dtype. `offset_map`: how offsets are read in the bias table
  (`reference.OffsetMap`).

  Returns:
    `[b, l, h, d]` output and optional RowStats `[b, h, l]`.
  """
  batch, length, heads, depth = query.shape
  default_q, default_k = default_blocks()
  block_q, block_k = block_q or default_q, block_k or default_k
  _check_supported(query, key, value, dtype, bidirectional, block_q, block_k,
                   max_concurrent_steps)
  in_dtype = query.dtype
  # [1 or b, 1 or h] -> [b, h]
  tau = jnp.broadcast_to(reference.head_temperature(temperature, batch, heads), (batch, heads))
  padded = blockwise.round_up(length, math.lcm(_COMPUTE_WGS * block_q, block_k))
  nk = padded // block_k
  steps = min(max_concurrent_steps, nk)
  pad = lambda x: jnp.pad(x, [(0, 0), (0, padded - length)] + [(0, 0)] * (x.ndim - 2))
  q, k, v = pad(query), pad(key), pad(value.astype(in_dtype))  # [b, padded, h, d]
  ids = pad(segment_ids.astype(jnp.int32))  # [b, padded]; 0 beyond the length.
  # [b, nq, nk], nk padded to a multiple of 32: Mosaic GPU's warpgroup copies move a multiple
  # of 128 bytes.
  kinds = mask_kinds(ids, block_q, block_k)
  kinds = jnp.pad(kinds, [(0, 0), (0, 0), (0, blockwise.round_up(nk, 32) - nk)])
  # Per (example, head): log2(e) / tau, and the far-left / far-right biases tempered, each
  # repeated over the rows: [b, h, 4, block_q].
  # [h, 2 * far + 1]
  lut = reference.bias_by_offset(rel_embedding.astype(jnp.float32), bidirectional, offset_map)
  scale = _LOG2E / tau  # [b, h]
  params = jnp.stack([scale, lut[None, :, 0] * scale, lut[None, :, -1] * scale,
                      jnp.zeros_like(scale)], axis=-1)
  params = jnp.broadcast_to(params[..., None], (batch, heads, 4, block_q)).astype(jnp.float32)
  deltas = band_deltas(block_q, block_k, offset_map.far)
  # [h, n, bq, bk]
  band = band_bias_tiles(rel_embedding, block_q, block_k, bidirectional, offset_map)

  kernel = _make_kernel(
      block_q=block_q, block_k=block_k, depth=depth, nk=nk, steps=steps, with_stats=with_stats,
      round_qk=not float32_logits, in_dtype=in_dtype, schedule_barrier=use_schedule_barrier,
      delta_lo=int(deltas[0]), delta_step=math.gcd(block_q, block_k), far=offset_map.far,
      interpret=interpret)

  def entry(q_ref, k_ref, v_ref, ids_ref, kinds_ref, params_ref, band_ref, out_ref, *stats_ref):
    tiled = lambda shape: plgpu.SMEM(
        shape, in_dtype, transforms=(plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)))
    smem = [
        tiled((_COMPUTE_WGS, block_q, depth)),  # q, then the output
        tiled((steps, block_k, depth)),  # k ring
        tiled((steps, block_k, depth)),  # v ring
        plgpu.SMEM((steps, block_k), jnp.int32),  # key ids ring
        plgpu.SMEM((_COMPUTE_WGS, block_q), jnp.int32),  # query ids
        plgpu.SMEM((_COMPUTE_WGS, kinds.shape[-1]), jnp.int32),  # mask kinds
        plgpu.SMEM((_COMPUTE_WGS, 4, block_q), jnp.float32),  # row parameters
        plgpu.SMEM((_COMPUTE_WGS, block_q, block_k), jnp.float32,  # band bias tile
                   transforms=(plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))),
        plgpu.SMEM((_COMPUTE_WGS, 2, block_q), jnp.float32) if with_stats else None,
    ]
    pl.run_scoped(
        lambda *scoped: kernel(q_ref, k_ref, v_ref, ids_ref, kinds_ref, params_ref, band_ref,
                               out_ref, stats_ref, scoped),
        smem,
        tuple(plgpu.Barrier(num_barriers=steps) for _ in range(3)),
        tuple(plgpu.Barrier(num_barriers=_COMPUTE_WGS) for _ in range(5)),
        tuple(plgpu.Barrier(num_arrivals=_COMPUTE_WGS, num_barriers=steps) for _ in range(2)),
        plgpu.Barrier(num_arrivals=_COMPUTE_WGS),
        collective_axes='wg',
    )

  out_type = [jax.ShapeDtypeStruct((batch, padded, heads, depth), in_dtype)]
  if with_stats:
    out_type += [jax.ShapeDtypeStruct((batch, heads, padded), jnp.float32)] * 2
  interpret_params = None
  if interpret:
    from jax._src.pallas.mosaic_gpu.interpret import params as interpret_lib  # pylint: disable=g-import-not-at-top
    interpret_params = interpret_lib.InterpretGPUParams()
  if approx_math is None:
    approx_math = not interpret
  outs = plgpu.kernel(
      entry,
      out_type=out_type,
      grid=(heads, padded // (_COMPUTE_WGS * block_q), batch),
      grid_names=('heads', 'q_seq', 'batch'),
      num_threads=_COMPUTE_WGS + 1,
      thread_name='wg',
      compiler_params=plgpu.CompilerParams(approx_math=approx_math),
      interpret=interpret_params,
  )(q, k, v, ids, kinds, params, band)
  out = outs[0][:, :length]
  # Padding rows (segment id 0): uniform over the real keys, as t5x.
  pad_rows = (segment_ids == 0)  # [b, l]
  v_mean = jnp.mean(value.astype(jnp.float32), axis=1)  # [b, h, d]
  out = jnp.where(pad_rows[:, :, None, None], v_mean[:, None].astype(in_dtype), out)
  if not with_stats:
    return out, None
  pad_rows = pad_rows[:, None, :]  # [b, 1, l]
  pmax = jnp.where(pad_rows, np.float32(1.0 / length), outs[1][..., :length])
  entropy = jnp.where(pad_rows, np.float32(np.log(length)), outs[2][..., :length])
  return out, reference.RowStats(pmax=pmax, entropy=entropy)
