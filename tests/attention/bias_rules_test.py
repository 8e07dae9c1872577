"""The encoder's relative-bias rules (`reference.BiasRule`, `reference.OffsetMap`): the bucket of
every offset against a written-out numpy derivation, and every attention implementation against
float64 numpy attention with that bias.

The numpy side is built here, independently of reference.py: offsets are scaled with exact
fractions (`round(d * s)`, half away from zero) and bucketed by `attention_test._np_bucket`
(checked against t5x's fixture), with T5's bucketing over `round(128 * e)` for the extension.
"""
from __future__ import annotations

import fractions
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention.attention_test import _np_bucket
from attention.attention_test import _segment_ids
from t5align.attention import dispatch
from t5align.attention import reference

pytestmark = pytest.mark.newest_jax

F32 = dict(rtol=1e-5, atol=1e-5)
OffsetMap = reference.OffsetMap


def _np_rule_bucket(offsets, bidirectional, interpolation=1.0, extension=1.0):
  """The bucket of each offset under (s, e), written out: `d * s` rounded exactly, s the
  fraction nearest it with a denominator up to 10^6 (the rule's reading: 0.3 is 3/10)."""
  s = fractions.Fraction(interpolation).limit_denominator(10 ** 6)
  scaled = []
  for d in np.ravel(offsets).tolist():
    x = abs(fractions.Fraction(d) * s)
    r = int(x) + (1 if x - int(x) >= fractions.Fraction(1, 2) else 0)
    scaled.append(r if d >= 0 else -r)
  scaled = np.asarray(scaled, np.int64).reshape(np.shape(offsets))
  return _np_bucket(scaled, bidirectional, max_distance=round(128 * extension))


MAPS = {
    'as_trained': OffsetMap(),
    # s = 1/2: odd offsets are halves, rounded away from zero (1 -> 1, -3 -> -2).
    'interpolate_half': OffsetMap(interpolation=0.5),
    'interpolate_0.3': OffsetMap(interpolation=0.3),
    'extend_1.5': OffsetMap(extension=1.5),
    'extend_4': OffsetMap(extension=4.0),
    'both': OffsetMap(interpolation=0.75, extension=2.0),
}


@pytest.mark.parametrize('bidirectional', [True, False])
@pytest.mark.parametrize('name', MAPS)
def test_buckets_and_band_match_the_written_out_rule(name, bidirectional):
  """`bias_by_offset` over its band, clipped beyond `far`, gives the written-out bucket of every
  offset of a 6000-token input; `far` is the least half-width whose scaled offset reaches
  `max_distance` (from where T5's bucketing gives every offset the last bucket)."""
  offset_map = MAPS[name]
  table = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (2, reference.NUM_BUCKETS)))
  offsets = np.arange(-6000, 6001)
  lut = np.asarray(reference.bias_by_offset(jnp.asarray(table), bidirectional, offset_map))
  far = offset_map.far
  assert lut.shape == (2, 2 * far + 1)
  index = np.asarray(reference.offset_index(jnp.zeros((1,), jnp.int32), jnp.asarray(offsets),
                                            far))[0]
  expected = _np_rule_bucket(offsets, bidirectional, offset_map.interpolation,
                             offset_map.extension)
  np.testing.assert_array_equal(lut[:, index], table[:, expected])
  # far is the least F with round(F * s) >= max_distance (T5's band when s = e = 1).
  s = fractions.Fraction(offset_map.interpolation).limit_denominator(10 ** 6)
  half = fractions.Fraction(1, 2)
  md = round(128 * offset_map.extension)
  assert int(far * s + half) >= md > int((far - 1) * s + half)
  assert reference.bucket_steps(bidirectional, reference.NUM_BUCKETS, offset_map)[-1][1] == (
      expected[-1])


