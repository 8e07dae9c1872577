"""Strategy options (`strategies.parse_name`): a temperature from layer K on, the floor, a bias
rule calibrated with tau, and the joint (bias rule, tau) search against an exhaustive float64
numpy search over the same pairs."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attention.bias_rules_test import _np_rule_bucket
from calibration.calibration_test import L_EX, L_TR
from t5align import calibration
from t5align.attention import reference
from t5align.calibration import strategies


@pytest.fixture(scope='module')
def tiny(load_t5x_fixture):
  config, params, ref = load_t5x_fixture('t5_1_1_tiny')
  return config, params, calibration.cut_to_length(ref['encoder_input_tokens'], L_EX, 1)


@pytest.mark.parametrize('name,spec', [
    ('pmax', strategies.Spec('pmax')),
    ('pmax:from_layer=1:floor', strategies.Spec('pmax', from_layer=1, floor=True)),
    ('entropy:bias=joint', strategies.Spec('entropy', bias='joint')),
    ('log_length:floor:bias=extend', strategies.Spec('log_length', floor=True, bias='extend')),
    ('none:bias=interpolate', strategies.Spec('none', bias='interpolate')),
])
def test_names_parse_to_their_options(name, spec):
  assert strategies.parse_name(name) == spec and strategies.is_strategy(name)
  assert strategies.parse_name(spec.name) == spec


@pytest.mark.parametrize('name,message', [
    ('pmax:from_layer=0', "option 'from_layer=0'"),
    ('pmax:from_layer=x', "option 'from_layer=x'"),
    ('pmax:floor:floor', "gives 'floor' twice"),
    ('pmax:bias=stretch', "option 'bias=stretch'"),
    ('pmax_bisect:bias=joint', 'bias=joint extends'),
    ('pmax_per_layer:from_layer=1', 'already gives each layer'),
    ('none', "'none' \\(tau = 1\\) takes a bias rule"),
    ('pmaxx:floor', "'pmaxx' is not a strategy"),
])
def test_bad_names_are_refused_naming_the_part(name, message):
  with pytest.raises(ValueError, match=message):
    strategies.parse_name(name)
  assert not strategies.is_strategy(name)


def _pooled_numpy(numpy_head_stats, config, params, tokens, tau, kind, layers=slice(None)):
  """float64 mean row P_max over `layers` (and heads) with bias rule `kind` resolved at the
  tokens' width, its buckets written out (`_np_rule_bucket`)."""
  length = tokens.shape[1]
  rule = reference.BiasRule(kind, reference_length=L_TR) if kind != 'none' else reference.BiasRule()
  offset_map = rule.at(length)
  offsets = np.arange(length)[None, :] - np.arange(length)[:, None]
  buckets = _np_rule_bucket(offsets, True, offset_map.interpolation, offset_map.extension)
  ruled = dataclasses.replace(config, encoder_bias_rule=rule)
  pmax, _ = numpy_head_stats(ruled, params, tokens, tau, buckets)
  return float(np.mean(pmax[layers]))


@pytest.mark.slow
def test_joint_choice_equals_an_exhaustive_numpy_search(tiny, numpy_head_stats):
  """'pmax:bias=joint' chooses the (rule, tau) pair of the grid whose float64 numpy P_max is
  nearest the L_tr target (ties: first rule, then first tau), and its statistic."""
  config, params, tokens = tiny
  result = calibration.calibrate(params, config, tokens, 'pmax:bias=joint',
                                 reference_length=L_TR)
  reference_tokens = calibration.cut_to_length(tokens, L_TR, 1)
  target = _pooled_numpy(numpy_head_stats, config, params, reference_tokens, 1.0, 'none')
  grid = calibration.PAPER_GRID
  table = np.array([[_pooled_numpy(numpy_head_stats, config, params, tokens, tau, kind)
                     for tau in grid] for kind in strategies.JOINT_RULES])
  i, j = np.unravel_index(np.argmin(np.abs(table - target)), table.shape)
  assert (result.bias_rule, result.tau) == (strategies.JOINT_RULES[i], grid[j])
  np.testing.assert_allclose(result.target, target, rtol=1e-6)
  np.testing.assert_allclose(result.achieved, table[i, j], rtol=1e-6)
  np.testing.assert_allclose(
      [result.details['pairs'][k] for k in strategies.JOINT_RULES], table, rtol=1e-6)
  # The rules are not one another: each gives other statistics.
  assert np.min(np.abs(table[1:] - table[0])) > 1e-4


@pytest.mark.slow
def test_from_layer_and_floor_and_a_fixed_rule(tiny, numpy_head_stats):
  """From layer 1 on: tau = 1 in layer 0 and layer 1's statistic matched; the floor caps tau at
  1; a fixed rule is Algorithm 1 run on the model with that rule."""
  config, params, tokens = tiny
  result = calibration.calibrate(params, config, tokens, 'pmax:from_layer=1',
                                 reference_length=L_TR)
  assert result.tau[0] == 1.0 and result.tau[1] in calibration.PAPER_GRID
  reference_tokens = calibration.cut_to_length(tokens, L_TR, 1)
  np.testing.assert_allclose(result.target, _pooled_numpy(
      numpy_head_stats, config, params, reference_tokens, 1.0, 'none', slice(1, None)),
      rtol=1e-6)
  values = [_pooled_numpy(numpy_head_stats, config, params, tokens, np.array([[1.0, tau]]), 'none',
                          slice(1, None)) for tau in calibration.PAPER_GRID]
  best = int(np.argmin(np.abs(np.array(values) - result.target)))
  assert result.tau[1] == calibration.PAPER_GRID[best]
  # Floor: a formula's tau > 1 (YaRN's at L < L_tr is not reachable; log-length's is < 1) stays.
  floored = calibration.calibrate(params, config, tokens, 'log_length:floor',
                                  reference_length=L_TR)
  assert floored.tau == pytest.approx(np.log(L_TR) / np.log(L_EX))
  assert calibration.calibrate(params, config, reference_tokens, 'pmax:floor',
                               reference_length=L_TR).tau == 1.0
  fixed = calibration.calibrate(params, config, tokens, 'pmax:bias=extend',
                                reference_length=L_TR)
  assert fixed.bias_rule == 'extend'
  values = [_pooled_numpy(numpy_head_stats, config, params, tokens, tau, 'extend')
            for tau in calibration.PAPER_GRID]
  best = int(np.argmin(np.abs(np.array(values) - fixed.target)))
  assert fixed.tau == calibration.PAPER_GRID[best]
  alone = calibration.calibrate(params, config, tokens, 'none:bias=interpolate',
                                reference_length=L_TR)
  assert (alone.tau, alone.bias_rule) == (1.0, 'interpolate')


def test_a_model_with_a_rule_of_its_own_is_refused(tiny):
  config, params, tokens = tiny
  ruled = dataclasses.replace(config, encoder_bias_rule=reference.BiasRule('extend', scale=2.0))
  with pytest.raises(ValueError, match="in the strategy's name"):
    calibration.calibrate(params, ruled, tokens, 'pmax', reference_length=L_TR)
  with pytest.raises(ValueError, match='from_layer=2, but the model has 2 encoder layers'):
    calibration.calibrate(params, config, tokens, 'pmax:from_layer=2', reference_length=L_TR)
