r"""The main job: the shipped retrieval T5, calibrated and evaluated past its training length.

    python -m t5align.demo [--output_dir=demo_output] [--lengths 512 1024 2048 4096]
                           [--num_examples=N] [--num_samples=N] [--model_dir=PATH]

Steps: calibrate the encoder temperature at each length L_ex (2x..16x L_tr) with every strategy,
per task (each task's prompts at L_ex against the same task's at L_tr, as the paper does) and
pooled over the tasks (for comparison); evaluate passkey (plain and with decoys), line and
key-value retrieval at L_tr and each L_ex with tau = 1 and each strategy's per-task temperature;
write a report folder (report.md, results.json, schedule.json, PNGs, and per evaluated cell
predictions/<row>_<length>_<task>.jsonl with each example's answer and score).
Results are saved cell by cell (atomically); rerunning the same command resumes where it stopped.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from t5align import calibration
from t5align import assets
from t5align import batching
from t5align import fileio
from t5align import heldout
from t5align import labels
from t5align import multihost
from t5align import network
from t5align import outputs
from t5align import partitioning
from t5align import report
from t5align import schedule as schedule_lib
from t5align import train_data

STRATEGIES = ('pmax', 'entropy', 'log_length', 'prop1', 'prop2', 'pmax_per_layer')
# Evaluated rows (the list); prop1/prop2 are calibrated and tabulated, not evaluated.
EVALUATED = ('pmax', 'entropy', 'log_length', 'pmax_per_layer')
# Report rows: 'tau=1' and the strategies, named as every other table names them.
ROW_LABELS = {'tau=1': labels.TAU_ONE, **labels.STRATEGY_LABELS}
CALIBRATION_SEED = 7  # Calibration samples and evaluation examples never share a seed.
EVAL_SEED = 2000


def _log(message: str, start: float) -> None:
  if multihost.is_writer():
    print(f'[{time.time() - start:7.1f}s] {message}', file=sys.stderr, flush=True)


class Eta:
  """Remaining-time estimate from the elapsed time and the work done (weights per step)."""

  def __init__(self, weights: Sequence[float] | None = None, clock=time.time):
    self.weights = None if weights is None else np.cumsum(weights, dtype=np.float64)
    self.clock = clock
    self.start = clock()

  def update(self, done: int, total: int | None = None) -> str:
    """', ETA 1m05s' after `done` steps (of `total`, or of the weights given)."""
    if self.weights is not None:
      fraction = self.weights[done - 1] / self.weights[-1] if len(self.weights) else 1.0
    else:
      fraction = done / total
    elapsed = self.clock() - self.start
    left = elapsed * (1 - fraction) / max(fraction, 1e-9)
    return f', ETA {int(left // 60)}m{int(left % 60):02d}s'


def calibration_tokens(vocab, length: int, per_task: int, seed: int = CALIBRATION_SEED
                       ) -> np.ndarray:
  """`[tasks * per_task, length]` int32 held-out prompts of every task filled to `length`.

  A prompt fills to at most `length` tokens (whole sentences/records); the rest is padding.
  """
  rows = [ex.input_ids for task in train_data.TASKS
          for ex in train_data.eval_examples(task, vocab, length, per_task, seed)]
  return batching.pad_tokens(rows, multiple=length, min_length=length)


def task_calibration_inputs(vocab, task: str, lengths: Sequence[int], reference_length: int,
                            per_task: int, seed: int = CALIBRATION_SEED) -> list[tuple]:
  """Per length L_ex: (`[per_task, L_ex]` the task's held-out prompts filled to L_ex,
  `[per_task, L_tr]` the same task's prompts at L_tr), for `schedule.calibrate_tasks`: the
  paper's per-task calibration, its L_tr reference being the task at its training length."""
  def prompts(length):
    rows = [ex.input_ids for ex in train_data.eval_examples(task, vocab, length, per_task, seed)]
    return batching.pad_tokens(rows, multiple=length, min_length=length)
  reference = prompts(reference_length)
  return [(prompts(L), reference) for L in lengths]


def row_temperature(schedule: schedule_lib.TemperatureSchedule, row: str, length: int):
  """The encoder temperature of a report row at `length`: 1, or the strategy's calibrated tau."""
  if row == 'tau=1':
    return 1.0
  tau = schedule.tau_for_length(length, row)
  # A per-layer strategy gives one tau per layer: pass it as [1, layers] (never ambiguous).
  return np.asarray(tau, np.float32).reshape(1, -1) if np.ndim(tau) else float(tau)


class Results:
  """results.json: settings plus one accuracy cell per (row, task, length), saved as it grows."""

  def __init__(self, path: str, settings: Mapping[str, Any]):
    self.path = path
    settings = json.loads(json.dumps(settings))
    self.data = multihost.read_on_writer(lambda: self._read(settings), f'reading {path}')

  def _read(self, settings: Mapping[str, Any]) -> dict[str, Any]:
    if not fileio.exists(self.path):
      return {'settings': settings, 'accuracy': {}}
    old = outputs.read_json(self.path, 'demo results')
    if not isinstance(old, dict) or not isinstance(old.get('accuracy'), dict):
      raise ValueError(f'demo results {self.path} lack an "accuracy" object; delete the file to '
                       'start over.')
    if old.get('settings') != settings:
      raise ValueError(f'{self.path} holds a run with other settings ({old.get("settings")}); '
                       'use another --output_dir or delete it.')
    return old

  def _save(self) -> None:
    multihost.on_writer(lambda: fileio.write_json_atomic(self.path, self.data, sort_keys=False),
                        f'writing {self.path}')

  def get(self, row: str, task: str, length: int) -> float | None:
    return self.data['accuracy'].get(row, {}).get(task, {}).get(str(length))

  def put(self, row: str, task: str, length: int, value: float) -> None:
    self.data['accuracy'].setdefault(row, {}).setdefault(task, {})[str(length)] = value
    self._save()

  def put_section(self, key: str, value: Any) -> None:
    self.data[key] = value
    self._save()


def accuracy_table(results: Mapping[str, Any], rows: Sequence[str], task: str,
                   lengths: Sequence[int]) -> str:
  """Markdown: one row per strategy, one column per length, accuracy in percent with its
  95% Wilson interval over the run's `num_examples` examples ('90 [79-96]')."""
  trials = results['settings']['num_examples']
  table = []
  for row in rows:
    cells = [results['accuracy'].get(row, {}).get(task, {}).get(str(L)) for L in lengths]
    table.append([ROW_LABELS[row],
                  *('' if c is None else report.accuracy_cell(c, trials) for c in cells)])
  return report.markdown_table(['', *map(str, lengths)], table)


def headline_table(results: Mapping[str, Any], rows: Sequence[str],
                   lengths: Sequence[int]) -> str:
  """Markdown: strategy x length, each cell the tasks' accuracies (%), in `TASKS` order."""
  table = [[ROW_LABELS[row], *('/'.join(f'{results["accuracy"][row][t][str(L)]:.0f}'
                                        for t in train_data.TASKS) for L in lengths)]
           for row in rows]
  return report.markdown_table(
      [f'accuracy % ({" / ".join(train_data.TASKS)})', *map(str, lengths)], table)


def observations(results: Mapping[str, Any], rows: Sequence[str], lengths: Sequence[int],
                 reference_length: int) -> list[str]:
  """Plain statements read off the numbers, whatever they show (no tuning, no selection)."""
  acc = results['accuracy']
  out = []
  for task in train_data.TASKS:
    base = [acc['tau=1'][task][str(L)] for L in lengths]
    drop = base[0] - min(base[1:]) if len(base) > 1 else 0.0
    out.append(f'{task}: tau = 1 scores {base[0]:.0f}% at L_tr = {reference_length} and '
               f'{", ".join(f"{b:.0f}% at {L}" for b, L in zip(base[1:], lengths[1:]))} '
               f'(largest drop {drop:.0f} points).')
    for L in lengths[1:]:
      cell = {r: acc[r][task][str(L)] for r in rows}
      base = cell['tau=1']
      listed = lambda keep: ', '.join(f'{ROW_LABELS[r]} {cell[r]:.0f}%' for r in rows if keep(r))
      parts = [f'{word} than tau = 1 ({base:.0f}%): {listed(keep)}'
               for word, keep in (('better', lambda r: cell[r] > base),
                                  ('worse', lambda r: cell[r] < base))
               if any(keep(r) for r in rows)]
      out.append(f'  at {L}: ' + ('; '.join(parts) or f'every row scores {base:.0f}%') + '.')
  return out


def plot_accuracy(results: Mapping[str, Any], rows: Sequence[str], lengths: Sequence[int],
                  path: str) -> None:
  """Accuracy vs length, one panel per task, one line per strategy."""
  from t5align import analysis  # pylint: disable=g-import-not-at-top
  plt = analysis.pyplot()
  fig, axes = plt.subplots(1, len(train_data.TASKS), figsize=(5 * len(train_data.TASKS), 4))
  for ax, task in zip(np.atleast_1d(axes), train_data.TASKS):
    for row in rows:
      ys = [results['accuracy'][row][task][str(L)] for L in lengths]
      ax.plot(lengths, ys, marker='o', label=ROW_LABELS[row])
    ax.set_xscale('log', base=2)
    ax.set_xticks(lengths, [str(L) for L in lengths])
    ax.set_title(task)
    ax.set_xlabel('input length (tokens)')
    ax.set_ylabel('accuracy (%)')
    ax.set_ylim(-5, 105)
  np.atleast_1d(axes)[0].legend(fontsize=8)
  fig.tight_layout()
  fileio.save_figure(fig, path, dpi=110)
  plt.close(fig)


@outputs.claims('output_dir', '--output_dir')
def run(*, output_dir: str = 'demo_output', model_dir: str = assets.ASSET_DIR,
        lengths: Sequence[int] | None = None, strategies: Sequence[str] = STRATEGIES,
        num_examples: int = 50, num_samples: int = 1, batch_size: int = 50,
        attention_impl: str = 'blockwise') -> dict[str, Any]:
  """Runs (or resumes) the whole demo; returns the results dict also written to results.json.

  Args:
    output_dir: report folder.
    model_dir: a folder with one T5X checkpoint_N/, its sentencepiece.model and training.json.
    lengths: extrapolation lengths; default 2x, 4x, 8x and 16x the training length.
    strategies: calibration strategies (`calibration.STRATEGIES` names); those in EVALUATED are
      also evaluated.
    num_examples: evaluation examples per task and length.
    num_samples: calibration samples per task (each filled to the longest length).
    batch_size: examples per decoding call.
    attention_impl: encoder attention implementation ('blockwise' keeps long inputs lean).
  """
  from t5align import analysis  # pylint: disable=g-import-not-at-top
  start = time.time()
  params, config, vocab = assets.load_shipped(model_dir)
  config = dataclasses.replace(config, attention_impl=attention_impl, dropout_rate=0.0)
  reference_length = assets.training_length(model_dir)
  lengths = sorted(lengths or [reference_length * k for k in (2, 4, 8, 16)])
  eval_lengths = [reference_length, *lengths]
  rows = ['tau=1', *(s for s in strategies if s in EVALUATED)]
  multihost.on_writer(lambda: fileio.makedirs(output_dir), f'creating {output_dir}')
  # Several devices (or processes): calibration examples split over 'data'. Evaluation runs
  # on every process's first device with host parameters (the model is small).
  mesh = (partitioning.calibration_mesh(1, jax.device_count(), 1) if jax.device_count() > 1
          else None)
  results = Results(os.path.join(output_dir, 'results.json'), {
      'model_dir': os.path.abspath(model_dir), 'reference_length': reference_length,
      'lengths': lengths, 'strategies': list(strategies), 'num_examples': num_examples,
      'num_samples': num_samples, 'calibration_seed': CALIBRATION_SEED, 'eval_seed': EVAL_SEED,
      'attention_impl': attention_impl, 'calibration': 'per task'})
  _log(f'model {config.num_encoder_layers}+{config.num_decoder_layers} layers, '
       f'L_tr = {reference_length}, lengths {lengths}', start)

  schedule_path = os.path.join(output_dir, 'schedule.json')
  tokens = calibration_tokens(vocab, lengths[-1], num_samples)
  memo = calibration.Memo()  # The analysis reuses the calibration's sweeps.
  saved = multihost.read_on_writer(
      lambda: schedule_lib.load_schedule(schedule_path).to_dict()
      if fileio.exists(schedule_path) else None, f'reading {schedule_path}')
  if saved is not None:
    schedule = schedule_lib.TemperatureSchedule.from_dict(saved)
    _log(f'reusing {schedule_path}', start)
  else:
    calibration_eta = Eta()
    schedule = schedule_lib.build_schedule(
        params, config, tokens, lengths, strategies, reference_length=reference_length,
        provenance={'model_dir': os.path.abspath(model_dir), 'seed': CALIBRATION_SEED,
                    'source': f'held-out prompts of {", ".join(train_data.TASKS)}'},
        progress=lambda d, t, c: _log(f'calibrated {d}/{t}: {c.strategy} @ {c.length} -> '
                                      f'tau {np.round(c.tau, 3).tolist()}'
                                      f'{calibration_eta.update(d, t)}', start),
        mesh=mesh, memo=memo)
  if not schedule.tasks:  # Per task, as the paper calibrates; the pooled schedule is kept.
    task_eta = Eta()
    tasks = schedule_lib.calibrate_tasks(
        params, config, {t: task_calibration_inputs(vocab, t, lengths, reference_length,
                                                    num_samples) for t in train_data.TASKS},
        strategies, reference_length=reference_length, mesh=mesh,
        progress=lambda d, t, c: _log(f'calibrated per task {d}/{t}: {c.strategy} @ {c.length} '
                                      f'-> tau {np.round(c.tau, 3).tolist()}'
                                      f'{task_eta.update(d, t)}', start))
    schedule = dataclasses.replace(schedule, tasks=tasks)
    multihost.on_writer(lambda: schedule.save(schedule_path), f'writing {schedule_path}')
  temperatures = '\n\n'.join([schedule.table()] + [
      schedule.task_table(s) for s in strategies
      if calibration.parse_strategy(s)[1] != 'closed_form' and s != 'log_length'])
  if multihost.is_writer():
    print(temperatures)

  model = network.Transformer(config)
  # Cells to evaluate: (length, row, tau, tasks). A row whose temperature for a task at L equals
  # an earlier row's (at L_tr every strategy's is 1 by construction) copies that cell instead.
  cells, copies = [], []
  for L in eval_lengths:
    seen = []  # (row, tau, task) evaluated at L
    for row in rows:
      for task in train_data.TASKS:
        if results.get(row, task, L) is not None:
          continue
        # Each task at the temperature calibrated on it (per task, as the paper does).
        tau = (1.0 if L == reference_length
               else row_temperature(schedule.for_task(task), row, L))
        same = next((r for r, t, k in seen if k == task and np.shape(t) == np.shape(tau)
                     and np.array_equal(t, tau)), None)
        if same is None:
          seen.append((row, tau, task))
          cells.append((L, row, tau, [task]))
        else:
          copies.append((L, row, same, [task]))
  # Work per cell ~ L^2 (attention dominates at these lengths): the ETA's weights.
  eval_eta = Eta([L * L for L, *_ in cells])
  layers = config.num_encoder_layers
  for i, (L, row, tau, todo) in enumerate(cells):
    # Every row's temperature as float32 [1, layers] (a scalar tau repeated, which the encoder
    # applies identically): one compiled decoder per length and decode length serves them all.
    tau = np.broadcast_to(np.asarray(tau, np.float32).reshape(1, -1), (1, layers))
    records = heldout.retrieval_predictions(
        model, params, vocab, tasks=todo, length=L, num_examples=num_examples, seed=EVAL_SEED,
        batch_size=min(batch_size, num_examples), temperature=tau)
    write_predictions(output_dir, row, L, records)
    acc = heldout.accuracy(records)
    for task, value in acc.items():
      results.put(row, task, L, value)
    _log(f'{ROW_LABELS[row]:>20} @ {L:>5}: ' +
         ', '.join(f'{k} {v:.0f}%' for k, v in acc.items()) +
         f' (cell {i + 1}/{len(cells)}{eval_eta.update(i + 1)})', start)
  for L, row, same, todo in copies:
    for task in todo:
      results.put(row, task, L, results.get(same, task, L))

  numbers = analysis.collect(params, config, tokens, lengths, reference_length=reference_length,
                             mesh=mesh, memo=memo)
  multihost.on_writer(lambda: analysis.write_analysis(numbers, output_dir, schedule),
                      f'writing the analysis to {output_dir}')
  dispersion = analysis.dispersion_table(numbers)
  one = list(numbers['grid']).index(1.0)
  results.put_section('dispersion', {
      str(L): {k: numbers['statistics'][str(L)][k][one] for k in ('pmax', 'entropy')}
      for L in numbers['lengths']})
  notes = observations(results.data, rows, eval_lengths, reference_length)

  def write():
    plot_accuracy(results.data, rows, eval_lengths, os.path.join(output_dir, 'accuracy.png'))
    write_report(output_dir, results.data, rows, eval_lengths, temperatures, dispersion, notes,
                 time.time() - start)
    _log(f'wrote {output_dir}/report.md', start)

  multihost.on_writer(write, f'writing {output_dir}/report.md')
  multihost.barrier('t5align.demo:done')
  return results.data


def predictions_path(output_dir: str, row: str, length: int, task: str) -> str:
  """predictions/<row>_<length>_<task>.jsonl: an evaluated cell's per-example records."""
  return os.path.join(output_dir, 'predictions', f'{row}_{length}_{task}.jsonl')


def write_predictions(output_dir: str, row: str, length: int,
                      records: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
  """One JSONL file per (row, length, task) cell, written atomically (`heldout` records)."""
  def write():
    for task, items in records.items():
      path = predictions_path(output_dir, row, length, task)
      fileio.makedirs(os.path.dirname(path))
      fileio.write_atomic(path, ''.join(json.dumps(r, sort_keys=True) + '\n' for r in items))
  multihost.on_writer(write, f'writing {output_dir}/predictions')


def write_report(output_dir: str, results: Mapping[str, Any], rows: Sequence[str],
                 lengths: Sequence[int], temperatures: str, dispersion: str,
                 notes: Sequence[str], seconds: float) -> None:
  """report.md: what was run, the numbers, and what they show."""
  s = results['settings']
  parts = [
      '# t5align demo: attention alignment on the shipped retrieval T5', '',
      f'Model: `{s["model_dir"]}` (trained by the project at L_tr = {s["reference_length"]}). '
      f'Accuracy (%) on {s["num_examples"]} held-out examples per task and length (seed '
      f'{s["eval_seed"]}); temperatures calibrated on {s["num_samples"]} prompts per task (seed '
      f'{s["calibration_seed"]}). Encoder attention: {s["attention_impl"]}. '
      f'Wall time of this run: {seconds:.0f} s.', '',
      '## Headline', '', headline_table(results, rows, lengths), '',
      '## What the numbers show', '', *[f'- {n}' if not n.startswith('  ') else f'  - {n[2:]}'
                                          for n in notes], '',
      '## Temperatures', '', '```', temperatures, '```', '',
      '## Dispersion (tau = 1)', '', '```', dispersion, '```', '',
  ]
  for task in train_data.TASKS:
    parts += [f'## Accuracy: {task}', '',
              'Accuracy (%) [95% Wilson interval] over the examples of each cell.', '',
              accuracy_table(results, rows, task, lengths), '']
  parts += ['## Figures', '', '![accuracy](accuracy.png)', '',
            'Also: the statistic-vs-tau curves, relative-position bias and QQ plot PNGs beside '
            'this file (see analysis.json for their numbers).', '']
  fileio.write_atomic(os.path.join(output_dir, 'report.md'), '\n'.join(parts))


def main(argv: Sequence[str] | None = None) -> None:
  multihost.initialize()  # First: before anything starts a JAX backend.
  parser = argparse.ArgumentParser(prog='python -m t5align.demo', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--output_dir', default='demo_output')
  parser.add_argument('--model_dir', default=assets.ASSET_DIR)
  parser.add_argument('--lengths', type=int, nargs='+')
  parser.add_argument('--strategies', nargs='+', default=list(STRATEGIES))
  parser.add_argument('--num_examples', type=int, default=50)
  parser.add_argument('--num_samples', type=int, default=1)
  parser.add_argument('--attention_impl', default='blockwise')
  args = parser.parse_args(argv)
  run(output_dir=args.output_dir, model_dir=args.model_dir, lengths=args.lengths,
      strategies=args.strategies, num_examples=args.num_examples, num_samples=args.num_samples,
      batch_size=args.num_examples, attention_impl=args.attention_impl)


if __name__ == '__main__':
  main()
