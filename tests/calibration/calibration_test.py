"""Calibration tests: statistics vs t5x fixtures, vmap vs loop, searches,
closed forms on Gaussian logits, and input validation."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from t5align import calibration
from t5align.calibration import stats as calibration_stats
from t5align import network
from t5align import partitioning

pytestmark = pytest.mark.newest_jax

TAUS = ('1.00', '0.80', '0.60')
L_EX, L_TR = 81, 32  # Fixture rows cut to 81 tokens are both unpadded.
# Statistics vs the t5x fixtures: at most 2.0e-7 relative measured (2-core CPU, every tau).
STATS_RTOL = 5e-7
# Per-head statistics vs a float64 numpy re-derivation: at most 1.6e-7 relative measured (2-core
# CPU; both fixture widths, tau = 1 and two random per-head rows).
HEAD_RTOL = 5e-7


@pytest.fixture(scope='module')
def tiny(load_t5x_fixture):
  return load_t5x_fixture('t5_1_1_tiny')


@pytest.mark.slow
@pytest.mark.parametrize('name', ['t5_1_1_tiny', 't5_1_0_tiny'])
def test_stats_match_t5x_fixtures(load_t5x_fixture, name):
  config, params, ref = load_t5x_fixture(name)
  stats = calibration.encoder_attention_stats(
      params, config, ref['encoder_input_tokens'], [float(t) for t in TAUS])
  for i, tau in enumerate(TAUS):
    np.testing.assert_allclose(stats.layer_pmax[i], ref[f'layer_pmax_tau{tau}'], rtol=STATS_RTOL)
    np.testing.assert_allclose(stats.layer_entropy[i], ref[f'layer_entropy_tau{tau}'],
                               rtol=STATS_RTOL)
    np.testing.assert_allclose(stats.pmax[i], ref[f'mean_pmax_tau{tau}'], rtol=STATS_RTOL)
    np.testing.assert_allclose(stats.entropy[i], ref[f'mean_entropy_tau{tau}'], rtol=STATS_RTOL)
  assert stats.rows == int(np.sum(ref['encoder_input_tokens'] > 0))


# tau_chunk: all four taus vmapped at once; one at a time; 3 then 1 (`lax.map` with a rest).
@pytest.mark.slow
@pytest.mark.parametrize('tau_chunk', [None, 1, 3])
def test_vmap_over_taus_equals_python_loop(tiny, tau_chunk):
  config, params, ref = tiny
  tokens = ref['encoder_input_tokens']  # Two rows of different lengths (one padded).
  taus = np.array([[1.0, 1.0], [0.8, 0.8], [0.7, 0.9], [0.55, 0.55]])
  stats = calibration.encoder_attention_stats(params, config, tokens, taus, tau_chunk=tau_chunk)
  model = network.Transformer(config)
  encode = jax.jit(lambda example, tau: model.apply(
      {'params': params}, example, method='encode', enable_dropout=False, temperature=tau,
      mutable=['intermediates'])[1])
  for i, row in enumerate(taus):
    # Reference: one `encode` per example (unpadded) and tau, pooled by hand.
    sums, rows = np.zeros((2, config.num_encoder_layers)), 0
    for example in tokens:
      state = encode(example[example > 0][None], row[None])
      s = network.encoder_row_stats(state['intermediates'], config.num_encoder_layers)
      sums += [np.sum(s['pmax_sum'], axis=(1, 2)), np.sum(s['entropy_sum'], axis=(1, 2))]
      rows += int(np.sum(s['rows']))
    expected = sums / (rows * config.num_heads)
    np.testing.assert_allclose(stats.layer_pmax[i], expected[0], rtol=1e-5)
    np.testing.assert_allclose(stats.layer_entropy[i], expected[1], rtol=1e-5)
  # A scalar tau is the same tau on every layer.
  scalar = calibration.encoder_attention_stats(params, config, tokens, np.full(len(taus), 0.8))
  np.testing.assert_allclose(scalar.layer_pmax[0], stats.layer_pmax[1], rtol=1e-6)


@pytest.mark.slow
def test_stats_need_only_the_encoder_and_embedder(tiny):
  """A params tree without the decoder (half the weights of a large model) gives the same
  statistics, on a mesh too (its compiled call takes shardings for the parts it is given)."""
  config, params, ref = tiny
  tokens = ref['encoder_input_tokens']
  encoder_only = {k: params[k] for k in ('encoder', 'token_embedder')}
  full = calibration.encoder_attention_stats(params, config, tokens, [1.0, 0.7])
  mesh = partitioning.calibration_mesh(1, 1, 1)
  for tree, m in ((encoder_only, None), (encoder_only, mesh), (params, mesh)):
    got = calibration.encoder_attention_stats(tree, config, tokens, [1.0, 0.7], mesh=m)
    np.testing.assert_allclose(got.layer_pmax, full.layer_pmax, rtol=1e-6)
    np.testing.assert_allclose(got.layer_entropy, full.layer_entropy, rtol=1e-6)


# Meshes (8 simulated devices) against one device: tests/model/partitioning_test.py.


@pytest.mark.slow
@pytest.mark.parametrize('statistic', calibration.STATISTICS)
def test_monotone_statistic_and_bisection_agrees_with_grid(tiny, statistic):
  config, params, ref = tiny
  tokens = calibration.cut_to_length(ref['encoder_input_tokens'], L_EX, 1)
  grid = calibration.calibrate(params, config, tokens, statistic, reference_length=L_TR)
  values = np.asarray(grid.details['values'])  # Over the grid 1.0, 0.95, ..., 0.5.
  # Lower tau sharpens: P_max rises and entropy falls along the grid, on every step.
  steps = np.diff(values) if statistic == 'pmax' else -np.diff(values)
  assert np.all(steps > 0), values
  bisect = calibration.calibrate(params, config, tokens, f'{statistic}_bisect',
                                 reference_length=L_TR)
  assert not grid.clamped and not bisect.clamped
  assert abs(bisect.tau - grid.tau) <= 0.05, (bisect.tau, grid.tau)
  assert bisect.details['bracket'][1] - bisect.details['bracket'][0] <= 1e-3
  np.testing.assert_allclose(bisect.achieved, bisect.target, rtol=5e-3)
  # Algorithm 1 picks the grid value nearest the target.
  assert grid.achieved == min(values, key=lambda v: abs(v - grid.target))


@pytest.mark.slow
def test_per_layer_alignment_matches_each_layer(tiny):
  config, params, ref = tiny
  tokens = calibration.cut_to_length(ref['encoder_input_tokens'], L_EX, 1)
  result = calibration.calibrate(params, config, tokens, 'pmax_per_layer', reference_length=L_TR)
  assert len(result.tau) == config.num_encoder_layers
  np.testing.assert_allclose(result.achieved, result.target, rtol=5e-3)
  # Re-evaluating the chosen per-layer taus in one pass reproduces each layer's value.
  stats = calibration.encoder_attention_stats(params, config, tokens, [result.tau])
  np.testing.assert_allclose(stats.layer_pmax[0], result.achieved, rtol=1e-6)


@pytest.mark.slow
def test_memo_computes_each_sweep_once_and_changes_nothing(tiny, monkeypatch):
  config, params, ref = tiny
  tokens = ref['encoder_input_tokens'][:, :L_EX]
  strategies = ('pmax', 'entropy', 'prop1', 'prop2')
  fresh = {s: calibration.calibrate(params, config, tokens, s, reference_length=L_TR)
           for s in strategies}
  calls = {'encoder_attention_stats': 0, 'layer0_sorted_logits': 0}
  for name in calls:
    def counted(*args, name=name, fn=getattr(calibration_stats, name), **kwargs):
      calls[name] += 1
      return fn(*args, **kwargs)
    monkeypatch.setattr(calibration_stats, name, counted)  # What Memo calls.
  memo = calibration.Memo()
  shared = {s: calibration.calibrate(params, config, tokens, s, reference_length=L_TR, memo=memo)
            for s in strategies}
  assert shared == fresh
  # P_max, entropy and Prop. 1 (P_tr) share the L_tr target; P_max and entropy the grid sweep;
  # the propositions share the L_tr and L_ex logit vectors. Without the memo: 5 and 4.
  assert calls == {'encoder_attention_stats': 2, 'layer0_sorted_logits': 2}
  assert memo.hits == 5
  # Other tokens or taus are other questions.
  memo.attention_stats(params, config, tokens[:1], [1.0])
  memo.attention_stats(params, config, tokens, [1.0, 0.9])
  assert calls['encoder_attention_stats'] == 4


@pytest.mark.slow
def test_pooled_stats_equal_one_call_on_the_concatenation(tiny):
  """Layer, encoder and per-head means of several token arrays pooled by their row counts."""
  config, params, ref = tiny
  tokens = np.array(ref['encoder_input_tokens'][:, :L_EX])
  tokens[0, L_EX // 2:] = 0  # Groups of unequal row counts.
  groups = [tokens[:1], tokens[1:]]
  memo = calibration.Memo()
  pooled = memo.pooled_stats(params, config, groups, [1.0, 0.7])
  expected = calibration.encoder_attention_stats(params, config, tokens, [1.0, 0.7])
  for field in expected._fields:
    np.testing.assert_allclose(getattr(pooled, field), getattr(expected, field), rtol=1e-6,
                               err_msg=field)
  assert pooled.head_pmax.shape == (2, config.num_encoder_layers, config.num_heads)


def test_memo_keeps_other_weights_apart(tiny):
  """One Memo asked about other weights computes their statistics, not the first weights'."""
  config, params, ref = tiny
  tokens = ref['encoder_input_tokens'][:, :L_EX]
  other = jax.tree.map(lambda x: np.asarray(x) * 0.5, params)  # Other weights, same tree.
  memo = calibration.Memo()
  first = memo.attention_stats(params, config, tokens, [1.0, 0.8])
  second = memo.attention_stats(other, config, tokens, [1.0, 0.8])
  expected = calibration.encoder_attention_stats(other, config, tokens, [1.0, 0.8])
  np.testing.assert_array_equal(second.layer_pmax, expected.layer_pmax)
  assert not np.allclose(first.layer_pmax, second.layer_pmax)
  logits = memo.sorted_logits(params, config, tokens)
  np.testing.assert_array_equal(memo.sorted_logits(other, config, tokens),
                                calibration.layer0_sorted_logits(other, config, tokens))
  assert not np.allclose(logits, memo.sorted_logits(other, config, tokens))
  # The same weights again (a copy, or placed on the device) are the same question.
  hits = memo.hits
  memo.attention_stats(jax.tree.map(np.array, other), config, tokens, [1.0, 0.8])
  memo.attention_stats(jax.device_put(params), config, tokens, [1.0, 0.8])
  assert memo.hits == hits + 2


