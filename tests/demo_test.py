"""A shortened demo on the shipped model; its report is checked against a recomputation."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqio_tasks import metrics
from t5align import assets
from t5align import calibration
from t5align import demo
from t5align import heldout
from t5align import network
from t5align import train_data

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_DIR = os.environ.get('T5ALIGN_MODEL_DIR', assets.ASSET_DIR)
STRATEGIES = ('pmax', 'log_length')
NUM_EXAMPLES = 4


@pytest.fixture(scope='module')
def shortened(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('demo'))
  reference_length = assets.training_length(MODEL_DIR)
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
  params, config, vocab = assets.load_shipped(MODEL_DIR)
  config = dataclasses.replace(config, attention_impl='blockwise', dropout_rate=0.0)
  model = network.Transformer(config)
  schedule = json.load(open(os.path.join(out, 'schedule.json'), encoding='utf-8'))
  expected = heldout.retrieval_accuracy(model, params, vocab, length=length,
                                        num_examples=NUM_EXAMPLES, seed=demo.EVAL_SEED,
                                        batch_size=NUM_EXAMPLES, temperature=1.0)
  for task, value in expected.items():
    assert results['accuracy']['tau=1'][task][str(length)] == value, task
  for task in train_data.TASKS:  # Each task at its own calibrated temperature.
    tau = schedule['tasks'][task]['pmax'][0]['tau']
    value = heldout.retrieval_accuracy(model, params, vocab, tasks=[task], length=length,
                                       num_examples=NUM_EXAMPLES, seed=demo.EVAL_SEED,
                                       batch_size=NUM_EXAMPLES, temperature=tau)[task]
    assert results['accuracy']['pmax'][task][str(length)] == value, task
  # The report's Markdown tables print the same numbers.
  report = open(os.path.join(out, 'report.md'), encoding='utf-8').read()
  for task in train_data.TASKS:
    section = report.split(f'## Accuracy: {task}')[1]
    found = re.search(r'\| tau = 1 \| ([0-9]+) \[([0-9]+)-([0-9]+)\] '
                      r'\| ([0-9]+) \[([0-9]+)-([0-9]+)\] \|', section)
    cells = [int(c) for c in found.groups()]
    assert cells[0::3] == [
        round(results['accuracy']['tau=1'][task][str(L)]) for L in (reference_length, length)]
    for value, low, high in zip(cells[0::3], cells[1::3], cells[2::3]):  # 95% Wilson bounds.
      assert low <= value <= high and (low, high) != (0, 100), (task, cells)


def _read_predictions(out: str, row: str, length: int, task: str) -> list[dict]:
  with open(demo.predictions_path(out, row, length, task), encoding='utf-8') as f:
    return [json.loads(line) for line in f]


# Each family's answer check, written out from the metrics' primitives (not `score_example`).
RESCORE = {
    'passkey': lambda target, prediction: metrics.first_integer(prediction) == int(target),
    'lines': lambda target, prediction: metrics.last_integer(prediction) == int(target),
    'kv': lambda target, prediction: target.lower() in prediction.lower(),
}


def test_accuracy_rescored_from_written_predictions(shortened):
  """Every evaluated cell's accuracy from its predictions file, re-scored and averaged in float64;
  the examples' targets regenerated from their seed."""
  out, results, reference_length, length = shortened
  vocab = assets.load_shipped(MODEL_DIR)[2]
  for row in results['accuracy']:
    for task in train_data.TASKS:
      for L in (reference_length, length):
        path = demo.predictions_path(out, row, L, task)
        if not os.path.exists(path):  # A cell copied from an earlier row with the same tau.
          continue
        records = _read_predictions(out, row, L, task)
        examples = train_data.eval_examples(task, vocab, L, NUM_EXAMPLES, demo.EVAL_SEED)
        assert [r['index'] for r in records] == list(range(NUM_EXAMPLES)), path
        assert [(r['target'], r['answer']) for r in records] == [
            (e.targets, e.answer) for e in examples], path
        assert all(r['input_tokens'] <= L for r in records), path
        hits = np.array([RESCORE[train_data.FAMILY[task]](r['answer'], r['prediction'])
                         for r in records], np.float64)
        assert results['accuracy'][row][task][str(L)] == pytest.approx(100.0 * hits.mean(),
                                                                       abs=1e-9), path
  # tau = 1 at L_ex is evaluated, never copied: its files exist for every task.
  for task in train_data.TASKS:
    assert os.path.exists(demo.predictions_path(out, 'tau=1', length, task))


