"""docs/ranking.md: the demo's encoder-temperature rules ranked by paired tests on its examples.

Run from the repository root, after a demo run:
  python -m t5align.demo --strategies pmax none:bias=interpolate none:bias=extend \
      pmax:bias=interpolate pmax:bias=extend pmax:bias=joint pmax:from_layer=1 \
      --num_examples 100 --output_dir demo_ranking
  python -m benchmarks.ranking --demo_output demo_ranking [--out docs/ranking.md]
      [--json benchmarks/results/ranking.json] [--machine TEXT]
  python -m benchmarks.ranking --check   # exit 1 if the page is not what the JSON record gives

It reads the demo output's results.json and predictions/<row>_<length>_<task>.jsonl (one record
per held-out example, every row on the same examples in the same order: checked) and compares,
per (task, length) cell, every row with tau = 1 and with the cell's best row by the exact
McNemar test (`t5align.evaluation.paired`), each accuracy with its 95% Wilson interval. It
writes a JSON record (its format, provenance, the demo's settings, n and every number per cell)
and the page rendered from that record alone, both atomically. Rows are whatever the demo output
has, named by `labels.row_label` (as the demo's report names them), else by their own name.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import time
from typing import Any, Mapping, Sequence

import numpy as np

from benchmarks import docs_pages
from t5align import labels
from t5align.evaluation import markdown
from t5align.evaluation import paired
from t5align.evaluation import tables
from t5align.runtime import fileio
from t5align.runtime import outputs

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGE = REPO / 'docs' / 'ranking.md'
RECORD = REPO / 'benchmarks' / 'results' / 'ranking.json'
FORMAT = 't5align.ranking.v1'
BASELINE = 'tau=1'
GENERATED = ('<!-- Written by `python -m benchmarks.ranking` from a demo output folder (its '
             'record:\n     benchmarks/results/ranking.json): edit the script, not this page. -->')
MARKS = {'better': ' (+)', 'worse': ' (-)', 'no difference': ''}


def row_label(row: str) -> str:
  """The demo report's label of a row (`labels.row_label`); a row it has no label for (a rule
  added since) by its own name."""
  try:
    return labels.row_label(row)
  except ValueError:
    return row


def predictions_path(demo_output: str, row: str, length: int, task: str) -> str:
  """The demo's `store.predictions_path`: predictions/<row>_<length>_<task>.jsonl."""
  return os.path.join(demo_output, 'predictions', f'{row}_{length}_{task}.jsonl')


# ------------------------------------------------------------------------------ reading a run


def read_predictions(path: str, task: str, length: int) -> list[dict[str, Any]]:
  """A cell's records (the demo's `heldout.retrieval_predictions` ones), checked: each names the
  cell's task and length, has an example 'index' and an 'accuracy' of 0 or 1."""
  text = fileio.read_input(path, 'demo predictions').decode('utf-8')
  records = []
  for i, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    try:
      r = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f'demo predictions {path}:{i}: not valid JSON ({e.msg}); is it '
                       'truncated?') from e
    if not isinstance(r, dict) or any(k not in r for k in ('index', 'accuracy')):
      raise ValueError(f'demo predictions {path}:{i}: expected a record with "index" and '
                       '"accuracy".')
    if r['accuracy'] not in (0, 1) or isinstance(r['accuracy'], bool):
      raise ValueError(f'demo predictions {path}:{i}: accuracy {r["accuracy"]!r}; expected 0 '
                       'or 1.')
    if r.get('task', task) != task or r.get('length', length) != length:
      raise ValueError(f'demo predictions {path}:{i}: a record of {r.get("task")} at '
                       f'{r.get("length")} tokens in the file of {task} at {length}.')
    records.append(r)
  if not records:
    raise ValueError(f'demo predictions {path}: no records.')
  return records


def _example_ids(records: Sequence[Mapping[str, Any]]) -> list[tuple[Any, Any]]:
  """Each record's example: its index and the answer it was scored against."""
  return [(r['index'], r.get('target', r.get('answer'))) for r in records]


