"""The pre-flight table (docs/performance/tpu.md): `python -m t5align.preflight` for Flan-T5-XL
and XXL, eval and calibration, at 8k / 16k / 32k tokens on v4-32, v5e-16, v5p-8 and v6e-16, with
'blockwise' and the fused kernel ('pallas'); results as JSON, or the Markdown table.

Run from the repository root (libtpu installed; no TPU needed):
  python -m benchmarks.preflight_table                      # every row not yet in the results
  python -m benchmarks.preflight_table --impls blockwise --models xxl --lengths 32768
  python -m benchmarks.preflight_table --rows issue         # XXL encoder, 32k, v5e:4x4
  python -m benchmarks.preflight_table --markdown           # the table, from the results

Each row is one `python -m t5align.preflight` command (printed in the row as `command`), run in
its own process: one XLA compile for the slice, an XXL one taking minutes on a 2-core machine.
Its JSON report is added to the results file (`--output`, written atomically) as soon as it is
done, so a rerun resumes: rows already there are skipped (`--redo` runs them again).

Run settings per slice, as the Pods commands (docs/pods.md) set them: parameters and activations
in bfloat16, 'model' axis min(8, chips); eval: 'data' axis the rest, one example per 'data' shard
(BATCH_SIZE = data), greedy decoding of 64 tokens; calibration: MESH_SHAPE (chips / model, 1,
model), one sample (gin/calibrate.gin's BATCH_SIZE), the 11-candidate grid over the 'tau' axis.
Row set 'issue': Flan-T5-XXL's encoder at 32,768 tokens on v5e:4x4, data 2 x model 8, batch 2
(the calibration sweep with one tau: encoder plus its row statistics).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Callable

from t5align.jobs import preflight
from t5align.runtime import fileio
from t5align.runtime import tpu_chips

MODELS = {'xl': 'gin/models/flan_t5/xl.gin', 'xxl': 'gin/models/flan_t5/xxl.gin'}
LENGTHS = (8192, 16384, 32768)
TARGETS = ('v4-32', 'v5litepod-16', 'v5p-8', 'v6e-16')
PROGRAMS = ('eval', 'calibration')
IMPLS = ('blockwise', 'pallas')
DEFAULT_OUTPUT = 'benchmarks/results/preflight_table.json'
ROW_TIMEOUT_S = 3600
# Rows without a `code` entry were measured before it was recorded.
STALE = ("measured with older code (the pre-flight branch, before 'blockwise' took its five tile "
         'kinds and loops inside conditionals were counted by trip count): that program, not '
         "today's.")


def row_flags(model: str, length: int, target: str, program: str, impl: str,
              encoder_only: bool = False) -> list[str]:
  """The `python -m t5align.preflight` flags of one row (module docstring)."""
  chips = tpu_chips.parse_target(target).num_chips
  shard = min(8, chips)
  common = [f'--gin_file={MODELS[model]}', '--gin.PARAMS_DTYPE=bfloat16',
            '--gin.ACTIVATION_DTYPE=bfloat16', f'--gin.ATTENTION_IMPL={impl}',
            f'--topology={target}', f'--length={length}']
  if encoder_only:
    return (['--gin_file=gin/calibrate.gin'] + common
            + [f'--gin.MESH_SHAPE=(1, {chips // shard}, {shard})',
               f'--gin.BATCH_SIZE={chips // shard}', '--gin.TAU_BATCH_SIZE=1'])
  if program == 'eval':
    return (['--gin_file=gin/runs/eval.gin'] + common
            + [f'--gin.NUM_PARTITIONS={shard}', f'--gin.BATCH_SIZE={chips // shard}'])
  return (['--gin_file=gin/calibrate.gin'] + common
          + [f'--gin.MESH_SHAPE=({chips // shard}, 1, {shard})'])


def rows(args: argparse.Namespace) -> dict[str, list[str]]:
  """{row id: flags} of the selected rows, in table order."""
  if args.rows == 'issue':
    return {f'xxl-32768-v5e:4x4-encoder-{impl}': row_flags('xxl', 32768, 'v5e:4x4', 'encoder',
                                                           impl, encoder_only=True)
            for impl in args.impls}
  return {f'{m}-{n}-{t}-{p}-{i}': row_flags(m, n, t, p, i)
          for m in args.models for n in args.lengths for t in args.targets
          for p in args.programs for i in args.impls}


def code_version() -> str:
  """The commit the rows are measured with, '+' when t5align/ differs from it; '' outside git."""
  git = lambda *a: subprocess.run(['git', *a], capture_output=True, text=True, check=False)
  head = git('rev-parse', '--short', 'HEAD')
  if head.returncode:
    return ''
  dirty = git('status', '--porcelain', '--', 't5align').stdout.strip()
  return head.stdout.strip() + ('+' if dirty else '')


def run_row(flags: list[str], json_path: str) -> dict:
  """One preflight command in its own process; its JSON report plus how the run went."""
  command = [sys.executable, '-m', 't5align.preflight', *flags, f'--json_output={json_path}']
  if os.path.exists(json_path):
    os.remove(json_path)
  start = time.time()
  load = os.getloadavg()[0]
  try:
    done = subprocess.run(command, capture_output=True, text=True, timeout=ROW_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    return {'error': f'timed out after {ROW_TIMEOUT_S} s'}
  row = {'exit_status': done.returncode, 'wall_s': round(time.time() - start, 1),
         'loadavg_1min_at_start': load, 'code': code_version()}
  if done.returncode not in (0, preflight.DOES_NOT_FIT) or not os.path.exists(json_path):
    return {**row, 'error': done.stderr[-3000:]}
  with open(json_path, encoding='utf-8') as f:
    return {**row, 'report': json.load(f)}


def estimate_ratio(row: dict) -> float:
  """`memory.estimate` over XLA's total for a row: the row's command's settings read back from
  gin (the same path as the CLI; no compile), estimated with today's `t5align.memory`."""
  import gin  # pylint: disable=g-import-not-at-top
  from t5align import gin_cli  # pylint: disable=g-import-not-at-top
  flags = [f for f in row['command'][3:] if not f.startswith(('--topology', '--length'))]
  report = row['report']
  gin.clear_config()
  try:
    gin_cli.configure(flags, prog='preflight_table', unset_required=True)
    case = preflight.case_from_gin(tpu_chips.parse_target(report['target']['topology']),
                                   report['settings']['length'])
  finally:
    gin.clear_config()
  program, _ = preflight.programs(case)[0]
  estimate = preflight.memory_estimate(program)
  return estimate.total / report['memory_per_chip']['total']


