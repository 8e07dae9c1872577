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
row). Stdlib only.
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

FAMILIES = ('string_match_all', 'string_match_part')
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


_PER_EXAMPLE = {'string_match_all': match_all, 'string_match_part': match_part}


def _family(family: str) -> None:
  if family not in FAMILIES:
    raise ValueError(f'no RULER metric {family!r}; expected one of {FAMILIES}.')


def score_example(family: str, prediction: str,
                  references: Sequence[str]) -> dict[str, float]:
  """{family: the example's value in [0, 1], 'null': 1.0 if the postprocessed prediction is
  empty}."""
  _family(family)
  return {family: _PER_EXAMPLE[family](prediction, references),
          'null': float(not postprocess_prediction(prediction))}


def aggregate(family: str, scores: Sequence[Mapping[str, float]]) -> dict[str, float]:
  """{'score': upstream's rounded task score (0..100), family: the same, 'nulls': how many
  predictions were empty}; raises ValueError on no scores."""
  _family(family)
  if not scores:
    raise ValueError(f'{family}: no examples to score.')
  score = round(sum(s[family] for s in scores) / len(scores) * 100, 2)
  return {'score': score, family: score, 'nulls': float(sum(s['null'] for s in scores))}


def string_match_all(predictions: Sequence[str],
                     references: Sequence[Sequence[str]]) -> float:
  """Upstream's `string_match_all(preds, refs)`: the task score over parallel lists."""
  return _task_score('string_match_all', predictions, references)


def string_match_part(predictions: Sequence[str],
                      references: Sequence[Sequence[str]]) -> float:
  """Upstream's `string_match_part(preds, refs)`: the task score over parallel lists."""
  return _task_score('string_match_part', predictions, references)


def _task_score(family: str, predictions: Sequence[str],
                references: Sequence[Sequence[str]]) -> float:
  if len(predictions) != len(references):
    raise ValueError(f'{family}: {len(predictions)} predictions but {len(references)} '
                     'reference lists.')
  return aggregate(family, [score_example(family, p, r)
                            for p, r in zip(predictions, references)])['score']
