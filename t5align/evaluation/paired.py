"""Paired comparison of rows evaluated on the same examples: the exact McNemar test.

Two rows (encoder-temperature rules) scored on the same held-out examples differ only where one
is right and the other wrong; the exact McNemar test asks whether those discordant examples
split evenly. Unlike comparing two accuracies' intervals it uses the pairing, so it separates
rules whose intervals overlap. No JAX: numpy and the report's Wilson interval only.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Mapping

import numpy as np

from t5align.evaluation import tables

ALPHA = 0.05  # Two-sided level of the verdicts.
VERDICTS = ('better', 'worse', 'no difference')


def _count(value: Any, name: str) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
    raise ValueError(f'mcnemar_exact: {name}={value!r}; expected a count (an integer >= 0).')
  return int(value)


def mcnemar_exact(b: int, c: int) -> float:
  """Two-sided exact McNemar p-value of `b` and `c` discordant pairs.

  Under the null hypothesis each discordant pair goes either way with probability 1/2, so
  p = min(1, 2 * P[X <= min(b, c)]) for X ~ Binomial(b + c, 1/2), and 1 when b + c == 0.

  Args:
    b: pairs where the first row is right and the second wrong.
    c: pairs where the first row is wrong and the second right.

  Returns:
    The p-value in (0, 1], from exact integer sums (so 22/1024 for b=1, c=9 exactly).
  """
  b, c = _count(b, 'b'), _count(c, 'c')
  n = b + c
  if n == 0:
    return 1.0
  tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
  # NOTE: int / int is correctly rounded, so the only rounding is this one division.
  return min(1.0, 2 * tail / 2**n)


def _outcomes(x: Any, name: str) -> np.ndarray:
  """`x` as bool `[n]`: per-example correctness (booleans, or scores 0 and 1)."""
  a = np.asarray(x)
  if a.ndim != 1:
    raise ValueError(f'{name}: expected one outcome per example (shape [n]); got shape '
                     f'{a.shape}.')
  if a.dtype == bool:
    return a
  if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
    raise ValueError(f'{name}: expected booleans or 0/1 scores; got dtype {a.dtype}.')
  bad = sorted({v for v in a.tolist() if v not in (0, 1)})
  if bad:
    raise ValueError(f'{name}: expected booleans or 0/1 scores; got {bad[:5]}.')
  return a == 1


def discordant(a: Any, b: Any) -> tuple[int, int]:
  """The discordant counts of two rows' outcomes on the same examples.

  Args:
    a: per-example correctness of the first row, `[n]` (booleans or 0/1 scores).
    b: the second row's on the same examples in the same order, `[n]`.

  Returns:
    (examples `a` gets right and `b` wrong, examples `a` gets wrong and `b` right): the `b` and
    `c` of `mcnemar_exact`.
  """
  a, b = _outcomes(a, 'discordant: a'), _outcomes(b, 'discordant: b')
  if a.shape != b.shape:
    raise ValueError(f'discordant: the rows have {a.size} and {b.size} outcomes; a paired test '
                     'needs both rows on the same examples.')
  return int(np.sum(a & ~b)), int(np.sum(~a & b))


def _versus(mine: np.ndarray, theirs: np.ndarray) -> dict[str, Any]:
  wins, losses = discordant(mine, theirs)
  return {'wins': wins, 'losses': losses, 'p': mcnemar_exact(wins, losses)}


def compare_rows(outcomes: Mapping[str, Any], *, baseline: str = 'tau=1',
                 alpha: float = ALPHA) -> dict[str, Any]:
  """One cell's rows compared on its examples: accuracy, interval and paired tests.

  Args:
    outcomes: {row: per-example correctness `[n]`}, every row on the same `n` examples in the
      same order, in the order rows are listed (ties for the best go to the first).
    baseline: the row every other is tested against (kept in `outcomes`).
    alpha: two-sided level of the verdicts.

  Returns:
    {'n', 'baseline', 'alpha', 'best', 'rows': {row: {'correct', 'accuracy' (%), 'interval'
    ([low, high] %, 95% Wilson), 'vs_baseline' and 'vs_best' ({'wins', 'losses', 'p'}: the
    examples only this row gets right, those only the other gets right, the exact McNemar
    p-value)), 'verdict'}}}. 'verdict' is 'better' or 'worse' than the baseline where
    p < alpha (by the sign of wins - losses), else 'no difference' (the baseline's own too).
  """
  if not outcomes:
    raise ValueError('compare_rows: no rows to compare.')
  if baseline not in outcomes:
    raise ValueError(f'compare_rows: no baseline row {baseline!r} among {list(outcomes)}.')
  if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 < alpha < 1:
    raise ValueError(f'compare_rows: alpha={alpha!r}; expected a level in (0, 1).')
  rows = {r: _outcomes(x, f'compare_rows: row {r!r}') for r, x in outcomes.items()}
  sizes = {r: int(x.size) for r, x in rows.items()}
  if len(set(sizes.values())) != 1:
    raise ValueError(f'compare_rows: the rows have different numbers of examples {sizes}; a '
                     'paired test needs every row on the same examples.')
  n = sizes[baseline]
  if n == 0:
    raise ValueError('compare_rows: the rows have no examples.')
  correct = {r: int(x.sum()) for r, x in rows.items()}
  best = max(rows, key=lambda r: correct[r])  # The first of the most correct.
  out = {}
  for r, x in rows.items():
    low, high = tables.binomial_interval(correct[r], n)
    vs_base = _versus(x, rows[baseline])
    verdict = 'no difference'
    if vs_base['p'] < alpha:
      verdict = 'better' if vs_base['wins'] > vs_base['losses'] else 'worse'
    out[r] = {'correct': correct[r], 'accuracy': 100.0 * correct[r] / n,
              'interval': [100.0 * low, 100.0 * high], 'vs_baseline': vs_base,
              'vs_best': _versus(x, rows[best]), 'verdict': verdict}
  return {'n': n, 'baseline': baseline, 'alpha': float(alpha), 'best': best, 'rows': out}


def rows_with(cell: Mapping[str, Any], verdict: str) -> list[str]:
  """The rows of a `compare_rows` cell with `verdict` ('better', 'worse', 'no difference'),
  the baseline left out."""
  if verdict not in VERDICTS:
    raise ValueError(f'rows_with: verdict={verdict!r}; expected one of {VERDICTS}.')
  return [r for r, v in cell['rows'].items() if r != cell['baseline'] and v['verdict'] == verdict]


def tied_with_best(cell: Mapping[str, Any]) -> list[str]:
  """The rows of a `compare_rows` cell not significantly below its best (p >= alpha vs the
  best, the best included)."""
  return [r for r, v in cell['rows'].items()
          if r == cell['best'] or v['vs_best']['p'] >= cell['alpha']]