def test_log_length_reproduces_paper_row():
  taus = calibration.log_length_tau([1024, 2048, 4096, 8192, 15000], 512)
  np.testing.assert_array_equal(np.round(taus, 2), [0.90, 0.82, 0.75, 0.69, 0.65])
  # CodeT5+ (L_tr = 768), paper Table 12: 1k .. 4k.
  np.testing.assert_array_equal(
      np.round(calibration.log_length_tau([1000, 2000, 3000, 4000], 768), 2),
      [0.96, 0.87, 0.83, 0.80])


def _gaussian_logits(rng, length, sigma, lmax=None, n=64):
  """`[n, length]` logit vectors ~ N(0, sigma^2); with `lmax`, one entry planted at lmax."""
  z = rng.normal(0.0, sigma, (n, length))
  if lmax is not None:
    z[:, 0] = lmax  # Assumption 2: the same largest logit at every length.
  return z


def _row_stats(logits, tau):
  """float64 brute force: mean row P_max and entropy of softmax(logits / tau)."""
  s = logits / tau
  p = np.exp(s - s.max(axis=1, keepdims=True))
  p /= p.sum(axis=1, keepdims=True)
  return p.max(axis=1).mean(), -(p * np.log(p)).sum(axis=1).mean()


def _solve(logits, target, index):
  """Brute-force tau with mean statistic `index` (0 P_max, 1 entropy) equal to target."""
  lo, hi = 0.05, 3.0
  for _ in range(60):
    mid = 0.5 * (lo + hi)
    value = _row_stats(logits, mid)[index]
    # P_max falls with tau, entropy rises.
    if (value < target) == (index == 0):
      hi = mid
    else:
      lo = mid
  return mid


