r"""The main job: the shipped retrieval T5, calibrated and evaluated past its training length.

    python -m t5align.demo [--output_dir=demo_output] [--full] [--controls]
                           [--lengths 512 1024 2048 4096] [--num_examples=N] [--num_samples=N]
                           [--num_references=N] [--calibration_seeds=N] [--strategies S ...]
                           [--model_dir=PATH]

Default (`make demo`): calibrate the encoder temperature per task, as the paper does (each task's
prompts at L_ex against the same task's at L_tr), for line and key-value retrieval at each
length L_ex (2x..16x L_tr) with every evaluated strategy (P_max, entropy, log-length, P_max per
layer); the pooled P_max / entropy / log-length temperatures come from the same sweeps. Then
measure the attention's dispersion and evaluate lines and key-value retrieval at L_tr and each
L_ex with tau = 1 and each strategy, 50 held-out examples per cell.
--controls: passkey (plain and with decoys) evaluated too, at tau = 1 only, as controls (this
model does not lose it).
--full: every task calibrated and evaluated with every row, P_max per head (a row beside P_max
per layer), the literature's training-free temperatures (InfoScale with either head dimension,
a Llama-4-style length term, YaRN's mscale) beside log_Lex L_tr, Propositions 1-2 and the pooled
per-layer and per-head calibrations too, and the temperatures of 5 calibration seeds (their
spread reported).
Writes a report folder (report.md, results.json, schedule.json, PNGs, and per evaluated cell
predictions/<row>_<length>_<task>.jsonl with each example's answer and score). Results are
saved cell by cell (atomically); rerunning the same command resumes where it stopped, and a
schedule.json is reused only if it was calibrated for the settings asked.
"""
from __future__ import annotations

import argparse
from typing import Sequence

from t5align import gin_cli
from t5align.demo import job
from t5align.demo import planning
from t5align.runtime import multihost


def flag_parser() -> argparse.ArgumentParser:
  """The command's flags (tests/doc_blocks.py parses documented command lines with it)."""
  parser = argparse.ArgumentParser(prog='python -m t5align.demo', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  defaults = planning.DemoSettings()
  parser.add_argument('--output_dir', default=defaults.output_dir)
  parser.add_argument('--model_dir', default=defaults.model_dir)
  parser.add_argument('--full', action='store_true',
                      help='every task with every strategy (P_max per head and the '
                      "literature's training-free temperatures too), Props. 1-2, "
                      'the pooled per-layer and per-head calibrations and 5 calibration seeds '
                      '(see docs/demo.md for its time)')
  parser.add_argument('--controls', action='store_true',
                      help='also evaluate passkey and passkey_decoys at tau = 1 only, as '
                      'controls (see docs/demo.md for its time)')
  parser.add_argument('--lengths', type=int, nargs='+', default=[],
                      help='L_ex (default: 2x, 4x, 8x, 16x L_tr)')
  parser.add_argument('--strategies', nargs='+', default=[],
                      help='calibrated strategies (default: the mode\'s; any of '
                      f'{planning.STRATEGIES})')
  parser.add_argument('--num_examples', type=int, default=defaults.num_examples,
                      help='evaluation examples per cell')
  parser.add_argument('--num_samples', type=int, default=defaults.num_samples,
                      help='calibration prompts per task at the longest length (x L_max / L at '
                      'a shorter L)')
  parser.add_argument('--num_references', type=int, default=defaults.num_references,
                      help='calibration prompts per task at L_tr')
  parser.add_argument('--calibration_seeds', type=int, default=0,
                      help='sampling seeds calibrated, their spread reported (default: 1; '
                      '--full: 5)')
  parser.add_argument('--attention_impl', default=defaults.attention_impl)
  return parser


def main(argv: Sequence[str] | None = None) -> None:
  gin_cli.log_plainly()
  multihost.initialize()  # First: before anything starts a JAX backend.
  parser = flag_parser()
  args = parser.parse_args(argv)
  settings = planning.DemoSettings(
      output_dir=args.output_dir, model_dir=args.model_dir, full=args.full,
      controls=args.controls,
      lengths=tuple(args.lengths), strategies=tuple(args.strategies),
      num_examples=args.num_examples, num_samples=args.num_samples,
      num_references=args.num_references, calibration_seeds=args.calibration_seeds,
      batch_size=args.num_examples, attention_impl=args.attention_impl)
  try:
    settings.check()
  except ValueError as e:
    parser.error(str(e))
  job.run(settings)
