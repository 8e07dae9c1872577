"""A shortened demo on the shipped model; its report is checked against a recomputation."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re

import numpy as np
import pytest

pytest.importorskip('seqio')  # The tasks' metrics live in seqio_tasks.

from t5align import calibration  # pylint: disable=g-import-not-at-top
from t5align import demo
from t5align import network
from t5align import train
from t5align import train_data

MODEL_DIR = os.environ.get('T5ALIGN_MODEL_DIR', train.ASSET_DIR)
STRATEGIES = ('pmax', 'log_length')
NUM_EXAMPLES = 4


@pytest.fixture(scope='module')
def shortened(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('demo'))
  with open(os.path.join(MODEL_DIR, 'training.json'), encoding='utf-8') as f:
    reference_length = int(json.load(f)['input_length'])
  length = 2 * reference_length
  results = demo.run(output_dir=out, model_dir=MODEL_DIR, lengths=[length],
                     strategies=STRATEGIES, num_examples=NUM_EXAMPLES, num_samples=1,
                     batch_size=NUM_EXAMPLES)
  return out, results, reference_length, length


def test_report_files(shortened):
  out, _, _, _ = shortened
  for name in ('report.md', 'results.json', 'schedule.json', 'accuracy.png', 'analysis.json',
               'statistic_curves.png', 'relpos_bias.png'):
    assert os.path.getsize(os.path.join(out, name)) > 0, name


def test_accuracy_equals_recomputation(shortened):
  out, results, reference_length, length = shortened
  params, config, vocab = train.load_shipped(MODEL_DIR)
  config = dataclasses.replace(config, attention_impl='blockwise', dropout_rate=0.0)
  model = network.Transformer(config)
  schedule = json.load(open(os.path.join(out, 'schedule.json'), encoding='utf-8'))
  expected = train.evaluate(model, params, vocab, length=length, num_examples=NUM_EXAMPLES,
                            seed=demo.EVAL_SEED, batch_size=NUM_EXAMPLES, temperature=1.0)
  for task, value in expected.items():
    assert results['accuracy']['tau=1'][task][str(length)] == value, task
  for task in train_data.TASKS:  # Each task at its own calibrated temperature.
    tau = schedule['tasks'][task]['pmax'][0]['tau']
    value = train.evaluate(model, params, vocab, tasks=[task], length=length,
                           num_examples=NUM_EXAMPLES, seed=demo.EVAL_SEED,
                           batch_size=NUM_EXAMPLES, temperature=tau)[task]
    assert results['accuracy']['pmax'][task][str(length)] == value, task
  # The report's Markdown tables print the same numbers.
  report = open(os.path.join(out, 'report.md'), encoding='utf-8').read()
  for task in train_data.TASKS:
    section = report.split(f'## Accuracy: {task}')[1]
    cells = re.search(r'\| tau = 1 \| ([0-9]+) \| ([0-9]+) \|', section).groups()
    assert [int(c) for c in cells] == [
        round(results['accuracy']['tau=1'][task][str(L)]) for L in (reference_length, length)]


def test_temperatures_equal_recomputation(shortened):
  out, _, reference_length, length = shortened
  params, config, vocab = train.load_shipped(MODEL_DIR)
  config = dataclasses.replace(config, attention_impl='blockwise', dropout_rate=0.0)
  schedule = json.load(open(os.path.join(out, 'schedule.json'), encoding='utf-8'))
  tokens = demo.calibration_tokens(vocab, length, 1)
  c = calibration.calibrate(params, config, tokens, 'pmax', reference_length=reference_length)
  assert schedule['calibrations']['pmax'][0]['tau'] == pytest.approx(c.tau)
  assert schedule['calibrations']['log_length'][0]['tau'] == pytest.approx(
      math.log(reference_length) / math.log(length))
  # Per task: the task's prompts at L_ex against the same task's at L_tr.
  for task in train_data.TASKS:
    [(long, short)] = demo.task_calibration_inputs(vocab, task, [length], reference_length, 1)
    assert long.shape[1] == length and short.shape[1] == reference_length
    c = calibration.calibrate(params, config, long, 'pmax', reference_tokens=short,
                              reference_length=reference_length)
    assert schedule['tasks'][task]['pmax'][0]['tau'] == pytest.approx(c.tau)
  report = open(os.path.join(out, 'report.md'), encoding='utf-8').read()
  assert 'Per-task vs pooled temperatures' in report
  # Dispersion row at tau = 1 equals the statistics of the same samples.
  results = json.load(open(os.path.join(out, 'results.json'), encoding='utf-8'))
  stats = calibration.encoder_attention_stats(params, config, tokens, [1.0])
  np.testing.assert_allclose(results['dispersion'][str(length)]['pmax'], stats.pmax[0],
                             rtol=1e-5)


def test_rerun_resumes_and_rejects_other_settings(shortened):
  out, results, _, length = shortened
  again = demo.run(output_dir=out, model_dir=MODEL_DIR, lengths=[length], strategies=STRATEGIES,
                   num_examples=NUM_EXAMPLES, num_samples=1, batch_size=NUM_EXAMPLES)
  assert again['accuracy'] == results['accuracy']
  with pytest.raises(ValueError, match='holds a run with other settings'):
    demo.run(output_dir=out, model_dir=MODEL_DIR, lengths=[length], strategies=STRATEGIES,
             num_examples=NUM_EXAMPLES + 1, num_samples=1)


def test_eta_weights_the_work_done():
  clock = iter([100.0, 130.0, 0.0, 10.0])
  eta = demo.Eta([1, 3], clock=lambda: next(clock))
  assert eta.update(1) == ', ETA 1m30s'  # 30 s for 1/4 of the work: 90 s to go.
  steps = demo.Eta(clock=lambda: next(clock))
  assert steps.update(1, 4) == ', ETA 0m30s'  # 10 s per step, 3 steps to go.
