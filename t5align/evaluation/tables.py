"""Results tables: metrics.json files of evaluation folders as Markdown shaped like the paper's.

Every metrics.json (written by `t5align.eval`) is one cell: its row is (model, label), labels in
`labels.PAPER_ORDER` first; its column is the task's (group, column); its value the metric the
file names as 'primary_metric' (its task family's, `seqio_tasks.metrics.PRIMARY_METRICS`).
Results of different runs that would share a cell get rows of their own (`separate_runs`).
The ZeroSCROLLS tasks (table 'zeroscrolls') form one table shaped like the suite's paper: a
row per (model, split, input length, label), the 10 tasks and their average as columns, with
the published rows (`PUBLISHED`, data files beside this module) on request; the SCROLLS tasks
(table 'scrolls') likewise, shaped like its leaderboard (`suite_table`). The RULER tasks
(table 'ruler') form one table shaped like RULER's: a row per (model, label), the input lengths
as columns, a cell the mean over the tasks scored at that length (`ruler_table`; per task on
request, `ruler_task_table`). No JAX: this reads files only.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any, Collection, Iterable, Iterator, Mapping, Sequence

from t5align import labels
from t5align import run_identity
from t5align.runtime import fileio
from t5align.runtime import outputs

TITLES = {
    'lm': 'Language modeling (perplexity, lower is better; Table 3)',
    'retrieval': 'Retrieval accuracy (Table 4)',
    'mdqa': 'Multi-document QA accuracy, gold document position (Table 5)',
    'mdqa_oracle': 'Multi-document QA accuracy, built-in NQ-oracle variant (Table 5 layout)',
    'kv': 'Key-value retrieval accuracy, gold key position',
    'code_key': 'Code key retrieval accuracy',
    'code': 'Code completion (Table 6)',
    'zeroscrolls': "ZeroSCROLLS (each task's score; Avg: their mean over the 10 tasks)",
    'scrolls': ("SCROLLS (ROUGE-1/2/L, F1 or exact match, as its leaderboard shows them; Avg: the "
                "mean over the 7 tasks' scores, ROUGE's geometric mean for the summaries)"),
    'ruler': 'RULER (the mean of the tasks\' scores at each input length; Avg.: over the lengths)',
}
TABLE_ORDER = ('lm', 'retrieval', 'mdqa', 'mdqa_oracle', 'kv', 'code', 'code_key', 'zeroscrolls',
               'scrolls', 'ruler')
GROUP_ORDER = ('Topic', 'Line', 'Passkey')
# Tables with an average column per group (Table 5) rather than one over all columns.
PER_GROUP_AVERAGE = ('mdqa', 'mdqa_oracle', 'kv')
# ZeroSCROLLS' columns in its paper's order and abbreviations: the values of
# `seqio_tasks.zeroscrolls.COLUMNS`, which the tasks' metrics.json name as their 'column' (this
# module imports nothing of seqio_tasks; tests/zeroscrolls_report_test.py checks they agree).
ZEROSCROLLS_COLUMNS = ('GvRp', 'SSFD', 'QMsm', 'SQAL', 'Qspr', 'Nrtv', 'QALT', 'MuSQ', 'SpDg',
                       'BkSS')
# Published results `render` can add (`t5align.report --published SUITE`): suite -> data file
# (its source, split, row label, columns and rows; `published_results`).
PUBLISHED = {'zeroscrolls': os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                         'zeroscrolls_published.json')}
# SCROLLS' columns in its leaderboard's order and abbreviations: the values of
# `seqio_tasks.scrolls.COLUMNS` (tests/scrolls_report_test.py checks they agree).
SCROLLS_COLUMNS = ('GovRep', 'SumScr', 'QMSum', 'Qspr', 'Nrtv', 'QALT', 'CNLI')
PUBLISHED['scrolls'] = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    'scrolls_published.json')
# Our rows' splits in this order, then any other.
SPLIT_ORDER = ('validation', 'test')


def iter_metrics_files(folders: Iterable[str | os.PathLike[str]]) -> Iterator[str]:
  """metrics.json files under each folder (the folder itself may be a task folder)."""
  for folder in folders:
    for root, dirs, files in os.walk(os.fspath(folder)):
      dirs.sort()
      if 'metrics.json' in files:
        yield os.path.join(root, 'metrics.json')


def load_results(folders: Iterable[str]) -> list[dict[str, Any]]:
  """Every metrics.json under `folders`; a corrupt or incomplete one raises, naming it."""
  results = []
  for path in iter_metrics_files(folders):
    result = outputs.read_json(path, 'metrics file')
    if not isinstance(result, dict):
      raise ValueError(f'metrics file {path}: expected a JSON object; got '
                       f'{type(result).__name__}.')
    missing = [k for k in ('group', 'column', 'metrics') if k not in result]
    if missing or not isinstance(result.get('metrics'), dict):
      raise ValueError(f'metrics file {path} is incomplete: it lacks '
                       f'{", ".join(missing) or "a metrics object"} (written by an older or '
                       'interrupted t5align.eval?).')
    for key, value in result['metrics'].items():
      if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f'metrics file {path}: metric {key!r} is {value!r}; expected a number '
                         'or null.')
    for key in ('group', 'column', 'primary_metric'):
      if key in result and not isinstance(result[key], str):
        raise ValueError(f'metrics file {path}: {key!r} is {result[key]!r}; expected a string.')
    result['path'] = path
    run_file = os.path.join(os.path.dirname(path), 'run.json')
    result['run'] = (outputs.read_json(run_file, 'run record') if fileio.exists(run_file)
                     else None)
    results.append(result)
  return separate_runs(results)


# run.json fields that say where or on how many devices a run ran, not what it computed.
_NOT_RESULTS = (*run_identity.INFORMATIONAL, 'gin', 'process_count', 'device_count', 'mesh')


def split_of(result: Mapping[str, Any]) -> str | None:
  """The split a result was evaluated on (its run.json's 'split'); None without a run.json."""
  run = result.get('run')
  split = run.get('split') if isinstance(run, Mapping) else None
  return split if isinstance(split, str) else None


def _value(settings: Any, dotted: str) -> Any:
  for key in dotted.split('.'):
    settings = settings.get(key) if isinstance(settings, Mapping) else None
  return settings


def _shown(value: Any) -> str:
  """A setting's value in a row label: a long digest as its first 8 characters."""
  text = str(value)
  if re.fullmatch(r'[0-9a-f]{16,}', text):
    return text[:8]
  return text if len(text) <= 32 else text[:29] + '...'


def separate_runs(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """`results` with no two runs in one cell.

  Results whose cell (model, label, group, column) is shared by another run of the same split
  (run.json's; a table shows the split where there are several, as ZeroSCROLLS' does) are
  compared by their run.json (`result['run']`): every run folder (the folder holding the task
  folders) in such a collision gets its folder and the differing settings (those with one value
  across that folder's results) appended to its label. The same run found twice (identical
  settings and metrics) counts once.

  Raises:
    ValueError: two results of one cell with identical settings but different metrics, or
      without a run.json to tell them apart, naming both files.
  """
  cell_of = lambda r: (r.get('model', ''), r.get('label', ''), r['group'], r['column'])
  # A cell with a result lacking run.json (so its split) is one collision, refused below.
  unknown = {cell_of(r) for r in results if r['run'] is None}
  cells: dict[tuple[str, str, str, str, str | None], list[dict[str, Any]]] = {}
  for r in results:
    cell = cell_of(r)
    cells.setdefault((*cell, None if cell in unknown else split_of(r)), []).append(r)
  kept, fields, split = [], set(), set()
  for items in cells.values():
    first = items[0]
    kept.append(first)
    for other in items[1:]:
      pair = f'{first["path"]} and {other["path"]}'
      if first['run'] is None or other['run'] is None:
        raise ValueError(f'{pair} fill one table cell and one of them has no run.json to tell '
                         'the runs apart; report them separately.')
      diff = run_identity.differences(first['run'], other['run'], ignore=_NOT_RESULTS)
      if not diff:
        if other['metrics'] != first['metrics']:
          raise ValueError(f'{pair} record the same run (equal run.json settings) with '
                           'different metrics; report one of them.')
        continue  # The same run, found twice.
      kept.append(other)
      fields.update(diff)
      split.update(os.path.dirname(os.path.dirname(r['path'])) for r in (first, other))
  by_run: dict[str, list[dict[str, Any]]] = {}
  for r in kept:
    by_run.setdefault(os.path.dirname(os.path.dirname(r['path'])), []).append(r)
  for folder in sorted(split):
    values = {f: {json.dumps(_value(r['run'], f), sort_keys=True) for r in by_run[folder]}
              for f in sorted(fields)}
    shown = [f'{f}={_shown(_value(by_run[folder][0]["run"], f))}'
             for f, v in values.items() if len(v) == 1]
    for r in by_run[folder]:
      r['label'] = f'{r.get("label", "")} [{", ".join([folder, *shown])}]'
  return kept


def _number_key(text: str) -> tuple[float, str]:
  match = re.match(r'<?(\d+(?:\.\d+)?)(k?)', text)
  if not match:
    return (float('inf'), text)
  value = float(match.group(1)) * (1000 if match.group(2) else 1)
  return (value - 0.5 if text.startswith('<') else value, text)


def _group_key(group: str) -> tuple[int, float, str]:
  for i, prefix in enumerate(GROUP_ORDER):
    if group.startswith(prefix):
      return (i, 0.0, group)
  return (len(GROUP_ORDER), _number_key(group)[0], group)


def _fmt(value: float | None, table: str) -> str:
  if value is None or value != value:
    return '-'
  if table == 'lm' and value > 1000:
    return '>1k'
  return f'{value:.1f}'


def _mean(values: Sequence[float | None]) -> float | None:
  values = [v for v in values if v is not None]
  return sum(values) / len(values) if values else None


def binomial_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
  """Wilson score interval (95% for the default z) of a success rate, as fractions in [0, 1].

  Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or `trials`
  successes, where small retrieval evaluations often sit.
  """
  if trials <= 0 or not 0 <= successes <= trials or int(successes) != successes:
    raise ValueError(f'binomial_interval: need 0 <= successes <= trials, trials > 0 and whole '
                     f'successes; got successes={successes}, trials={trials}.')
  p = successes / trials
  scale = 1 + z * z / trials
  center = (p + z * z / (2 * trials)) / scale
  half = z / scale * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
  return max(0.0, center - half), min(1.0, center + half)


def accuracy_interval(percent: float, trials: int) -> tuple[float, float]:
  """The 95% Wilson interval (%) of an accuracy (%) over `trials` examples; raises ValueError
  unless the accuracy is a whole number of them."""
  successes = round(percent * trials / 100)
  if abs(successes - percent * trials / 100) > 1e-6:
    raise ValueError(f'accuracy {percent}% is not a whole number of {trials} examples.')
  low, high = binomial_interval(successes, trials)
  return 100 * low, 100 * high


def accuracy_cell(percent: float, trials: int) -> str:
  """'90 [79-96]': an accuracy (%) over `trials` examples with its 95% Wilson interval (%)."""
  low, high = accuracy_interval(percent, trials)
  return f'{percent:.0f} [{low:.0f}-{high:.0f}]'


def compare_accuracies(percent: float, baseline: float, trials: int) -> str:
  """'better', 'worse' or 'within noise': an accuracy (%) against a baseline's, both over
  `trials` examples, 'better'/'worse' only where their 95% Wilson intervals do not overlap.

  NOTE: disjoint 95% intervals are a stricter test than a 5% two-sample test, so a difference
  called 'within noise' here may still be real; one called 'better' is not an interval's luck.
  """
  low, high = accuracy_interval(percent, trials)
  base_low, base_high = accuracy_interval(baseline, trials)
  if low > base_high:
    return 'better'
  if high < base_low:
    return 'worse'
  return 'within noise'


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]],
                   left: Collection[int] = (0,)) -> str:
  """A Markdown table: the columns at the indices `left` left-aligned (row names; default the
  first), the others right-aligned."""
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join('---' if i in left else '---:' for i in range(len(header))) + '|']
  lines += ['| ' + ' | '.join(r) + ' |' for r in rows]
  return '\n'.join(lines)