def check_same_examples(path: str, records: Sequence[Mapping[str, Any]], other_path: str,
                        other: Sequence[Mapping[str, Any]]) -> None:
  """Refuses, naming both files and the first difference, two cells' records that are not of
  the same examples in the same order (a paired test compares example by example)."""
  mine, theirs = _example_ids(records), _example_ids(other)
  if mine == theirs:
    return
  if len(mine) != len(theirs):
    detail = f'{len(mine)} and {len(theirs)} examples'
  else:
    i = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
    detail = (f'record {i + 1} is example {mine[i][0]} (answer {mine[i][1]!r}) in the first and '
              f'example {theirs[i][0]} (answer {theirs[i][1]!r}) in the second')
  raise ValueError(f'demo predictions {path} and {other_path} are not of the same examples '
                   f'({detail}): a paired test needs both rows on the same examples; rerun the '
                   'demo into a new --output_dir.')


def cell_files(demo_output: str, rows: Sequence[str], task: str, length: int) -> dict[str, str]:
  """{row: its predictions file} of one cell. The demo writes every row's, a row whose
  temperature and bias rule equal an earlier row's as a copy of that row's file
  (`store.copy_predictions`)."""
  out = {}
  for row in rows:
    path = predictions_path(demo_output, row, length, task)
    if not fileio.exists(path):
      raise ValueError(f'demo output {demo_output}: results.json has {row} for {task} at '
                       f'{length} tokens but there is no {path}; run the demo command again '
                       '(it resumes, and writes the predictions of the cells it copied).')
    out[row] = path
  return out


def _ordered_rows(settings: Mapping[str, Any], accuracy: Mapping[str, Any]) -> list[str]:
  rows = [r for r in settings.get('rows') or () if r in accuracy]
  return rows + [r for r in accuracy if r not in rows]


def _ordered_tasks(settings: Mapping[str, Any], accuracy: Mapping[str, Any]) -> list[str]:
  present = [t for by_task in accuracy.values() for t in by_task]
  listed = [*(settings.get('tasks') or ()), *(settings.get('control_tasks') or ())]
  return [t for t in dict.fromkeys(listed) if t in present] + sorted(set(present) - set(listed))


def load_results(demo_output: str) -> dict[str, Any]:
  """The demo output's results.json, checked for what the ranking reads."""
  path = os.path.join(demo_output, 'results.json')
  results = outputs.read_json(path, 'demo results')
  if (not isinstance(results, dict) or not isinstance(results.get('accuracy'), dict)
      or not isinstance(results.get('settings'), dict)):
    raise ValueError(f'demo results {path}: expected "settings" and "accuracy" objects (written '
                     'by python -m t5align.demo).')
  if BASELINE not in results['accuracy']:
    raise ValueError(f'demo results {path}: no {BASELINE!r} row to compare the others with.')
  return results


def rank(demo_output: str, alpha: float = paired.ALPHA) -> dict[str, Any]:
  """The comparisons of every (task, length) cell of a finished demo output (the JSON record
  without its provenance).

  Returns:
    {'demo_settings', 'alpha', 'baseline', 'labels' {row: label}, 'rows', 'tasks' (ranked),
    'controls' (tasks with the baseline alone), 'cells': [{'task', 'length', 'n', 'best',
    'rows': {row: `paired.compare_rows`' fields + 'predictions' (the file, relative to the
    demo output)}}], 'ranking', 'conclusions'}.
  """
  results = load_results(demo_output)
  settings, accuracy = results['settings'], results['accuracy']
  rows, tasks = _ordered_rows(settings, accuracy), _ordered_tasks(settings, accuracy)
  cells, ranked, controls = [], [], []
  for task in tasks:
    task_rows = [r for r in rows if task in accuracy[r]]
    if task_rows == [BASELINE]:
      controls.append(task)
      continue
    ranked.append(task)
    lengths = sorted({int(L) for r in task_rows for L in accuracy[r][task]})
    for L in lengths:
      here = [r for r in task_rows if str(L) in accuracy[r][task]]
      if BASELINE not in here:
        raise ValueError(f'demo results {demo_output}/results.json: {task} at {L} tokens has '
                         f'rows {here} but no {BASELINE!r}.')
      files = cell_files(demo_output, here, task, L)
      records = {p: read_predictions(p, task, L) for p in files.values()}
      first = files[BASELINE]
      for p, items in records.items():
        check_same_examples(first, records[first], p, items)
      outcomes = {r: np.array([x['accuracy'] == 1 for x in records[files[r]]]) for r in here}
      cell = paired.compare_rows(outcomes, baseline=BASELINE, alpha=alpha)
      for r in here:
        recorded, measured = accuracy[r][task][str(L)], cell['rows'][r]['accuracy']
        if abs(recorded - measured) > 1e-6:
          raise ValueError(f'demo output {demo_output}: results.json gives {r} {recorded}% for '
                           f'{task} at {L} tokens, but {files[r]} scores {measured}%; the '
                           'folder mixes runs.')
        cell['rows'][r]['predictions'] = os.path.relpath(files[r], demo_output)
      cells.append({'task': task, 'length': L, **cell})
  record = {'demo_settings': _settings_summary(settings), 'alpha': alpha, 'baseline': BASELINE,
            'labels': {r: row_label(r) for r in rows}, 'rows': rows, 'tasks': ranked,
            'controls': controls, 'cells': cells}
  record['ranking'] = ranking(cells, rows)
  record['conclusions'] = conclusions(record)
  return record


