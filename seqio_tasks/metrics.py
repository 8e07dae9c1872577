"""Scoring rules of the paper's evaluations, per example and aggregated (no seqio needed).

Each task family is a `family.Family` of `FAMILIES`, the one registry: its per-example scores,
its task metrics (in percent as in the paper's tables) and its primary metric.
`score_example(family, target, prediction)`, `aggregate(family, targets, scores)` and
`primary_metric(family)` look it up; `make_metric_fn(family)` wraps it as a seqio metric function
`(targets, predictions)` (or `(targets, scores)` for perplexity); targets are the dicts that
`postprocess` builds.

Rules (the upstream benchmarks' conventions):
  passkey, code_key  the first integer in the output equals the key.
  lines              the last integer in the output equals the expected number (LongEval).
  topics             deterministic stand-in for upstream's LLM judge: the SQuAD-normalized first
                     topic is a substring of the normalized output, and no other topic of the
                     conversation is (so listing every topic does not score).
  kv                 the value is a case-insensitive substring of the output (Lost in the Middle).
  mdqa               best_subspan_em on the output's first line (Lost in the Middle).
  code_completion    on the output's first non-empty line and the target line, both stripped:
                     EM = equal whitespace-separated tokens, ES = round(100 * difflib ratio);
                     also per context-length bucket ('1k' = [1000, 2000) input tokens).
  lm                 perplexity per sequence, exp(-log-likelihood / target tokens), averaged
                     over sequences (the paper's "average perplexity"), and over tokens.
  rouge_geo, f1, f1_unidecode, exact_match, letter_acc, exp_sim, c_index
                     the long-context suites' rules (ZeroSCROLLS, SCROLLS), against every
                     reference in the target's meta 'outputs': `seqio_tasks.suite_metrics`.
  string_match_all, string_match_part
                     RULER's, against every reference in the target's meta 'outputs':
                     `seqio_tasks.ruler.metrics`.
"""
from __future__ import annotations

import difflib
import json
import math
import re
from typing import Any, Callable, Mapping, Sequence

from seqio_tasks import family
from seqio_tasks import suite_metrics
from seqio_tasks.ruler import metrics as ruler_metrics

_INT = re.compile(r'\d+')


def first_integer(text: str) -> int | None:
  match = _INT.search(text)
  return int(match.group()) if match else None


def last_integer(text: str) -> int | None:
  found = _INT.findall(text)
  return int(found[-1]) if found else None


# SQuAD normalization: lower case, no punctuation, no articles, single spaces. One rule for the
# paper's tasks and the suites' F1 / exact match; it lives in suite_metrics, which this imports.
normalize_answer = suite_metrics.normalize_answer


def best_subspan_em(prediction: str, answers: Sequence[str]) -> float:
  """1.0 if some normalized answer is a substring of the normalized prediction."""
  pred = normalize_answer(prediction)
  return float(any(normalize_answer(a) in pred for a in answers))


def first_line(text: str) -> str:
  """The text up to its first newline, stripped (Lost in the Middle's QA rule)."""
  return text.split('\n')[0].strip()


def first_code_line(text: str) -> str:
  """The first line with any non-space character, stripped; '' if there is none."""
  for line in text.split('\n'):
    if line.strip():
      return line.strip()
  return ''


def edit_similarity(prediction: str, target: str) -> float:
  """round(100 * difflib ratio); two empty strings are identical (100)."""
  if not prediction and not target:
    return 100.0
  return float(round(100 * difflib.SequenceMatcher(None, prediction, target).ratio()))


def topic_match(prediction: str, topics: Sequence[str]) -> float:
  """1.0 if topics[0] appears in the normalized prediction and no other topic does.

  A later topic that is itself contained in topics[0] (normalized) does not count against it.
  """
  pred = normalize_answer(prediction)
  gold = normalize_answer(topics[0])
  if not gold or gold not in pred:
    return 0.0
  others = (normalize_answer(t) for t in topics[1:])
  return float(not any(o and o not in gold and o in pred for o in others))


