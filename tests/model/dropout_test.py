"""Encoder self-attention dropout: t5x's mask and scaling, in 'reference' and 'blockwise'.

The expected values are a numpy float64 re-derivation of t5x/examples/t5/layers.py's attention
with dropout: softmax, then `* bernoulli(rng, 1 - rate, [b, h, 1, k]) / (1 - rate)`, with `rng` the
attention module's `make_rng('dropout')` (obtained through flax itself, from a probe module) and
T5 buckets from the t5x-written fixture.
"""
from __future__ import annotations

import pathlib

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5align.attention import blockwise
from t5align.attention import dispatch
from t5align.attention import reference
from t5align import layers
from t5align import network

FIXTURE = pathlib.Path(__file__).parents[1] / 'testdata' / 't5x' / 't5_1_1_tiny' / 'reference.npz'
RATE = 0.5
BATCH, LENGTH, HEADS, DEPTH, EMBED = 2, 40, 2, 8, 16


class _RngProbe(nn.Module):
  """Returns the key a root module's first `make_rng('dropout')` gives, as the attention's."""

  @nn.compact
  def __call__(self):
    return self.make_rng('dropout')


def _numpy_attention(params, x, ids, tau, table, keep):
  """float64 t5x attention over `[b, l, e]` x; `keep` is None or the `[b, h, 1, l]` bool mask."""
  ref = np.load(FIXTURE)
  offsets = list(ref['relpos_offsets'])
  buckets_of = ref['relpos_bucket_bidirectional'][0]  # [601]
  pos = np.arange(LENGTH)
  # [q, k] buckets of key - query offsets, from t5x's own bucketing.
  buckets = buckets_of[np.asarray([[offsets.index(k - q) for k in pos] for q in pos])]
  kernel = lambda name: np.float64(params[name]['kernel'])
  x = np.float64(x)
  q, k, v = (np.einsum('ble,ef->blf', x, kernel(n)).reshape(BATCH, LENGTH, HEADS, DEPTH)
             for n in ('query', 'key', 'value'))
  # [b, h, q, k]
  logits = np.einsum('bqhd,bkhd->bhqk', q, k) + np.float64(table)[:, buckets][None]
  allowed = ((ids[:, :, None] == ids[:, None, :]) & (ids[:, :, None] > 0))[:, None]
  s = logits / tau[:, None, None, None]
  e = np.where(allowed, np.exp(s - np.max(s, axis=-1, keepdims=True)), 0.0)
  # Rows without any key to attend to (padding queries) are uniform, as in t5x.
  some = allowed.any(-1, keepdims=True)
  probs = np.where(some, e / np.where(some, e.sum(-1, keepdims=True), 1.0), 1.0 / LENGTH)
  if keep is not None:
    probs = probs * keep / (1.0 - RATE)
  out = np.einsum('bhqk,bkhd->bqhd', probs, v).reshape(BATCH, LENGTH, HEADS * DEPTH)
  return out @ kernel('out')


def _inputs():
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  x = jax.random.normal(keys[0], (BATCH, LENGTH, EMBED))
  table = jax.random.normal(keys[1], (HEADS, reference.NUM_BUCKETS))
  ids = np.zeros((BATCH, LENGTH), np.int32)
  ids[0, :15], ids[0, 15:35] = 1, 2  # Two packed segments, then padding.
  ids[1, :25] = 1
  tau = np.array([0.7, 1.3], np.float32)
  return x, table, ids, tau


