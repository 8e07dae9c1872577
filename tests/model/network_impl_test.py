"""Tiny t5x encoder with attention_impl blockwise / the Pallas kernels equals the reference
encoder."""
from __future__ import annotations

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5align.attention import dispatch
from t5align import checkpoints
from t5align import network

pytestmark = pytest.mark.newest_jax

FIXTURE = pathlib.Path(__file__).parents[1] / 'testdata' / 't5x' / 't5_1_1_tiny'


@functools.cache
def _fixture():
  """(config, params, reference arrays): the t5x-written fixture checkpoint and its outputs."""
  params, config = checkpoints.load_params(str(FIXTURE / 'legacy' / 'checkpoint_0'))
  return config, params, dict(np.load(FIXTURE / 'reference.npz'))


def _encode(config, params, tokens, temperature):
  """Encoded `[b, l, e]` and sown row statistics `{pmax_sum, entropy_sum: [n, b, h], rows}`."""
  model = network.Transformer(config)
  encoded, state = model.apply({'params': params}, tokens, method=model.encode,
                               enable_dropout=False, temperature=temperature,
                               mutable=['intermediates'])
  return encoded, network.encoder_row_stats(state['intermediates'], config.num_encoder_layers)


# Per-example taus for both layers ([b, 1]), or one per layer (the config's tuple).
TAUS = {'per_example': (np.array([[0.6], [1.0]], np.float32), 1.0),
        'per_layer': (None, (0.7, 1.3))}


def _assert_matches_reference(config, params, tokens, tau, impl, block):
  """`impl` in `block` x `block` tiles equals 'reference' (outputs and row statistics);
  returns the reference statistics."""
  expected, expected_stats = _encode(config, params, tokens, tau)
  kind = dispatch.IMPLEMENTATIONS[dispatch.resolve(impl, 1, 0)].options
  options = kind(block_q=block, block_k=block)
  actual, stats = _encode(dataclasses.replace(config, attention_impl=impl,
                                              attention_options=(options,)), params, tokens, tau)
  np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
  for name in ('pmax_sum', 'entropy_sum', 'rows'):
    np.testing.assert_allclose(stats[name], expected_stats[name], rtol=1e-5, atol=1e-4)
  return expected_stats


@pytest.mark.slow
@pytest.mark.parametrize('impl,block,taus', [
    ('blockwise', 64, 'per_example'), ('blockwise', 512, 'per_example'),
    ('pallas_gpu', 64, 'per_example'),
    ('pallas', 128, 'per_example'), ('pallas', 128, 'per_layer')])  # CPU: the TPU kernel.
def test_encoder_matches_reference(impl, block, taus):
  config, params, ref = _fixture()
  tokens = ref['encoder_input_tokens']  # [2, 160]; example 1 is mostly padding.
  tau, config_tau = TAUS[taus]
  config = dataclasses.replace(config, encoder_attention_temperature=config_tau)
  _assert_matches_reference(config, params, tokens, tau, impl, block)