def _settings_summary(settings: Mapping[str, Any]) -> dict[str, Any]:
  keys = ('mode', 'num_examples', 'reference_length', 'lengths', 'strategies', 'rows', 'tasks',
          'control_tasks', 'eval_seed', 'calibration_seed', 'seeds', 'num_references',
          'prompts_per_length', 'attention_impl', 'dtype')
  return {k: settings[k] for k in keys if k in settings}


# -------------------------------------------------------------------------------- the numbers


def ranking(cells: Sequence[Mapping[str, Any]], rows: Sequence[str]) -> list[dict[str, Any]]:
  """Rows ordered by cells significantly better than the baseline (most first), then worse
  (fewest first), then cells not significantly below the best (most first), then mean accuracy
  over their cells; each with those counts."""
  out = []
  for row in rows:
    mine = [c for c in cells if row in c['rows']]
    if not mine:
      continue
    verdicts = [c['rows'][row]['verdict'] for c in mine]
    out.append({'row': row, 'cells': len(mine), 'better': verdicts.count('better'),
                'worse': verdicts.count('worse'),
                'tied_with_best': sum(row in paired.tied_with_best(c) for c in mine),
                'mean_accuracy': float(np.mean([c['rows'][row]['accuracy'] for c in mine]))})
  return sorted(out, key=lambda r: (-r['better'], r['worse'], -r['tied_with_best'],
                                    -r['mean_accuracy']))


def p_clause(p: float, alpha: float = paired.ALPHA) -> str:
  """'p = 0.031', or 'p < 0.0001' (`p_text`'s '<0.0001'), for a sentence."""
  text = p_text(p, alpha)
  return f'p {text[0]} {text[1:]}' if text.startswith('<') else f'p = {text}'


def p_text(p: float, alpha: float = paired.ALPHA) -> str:
  """A p-value in two significant figures (more where two would round across `alpha`);
  '<0.0001' below it."""
  if p < 1e-4:
    return '<0.0001'
  text = f'{p:.2g}'
  if (float(text) < alpha) != (p < alpha):
    text = f'{p:.4g}'
  return text


def _places(items: Sequence[tuple[str, Sequence[str]]]) -> str:
  """'lines at 2048 (...) and 4096 (...); kv at 4096 (...)'."""
  return '; '.join(f'{task} at {_and(parts)}' for task, parts in items)


def _and(parts: Sequence[str]) -> str:
  return parts[0] if len(parts) == 1 else ', '.join(parts[:-1]) + ' and ' + parts[-1]


