"""A metric family as one object: per-example scores, a task's metrics from them, and the metric a
report shows (stdlib only; `seqio_tasks.metrics.FAMILIES` is the registry of them all).

A target is what `seqio_tasks.metrics.postprocess` makes of an example: {'target': its reference
text, 'meta': its meta dict, 'length': its input tokens, 'num_tokens': its target tokens}.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

Target = Mapping[str, Any]
Scores = Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class Family:
  """A scoring rule.

  Attributes:
    name: the family's name, the catalog specs' `family`.
    score: (target, output) -> the example's scores; the output is the decoded prediction, or
      for a `scored` family the target's summed log-likelihood.
    aggregate: (targets, per-example scores) -> the task's metrics.
    primary: the key of `aggregate`'s result that a report's cell shows (metrics.json's
      'primary_metric', written by `t5align.eval`).
    scored: scored by log-likelihood (the LM tasks), not by a prediction.
  """

  name: str
  score: Callable[[Target, Any], dict[str, float]]
  aggregate: Callable[[Sequence[Target], Sequence[Scores]], dict[str, float]]
  primary: str
  scored: bool = False


def references(target: Target) -> list[str]:
  """Every reference of an example: its meta's 'outputs', else its target text ([] if empty)."""
  ref = target['target']
  return (target.get('meta') or {}).get('outputs', [ref] if ref else [])


def registry(*families: Family) -> dict[str, Family]:
  """{name: family}; raises ValueError naming a name given twice."""
  out: dict[str, Family] = {}
  for family in families:
    if family.name in out:
      raise ValueError(f'metric family {family.name!r} is defined twice.')
    out[family.name] = family
  return out