@pytest.mark.parametrize('l_tr,l_ex,s_tr,s_ex', [(512, 2048, 0.6, 0.7), (256, 1024, 0.7, 0.8),
                                                 (512, 8192, 0.5, 0.5)])
def test_closed_forms_align_gaussian_logits(l_tr, l_ex, s_tr, s_ex):
  # Where Assumptions 1-2 hold (Gaussian entries; for Prop. 1 a shared largest logit) and
  # sigma / tau stays moderate, the closed forms align the brute-force statistics:
  # Prop. 1 within 0.015 in tau and 6% in P_max, Prop. 2 within 0.015 in tau and 0.1 nats.
  rng = np.random.default_rng(0)
  summary = lambda x: calibration.summarize_logit_vector(np.sort(x, axis=1)[:, ::-1].mean(0))

  tr, ex = _gaussian_logits(rng, l_tr, s_tr, 4.0), _gaussian_logits(rng, l_ex, s_ex, 4.0)
  ref, ext = summary(tr), summary(ex)
  p_tr = _row_stats(tr, 1.0)[0]  # P_tr as calibration.reference_pmax: the mean row P_max.
  tau1 = calibration.prop1_tau(l_tr, l_ex, ref.sigma, ext.sigma, p_tr)
  assert abs(tau1 - _solve(ex, p_tr, 0)) <= 0.015
  np.testing.assert_allclose(_row_stats(ex, tau1)[0], p_tr, rtol=0.06)

  tr, ex = _gaussian_logits(rng, l_tr, s_tr), _gaussian_logits(rng, l_ex, s_ex)
  ref, ext = summary(tr), summary(ex)
  tau2 = calibration.prop2_tau(l_tr, l_ex, ref.sigma, ext.sigma)
  h_tr = _row_stats(tr, 1.0)[1]
  assert abs(tau2 - _solve(ex, h_tr, 1)) <= 0.015
  np.testing.assert_allclose(_row_stats(ex, tau2)[1], h_tr, atol=0.1)