def _markdown(title: str, header: Sequence[str], rows: Sequence[Sequence[str]],
              left: Collection[int] = (0,)) -> str:
  return f'### {title}\n\n' + markdown_table(header, rows, left)


def _row_keys(results: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
  keys = {(r.get('model', ''), r.get('label', '')) for r in results}
  return sorted(keys, key=lambda k: (k[0], labels.label_order(k[1])))


def _row_name(model: str, label: str, first: bool) -> str:
  return f'{model} {label}'.strip() if first else label


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


def _cells_table(table: str, results: Sequence[Mapping[str, Any]], metric: str | None) -> str:
  """Columns (group, column), a value per row (of `metric`, else each result's primary metric);
  averages per group or over everything."""
  columns = sorted({(r['group'], r['column']) for r in results},
                   key=lambda gc: (_group_key(gc[0]), _number_key(gc[1])))
  groups = sorted({g for g, _ in columns}, key=_group_key)
  per_group = table in PER_GROUP_AVERAGE
  header = ['Model']
  for g in groups:
    cols = [c for gg, c in columns if gg == g]
    header += [f'{g}: {c}' for c in cols] + ([f'{g}: Avg.'] if per_group else [])
  if not per_group:
    header.append('Avg.')
  cell = {(r.get('model', ''), r.get('label', ''), r['group'], r['column']):
          r['metrics'].get(metric) if metric else primary_value(r) for r in results}
  rows, last_model = [], None
  for model, label in _row_keys(results):
    row = [_row_name(model, label, model != last_model)]
    last_model = model
    everything = []
    for g in groups:
      values = [cell.get((model, label, g, c)) for gg, c in columns if gg == g]
      everything += values
      row += [_fmt(v, table) for v in values]
      if per_group:
        row.append(_fmt(_mean(values) if None not in values else None, table))
    if not per_group:
      row.append(_fmt(_mean(everything) if None not in everything else None, table))
    rows.append(row)
  return _markdown(TITLES.get(table, table), header, rows)


def _code_tables(results: Sequence[Mapping[str, Any]]) -> list[str]:
  """EM and ES per context-length bucket, one pair of tables per code source (group)."""
  out = []
  for group in sorted({r['group'] for r in results}):
    items = [r for r in results if r['group'] == group]
    buckets = sorted({k[3:] for r in items for k in r['metrics'] if k.startswith('em_')},
                     key=_number_key)
    for name, prefix in (('Exact Match', 'em_'), ('Edit Similarity', 'es_')):
      cell = {(r.get('model', ''), r.get('label', '')): r['metrics'] for r in items}
      rows, last_model = [], None
      for model, label in _row_keys(items):
        metrics = cell[(model, label)]
        rows.append([_row_name(model, label, model != last_model)]
                    + [_fmt(metrics.get(prefix + b), 'code') for b in buckets]
                    + [_fmt(metrics.get(prefix.rstrip('_')), 'code')])
        last_model = model
      out.append(_markdown(f'{TITLES["code"]}: {name}, {group}, by input length',
                           ['Model', *buckets, 'All'], rows))
  return out


def render(results: Sequence[Mapping[str, Any]], published: Collection[str] = (),
           ruler_tasks: bool = False) -> str:
  """Markdown for all results, one section per table kind present.

  Args:
    results: `load_results`' results.
    published: suites (keys of `PUBLISHED`) whose published rows join their table, which is
      printed even without results of ours.
    ruler_tasks: add the RULER table per task (`ruler_task_table`) after the per-length one.
  """
  unknown = sorted(set(published) - set(PUBLISHED))
  if unknown:
    raise ValueError(f'no published results of {", ".join(unknown)}; there are those of '
                     f'{", ".join(PUBLISHED)}.')
  sections = []
  tables = sorted({r.get('table', 'other') for r in results} | set(published),
                  key=lambda t: (TABLE_ORDER.index(t) if t in TABLE_ORDER else len(TABLE_ORDER),
                                 t))
  for table in tables:
    items = [r for r in results if r.get('table', 'other') == table]
    if table == 'code':
      sections += _code_tables(items)
    elif table == 'ruler':
      sections.append(ruler_table(items))
      if ruler_tasks:
        sections.append(ruler_task_table(items))
    elif table in SUITES:  # ZeroSCROLLS, SCROLLS.
      sections.append(suite_table(
          table, items, published_results(table) if table in published else None))
    else:
      sections.append(_cells_table(table, items, 'perplexity' if table == 'lm' else None))
  return '\n\n'.join(sections) + '\n'


# ---------------------------------------------------------------------------------------------
# Suites laid out as their papers' tables: ZeroSCROLLS, SCROLLS.


@dataclasses.dataclass(frozen=True)
class SuiteLayout:
  """A suite's table: a row per (model, split, input length, label), a column per task in the
  suite's order and Avg (the mean of the tasks' primary metrics, '-' unless all are there).

  Attributes:
    name: the suite's name, in messages.
    columns: the tasks' columns: the 'column' their metrics.json files name.
    parts: column -> the metrics a cell of ours shows, '/'-joined (ROUGE-1/2/L); any other
      column shows its primary metric.
    published_parts: column -> how many numbers a published cell holds, a list (other columns:
      one number).
    average_first: Avg before the task columns (SCROLLS' leaderboard), else after them.
    unscored: said of a test-split row without scores (its gold is private).
  """

  name: str
  columns: tuple[str, ...]
  parts: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
  published_parts: Mapping[str, int] = dataclasses.field(default_factory=dict)
  average_first: bool = False
  unscored: str = ''

  @property
  def scores(self) -> list[str]:
    """The score columns in the table's order: the tasks and 'Avg'."""
    return ['Avg', *self.columns] if self.average_first else [*self.columns, 'Avg']


_ROUGE_PARTS = ('rouge1', 'rouge2', 'rougeL')
SUITES = {
    'zeroscrolls': SuiteLayout(
        'ZeroSCROLLS', ZEROSCROLLS_COLUMNS,
        unscored=(" (the test split's gold is private: the leaderboard scores its predictions, "
                  'python -m t5align.leaderboard writes the CSV)')),
}


def _number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _published_cell(layout: SuiteLayout, column: str, value: Any) -> bool:
  size = layout.published_parts.get(column, 1)
  if size == 1:
    return _number(value)
  return isinstance(value, list) and len(value) == size and all(_number(v) for v in value)


def published_results(suite: str) -> dict[str, Any]:
  """The published rows of `suite` (`PUBLISHED`), checked: {'source', 'split', 'label',
  'columns', 'rows': [{'model', 'tokens', 'scores': one entry per column}]}; the columns are the
  suite's `SuiteLayout.scores`, an entry a number or, for a column of `published_parts`, a list
  of that many numbers.

  Raises:
    ValueError: naming the file and the field, for a field missing or of the wrong kind, or
      columns other than the table's.
  """
  path, layout = PUBLISHED[suite], SUITES[suite]
  data = outputs.read_json(path, 'published results')
  where = f'published results {path}'
  if not isinstance(data, dict):
    raise ValueError(f'{where}: expected a JSON object; got {type(data).__name__}.')
  for key in ('source', 'split', 'label'):
    if not isinstance(data.get(key), str):
      raise ValueError(f'{where}: {key!r} is {data.get(key)!r}; expected a string.')
  columns = layout.scores
  if data.get('columns') != columns:
    raise ValueError(f'{where}: \'columns\' is {data.get("columns")!r}; expected {columns}.')
  if not isinstance(data.get('rows'), list) or not data['rows']:
    raise ValueError(f'{where}: \'rows\' is {data.get("rows")!r}; expected a list of rows.')
  if layout.published_parts:
    kinds = [f'{c}: a list of {layout.published_parts[c]} numbers'
             if c in layout.published_parts else f'{c}: a number' for c in columns]
    expected = f'{len(columns)} entries ({", ".join(kinds)})'
  else:
    expected = f'{len(columns)} numbers ({", ".join(columns)})'
  for i, row in enumerate(data['rows']):
    field = f'{where}: rows[{i}]'
    if not isinstance(row, dict) or not isinstance(row.get('model'), str):
      raise ValueError(f'{field}: expected an object with a string \'model\'; got {row!r}.')
    if not isinstance(row.get('tokens'), int) or isinstance(row['tokens'], bool):
      raise ValueError(f'{field}.tokens is {row.get("tokens")!r}; expected an integer.')
    scores = row.get('scores')
    if (not isinstance(scores, list) or len(scores) != len(columns)
        or not all(_published_cell(layout, c, v) for c, v in zip(columns, scores))):
      raise ValueError(f'{field}.scores is {scores!r}; expected {expected}.')
  return data


def _suite_rows(layout: SuiteLayout, results: Sequence[Mapping[str, Any]]
                ) -> dict[tuple[str, str, int, str], dict[str, Mapping[str, Any]]]:
  """{(model, split, input length, label): {column: result}}, each result's fields checked."""
  rows: dict[tuple[str, str, int, str], dict[str, Mapping[str, Any]]] = {}
  for r in results:
    if r['column'] not in layout.columns:
      raise ValueError(f'metrics file {r["path"]}: \'column\' is {r["column"]!r}, not a '
                       f'{layout.name} column ({", ".join(layout.columns)}).')
    if not r['group'].isdigit():
      raise ValueError(f'metrics file {r["path"]}: \'group\' is {r["group"]!r}; a '
                       f"{layout.name} task's group is its input length.")
    key = (r.get('model', ''), split_of(r) or 'split unknown', int(r['group']),
           r.get('label', ''))
    rows.setdefault(key, {})[r['column']] = r
  return rows


def _our_cell(layout: SuiteLayout, table: str, column: str,
              result: Mapping[str, Any] | None, value: float | None) -> str:
  parts = layout.parts.get(column)
  if not parts or result is None or value is None:
    return _fmt(value, table)
  return '/'.join(_fmt(result['metrics'].get(k), table) for k in parts)


def _published_text(value: Any, table: str) -> str:
  return '/'.join(_fmt(v, table) for v in value) if isinstance(value, list) else _fmt(value,
                                                                                       table)


def suite_table(table: str, results: Sequence[Mapping[str, Any]],
                published: Mapping[str, Any] | None = None) -> str:
  """A suite's table (`SUITES[table]`): columns Model, Tokens, Temperature, the tasks and Avg.

  Our rows, one per (model, split, input length, label), are named '{model} ({split})' (the
  split from run.json) and sorted by model, split, length and label (`labels.PAPER_ORDER`
  first); a cell is the task's primary metric, or the metrics its column's `parts` name ('-'
  without; `primary_value`, strict). Avg is the mean of the tasks' primary metrics, '-' unless
  all are there; the lines under the table name what each such row lacks. `published`
  (`published_results`) rows follow ours as published, '{model} (published, {split})', with the
  published average and the data's source.
  """
  layout = SUITES[table]
  rows = _suite_rows(layout, results)
  order = lambda key: (key[0], SPLIT_ORDER.index(key[1]) if key[1] in SPLIT_ORDER
                       else len(SPLIT_ORDER), key[1], key[2], labels.label_order(key[3]))
  lines, notes = [], []
  for key in sorted(rows, key=order):
    model, split, length, label = key
    values = {c: primary_value(r, strict=True) for c, r in rows[key].items()}
    scores = [values.get(c) for c in layout.columns]
    cells = {c: _our_cell(layout, table, c, rows[key].get(c), values.get(c))
             for c in layout.columns}
    cells['Avg'] = _fmt(_mean(scores) if None not in scores else None, table)
    name = f'{model} ({split})'
    lines.append([name, str(length), label, *[cells[c] for c in layout.scores]])
    absent = [c for c in layout.columns if c not in values]
    unscored = [c for c in layout.columns if c in values and values[c] is None]
    lacks = ([f'no result for {", ".join(absent)}'] if absent else []) + (
        [f'no score for {", ".join(unscored)}' + (layout.unscored if split == 'test' else '')]
        if unscored else [])
    if lacks:
      notes.append(f'- {name}, {length} tokens, {label}: {"; ".join(lacks)}.')
  if published is not None:
    for row in published['rows']:
      lines.append([f'{row["model"]} (published, {published["split"]})', str(row['tokens']),
                    published['label'], *[_published_text(v, table) for v in row['scores']]])
  header = ['Model', 'Tokens', 'Temperature', *layout.scores]
  text = _markdown(TITLES[table], header, lines, left=(0, 2))
  if notes:
    text += f'\n\nAvg needs all {len(layout.columns)} tasks scored:\n\n' + '\n'.join(notes)
  if published is not None:
    text += f'\n\nPublished rows: {published["source"]}'
  return text


# ---------------------------------------------------------------------------------------------
# RULER.

# RULER's 13 tasks in its README's order: the values of `seqio_tasks.ruler.TASKS`, which the
# tasks' metrics.json name as their 'column' (tests/ruler_report_test.py checks they agree).
RULER_TASKS = ('niah_single_1', 'niah_single_2', 'niah_single_3', 'niah_multikey_1',
               'niah_multikey_2', 'niah_multikey_3', 'niah_multivalue', 'niah_multiquery', 'vt',
               'cwe', 'fwe', 'qa_1', 'qa_2')


def _ruler_cells(results: Sequence[Mapping[str, Any]]
                 ) -> tuple[dict[tuple[str, str], dict[int, dict[str, float | None]]], list[int]]:
  """({(model, label): {length: {task: score or None}}}, the lengths present, ascending), each
  result's fields checked."""
  rows: dict[tuple[str, str], dict[int, dict[str, float | None]]] = {}
  for r in results:
    if r['column'] not in RULER_TASKS:
      raise ValueError(f'metrics file {r["path"]}: \'column\' is {r["column"]!r}, not a RULER '
                       f'task ({", ".join(RULER_TASKS)}).')
    if not r['group'].isdigit():
      raise ValueError(f'metrics file {r["path"]}: \'group\' is {r["group"]!r}; a RULER task\'s '
                       'group is its input length.')
    key = (r.get('model', ''), r.get('label', ''))
    rows.setdefault(key, {}).setdefault(int(r['group']), {})[r['column']] = primary_value(
        r, strict=True)
  lengths = sorted({n for row in rows.values() for n in row})
  return rows, lengths


def _ruler_order(rows: Mapping[tuple[str, str], Any]) -> list[tuple[str, str]]:
  return sorted(rows, key=lambda k: (k[0], labels.label_order(k[1])))


def ruler_table(results: Sequence[Mapping[str, Any]]) -> str:
  """The RULER table: columns Model, Temperature, one per input length, and Avg.

  A row per (model, label), labels in `labels.PAPER_ORDER` first. A cell is the mean of the
  primary metric (upstream's score) of the RULER tasks scored at that length ('-' without any);
  Avg. is the mean of the row's cells, '-' unless every length has one. The lines under the
  table say which tasks the cells average, and which of the 13 they lack.
  """
  rows, lengths = _ruler_cells(results)
  lines, averaged = [], {}
  for key in _ruler_order(rows):
    model, label = key
    cells = []
    for n in lengths:
      scores = {t: v for t, v in rows[key].get(n, {}).items() if v is not None}
      cells.append(_mean(list(scores.values())))
      tasks = tuple(t for t in RULER_TASKS if t in scores)
      averaged.setdefault(tasks, []).append(f'{model} {label} at {n}'.strip())
    lines.append([model, label, *[_fmt(v, 'ruler') for v in cells],
                  _fmt(_mean(cells) if None not in cells else None, 'ruler')])
  header = ['Model', 'Temperature', *map(str, lengths), 'Avg.']
  text = _markdown(TITLES['ruler'], header, lines, left=(0, 1))
  notes = []
  everywhere = len(averaged) == 1
  for tasks, where in averaged.items():
    lacking = [t for t in RULER_TASKS if t not in tasks]
    what = ('no task' if not tasks else f'all {len(RULER_TASKS)} tasks' if not lacking else
            f'{len(tasks)} of the {len(RULER_TASKS)} tasks ({", ".join(tasks)}); no score for '
            f'{", ".join(lacking)}')
    notes.append(f'- {what}: {"every cell" if everywhere else "; ".join(where)}.')
  return text + '\n\nCells average:\n\n' + '\n'.join(notes)


def ruler_task_table(results: Sequence[Mapping[str, Any]]) -> str:
  """RULER per task: a row per (model, label, task), columns the input lengths and Avg. (over
  the lengths, '-' unless all are scored); a cell is the task's score at that length."""
  rows, lengths = _ruler_cells(results)
  lines = []
  for key in _ruler_order(rows):
    model, label = key
    for task in [t for t in RULER_TASKS if any(t in rows[key].get(n, {}) for n in lengths)]:
      cells = [rows[key].get(n, {}).get(task) for n in lengths]
      lines.append([model, label, task, *[_fmt(v, 'ruler') for v in cells],
                    _fmt(_mean(cells) if None not in cells else None, 'ruler')])
  header = ['Model', 'Temperature', 'Task', *map(str, lengths), 'Avg.']
  return _markdown('RULER per task (upstream\'s score; Avg.: over the lengths)', header, lines,
                   left=(0, 1, 2))


# ---------------------------------------------------------------------------------------------
# SCROLLS.

# The leaderboard's layout: Avg first, ROUGE-1/2/L for the summaries, QuALITY's published cell
# EM on the whole test set / its hard subset (ours: the whole split).
SUITES['scrolls'] = SuiteLayout(
    'SCROLLS', SCROLLS_COLUMNS, parts=dict.fromkeys(SCROLLS_COLUMNS[:3], _ROUGE_PARTS),
    published_parts={**dict.fromkeys(SCROLLS_COLUMNS[:3], 3), 'QALT': 2}, average_first=True,
    unscored=" (the test split's gold is private: SCROLLS' leaderboard scores its predictions)")
