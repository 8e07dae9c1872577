"""The long-context suites' metrics (ZeroSCROLLS and SCROLLS: `seqio_tasks.suite_metrics`; RULER:
`seqio_tasks.ruler.metrics`), each a family of the one registry `seqio_tasks.metrics.FAMILIES`,
against written-out values: SCROLLS' metric docstring example (tau/scrolls:metrics/scrolls.py,
../shared/docs/YARDSTICKS.md section 3.3), the ZeroSCROLLS paper's examples, `rouge_score` called
directly, and RULER's definitions (NVIDIA/RULER:scripts/eval/synthetic/constants.py,
eval/evaluate.py; YARDSTICKS.md section 1.4): a prediction is stripped, its U+0000..U+001F
characters become newlines, it is stripped again; string_match_all averages, per example, the
fraction of its references found in it (case-insensitive); string_match_part averages 1 for any
reference found; the task score is `round(sum / n * 100, 2)`. Each RULER value below is worked out
by hand from those definitions; the lm-eval values named beside them are what its port
(lm_eval/tasks/ruler/common_utils.py, called per example) gives instead.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from seqio_tasks import metrics
from seqio_tasks import scrolls
from seqio_tasks import suite_metrics
from seqio_tasks.ruler import metrics as ruler_metrics

# SCROLLS' metric docstring example (tau/scrolls:metrics/scrolls.py).
DOC_PREDICTIONS = ['exact match example', 'hello there', 'general kenobi']
DOC_REFERENCES = [['exact match example'], ['hello', 'hi there'], ['commander kenobi']]


def _score(family: str, prediction: str, references: list[str]) -> dict[str, float]:
  """One prediction's scores against `references` by the family of the registry."""
  return metrics.FAMILIES[family].score({'target': '', 'meta': {'outputs': references}},
                                        prediction)


def _task(family: str, scores: list[dict[str, float]]) -> dict[str, float]:
  """A task's metrics from its examples' `_score`s by the family of the registry."""
  return metrics.FAMILIES[family].aggregate([{}] * len(scores), scores)


# ---------------------------------------------------------------------------------------------
# Every family: one registry.


def test_every_family_has_a_primary_metric_its_aggregate_gives():
  for name, rule in metrics.FAMILIES.items():
    assert rule.name == name and rule.primary and metrics.primary_metric(name) == rule.primary
  for family in suite_metrics.FAMILIES:
    assert metrics.primary_metric(family) == 'score'
  assert metrics.primary_metric('passkey') == 'accuracy'
  assert metrics.primary_metric('lm') == 'perplexity'
  assert 'perplexity' in metrics.aggregate_perplexity(
      [metrics.perplexity_scores(-2.0, 4)])
  assert 'em' in metrics.aggregate('code_completion', [{'length': 10}], [{'em': 1.0, 'es': 9.0}])
  assert 'accuracy' in metrics.aggregate('passkey', [{}], [{'accuracy': 1.0}])
  with pytest.raises(ValueError, match="no primary metric for family 'bleu'"):
    metrics.primary_metric('bleu')


# ---------------------------------------------------------------------------------------------
# ZeroSCROLLS (and the suites' shared rules).


def _aggregate(family, predictions, references):
  return _task(family, [_score(family, p, r) for p, r in zip(predictions, references)])


def test_scrolls_docstring_example():
  rouge = _aggregate('rouge_geo', DOC_PREDICTIONS, DOC_REFERENCES)
  assert rouge['rouge1'] == pytest.approx(72.2222, abs=1e-4)
  assert rouge['rouge2'] == pytest.approx(33.3333, abs=1e-4)
  assert rouge['rougeL'] == pytest.approx(72.2222, abs=1e-4)
  assert rouge['rouge_geometric_mean'] == pytest.approx(55.8136, abs=1e-4)
  assert rouge['score'] == rouge['rouge_geometric_mean']
  # Per example: only the first has a ROUGE-2 above 0, so only its geometric mean is.
  assert rouge['rouge_geometric_mean_per_example'] == pytest.approx(100 / 3)
  for family in ('f1', 'f1_unidecode'):
    assert _aggregate(family, DOC_PREDICTIONS, DOC_REFERENCES) == {
        'f1': pytest.approx(72.2222, abs=1e-4), 'score': pytest.approx(72.2222, abs=1e-4)}
  assert _aggregate('exact_match', DOC_PREDICTIONS, DOC_REFERENCES)['score'] == pytest.approx(
      33.3333, abs=1e-4)