@pytest.mark.slow
@pytest.mark.parametrize('impl', ['reference', 'blockwise'])
def test_attention_dropout_is_t5x_s(impl):
  # Blocks of 16 over 40 positions: several key blocks, and internal padding of the last one.
  x, table, ids, tau = _inputs()
  options = {'reference': None, 'blockwise': blockwise.Options(block_q=16, block_k=16)}[impl]
  module = layers.MultiHeadDotProductAttention(
      num_heads=HEADS, head_dim=DEPTH, dropout_rate=RATE, attention_impl=impl, options=options)
  rng = np.random.default_rng(1)
  kernel = lambda *shape: rng.normal(scale=0.3, size=shape).astype(np.float32)
  params = {**{n: {'kernel': kernel(EMBED, HEADS * DEPTH)} for n in ('query', 'key', 'value')},
            'out': {'kernel': kernel(HEADS * DEPTH, EMBED)}}
  apply = jax.jit(lambda deterministic, rng: module.apply(
      {'params': params}, x, x, deterministic=deterministic, rngs={'dropout': rng},
      mutable=['intermediates'], rel_embedding=table, segment_ids=ids, temperature=tau),
                  static_argnums=0)
  rng = jax.random.PRNGKey(7)
  (dropped, state), (plain, plain_state) = apply(False, rng), apply(True, rng)

  dropout_key = _RngProbe().apply({}, rngs={'dropout': rng})
  # t5x's draw, written out: bernoulli(keep_prob) over [b, h, 1, k], broadcast over queries.
  keep = np.asarray(jax.random.bernoulli(dropout_key, 1.0 - RATE, (BATCH, HEADS, 1, LENGTH)))
  assert 0 < keep.sum() < keep.size
  np.testing.assert_allclose(dropped, _numpy_attention(params, x, ids, tau, table, keep),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(plain, _numpy_attention(params, x, ids, tau, table, None),
                             rtol=1e-5, atol=1e-5)
  assert np.max(np.abs(np.asarray(dropped) - np.asarray(plain))) > 0.1
  # Row statistics are the softmax's, taken before dropout.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
               state['intermediates'], plain_state['intermediates'])


def _tiny_config(**kw):
  return network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, num_encoder_layers=2,
                          num_decoder_layers=1, head_dim=8, mlp_dim=32,
                          mlp_activations=('gelu', 'linear'), dropout_rate=RATE, **kw)


def _random_params(config):
  """Random float32 params shaped like `config`'s (running the init eagerly is slow on CPU)."""
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda s: rng.normal(scale=0.5, size=s.shape).astype(np.float32),
                      network.param_shapes(config))


@pytest.mark.slow
def test_encoder_dropout_same_in_reference_and_blockwise():
  tokens = np.array(jax.random.randint(jax.random.PRNGKey(2), (BATCH, LENGTH), 1, 64))
  tokens[1, 30:] = 0
  params = _random_params(_tiny_config())
  encoded = {}
  for impl in ('reference', 'blockwise'):
    kind = dispatch.IMPLEMENTATIONS[impl].options
    options = () if kind is None else (kind(block_q=16, block_k=16),)
    model = network.Transformer(_tiny_config(attention_impl=impl, attention_options=options))
    encoded[impl] = jax.jit(lambda p, r, model=model: model.apply(
        {'params': p}, tokens, enable_dropout=True, method=model.encode, rngs={'dropout': r}))(
            params, jax.random.PRNGKey(4))
  np.testing.assert_allclose(encoded['blockwise'], encoded['reference'], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('impl,kernel', [
    ('pallas', 'pallas_tpu'),  # CPU: 'pallas' is the TPU kernel (interpret mode).
    ('pallas_gpu', 'pallas_gpu'), ('pallas_tpu', 'pallas_tpu')])
def test_pallas_refuses_attention_dropout(impl, kernel):
  config = _tiny_config(attention_impl=impl)
  params = _random_params(config)
  model = network.Transformer(config)
  tokens = jnp.ones((1, 16), jnp.int32)
  with pytest.raises(ValueError, match=rf"attention_impl='{kernel}' does not implement attention "
                                       r'dropout.*dropout_rate=0.5'):
    model.apply({'params': params}, tokens, enable_dropout=True, method=model.encode,
                rngs={'dropout': jax.random.PRNGKey(4)})