def recorded_estimate_ratio(row: dict) -> float:
  """`memory.estimate` over XLA's total as the row's report recorded it when it was measured
  (`memory_estimate.ratio_to_xla`; no gin, no `t5align.memory`)."""
  return row['report']['memory_estimate']['ratio_to_xla']


def _cell(row: dict | None, with_estimate: bool,
          estimate: Callable[[dict], float] = estimate_ratio) -> list[str]:
  if row is None:
    return ['not run'] + [''] * (3 + with_estimate)
  if 'report' not in row:
    return ['error'] + [''] * (3 + with_estimate)
  r = row['report']
  total = r['memory_per_chip']['total']
  usable = tpu_chips.CHIPS[r['target']['chip']['generation']].usable_hbm_bytes
  fits = total <= usable and not r.get('compile_error')
  marks = ('' if fits else ' (no)') + ('' if row.get('code') else ' °')
  cells = [f'{total / 2**30:.2f}{marks}']
  per = r['per_unit']
  cells += (['', '', ''] if per is None else
            [f'{per["flops"] / 1e12:.4g}', f'{per["bytes_accessed"] / 1e9:.4g}',
             f'{per["roofline_seconds"]:.3g}'])
  if with_estimate:
    cells.append(f'{estimate(row):.2f}')
  return cells