def test_rouge_against_rouge_score():
  rouge_scorer = pytest.importorskip('rouge_score.rouge_scorer')
  scorer = rouge_scorer.RougeScorer(['rouge1', 'rouge2', 'rougeL'], use_stemmer=False)
  prediction = 'The committee approved the budget, citing rising costs.'
  # The first reference has every word in another order (best ROUGE-1), the second some words
  # in order (best ROUGE-2 and -L): the max per type comes from different references, before
  # the geometric mean (SQuALITY).
  references = ['Costs rising citing budget; the approved committee, the!',
                'The committee approved a plan.']
  want = {k: max(100 * scorer.score(r, prediction)[k].fmeasure for r in references)
          for k in ('rouge1', 'rouge2', 'rougeL')}
  best_of = {k: max(range(2), key=lambda i, k=k: scorer.score(references[i], prediction)[k]
                    .fmeasure) for k in want}
  assert len(set(best_of.values())) == 2, best_of  # The maxima come from both references.
  got = _score('rouge_geo', prediction, references)
  assert got == {**{k: pytest.approx(v) for k, v in want.items()},
                 'rouge_geometric_mean': pytest.approx(
                     (want['rouge1'] * want['rouge2'] * want['rougeL']) ** (1 / 3))}
  # The task score: the geometric mean of the mean F-measures, not the mean geometric mean.
  second = _score('rouge_geo', 'Budget approved.', references[1:])
  task = _task('rouge_geo', [got, second])
  means = [(got[k] + second[k]) / 2 for k in ('rouge1', 'rouge2', 'rougeL')]
  assert task['score'] == pytest.approx(math.prod(means) ** (1 / 3))
  assert task['rouge_geometric_mean_per_example'] == pytest.approx(
      (got['rouge_geometric_mean'] + second['rouge_geometric_mean']) / 2)
  assert task['score'] > task['rouge_geometric_mean_per_example']
  # rouge-score's tokenizer: case and punctuation do not count; no stemming.
  assert suite_metrics.rouge('THE Cats!', ['the cats'])['rouge2'] == 100.0
  assert suite_metrics.rouge('the cat', ['the cats'])['rouge1'] == 50.0


def test_f1_transliterates_after_normalizing():
  assert suite_metrics.token_f1('Café Müller', 'cafe muller', transliterate=True) == 100.0
  assert suite_metrics.token_f1('Café Müller', 'cafe muller') == 0.0
  # Articles and ASCII punctuation go first, then unidecode: '«The»' keeps its '<< >>'.
  assert suite_metrics.normalize_answer('«The» answer', transliterate=True) == '<< >> answer'
  assert suite_metrics.token_f1('', '', transliterate=True) == 0.0  # Nothing shared: 0.
  assert suite_metrics.token_f1('the big red dog', 'a red dog') == pytest.approx(
      100 * 2 * (2 / 3) * 1 / (2 / 3 + 1))
  assert _score('f1_unidecode', 'Zürich', ['Geneva', 'zurich']) == {
      'f1': 100.0}


def test_letter_accuracy():
  assert suite_metrics.letter_accuracy('The answer is (B) because', '(B) The house') == 100.0
  assert suite_metrics.letter_accuracy('A or B', 'B') == 0.0  # The first letter counts.
  assert suite_metrics.letter_accuracy('Based on it, C', 'C') == 100.0  # 'Based' is no letter.
  assert suite_metrics.letter_accuracy('none', 'D') == 0.0
  with pytest.raises(ValueError, match='holds no option letter'):
    suite_metrics.letter_accuracy('A', 'no letter here')


def test_exponential_similarity():
  assert suite_metrics.exp_similarity('40%', '30%') == 50.0
  assert suite_metrics.exp_similarity('30%', '30%') == 100.0
  assert suite_metrics.exp_similarity('12.5%', '32.5%') == 25.0
  assert suite_metrics.exp_similarity('about forty percent', '40%') == 0.0
  assert suite_metrics.exp_similarity('10%', 'no percentage') == 50.0  # Gold counts as 0%.
  # The paper's example: the first percentage is the answer.
  paper = ('Out of 50 reviews, 20 are positive and 30 are negative, so 40% of the reviews are '
           'positive 60% are negative.')
  assert suite_metrics.percentage(paper) == 40.0
  assert suite_metrics.exp_similarity(paper, '40%') == 100.0