def length_bucket(length: int) -> str:
  """'1k' for [1000, 2000) tokens, ..., '<1k' below 1000 (the paper's buckets)."""
  return '<1k' if length < 1000 else f'{length // 1000}k'


# ---------------------------------------------------------------------------------------------
# The families: per-example scores, aggregation, the primary metric.


def _mean(values: Sequence[float]) -> float:
  return float(sum(values) / len(values)) if values else float('nan')


def _accuracy(targets: Sequence[Mapping[str, Any]],
              scores: Sequence[Mapping[str, float]]) -> dict[str, float]:
  del targets
  return {'accuracy': 100 * _mean([s['accuracy'] for s in scores])}


def _integer_is(pick: Callable[[str], int | None]) -> Callable[..., dict[str, float]]:
  return lambda target, prediction: {'accuracy': float(pick(prediction) == int(target['target']))}


def _topics(target: Mapping[str, Any], prediction: str) -> dict[str, float]:
  topics = (target.get('meta') or {}).get('topics') or [target['target']]
  return {'accuracy': topic_match(prediction, topics)}


def _kv(target: Mapping[str, Any], prediction: str) -> dict[str, float]:
  return {'accuracy': float(target['target'].lower() in prediction.lower())}


def _mdqa(target: Mapping[str, Any], prediction: str) -> dict[str, float]:
  answers = (target.get('meta') or {}).get('answers') or [target['target']]
  return {'accuracy': best_subspan_em(first_line(prediction), answers)}


def _code_line(target: Mapping[str, Any], prediction: str) -> dict[str, float]:
  pred, gold = first_code_line(prediction), target['target'].strip()
  return {'em': float(pred.split() == gold.split()), 'es': edit_similarity(pred, gold)}


def _code_buckets(targets: Sequence[Mapping[str, Any]],
                  scores: Sequence[Mapping[str, float]]) -> dict[str, float]:
  """EM (%) and ES overall and per context-length bucket, with each bucket's count."""
  out = {'em': 100 * _mean([s['em'] for s in scores]), 'es': _mean([s['es'] for s in scores])}
  buckets: dict[str, list[Mapping[str, float]]] = {}
  for t, s in zip(targets, scores):
    buckets.setdefault(length_bucket(int(t['length'])), []).append(s)
  for name, items in buckets.items():
    out[f'em_{name}'] = 100 * _mean([s['em'] for s in items])
    out[f'es_{name}'] = _mean([s['es'] for s in items])
    out[f'count_{name}'] = float(len(items))
  return out


def perplexity_scores(log_likelihood: float, num_tokens: int) -> dict[str, float]:
  """Per-sequence numbers for the LM task from the summed log-likelihood of its targets."""
  if num_tokens <= 0:
    raise ValueError('a sequence needs at least one target token to have a perplexity.')
  nll = -float(log_likelihood)
  return {'nll': nll, 'num_tokens': float(num_tokens), 'perplexity': math.exp(nll / num_tokens)}


def aggregate_perplexity(scores: Sequence[Mapping[str, float]]) -> dict[str, float]:
  """Mean per-sequence perplexity (the paper's) and token-level perplexity."""
  total = sum(s['num_tokens'] for s in scores)
  return {'perplexity': _mean([s['perplexity'] for s in scores]),
          'token_perplexity': math.exp(sum(s['nll'] for s in scores) / total) if total else
                              float('nan')}


