"""The two shapes of a suite's table (no JAX, no seqio): `TaskColumns`, a row per (model, split,
input length, label) and a column per task (ZeroSCROLLS', SCROLLS'), and `LengthColumns`, a row
per (model, label) and a column per input length, a cell the mean over the tasks (RULER's).

Each suite's own layout (`zeroscrolls.LAYOUT`, ...) is one of them, with the suite's columns,
title and published rows; `t5align.evaluation.tables.render` calls its `sections`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol, Sequence

from t5align import labels
from t5align.evaluation import markdown
from t5align.runtime import outputs

# Our rows' splits in this order, then any other.
SPLIT_ORDER = ('validation', 'test')


class Layout(Protocol):
  """A suite's table: the results whose 'table' is `table`, as Markdown sections."""

  table: str
  published: str | None  # The published rows' data file (`published_results`), if any.

  def sections(self, results: Sequence[Mapping[str, Any]], *, published: bool = False,
               per_task: bool = False) -> list[str]:
    """The suite's tables of `results` (`tables.load_results`' results of this table); with
    `published`, the published rows too; with `per_task`, a table per task where the layout
    has one."""
    ...


def _number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(result: Mapping[str, Any], columns: Sequence[str], what: str, name: str) -> None:
  """Raises ValueError naming the file, for a 'column' not among `columns` (a `what`) or a
  'group' that is not an input length."""
  if result['column'] not in columns:
    raise ValueError(f'metrics file {result["path"]}: \'column\' is {result["column"]!r}, not a '
                     f'{name} {what} ({", ".join(columns)}).')
  if not result['group'].isdigit():
    raise ValueError(f'metrics file {result["path"]}: \'group\' is {result["group"]!r}; a '
                     f"{name} task's group is its input length.")


def _our_rows(layout: TaskColumns, results: Sequence[Mapping[str, Any]]
              ) -> dict[tuple[str, str, int, str], dict[str, Mapping[str, Any]]]:
  """{(model, split, input length, label): {column: result}}, each result's fields checked."""
  rows: dict[tuple[str, str, int, str], dict[str, Mapping[str, Any]]] = {}
  for r in results:
    _check(r, layout.columns, 'column', layout.name)
    key = (r.get('model', ''), markdown.split_of(r) or 'split unknown', int(r['group']),
           r.get('label', ''))
    rows.setdefault(key, {})[r['column']] = r
  return rows


