"""Scoring rules of the paper's evaluations, per example and aggregated (no seqio needed).

Per task family, `score_example(family, target, prediction)` gives the example's scores and
`aggregate(family, targets, scores)` the task's metrics, in percent as in the paper's tables.
`make_metric_fn(family)` wraps both as a seqio metric function `(targets, predictions)` (or
`(targets, scores)` for perplexity); targets are the dicts that `postprocess` builds.

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

from seqio_tasks import suite_metrics
from seqio_tasks.ruler import metrics as ruler_metrics

_INT = re.compile(r'\d+')

FAMILIES = ('passkey', 'lines', 'topics', 'kv', 'mdqa', 'code_completion', 'code_key', 'lm',
            *suite_metrics.FAMILIES, *ruler_metrics.FAMILIES)
# Each family's primary metric: the key of `aggregate`'s (or `aggregate_perplexity`'s) result a
# report's cell shows. `t5align.eval` writes it into metrics.json ('primary_metric'), where
# `t5align.report` reads it.
PRIMARY_METRICS = {'passkey': 'accuracy', 'lines': 'accuracy', 'topics': 'accuracy',
                   'kv': 'accuracy', 'mdqa': 'accuracy', 'code_completion': 'em',
                   'code_key': 'accuracy', 'lm': 'perplexity',
                   **dict.fromkeys(suite_metrics.FAMILIES, 'score'),
                   **dict.fromkeys(ruler_metrics.FAMILIES, 'score')}


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
# Per-example scores and aggregation.


def score_example(family: str, target: Mapping[str, Any], prediction: str) -> dict[str, float]:
  """Scores one prediction; values are 0/1 (or 0..100 for ES and the suites' rules).

  Args:
    family: one of `FAMILIES` except 'lm'.
    target: {'target': reference text, 'meta': dict, 'length': input tokens} (see `postprocess`).
    prediction: the decoded model output.
  """
  ref = target['target']
  meta = target.get('meta') or {}
  if family in suite_metrics.FAMILIES:  # Every reference; none (a test split): not scored.
    references = meta.get('outputs', [ref] if ref else [])
    return suite_metrics.score_example(family, prediction, references)
  if family in ruler_metrics.FAMILIES:  # RULER: every reference of the record, as upstream.
    if 'outputs' not in meta:
      raise ValueError(f'{family}: the target has no meta \'outputs\' (the RULER record\'s '
                       f'references); target {ref!r:.80}.')
    return ruler_metrics.score_example(family, prediction, meta['outputs'])
  if family in ('passkey', 'code_key'):
    return {'accuracy': float(first_integer(prediction) == int(ref))}
  if family == 'lines':
    return {'accuracy': float(last_integer(prediction) == int(ref))}
  if family == 'topics':
    return {'accuracy': topic_match(prediction, meta.get('topics') or [ref])}
  if family == 'kv':
    return {'accuracy': float(ref.lower() in prediction.lower())}
  if family == 'mdqa':
    return {'accuracy': best_subspan_em(first_line(prediction), meta.get('answers') or [ref])}
  if family == 'code_completion':
    pred, gold = first_code_line(prediction), ref.strip()
    return {'em': float(pred.split() == gold.split()), 'es': edit_similarity(pred, gold)}
  raise ValueError(f'no prediction scoring for family {family!r}; expected one of '
                   f'{[f for f in FAMILIES if f != "lm"]}.')


def _mean(values: Sequence[float]) -> float:
  return float(sum(values) / len(values)) if values else float('nan')


def aggregate(family: str, targets: Sequence[Mapping[str, Any]],
              scores: Sequence[Mapping[str, float]]) -> dict[str, float]:
  """Task metrics from per-example scores: accuracy in percent; code EM/ES also per bucket; the
  suites' families as `suite_metrics.aggregate` (their 'score' among them)."""
  if len(targets) != len(scores):
    raise ValueError(f'{len(targets)} targets but {len(scores)} scores.')
  if family in suite_metrics.FAMILIES:
    return suite_metrics.aggregate(family, scores)
  if family in ruler_metrics.FAMILIES:
    return ruler_metrics.aggregate(family, scores)
  if family == 'code_completion':
    out = {'em': 100 * _mean([s['em'] for s in scores]), 'es': _mean([s['es'] for s in scores])}
    buckets: dict[str, list[Mapping[str, float]]] = {}
    for t, s in zip(targets, scores):
      buckets.setdefault(length_bucket(int(t['length'])), []).append(s)
    for name, items in buckets.items():
      out[f'em_{name}'] = 100 * _mean([s['em'] for s in items])
      out[f'es_{name}'] = _mean([s['es'] for s in items])
      out[f'count_{name}'] = float(len(items))
    return out
  return {'accuracy': 100 * _mean([s['accuracy'] for s in scores])}


def primary_metric(family: str) -> str:
  """The metric a report shows for a task of `family` (`PRIMARY_METRICS`); raises ValueError
  naming an unknown family."""
  if family not in PRIMARY_METRICS:
    raise ValueError(f'no primary metric for family {family!r}; expected one of {FAMILIES}.')
  return PRIMARY_METRICS[family]


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


def make_metric_fn(family: str) -> Callable[..., dict[str, float]]:
  """A seqio metric function for `family`: `(targets, predictions)`, or `(targets, scores)`."""
  if family == 'lm':
    def lm_metric(targets, scores):
      return aggregate_perplexity([perplexity_scores(s, t['num_tokens'])
                                   for t, s in zip(targets, scores)])
    return lm_metric

  def metric(targets, predictions):
    return aggregate(family, targets, [score_example(family, t, p)
                                       for t, p in zip(targets, predictions)])
  metric.__name__ = f'{family}_metric'
  return metric