@pytest.mark.slow
@pytest.mark.parametrize('impl', ['blockwise', 'pallas'])  # CPU: 'pallas' is the TPU kernel.
def test_vmapped_calibration_stats_match_reference(impl):
  """Calibration-style sweep: 11 taus vmapped through the encoder, then mean stats."""
  config, params, ref = _fixture()
  tokens = ref['encoder_input_tokens']
  taus = np.linspace(1.0, 0.5, 11, dtype=np.float32)
  blocks = 128 if impl == 'pallas' else None  # blockwise: the backend's default.
  sweep_config = dataclasses.replace(
      config, attention_impl=impl,
      attention_options=(dispatch.IMPLEMENTATIONS[dispatch.resolve(impl, 1, 0)].options(
          block_q=blocks, block_k=blocks),))

  @jax.jit
  @jax.vmap
  def sweep(tau):
    return network.mean_row_stats(_encode(sweep_config, params, tokens, tau)[1])

  swept = sweep(jnp.asarray(taus))
  for i in (0, 5, 10):
    expected = network.mean_row_stats(_encode(config, params, tokens, float(taus[i]))[1])
    np.testing.assert_allclose(swept['layer_pmax'][i], expected['layer_pmax'], rtol=1e-5)
    np.testing.assert_allclose(swept['layer_entropy'][i], expected['layer_entropy'], rtol=1e-5)
  for i, name in ((0, '1.00'), (8, '0.60')):  # t5x's own numbers for the fixture's weights.
    np.testing.assert_allclose(swept['pmax'][i], ref[f'mean_pmax_tau{name}'], rtol=1e-5)
    np.testing.assert_allclose(swept['entropy'][i], ref[f'mean_entropy_tau{name}'], rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('threshold,expected_impl', [(160, 'reference'), (159, 'blockwise')])
def test_auto_dispatches_on_the_static_length(threshold, expected_impl, monkeypatch):
  """On CPU, 'auto' is 'reference' up to the threshold and 'blockwise' above it (on GPU / TPU
  the fused kernel: attention_test.test_dispatch_table)."""
  config, params, ref = _fixture()
  tokens = ref['encoder_input_tokens']  # [2, 160]
  called = []
  for name in ('reference', 'blockwise'):
    spec = dispatch.IMPLEMENTATIONS[name]
    traced = lambda *a, _fn=spec.fn, _name=name, **k: called.append(_name) or _fn(*a, **k)
    monkeypatch.setitem(dispatch.IMPLEMENTATIONS, name, dataclasses.replace(spec, fn=traced))
  auto = dataclasses.replace(config, attention_impl='auto', blockwise_threshold=threshold)
  actual, _ = _encode(auto, params, tokens, 0.8)
  assert set(called) == {expected_impl}
  expected, _ = _encode(dataclasses.replace(config, attention_impl=expected_impl), params,
                        tokens, 0.8)
  np.testing.assert_array_equal(actual, expected)


@pytest.mark.slow
@pytest.mark.parametrize('impl,block', [('blockwise', 64), ('pallas_gpu', 64), ('pallas', 128)])
def test_per_head_temperatures_match_reference(impl, block):
  """`[batch, layers, heads]` taus, every one different, through the whole encoder: blockwise
  and both fused kernels (interpret mode on CPU; 'pallas' is the TPU kernel there) equal the
  reference, outputs and per-head statistics."""
  config, params, ref = _fixture()
  tokens = ref['encoder_input_tokens']  # [2, 160]; example 1 is mostly padding.
  n, h = config.num_encoder_layers, config.num_heads
  tau = np.random.default_rng(3).uniform(0.5, 1.0, (2, n, h)).astype(np.float32)
  expected_stats = _assert_matches_reference(config, params, tokens, tau, impl, block)
  # The taus matter per head: one layer-wide tau (their mean) gives other statistics.
  _, flat = _encode(config, params, tokens, tau.mean(-1))
  assert np.abs(np.asarray(flat['pmax_sum']) - np.asarray(expected_stats['pmax_sum'])).max() > 1e-2


def test_attention_options_are_per_implementation_and_checked():
  from t5align.attention import blockwise  # pylint: disable=g-import-not-at-top
  from t5align.attention import pallas_gpu  # pylint: disable=g-import-not-at-top
  from t5align.attention import pallas_tpu  # pylint: disable=g-import-not-at-top
  tiles = blockwise.Options(block_q=16, block_k=32)
  tpu = pallas_tpu.Options(vmem_limit_bytes=1 << 20)
  config = network.T5Config(vocab_size=32, attention_options=[tiles, tpu])
  assert config.attention_options == (tiles, tpu)  # A tuple: the config stays hashable.
  assert network.attention_options(config, 'blockwise') == tiles
  assert network.attention_options(config, 'pallas_tpu') == tpu
  assert network.attention_options(config, 'pallas_gpu') == pallas_gpu.Options()  # Defaults.
  assert network.attention_options(config, 'reference') is None
  with pytest.raises(ValueError, match=r"gives 'blockwise' options twice"):
    network.T5Config(vocab_size=32, attention_options=(tiles, blockwise.Options()))
  with pytest.raises(ValueError, match=r'is not the Options of an attention implementation'):
    network.T5Config(vocab_size=32, attention_options=({'block_q': 16},))
  with pytest.raises(ValueError, match=r'pallas_gpu num_warps must be a positive int; got 0'):
    network.T5Config(vocab_size=32, attention_options=(pallas_gpu.Options(num_warps=0),))
