"""How much the demo's per-task temperatures move with the calibration sample; prints JSON.

Run from the repository root:
  python -m benchmarks.calibration_stability [--num_samples 1 2 4] [--seeds 5]
      [--strategies pmax entropy] [--lengths 512 ...] [--num_references 64]
      [--output benchmarks/results/calibration_stability.json]

For each count n of calibration prompts per task at the longest length (the demo's
`--num_samples`: n x L_max / L prompts at a shorter L), calibrates the demo's tuned tasks at each
of its lengths (or `--lengths`) on the prompts of `--seeds` sampling seeds (the demo's seeds 7,
8, ...), against the same `--num_references` prompts at L_tr per seed as the demo, with the demo
library's own functions (`t5align.demo`'s planning, inputs and temperatures modules). Per (n,
task, strategy, length) it records every seed's tau, their range, and whether the grid
strategies (Algorithm 1's grid) chose the same grid point for every seed ('stable'); per n, the
seconds the calibrations took and whether every grid cell was stable.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Sequence

from t5align import calibration
from t5align.demo import inputs
from t5align.demo import planning
from t5align.demo import temperatures
from t5align.runtime import fileio
from t5align.shipped import assets


def measure(num_samples: int, seeds: int, strategies: tuple[str, ...], params, config, vocab,
            reference_length: int, memo: calibration.Memo, lengths: Sequence[int] = (),
            num_references: int = planning.DemoSettings.num_references) -> dict:
  """One prompt count: every seed's calibration and their spread (no lengths: the demo's)."""
  settings = planning.DemoSettings(num_samples=num_samples, strategies=strategies,
                                   calibration_seeds=seeds, lengths=tuple(lengths),
                                   num_references=num_references)
  plan = planning.make_plan(settings, reference_length)
  start = time.time()
  per_seed = []
  for seed in plan.seeds:
    prompts = {t: {L: inputs.task_prompts(vocab, t, L, plan.samples[L], seed)
                   for L in plan.lengths} for t in plan.tuned_tasks}
    references = {t: inputs.task_prompts(vocab, t, reference_length, plan.num_references, seed)
                  for t in plan.tuned_tasks}
    per_seed.append(temperatures.calibrate_per_task(
        params, config, prompts, references, plan,
        settings=temperatures.calibration_settings(), memo=memo,
        progress=lambda c, task: None))
  spread = temperatures.calibration_spread(per_seed)
  grid = {s for s in strategies if calibration.parse_strategy(s)[1] == 'grid'}
  for by_strategy in spread.values():
    for s, by_length in by_strategy.items():
      for item in by_length.values():
        if s in grid:
          item['stable'] = item['spread'] == 0.0
  stable = all(item['stable'] for by_strategy in spread.values()
               for s, by_length in by_strategy.items() if s in grid
               for item in by_length.values())
  return {'num_samples': num_samples, 'prompts_per_length': {str(L): n for L, n in
                                                            plan.samples.items()},
          'num_references': plan.num_references, 'seeds': list(plan.seeds),
          'seconds': round(time.time() - start, 1),
          'grid_stable': stable, 'tasks': spread}


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--num_samples', type=int, nargs='+', default=[1, 2, 4])
  parser.add_argument('--seeds', type=int, default=5)
  parser.add_argument('--strategies', nargs='+', default=['pmax', 'entropy'])
  parser.add_argument('--lengths', type=int, nargs='+', default=[],
                      help="L_ex (default: the demo's, 2x, 4x, 8x, 16x L_tr)")
  parser.add_argument('--num_references', type=int,
                      default=planning.DemoSettings.num_references,
                      help="prompts per task at L_tr (default: the demo's)")
  parser.add_argument('--output', default=None)
  args = parser.parse_args(argv)
  params, config, vocab = assets.load_shipped()
  config = dataclasses.replace(config, attention_impl=planning.DemoSettings().attention_impl,
                               dropout_rate=0.0)
  reference_length = assets.training_length()
  memo = calibration.Memo()
  out = {'model': assets.ASSET_DIR.split(os.sep)[-1], 'strategies': args.strategies,
         'rows': []}
  for n in args.num_samples:
    row = measure(n, args.seeds, tuple(args.strategies), params, config, vocab,
                  reference_length, memo, lengths=args.lengths,
                  num_references=args.num_references)
    with open('/proc/loadavg', encoding='utf-8') as f:
      row['loadavg_at_end'] = f.read().split()[:3]  # The machine may be shared.
    out['rows'].append(row)
    print(f'num_samples {n}: grid stable {row["grid_stable"]}, {row["seconds"]} s',
          file=sys.stderr, flush=True)
    if args.output:  # After each count: an interrupted run keeps what it measured.
      fileio.write_atomic(args.output, json.dumps(out, indent=1) + '\n')
  print(json.dumps(out, indent=1))


if __name__ == '__main__':
  main()