def markdown(results: dict, with_estimate: bool = True,
             estimate: Callable[[dict], float] = estimate_ratio) -> str:
  """The pre-flight table: one line per model, length, slice and program; blockwise | fused.

  Per implementation: XLA's GiB per chip ('(no)': does not fit), TFLOPs, GB accessed and
  roofline seconds per example (calibration: per encoder pass, one sample at one tau), and
  `memory.estimate` / XLA's total, by `estimate(row)`: recomputed with today's `t5align.memory`
  (`estimate_ratio`, minutes for the whole table) or as recorded (`recorded_estimate_ratio`).
  """
  cols = ['GiB/chip', 'TFLOPs/ex', 'GB/ex', 's/ex'] + (['est./XLA'] if with_estimate else [])
  head = ('| model | tokens | slice | program | '
          + ' | '.join(f'{impl} {c}' for impl in ('blockwise', 'fused') for c in cols) + ' |')
  lines = [head, '|' + '---|' * (4 + 2 * len(cols))]
  for m in MODELS:
    for n in LENGTHS:
      for t in TARGETS:
        for p in PROGRAMS:
          rows_ = [results.get(f'{m}-{n}-{t}-{p}-{i}') for i in IMPLS]
          if all(r is None for r in rows_):
            continue
          cells = [c for r in rows_ for c in _cell(r, with_estimate, estimate)]
          lines.append(f'| {m.upper()} | {n // 1024}k | {t} | {p} | ' + ' | '.join(cells) + ' |')
  for key, row in results.items():  # Rows outside the table ('issue').
    if 'encoder' in key:
      cells = _cell(row, with_estimate, estimate)
      lines.append('\n' + textwrap.fill(
          f'`{key}`: ' + ', '.join(f'{c} {v}' for c, v in zip(cols, cells)), 100))
  if any('report' in row and not row.get('code') for row in results.values()):
    lines.append('\n' + textwrap.fill(f'°: {STALE}', 100))
  return '\n'.join(lines)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--models', nargs='*', default=list(MODELS), choices=list(MODELS))
  parser.add_argument('--lengths', nargs='*', type=int, default=list(LENGTHS))
  parser.add_argument('--targets', nargs='*', default=list(TARGETS))
  parser.add_argument('--programs', nargs='*', default=list(PROGRAMS), choices=PROGRAMS)
  parser.add_argument('--impls', nargs='*', default=list(IMPLS), choices=IMPLS)
  parser.add_argument('--rows', choices=('table', 'issue'), default='table')
  parser.add_argument('--output', default=DEFAULT_OUTPUT)
  parser.add_argument('--redo', action='store_true', help='run rows already in the results')
  parser.add_argument('--markdown', action='store_true',
                      help='print the table from the results and exit')
  parser.add_argument('--no-estimate', action='store_true',
                      help='--markdown without the memory.estimate / XLA column')
  args = parser.parse_args(argv)
  preflight.compile_only_environment()  # This process compiles nothing; keep libtpu quiet.
  results = {}
  if os.path.exists(args.output):
    with open(args.output, encoding='utf-8') as f:
      results = json.load(f)['rows']
  if args.markdown:
    print(markdown(results, with_estimate=not args.no_estimate))
    return
  scratch = os.path.join(tempfile.mkdtemp(prefix='preflight_table_'), 'row.json')
  for row_id, flags in rows(args).items():
    if row_id in results and 'report' in results[row_id] and not args.redo:
      continue
    print(f'{row_id}: python -m t5align.preflight {" ".join(flags)}', file=sys.stderr,
          flush=True)
    row = {'command': ['python', '-m', 't5align.preflight', *flags], **run_row(flags, scratch)}
    results[row_id] = row
    fileio.write_json_atomic(args.output, {'rows': results})
    print(json.dumps({row_id: {k: v for k, v in row.items() if k != 'report'}}), flush=True)
  shutil.rmtree(os.path.dirname(scratch))


if __name__ == '__main__':
  main()