def test_prop1_roots_and_no_root():
  # At L_ex = L_tr the quadratic factors as (tau - 1)(A tau - C): tau = 1.
  np.testing.assert_allclose(calibration.prop1_tau(512, 512, 1.3, 1.3, 0.2), 1.0, rtol=1e-12)
  assert np.isnan(calibration.prop1_tau(40, 160, 0.96, 0.99, 0.13))
  closest = calibration.prop1_tau(40, 160, 0.96, 0.99, 0.13, closest=True)
  b = np.log(40) + np.log(0.13) + 0.96**2 / 2
  np.testing.assert_allclose(closest, 0.99**2 / b, rtol=1e-12)  # 2C / B


def test_closed_forms_clamped_to_one_and_marked():
  # L_tr = 40, L_ex = 160, sigma_tr = 0.5, sigma_ex = 1.2, P_tr = 0.03:
  # B = ln 40 + ln 0.03 + 0.125 = 0.307, A = ln 160 + ln 0.03 = 1.568, C = 0.72;
  # B^2 - 4AC = -4.42 < 0: no real root, and the closest approach 2C/B = 4.68 > 1.
  b = np.log(40) + np.log(0.03) + 0.5**2 / 2
  a, c = np.log(160) + np.log(0.03), 1.2**2 / 2
  assert b * b - 4 * a * c < 0 and 2 * c / b > 1
  tau, note, raw = calibration.closed_form_tau('prop1', 40, 160, 0.5, 1.2, 0.03)
  np.testing.assert_allclose(raw, 2 * c / b, rtol=1e-12)
  assert tau == 1.0 and 'no real root' in note and 'clamped to 1' in note
  # A real root below 1 is kept as is, with no note.
  tau, note, raw = calibration.closed_form_tau('prop1', 512, 2048, 1.3, 1.4, 0.2)
  assert 0 < tau == raw < 1 and note == ''
  # Prop. 2 above 1 (sigma_ex much larger than sigma_tr) is clamped too.
  tau, note, raw = calibration.closed_form_tau('prop2', 512, 1024, 0.5, 3.0)
  np.testing.assert_allclose(raw, 3.0 / np.sqrt(0.25 + 2 * np.log(2)), rtol=1e-12)
  assert tau == 1.0 and note.startswith('closed form gave tau=')
  with pytest.raises(ValueError, match='no closed form'):
    calibration.closed_form_tau('pmax', 512, 1024, 0.5, 3.0)


