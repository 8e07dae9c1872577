"""Markdown tables from evaluation folders, shaped like the paper's.

    python -m t5align.report RESULTS_DIR [RESULTS_DIR ...] [--published zeroscrolls]
        [--ruler-tasks] [--output report.md]

Every metrics.json under the folders (written by `t5align.eval`) is one cell: its row is
(model, label), labels in `labels.PAPER_ORDER` (tau = 1, w/ P_max, w/ H, w/ log_Lex L_tr) first;
its column is the task's (group, column); its value the task's primary metric (its family's:
accuracy, perplexity, a suite's score). Results of different runs that would share a cell
(the run.json beside each metrics.json differs in something that changes results: decode
length, dtypes, attention, examples, checkpoint content, ...) get rows of their own, labelled
with their run folder and the settings that differ (`separate_runs`). Tables: language modeling
(Table 3, perplexity), retrieval (Table 4, accuracy), multi-document QA (Table 5, accuracy per
gold position with per-group averages), code completion (Table 6, EM and ES per context-length
bucket), key-value and code key retrieval. Cells without a result are '-', a NaN metric 'NaN'.
Task folders of unfinished runs (run.json or predictions.jsonl without metrics.json) are listed
under the tables; a row whose results come from different checkpoints of one model (run.json's
content fingerprint) is a row per checkpoint, labelled '[checkpoint=<sha256 prefix>]'.

ZeroSCROLLS (the t5align_zeroscrolls_{task}_{L} folders) is one table shaped like its paper's:
the columns GvRp SSFD QMsm SQAL Qspr Nrtv QALT MuSQ SpDg BkSS and Avg (the mean of the 10, only
when all are there: the lines under the table say what a row lacks), a row per model, split
(from run.json), input length and label. `--published zeroscrolls` adds the paper's published
rows (Flan-T5 small to XXL, Flan-UL2, T0pp; test split), labelled '(published, test)', from
t5align/evaluation/zeroscrolls_published.json, which names its source; with it the folders may
be left out, to print the published rows alone. Each suite's layout: t5align/evaluation/suites/.

SCROLLS (the t5align_scrolls_{config}_{L} folders) is one table shaped like its leaderboard: the
columns Avg (the mean of the 7 tasks' scores, only when all are there), GovRep SumScr QMSum (each
ROUGE-1/ROUGE-2/ROUGE-L), Qspr Nrtv (F1), QALT CNLI (exact match), a row per model, split, input
length and label. `--published scrolls` adds the published fine-tuned rows (LongT5 base to XL,
UL2, SCROLLS' LED-base; test split) from t5align/evaluation/scrolls_published.json.

RULER (the t5align_ruler_{task}_{L} folders) is one table shaped like RULER's: a row per model and
label, a column per input length (512 .. 16384) and Avg. over the lengths; a cell is the mean of
the tasks' scores at that length, the lines under the table saying which tasks the cells average
and which of the 13 they lack. `--ruler-tasks` adds the table per task (a row per model, label and
task).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from t5align.evaluation import suites
from t5align.evaluation import tables
from t5align.runtime import fileio


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m t5align.report', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('folders', nargs='*', help='evaluation output folders')
  parser.add_argument('--published', action='append', default=[],
                      choices=sorted(suites.PUBLISHED), metavar='SUITE',
                      help="add a suite's published rows to its table (repeatable; suites: "
                           f'{", ".join(sorted(suites.PUBLISHED))})')
  parser.add_argument('--ruler-tasks', action='store_true',
                      help='add the RULER table per task (a row per model, label and task)')
  parser.add_argument('--output', help='write the Markdown here instead of stdout')
  args = parser.parse_args(argv)
  if not args.folders and not args.published:
    parser.error('name the evaluation folders (or --published SUITE for the published rows '
                 'alone)')
  missing = [f for f in args.folders if not os.path.isdir(f)]
  if missing:
    parser.error(f'not a folder: {", ".join(missing)}')
  results = tables.load_results(args.folders)
  left_out = tables.unfinished(args.folders)
  if args.folders and not results:
    parser.error(f'no metrics.json under {", ".join(args.folders)}'
                 + (f' ({len(left_out)} unfinished task folders: {", ".join(left_out)})'
                    if left_out else ''))
  text = tables.render(results, published=args.published, ruler_tasks=args.ruler_tasks,
                       left_out=left_out)
  if args.output:
    fileio.write_atomic(args.output, text)
  else:
    sys.stdout.write(text)
  return 0


if __name__ == '__main__':
  sys.exit(main())
