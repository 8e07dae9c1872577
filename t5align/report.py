"""Markdown tables from evaluation folders, shaped like the paper's tables.

    python -m t5align.report RESULTS_DIR [RESULTS_DIR ...] [--output report.md]

Every metrics.json under the folders (written by `t5align.eval`) is one cell: its row is
(model, label), labels in `labels.PAPER_ORDER` (tau = 1, w/ P_max, w/ H, w/ log_Lex L_tr) first;
its column is the task's (group, column). Results of different runs that would share a cell
(the run.json beside each metrics.json differs in something that changes results: decode
length, dtypes, attention, examples, checkpoint content, ...) get rows of their own, labelled
with their run folder and the settings that differ (`separate_runs`). Tables: language modeling
(Table 3, perplexity), retrieval (Table 4, accuracy), multi-document QA (Table 5, accuracy per
gold position with per-group averages), code completion (Table 6, EM and ES per context-length
bucket), key-value and code key retrieval. Cells without a result are '-'.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from t5align.evaluation import tables


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m t5align.report', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('folders', nargs='+', help='evaluation output folders')
  parser.add_argument('--output', help='write the Markdown here instead of stdout')
  args = parser.parse_args(argv)
  missing = [f for f in args.folders if not os.path.isdir(f)]
  if missing:
    parser.error(f'not a folder: {", ".join(missing)}')
  results = tables.load_results(args.folders)
  if not results:
    parser.error(f'no metrics.json under {", ".join(args.folders)}')
  text = tables.render(results)
  if args.output:
    with open(args.output, 'w', encoding='utf-8') as f:
      f.write(text)
  else:
    sys.stdout.write(text)
  return 0


if __name__ == '__main__':
  sys.exit(main())
