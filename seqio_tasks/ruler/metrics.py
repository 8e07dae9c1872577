"""RULER's scoring rules (Hsieh et al., 2024; NVIDIA/RULER), per example and per task.

Written from RULER's definitions (NVIDIA/RULER:scripts/eval/synthetic/constants.py and
scripts/eval/evaluate.py at c3f5e3b, as ../shared/docs/YARDSTICKS.md section 1.4 gives them):

  prediction   upstream's `postprocess_pred`: stripped, every character U+0000..U+001F replaced by
               a newline, stripped again. Both rules below read the prediction after it.
  string_match_all   per example, the fraction of its references that occur in the prediction,
                     case-insensitively (`reference.lower() in prediction.lower()`). The NIAH
                     tasks, variable tracking, CWE and FWE.
  string_match_part  per example, 1 if any reference occurs in it (same test), else 0. The QA
                     tasks, whose references are alternative answers.

A task's score is `round(sum(per-example values) / examples * 100, 2)`, in upstream's order of
operations, so it equals the number upstream's summary.csv shows. lm-eval's port differs
(EleutherAI/lm-evaluation-harness:lm_eval/tasks/ruler/common_utils.py): called per example, its
`string_match_part` gives the fraction of references found, as `string_match_all` does, where
upstream gives 1 for any reference found (the author in NVIDIA/RULER#15); this module follows
upstream. `nulls` counts the predictions that are empty after postprocessing (upstream's "Nulls"
row). Each rule is a `family.Family` of `FAMILIES` (`seqio_tasks.metrics.FAMILIES` holds them with
the others). Stdlib only.
"""
from __future__ import annotations

import re
from typing import Callable, Mapping, Sequence

from seqio_tasks import family

_CONTROL = re.compile(r'[\x00-\x1f]')


def postprocess_prediction(prediction: str) -> str:
  """Upstream's prediction cleanup: strip, control characters to newlines, strip."""
  return _CONTROL.sub('\n', prediction.strip()).strip()


def _check_references(references: Sequence[str], where: str) -> None:
  if isinstance(references, str) or not references:
    raise ValueError(f'{where}: a RULER example needs a non-empty list of reference strings (its '
                     f"record's 'outputs'); got {references!r}.")
  bad = [r for r in references if not isinstance(r, str)]
  if bad:
    raise ValueError(f'{where}: references must be strings; got {bad[:3]!r} in {references!r}.')


def _found(prediction: str, references: Sequence[str]) -> list[float]:
  pred = prediction.lower()
  return [1.0 if r.lower() in pred else 0.0 for r in references]


def match_all(prediction: str, references: Sequence[str]) -> float:
  """The fraction of `references` found in the postprocessed `prediction`, in [0, 1]."""
  _check_references(references, 'string_match_all')
  return sum(_found(postprocess_prediction(prediction), references)) / len(references)


def match_part(prediction: str, references: Sequence[str]) -> float:
  """1.0 if any of `references` is found in the postprocessed `prediction`, else 0.0."""
  _check_references(references, 'string_match_part')
  return max(_found(postprocess_prediction(prediction), references))


def _family(name: str, rule: Callable[[str, Sequence[str]], float]) -> family.Family:
  """A RULER metric: per example {name: `rule`'s value in [0, 1], 'null': 1.0 if the
  postprocessed prediction is empty}, against the record's references (the target's meta
  'outputs'); per task {'score': upstream's rounded task score (0..100), name: the same, 'nulls':
  how many predictions were empty}."""

  def score(target: family.Target, prediction: str) -> dict[str, float]:
    meta = target.get('meta') or {}
    if 'outputs' not in meta:
      raise ValueError(f'{name}: the target has no meta \'outputs\' (the RULER record\'s '
                       f'references); target {target["target"]!r:.80}.')
    return {name: rule(prediction, meta['outputs']),
            'null': float(not postprocess_prediction(prediction))}

  def aggregate(targets: Sequence[family.Target],
                scores: Sequence[Mapping[str, float]]) -> dict[str, float]:
    del targets
    if not scores:
      raise ValueError(f'{name}: no examples to score.')
    value = round(sum(s[name] for s in scores) / len(scores) * 100, 2)
    return {'score': value, name: value, 'nulls': float(sum(s['null'] for s in scores))}

  return family.Family(name, score, aggregate, 'score')


FAMILIES = family.registry(_family('string_match_all', match_all),
                           _family('string_match_part', match_part))


def string_match_all(predictions: Sequence[str],
                     references: Sequence[Sequence[str]]) -> float:
  """Upstream's `string_match_all(preds, refs)`: the task score over parallel lists."""
  return _task_score('string_match_all', predictions, references)


def string_match_part(predictions: Sequence[str],
                      references: Sequence[Sequence[str]]) -> float:
  """Upstream's `string_match_part(preds, refs)`: the task score over parallel lists."""
  return _task_score('string_match_part', predictions, references)


def _task_score(name: str, predictions: Sequence[str],
                references: Sequence[Sequence[str]]) -> float:
  if len(predictions) != len(references):
    raise ValueError(f'{name}: {len(predictions)} predictions but {len(references)} '
                     'reference lists.')
  rule = FAMILIES[name]
  targets = [{'target': '', 'meta': {'outputs': list(r)}} for r in references]
  return rule.aggregate(targets, [rule.score(t, p) for t, p in zip(targets, predictions)])['score']
