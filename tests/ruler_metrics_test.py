"""RULER's metrics against written-out values of upstream's definitions.

Upstream (NVIDIA/RULER:scripts/eval/synthetic/constants.py, eval/evaluate.py; ../shared/docs/
YARDSTICKS.md section 1.4): a prediction is stripped, its U+0000..U+001F characters become
newlines, it is stripped again; string_match_all averages, per example, the fraction of its
references found in it (case-insensitive); string_match_part averages 1 for any reference found;
the task score is `round(sum / n * 100, 2)`. Each expected value below is worked out by hand from
those definitions; the lm-eval values named beside them are what its port
(lm_eval/tasks/ruler/common_utils.py, called per example) gives instead.
"""
from __future__ import annotations

import json

import pytest

from seqio_tasks import metrics
from seqio_tasks.ruler import metrics as ruler_metrics


def test_yardsticks_design_note_values():
  # YARDSTICKS 1.5 item 6.
  assert ruler_metrics.string_match_all(['a b'], [['a', 'c']]) == 50.0
  assert ruler_metrics.string_match_part(['a b'], [['a', 'c']]) == 100.0


@pytest.mark.parametrize('prediction, references, match_all, match_part', [
    # niah_multivalue: 4 values, 1 found. Upstream part: 100 (any); lm-eval's part: 25.
    ('The numbers are 1234567 and 42.', ['1234567', '7654321', '1111111', '2222222'], 25.0, 100.0),
    # Case-insensitive both ways.
    ('THE SPECIAL MAGIC uuid IS 9F3C', ['9f3c', 'Special magic UUID'], 100.0, 100.0),
    ('Élan vital', ['éLAN'], 100.0, 100.0),
    # Substring, not word match.
    ('1234567890', ['2345'], 100.0, 100.0),
    # None found.
    ('no answer', ['x1', 'y2'], 0.0, 0.0),
    # Postprocessing: leading control characters become a newline, then stripped away.
    ('\x01 answer\x02 ', [' answer'], 0.0, 0.0),   # the ' ' before 'answer' was stripped
    ('\x01answer\x02', ['answer'], 100.0, 100.0),
    # A tab inside becomes a newline, so a reference holding the tab is not found any more.
    ('a\tb', ['a\tb'], 0.0, 0.0),
    ('a\tb', ['a\nb'], 100.0, 100.0),
    # An empty reference is in every string, the empty prediction included (upstream's `in`).
    ('', [''], 100.0, 100.0),
    ('   ', ['x'], 0.0, 0.0),
])
def test_one_example(prediction, references, match_all, match_part):
  assert ruler_metrics.string_match_all([prediction], [references]) == match_all
  assert ruler_metrics.string_match_part([prediction], [references]) == match_part


def test_several_examples_and_upstream_rounding():
  predictions = ['alpha beta', 'gamma', 'delta']
  references = [['alpha', 'beta', 'zeta'], ['gamma'], ['x', 'y']]
  # all: (2/3 + 1 + 0) / 3 * 100 = 55.555... -> 55.56.
  assert ruler_metrics.string_match_all(predictions, references) == 55.56
  # part: (1 + 1 + 0) / 3 * 100 = 66.666... -> 66.67 (lm-eval's part would give 55.56).
  assert ruler_metrics.string_match_part(predictions, references) == 66.67
  # 1 of 3: 33.333... -> 33.33; 1 of 6 references at 1/2 in one of 7 examples: 7.142857 -> 7.14.
  assert ruler_metrics.string_match_all(['a', 'b', 'c'], [['a'], ['x'], ['y']]) == 33.33
  assert ruler_metrics.string_match_all(['p'] * 7, [['p', 'q']] + [['z']] * 6) == 7.14


def test_aggregate_counts_nulls_and_refuses_bad_input():
  scores = [ruler_metrics.score_example('string_match_all', p, ['x'])
            for p in ('x', '  ', '\x00\n', 'y')]
  assert [s['null'] for s in scores] == [0.0, 1.0, 1.0, 0.0]
  assert ruler_metrics.aggregate('string_match_all', scores) == {
      'score': 25.0, 'string_match_all': 25.0, 'nulls': 2.0}
  with pytest.raises(ValueError, match='non-empty list of reference strings'):
    ruler_metrics.match_all('x', [])
  with pytest.raises(ValueError, match='non-empty list of reference strings'):
    ruler_metrics.match_part('x', 'x')
  with pytest.raises(ValueError, match='must be strings'):
    ruler_metrics.match_all('1', [1])
  with pytest.raises(ValueError, match='2 predictions but 1 reference'):
    ruler_metrics.string_match_all(['a', 'b'], [['a']])
  with pytest.raises(ValueError, match='no RULER metric'):
    ruler_metrics.score_example('string_match_any', 'a', ['a'])
  with pytest.raises(ValueError, match='no examples'):
    ruler_metrics.aggregate('string_match_part', [])


def _target(outputs):
  """What `metrics.postprocess` makes of a RULER example's target (seqio's postprocess_fn)."""
  example = {'meta': json.dumps({'outputs': outputs}).encode(), 'inputs': [5, 6, 1],
             'targets': [7, 1]}
  return metrics.postprocess(b', '.join(o.encode() for o in outputs), example=example,
                             is_target=True)


def test_seqio_metric_functions_read_every_reference():
  targets = [_target(['1234567', '7654321']), _target(['Paris', 'paris, France'])]
  predictions = ['The special magic numbers are: 7654321.', ' paris ']
  # all: (1/2 + 1/2) / 2 ('paris, france' is not in 'paris'); part: (1 + 1) / 2.
  assert metrics.make_metric_fn('string_match_all')(targets, predictions) == {
      'score': 50.0, 'string_match_all': 50.0, 'nulls': 0.0}
  assert metrics.make_metric_fn('string_match_part')(targets, predictions) == {
      'score': 100.0, 'string_match_part': 100.0, 'nulls': 0.0}
  assert metrics.primary_metric('string_match_all') == 'score'
  assert metrics.primary_metric('string_match_part') == 'score'


def test_a_target_without_references_is_refused():
  target = metrics.postprocess(b'x', example={'meta': b'{}'}, is_target=True)
  with pytest.raises(ValueError, match="no meta 'outputs'"):
    metrics.score_example('string_match_all', target, 'x')