def test_as_trained_is_t5s_band_and_buckets():
  """No rule: the band and the buckets of T5 (MAX_DISTANCE, t5x's bucketing), unchanged."""
  assert OffsetMap().far == reference.MAX_DISTANCE == 128
  for bidirectional in (True, False):
    offsets = np.arange(-128, 129)
    np.testing.assert_array_equal(reference.offset_buckets(bidirectional),
                                  reference.relative_position_bucket(offsets, bidirectional))
  assert reference.BiasRule().at(100_000) == OffsetMap()


def test_rules_resolve_from_the_lengths_and_keep_the_trained_bias_up_to_l_tr():
  rule = reference.BiasRule('interpolate', reference_length=256)
  assert rule.at(1024) == OffsetMap(interpolation=0.25)
  assert rule.at(256) == rule.at(100) == OffsetMap()
  assert rule.at(1024).far == 510  # round(510 / 4) = round(127.5) = 128, the far bucket.
  rule = reference.BiasRule('extend', reference_length=256)
  assert rule.at(1024) == OffsetMap(extension=4.0) and rule.at(1024).max_distance == 512
  assert rule.at(256) == OffsetMap()
  # A given scale holds at every length.
  assert reference.BiasRule('extend', scale=2.0).at(64) == OffsetMap(extension=2.0)
  assert reference.BiasRule('extend', scale=2.0, reference_length=512).at(64).extension == 2.0
  assert reference.BiasRule('none', reference_length=512).at(4096) == OffsetMap()
  assert reference.BiasRule('interpolate', scale=0.5).describe() == 'interpolate (s = 0.5)'
  assert (reference.BiasRule('extend', reference_length=512).describe()
          == 'extend (e = L / L_tr, L_tr = 512)')


def test_a_rule_fixed_at_a_length_reads_alike_at_every_width():
  """A job resolves a length-derived rule once at its inputs' length (`fixed_at`,
  `network.bias_rules_at`): the same map at any padded width; T5's bias at or below L_tr."""
  from t5align import network  # pylint: disable=g-import-not-at-top
  rule = reference.BiasRule('interpolate', reference_length=256)
  fixed = rule.fixed_at(576)
  assert fixed == reference.BiasRule('interpolate', scale=256 / 576)
  assert fixed.at(640) == fixed.at(4096) == rule.at(576) != rule.at(640)
  assert rule.fixed_at(256) == reference.BiasRule()
  assert reference.BiasRule('extend', reference_length=256).fixed_at(1024) == reference.BiasRule(
      'extend', scale=4.0)
  config = network.T5Config(vocab_size=32, num_encoder_layers=2, num_heads=2,
                            encoder_bias_rule=(reference.BiasRule(), rule))
  fixed_config = network.bias_rules_at(config, 576)
  assert fixed_config.encoder_bias_rule == (reference.BiasRule(), fixed)
  assert network.bias_rules_at(fixed_config, 1000) == fixed_config  # Fixed: stays.
  plain = network.T5Config(vocab_size=32, num_encoder_layers=2, num_heads=2)
  assert network.bias_rules_at(plain, 576) is plain


@pytest.mark.parametrize('kwargs,message', [
    (dict(kind='stretch'), "BiasRule.kind='stretch'"),
    (dict(kind='interpolate'), 'reference_length=None'),
    (dict(kind='none', reference_length=2.5), 'reference_length=2.5'),
    (dict(kind='interpolate', scale=1.5), 'interpolation=1.5'),
    (dict(kind='extend', scale=0.5), 'extension=0.5'),
    (dict(kind='extend', scale=float('nan')), 'extension=nan'),
    (dict(kind='extend', scale='2'), "extension='2'"),
    (dict(kind='none', scale=0.5), "kind='none'"),
    (dict(kind='interpolate', reference_length=1), 'reference_length=1'),
])
def test_bad_rules_are_refused_by_name(kwargs, message):
  with pytest.raises(ValueError, match=message.replace('(', r'\(').replace(')', r'\)')):
    reference.BiasRule(**kwargs)