def test_concordance_index():
  assert suite_metrics.concordance_index('1, 3, 2', '1, 2, 3') == pytest.approx(66.6667,
                                                                                abs=1e-4)
  assert suite_metrics.concordance_index('Order: 3, 2, 1.', '1, 2, 3') == 0.0
  assert suite_metrics.concordance_index('Summary IDs: 2 1 3 4', '1, 2, 3, 4') == pytest.approx(
      500 / 6)
  assert suite_metrics.concordance_index('1, 2', '1, 2, 3') == 0.0  # Not the same IDs.
  assert suite_metrics.concordance_index('1, 2, 2', '1, 2, 3') == 0.0
  assert suite_metrics.summary_ids('Summary 12, then 3rd; 4') == [12, 3, 4]
  with pytest.raises(ValueError, match='not an order of 2 or more'):
    suite_metrics.concordance_index('1', '1')


def test_seqio_metric_path():
  """`metrics.postprocess` then the task's metric function, as seqio (and t5align.eval) call
  them: references from the target's meta; a test split (no references) scores nothing."""
  def target(outputs):
    example = {'inputs': np.ones(5, np.int32), 'targets': np.ones(2, np.int32),
               'meta': json.dumps({'outputs': outputs}).encode()}
    return metrics.postprocess((outputs[0] if outputs else '').encode(), example=example,
                               is_target=True)

  metric = metrics.make_metric_fn('f1_unidecode')
  targets = [target(['English and German', 'German']), target(['yes'])]
  assert metric(targets, ['German', 'no']) == {'f1': 50.0, 'score': 50.0}
  assert metrics.score_example('c_index', target(['1, 2, 3']), '1, 3, 2')[
      'concordance_index'] == pytest.approx(200 / 3)
  assert metric([target([]), target([])], ['a', 'b']) == {}
  with pytest.raises(ValueError, match='1 of 2 examples have no reference'):
    metric([target(['x']), target([])], ['a', 'b'])
  assert set(suite_metrics.FAMILIES) <= set(metrics.FAMILIES)


# ---------------------------------------------------------------------------------------------
# SCROLLS.

# SCROLLS' metric file docstring: "Examples: predictions = [...] references = [[...], ...]" and
# its printed results for 'gov_report', 'contract_nli' and 'narrative_qa' (each also stands for
# the configs the docstring names beside it: qmsum and summ_screen_fd, quality, qasper).
DOC_RESULTS = {
    'gov_report': {'rouge1': 72.2222, 'rouge2': 33.3333, 'rougeL': 72.2222, 'score': 55.8136},
    'contract_nli': {'exact_match': 33.3333, 'score': 33.3333},
    'narrative_qa': {'f1': 72.2222, 'score': 72.2222},
}
SIBLINGS = {'gov_report': ('qmsum', 'summ_screen_fd'), 'contract_nli': ('quality',),
            'narrative_qa': ('qasper',)}


def _scrolls_target(outputs: list[str]) -> dict:
  """A target as the evaluation tasks' postprocessor makes it (meta 'outputs': every
  reference)."""
  example = {'inputs': np.ones(3, np.int32), 'targets': np.ones(2, np.int32),
             'meta': json.dumps({'outputs': outputs}).encode()}
  return metrics.postprocess((outputs[0] if outputs else '').encode(), example=example,
                             is_target=True)


@pytest.mark.parametrize('config', sorted(DOC_RESULTS))
def test_the_metric_files_docstring_example(config):
  """Every config scores the docstring's example as SCROLLS' metric prints it (rounded to 4
  decimals, as it rounds)."""
  for name in (config, *SIBLINGS[config]):
    metric = metrics.make_metric_fn(scrolls.FAMILIES[name])
    got = metric([_scrolls_target(r) for r in DOC_REFERENCES], DOC_PREDICTIONS)
    assert {k: round(got[k], 4) for k in DOC_RESULTS[config]} == DOC_RESULTS[config], name