def conclusions(record: Mapping[str, Any]) -> list[str]:
  """Plain sentences read off the cells: which rows help (significantly better than the
  baseline at p < alpha), which hurt, where, and each cell's best."""
  alpha, base, label = record['alpha'], record['baseline'], record['labels']
  cells = record['cells']
  out = []
  for verdict, verb in (('better', 'helps'), ('worse', 'hurts')):
    any_row = False
    for row in record['rows']:
      if row == base:
        continue
      by_task: dict[str, list[str]] = {}
      for c in cells:
        v = c['rows'].get(row)
        if v is not None and v['verdict'] == verdict:
          b = c['rows'][base]
          by_task.setdefault(c['task'], []).append(
              f'{c["length"]} ({v["accuracy"]:.0f}% vs {b["accuracy"]:.0f}%, '
              f'{p_clause(v["vs_baseline"]["p"], alpha)})')
      if by_task:
        any_row = True
        count = sum(map(len, by_task.values()))
        total = sum(row in c['rows'] for c in cells)
        out.append(f'{label[row]} {verb}: significantly {verdict} than {label[base]} (exact '
                   f'McNemar, p < {alpha:g}) in {count} of its {total} cells: '
                   f'{_places(list(by_task.items()))}.')
    if not any_row:
      out.append(f'No rule is significantly {verdict} than {label[base]} (p < {alpha:g}) in any '
                 'cell.')
  for task in record['tasks']:
    mine = [c for c in cells if c['task'] == task]
    where = lambda verdict: [
        f'{c["length"]} ({", ".join(label[r] for r in paired.rows_with(c, verdict))})'
        for c in mine if paired.rows_with(c, verdict)]
    helped, hurt = where('better'), where('worse')
    neither = [str(c['length']) for c in mine
               if not paired.rows_with(c, 'better') and not paired.rows_with(c, 'worse')]
    parts = ([f'significantly better than {label[base]} at {_and(helped)}'] if helped else
             [f'no rule is significantly better than {label[base]} at any length'])
    if hurt:
      parts.append(f'significantly worse at {_and(hurt)}')
    if neither:
      parts.append(f'no rule differs significantly from {label[base]} at {_and(neither)}')
    out.append(f'Where, {task}: ' + '; '.join(parts) + '.')
  for c in cells:
    best, rows = c['best'], c['rows']
    if len({v['correct'] for v in rows.values()}) == 1:
      continue  # Every row alike (at L_tr, every row is tau = 1): nothing to rank.
    tied = [r for r in paired.tied_with_best(c) if r != best]
    below = [r for r in rows if r != best and r not in tied]
    text = (f'Best for {c["task"]} at {c["length"]}: {label[best]} '
            f'({rows[best]["accuracy"]:.0f}%, n = {c["n"]})')
    if tied:
      text += ('; not significantly below it (p >= ' f'{alpha:g}): '
               + ', '.join(f'{label[r]} {rows[r]["accuracy"]:.0f}%' for r in tied))
    if below:
      text += ('; significantly below it: '
               + ', '.join(f'{label[r]} {rows[r]["accuracy"]:.0f}% '
                           f'({p_clause(rows[r]["vs_best"]["p"], alpha)})' for r in below))
    out.append(text + '.')
  return out


# ---------------------------------------------------------------------------------- the page


def _commit() -> str | None:
  try:
    head = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=REPO, capture_output=True,
                          text=True, timeout=10, check=True).stdout.strip()
    dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=REPO,
                           capture_output=True, text=True, timeout=10, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return head + (' (with uncommitted changes)' if dirty else '')


def machine() -> str:
  """$T5ALIGN_BENCH_MACHINE, else this machine's core count, architecture and system."""
  return os.environ.get('T5ALIGN_BENCH_MACHINE') or (
      f'a {os.cpu_count()}-core {platform.machine()} {platform.system()} machine')


