"""t5align/evaluation/paired.py against scipy's exact binomial test and values worked out by
hand (as fractions), and its verdicts on a hand-made cell."""
from __future__ import annotations

from fractions import Fraction
import math

import numpy as np
import pytest
from scipy import stats

from t5align.evaluation import paired


@pytest.mark.parametrize('b, c', [
    (1, 9), (9, 1), (0, 1), (3, 3), (4, 5), (0, 7), (2, 8), (12, 30), (50, 61), (100, 140),
    (0, 200), (97, 103)])
def test_mcnemar_exact_is_scipys_two_sided_binomial_test(b, c):
  expected = stats.binomtest(min(b, c), b + c, 0.5, alternative='two-sided').pvalue
  np.testing.assert_allclose(paired.mcnemar_exact(b, c), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize('b, c, expected', [
    # 2 * (C(10,0) + C(10,1)) / 2^10
    (1, 9, Fraction(2 * (1 + 10), 2**10)),
    (9, 1, Fraction(22, 1024)),
    # 2 * (1 + 10 + 45) / 2^10
    (2, 8, Fraction(2 * (1 + 10 + 45), 2**10)),
    (0, 5, Fraction(2, 2**5)),  # 1/16: five to none is not significant at 5%.
    (0, 6, Fraction(2, 2**6)),  # 1/32: six to none is.
    (3, 3, Fraction(1)),  # 2 * P[X <= 3] > 1 for X ~ B(6, 1/2): capped at 1.
    (0, 0, Fraction(1)),  # No discordant pair: nothing to test.
    # 2 * (1 + 15) / 2^15 and 2 * (1 + 16) / 2^16
    (1, 14, Fraction(32, 2**15)),
    (1, 15, Fraction(34, 2**16)),
])
def test_mcnemar_exact_textbook_values(b, c, expected):
  assert paired.mcnemar_exact(b, c) == float(expected)


def test_mcnemar_exact_b1_c9_is_22_over_1024_exactly():
  assert paired.mcnemar_exact(1, 9) == 0.021484375
  assert paired.mcnemar_exact(np.int64(1), np.int64(9)) == 0.021484375


@pytest.mark.parametrize('b, c, message', [
    (-1, 3, r'b=-1; expected a count'),
    (2, 1.5, r'c=1\.5; expected a count'),
    (True, 3, r'b=True; expected a count'),
    ('2', 3, r"b='2'; expected a count"),
])
def test_mcnemar_exact_refuses_what_is_not_a_count(b, c, message):
  with pytest.raises(ValueError, match=message):
    paired.mcnemar_exact(b, c)


def test_discordant_counts_each_way():
  a = [True, True, False, False, True, False]
  b = [True, False, True, False, False, False]
  assert paired.discordant(a, b) == (2, 1)
  assert paired.discordant(b, a) == (1, 2)
  # The demo's records score 0.0 or 1.0.
  assert paired.discordant(np.asarray(a, float), np.asarray(b, int)) == (2, 1)


def test_discordant_refuses_rows_of_different_lengths():
  with pytest.raises(ValueError, match=r'the rows have 3 and 4 outcomes'):
    paired.discordant([1, 0, 1], [1, 0, 1, 1])


@pytest.mark.parametrize('a, message', [
    ([1, 0, 0.5], r'got \[0\.5\]'),
    ([[1, 0], [0, 1]], r'shape \[n\]\); got shape \(2, 2\)'),
    (['1', '0'], r'got dtype <U1'),
])
def test_discordant_refuses_what_is_not_an_outcome(a, message):
  with pytest.raises(ValueError, match=message):
    paired.discordant(a, [1, 0])


def _row(*right: range, n: int = 20) -> np.ndarray:
  out = np.zeros(n, bool)
  for r in right:
    out[list(r)] = True
  return out


# tau = 1 gets examples 0-9 of 20 right. 'good' loses example 0 and wins 10-18 (9 to 1), 'bad'
# loses 4-9 (0 to 6), 'meh' loses 5-9 (0 to 5: half the accuracy, but not significant).
CELL = {'tau=1': _row(range(10)), 'meh': _row(range(5)), 'good': _row(range(1, 19)),
        'bad': _row(range(4))}


def _wilson(k: int, n: int, z: float = 1.959964) -> list[float]:
  p = k / n
  center = (p + z**2 / (2 * n)) / (1 + z**2 / n)
  half = z * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / (1 + z**2 / n)
  return [100 * max(0.0, center - half), 100 * min(1.0, center + half)]


def test_compare_rows_on_a_hand_made_cell():
  cell = paired.compare_rows(CELL)
  assert (cell['n'], cell['baseline'], cell['alpha'], cell['best']) == (20, 'tau=1', 0.05, 'good')
  rows = cell['rows']
  assert list(rows) == ['tau=1', 'meh', 'good', 'bad']
  assert {r: v['correct'] for r, v in rows.items()} == {'tau=1': 10, 'meh': 5, 'good': 18,
                                                       'bad': 4}
  assert {r: v['accuracy'] for r, v in rows.items()} == {'tau=1': 50.0, 'meh': 25.0,
                                                        'good': 90.0, 'bad': 20.0}
  for r, v in rows.items():
    np.testing.assert_allclose(v['interval'], _wilson(v['correct'], 20), rtol=1e-9)
  np.testing.assert_allclose(rows['tau=1']['interval'], [29.93, 70.07], atol=0.005)
  assert {r: (v['vs_baseline']['wins'], v['vs_baseline']['losses'], v['vs_baseline']['p'])
          for r, v in rows.items()} == {
              'tau=1': (0, 0, 1.0), 'meh': (0, 5, 1 / 16), 'good': (9, 1, 22 / 1024),
              'bad': (0, 6, 1 / 32)}
  assert {r: (v['vs_best']['wins'], v['vs_best']['losses'], v['vs_best']['p'])
          for r, v in rows.items()} == {
              'tau=1': (1, 9, 22 / 1024), 'meh': (1, 14, 32 / 2**15), 'good': (0, 0, 1.0),
              'bad': (1, 15, 34 / 2**16)}
  assert {r: v['verdict'] for r, v in rows.items()} == {
      'tau=1': 'no difference', 'meh': 'no difference', 'good': 'better', 'bad': 'worse'}
  assert paired.rows_with(cell, 'better') == ['good']
  assert paired.rows_with(cell, 'worse') == ['bad']
  assert paired.rows_with(cell, 'no difference') == ['meh']
  assert paired.tied_with_best(cell) == ['good']


def test_compare_rows_alpha_moves_the_verdicts():
  """At alpha = 0.1, 'meh' (p = 1/16) is significantly worse; at 0.01 nothing is significant
  (22/1024 and 1/32 are above it)."""
  loose = paired.compare_rows(CELL, alpha=0.1)
  assert paired.rows_with(loose, 'worse') == ['meh', 'bad']
  strict = paired.compare_rows(CELL, alpha=0.01)
  assert paired.rows_with(strict, 'no difference') == ['meh', 'good', 'bad']
  assert paired.tied_with_best(strict) == ['tau=1', 'good']  # 22/1024 >= 0.01; 34/2^16 < it.


def test_compare_rows_best_of_a_tie_is_the_first_listed():
  cell = paired.compare_rows({'tau=1': [1, 0, 0], 'x': [0, 1, 1], 'y': [1, 1, 0]})
  assert cell['best'] == 'x'
  assert paired.tied_with_best(cell) == ['tau=1', 'x', 'y']


@pytest.mark.parametrize('outcomes, kwargs, message', [
    ({}, {}, 'no rows to compare'),
    ({'pmax': [1, 0]}, {}, r"no baseline row 'tau=1' among \['pmax'\]"),
    ({'tau=1': [1, 0], 'pmax': [1, 0, 1]}, {},
     r"different numbers of examples \{'tau=1': 2, 'pmax': 3\}"),
    ({'tau=1': []}, {}, 'the rows have no examples'),
    ({'tau=1': [1, 0]}, {'alpha': 1.5}, r'alpha=1\.5; expected a level in \(0, 1\)'),
    ({'tau=1': [1, 2]}, {}, r"row 'tau=1': expected booleans or 0/1 scores; got \[2\]"),
])
def test_compare_rows_refuses_bad_input(outcomes, kwargs, message):
  with pytest.raises(ValueError, match=message):
    paired.compare_rows(outcomes, **kwargs)


def test_rows_with_refuses_an_unknown_verdict():
  with pytest.raises(ValueError, match=r"verdict='within noise'; expected one of"):
    paired.rows_with(paired.compare_rows(CELL), 'within noise')