def test_clamped_calibration_is_marked_in_the_schedule_table():
  from t5align import schedule
  cal = calibration.Calibration('prop1', 1024, 512, 1.0, clamped=True,
                                note='Prop. 1 has no real root; closest approach 2C/B used; '
                                     'closed form gave tau=9.1 > 1; clamped to 1')
  table = schedule.TemperatureSchedule(512, {'prop1': (cal,)}, 'prop1').table()
  assert '1.000*' in table
  assert 'Prop. 1 (P_max) at 1024: Prop. 1 has no real root' in table
  loaded = schedule.TemperatureSchedule.from_dict(
      schedule.TemperatureSchedule(512, {'prop1': (cal,)}, 'prop1').to_dict())
  assert loaded.calibrations['prop1'][0] == cal


@pytest.mark.slow
def test_layer0_sorted_logits_match_numpy_and_closed_forms(tiny, numpy_layer0_sorted):
  config, params, ref = tiny
  tokens = calibration.cut_to_length(ref['encoder_input_tokens'], L_EX, 1)
  expected = numpy_layer0_sorted(config, params, tokens)
  # 81 = 5 x 16 + 1: the last chunk is mostly padding queries.
  got = calibration.layer0_sorted_logits(params, config, tokens, chunk=16)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  # A padded row equals the same row unpadded.
  padded = np.pad(tokens[:1, :40], ((0, 0), (0, 41)))
  np.testing.assert_allclose(calibration.layer0_sorted_logits(params, config, padded, chunk=16),
                             calibration.layer0_sorted_logits(params, config, tokens[:1, :40],
                                                              chunk=16),
                             rtol=1e-5, atol=1e-5)
  # One chunk (128 clipped to 81) inside the closed-form strategy.
  result = calibration.calibrate(params, config, tokens, 'prop2', reference_length=L_TR)
  s_tr, s_ex = result.details['reference']['sigma'], result.details['extrapolation']['sigma']
  np.testing.assert_allclose(s_ex, np.std(expected), rtol=1e-5)
  np.testing.assert_allclose(result.tau, s_ex / np.sqrt(s_tr**2 + 2 * np.log(L_EX / L_TR)))


def test_cut_to_length_keeps_eos():
  tokens = np.array([[5, 6, 7, 8, 1], [5, 6, 1, 0, 0]])
  np.testing.assert_array_equal(calibration.cut_to_length(tokens, 3, 1), [[5, 6, 1], [5, 6, 1]])
  np.testing.assert_array_equal(calibration.cut_to_length(tokens, 4, 1),
                                [[5, 6, 7, 1], [5, 6, 1, 0]])
  np.testing.assert_array_equal(calibration.length_groups(tokens)[0], [[5, 6, 1]])
  groups = calibration.length_groups(tokens, multiple=4)  # Widths 3 -> 4 and 5 -> 5 (at most l).
  np.testing.assert_array_equal(groups[0], [[5, 6, 1, 0]])
  np.testing.assert_array_equal(groups[1], [[5, 6, 7, 8, 1]])
  assert len(calibration.length_groups(tokens, multiple=8)) == 1