def demo_command(settings: Mapping[str, Any], output_dir: str) -> str:
  """The `python -m t5align.demo` command whose run records `settings` (results.json's): the
  flags that differ from the defaults of the mode it names."""
  from t5align.demo import planning  # pylint: disable=g-import-not-at-top  # Loads seqio.
  defaults = planning.DemoSettings()
  mode = planning.FULL if settings.get('mode') == 'full' else planning.DEFAULT
  args = ['--full'] if mode is planning.FULL else []
  if settings.get('control_tasks'):
    args.append('--controls')
  lengths, reference = list(settings.get('lengths') or ()), settings.get('reference_length')
  if lengths and lengths != [reference * k for k in (2, 4, 8, 16)]:
    args += ['--lengths', *map(str, lengths)]
  if list(settings.get('strategies') or mode.strategies) != list(mode.strategies):
    args += ['--strategies', *settings['strategies']]
  samples = (settings.get('prompts_per_length') or {}).get(str(max(lengths))) if lengths else None
  for flag, value, default in (
      ('num_examples', settings.get('num_examples'), defaults.num_examples),
      ('num_samples', samples, defaults.num_samples),
      ('num_references', settings.get('num_references'), defaults.num_references),
      ('calibration_seeds', len(settings.get('seeds') or ()) or None, mode.calibration_seeds),
      ('attention_impl', settings.get('attention_impl'), defaults.attention_impl)):
    if value is not None and value != default:
      args += [f'--{flag}', str(value)]
  model_dir = settings.get('model_dir')
  if model_dir and not model_dir.rstrip('/').endswith(os.path.join('shipped', 'retrieval_t5')):
    args.append(f'--model_dir={model_dir}')
  return shlex.join(['python', '-m', 't5align.demo', *args, '--output_dir', output_dir])


def provenance(demo_output: str, argv: Sequence[str], machine_text: str) -> dict[str, Any]:
  """Today's date, this checkout's commit, `machine_text`, this command (`argv`), and of the demo
  output: its command (`demo_command`), the date its results.json was last written and the demo's
  wall seconds (its 'timing')."""
  path = os.path.join(demo_output, 'results.json')
  results = load_results(demo_output)
  return {
      'date': time.strftime('%Y-%m-%d'), 'commit': _commit(), 'machine': machine_text,
      'command': shlex.join(['python', '-m', 'benchmarks.ranking', *argv]),
      'demo_output': demo_output, 'demo_command': demo_command(results['settings'], demo_output),
      'demo_results_written': time.strftime('%Y-%m-%d', time.localtime(os.path.getmtime(path))),
      'demo_seconds': (results.get('timing') or {}).get('total_s')}


def _head(c: Mapping[str, Any], reference_length: int | None, vary: bool) -> str:
  text = f'{c["length"]} (L_tr)' if c['length'] == reference_length else str(c['length'])
  return f'{text}, n = {c["n"]}' if vary else text


def _task_tables(record: Mapping[str, Any], task: str) -> str:
  label, base = record['labels'], record['baseline']
  mine = [c for c in record['cells'] if c['task'] == task]
  ns = {c['n'] for c in mine}
  reference = record['demo_settings'].get('reference_length')
  head = [_head(c, reference, len(ns) > 1) for c in mine]
  rows = [r for r in record['rows'] if any(r in c['rows'] for c in mine)]

  def cell(c, r, what):
    v = c['rows'].get(r)
    if v is None:
      return ''
    if what == 'accuracy':
      text = tables.accuracy_cell(v['accuracy'], c['n']) + MARKS[v['verdict']]
      top = c['rows'][c['best']]['correct']
      alike = all(x['correct'] == top for x in c['rows'].values())
      return f'**{text}**' if v['correct'] == top and not alike else text
    return '-' if r == (base if what == 'vs_baseline' else c['best']) else p_text(
        v[what]['p'], record['alpha'])

  n_text = f', n = {ns.pop()} per cell' if len(ns) == 1 else ''
  out = [f'## {task}']
  for title, what, skip in (
      (f'Accuracy % [95% Wilson interval]{n_text}; (+) / (-): significantly better / worse '
       f'than {label[base]} (p < {record["alpha"]:g}); bold: the cell\'s highest, where rows '
       'differ', 'accuracy', ()),
      (f'Exact McNemar p-value vs {label[base]}', 'vs_baseline', (base,)),
      ('Exact McNemar p-value vs the cell\'s best rule (- : the best)', 'vs_best', ())):
    table = [[label[r], *(cell(c, r, what) for c in mine)] for r in rows if r not in skip]
    out.append(f'{title}:\n\n' + markdown.markdown_table(['rule', *head], table))
  return '\n\n'.join(out)