def _naive_greedy(apply, steps, eos_id, tau):
  """Greedy decoding without a cache: the whole model re-run on the growing prefix each step."""
  out = np.zeros((1, steps), np.int32)
  for t in range(steps):
    dec_in = np.zeros((1, steps), np.int32)
    dec_in[0, 1:t + 1] = out[0, :t]
    out[0, t] = int(np.argmax(np.asarray(apply(jnp.asarray(dec_in), tau))[0, t]))
    if out[0, t] == eos_id:
      break
  return out[0]


def test_written_prediction_equals_uncached_greedy_decoding(shortened):
  """The passkey cell's first answer at L_ex, tau = 1 and P_max: the same text from a decoder that
  re-runs the whole model per token (no cache, no `decoding` module)."""
  out, _, _, length = shortened
  params, config, vocab = assets.load_shipped(MODEL_DIR)
  model = network.Transformer(dataclasses.replace(config, attention_impl='blockwise',
                                                  dropout_rate=0.0))
  schedule = json.load(open(os.path.join(out, 'schedule.json'), encoding='utf-8'))
  [example] = train_data.eval_examples('passkey', vocab, length, 1, demo.EVAL_SEED)
  tokens = np.zeros((1, length), np.int32)
  tokens[0, :len(example.input_ids)] = example.input_ids
  steps = heldout.DECODE_LENGTH['passkey']
  # [1, length] inputs, [1, steps] decoder tokens -> [1, steps, vocab]; one compile for both taus.
  apply = jax.jit(lambda dec, tau: model.apply(
      {'params': params}, jnp.asarray(tokens), dec, jnp.ones_like(dec), enable_dropout=False,
      temperature=tau))
  for row, tau in (('tau=1', 1.0), ('pmax', schedule['tasks']['passkey']['pmax'][0]['tau'])):
    path = demo.predictions_path(out, row, length, 'passkey')
    if not os.path.exists(path):
      continue
    recorded = _read_predictions(out, row, length, 'passkey')[0]['prediction']
    naive = _naive_greedy(apply, steps, vocab.eos_id, jnp.float32(tau))
    assert vocab.decode(naive) == recorded, row


def test_demo_needs_no_seqio():
  """With seqio unimportable, the demo's modules import and its examples score (no TensorFlow)."""
  code = ('import sys; sys.modules["seqio"] = None\n'
          'from t5align import demo, heldout, train_data\n'
          'import os; from t5align import assets, vocab\n'
          'v = vocab.Vocabulary(os.path.join(assets.ASSET_DIR, assets.VOCAB_FILE))\n'
          '[ex] = train_data.eval_examples("passkey", v, 256, 1, 1)\n'
          'assert ex.score(ex.targets) == 1.0\n'
          'heavy = [m for m in ("seqio", "tensorflow") if sys.modules.get(m) is not None]\n'
          'print(heavy); sys.exit(1 if heavy else 0)\n')
  env = {**os.environ, 'PYTHONPATH': REPO_ROOT, 'JAX_PLATFORMS': 'cpu'}
  done = subprocess.run([sys.executable, '-c', code], env=env, cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stdout + done.stderr


def test_temperatures_equal_recomputation(shortened):
  out, _, reference_length, length = shortened
  params, config, vocab = assets.load_shipped(MODEL_DIR)
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