def test_bad_inputs_raise_clear_errors(tiny):
  config, params, ref = tiny
  tokens = ref['encoder_input_tokens']
  for taus, message in (([0.9, 0.0], 'finite and > 0'), ([-1.0], 'finite and > 0'),
                        ([np.nan], 'finite and > 0'), ([np.inf], 'finite and > 0'),
                        ([], 'non-empty'), (np.ones((2, 3)), 'per-layer')):
    with pytest.raises(ValueError, match=message):
      calibration.encoder_attention_stats(params, config, tokens, taus)
  for bad, message in ((np.zeros((0, 8), np.int32), 'non-empty'),
                       (np.zeros((2, 8), np.int32), 'no non-pad tokens'),
                       (np.ones(8, np.int32), r'\[batch, length\]'),
                       (np.ones((2, 8), np.float32), 'integer')):
    with pytest.raises(ValueError, match=message):
      calibration.encoder_attention_stats(params, config, bad, [1.0])
  with pytest.raises(ValueError, match='shorter than L_tr'):
    calibration.calibrate(params, config, tokens, 'pmax')  # 160 < 512
  with pytest.raises(ValueError, match='strategy'):
    calibration.calibrate(params, config, tokens, 'max_prob', reference_length=32)
  with pytest.raises(ValueError, match='cannot cut'):
    calibration.cut_to_length(tokens, 400, 1)
  with pytest.raises(ValueError, match='bracket'):
    calibration.bisect_search(lambda t: t, 0.5, increasing=True, bracket=(1.0, 0.5))
  with pytest.raises(ValueError, match='>= 2'):
    calibration.log_length_tau(1, 512)
  with pytest.raises(ValueError, match='needs 16 devices'):
    partitioning.calibration_mesh(8, 2)


@pytest.mark.parametrize('increasing', [True, False])
@pytest.mark.parametrize('crossing', [0.3, 0.5, 0.5004, 0.62, 0.75, 0.83, 0.9501, 0.99, 0.051,
                                      0.02, 1.2])
def test_search_solves_to_tol_cold_and_warm_started_from_the_grid(crossing, increasing):
  """Both searches end on an interval of width <= tol holding the crossing; the grid's values
  save calls (one call inside the grid); every call evaluates the same number of taus."""
  sign = 1.0 if increasing else -1.0
  sizes = []

  def evaluate(taus):
    sizes.append(len(taus))
    return sign * np.tanh(3.0 * (np.asarray(taus) - crossing))  # monotone, target 0 at crossing

  grid = np.asarray(calibration.PAPER_GRID)
  cold = calibration.bisect_search(evaluate, 0.0, increasing=increasing, points=2)
  known = (grid, sign * np.tanh(3.0 * (grid - crossing)))
  warm = calibration.bisect_search(evaluate, 0.0, increasing=increasing, points=2, known=known)
  assert set(sizes) == {2}
  assert cold[2]['calls'] + warm[2]['calls'] == len(sizes)
  for tau, value, details in (cold, warm):
    assert value == sign * np.tanh(3.0 * (tau - crossing))  # The statistic at the answer.
    if not 0.05 < crossing < 1.0:
      assert details['clamped'] and tau == (0.05 if crossing < 0.05 else 1.0)
      continue
    lo, hi = details['bracket']
    assert not details['clamped'] and hi - lo <= 1e-3 and lo <= crossing <= hi, details
    assert tau in (lo, hi) and abs(tau - crossing) <= 1e-3
  # Trisection from (0.05, 1.0) to 1e-3 takes 8 calls (7 rounds and the ends).
  assert cold[2]['calls'] <= 6, cold[2]
  if 0.5 < crossing < 1.0:
    assert warm[2]['calls'] == 1, warm[2]
  elif crossing < 0.5:  # Below the grid: secants from its lowest taus (fixed steps took 5).
    assert warm[2]['calls'] <= 4, warm[2]