def page(record: Mapping[str, Any]) -> str:
  """docs/ranking.md from a record (`rank` plus 'provenance')."""
  p, s, label = record['provenance'], record['demo_settings'], record['labels']
  seconds = p.get('demo_seconds')
  lines = [
      '# Ranking the encoder-temperature rules', GENERATED,
      f'Generated on {p["date"]} at commit {p["commit"] or "(not recorded)"} on '
      f'{p["machine"]} by `{p["command"]}`, from the demo output `{p["demo_output"]}` '
      f'(results.json written on {p["demo_results_written"]}'
      + (f', {seconds / 3600:.1f} hours of demo wall time' if seconds else '')
      + f'), whose recorded settings are those of `{p["demo_command"]}`.',
      f'Demo settings: {s.get("mode")} mode, {s.get("num_examples")} held-out examples per cell '
      f'(evaluation seed {s.get("eval_seed")}), L_tr = {s.get("reference_length")}, lengths '
      f'{", ".join(map(str, s.get("lengths", [])))}, calibration seed '
      f'{s.get("calibration_seed")}; rows: {", ".join(label[r] for r in record["rows"])}.'
      + (f' {" and ".join(record["controls"])}: evaluated at {label[record["baseline"]]} only '
         '(controls), not ranked.' if record['controls'] else ''),
      'Every row of a cell is evaluated on the same examples, so two rows are compared example '
      'by example: the exact McNemar test (two-sided binomial test on the examples only one of '
      'them gets right) says whether a rule differs from tau = 1, or from the cell\'s best, '
      'where their 95% Wilson intervals may still overlap. One test per cell and row, not '
      'corrected for their number: a few of the p < 0.05 verdicts may be chance.',
      '## Conclusions', '\n'.join(f'- {t}' for t in record['conclusions']),
      '## Ranking',
      'Rules ordered by the cells where they are significantly better than tau = 1, then worse '
      '(fewest first), then the cells where they are not significantly below the best, then '
      'mean accuracy over their cells (every task and length, L_tr included).',
      markdown.markdown_table(
          ['rule', 'cells', 'better', 'worse', 'not below the best', 'mean accuracy %'],
          [[label[r['row']], str(r['cells']), str(r['better']), str(r['worse']),
            str(r['tied_with_best']), f'{r["mean_accuracy"]:.1f}'] for r in record['ranking']]),
      *(_task_tables(record, task) for task in record['tasks'])]
  return docs_pages.reflow('\n\n'.join(lines)) + '\n'


# ---------------------------------------------------------------------------------- command


def flag_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog='python -m benchmarks.ranking',
                                   description=__doc__.splitlines()[0])
  parser.add_argument('--demo_output', help='a finished demo output folder (results.json, '
                      'schedule.json, predictions/)')
  parser.add_argument('--out', default=str(PAGE), help='the page (default: docs/ranking.md)')
  parser.add_argument('--json', default=str(RECORD),
                      help='the record (default: benchmarks/results/ranking.json)')
  parser.add_argument('--machine', default=None, help='where the demo ran, for the page '
                      '(default: $T5ALIGN_BENCH_MACHINE, else this machine\'s cores and system)')
  parser.add_argument('--alpha', type=float, default=paired.ALPHA,
                      help='two-sided level of the verdicts')
  parser.add_argument('--check', action='store_true',
                      help='write nothing; exit 1 unless --out is the page --json renders')
  return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = flag_parser()
  args = parser.parse_args(argv)
  if args.check:
    record = outputs.read_json(args.json, 'ranking record')
    current = pathlib.Path(args.out).read_text(encoding='utf-8') if os.path.exists(
        args.out) else None
    if current != page(record):
      print(f'{args.out} is not the page {args.json} renders: run python -m benchmarks.ranking '
            '--demo_output DIR again.', file=sys.stderr)
      sys.exit(1)
    return record
  if not args.demo_output:
    parser.error('--demo_output DIR is required (or --check).')
  record = {'format': FORMAT,
            'provenance': provenance(args.demo_output, argv, args.machine or machine()),
            **rank(args.demo_output, args.alpha)}
  text = page(record)
  for path in (args.json, args.out):
    fileio.makedirs(os.path.dirname(os.path.abspath(path)))
  fileio.write_json_atomic(args.json, record, sort_keys=False)
  fileio.write_atomic(args.out, text)
  print(f'wrote {args.out} and {args.json}', file=sys.stderr)
  return record


if __name__ == '__main__':
  main()
