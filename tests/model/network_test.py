"""Network tests: t5x fixtures (outputs, logits, statistics, greedy), parameter tree, temperature
forms, and the row statistics of an all-padding batch refused."""
from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5align import decoding
from t5align import network
from t5align.attention import reference

pytestmark = pytest.mark.newest_jax

TAUS = ('1.00', '0.80', '0.60')
FIXTURES = ('t5_1_1_tiny', 't5_1_0_tiny')
# Measured against the t5x fixtures on the project's 2-core CPU (float32, both fixtures, every tau,
# 1.0 included; XLA's CPU kernels do not reproduce t5x's float32 rounding exactly): encoded and
# logits differ by at most 1.67e-6 absolute, row statistics by at most 2.3e-7 relative. The
# tolerances sit just above. Greedy tokens and relative-position buckets are compared exactly.
ATOL = 3e-6
STATS_RTOL = 5e-7


@pytest.fixture(scope='module', params=FIXTURES)
def fixture(request, load_t5x_fixture):
  return load_t5x_fixture(request.param)


def _encode(config, params, tokens, **kwargs):
  model = network.Transformer(config)
  return model.apply({'params': params}, tokens, enable_dropout=False, method=model.encode,
                     **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize('tau', TAUS)
def test_encoder_and_logits_match_t5x(fixture, tau):
  config, params, ref = fixture
  model = network.Transformer(config)
  logits, variables = model.apply(
      {'params': params}, ref['encoder_input_tokens'], ref['decoder_input_tokens'],
      ref['decoder_target_tokens'], enable_dropout=False, temperature=float(tau),
      mutable=['intermediates'])
  encoded = _encode(config, params, ref['encoder_input_tokens'], temperature=float(tau))
  np.testing.assert_allclose(encoded, ref[f'encoded_tau{tau}'], rtol=0, atol=ATOL)
  np.testing.assert_allclose(logits, ref[f'logits_tau{tau}'], rtol=0, atol=ATOL)
  stats = network.mean_row_stats(
      network.encoder_row_stats(variables['intermediates'], config.num_encoder_layers))
  np.testing.assert_allclose(stats['layer_pmax'], ref[f'layer_pmax_tau{tau}'], rtol=STATS_RTOL)
  np.testing.assert_allclose(stats['layer_entropy'], ref[f'layer_entropy_tau{tau}'],
                             rtol=STATS_RTOL)
  np.testing.assert_allclose(stats['pmax'], ref[f'mean_pmax_tau{tau}'], rtol=STATS_RTOL)
  np.testing.assert_allclose(stats['entropy'], ref[f'mean_entropy_tau{tau}'], rtol=STATS_RTOL)


@pytest.mark.parametrize('tau', TAUS)
def test_config_temperature_equals_call_override(fixture, tau):
  config, params, ref = fixture
  tempered = dataclasses.replace(config, encoder_attention_temperature=float(tau))
  np.testing.assert_allclose(_encode(tempered, params, ref['encoder_input_tokens']),
                             ref[f'encoded_tau{tau}'], rtol=0, atol=ATOL)


def test_greedy_decode_matches_t5x(fixture):
  config, params, ref = fixture
  expected = ref['greedy_tokens_tau1.00']
  tokens = decoding.greedy_decode(network.Transformer(config), params,
                                  ref['encoder_input_tokens'],
                                  max_decode_length=expected.shape[1])
  np.testing.assert_array_equal(tokens, expected)


@pytest.mark.slow
def test_greedy_decode_stops_at_eos(fixture):
  config, params, ref = fixture
  model = network.Transformer(config)
  tokens = ref['encoder_input_tokens']
  free = np.asarray(decoding.greedy_decode(model, params, tokens, max_decode_length=6))
  # Declare the token greedy decoding emits at step 2 of row 0 to be EOS: row 0 must stop there
  # (EOS kept, zeros after), row 1 continues unchanged until its own first occurrence.
  eos = int(free[0, 2])
  stopped = np.asarray(decoding.greedy_decode(model, params, tokens, max_decode_length=6,
                                              eos_id=eos))
  expected = free.copy()
  for row in range(expected.shape[0]):
    hits = np.nonzero(expected[row] == eos)[0]
    if hits.size:
      expected[row, hits[0] + 1:] = 0
  np.testing.assert_array_equal(stopped, expected)
  first = int(np.nonzero(free[0] == eos)[0][0])  # <= 2 by construction
  assert stopped[0, first] == eos and not stopped[0, first + 1:].any()


def test_per_layer_and_per_example_temperatures(fixture):
  config, params, ref = fixture
  tokens = ref['encoder_input_tokens']
  n = config.num_encoder_layers
  np.testing.assert_allclose(_encode(config, params, tokens, temperature=np.full((1, n), 0.8)),
                             ref['encoded_tau0.80'], rtol=0, atol=ATOL)
  # One tau per example: row b of the output equals a run of the whole batch at that tau.
  per_example = np.array([[0.6], [1.0]], np.float32)  # [batch, 1]
  out = _encode(config, params, tokens, temperature=per_example)
  np.testing.assert_allclose(out[0], ref['encoded_tau0.60'][0], rtol=0, atol=ATOL)
  np.testing.assert_allclose(out[1], ref['encoded_tau1.00'][1], rtol=0, atol=ATOL)
  # Layers at different taus differ from any uniform tau.
  mixed = _encode(config, params, tokens, temperature=np.array([[0.6] + [1.0] * (n - 1)]))
  assert np.abs(np.asarray(mixed) - ref['encoded_tau0.60']).max() > 1e-3
  assert np.abs(np.asarray(mixed) - ref['encoded_tau1.00']).max() > 1e-3


def test_vmap_over_temperature_and_jit_match_loop(fixture):
  config, params, ref = fixture
  tokens = ref['encoder_input_tokens']
  taus = jnp.array([float(t) for t in TAUS])
  encode = jax.jit(lambda tau: _encode(config, params, tokens, temperature=tau))
  stacked = jax.vmap(encode)(taus)
  for i, tau in enumerate(TAUS):
    np.testing.assert_allclose(stacked[i], ref[f'encoded_tau{tau}'], rtol=0, atol=ATOL)


@pytest.mark.slow
def test_padding_rows_and_segments():
  config = network.T5Config(vocab_size=32, emb_dim=16, num_heads=2, num_encoder_layers=1,
                            num_decoder_layers=1, head_dim=8, mlp_dim=32, dropout_rate=0.0)
  params = network.init_variables(config, jax.random.PRNGKey(1))['params']
  rng = np.random.default_rng(0)
  a, b = rng.integers(2, 32, size=5), rng.integers(2, 32, size=7)
  packed = np.concatenate([a, b, [0, 0]])[None]
  segments = np.array([[1] * 5 + [2] * 7 + [0, 0]])
  out = _encode(config, params, packed, encoder_segment_ids=segments)
  # Packed examples are independent: each equals the example encoded alone.
  np.testing.assert_allclose(out[0, :5], _encode(config, params, a[None])[0], rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(out[0, 5:12], _encode(config, params, b[None])[0], rtol=1e-5,
                             atol=1e-5)


@pytest.mark.slow
def test_param_tree_and_axes():
  config = network.T5Config(vocab_size=10, emb_dim=6, num_heads=2, num_encoder_layers=1,
                            num_decoder_layers=1, head_dim=3, mlp_dim=5,
                            mlp_activations=('gelu', 'linear'))
  variables = network.init_variables(config, jax.random.PRNGKey(0))
  # init returns exactly what t5x's train state holds: params and their logical axes.
  assert set(variables) == {'params', 'params_axes'}
  attn = {n: {'kernel': (6, 6)} for n in ('query', 'key', 'value', 'out')}
  mlp = {'wi_0': {'kernel': (6, 5)}, 'wi_1': {'kernel': (6, 5)}, 'wo': {'kernel': (5, 6)}}
  expected = {
      'token_embedder': {'embedding': (10, 6)},
      'encoder': {
          'relpos_bias': {'rel_embedding': (2, 32)},
          'layers_0': {'pre_attention_layer_norm': {'scale': (6,)}, 'attention': attn,
                       'pre_mlp_layer_norm': {'scale': (6,)}, 'mlp': mlp},
          'encoder_norm': {'scale': (6,)},
      },
      'decoder': {
          'relpos_bias': {'rel_embedding': (2, 32)},
          'layers_0': {'pre_self_attention_layer_norm': {'scale': (6,)}, 'self_attention': attn,
                       'pre_cross_attention_layer_norm': {'scale': (6,)},
                       'encoder_decoder_attention': attn,
                       'pre_mlp_layer_norm': {'scale': (6,)}, 'mlp': mlp},
          'decoder_norm': {'scale': (6,)},
          'logits_dense': {'kernel': (6, 10)},
      },
  }
  assert jax.tree.map(lambda x: x.shape, variables['params']) == expected
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(variables['params']))
  axes = variables['params_axes']
  assert axes['token_embedder']['embedding_axes'].names == ('vocab', 'embed')
  assert axes['encoder']['relpos_bias']['rel_embedding_axes'].names == ('heads', 'relpos_buckets')
  layer = axes['encoder']['layers_0']
  assert layer['attention']['query']['kernel_axes'].names == ('embed', 'joined_kv')
  assert layer['attention']['out']['kernel_axes'].names == ('joined_kv', 'embed')
  assert layer['mlp']['wi_0']['kernel_axes'].names == ('embed', 'mlp')
  assert layer['mlp']['wo']['kernel_axes'].names == ('mlp', 'embed')
  assert layer['pre_mlp_layer_norm']['scale_axes'].names == ('embed',)
  assert axes['decoder']['logits_dense']['kernel_axes'].names == ('embed', 'vocab')
  tied = dataclasses.replace(config, logits_via_embedding=True)
  assert 'logits_dense' not in network.param_shapes(tied)['decoder']


@pytest.mark.parametrize('bad', [0.0, -0.5, float('nan'), float('inf')])
def test_bad_temperature_in_config(bad):
  with pytest.raises(ValueError, match=rf'^network\.T5Config\.encoder_attention_temperature = '
                                       rf'{bad!r}: expected a temperature, finite and > 0, in '
                                       r'float32 too .* '
                                       rf'\({bad!r} is not\)\.$'):
    network.T5Config(vocab_size=8, encoder_attention_temperature=bad)


@pytest.mark.parametrize('bad', [0.0, -1.0, float('nan')])
def test_bad_temperature_in_call(fixture, bad):
  config, params, ref = fixture
  with pytest.raises(ValueError,
                     match=r'temperature must be finite and > 0.*; got \[(0.0|-1.0|nan)'):
    _encode(config, params, ref['encoder_input_tokens'], temperature=bad)


@pytest.mark.slow
def test_temperature_shape_errors():
  config = network.T5Config(vocab_size=8, emb_dim=4, num_heads=1, num_encoder_layers=2,
                            num_decoder_layers=1, head_dim=4, mlp_dim=4)
  params = network.init_variables(config, jax.random.PRNGKey(0))['params']
  tokens = np.ones((2, 3), np.int32)
  with pytest.raises(ValueError, match=r'ambiguous.*Pass shape \(2, 1\)'):
    _encode(config, params, tokens, temperature=np.array([0.9, 0.8]))
  with pytest.raises(ValueError, match=r'matches neither batch=2 nor num_encoder_layers=2'):
    _encode(config, params, tokens, temperature=np.array([0.9, 0.8, 0.7]))
  with pytest.raises(ValueError, match=r'has shape \(3,\); expected one float, '
                                      r'num_encoder_layers=2 values, or \[num_encoder_layers=2\]'
                                      r'\[num_heads=8\]'):
    network.T5Config(vocab_size=8, num_encoder_layers=2,
                     encoder_attention_temperature=(0.9, 0.8, 0.7))
  with pytest.raises(ValueError, match=r"^network\.T5Config\.attention_impl = 'flash': expected "
                                       r"one of 'reference', 'blockwise'"):
    network.T5Config(vocab_size=8, attention_impl='flash')


# `layer_temperatures` with 2 layers, 3 heads, a batch of 4: every accepted form and the
# float32 `[1 or batch, layers, 1 or heads]` array it becomes, written out.
_CONSTANT_FORMS = {
    'scalar': (0.8, [[[0.8], [0.8]]]),
    'one_for_every_layer': ((0.9,), [[[0.9], [0.9]]]),
    'per_layer': ((0.9, 0.7), [[[0.9], [0.7]]]),
    'per_layer_and_head': (((0.9, 0.8, 0.7), (0.6, 0.5, 0.4)), [[[0.9, 0.8, 0.7],
                                                                   [0.6, 0.5, 0.4]]]),
}
_CALL_FORMS = {
    'scalar': (0.8, [[[0.8], [0.8]]]),
    'per_layer': (np.array([0.9, 0.7]), [[[0.9], [0.7]]]),
    'per_example': (np.array([0.6, 0.7, 0.8, 0.9]), [[[0.6]] * 2, [[0.7]] * 2, [[0.8]] * 2,
                                                      [[0.9]] * 2]),
    'one_vector': (np.array([0.5]), [[[0.5], [0.5]]]),
    'batch_by_one': (np.array([[0.6], [0.7], [0.8], [0.9]]), [[[0.6]] * 2, [[0.7]] * 2,
                                                               [[0.8]] * 2, [[0.9]] * 2]),
    'one_by_layers': (np.array([[0.9, 0.7]]), [[[0.9], [0.7]]]),
    'batch_by_layers': (np.array([[0.9, 0.7], [0.8, 0.6], [1.0, 0.5], [0.4, 0.3]]),
                        [[[0.9], [0.7]], [[0.8], [0.6]], [[1.0], [0.5]], [[0.4], [0.3]]]),
    'one_by_layers_by_heads': (np.array([[[0.9, 0.8, 0.7], [0.6, 0.5, 0.4]]]),
                               [[[0.9, 0.8, 0.7], [0.6, 0.5, 0.4]]]),
    'batch_by_one_by_heads': (np.array([[[0.9, 0.8, 0.7]], [[0.6, 0.5, 0.4]]] * 2),
                              [[[0.9, 0.8, 0.7]] * 2, [[0.6, 0.5, 0.4]] * 2] * 2),
}


@pytest.mark.parametrize('constant, form', [(True, k) for k in _CONSTANT_FORMS] +
                         [(False, k) for k in _CALL_FORMS])
def test_layer_temperatures_forms(constant, form):
  """Each form becomes the written-out `[1 or b, n, 1 or h]` float32 array, eagerly and traced;
  the layer's slice passes the attention's `head_temperature` unchanged."""
  value, expected = (_CONSTANT_FORMS if constant else _CALL_FORMS)[form]
  expected = np.array(expected, np.float32)
  tau = network.layer_temperatures(value, 2, 4, 3, constant=constant)
  assert tau.dtype == jnp.float32 and tau.shape == expected.shape
  np.testing.assert_array_equal(tau, expected)
  if not constant:  # Traced (jit, vmap): the same, its values unchecked.
    traced = jax.jit(lambda t: network.layer_temperatures(t, 2, 4, 3))(jnp.asarray(value))
    np.testing.assert_array_equal(traced, expected)
  for i in range(2):
    np.testing.assert_array_equal(reference.head_temperature(tau[:, i], 4, 3), expected[:, i])


def test_head_temperature_of_direct_callers():
  """None, a scalar and a `[batch]` vector (the attention's direct callers) -> `[1 or b, 1]`."""
  np.testing.assert_array_equal(reference.head_temperature(None, 4, 3), [[1.0]])
  np.testing.assert_array_equal(reference.head_temperature(0.5, 4, 3), np.float32([[0.5]]))
  np.testing.assert_array_equal(reference.head_temperature(np.array([0.6, 0.7, 0.8, 0.9]), 4, 3),
                                np.float32([[0.6], [0.7], [0.8], [0.9]]))
  for bad in (np.ones(3), np.ones((1, 1, 1))):
    with pytest.raises(ValueError, match=r'expected \[1 or batch=4, 1 or heads=3\], a scalar'):
      reference.head_temperature(bad, 4, 3)


@pytest.mark.parametrize('value, kwargs, message', [
    # The config's constant: no batch axis, at most [layers][heads].
    ((0.9, 0.8, 0.7), dict(constant=True), r'config_tau of shape \(3,\) does not broadcast to '
     r'\[num_encoder_layers=2, num_heads=3\]; accepted: a scalar, \[num_encoder_layers=2\] or '
     r'\[num_encoder_layers=2\]\[num_heads=3\]\.'),
    (((0.9,) * 4,) * 2, dict(constant=True), r'config_tau of shape \(2, 4\) does not broadcast'),
    (np.ones((1, 2, 3)), dict(constant=True), r'config_tau of shape \(1, 2, 3\) does not'),
    (0.0, dict(constant=True), r'config_tau must be finite and > 0'),
    # A call's value.
    (np.array([0.9, 0.8]), dict(batch=2), r'config_tau of shape \(2,\) is ambiguous: batch and '
     r'num_encoder_layers are both 2\. Pass shape \(2, 1\) for one value per example or '
     r'\(1, 2\) for one per layer\.'),
    (np.ones(3), {}, r'config_tau of shape \(3,\) matches neither batch=4 nor '
     r'num_encoder_layers=2; accepted: a scalar, \[num_encoder_layers=2\], \[batch=4\]'),
    (np.ones((4, 3)), {}, r'config_tau of shape \(4, 3\) does not broadcast to \[batch=4, '
     r'num_encoder_layers=2, num_heads=3\]; accepted: a scalar'),
    (np.ones((2, 2, 3)), {}, r'shape \(2, 2, 3\) does not broadcast to \[batch=4'),
    (np.ones((4, 2, 2)), {}, r'shape \(4, 2, 2\) does not broadcast to \[batch=4'),
    (np.ones((1, 2, 3, 1)), {}, r'shape \(1, 2, 3, 1\) does not broadcast to \[batch=4'),
    (np.array([[0.9, float('nan')]]), {}, r'config_tau must be finite and > 0.*got \[nan\]'),
])
def test_layer_temperatures_errors(value, kwargs, message):
  """Errors name the value (`name`), its shape, the model's sizes and the accepted forms."""
  kwargs = dict(dict(num_layers=2, batch=4, num_heads=3), **kwargs)
  with pytest.raises(ValueError, match=message):
    network.layer_temperatures(value, name='config_tau', **kwargs)


@pytest.mark.parametrize('bad', [1.0, -0.1, None, 'x', float('nan')])
def test_bad_dropout_rate(bad):
  shown = re.escape(repr(bad))
  with pytest.raises(ValueError, match=rf'^network\.T5Config\.dropout_rate = {shown}: expected a '
                                       r'number in \[0, 1\)\.$'):
    network.T5Config(vocab_size=8, dropout_rate=bad)


@pytest.mark.parametrize('field, bad, expected', [
    ('vocab_size', '8', 'a positive integer'),
    ('num_heads', 0, 'a positive integer'),
    ('head_dim', 64.0, 'a positive integer'),
    ('num_encoder_layers', True, 'a positive integer'),
    ('logits_via_embedding', 'no', 'True or False'),
    ('attention_impl', 'flash', "one of 'reference', 'blockwise'"),
    ('blockwise_threshold', -1, 'a positive integer'),
    ('mlp_activations', ('gelu', 'nope'), "a non-empty tuple of flax.linen activations' names "
     "or 'linear' ('nope' is not one)"),
    ('mlp_activations', 'gelu', "a non-empty tuple of flax.linen activations' names"),
    ('encoder_bias_rule', 'interpolate', 'a reference.BiasRule, or a tuple of them'),
    # numpy reads '0.8' as 0.8 and True as 1.0: neither is cast.
    ('encoder_attention_temperature', '0.8', 'a temperature, finite and > 0'),
    ('encoder_attention_temperature', (0.9, True), 'a temperature, finite and > 0'),
])
def test_a_bad_config_field_is_refused_naming_it(field, bad, expected):
  with pytest.raises(ValueError, match=rf'^network\.T5Config\.{field} = {re.escape(repr(bad))}: '
                                       rf'expected {re.escape(expected)}'):
    network.T5Config(**{'vocab_size': 8, field: bad})


@pytest.mark.slow
@pytest.mark.parametrize('tau', [1.0, 0.9, 0.8, 0.7, 0.5])
def test_jitted_padding_is_finite_and_exact(tau):
  # Regression: fully padded query rows once turned into NaN under jit at tau 0.8 / 0.7.
  config = network.T5Config(vocab_size=32, emb_dim=16, num_heads=2, num_encoder_layers=2,
                            num_decoder_layers=1, head_dim=8, mlp_dim=32, dropout_rate=0.0)
  params = network.init_variables(config, jax.random.PRNGKey(1))['params']
  model = network.Transformer(config)
  run = jax.jit(lambda t, tau: model.apply({'params': params}, t, enable_dropout=False,
                                            method=model.encode, temperature=tau,
                                            mutable=['intermediates']))
  padded = np.zeros((1, 40), np.int32)
  padded[0, :25] = np.arange(2, 27)
  out_padded, inter_padded = run(padded, jnp.full((1, 1), tau))
  out_alone, inter_alone = run(padded[:, :25], jnp.full((1, 1), tau))
  assert np.isfinite(np.asarray(out_padded)).all()
  np.testing.assert_allclose(out_padded[:, :25], out_alone, rtol=0, atol=ATOL)
  stats = [network.mean_row_stats(network.encoder_row_stats(v['intermediates'], 2))
           for v in (inter_padded, inter_alone)]
  for key in ('layer_pmax', 'layer_entropy'):
    np.testing.assert_allclose(stats[0][key], stats[1][key], rtol=1e-5)


@pytest.mark.slow
def test_cached_cross_attention_equals_per_step_projection(load_t5x_fixture):
  """Cross K/V projected once into the cache: the same logits (1e-6) and tokens as per step."""
  config, params, ref = load_t5x_fixture('t5_1_1_tiny')
  model = network.Transformer(config)
  inputs = ref['encoder_input_tokens']
  encoded = _encode(config, params, inputs)
  expected = np.asarray(ref['greedy_tokens_tau1.00'])
  length = expected.shape[1]
  # Teacher-forced steps over the fixture's greedy tokens (shifted right, start token 0).
  steps = np.concatenate([np.zeros_like(expected[:, :1]), expected[:, :-1]], axis=1)

  @functools.partial(jax.jit, static_argnums=0)
  def run(cached, params, encoded, step_encoded):
    decode = functools.partial(model.apply, enable_dropout=False, decode=True,
                               max_decode_length=length, cache_cross_kv=cached,
                               method=model.decode, mutable=['cache'])
    full = jnp.zeros_like(steps)
    cache = decode({'params': params}, encoded, inputs, full, full)[1]['cache']

    def step(cache, token):  # token [b, 1]
      logits, state = decode({'params': params, 'cache': cache}, step_encoded, inputs, token,
                             token)
      return state['cache'], logits[:, -1]

    # [l, b, 1] tokens -> [l, b, vocab] logits -> [b, l, vocab].
    cache, logits = jax.lax.scan(step, cache, jnp.asarray(steps.T[:, :, None]))
    return jnp.moveaxis(logits, 0, 1), cache

  per_step, cache = run(False, params, encoded, encoded)
  assert not any('cached_cross_key' in jax.tree_util.keystr(k)
                 for k, _ in jax.tree_util.tree_leaves_with_path(cache))
  # Once the cache holds the keys/values, the steps must not read `encoded` at all.
  cached, cache = run(True, params, encoded, jnp.zeros_like(encoded))
  # [b, h, d, k]: the layout the per-step dots read.
  assert cache['decoder']['layers_0']['encoder_decoder_attention']['cached_cross_key'].shape == (
      encoded.shape[0], config.num_heads, config.head_dim, encoded.shape[1])
  np.testing.assert_allclose(cached, per_step, rtol=1e-6, atol=1e-6)
  # Teacher forcing over greedy's own tokens: the argmax is the next greedy token (until EOS).
  np.testing.assert_array_equal(np.argmax(cached, -1), np.argmax(per_step, -1))
  running = np.cumsum(steps == 1, axis=1) == 0  # No EOS (id 1) among the inputs so far.
  np.testing.assert_array_equal(np.argmax(cached, -1)[running], expected[running])


@pytest.mark.slow
def test_per_head_temperatures(load_t5x_fixture):
  """`[batch, layers, heads]` taus: equal heads are the per-layer form (t5x's encoding at 0.8);
  the config's `[layers][heads]` equals the call; each row of a batch gets its own taus; and
  one head's tau moves that head's statistics only."""
  config, params, ref = load_t5x_fixture('t5_1_1_tiny')
  tokens = ref['encoder_input_tokens']
  n, h = config.num_encoder_layers, config.num_heads

  @functools.partial(jax.jit, static_argnums=0)
  def run(cfg, x, tau):
    model = network.Transformer(cfg)
    return model.apply({'params': params}, x, method=model.encode, enable_dropout=False,
                       temperature=tau, mutable=['intermediates'])

  np.testing.assert_allclose(run(config, tokens, np.full((1, n, h), 0.8))[0],
                             ref['encoded_tau0.80'], rtol=0, atol=ATOL)
  taus = np.random.default_rng(0).uniform(0.5, 1.0, (2, n, h)).astype(np.float32)
  per_head = dataclasses.replace(config, encoder_attention_temperature=taus[0].tolist())
  assert per_head.encoder_attention_temperature == tuple(map(tuple, taus[0].tolist()))
  np.testing.assert_allclose(run(per_head, tokens, None)[0], run(config, tokens, taus[:1])[0],
                             rtol=0, atol=ATOL)
  batched, state = run(config, tokens, taus)
  for b in range(2):  # Row b of the batch run at example b's taus for every row.
    np.testing.assert_allclose(batched[b], run(config, tokens, taus[b:b + 1])[0][b], rtol=0,
                               atol=ATOL)
  # Layer 1, head 2 sharper: layer 0 and the other heads of layer 1 keep their statistics.
  moved = taus.copy()
  moved[:, 1, 2] *= 0.5
  before = network.encoder_row_stats(state['intermediates'], n)['pmax_sum']  # [n, b, h]
  after = network.encoder_row_stats(run(config, tokens, moved)[1]['intermediates'], n)['pmax_sum']
  changed = np.abs(np.asarray(after) - np.asarray(before)) > 1e-5 * np.abs(np.asarray(before))
  expected = np.zeros((n, 2, h), bool)
  expected[1, :, 2] = True
  np.testing.assert_array_equal(changed, expected)


def test_per_head_temperature_shape_errors(load_t5x_fixture):
  config, params, _ = load_t5x_fixture('t5_1_1_tiny')  # 2 layers, 4 heads
  tokens = np.ones((3, 5), np.int32)
  for bad in (np.ones((3, 2, 3)), np.ones((2, 2, 4)), np.ones((1, 3, 4)), np.ones((1, 2, 4, 1))):
    with pytest.raises(ValueError, match=r'does not broadcast to \[batch=3, num_encoder_layers=2, '
                                         r'num_heads=4\]; accepted: a scalar'):
      _encode(config, params, tokens, temperature=bad)
  with pytest.raises(ValueError, match=r'must be finite and > 0'):
    _encode(config, params, tokens, temperature=np.array([[[1.0, 0.0, 1.0, 1.0]] * 2]))
  for bad, message in ((((0.9,) * 4,) * 3, r'has shape \(3, 4\); expected one float, '
                        r'num_encoder_layers=2 values, or \[num_encoder_layers=2\]\[num_heads=4\]'),
                       (((0.9,) * 4, (0.7,) * 3), r'expected a temperature, finite and > 0, '
                        r'in float32 too .*: a number, .*\)\.$'),
                       (((0.9,) * 4, ((0.9,),) * 4), 'expected a temperature, finite and > 0'),
                       (((0.9,) * 4, 0.7), 'expected a temperature, finite and > 0'),
                       (((0.9,) * 4, (0.9, -0.8, 1.0, 1.0)), r'\(-0\.8 is not\)\.$')):
    with pytest.raises(ValueError, match=rf'T5Config.encoder_attention_temperature.*{message}'):
      dataclasses.replace(config, encoder_attention_temperature=bad)


def test_mean_row_stats_of_an_all_padding_batch_raises():
  stats = {'pmax_sum': np.zeros((2, 3, 4)), 'entropy_sum': np.zeros((2, 3, 4)),
           'rows': np.zeros(3, np.int32)}
  with pytest.raises(ValueError, match='no non-pad query row'):
    network.mean_row_stats(stats)
