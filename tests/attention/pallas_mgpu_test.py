"""The Hopper kernel (attention/pallas_mgpu.py): equal to 'reference' in Mosaic GPU's interpret
mode on the CPU, lowered for sm_90 without a GPU, and its refusals.

Interpret mode simulates the three warpgroups, their barriers and the TMA copies, but runs the two
dots as plain dots of the same shared-memory tiles (it has no wgmma with a register operand, and
jax < 0.12 none with a transposed one); the wgmma path is what the lowering test checks (Mosaic
GPU's layout inference and lowering to its dialects). Compiling and timing need a GPU.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import abstract_devices
from t5align.attention import pallas_mgpu
from t5align.attention import reference

pytestmark = pytest.mark.newest_jax

BF16 = dict(rtol=2e-2, atol=2e-2)
STATS = dict(rtol=1e-5, atol=1e-5)  # P_max and entropy are float32.
BLOCK_Q, BLOCK_K = 64, 64  # Small tiles: interpret mode is slow.


def _inputs(batch=2, length=300, heads=2, depth=64, seed=0, exact_logits=False):
  """bfloat16 q, k, v `[b, l, h, d]` and a `[h, 32]` table.

  `exact_logits`: q and k in {-2, ..., 2} / 4, so that every q.k (a multiple of 1/16, at most 16
  in magnitude) is exact in float32 and in bfloat16 whatever the order of the sums. Otherwise
  the kernel's dot and 'reference's einsum, summing in different orders, now and then round a
  logit to neighbouring bfloat16 values (both round q.k to bfloat16, as the contract says), which
  moves a row's P_max by up to ~2e-4: more than float32 tolerance, less than bfloat16's.
  """
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  shape = (batch, length, heads, depth)
  if exact_logits:
    q, k = (jax.random.randint(key, shape, -2, 3).astype(jnp.bfloat16) / 4 for key in keys[:2])
  else:
    q, k = (jax.random.normal(key, shape).astype(jnp.bfloat16) for key in keys[:2])
  v = jax.random.normal(keys[2], shape).astype(jnp.bfloat16)
  return q, k, v, jax.random.normal(keys[3], (heads, reference.NUM_BUCKETS))


def _segment_ids(batch=2, length=300):
  """Example 0 packs two segments then padding (as tests/attention/attention_test.py's); example 1
  is one segment throughout (the kernel pads it to its blocks), so that its tiles far from the
  diagonal are computed, unmasked and masked."""
  ids = np.ones((batch, length), np.int32)
  ids[0, length // 3:length * 5 // 6] = 2
  ids[0, length * 5 // 6:] = 0
  return ids


@contextlib.contextmanager
def _interpret_mode():
  """Resets Mosaic GPU's interpret-mode state if a kernel raised, so later tests can run."""
  try:
    yield
  except Exception:
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call  # pylint: disable=g-import-not-at-top
    interpret_pallas_call.reset_gpu_interpret_mode_state()
    raise


def _tile_regions(padded, block_q, block_k, far=reference.MAX_DISTANCE):
  """(band, far) bool `[nq, nk]` of the kernel's loops, from the query blocks' first rows."""
  q_base = np.arange(padded // block_q)[:, None] * block_q
  k = np.arange(padded // block_k)[None, :]
  lo = np.maximum(q_base - far + 1, 0) // block_k
  hi = (q_base + block_q - 2 + far + block_k) // block_k
  band = (k >= lo) & (k < hi)
  return band, ~band


@pytest.mark.slow
def test_the_test_input_has_tiles_of_every_kind():
  """With the tests' ids, length and blocks: skipped tiles, and masked and unmasked ones both in
  the band and far from it, far ones on both sides of their queries."""
  length = 300
  padded = 384  # round_up(300, lcm(2 * 64, 64))
  ids = np.zeros((2, padded), np.int32)
  ids[:, :length] = _segment_ids(2, length)
  kinds = np.asarray(pallas_mgpu.mask_kinds(jnp.asarray(ids), BLOCK_Q, BLOCK_K))  # [b, nq, nk]
  assert np.any(kinds == pallas_mgpu.SKIP)
  band, far = _tile_regions(padded, BLOCK_Q, BLOCK_K)
  for region in (band, far):
    for kind in (pallas_mgpu.MASKED, pallas_mgpu.FULL):
      assert np.any((kinds == kind) & region[None]), (region, kind)
  q_block, k_tile = np.nonzero(np.any(kinds != pallas_mgpu.SKIP, axis=0) & far)
  assert np.any(k_tile * BLOCK_K > q_block * BLOCK_Q)
  assert np.any(k_tile * BLOCK_K < q_block * BLOCK_Q)


@pytest.mark.parametrize('offset_map', [
    reference.OffsetMap(), reference.OffsetMap(interpolation=0.5),
    reference.OffsetMap(extension=1.5)], ids=['as_trained', 'interpolate_half', 'extend_1.5'])
@pytest.mark.parametrize('block_q,block_k', [(64, 128), (64, 64), (128, 64)])
def test_band_bias_tiles_are_the_reference_bias(block_q, block_k, offset_map):
  """Every band tile of every query block: the tile of `band_bias_tiles` the kernel picks
  (`(k_start - q_start - deltas[0]) / gcd`) equals 'reference's materialized bias there; far
  tiles are one value per side. With a bias rule, the band widens to its `far`
  (tests/attention/bias_rules_test.py holds 'reference' to the written-out rule)."""
  heads, length = 2, 768
  table = jax.random.normal(jax.random.PRNGKey(3), (heads, reference.NUM_BUCKETS))
  full = np.asarray(reference.relative_position_bias(table, length, length, True,
                                                     offset_map=offset_map))[0]
  tiles = np.asarray(pallas_mgpu.band_bias_tiles(table, block_q, block_k, True, offset_map))
  deltas = pallas_mgpu.band_deltas(block_q, block_k, offset_map.far)
  assert tiles.shape == (heads, len(deltas), block_q, block_k)
  band, _ = _tile_regions(length, block_q, block_k, offset_map.far)
  lut = np.asarray(reference.bias_by_offset(table, True, offset_map))
  for qb, kb in np.ndindex(*band.shape):
    q0, k0 = qb * block_q, kb * block_k
    expected = full[:, q0:q0 + block_q, k0:k0 + block_k]
    if band[qb, kb]:
      index = (k0 - q0 - deltas[0]) // np.gcd(block_q, block_k)
      np.testing.assert_array_equal(tiles[:, index], expected)
    else:
      side = lut[:, -1] if k0 > q0 else lut[:, 0]
      np.testing.assert_array_equal(expected, np.broadcast_to(side[:, None, None], expected.shape))


CASES = {
    # name: (temperature, with_stats, length, exact_logits, offset_map)
    'per_head_tau_with_stats': (np.array([[0.6, 1.7], [1.3, 0.8]], np.float32), True, 300, True,
                                reference.OffsetMap()),
    'per_example_tau_no_stats': (np.array([0.6, 1.3], np.float32), False, 200, False,
                                 reference.OffsetMap()),
    # A bias rule: the band widened to 171 (s = 3/4), and 448 tokens still have far tiles.
    'interpolated_bias_with_stats': (np.array([[0.6, 1.7], [1.3, 0.8]], np.float32), True, 448,
                                     True, reference.OffsetMap(interpolation=0.75)),
}


def _check_interpret_case(case, interpret=True):
  """Runs CASES[case] (in interpret mode unless `interpret` is False) and checks it against
  'reference' (see `test_interpret_mode_matches_reference`)."""
  temperature, with_stats, length, exact_logits, offset_map = CASES[case]
  query, key, value, table = _inputs(length=length, exact_logits=exact_logits)
  ids = _segment_ids(length=length)
  kwargs = dict(rel_embedding=table, segment_ids=jnp.asarray(ids),
                temperature=jnp.asarray(temperature), dtype=jnp.bfloat16, with_stats=with_stats,
                offset_map=offset_map)
  with _interpret_mode():
    out, stats = pallas_mgpu.pallas_mgpu_attention(
        query, key, value, block_q=BLOCK_Q, block_k=BLOCK_K, interpret=interpret, **kwargs)
    out = np.float32(out)
  ref_out, ref_stats = reference.reference_self_attention(query, key, value, **kwargs)
  assert out.shape == ref_out.shape
  np.testing.assert_allclose(out, np.float32(ref_out), **BF16)
  pad = ids == 0
  uniform = np.broadcast_to(np.mean(np.float32(value), axis=1, keepdims=True), out.shape)
  np.testing.assert_allclose(out[pad], uniform[pad], **BF16)
  if not with_stats:
    assert stats is None
    return
  np.testing.assert_allclose(stats.pmax, ref_stats.pmax, **STATS)
  np.testing.assert_allclose(stats.entropy, ref_stats.entropy, **STATS)
  pad_rows = np.broadcast_to(pad[:, None], stats.pmax.shape)
  np.testing.assert_allclose(np.asarray(stats.entropy)[pad_rows], np.log(length), **STATS)


def _hopper() -> bool:
  """Whether jax's default device is a Hopper GPU (sm_90), where the kernel runs natively."""
  device = jax.devices()[0]
  return device.platform == 'gpu' and getattr(device, 'compute_capability', '') == '9.0'


@pytest.mark.skipif(jax.default_backend() != 'cpu', reason='interpret mode: the CPU backend')
@pytest.mark.skipif(jax.__version_info__ < (0, 12), reason=(
    "interpret mode's q.k runs through wgmma from jax 0.12 on (a plain dot before; 2 minutes on "
    'the 2-core CI machine): make test-newest-jax runs these cases'))
@pytest.mark.parametrize('case', CASES)
def test_interpret_mode_matches_reference(case):
  """bfloat16, a padded two-segment batch (lengths the kernel pads to its blocks), per-example or
  per-head taus, with and without row statistics: outputs to bfloat16 tolerance, P_max and
  entropy to float32's; padding rows uniform over the real keys. The first case has tiles of
  every kind (`test_the_test_input_has_tiles_of_every_kind`).

  NOTE: in a subprocess whose XLA CPU client has at least 8 threads (`NPROC`, read when jax
  starts its CPU backend). Interpret mode runs each of the kernel's three warpgroups as an XLA
  computation that blocks in host callbacks while it waits on a barrier; with XLA's default of
  one thread per core, two blocked warpgroups on a 2-core machine starve the third, and the
  kernel hangs (seen here, with and without the schedule barrier; faulthandler showed every
  thread waiting on a barrier or for an XLA thread).
  """
  root = pathlib.Path(__file__).resolve().parents[2]
  # tests/ for the helpers it imports (abstract_devices), as pytest's rootdir gives them.
  env = dict(os.environ, NPROC=str(max(8, os.cpu_count() or 1)),
             JAX_PLATFORMS=os.environ.get('JAX_PLATFORMS', 'cpu'),
             PYTHONPATH=os.pathsep.join([str(root / 'tests'), str(root),
                                         os.environ.get('PYTHONPATH', '')]))
  result = subprocess.run([sys.executable, __file__, case], env=env, cwd=root,
                          capture_output=True, text=True, timeout=1200)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
  assert f'ok {case}' in result.stdout


@pytest.mark.skipif(not _hopper(), reason='needs a Hopper GPU (sm_90)')
@pytest.mark.parametrize('case', CASES)
def test_native_kernel_matches_reference_on_hopper(case):
  """The compiled kernel (wgmma, TMA, approximate exp2) on the GPU: the interpret cases."""
  _check_interpret_case(case, interpret=False)


@pytest.mark.parametrize('with_stats', [True, False])
def test_kernel_lowers_for_sm90(with_stats):
  """The real kernel (wgmma, TMA, barriers; default blocks), lowered for CUDA under an abstract
  H100 without a GPU: Mosaic GPU's layout inference and lowering accept every operation."""
  batch, length, heads, depth = 2, 1000, 4, 64
  sds = jax.ShapeDtypeStruct
  qkv = [sds((batch, length, heads, depth), jnp.bfloat16)] * 3

  def attend(q, k, v, table, ids, tau):
    return pallas_mgpu.pallas_mgpu_attention(
        q, k, v, rel_embedding=table, segment_ids=ids, temperature=tau, dtype=jnp.bfloat16,
        with_stats=with_stats)

  with abstract_devices.abstract_gpu():
    lowered = jax.jit(attend).trace(
        *qkv, sds((heads, reference.NUM_BUCKETS), jnp.float32), sds((batch, length), jnp.int32),
        sds((batch, heads), jnp.float32)).lower(lowering_platforms=('cuda',))
  text = lowered.as_text()
  assert 'mosaic_gpu' in text


@pytest.mark.slow
@pytest.mark.parametrize('impl,dtype,kernel', [
    ('pallas_mgpu', jnp.bfloat16, 'mosaic_gpu'), ('pallas', jnp.bfloat16, 'mosaic_gpu'),
    ('pallas', jnp.float32, 'xla.gpu.triton')])
def test_model_encoder_lowers_with_it_for_sm90(impl, dtype, kernel):
  """The network (dispatch, layers, per-layer taus) lowers for an H100 with the kernel in every
  encoder layer: 'pallas_mgpu', and 'pallas' in bfloat16, are this Mosaic GPU kernel; 'pallas' in
  float32 is the Triton kernel ('pallas_gpu'), and nothing of the other."""
  from t5align import network  # pylint: disable=g-import-not-at-top
  config = network.T5Config(
      vocab_size=64, dtype=dtype, emb_dim=128, num_heads=2, head_dim=64, mlp_dim=128,
      num_encoder_layers=2, num_decoder_layers=1, dropout_rate=0.0, attention_impl=impl,
      encoder_attention_temperature=(0.8, 0.9),
      attention_options=(pallas_mgpu.Options(block_k=64, use_schedule_barrier=False),))
  model = network.Transformer(config)
  tokens = jax.ShapeDtypeStruct((2, 256), jnp.int32)
  # The parameters' shapes, from the same model with 'reference' (a CPU host may not run this one).
  plain = network.Transformer(dataclasses.replace(config, attention_impl='reference'))
  params = jax.eval_shape(lambda: plain.init(jax.random.PRNGKey(0), jnp.ones((2, 256), jnp.int32),
                                             jnp.ones((2, 4), jnp.int32),
                                             jnp.ones((2, 4), jnp.int32), enable_dropout=False))
  encode = jax.jit(lambda p, t: model.apply(p, t, method=model.encode, enable_dropout=False))
  with abstract_devices.abstract_gpu():
    text = encode.trace(params, tokens).lower(lowering_platforms=('cuda',)).as_text()
    chosen = network.encoder_attention_impl(config, 256)
  assert chosen == ('pallas_gpu' if kernel == 'xla.gpu.triton' else 'pallas_mgpu')
  # Mosaic GPU: one custom call per layer; Triton: the layers call one outlined kernel.
  assert text.count(kernel) >= (config.num_encoder_layers if kernel == 'mosaic_gpu' else 1)
  other = 'xla.gpu.triton' if kernel == 'mosaic_gpu' else 'mosaic_gpu'
  assert other not in text


BF, F16, F32 = jnp.bfloat16, jnp.float16, jnp.float32


@pytest.mark.parametrize('device_kind,input_dtype,dtype,head_dim,bidirectional,want', [
    ('NVIDIA H100 80GB HBM3', BF, BF, 64, True, 'pallas_mgpu'),
    ('NVIDIA H200', F16, F16, 128, True, 'pallas_mgpu'),
    ('NVIDIA GH200 480GB', BF, BF, 64, True, 'pallas_mgpu'),
    ('NVIDIA H20', BF, BF, 64, True, 'pallas_mgpu'),
    ('NVIDIA A100-SXM4-80GB', BF, BF, 64, True, 'pallas_gpu'),  # Not Hopper.
    ('NVIDIA H100 80GB HBM3', F32, F32, 64, True, 'pallas_gpu'),  # float32 stays float32.
    ('NVIDIA H100 80GB HBM3', BF, F32, 64, True, 'pallas_gpu'),  # Computed in float32.
    ('NVIDIA H100 80GB HBM3', BF, BF, 32, True, 'pallas_gpu'),  # Head dim not a multiple of 64.
    ('NVIDIA H100 80GB HBM3', BF, BF, 64, False, 'pallas_gpu'),  # The causal decoder.
])
def test_pallas_on_a_gpu_is_this_kernel_where_it_applies(device_kind, input_dtype, dtype,
                                                         head_dim, bidirectional, want):
  """'pallas' (and 'auto' above the threshold) on a GPU: this kernel on Hopper for bfloat16 /
  float16 encoders of head dims that are multiples of 64, else the Triton kernel; without the
  call's facts, the Triton kernel."""
  from t5align.attention import dispatch  # pylint: disable=g-import-not-at-top
  call = dict(input_dtype=input_dtype, dtype=dtype, head_dim=head_dim,
              bidirectional=bidirectional)
  with abstract_devices.abstract_gpu(device_kind):
    assert dispatch.resolve('pallas', 4096, 0, **call) == want
    assert dispatch.resolve('auto', 4096, 2048, **call) == want
    assert dispatch.resolve('auto', 2048, 2048, **call) == 'reference'
    assert dispatch.resolve('pallas', 4096, 0) == 'pallas_gpu'
    assert dispatch.resolve('pallas_gpu', 4096, 0, **call) == 'pallas_gpu'  # Named: kept.


def test_dispatch_refuses_it_on_the_cpu_and_the_config_checks_its_options():
  """On the CPU (where its interpret mode would hang a 2-core machine) the dispatch refuses it,
  naming what runs there; T5Config takes its Options, the switch as a bool only."""
  from t5align import network  # pylint: disable=g-import-not-at-top
  from t5align.attention import dispatch  # pylint: disable=g-import-not-at-top
  (query, key, value), kwargs = _small()
  if jax.default_backend() == 'cpu':
    with pytest.raises(ValueError, match="'pallas_mgpu' is the Hopper .* does not run on the CPU"):
      dispatch.self_attention(query, key, value, impl='pallas_mgpu', dtype=jnp.bfloat16, **kwargs)
  config = network.T5Config(vocab_size=32, attention_impl='pallas_mgpu',
                            attention_options=(pallas_mgpu.Options(block_q=128),))
  assert network.attention_options(config, 'pallas_mgpu') == pallas_mgpu.Options(block_q=128)
  with pytest.raises(ValueError, match='use_schedule_barrier must be True or False; got 1'):
    network.T5Config(vocab_size=32,
                     attention_options=(pallas_mgpu.Options(use_schedule_barrier=1),))


def _small(dtype=jnp.bfloat16):
  query, key, value, table = _inputs(length=64)
  query, key, value = (x.astype(dtype) for x in (query, key, value))
  return (query, key, value), dict(rel_embedding=table,
                                   segment_ids=jnp.asarray(_segment_ids(length=64)))


def test_refuses_float32():
  """float32 inputs, or float32 probabilities, are refused (wgmma has no full-precision float32),
  naming the kernels that compute them."""
  args, kwargs = _small(jnp.float32)
  with pytest.raises(ValueError, match="float32.*'pallas_gpu' or 'blockwise'"):
    pallas_mgpu.pallas_mgpu_attention(*args, dtype=jnp.float32, **kwargs)
  args, kwargs = _small()
  with pytest.raises(ValueError, match="'pallas_gpu' or 'blockwise' for float32"):
    pallas_mgpu.pallas_mgpu_attention(*args, dtype=jnp.float32, **kwargs)


def test_refuses_causal():
  args, kwargs = _small()
  with pytest.raises(ValueError, match="'pallas_gpu' or 'blockwise' for causal"):
    pallas_mgpu.pallas_mgpu_attention(*args, dtype=jnp.bfloat16, bidirectional=False, **kwargs)


def test_options_are_the_kernel_keywords():
  """`Options` fields are keywords of `pallas_mgpu_attention` (what a dispatch passes)."""
  import inspect  # pylint: disable=g-import-not-at-top
  params = inspect.signature(pallas_mgpu.pallas_mgpu_attention).parameters
  for field in dataclasses.fields(pallas_mgpu.Options):
    assert field.name in params
  assert pallas_mgpu.default_blocks() == (64, 128)


if __name__ == '__main__':
  _check_interpret_case(sys.argv[1])
  print(f'ok {sys.argv[1]}')
