"""The TPU kernel (attention/pallas_tpu.py): Mosaic compiles for a TPU topology without a TPU;
its tiles.

Deviceless compiles need libtpu (`pip install "jax[tpu]"`); without it those tests skip. Numerical
equality with 'reference' in interpret mode: tests/attention/attention_test.py (every case of
CASES) and tests/model/network_impl_test.py (through the model, per-example and per-layer taus).
"""
from __future__ import annotations

import importlib.util
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5align.attention import dispatch
from t5align.attention import pallas_tpu
from t5align.attention import reference
from t5align import network
from t5align import partitioning

pytestmark = pytest.mark.newest_jax

# NOTE: libtpu refuses to start while another process holds its lock file; a deviceless compile
# uses no TPU, so several may run side by side.
os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec('libtpu') is None,
    reason='libtpu is not installed (pip install "jax[tpu]"): no deviceless TPU compile')
TOPOLOGY = 'v5e:2x2'


def _tpu_mesh():
  """('data', 'model') = (2, 2) over the devices of a v5e:2x2 topology (no runtime)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  devices = topologies.get_topology_desc(topology_name=TOPOLOGY, platform='tpu').devices
  return partitioning.eval_mesh(num_partitions=2, devices=devices)


@pytest.mark.tpu_compile
@needs_libtpu
def test_the_mesh_picks_the_tpu_kernel():
  """Under a TPU mesh on this CPU host the target platform is 'tpu': 'pallas' and 'auto' above
  the threshold are the Mosaic kernel."""
  with jax.set_mesh(_tpu_mesh()):
    assert reference.target_platform() == 'tpu'
    assert dispatch.resolve('pallas', 1000, 512) == 'pallas_tpu'
    assert dispatch.resolve('auto', 1000, 512) == 'pallas_tpu'
  assert reference.target_platform() == jax.default_backend()


@pytest.mark.tpu_compile
@needs_libtpu
def test_model_compiles_the_mosaic_kernel_for_tpu():
  """The tiny model's encoder with row statistics, attention_impl='pallas', bfloat16, sharded over
  v5e:2x2 (data 2 x model 2), compiled by XLA's TPU compiler with Mosaic: the attention is one
  Mosaic custom call, and no buffer is `[L, L]`-sized."""
  length = 1000  # Not a multiple of the 512-query blocks.
  config = network.T5Config(
      vocab_size=128, emb_dim=64, num_heads=4, num_encoder_layers=2, num_decoder_layers=1,
      head_dim=64, mlp_dim=128, dropout_rate=0.0, dtype='bfloat16', attention_impl='pallas')
  model = network.Transformer(config)
  mesh = _tpu_mesh()
  params = jax.tree.map(lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                                                 sharding=sharding),
                        network.param_shapes(config), partitioning.param_shardings(config, mesh))
  tokens = jax.ShapeDtypeStruct((2, length), jnp.int32,
                                sharding=partitioning.batch_sharding(mesh, 2))

  def encode(params, tokens):
    encoded, state = model.apply({'params': params}, tokens, method=model.encode,
                                 enable_dropout=False, mutable=['intermediates'])
    stats = network.encoder_row_stats(state['intermediates'], config.num_encoder_layers)
    return encoded, network.mean_row_stats(stats)

  compiled = partitioning.partition(encode, mesh).lower(params, tokens).compile()
  text = compiled.as_text()
  # One Mosaic kernel per layer, nothing else custom.
  calls = re.findall(r'custom_call_target="([^"]+)"', text)
  assert calls.count('tpu_custom_call') == config.num_encoder_layers, calls
  assert text.count('t5_relpos_attention_tpu') >= config.num_encoder_layers
  # No array anywhere with two axes of (padded) sequence length.
  shapes = [[int(d) for d in dims.split(',') if d] for dims in re.findall(r'\w\[([\d,]*)\]', text)]
  assert not [s for s in shapes if sum(d >= length for d in s) >= 2]
  heads_per_chip = config.num_heads // 2
  assert compiled.memory_analysis().temp_size_in_bytes < heads_per_chip * length * length


def _ids(pattern, length):
  """`[b, l]` segment ids from `[(segment id, tokens), ...]` per example; the rest padding."""
  ids = np.zeros((len(pattern), length), np.int32)
  for row, segments in zip(ids, pattern):
    start = 0
    for segment, size in segments:
      row[start:start + size] = segment
      start += size
  return ids


@pytest.mark.slow
@pytest.mark.parametrize('bidirectional', [True, False])
def test_skipped_and_unmasked_tiles_match_reference(bidirectional):
  """Interpret mode, 128 x 128 tiles over 520 tokens: example 0 packs three segments (its first
  query block never meets the third segment: skipped tiles, key blocks not fetched), example 1
  is one segment without padding (every tile but the causal diagonal runs unmasked), example 2
  is padding from token 100 on (padding-only blocks skipped; padding rows uniform)."""
  length, heads, depth = 520, 2, 16
  keys = jax.random.split(jax.random.PRNGKey(3), 4)
  q, k, v = (jax.random.normal(key, (3, length, heads, depth)) for key in keys[:3])
  table = jax.random.normal(keys[3], (heads, reference.NUM_BUCKETS))
  ids = _ids([[(1, 128), (2, 172), (3, 200)], [(1, length)], [(1, 100)]], length)
  kwargs = dict(rel_embedding=table, segment_ids=jnp.asarray(ids), bidirectional=bidirectional,
                temperature=jnp.asarray([0.7, 1.1, 0.9]), with_stats=True)
  out, stats = pallas_tpu.pallas_tpu_attention(q, k, v, block_q=128, block_k=128,
                                               interpret=True, **kwargs)
  ref_out, ref_stats = reference.reference_self_attention(q, k, v, **kwargs)
  np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(stats.pmax, ref_stats.pmax, rtol=1e-5, atol=1e-5)
  valid = np.broadcast_to((ids > 0)[:, None, :], stats.entropy.shape)
  np.testing.assert_allclose(np.asarray(stats.entropy)[valid],
                             np.asarray(ref_stats.entropy)[valid], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(stats.entropy)[~valid], np.log(length), rtol=1e-5)


def test_a_wide_bias_band_picks_blocks_whose_band_fits_vmem():
  """A bias rule's band (`OffsetMap.far`) sets the default blocks: 512 x 512 for T5's (3 band
  tiles, 3 MiB), smaller where 512 x 512 would overflow Mosaic's scoped VMEM; explicit blocks
  that do not fit are refused naming the band and what to change."""
  wide = reference.BiasRule('interpolate', reference_length=512).at(16384)  # s = 1/32
  assert wide.far == 4080
  assert pallas_tpu.default_blocks() == (512, 512)
  assert pallas_tpu.band_bytes(512, 512, 128) == 3 * 2 ** 20
  assert pallas_tpu.band_bytes(512, 512, wide.far) == 17 * 2 ** 20  # Over 16 MiB.
  assert pallas_tpu.default_blocks(far=wide.far) == (128, 128)
  assert pallas_tpu.default_blocks(far=reference.BiasRule(
      'extend', reference_length=512).at(8192).far) == (256, 256)  # far 2048: 4.25 MiB
  q = jnp.zeros((1, 1024, 1, 128), jnp.float32)
  with pytest.raises(ValueError, match=r'pallas_tpu blocks 512 x 512: the bias band of '
                                       r'OffsetMap\(interpolation=0.03125.*\|offset\| < 4080\) '
                                       r'takes 17.0 MiB'):
    pallas_tpu.pallas_tpu_attention(
        q, q, q, rel_embedding=jnp.zeros((1, 32)), segment_ids=jnp.ones((1, 1024), jnp.int32),
        block_q=512, block_k=512, interpret=True, offset_map=wide)


@pytest.mark.tpu_compile
@needs_libtpu
def test_a_wide_bias_band_compiles_for_tpu():
  """At 16k tokens with s = L_tr / L = 1/32, the kernel with its default blocks compiles for a
  v5e chip (512 x 512 blocks overflow its scoped VMEM: CompileTimeScopedVmemOom)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  device = topologies.get_topology_desc(topology_name=TOPOLOGY, platform='tpu').devices[0]
  mesh = jax.sharding.Mesh([device], ('x',))
  wide = reference.BiasRule('interpolate', reference_length=512).at(16384)
  length, heads, depth = 16384, 8, 64
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=replicated)
  qkv = [sds((1, length, heads, depth), jnp.bfloat16)] * 3

  def attend(q, k, v, table, ids, tau):
    return pallas_tpu.pallas_tpu_attention(q, k, v, rel_embedding=table, segment_ids=ids,
                                           temperature=tau, dtype=jnp.bfloat16, with_stats=True,
                                           offset_map=wide)

  with jax.set_mesh(mesh):
    compiled = jax.jit(attend).lower(*qkv, sds((heads, 32), jnp.float32),
                                     sds((1, length), jnp.int32),
                                     sds((1, heads), jnp.float32)).compile()
  assert 'tpu_custom_call' in compiled.as_text()