def test_searches_warm_started_from_the_shared_sweep_agree_with_fresh_ones(tiny):
  """After the grid strategies, bisection and per-layer searches reuse their sweep: the same
  alignment (taus within tol, each achieving the target) in fewer calls."""
  config, params, ref = tiny
  tokens = calibration.cut_to_length(ref['encoder_input_tokens'], L_EX, 1)
  memo = calibration.Memo()
  calibration.calibrate(params, config, tokens, 'pmax', reference_length=L_TR, memo=memo)
  for strategy in ('pmax_bisect', 'pmax_per_layer'):
    fresh = calibration.calibrate(params, config, tokens, strategy, reference_length=L_TR)
    warm = calibration.calibrate(params, config, tokens, strategy, reference_length=L_TR,
                                 memo=memo)
    assert warm.clamped == fresh.clamped is False
    np.testing.assert_allclose(warm.tau, fresh.tau, atol=1e-3, rtol=0)
    np.testing.assert_allclose(warm.achieved, warm.target, rtol=5e-3)
    calls = lambda c: sum(i['calls'] for i in c.details.get('layers', [c.details]))
    assert calls(warm) < calls(fresh), (calls(warm), calls(fresh))


# ------------------------------------------------------------------ per head


@pytest.mark.slow
def test_per_head_stats_match_numpy_float64(tiny, numpy_head_stats):
  """Per-head means from the compiled sweep against logits materialized per head in float64,
  at tau = 1 and at one tau per layer and head; per layer they are the heads' mean."""
  config, params, ref = tiny
  tokens = ref['encoder_input_tokens'][:, :128]  # Row 1 has 81 tokens, then padding.
  n, h = config.num_encoder_layers, config.num_heads
  taus = np.stack([np.ones((n, h)), np.random.default_rng(0).uniform(0.5, 1.0, (n, h))])
  stats = calibration.encoder_attention_stats(params, config, tokens, taus)  # [t, n, h] taus
  assert stats.head_pmax.shape == stats.head_entropy.shape == (2, n, h)
  for i, row in enumerate(taus):
    pmax, entropy = numpy_head_stats(config, params, tokens, row[None])
    np.testing.assert_allclose(stats.head_pmax[i], pmax, rtol=HEAD_RTOL)
    np.testing.assert_allclose(stats.head_entropy[i], entropy, rtol=HEAD_RTOL)
  np.testing.assert_allclose(stats.layer_pmax, stats.head_pmax.mean(-1), rtol=1e-12)
  np.testing.assert_allclose(stats.pmax, stats.head_pmax.mean((1, 2)), rtol=1e-12)
  with pytest.raises(ValueError, match=r'expected \[t\], \[t, 2\] per-layer or \[t, 2, 4\]'):
    calibration.encoder_attention_stats(params, config, tokens, np.ones((1, 2, 3)))
  with pytest.raises(ValueError, match=r'\[t\], \[t, layers\] or \[t, layers, heads\]'):
    calibration.encoder_attention_stats(params, config, tokens, np.ones((1, 2, 4, 1)))


def test_lockstep_searches_equal_each_search_alone():
  """Independent searches run together give each search's own answer, in as many calls as the
  slowest needs; every call holds one column per search."""
  crossings = (0.3, 0.62, 0.9501, 0.051, 1.2, 0.02)
  curve = lambda taus, c: np.tanh(3.0 * (np.asarray(taus) - c))
  alone = [calibration.bisect_search(lambda t, c=c: curve(t, c), 0.0, increasing=True)
           for c in crossings]
  shapes = []

  def evaluate(columns):  # [t, k] -> [t, k]: column j depends on column j only
    shapes.append(columns.shape)
    return np.stack([curve(columns[:, j], c) for j, c in enumerate(crossings)], axis=1)

  together = calibration.run_lockstep(
      [calibration.bisect_steps(0.0, increasing=True) for _ in crossings], evaluate)
  assert together == alone
  assert len(shapes) == max(r[2]['calls'] for r in alone) and set(shapes) == {(2, 6)}
  # A guess near the crossing (within 0.025, 0.05 or 0.2) saves calls and gives the same answer
  # to tol; a guess off the bracket still finds it.
  for c, alone_result in zip(crossings[:3], alone):
    for off in (0.01, -0.04, 0.2, -2.0):
      tau, _, details = calibration.run_steps(
          calibration.bisect_steps(0.0, increasing=True, guess=c + off), lambda t, c=c: curve(t, c))
      assert abs(tau - c) <= 1e-3 and not details['clamped'], (c, off, details)
      if abs(off) < 0.05:
        assert details['calls'] < alone_result[2]['calls'], (c, off, details)
  grid = calibration.run_lockstep([calibration.grid_steps(v) for v in (0.1, -0.4)],
                                  lambda cols: np.tanh(cols - 0.75))
  assert grid == [calibration.grid_search(lambda t: np.tanh(t - 0.75), v) for v in (0.1, -0.4)]


