"""report (t5align/evaluation/tables.py): the binomial intervals printed beside accuracies, and
the metrics.json files it cannot read (cut off, incomplete, a metric that is no number) named."""
from __future__ import annotations

import json

import pytest
from scipy import stats

from t5align.evaluation import tables


@pytest.mark.parametrize('successes,trials', [(0, 10), (5, 10), (10, 10), (45, 50), (1, 60),
                                              (59, 60), (37, 100)])
def test_binomial_interval_is_scipys_wilson_interval(successes, trials):
  expected = stats.binomtest(successes, trials).proportion_ci(0.95, method='wilson')
  low, high = tables.binomial_interval(successes, trials)
  assert low == pytest.approx(expected.low, abs=1e-6)
  assert high == pytest.approx(expected.high, abs=1e-6)


def test_binomial_interval_written_out_values():
  # Wilson 95% for 5 of 10: the textbook (0.2366, 0.7634); 0 of 10: upper bound 0.2775.
  assert tables.binomial_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
  assert tables.binomial_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)


def test_accuracy_cell():
  assert tables.accuracy_cell(90.0, 50) == '90 [79-96]'
  assert tables.accuracy_cell(100.0, 50) == '100 [93-100]'
  with pytest.raises(ValueError, match='not a whole number of 50'):
    tables.accuracy_cell(33.3, 50)
  with pytest.raises(ValueError, match='successes=11, trials=10'):
    tables.binomial_interval(11, 10)


@pytest.mark.parametrize('percent,baseline,verdict', [
    # Issue 22's cases: lines at 1024, 92 [81-97] vs 78 [65-87]; kv at 4096, 12 [6-24] vs 0 [0-7]:
    # the intervals overlap.
    (92.0, 78.0, 'within noise'), (12.0, 0.0, 'within noise'),
    (42.0, 0.0, 'better'),  # 42 [29-56] vs 0 [0-7]
    (70.0, 96.0, 'worse'),  # 70 [56-81] vs 96 [87-99]
    (100.0, 100.0, 'within noise'),
    (16.0, 0.0, 'better'),  # 16 [8.34-28.5] vs 0 [0-7.13]: the first count that clears it
    (14.0, 0.0, 'within noise'),  # 14 [6.95-26.2]: 6.95 < 7.13
])
def test_compare_accuracies_by_disjoint_intervals(percent, baseline, verdict):
  assert tables.compare_accuracies(percent, baseline, 50) == verdict


def test_accuracy_interval_is_the_wilson_interval_in_percent():
  assert tables.accuracy_interval(90.0, 50) == pytest.approx(
      tuple(100 * x for x in tables.binomial_interval(45, 50)))
  with pytest.raises(ValueError, match='not a whole number of 50'):
    tables.accuracy_interval(33.3, 50)


@pytest.mark.parametrize('content, message', [
    ('{"group": "Passkey", "col', r'metrics.json:1: not valid JSON .*truncated'),
    ('{"group": "Passkey", "metrics": {}}', r'metrics.json is incomplete: it lacks column'),
])
def test_corrupt_metrics_json_in_report(content, message, tmp_path):
  (tmp_path / 'task').mkdir()
  (tmp_path / 'task' / 'metrics.json').write_text(content)
  with pytest.raises(ValueError, match=message) as e:
    tables.load_results([tmp_path])
  assert str(tmp_path / 'task' / 'metrics.json') in str(e.value)


def test_a_string_metric_in_metrics_json_names_the_file_and_metric(tmp_path):
  (tmp_path / 'task').mkdir()
  (tmp_path / 'task' / 'metrics.json').write_text(json.dumps(
      {'group': 'Passkey', 'column': '4k', 'metrics': {'accuracy': 'high'}}))
  with pytest.raises(ValueError, match=r"metric 'accuracy' is 'high'; expected a number") as e:
    tables.load_results([tmp_path])
  assert str(tmp_path / 'task' / 'metrics.json') in str(e.value)
