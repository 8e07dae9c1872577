"""Attention implementations ('blockwise', the Pallas kernels) against 'reference', and 'reference'.

The implementations are called through `dispatch.self_attention` (the dispatch the model uses),
with block sizes passed as arguments.
"""
from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import abstract_devices
from t5align.attention import blockwise
from t5align.attention import dispatch
from t5align.attention import pallas_gpu
from t5align.attention import pallas_tpu
from t5align.attention import reference

pytestmark = pytest.mark.newest_jax

FIXTURE = pathlib.Path(__file__).parents[1] / 'testdata' / 't5x' / 't5_1_1_tiny' / 'reference.npz'
F32 = dict(rtol=1e-5, atol=1e-5)
BF16 = dict(rtol=2e-2, atol=2e-2)


def _inputs(batch=2, length=300, heads=2, depth=16, dtype=jnp.float32, seed=0):
  """Random q, k, v `[b, l, h, d]` and a `[h, 32]` table (bias values ~ t5x's init scale)."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  qkv = [jax.random.normal(k, (batch, length, heads, depth)).astype(dtype) for k in keys[:3]]
  return (*qkv, jax.random.normal(keys[3], (heads, reference.NUM_BUCKETS)))


def _segment_ids(batch=2, length=300):
  """Example 0 packs two segments then padding; example 1 is one segment then padding."""
  ids = np.zeros((batch, length), np.int32)
  ids[0, :length // 3] = 1
  ids[0, length // 3:length * 5 // 6] = 2
  ids[1:, :length * 2 // 3] = 1
  return ids


def _impl(name, block_q, block_k):
  """`(q, k, v, **kw)` of an implementation through `dispatch.self_attention`, given blocks."""
  options = dispatch.IMPLEMENTATIONS[name].options(block_q=block_q, block_k=block_k)
  return lambda *a, **kw: dispatch.self_attention(*a, impl=name, options=options, **kw)


def _reference(*args, **kwargs):
  return dispatch.self_attention(*args, impl='reference', **kwargs)


def _check(actual, expected, ids, tol):
  """Outputs on every row, statistics on rows with a key to attend to; padded rows uniform."""
  (out, stats), (ref_out, ref_stats) = actual, expected
  np.testing.assert_allclose(np.float32(out), np.float32(ref_out), **tol)
  np.testing.assert_allclose(stats.pmax, ref_stats.pmax, **F32)
  valid = np.broadcast_to((ids > 0)[:, None, :], stats.entropy.shape)
  np.testing.assert_allclose(np.asarray(stats.entropy)[valid],
                             np.asarray(ref_stats.entropy)[valid], **F32)
  # Fully masked (padding) rows are uniform over all keys in every implementation: entropy
  # log(length), P_max 1 / length (finite: 'reference' subtracts the row max before dividing by
  # tau, so its ~-1e10 masked logits cancel exactly).
  length = ids.shape[1]
  for row_stats in (stats, ref_stats):
    np.testing.assert_allclose(np.asarray(row_stats.entropy)[~valid], np.log(length), **F32)
    np.testing.assert_allclose(np.asarray(row_stats.pmax)[~valid], 1.0 / length, **F32)


def _check_uniform_padding(out, value, ids, tol):
  """Fully masked (padding) rows attend uniformly to every key, as in t5x."""
  pad = ids == 0
  # [b, l, h, d] -> [b, 1, h, d]: the mean value over all keys.
  uniform = np.broadcast_to(np.mean(np.float32(value), axis=1, keepdims=True), out.shape)
  np.testing.assert_allclose(np.float32(out)[pad], uniform[pad], **tol)


CASES = {
    # name: (bidirectional, dtype, float32_logits, temperature)
    'encoder_f32_per_example_tau': (True, jnp.float32, False, np.array([0.6, 1.3], np.float32)),
    # [b, h]: per example and head.
    'encoder_f32_per_head_tau': (True, jnp.float32, False,
                                 np.array([[0.6, 1.3], [0.9, 0.5]], np.float32)),
    'causal_f32': (False, jnp.float32, False, np.array([0.8], np.float32)),
    'encoder_bf16': (True, jnp.bfloat16, False, np.array([0.7], np.float32)),
    'encoder_bf16_f32_logits': (True, jnp.bfloat16, True, np.array([1.0, 0.5], np.float32)),
    'causal_bf16': (False, jnp.bfloat16, False, np.array([1.2, 0.9], np.float32)),
}
# (impl, block_q, block_k, cases). At length 300, 128 x 128 and 128 x 64 blocks give blockwise
# tiles of all three bias kinds: near the diagonal (table lookup), wholly beyond MAX_DISTANCE to
# the left and to the right (one value per head). The TPU kernel's tiles at 128 x 128 are of all
# three bias kinds too, and of its three mask kinds (example 1's first query block against its
# first key block: one segment, no mask; padding-only blocks: skipped; the rest masked);
# 128 x 256 pads 300 tokens to 512 (lcm of the blocks) and has unequal blocks.
IMPLS = [
    ('blockwise', 128, 128, list(CASES)),
    ('blockwise', 128, 64, ['encoder_f32_per_example_tau', 'encoder_f32_per_head_tau',
                            'causal_f32']),
    ('pallas_tpu', 128, 128, list(CASES)),
    ('pallas_tpu', 128, 256, ['encoder_f32_per_head_tau', 'causal_bf16']),
]
if jax.default_backend() == 'cpu':  # Interpret mode is slow: fewer cases for the GPU kernel.
  IMPLS.append(('pallas_gpu', 64, 32, ['encoder_f32_per_head_tau', 'causal_bf16']))
else:  # GPU: the Triton kernel on every case, at two block shapes.
  IMPLS += [('pallas_gpu', 64, 32, list(CASES)), ('pallas_gpu', 128, 64, list(CASES))]
# A Pallas kernel runs on its own platform, and on CPU in interpret mode.
IMPLS = [spec for spec in IMPLS
         if jax.default_backend() in ('cpu', *dispatch.IMPLEMENTATIONS[spec[0]].platforms)]


@pytest.mark.slow
@pytest.mark.parametrize('impl,block_q,block_k,case', [
    (impl, bq, bk, case) for impl, bq, bk, cases in IMPLS for case in cases])
def test_matches_reference(impl, block_q, block_k, case):
  bidirectional, dtype, float32_logits, tau = CASES[case]
  query, key, value, table = _inputs(dtype=dtype)
  ids = _segment_ids()
  kwargs = dict(rel_embedding=table, segment_ids=jnp.asarray(ids), temperature=jnp.asarray(tau),
                bidirectional=bidirectional, dtype=dtype, float32_logits=float32_logits,
                with_stats=True)
  expected = _reference(query, key, value, **kwargs)
  actual = _impl(impl, block_q, block_k)(query, key, value, **kwargs)
  assert actual[0].dtype == expected[0].dtype and actual[0].shape == expected[0].shape
  tol = F32 if dtype == jnp.float32 else BF16
  _check(actual, expected, ids, tol)
  _check_uniform_padding(actual[0], value, ids, tol)


@pytest.mark.slow
@pytest.mark.parametrize('batch_block', [1, 2])
def test_blockwise_batch_chunks_equal_the_whole_batch(batch_block):
  """Examples attended `batch_block` at a time (CPU's default past a tile budget; 3 examples in
  chunks of 2 pad the batch), per-example taus and attention dropout: the same as all at once,
  and as 'reference' where there is no dropout."""
  query, key, value, table = _inputs(batch=3, seed=5)
  ids = _segment_ids(batch=3)
  kwargs = dict(rel_embedding=table, segment_ids=jnp.asarray(ids),
                temperature=jnp.asarray([0.6, 1.3, 0.9]), with_stats=True, block_q=128,
                block_k=64)
  whole = blockwise.blockwise_attention(query, key, value, batch_block=3, **kwargs)
  chunked = blockwise.blockwise_attention(query, key, value, batch_block=batch_block, **kwargs)
  _check(chunked, whole, ids, F32)
  _check(chunked, _reference(query, key, value, **{
      k: v for k, v in kwargs.items() if k not in ('block_q', 'block_k')}), ids, F32)
  rng = dict(dropout_rng=jax.random.PRNGKey(7), dropout_rate=0.3)
  np.testing.assert_allclose(
      blockwise.blockwise_attention(query, key, value, batch_block=batch_block, **kwargs, **rng)[0],
      blockwise.blockwise_attention(query, key, value, batch_block=3, **kwargs, **rng)[0], **F32)


def test_default_batch_block_keeps_cpu_tiles_in_budget():
  assert blockwise.default_batch_block(50, 8, 256, 512, 'cpu') == 1  # 8 x 256 x 512 = 2^20.
  assert blockwise.default_batch_block(50, 2, 128, 128, 'cpu') == 32
  assert blockwise.default_batch_block(3, 2, 128, 128, 'cpu') == 3
  assert blockwise.default_batch_block(50, 64, 512, 512, 'gpu') == 50


@pytest.mark.slow
@pytest.mark.parametrize('tau', [0.5, 1.0, 2.0])
def test_blockwise_scalar_taus_default_blocks(tau):
  query, key, value, table = _inputs(seed=1)
  ids = _segment_ids()
  kwargs = dict(rel_embedding=table, segment_ids=jnp.asarray(ids), temperature=tau,
                with_stats=True)
  expected = _reference(query, key, value, **kwargs)
  _check(dispatch.self_attention(query, key, value, impl='blockwise', **kwargs), expected, ids, F32)


@pytest.mark.slow
def test_without_stats_and_default_temperature():
  query, key, value, table = _inputs(seed=2)
  ids = jnp.asarray(_segment_ids())
  outputs = []
  for impl in ('reference', 'blockwise'):
    out, stats = dispatch.self_attention(query, key, value, rel_embedding=table, segment_ids=ids,
                                       impl=impl)
    assert stats is None
    outputs.append(out)
  np.testing.assert_allclose(outputs[1], outputs[0], **F32)


def _np_bucket(relative_position, bidirectional, num_buckets=32, max_distance=128):
  """T5's bucket written out in numpy (t5x's float32 epsilon)."""
  n = -np.asarray(relative_position, np.int64)
  bucket = np.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    bucket += (n < 0) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  with np.errstate(divide='ignore'):
    log_ratio = np.log(n / max_exact + np.finfo(np.float32).eps)
  large = max_exact + (log_ratio / np.log(max_distance / max_exact)
                       * (num_buckets - max_exact)).astype(np.int64)
  return bucket + np.where(n < max_exact, n, np.minimum(large, num_buckets - 1))


@pytest.mark.parametrize('bidirectional', [True, False])
def test_buckets_match_t5x_fixture(bidirectional):
  ref = np.load(FIXTURE)
  name = 'relpos_bucket_' + ('bidirectional' if bidirectional else 'causal')
  expected = ref[name][0]
  offsets = ref['relpos_offsets']  # key - query, -300..300
  np.testing.assert_array_equal(reference.relative_position_bucket(offsets, bidirectional),
                                expected)
  np.testing.assert_array_equal(_np_bucket(offsets, bidirectional), expected)


@pytest.mark.parametrize('bidirectional', [True, False])
def test_numpy_and_jax_buckets_agree(bidirectional):
  """Host (numpy) and traced (jnp) bucketing give the same int32 buckets at every offset."""
  offsets = np.arange(-70000, 70001, dtype=np.int32)
  on_host = reference.relative_position_bucket(offsets, bidirectional)
  traced = jax.jit(reference.relative_position_bucket, static_argnums=1)(
      jnp.asarray(offsets), bidirectional)
  assert isinstance(on_host, np.ndarray) and on_host.dtype == np.int32
  np.testing.assert_array_equal(on_host, np.asarray(traced))
  np.testing.assert_array_equal(on_host, _np_bucket(offsets, bidirectional))


@pytest.mark.parametrize('bidirectional', [True, False])
def test_bias_by_offset_covers_every_offset(bidirectional):
  """The clipped-offset table equals the bucketed table at every offset of a 5000-token input."""
  table = np.asarray(_inputs()[3])
  offsets = np.arange(-5000, 5001)
  lut = np.asarray(reference.bias_by_offset(jnp.asarray(table), bidirectional))
  index = np.asarray(reference.offset_index(jnp.zeros((1,), jnp.int32), jnp.asarray(offsets)))[0]
  np.testing.assert_array_equal(lut[:, index], table[:, _np_bucket(offsets, bidirectional)])


@pytest.mark.parametrize('tau', [np.array([0.7, 1.4]), np.array([[0.7, 1.1], [1.4, 0.55]])],
                         ids=['per_example', 'per_example_and_head'])
def test_reference_matches_numpy_float64(tau):
  batch, length = 2, 300
  query, key, value, table = (np.asarray(x, np.float64) for x in _inputs(batch, length, seed=4))
  ids = _segment_ids(batch, length)
  # [b, q, h, d] x [b, k, h, d] -> [b, h, q, k]
  logits = np.einsum('bqhd,bkhd->bhqk', query, key)
  offsets = np.arange(length)[None, :] - np.arange(length)[:, None]  # [q, k]
  bias = table[:, _np_bucket(offsets, True)][None]  # [1, h, q, k]
  allowed = (ids[:, :, None] == ids[:, None, :]) & (ids[:, :, None] > 0)  # [b, q, k]
  mask_bias = np.where(allowed, 0.0, -1e10)[:, None]  # [b, 1, q, k]
  tau4 = tau.reshape(batch, -1)[:, :, None, None]  # [b] or [b, h] -> [b, 1 or h, 1, 1]
  s = (logits + bias + mask_bias) / tau4
  probs = np.exp(s - s.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)  # [b, h, q, k]
  # NOTE: in float32 (t5x), -1e10 absorbs q.k and the bias, so fully masked rows are uniform.
  probs = np.where(allowed.any(-1)[:, None, :, None], probs, 1.0 / length)
  out = np.einsum('bhqk,bkhd->bqhd', probs, value)
  pmax = probs.max(-1)  # [b, h, q]
  entropy = -np.sum(np.where(probs > 0, probs * np.log(np.maximum(probs, 1e-300)), 0.0), -1)

  actual, stats = reference.reference_self_attention(
      *(jnp.asarray(x, jnp.float32) for x in (query, key, value)),
      rel_embedding=jnp.asarray(table, jnp.float32), segment_ids=jnp.asarray(ids),
      temperature=jnp.asarray(tau, jnp.float32), with_stats=True)
  np.testing.assert_allclose(actual, out, **F32)
  np.testing.assert_allclose(stats.pmax, pmax, **F32)
  valid = np.broadcast_to((ids > 0)[:, None, :], entropy.shape)
  np.testing.assert_allclose(np.asarray(stats.entropy)[valid], entropy[valid], **F32)
  np.testing.assert_allclose(entropy[~valid], np.log(length), rtol=1e-12)  # Uniform pad rows.


def _kinds_ids(length=1000):
  """Batch 1: segment 1 on [0, 600), segment 2 on [600, 900), then padding."""
  ids = np.zeros((1, length), np.int32)
  ids[0, :600] = 1
  ids[0, 600:900] = 2
  return ids


@pytest.mark.parametrize('bidirectional', [pytest.param(True, marks=pytest.mark.slow), False])
def test_tile_kinds_match_a_brute_force_classification(bidirectional):
  """Every tile's kind equals one read off its materialized mask and offsets (numpy), and the
  input below has tiles of all five kinds."""
  block_q, block_k = 128, 64
  ids = _kinds_ids()
  padded = 1024  # internal padding: ids 0
  full_ids = np.pad(ids, ((0, 0), (0, padded - ids.shape[1])))
  to_blocks = lambda block: np.moveaxis(full_ids.reshape(1, padded // block, block), 1, 0)
  kinds, right = blockwise.tile_kinds(jnp.asarray(to_blocks(block_q)),
                                      jnp.asarray(to_blocks(block_k)), block_q, block_k,
                                      bidirectional)
  pos = np.arange(padded)
  mask = (full_ids[0][:, None] == full_ids[0][None, :]) & (full_ids[0][:, None] > 0)
  if not bidirectional:
    mask &= pos[None, :] <= pos[:, None]
  offsets = pos[None, :] - pos[:, None]  # key - query
  expected = np.zeros((padded // block_q, padded // block_k), np.int32)
  for i in range(expected.shape[0]):
    for j in range(expected.shape[1]):
      rows, cols = slice(i * block_q, (i + 1) * block_q), slice(j * block_k, (j + 1) * block_k)
      tile, tile_offsets = mask[rows, cols], offsets[rows, cols]
      far = (np.all(tile_offsets <= -reference.MAX_DISTANCE)
             or np.all(tile_offsets >= reference.MAX_DISTANCE))
      assert right[i, j] == (far and tile_offsets.min() > 0)
      if not tile.any():
        expected[i, j] = blockwise.SKIP
      elif tile.all():
        expected[i, j] = blockwise.FAR if far else blockwise.NEAR
      else:
        expected[i, j] = blockwise.FAR_MASKED if far else blockwise.NEAR_MASKED
  np.testing.assert_array_equal(kinds, expected)
  assert set(np.unique(expected)) == {blockwise.SKIP, blockwise.NEAR_MASKED, blockwise.NEAR,
                                      blockwise.FAR_MASKED, blockwise.FAR}


@pytest.mark.slow
@pytest.mark.parametrize('bidirectional', [True, False])
def test_blockwise_tiles_of_every_kind_match_reference(bidirectional):
  """Unmasked near / far tiles (no per-element mask), masked ones and skipped ones together
  (`_kinds_ids`): output and statistics as 'reference', per-head taus."""
  query, key, value, table = _inputs(batch=1, length=1000, seed=4)
  ids = _kinds_ids()
  kwargs = dict(rel_embedding=table, segment_ids=jnp.asarray(ids), bidirectional=bidirectional,
                temperature=jnp.asarray([[0.7, 1.2]]), with_stats=True)
  _check(_impl('blockwise', 128, 64)(query, key, value, **kwargs),
         _reference(query, key, value, **kwargs), ids, F32)


@pytest.mark.slow
def test_blockwise_vmap_over_temperatures():
  query, key, value, table = _inputs(seed=5)
  ids = jnp.asarray(_segment_ids())
  taus = np.linspace(1.0, 0.5, 11, dtype=np.float32)

  def run(tau):
    return blockwise.blockwise_attention(
        query, key, value, rel_embedding=table, segment_ids=ids, temperature=tau[None],
        with_stats=True, block_q=128, block_k=128)

  out, stats = jax.jit(jax.vmap(run))(jnp.asarray(taus))  # [t, b, l, h, d], [t, b, h, l]
  valid = np.broadcast_to((np.asarray(ids) > 0)[:, None, :], stats.pmax.shape[1:])
  for i, tau in enumerate(taus):
    ref_out, ref_stats = reference.reference_self_attention(
        query, key, value, rel_embedding=table, segment_ids=ids, temperature=tau,
        with_stats=True)
    np.testing.assert_allclose(out[i], ref_out, **F32)
    np.testing.assert_allclose(stats.pmax[i], ref_stats.pmax, **F32)
    np.testing.assert_allclose(np.asarray(stats.entropy[i])[valid],
                               np.asarray(ref_stats.entropy)[valid], **F32)


@pytest.mark.slow
def test_blockwise_memory_is_linear_in_length():
  """At 16k tokens the compiled blockwise function holds nothing near `[h, L, L]`."""
  length, heads, depth = 16384, 4, 16
  spec = jax.ShapeDtypeStruct((1, length, heads, depth), jnp.float32)
  fn = jax.jit(lambda q, k, v, table, ids: blockwise.blockwise_attention(
      q, k, v, rel_embedding=table, segment_ids=ids, temperature=None, with_stats=True))
  compiled = fn.lower(spec, spec, spec, jax.ShapeDtypeStruct((heads, 32), jnp.float32),
                      jax.ShapeDtypeStruct((1, length), jnp.int32)).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  full = length * length * heads * 4
  assert temp < full / 100, (temp, full)


@pytest.mark.parametrize('bidirectional,dtype,blocks', [
    (True, jnp.bfloat16, (64, 64)), (True, jnp.float32, (128, 64)),
    (False, jnp.bfloat16, (64, 32))])
def test_pallas_kernel_lowers_to_triton_for_cuda(bidirectional, dtype, blocks):
  """The real kernel (not interpret mode) lowers through Pallas' Triton backend for an H100
  (sm_90), without a GPU.

  Cross-platform lowering runs every primitive of the kernel through its Triton lowering rule, so
  an operation Triton cannot express fails here in CI; compiling the Triton IR needs a GPU.
  (That its float32 dots carry Precision.HIGHEST, Triton's IEEE dot: tests/model/precision_test.py.)
  """
  batch, length, heads, depth = 2, 300, 2, 64  # 300: not a block multiple.
  spec = jax.ShapeDtypeStruct((batch, length, heads, depth), dtype)
  fn = jax.jit(lambda q, k, v, table, ids, tau: pallas_gpu.pallas_attention(
      q, k, v, rel_embedding=table, segment_ids=ids, temperature=tau,
      bidirectional=bidirectional, dtype=dtype, with_stats=True, block_q=blocks[0],
      block_k=blocks[1], interpret=False))
  with abstract_devices.abstract_gpu():
    lowered = fn.trace(spec, spec, spec, jax.ShapeDtypeStruct((heads, 32), jnp.float32),
                       jax.ShapeDtypeStruct((batch, length), jnp.int32),
                       jax.ShapeDtypeStruct((batch,), jnp.float32)
                       ).lower(lowering_platforms=('cuda',))
  text = lowered.as_text()
  # One Triton call (not Mosaic GPU, jax's default Pallas GPU backend) with the kernel's grid.
  assert text.count('xla.gpu.triton') == 1
  padded = -(-length // max(blocks)) * max(blocks)
  assert f'grid_x = {batch * heads} : i32, grid_y = {padded // blocks[0]} : i32' in text


@pytest.mark.slow
def test_registry_and_switches():
  assert {'reference', 'blockwise', 'pallas_gpu', 'pallas_mgpu', 'pallas_tpu'} == set(
      dispatch.IMPLEMENTATIONS)
  query, key, value, table = _inputs(length=16, depth=16)
  with pytest.raises(ValueError, match='power of 2'):
    pallas_gpu.pallas_attention(query, key, value, rel_embedding=table,
                                      segment_ids=jnp.ones((2, 16), jnp.int32), block_q=48)
  with pytest.raises(ValueError, match='block_k=64: the TPU kernel takes multiples of 128'):
    pallas_tpu.pallas_tpu_attention(query, key, value, rel_embedding=table,
                                    segment_ids=jnp.ones((2, 16), jnp.int32), block_k=64)
  with pytest.raises(ValueError, match=r"are not those of attention_impl='blockwise'"):
    dispatch.self_attention(query, key, value, rel_embedding=table, impl='blockwise',
                          segment_ids=jnp.ones((2, 16), jnp.int32),
                          options=pallas_tpu.Options(block_q=128))
  with pytest.raises(ValueError, match=r"attention_impl='fused'; expected 'pallas' or one of"):
    dispatch.self_attention(query, key, value, rel_embedding=table, impl='fused',
                          segment_ids=jnp.ones((2, 16), jnp.int32))


@pytest.mark.parametrize('platform,fused,long', [
    ('cpu', 'pallas_tpu', 'blockwise'),  # CPU: the TPU kernel in interpret mode; auto: blockwise.
    ('gpu', 'pallas_gpu', 'pallas_gpu'), ('tpu', 'pallas_tpu', 'pallas_tpu')])
def test_dispatch_table(platform, fused, long):
  """'pallas' is the platform's fused kernel; 'auto' is 'reference' up to the threshold and above
  it the fused kernel on GPU / TPU, 'blockwise' on CPU; names are kept as they are."""
  assert dispatch.resolve('pallas', 100, 2048, platform) == fused
  assert [dispatch.resolve('auto', n, 2048, platform) for n in (100, 2048, 2049, 32768)] == [
      'reference', 'reference', long, long]
  for name in dispatch.IMPLEMENTATIONS:
    assert dispatch.resolve(name, 32768, 2048, platform) == name
  with pytest.raises(ValueError, match="no fused kernel for platform 'metal'"):
    dispatch.resolve('pallas', 100, 2048, 'metal')


def test_target_platform_is_the_mesh_platform():
  """Without a mesh, jax's default backend; under `jax.set_mesh`, the mesh's devices' platform
  (tests/attention/pallas_tpu_test.py: 'tpu' for a TPU topology's devices on this CPU host)."""
  assert reference.target_platform() == jax.default_backend()
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ('data',))
  with jax.set_mesh(mesh):
    assert reference.target_platform() == jax.devices()[0].platform
  # A foreign kernel is refused by name rather than compiled for the wrong platform.
  other = 'pallas_gpu' if jax.default_backend() == 'tpu' else 'pallas_tpu'
  if jax.default_backend() != 'cpu':
    with pytest.raises(ValueError, match=f'attention_impl={other!r} is the'):
      dispatch._interpret(other, jax.default_backend())  # pylint: disable=protected-access


@pytest.mark.slow
def test_dot_product_attention_kv_layouts_agree_and_others_are_refused():
  """Keys/values laid out `[b, h, d, k]` (a decoder's cached cross-attention) give what
  `[b, k, h, d]` gives; any other layout name is refused, naming it."""
  rng = np.random.default_rng(3)
  q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32)
             for s in ((2, 3, 4, 8), (2, 5, 4, 8), (2, 5, 4, 8)))
  bias = jnp.asarray(rng.normal(size=(2, 4, 3, 5)), jnp.float32)
  expected, _ = reference.dot_product_attention(q, k, v, bias)
  to_bhdk = lambda x: jnp.transpose(x, (0, 2, 3, 1))
  got, _ = reference.dot_product_attention(q, to_bhdk(k), to_bhdk(v), bias, kv_layout='bhdk')
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="kv_layout='bkdh'"):
    reference.dot_product_attention(q, k, v, bias, kv_layout='bkdh')