# Every family of the catalog's tasks, by name: the paper's, the long-context suites'
# (`suite_metrics.FAMILIES`) and RULER's (`ruler.metrics.FAMILIES`).
FAMILIES: Mapping[str, family.Family] = family.registry(
    family.Family('passkey', _integer_is(first_integer), _accuracy, 'accuracy'),
    family.Family('lines', _integer_is(last_integer), _accuracy, 'accuracy'),
    family.Family('topics', _topics, _accuracy, 'accuracy'),
    family.Family('kv', _kv, _accuracy, 'accuracy'),
    family.Family('mdqa', _mdqa, _accuracy, 'accuracy'),
    family.Family('code_completion', _code_line, _code_buckets, 'em'),
    family.Family('code_key', _integer_is(first_integer), _accuracy, 'accuracy'),
    family.Family('lm', lambda target, log_likelihood: perplexity_scores(
        log_likelihood, target['num_tokens']), lambda targets, scores: aggregate_perplexity(
            scores), 'perplexity', scored=True),
    *suite_metrics.FAMILIES.values(), *ruler_metrics.FAMILIES.values())


def _family(name: str, what: str) -> family.Family:
  if name not in FAMILIES:
    raise ValueError(f'no {what} for family {name!r}; expected one of {tuple(FAMILIES)}.')
  return FAMILIES[name]


def score_example(family_name: str, target: Mapping[str, Any],
                  prediction: str) -> dict[str, float]:
  """Scores one prediction; values are 0/1 (or 0..100 for ES and the suites' rules).

  Args:
    family_name: a family of `FAMILIES` scored by prediction (any but 'lm').
    target: {'target': reference text, 'meta': dict, 'length': input tokens} (see `postprocess`).
    prediction: the decoded model output.
  """
  rule = FAMILIES.get(family_name)
  if rule is None or rule.scored:
    raise ValueError(f'no prediction scoring for family {family_name!r}; expected one of '
                     f'{[f for f, r in FAMILIES.items() if not r.scored]}.')
  return rule.score(target, prediction)


def aggregate(family_name: str, targets: Sequence[Mapping[str, Any]],
              scores: Sequence[Mapping[str, float]]) -> dict[str, float]:
  """Task metrics from per-example scores (the family's `aggregate`): accuracy in percent; code
  EM/ES also per bucket; the suites' families their 'score' among them."""
  if len(targets) != len(scores):
    raise ValueError(f'{len(targets)} targets but {len(scores)} scores.')
  return _family(family_name, 'aggregation').aggregate(targets, scores)


def primary_metric(family_name: str) -> str:
  """The metric a report shows for a task of the family (its `primary`); raises ValueError
  naming an unknown family."""
  return _family(family_name, 'primary metric').primary


# ---------------------------------------------------------------------------------------------
# seqio glue (callables only; seqio itself is not imported).


def _meta(example: Mapping[str, Any] | None) -> dict[str, Any]:
  raw = (example or {}).get('meta', b'{}')
  if hasattr(raw, 'item') and not isinstance(raw, (bytes, str)):
    raw = raw.item()
  return json.loads(raw.decode('utf-8') if isinstance(raw, bytes) else raw or '{}')


def postprocess(output: Any, example: Mapping[str, Any] | None = None,
                is_target: bool = False) -> Any:
  """seqio postprocess_fn: targets become {'target', 'meta', 'length'}; predictions stay text."""
  if isinstance(output, bytes):
    output = output.decode('utf-8')
  if not is_target:
    return output
  inputs = (example or {}).get('inputs', ())
  targets = (example or {}).get('targets', ())
  return {'target': output, 'meta': _meta(example), 'length': int(len(inputs)),
          'num_tokens': int(len(targets))}


def make_metric_fn(family_name: str) -> Callable[..., dict[str, float]]:
  """A seqio metric function for the family: `(targets, predictions)`, or `(targets, scores)`
  for a family scored by log-likelihood."""
  rule = _family(family_name, 'metric function')
  if rule.scored:
    def lm_metric(targets, scores):
      return rule.aggregate(targets, [rule.score(t, s) for t, s in zip(targets, scores)])
    return lm_metric

  def metric(targets, predictions):
    return aggregate(family_name, targets, [score_example(family_name, t, p)
                                            for t, p in zip(targets, predictions)])
  metric.__name__ = f'{family_name}_metric'
  return metric
