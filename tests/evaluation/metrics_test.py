"""Tests for seqio_tasks/metrics.py against hand-computed values (no seqio needed)."""
from __future__ import annotations

import inspect
import json
import math

import numpy as np
import pytest

from seqio_tasks import metrics


def _target(text, length=0, **meta):
  return {'target': text, 'meta': meta, 'length': length}


@pytest.mark.parametrize('text, first, last', [
    ('The pass key is 12345.', 12345, 12345),
    ('12 then 345', 12, 345),
    ('no number at all', None, None),
    ('', None, None),
    ('<2416>', 2416, 2416),
    ('x-7 and 3.5', 7, 5),  # Digits only: no sign, no decimals (the upstream regex \d+).
])
def test_first_and_last_integer(text, first, last):
  assert metrics.first_integer(text) == first
  assert metrics.last_integer(text) == last


@pytest.mark.parametrize('prediction, expected', [
    ('12345', 1.0),
    (' 12345. Remember it.', 1.0),
    ('12345 or 678', 1.0),
    ('678 or 12345', 0.0),  # The first integer counts.
    ('1234', 0.0),
    ('I do not know', 0.0),  # No number.
])
def test_passkey_first_integer(prediction, expected):
  assert metrics.score_example('passkey', _target('12345'), prediction) == {'accuracy': expected}


@pytest.mark.parametrize('prediction, expected', [
    ('The <REGISTER_CONTENT> in line torpid-kid is 2416', 1.0),
    ('line 7 holds 2416', 1.0),
    ('2416, not 17', 0.0),  # The last integer counts (LongEval).
    ('nothing', 0.0),
])
def test_lines_last_integer(prediction, expected):
  assert metrics.score_example('lines', _target('2416'), prediction) == {'accuracy': expected}


@pytest.mark.parametrize('text, normalized', [
    ('The Eiffel-Tower!', 'eiffeltower'),  # Punctuation removed, not replaced.
    ('  An apple, a day ', 'apple day'),
    ('Theatre the  end', 'theatre end'),  # Whole-word articles only.
    ('Wilhelm Conrad Röntgen', 'wilhelm conrad röntgen'),
])
def test_normalize_answer(text, normalized):
  assert metrics.normalize_answer(text) == normalized


@pytest.mark.parametrize('prediction, answers, expected', [
    ('The answer is Wilhelm Conrad Röntgen.', ['Wilhelm Conrad Röntgen'], 1.0),
    ('beatles', ['The Beatles'], 1.0),  # Articles dropped on both sides.
    ('U.S.A', ['USA'], 1.0),  # Punctuation dropped.
    ('Paris\nLondon', ['London'], 0.0),  # Only the first line is read.
    ('London', ['Paris', 'London'], 1.0),  # Any answer.
    ('Lond', ['London'], 0.0),
    ('', ['London'], 0.0),
])
def test_mdqa_best_subspan_em(prediction, answers, expected):
  target = _target(answers[0], answers=answers)
  assert metrics.score_example('mdqa', target, prediction) == {'accuracy': expected}


TOPICS = ['The psychology of creativity', 'The impact of social media on communication',
          'Creativity']


@pytest.mark.parametrize('prediction, expected', [
    ('The first topic is the psychology of creativity.', 1.0),
    ('psychology of creativity', 1.0),  # 'The' is an article.
    ('Psychology of Creativity!', 1.0),
    ('creativity', 0.0),  # Not the whole topic.
    # Listing several topics does not score; 'creativity' (inside topic 0) does not count.
    ('psychology of creativity, impact of social media on communication', 0.0),
    ('', 0.0),
])
def test_topic_rule(prediction, expected):
  target = _target(TOPICS[0], topics=TOPICS)
  assert metrics.score_example('topics', target, prediction) == {'accuracy': expected}