@functools.cache
def _case(name: str) -> tuple[np.ndarray, ...]:
  """The parity case of MAPS[name]: float64 inputs and the numpy attention's output and stats."""
  batch, length, heads, depth = 2, 700, 2, 16
  keys = jax.random.split(jax.random.PRNGKey(7), 4)
  q, k, v = (np.asarray(jax.random.normal(x, (batch, length, heads, depth)), np.float64)
             for x in keys[:3])
  table = 2.0 * np.asarray(jax.random.normal(keys[3], (heads, reference.NUM_BUCKETS)),
                           np.float64)
  ids = _segment_ids(batch, length)
  tau = np.array([[0.7, 1.2], [0.5, 0.9]])
  return (q, k, v, table, ids, tau,
          *_numpy_attention(q, k, v, table, ids, tau, MAPS[name]))


def _numpy_attention(query, key, value, table, ids, tau, offset_map):
  """float64 softmax((q.k + bias + mask) / tau) with the rule's bias, and its row statistics."""
  length = query.shape[1]
  logits = np.einsum('bqhd,bkhd->bhqk', query, key)
  offsets = np.arange(length)[None, :] - np.arange(length)[:, None]  # [q, k]
  buckets = _np_rule_bucket(offsets, True, offset_map.interpolation, offset_map.extension)
  allowed = (ids[:, :, None] == ids[:, None, :]) & (ids[:, :, None] > 0)  # [b, q, k]
  s = (logits + table[:, buckets][None] + np.where(allowed, 0.0, -1e10)[:, None]
       ) / tau.reshape(tau.shape[0], -1)[:, :, None, None]
  probs = np.exp(s - s.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  probs = np.where(allowed.any(-1)[:, None, :, None], probs, 1.0 / length)
  entropy = -np.sum(np.where(probs > 0, probs * np.log(np.maximum(probs, 1e-300)), 0.0), -1)
  return np.einsum('bhqk,bkhd->bqhd', probs, value), probs.max(-1), entropy


# (impl, block_q, block_k): blocks small enough that an input of 700 tokens has tiles in the
# widened band and far from it on both sides (far = 256 for s = 1/2, 192 for e = 1.5).
IMPLS = [('reference', None, None), ('blockwise', 128, 64), ('pallas_tpu', 128, 128),
         ('pallas_gpu', 64, 64)]
IMPLS = [spec for spec in IMPLS
         if jax.default_backend() in ('cpu', *dispatch.IMPLEMENTATIONS[spec[0]].platforms)]
RULE_MAPS = ('interpolate_half', 'interpolate_0.3', 'extend_1.5', 'both')


@pytest.mark.slow
@pytest.mark.parametrize('name', RULE_MAPS)
@pytest.mark.parametrize('impl,block_q,block_k', IMPLS)
def test_every_implementation_matches_numpy_float64_with_the_rule(impl, block_q, block_k, name):
  """float32 outputs, P_max and entropy within 1e-5 of the float64 numpy attention with the
  rule's bias (the fused kernels in Pallas interpret mode on the CPU)."""
  offset_map = MAPS[name]
  q, k, v, table, ids, tau, out, pmax, entropy = _case(name)
  options = (None if block_q is None else
             dispatch.IMPLEMENTATIONS[impl].options(block_q=block_q, block_k=block_k))
  actual, stats = dispatch.self_attention(
      *(jnp.asarray(x, jnp.float32) for x in (q, k, v)), rel_embedding=jnp.asarray(
          table, jnp.float32), segment_ids=jnp.asarray(ids),
      temperature=jnp.asarray(tau, jnp.float32), impl=impl, options=options, with_stats=True,
      offset_map=offset_map)
  np.testing.assert_allclose(actual, out, **F32)
  np.testing.assert_allclose(stats.pmax, pmax, **F32)
  valid = np.broadcast_to((ids > 0)[:, None, :], entropy.shape)
  np.testing.assert_allclose(np.asarray(stats.entropy)[valid], entropy[valid], **F32)
  # The rule changes the attention: not T5's bias by another name.
  plain = _case('as_trained')[6]
  assert np.max(np.abs(plain - out)) > 1e-2