def test_rouge_is_rouge_score_with_the_max_over_references_and_the_geometric_mean():
  """The summaries' metric against `rouge_score` called directly, as SCROLLS' compute_rouge
  calls it (no stemmer; its sentence split, one sentence a line, changes only ROUGE-Lsum, so
  the texts are scored here with that split and ours without)."""
  rouge_scorer = pytest.importorskip('rouge_score.rouge_scorer')
  scorer = rouge_scorer.RougeScorer(['rouge1', 'rouge2', 'rougeL'], use_stemmer=False)
  predictions = ['The committee approved the budget. It cited rising costs.',
                 'Officials said the bridge will reopen in May after repairs.']
  references = [['Costs rising, the committee approved the budget.',
                 'The budget was approved. The committee cited costs.'],
                ['The bridge reopens in May.', 'Repairs close the bridge until spring.']]
  one_per_line = lambda text: text.replace('. ', '.\n')
  want = {}
  for key in ('rouge1', 'rouge2', 'rougeL'):
    per_example = [max(100 * scorer.score(one_per_line(r), one_per_line(p))[key].fmeasure
                       for r in refs) for p, refs in zip(predictions, references)]
    want[key] = sum(per_example) / 2
  want['score'] = (want['rouge1'] * want['rouge2'] * want['rougeL']) ** (1 / 3)
  metric = metrics.make_metric_fn(scrolls.FAMILIES['qmsum'])
  got = metric([_scrolls_target(r) for r in references], predictions)
  assert {k: got[k] for k in want} == pytest.approx(want, rel=1e-12)
  assert got['rouge_geometric_mean'] == got['score']


def test_answers_are_scored_without_transliteration():
  """SCROLLS' F1 and exact match normalize as SQuAD (lower case, no punctuation, no a/an/the);
  unlike ZeroSCROLLS' F1 they do not transliterate: 'Zürich' is not 'zurich'."""
  f1 = metrics.make_metric_fn(scrolls.FAMILIES['qasper'])
  assert f1([_scrolls_target(['zurich'])], ['Zürich']) == {'f1': 0.0, 'score': 0.0}
  assert f1([_scrolls_target(['The big, red dog!'])], ['a red dog']) == {
      'f1': pytest.approx(80.0), 'score': pytest.approx(80.0)}  # P = 1, R = 2/3.
  em = metrics.make_metric_fn(scrolls.FAMILIES['contract_nli'])
  assert em([_scrolls_target(['Entailment']), _scrolls_target(['Not mentioned'])],
            ['entailment.', 'Contradiction']) == {'exact_match': 50.0, 'score': 50.0}


# ---------------------------------------------------------------------------------------------
# RULER.


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
  scores = [_score('string_match_all', p, ['x'])
            for p in ('x', '  ', '\x00\n', 'y')]
  assert [s['null'] for s in scores] == [0.0, 1.0, 1.0, 0.0]
  assert _task('string_match_all', scores) == {
      'score': 25.0, 'string_match_all': 25.0, 'nulls': 2.0}
  with pytest.raises(ValueError, match='non-empty list of reference strings'):
    ruler_metrics.match_all('x', [])
  with pytest.raises(ValueError, match='non-empty list of reference strings'):
    ruler_metrics.match_part('x', 'x')
  with pytest.raises(ValueError, match='must be strings'):
    ruler_metrics.match_all('1', [1])
  with pytest.raises(ValueError, match='2 predictions but 1 reference'):
    ruler_metrics.string_match_all(['a', 'b'], [['a']])
  with pytest.raises(ValueError, match="no prediction scoring for family 'string_match_any'"):
    metrics.score_example('string_match_any', {'target': 'a', 'meta': {'outputs': ['a']}}, 'a')
  with pytest.raises(ValueError, match='no examples'):
    _task('string_match_part', [])


def _ruler_target(outputs):
  """What `metrics.postprocess` makes of a RULER example's target (seqio's postprocess_fn)."""
  example = {'meta': json.dumps({'outputs': outputs}).encode(), 'inputs': [5, 6, 1],
             'targets': [7, 1]}
  return metrics.postprocess(b', '.join(o.encode() for o in outputs), example=example,
                             is_target=True)


def test_seqio_metric_functions_read_every_reference():
  targets = [_ruler_target(['1234567', '7654321']), _ruler_target(['Paris', 'paris, France'])]
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