@pytest.mark.slow
@pytest.mark.parametrize('statistic', calibration.STATISTICS)
def test_per_head_search_recovers_known_taus(tiny, statistic):
  """Targets made by known per-head taus at L_ex: the search finds those taus (to its 1e-3
  tolerance), layer by layer with a layer's heads together."""
  config, params, ref = tiny
  tokens = calibration.cut_to_length(ref['encoder_input_tokens'], L_EX, 1)
  known = np.array([[0.9, 0.6, 0.75, 0.8], [0.55, 0.95, 0.7, 0.85]])  # [n, h]
  head = lambda rows: getattr(calibration.encoder_attention_stats(params, config, tokens, rows),
                              f'head_{statistic}')
  calls = []
  evaluate = lambda rows: calls.append(rows.shape) or head(rows)
  steps = lambda target, known, guess: calibration.bisect_steps(
      target, increasing=statistic == 'entropy', known=known, guess=guess)
  chosen, values, infos = calibration.align_heads(evaluate, head(known[None])[0], steps=steps)
  np.testing.assert_allclose(chosen, known, atol=1e-3, rtol=0)
  np.testing.assert_allclose(values, head(chosen[None])[0], rtol=1e-6)
  assert all(r == (2, 2, 4) for r in calls) and len(calls) == sum(i['calls'] for i in infos)


def test_per_head_calibration_aligns_each_head(tiny):
  config, params, ref = tiny
  tokens = calibration.cut_to_length(ref['encoder_input_tokens'], L_EX, 1)
  memo = calibration.Memo()
  result = calibration.calibrate(params, config, tokens, 'pmax_per_head', reference_length=L_TR,
                                 memo=memo)
  n, h = config.num_encoder_layers, config.num_heads
  assert np.shape(result.tau) == np.shape(result.target) == np.shape(result.achieved) == (n, h)
  assert not result.clamped
  np.testing.assert_allclose(result.achieved, result.target, rtol=5e-3)
  target = calibration.encoder_attention_stats(
      params, config, calibration.cut_to_length(tokens, L_TR, 1), [1.0])
  np.testing.assert_allclose(result.target, target.head_pmax[0], rtol=1e-6)
  # Re-evaluating the chosen per-head taus in one pass reproduces each head's value.
  stats = calibration.encoder_attention_stats(params, config, tokens, [result.tau])
  np.testing.assert_allclose(stats.head_pmax[0], result.achieved, rtol=1e-6)
  # The grid sweep warm-starts the heads: the same alignment in fewer calls.
  calibration.calibrate(params, config, tokens, 'pmax', reference_length=L_TR, memo=memo)
  warm = calibration.calibrate(params, config, tokens, 'pmax_per_head', reference_length=L_TR,
                               memo=memo)
  np.testing.assert_allclose(warm.achieved, warm.target, rtol=5e-3)
  calls = lambda c: [layer['calls'] for layer in c.details['layers']]
  # Layer 0 from the sweep's exact values, layer 1 from the sweep's guesses: fewer calls.
  assert calls(warm)[0] < calls(result)[0] and calls(warm)[1] < calls(result)[1], (
      calls(warm), calls(result))
