"""What every results table shares: a metrics.json's split and primary value, a cell's text, the
Markdown (no JAX; `t5align.evaluation.tables` and the suites' layouts, `evaluation.suites`)."""
from __future__ import annotations

from typing import Any, Collection, Mapping, Sequence


def split_of(result: Mapping[str, Any]) -> str | None:
  """The split a result was evaluated on (its run.json's, in today's format: 'settings'); None
  without a run.json."""
  run = result.get('run')
  settings = run.get('settings') if isinstance(run, Mapping) else None
  split = settings.get('split') if isinstance(settings, Mapping) else None
  return split if isinstance(split, str) else None


def fmt(value: float | None, table: str) -> str:
  """A cell's number to one decimal; '-' for none (not evaluated), 'NaN' for NaN (evaluated,
  the metric undefined or broken: not hidden as missing); '>1k' for a perplexity over 1000."""
  if value is None:
    return '-'
  if value != value:
    return 'NaN'
  if table == 'lm' and value > 1000:
    return '>1k'
  return f'{value:.1f}'


def mean(values: Sequence[float | None]) -> float | None:
  """The mean of the values that are not None; None if there is none."""
  values = [v for v in values if v is not None]
  return sum(values) / len(values) if values else None


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]],
                   left: Collection[int] = (0,)) -> str:
  """A Markdown table: the columns at the indices `left` left-aligned (row names; default the
  first), the others right-aligned."""
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join('---' if i in left else '---:' for i in range(len(header))) + '|']
  lines += ['| ' + ' | '.join(r) + ' |' for r in rows]
  return '\n'.join(lines)


def section(title: str, header: Sequence[str], rows: Sequence[Sequence[str]],
            left: Collection[int] = (0,)) -> str:
  """'### title' over `markdown_table(header, rows, left)`."""
  return f'### {title}\n\n' + markdown_table(header, rows, left)


def primary_value(result: Mapping[str, Any], strict: bool = False) -> float | None:
  """The result's value of its 'primary_metric' ('accuracy' in a file without one); None when
  its metrics lack it (or are empty: a split without gold outputs).

  Raises:
    ValueError: naming the file, when `strict` and its metrics are there but lack the metric it
      names (a ZeroSCROLLS metrics.json written before t5align.eval recorded each family's
      primary metric; a task outside the catalog may well lack it, so the paper's tables show
      '-').
  """
  metric = result.get('primary_metric', 'accuracy')
  metrics = result['metrics']
  if strict and metrics and metric not in metrics:
    raise ValueError(f'metrics file {result.get("path", "?")}: its primary_metric {metric!r} is '
                     f'not among its metrics ({", ".join(sorted(metrics))}); written by an older '
                     't5align.eval? Rerun the same t5align.eval command: every example is '
                     'recorded, so it rewrites metrics.json from the records without decoding.')
  return metrics.get(metric)