def test_kv_case_insensitive_substring():
  value = 'bb3ba2a5-7de8-434b-a86e-a88bb9fa7289'
  assert metrics.score_example('kv', _target(value), f'"{value.upper()}"')['accuracy'] == 1.0
  assert metrics.score_example('kv', _target(value), value[:-1])['accuracy'] == 0.0


@pytest.mark.parametrize('prediction, target, em, es', [
    ('return x + 1', 'return x + 1', 1.0, 100.0),
    # Leading empty and blank lines are skipped; later lines ignored; EM on whitespace tokens.
    ('\n  \n   return x + 1  \nfoo()', 'return  x + 1', 1.0, 96.0),  # 2 * 12 / 25
    ('return x', 'return y', 0.0, 88.0),  # 2 * 7 / 16 = 0.875 -> 88
    ('', 'pass', 0.0, 0.0),
    ('\n\n', 'pass', 0.0, 0.0),  # Only empty lines: the prediction is ''.
])
def test_code_line_em_es(prediction, target, em, es):
  assert metrics.score_example('code_completion', _target(target), prediction) == {'em': em,
                                                                                   'es': es}


def test_edit_similarity_empty_pair():
  assert metrics.edit_similarity('', '') == 100.0


def test_code_buckets():
  targets = [_target('a', 500), _target('a', 1500), _target('a', 1999), _target('a', 2000)]
  scores = [{'em': 1.0, 'es': 100.0}, {'em': 1.0, 'es': 50.0}, {'em': 0.0, 'es': 0.0},
            {'em': 0.0, 'es': 30.0}]
  out = metrics.aggregate('code_completion', targets, scores)
  assert out['em'] == 50.0 and out['es'] == 45.0
  assert (out['em_<1k'], out['em_1k'], out['em_2k']) == (100.0, 50.0, 0.0)
  assert (out['es_<1k'], out['es_1k'], out['es_2k']) == (100.0, 25.0, 30.0)
  assert (out['count_<1k'], out['count_1k'], out['count_2k']) == (1.0, 2.0, 1.0)


def test_length_bucket():
  assert [metrics.length_bucket(n) for n in (0, 999, 1000, 15999, 16000)] == [
      '<1k', '<1k', '1k', '15k', '16k']


def test_accuracy_is_percent():
  out = metrics.aggregate('passkey', [_target('1')] * 4, [{'accuracy': a} for a in (1, 1, 1, 0)])
  assert out == {'accuracy': 75.0}


def test_perplexity():
  # ll = -4 ln 2 over 2 tokens -> 4; -8 ln 2 over 2 tokens -> 16; tokens: exp(12 ln 2 / 4) = 8.
  fn = metrics.make_metric_fn('lm')
  out = fn([{'num_tokens': 2}, {'num_tokens': 2}], np.array([-4 * math.log(2), -8 * math.log(2)]))
  np.testing.assert_allclose([out['perplexity'], out['token_perplexity']], [10.0, 8.0])
  with pytest.raises(ValueError, match='target token'):
    metrics.perplexity_scores(-1.0, 0)


def test_metric_fn_signatures_match_seqio_conventions():
  # seqio picks the model output from the positional parameter names.
  assert list(inspect.signature(metrics.make_metric_fn('passkey')).parameters) == [
      'targets', 'predictions']
  assert list(inspect.signature(metrics.make_metric_fn('lm')).parameters) == [
      'targets', 'scores']


def test_postprocess_reads_example():
  example = {'inputs': np.arange(7), 'targets': np.arange(3),
             'meta': np.array(json.dumps({'answers': ['x']}).encode())}
  out = metrics.postprocess(b'x', example=example, is_target=True)
  assert out == {'target': 'x', 'meta': {'answers': ['x']}, 'length': 7, 'num_tokens': 3}
  assert metrics.postprocess(b'pred', example=example, is_target=False) == 'pred'


def test_unknown_family():
  with pytest.raises(ValueError, match='no prediction scoring'):
    metrics.score_example('lm', _target('x'), 'x')