@dataclasses.dataclass(frozen=True)
class TaskColumns:
  """A suite's table: a row per (model, split, input length, label), a column per task in the
  suite's order and Avg (the mean of the tasks' primary metrics, '-' unless all are there).

  Attributes:
    table: the results' 'table' (the suite's name in the catalog).
    name: the suite's name, in messages.
    title: the table's title.
    columns: the tasks' columns: the 'column' their metrics.json files name.
    parts: column -> the metrics a cell of ours shows, '/'-joined (ROUGE-1/2/L); any other
      column shows its primary metric.
    published: the published rows' data file (`published_results`), if any.
    published_parts: column -> how many numbers a published cell holds, a list (other columns:
      one number).
    average_first: Avg before the task columns (SCROLLS' leaderboard), else after them.
    unscored: said of a test-split row without scores (its gold is private).
  """

  table: str
  name: str
  title: str
  columns: tuple[str, ...]
  parts: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
  published: str | None = None
  published_parts: Mapping[str, int] = dataclasses.field(default_factory=dict)
  average_first: bool = False
  unscored: str = ''

  @property
  def scores(self) -> list[str]:
    """The score columns in the table's order: the tasks and 'Avg'."""
    return ['Avg', *self.columns] if self.average_first else [*self.columns, 'Avg']

  def sections(self, results: Sequence[Mapping[str, Any]], *, published: bool = False,
               per_task: bool = False) -> list[str]:
    del per_task  # A column per task already.
    return [self.table_text(results, published_results(self) if published else None)]

  def _published_cell(self, column: str, value: Any) -> bool:
    size = self.published_parts.get(column, 1)
    if size == 1:
      return _number(value)
    return isinstance(value, list) and len(value) == size and all(_number(v) for v in value)

  def _our_cell(self, column: str, result: Mapping[str, Any] | None,
                value: float | None) -> str:
    parts = self.parts.get(column)
    if not parts or result is None or value is None:
      return markdown.fmt(value, self.table)
    return '/'.join(markdown.fmt(result['metrics'].get(k), self.table) for k in parts)

  def _published_text(self, value: Any) -> str:
    if isinstance(value, list):
      return '/'.join(markdown.fmt(v, self.table) for v in value)
    return markdown.fmt(value, self.table)

  def table_text(self, results: Sequence[Mapping[str, Any]],
                 published: Mapping[str, Any] | None = None) -> str:
    """The table: columns Model, Tokens, Temperature, the tasks and Avg (`scores`' order).

    Our rows, one per (model, split, input length, label), are named '{model} ({split})' (the
    split from run.json) and sorted by model, split, length and label (`labels.PAPER_ORDER`
    first); a cell is the task's primary metric, or the metrics its column's `parts` name ('-'
    without; `markdown.primary_value`, strict). Avg is the mean of the tasks' primary metrics, '-'
    unless all are there; the lines under the table name what each such row lacks. `published`
    (`published_results`) rows follow ours as published, '{model} (published, {split})', with
    the published average and the data's source.
    """
    rows = _our_rows(self, results)
    order = lambda key: (key[0], SPLIT_ORDER.index(key[1]) if key[1] in SPLIT_ORDER
                         else len(SPLIT_ORDER), key[1], key[2], labels.label_order(key[3]))
    lines, notes = [], []
    for key in sorted(rows, key=order):
      model, split, length, label = key
      values = {c: markdown.primary_value(r, strict=True) for c, r in rows[key].items()}
      scores = [values.get(c) for c in self.columns]
      shown = {c: self._our_cell(c, rows[key].get(c), values.get(c)) for c in self.columns}
      shown['Avg'] = markdown.fmt(markdown.mean(scores) if None not in scores else None, self.table)
      name = f'{model} ({split})'
      lines.append([name, str(length), label, *[shown[c] for c in self.scores]])
      absent = [c for c in self.columns if c not in values]
      unscored = [c for c in self.columns if c in values and values[c] is None]
      lacks = ([f'no result for {", ".join(absent)}'] if absent else []) + (
          [f'no score for {", ".join(unscored)}' + (self.unscored if split == 'test' else '')]
          if unscored else [])
      if lacks:
        notes.append(f'- {name}, {length} tokens, {label}: {"; ".join(lacks)}.')
    if published is not None:
      for row in published['rows']:
        lines.append([f'{row["model"]} (published, {published["split"]})', str(row['tokens']),
                      published['label'], *[self._published_text(v) for v in row['scores']]])
    header = ['Model', 'Tokens', 'Temperature', *self.scores]
    text = markdown.section(self.title, header, lines, left=(0, 2))
    if notes:
      text += f'\n\nAvg needs all {len(self.columns)} tasks scored:\n\n' + '\n'.join(notes)
    if published is not None:
      text += f'\n\nPublished rows: {published["source"]}'
    return text


def published_results(layout: TaskColumns) -> dict[str, Any]:
  """The published rows of a suite (its layout's `published` file), checked: {'source', 'split',
  'label', 'columns', 'rows': [{'model', 'tokens', 'scores': one entry per column}]}; the
  columns are the layout's `scores`, an entry a number or, for a column of `published_parts`, a
  list of that many numbers.

  Raises:
    ValueError: naming the file and the field, for a field missing or of the wrong kind, or
      columns other than the table's; for a layout without published rows.
  """
  path = layout.published
  if path is None:
    raise ValueError(f'{layout.name} has no published rows.')
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
        or not all(layout._published_cell(c, v) for c, v in zip(columns, scores))):
      raise ValueError(f'{field}.scores is {scores!r}; expected {expected}.')
  return data


