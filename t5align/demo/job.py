"""The demo's run: calibrate per task, measure the dispersion, evaluate each cell, report.

`run(DemoSettings)` runs or resumes it (the output folder's results.json, schedule.json and
predictions are kept cell by cell); `t5align.demo.command` is its command line.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

import jax
import numpy as np

from t5align.attention import reference
from t5align import calibration
from t5align import checkpoints
from t5align import labels
from t5align import network
from t5align import partitioning
from t5align import schedule as schedule_lib
from t5align import vocabularies
from t5align.demo import inputs
from t5align.demo import planning
from t5align.demo import reporting
from t5align.demo import store
from t5align.demo import temperatures
from t5align.demo import timing
from t5align.runtime import fileio
from t5align.runtime import multihost
from t5align.runtime import outputs
from t5align.runtime import validate
from t5align.shipped import assets
from t5align.shipped import heldout


def _log(message: str, start: float) -> None:
  if multihost.is_writer():
    print(f'[{time.time() - start:7.1f}s] {message}', file=sys.stderr, flush=True)


def check_vocabulary(model_dir: str) -> None:
  """Refuses, before any weight is read, a model directory whose vocabulary has more pieces than
  its checkpoint embeds (those ids would have no embedding row)."""
  checkpoint = assets.checkpoint_dir(model_dir)
  path = os.path.join(model_dir, assets.VOCAB_FILE)
  validate.vocabulary_fits(vocabularies.SentencePieceVocabulary(path, t5_ids=True).vocab_size,
                           checkpoints.embedding_rows(checkpoint),
                           vocabulary=f'--model_dir vocabulary {path}',
                           model=f'checkpoint {checkpoint}')


def run(settings: planning.DemoSettings) -> dict[str, Any]:
  """Runs (or resumes) the demo; returns the results dict also written to results.json."""
  settings.check()
  with store.claim_outputs(settings.output_dir):
    return _execute(settings)


def _execute(settings: planning.DemoSettings) -> dict[str, Any]:
  from t5align.calibration import analysis  # pylint: disable=g-import-not-at-top
  start = time.time()
  phases = timing.Phases()
  output_dir = settings.output_dir
  with phases('setup'):
    check_vocabulary(settings.model_dir)
    params, config, vocab = assets.load_shipped(settings.model_dir)
    config = dataclasses.replace(config, attention_impl=settings.attention_impl,
                                 dropout_rate=0.0)
    plan = planning.make_plan(settings, assets.training_length(settings.model_dir))
    multihost.on_writer(lambda: fileio.makedirs(output_dir), f'creating {output_dir}')
    # Several devices (or processes): calibration examples split over 'data'. Evaluation runs
    # on every process's first device with host parameters (the model is small).
    mesh = (partitioning.calibration_mesh(1, jax.device_count(), 1) if jax.device_count() > 1
            else None)
    _log(f'model {config.num_encoder_layers}+{config.num_decoder_layers} layers, L_tr = '
         f'{plan.reference_length}, lengths {list(plan.lengths)}, {settings.mode.name} mode',
         start)
    # The calibration prompts of every seed: the first seed's temperatures are used, the others
    # measure how much the temperatures move with the sample.
    prompts = [{task: {L: inputs.task_prompts(vocab, task, L, plan.samples[L], seed)
                       for L in plan.lengths} for task in plan.tuned_tasks}
               for seed in plan.seeds]
    references = [{task: inputs.task_prompts(vocab, task, plan.reference_length,
                                             plan.num_references, seed)
                   for task in plan.tuned_tasks} for seed in plan.seeds]
    identity = store.calibration_identity(settings, plan, config, prompts, references)
    results = store.Results(os.path.join(output_dir, 'results.json'), {
        'model_dir': os.path.abspath(settings.model_dir), 'mode': settings.mode.name,
        **identity, 'rows': list(plan.rows), 'control_tasks': list(plan.control_tasks),
        'num_examples': settings.num_examples, 'calibration_seed': plan.seeds[0],
        'eval_seed': inputs.EVAL_SEED, 'calibration': 'per task'})
    schedule_path = os.path.join(output_dir, 'schedule.json')
    saved = multihost.read_on_writer(
        lambda: outputs.read_json(schedule_path, 'temperature schedule')
        if fileio.exists(schedule_path) else None, f'reading {schedule_path}')

  memo = calibration.Memo()  # The analysis reuses the calibration's sweeps.
  schedule = None if saved is None else store.reusable_schedule(
      schedule_path, saved, identity, lambda message: _log(message, start))
  if schedule is not None:
    _log(f'reusing {schedule_path} (its run identity is this calibration\'s)', start)
  else:
    with phases('calibration'):
      schedule = _calibrate(params, config, plan, prompts, references, identity, memo, mesh,
                            start, output_dir)
  tau_tables = '\n\n'.join(
      [schedule.table(), 'Per-task temperatures (the ones evaluated)',
       reporting.temperature_table(schedule.tasks, plan.strategies, plan.lengths)] +
      [schedule.task_table(s) for s in plan.pooled if s in ('pmax', 'entropy')])
  spread = schedule.provenance.get('calibration_spread')
  if multihost.is_writer():
    print(tau_tables, file=sys.stderr)

  # Dispersion and the analysis figures, from the calibration's sweeps of the first seed's
  # prompts (pooled over the tasks); layer 0's sorted logits from one prompt per task at the
  # longest length and as many attention rows at each shorter one.
  with phases('analysis'):
    groups = {L: [prompts[0][t][L] for t in plan.tuned_tasks] for L in plan.lengths}
    groups[plan.reference_length] = [references[0][t] for t in plan.tuned_tasks]
    longest = plan.lengths[-1]
    layer0 = {L: np.concatenate([g[:max(1, longest // L)] for g in groups[L]]) for L in groups}
    numbers = analysis.collect(params, config, groups, plan.lengths,
                               reference_length=plan.reference_length, mesh=mesh, memo=memo,
                               layer0_tokens=layer0, tau_batch_size=1)
    multihost.on_writer(lambda: analysis.write_analysis(numbers, output_dir, schedule),
                        f'writing the analysis to {output_dir}')
    dispersion = analysis.dispersion_table(numbers)
    one = list(numbers['grid']).index(1.0)
    results.put_section('dispersion', {
        str(L): {k: numbers['statistics'][str(L)][k][one] for k in ('pmax', 'entropy')}
        for L in numbers['lengths']})
  _log(f'dispersion and analysis figures written ({phases.seconds["analysis_s"]:.0f} s)', start)

  with phases('evaluation'):
    cell_seconds = _evaluate(params, config, vocab, plan, schedule, results, settings, start)
  notes = reporting.observations(results.data, plan)

  def write():
    reporting.plot_accuracy(results.data, plan, os.path.join(output_dir, 'accuracy.png'))
    record = {**phases.totals(), 'cells': cell_seconds}
    results.put_section('timing', record)
    reporting.write_report(output_dir, results.data, plan, tau_tables, spread, dispersion, notes,
                           record)
    _log(f'wrote {output_dir}/report.md; wall time {reporting.timing_summary(record)}', start)

  multihost.on_writer(write, f'writing {output_dir}/report.md')
  multihost.barrier('t5align.demo:done')
  return results.data


def _calibrate(params, config, plan: planning.Plan, prompts, references, identity, memo, mesh,
               start: float, output_dir: str) -> schedule_lib.TemperatureSchedule:
  """The per-task calibrations of every seed, the pooled one of the first, as a schedule,
  written to `output_dir`/schedule.json.

  Resumable as calibrate is: each calibration is logged as it finishes
  (`store.calibration_progress`, process 0), a rerun after a kill takes the logged ones as they
  are, and the log is removed once schedule.json is written.
  """
  log_path = store.calibration_progress_path(output_dir)
  log = multihost.on_writer(
      lambda: store.calibration_progress(log_path, identity, lambda m: _log(m, start)),
      f'opening {log_path}')
  previous = calibration.resumed_calibrations(
      multihost.broadcast_json(log.done() if log is not None else {}), log_path)
  if previous:
    _log(f'resuming: {len(previous)} calibrations done before are in {log_path}', start)

  def record(name, c):
    multihost.on_writer(lambda: log.add(name, c), f'writing {log_path}')

  # Progress: a piece per (task, seed, length, strategy), the pooled strategies after them.
  pieces = {}
  for k in range(len(plan.seeds)):
    for task in plan.tuned_tasks:
      for L in plan.lengths:
        for s, n in timing.calibration_passes(plan.strategies).items():
          pieces[(task, k, L, s)] = (L, n * plan.samples[L])
  for L in plan.lengths:
    for s, n in timing.calibration_passes(plan.pooled, done=('grid',)).items():
      pieces[('pooled', 0, L, s)] = (L, n * plan.samples[L] * len(plan.tuned_tasks))
  eta = timing.Eta(pieces)

  def progress(c: calibration.Calibration, task: str, k: int) -> None:
    where = task if len(plan.seeds) == 1 or task == 'pooled' else f'{task} (seed {plan.seeds[k]})'
    left = eta.advance((task, k, c.length, c.strategy))
    _log(f'calibrated {len(eta.finished)}/{len(pieces)} {where}: {c.strategy} @ {c.length} -> '
         f'tau {np.round(c.tau, 3).tolist()}'
         f'{"" if c.bias_rule == "none" else ", bias " + c.bias_rule}'
         f'{" (calibration" + left[1:] + ")" if left else ""}',
         start)

  settings = temperatures.calibration_settings(mesh)
  resumable = dict(previous=previous, record=record)
  per_seed = []
  for k in range(len(plan.seeds)):
    per_seed.append(temperatures.calibrate_per_task(
        params, config, prompts[k], references[k], plan, settings=settings, memo=memo,
        progress=lambda c, task, k=k: progress(c, task, k), seed=plan.seeds[k], **resumable))
  # Pooled over the tuned tasks: the grid strategies from the per-task sweeps (computing
  # nothing), the others (full mode) searched on the pooled prompts.
  pooled_inputs = []
  refs = [references[0][t] for t in plan.tuned_tasks]
  memo.pooled_stats(params, config, refs, [1.0], **settings.stats_kwargs())
  for L in plan.lengths:
    groups = [prompts[0][t][L] for t in plan.tuned_tasks]
    if 'grid' in {calibration.parse_strategy(s)[1] for s in plan.pooled}:
      memo.pooled_stats(params, config, groups, settings.grid, **settings.stats_kwargs())
    pooled_inputs.append((np.concatenate(groups), np.concatenate(refs)))
  pooled = calibration.calibrate_tasks(
      params, config, {'pooled': list(reversed(pooled_inputs))}, plan.pooled,
      reference_length=plan.reference_length, settings=settings, memo=memo,
      progress=lambda d, t, c: progress(c, 'pooled', 0), **resumable)['pooled']
  provenance = {
      'identity': identity, 'source': 'held-out prompts of ' + ', '.join(plan.tuned_tasks),
      'calibration': 'per task (tasks); pooled over the tasks (calibrations)'}
  if len(plan.seeds) > 1:
    provenance['calibration_spread'] = {'seeds': list(plan.seeds),
                                        'tasks': temperatures.calibration_spread(per_seed)}
  schedule = schedule_lib.TemperatureSchedule(
      reference_length=plan.reference_length, calibrations=pooled, strategy=plan.strategies[0],
      provenance=provenance, tasks=per_seed[0])
  schedule_path = os.path.join(output_dir, 'schedule.json')
  multihost.on_writer(lambda: (schedule.save(schedule_path), log.remove()),
                      f'writing {schedule_path}')
  return schedule


def _evaluate(params, config, vocab, plan: planning.Plan, schedule, results: store.Results,
              settings: planning.DemoSettings, start: float) -> list[dict[str, Any]]:
  """Evaluates every cell not in `results` yet, longest length first; returns each evaluated
  cell's seconds. A row whose temperature and bias rule for a task at L equal an earlier row's
  (at L_tr every strategy's are 1 and T5's bias by construction) copies that cell instead."""
  models = {}  # bias rule -> the model reading its bias table so

  def model_for(rule: str) -> network.Transformer:
    if rule not in models:
      models[rule] = network.Transformer(dataclasses.replace(
          config, encoder_bias_rule=reference.BiasRule(
              rule, reference_length=plan.reference_length)))
    return models[rule]

  layers = config.num_encoder_layers
  cells, copies = [], []
  for L in reversed(plan.eval_lengths):
    seen = []  # (row, tau, bias rule, task) evaluated at L
    for row in plan.rows:
      for task in plan.row_tasks(row):
        # Each task at the temperature (and bias rule) calibrated on it (per task, as the paper).
        untouched = L == plan.reference_length or row == 'tau=1'
        tau = temperatures.encoder_temperature(
            1.0 if untouched else temperatures.row_temperature(schedule.for_task(task), row, L),
            layers)
        rule = 'none' if untouched else schedule.for_task(task).bias_rule(L, row)
        same = next((r for r, t, b, k in seen if k == task and b == rule
                     and t.shape == tau.shape and np.array_equal(t, tau)), None)
        if same is None:
          seen.append((row, tau, rule, task))
          if results.get(row, task, L) is None:
            cells.append((L, row, tau, rule, task))
        else:
          copies.append((L, row, same, task))
  # One compiled decoder per length: every task decodes the longest answer's steps.
  decode_length = max(heldout.DECODE_LENGTH.values())
  eta = timing.Eta({i: (L, settings.num_examples) for i, (L, *_) in enumerate(cells)})
  seconds = []
  for i, (L, row, tau, rule, task) in enumerate(cells):
    compiles = i == 0 or cells[i - 1][0] != L or cells[i - 1][3] != rule
    t0 = time.time()
    records = heldout.retrieval_predictions(
        model_for(rule), params, vocab, tasks=[task], length=L, num_examples=settings.num_examples,
        seed=inputs.EVAL_SEED, batch_size=min(settings.batch_size, settings.num_examples),
        temperature=tau, decode_length=decode_length)
    store.write_predictions(settings.output_dir, row, L, records)
    value = heldout.accuracy(records)[task]
    results.put(row, task, L, value)
    seconds.append({'length': L, 'row': row, 'task': task, 'compiled': compiles,
                    'seconds': round(time.time() - t0, 2)})
    _log(f'{labels.row_label(row):>20} @ {L:>5} {task}: {value:.0f}% '
         f'(cell {i + 1}/{len(cells)}{eta.advance(i)})', start)
  results.put_cells([(row, task, L, results.get(same, task, L)) for L, row, same, task in copies])
  for L, row, same, task in copies:
    store.copy_predictions(settings.output_dir, same, row, L, task)
  return seconds
