"""Results tables: metrics.json files of evaluation folders as Markdown shaped like the paper's.

Every metrics.json (written by `t5align.eval`) is one cell: its row is (model, label), labels in
`labels.PAPER_ORDER` first; its column is the task's (group, column); its value the metric the
file names as 'primary_metric' (its task family's, `seqio_tasks.metrics.FAMILIES`' `primary`).
Results of different runs that would share a cell get rows of their own (`separate_runs`).
The long-context suites' tables (ZeroSCROLLS, SCROLLS, RULER: a metrics.json's 'table' naming
one of `suites.LAYOUTS`) are laid out by their suite's layout, `t5align.evaluation.suites`, with
their published rows on request. No JAX: this reads files only.
"""
from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Collection, Iterable, Iterator, Mapping, Sequence

from t5align import labels
from t5align import run_identity
from t5align.evaluation import markdown
from t5align.evaluation import suites
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
}
# The paper's tables, then the suites'.
TABLE_ORDER = ('lm', 'retrieval', 'mdqa', 'mdqa_oracle', 'kv', 'code', 'code_key',
               *suites.LAYOUTS)
GROUP_ORDER = ('Topic', 'Line', 'Passkey')
# Tables with an average column per group (Table 5) rather than one over all columns.
PER_GROUP_AVERAGE = ('mdqa', 'mdqa_oracle', 'kv')


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
    result['run'] = (run_identity.upgrade(outputs.read_json(run_file, 'run record'), 'eval',
                                          run_file) if fileio.exists(run_file) else None)
    results.append(result)
  return split_checkpoints(separate_runs(results))


def unfinished(folders: Iterable[str | os.PathLike[str]]) -> list[str]:
  """Task folders under `folders` that a run started and did not finish: a run.json or
  predictions.jsonl, no metrics.json (an eval killed, failed or still running). The report
  lists them under its tables: their results are not in any row."""
  found = []
  for folder in folders:
    for root, dirs, files in os.walk(os.fspath(folder)):
      dirs.sort()
      if 'metrics.json' not in files and {'run.json', 'predictions.jsonl'} & set(files):
        found.append(root)
  return sorted(set(found))


def _checkpoint_of(result: Mapping[str, Any]) -> str | None:
  """The checkpoint content fingerprint of a result's run.json (its sha256), or None."""
  fingerprint = (result['run'] or {}).get('checkpoint')
  if isinstance(fingerprint, Mapping) and isinstance(fingerprint.get('sha256'), str):
    return fingerprint['sha256']
  return None


def split_checkpoints(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """`results` with no row (model, label) made of several checkpoints' results (whatever their
  splits: the paper's tables do not show the split, the suites' do).

  A model's name is the folder that holds its checkpoints (`checkpoint_N` of one MODEL_DIR
  share it), so the cells of one row can come from different checkpoints: then each result's
  label names its checkpoint, `[checkpoint=<the first 8 hex digits of its run.json's sha256>]`,
  and every checkpoint is a row of its own.

  Raises:
    ValueError: such a row holds a result without a run.json (its checkpoint unknown), naming
      it and one result of each checkpoint.
  """
  rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
  for r in results:
    rows.setdefault((r.get('model', ''), r.get('label', '')), []).append(r)
  for items in rows.values():
    shas = {_checkpoint_of(r) for r in items}
    if len(shas - {None}) < 2:
      continue
    unknown = [r['path'] for r in items if _checkpoint_of(r) is None]
    if unknown:
      raise ValueError(
          f'{unknown[0]} (no run.json, so no checkpoint recorded) shares a table row with '
          f'results of {len(shas - {None})} checkpoints ('
          + ', '.join(next(r['path'] for r in items if _checkpoint_of(r) == sha)
                      for sha in sorted(shas - {None}))
          + '); report them separately.')
    for r in items:
      r['label'] = f'{r.get("label", "")} [checkpoint={_checkpoint_of(r)[:8]}]'
  return list(results)


# run.json fields that say where or on how many devices a run ran, not what it computed.
_NOT_RESULTS = (*run_identity.INFORMATIONAL, 'gin', 'process_count', 'device_count', 'mesh')


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
    cells.setdefault((*cell, None if cell in unknown else markdown.split_of(r)), []).append(r)
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


def _row_keys(results: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
  keys = {(r.get('model', ''), r.get('label', '')) for r in results}
  return sorted(keys, key=lambda k: (k[0], labels.label_order(k[1])))


def _row_name(model: str, label: str, first: bool) -> str:
  return f'{model} {label}'.strip() if first else label


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
          r['metrics'].get(metric) if metric else markdown.primary_value(r) for r in results}
  rows, last_model = [], None
  for model, label in _row_keys(results):
    row = [_row_name(model, label, model != last_model)]
    last_model = model
    everything = []
    for g in groups:
      values = [cell.get((model, label, g, c)) for gg, c in columns if gg == g]
      everything += values
      row += [markdown.fmt(v, table) for v in values]
      if per_group:
        row.append(markdown.fmt(markdown.mean(values) if None not in values else None, table))
    if not per_group:
      row.append(markdown.fmt(markdown.mean(everything) if None not in everything else None, table))
    rows.append(row)
  return markdown.section(TITLES.get(table, table), header, rows)


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
                    + [markdown.fmt(metrics.get(prefix + b), 'code') for b in buckets]
                    + [markdown.fmt(metrics.get(prefix.rstrip('_')), 'code')])
        last_model = model
      out.append(markdown.section(f'{TITLES["code"]}: {name}, {group}, by input length',
                           ['Model', *buckets, 'All'], rows))
  return out


def render(results: Sequence[Mapping[str, Any]], published: Collection[str] = (),
           ruler_tasks: bool = False, left_out: Sequence[str] = ()) -> str:
  """Markdown for all results, one section per table kind present.

  Args:
    results: `load_results`' results.
    published: suites (keys of `suites.PUBLISHED`) whose published rows join their table, which
      is printed even without results of ours.
    ruler_tasks: add the RULER table per task after the per-length one.
    left_out: task folders of unfinished runs (`unfinished`), listed after the tables.
  """
  unknown = sorted(set(published) - set(suites.PUBLISHED))
  if unknown:
    raise ValueError(f'no published results of {", ".join(unknown)}; there are those of '
                     f'{", ".join(suites.PUBLISHED)}.')
  sections = []
  tables = sorted({r.get('table', 'other') for r in results} | set(published),
                  key=lambda t: (TABLE_ORDER.index(t) if t in TABLE_ORDER else len(TABLE_ORDER),
                                 t))
  for table in tables:
    items = [r for r in results if r.get('table', 'other') == table]
    if table == 'code':
      sections += _code_tables(items)
    elif table in suites.LAYOUTS:
      sections += suites.LAYOUTS[table].sections(items, published=table in published,
                                                 per_task=ruler_tasks)
    else:
      sections.append(_cells_table(table, items, 'perplexity' if table == 'lm' else None))
  if left_out:
    sections.append(f'Left out, unfinished (a run.json or predictions.jsonl, no metrics.json: '
                    f'an eval killed, failed or still running; rerun it to finish), '
                    f'{len(left_out)} task folder{"s" if len(left_out) > 1 else ""}:\n\n'
                    + '\n'.join(f'- {f}' for f in left_out))
  return '\n\n'.join(sections) + '\n'