@dataclasses.dataclass(frozen=True)
class LengthColumns:
  """A suite's table shaped like RULER's: a row per (model, label), labels in
  `labels.PAPER_ORDER` first, a column per input length and Avg.; a cell the mean of the primary
  metric of the tasks scored at that length ('-' without any), Avg. the mean of the row's cells
  ('-' unless every length has one). The lines under the table say which tasks the cells
  average, and which they lack. On request, a table per task (`task_table`).

  Attributes:
    table: the results' 'table'.
    name: the suite's name, in messages and the per-task table's title.
    title: the table's title.
    tasks: the tasks, in the suite's order: the 'column' their metrics.json files name.
  """

  table: str
  name: str
  title: str
  tasks: tuple[str, ...]
  published: str | None = None

  def sections(self, results: Sequence[Mapping[str, Any]], *, published: bool = False,
               per_task: bool = False) -> list[str]:
    del published  # No published rows.
    return [self.table_text(results), *([self.task_table(results)] if per_task else [])]

  def _cells(self, results: Sequence[Mapping[str, Any]]
             ) -> tuple[dict[tuple[str, str], dict[int, dict[str, float | None]]], list[int]]:
    """({(model, label): {length: {task: score or None}}}, the lengths present, ascending), each
    result's fields checked."""
    rows: dict[tuple[str, str], dict[int, dict[str, float | None]]] = {}
    for r in results:
      _check(r, self.tasks, 'task', self.name)
      key = (r.get('model', ''), r.get('label', ''))
      rows.setdefault(key, {}).setdefault(int(r['group']), {})[r['column']] = (
          markdown.primary_value(r, strict=True))
    lengths = sorted({n for row in rows.values() for n in row})
    return rows, lengths

  def table_text(self, results: Sequence[Mapping[str, Any]]) -> str:
    """The table: columns Model, Temperature, one per input length, and Avg."""
    rows, lengths = self._cells(results)
    lines, averaged = [], {}
    for key in _order(rows):
      model, label = key
      means = []
      for n in lengths:
        scores = {t: v for t, v in rows[key].get(n, {}).items() if v is not None}
        means.append(markdown.mean(list(scores.values())))
        tasks = tuple(t for t in self.tasks if t in scores)
        averaged.setdefault(tasks, []).append(f'{model} {label} at {n}'.strip())
      lines.append([model, label, *[markdown.fmt(v, self.table) for v in means],
                    markdown.fmt(markdown.mean(means) if None not in means else None, self.table)])
    header = ['Model', 'Temperature', *map(str, lengths), 'Avg.']
    text = markdown.section(self.title, header, lines, left=(0, 1))
    notes = []
    everywhere = len(averaged) == 1
    for tasks, where in averaged.items():
      lacking = [t for t in self.tasks if t not in tasks]
      what = ('no task' if not tasks else f'all {len(self.tasks)} tasks' if not lacking else
              f'{len(tasks)} of the {len(self.tasks)} tasks ({", ".join(tasks)}); no score for '
              f'{", ".join(lacking)}')
      notes.append(f'- {what}: {"every cell" if everywhere else "; ".join(where)}.')
    return text + '\n\nCells average:\n\n' + '\n'.join(notes)

  def task_table(self, results: Sequence[Mapping[str, Any]]) -> str:
    """Per task: a row per (model, label, task), columns the input lengths and Avg. (over the
    lengths, '-' unless all are scored); a cell is the task's score at that length."""
    rows, lengths = self._cells(results)
    lines = []
    for key in _order(rows):
      model, label = key
      for task in [t for t in self.tasks if any(t in rows[key].get(n, {}) for n in lengths)]:
        values = [rows[key].get(n, {}).get(task) for n in lengths]
        average = markdown.mean(values) if None not in values else None
        lines.append([model, label, task, *[markdown.fmt(v, self.table) for v in values],
                      markdown.fmt(average, self.table)])
    header = ['Model', 'Temperature', 'Task', *map(str, lengths), 'Avg.']
    return markdown.section(f"{self.name} per task (upstream's score; Avg.: over the lengths)",
                         header, lines, left=(0, 1, 2))


def _order(rows: Mapping[tuple[str, str], Any]) -> list[tuple[str, str]]:
  return sorted(rows, key=lambda k: (k[0], labels.label_order(k[1])))
