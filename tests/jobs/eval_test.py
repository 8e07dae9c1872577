"""Tests for t5align/evaluation/ (scoring, predictions, temperature), runtime/batching.py,
scheduled.py, report.py, eval.py and jobs.EvalJob.

The library tests need no seqio. The end-to-end test runs `python -m t5align.eval` with the gin
run file on the t5x tiny fixture (vocabulary 128) and a SentencePiece model trained here, kills it
midway, and reruns it: every example must end up recorded exactly once.

EvalJob's settings (batch size, decode length, dtype, temperature forms, a schedule's NaN, a
vocabulary larger than the embedding) are refused before any weight is read. A rerun into a
finished eval (`finished_eval`: 2 examples on a copy of the shipped model, shared by its tests in
order) is refused, naming the fields, when the checkpoint was replaced at the same path, the
vocabulary or the task seed changed, or run.json is gone; a CHECKPOINT_PATH link re-pointed as
the eval starts is read as the checkpoint it named then, and a resume through it refused.
"""
from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conftest
import runs

from t5align.attention import dispatch
from t5align import calibration
from t5align import checkpoints
from t5align.evaluation import markdown
from t5align.evaluation import predictions
from t5align.evaluation import scoring
from t5align.evaluation import temperature
from t5align import jobs
from t5align import network
from t5align import partitioning
from t5align import report
from t5align.evaluation import tables
from t5align import run_identity
from t5align.runtime import batching
from t5align.runtime import fileio
from t5align.runtime import outputs
from t5align.runtime import records
from t5align.runtime import validate
from t5align import schedule
from t5align import scheduled
from t5align.shipped import assets

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = REPO_ROOT / 'tests' / 'testdata' / 't5x' / 't5_1_1_tiny' / 'legacy' / 'checkpoint_0'


# ---------------------------------------------------------------------------------------------
# Prediction log and files.


def test_prediction_log_appends_and_reopens(tmp_path):
  path = tmp_path / 'task' / 'predictions.jsonl'
  log = records.RecordLog(path)
  log.append([{'index': 0, 'prediction': 'a'}, {'index': 1, 'prediction': 'b'}])
  log.append([{'index': 2, 'prediction': 'c'}])
  again = records.RecordLog(path)
  assert [r['prediction'] for r in again.ordered()] == ['a', 'b', 'c']
  with pytest.raises(ValueError, match='index 1 is already recorded'):
    again.append([{'index': 1, 'prediction': 'x'}])


def test_prediction_log_drops_a_torn_last_line(tmp_path):
  path = tmp_path / 'predictions.jsonl'
  path.write_text('{"index": 0, "prediction": "a"}\n{"index": 1, "predic')
  log = records.RecordLog(path)
  assert sorted(log.records) == [0]
  assert path.read_text() == '{"index": 0, "prediction": "a"}\n'
  log.append([{'index': 1, 'prediction': 'b'}])
  assert sorted(records.RecordLog(path).records) == [0, 1]


@pytest.mark.parametrize('content, message', [
    ('{"index": 0}\n{"index": 0}\n', r'predictions\.jsonl:2: index 0 recorded twice'),
    ('{"index": 0}\nnot json\n{"index": 1}\n', r'predictions\.jsonl:2: not a prediction'),
    ('{"prediction": "a"}\n', r'predictions\.jsonl:1: not a prediction'),
])
def test_prediction_log_corruption(tmp_path, content, message):
  path = tmp_path / 'predictions.jsonl'
  path.write_text(content)
  with pytest.raises(ValueError, match=message):
    records.RecordLog(path)


def _record(temperature):
  return run_identity.make(facts={'task': 't', 'temperature': temperature})


def test_write_json_atomic_and_check_run(tmp_path):
  fileio.write_json_atomic(tmp_path / 'm.json', {'a': 1})
  assert json.loads((tmp_path / 'm.json').read_text()) == {'a': 1}
  assert [p.name for p in tmp_path.iterdir()] == ['m.json']  # No temporary left behind.
  run_identity.check_run(tmp_path, _record(0.8), kind='eval')
  run_identity.check_run(tmp_path, _record(0.8), kind='eval')
  # No result yet (the first run failed before its first batch): a corrected rerun may start.
  run_identity.check_run(tmp_path, _record(0.9), kind='eval')
  assert json.loads((tmp_path / 'run.json').read_text())['temperature'] == 0.9
  records.RecordLog(tmp_path / 'predictions.jsonl').append([{'index': 0}])
  run_identity.check_run(tmp_path, _record(0.9), kind='eval')
  with pytest.raises(ValueError, match=r'different run; differing fields \(before -> now\): '
                                       r'temperature: 0\.9 -> 0\.7'):
    run_identity.check_run(tmp_path, _record(0.7), kind='eval')


def test_run_examples_skips_recorded(tmp_path):
  log = records.RecordLog(tmp_path / 'p.jsonl')
  log.append([{'index': 1, 'prediction': 'old'}])
  seen = []

  def process(batch):
    seen.append([e['index'] for e in batch])
    return [{'index': e['index'], 'prediction': str(e['index'])} for e in batch]

  predictions.run_examples([{'index': i} for i in range(5)], log, process, batch_size=2,
                          show_progress=False)
  assert seen == [[0, 2], [3, 4]]
  assert [r['prediction'] for r in log.ordered()] == ['0', 'old', '2', '3', '4']


def test_progress_bar_off_a_terminal_writes_plain_lines(tmp_path):
  log = records.RecordLog(tmp_path / 'p.jsonl')
  log.append([{'index': 1}])
  stream = io.StringIO()  # Not a TTY: every redraw is its own line, no carriage returns.
  predictions.run_examples([{'index': i} for i in range(5)], log,
                           lambda batch: [{'index': e['index']} for e in batch], batch_size=2,
                           desc='task', stream=stream)
  text = stream.getvalue()
  assert '\r' not in text and text.endswith('\n'), repr(text)
  lines = text.splitlines()
  assert lines[0].startswith('task:') and '1/5' in lines[0], lines
  assert '100%' in lines[-1] and '5/5' in lines[-1], lines


def test_ceil_div_and_round_up():
  assert [batching.ceil_div(n, 4) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]
  assert [batching.round_up(n, 128) for n in (1, 128, 129)] == [128, 128, 256]
  with pytest.raises(ValueError, match='divisor must be positive; got 0'):
    batching.ceil_div(3, 0)


# ---------------------------------------------------------------------------------------------
# Temperatures, batches, mesh, scoring.


def _schedule(tmp_path=None):
  cals = {'pmax': (calibration.Calibration('pmax', 32, 16, 0.5),)}
  sched = schedule.TemperatureSchedule(reference_length=16, calibrations=cals, strategy='pmax')
  if tmp_path is not None:
    sched.save(str(tmp_path / 'schedule.json'))
  return sched


def test_temperature_labels_and_values():
  tokens = np.array([[5] * 40 + [0] * 8, [5] * 8 + [0] * 40])
  const = temperature.Temperature(constant=1.0)
  assert const.label == 'tau = 1'
  np.testing.assert_array_equal(const.taus(tokens), [[1.0], [1.0]])
  assert temperature.Temperature(constant=(0.8, 0.9)).taus(tokens).shape == (2, 2)
  assert temperature.Temperature(constant=0.75).label == 'tau = 0.75'
  sched = temperature.Temperature(schedule=_schedule())
  assert sched.label == 'w/ P_max'
  # 40 tokens: past the last calibrated length, tau holds 0.5; 8 tokens: below L_tr, tau 1.
  np.testing.assert_allclose(sched.taus(tokens), [[0.5], [1.0]])
  with pytest.raises(ValueError, match='exactly one'):
    temperature.Temperature()


def test_per_head_temperatures_of_a_run(tiny):
  """TEMPERATURE as `[layers][heads]` tuples (tiny: 2 x 4): `[b, layers, heads]` per batch;
  a per-head schedule gives each row its length's taus."""
  config, _ = tiny
  tokens = np.array([[5] * 40 + [0] * 8, [5] * 8 + [0] * 40])
  per_head = [[0.9, 0.8, 0.7, 0.6], [1.0, 0.5, 0.75, 0.95]]
  const = temperature.make_temperature(config, per_head)
  assert const.constant == tuple(map(tuple, per_head))
  assert const.label == 'tau = [2 x 4] per head (mean 0.775)'
  np.testing.assert_array_equal(const.taus(tokens), np.float32([per_head, per_head]))
  for bad, message in (([[0.9, 0.8], [0.7]], 'TEMPERATURE=.* is not a float, a tuple'),
                       ([[0.9, 0.0]], 'TEMPERATURE must be finite and > 0')):
    with pytest.raises(ValueError, match=message):
      temperature.make_temperature(config, bad)
  cals = {'pmax_per_head': (calibration.Calibration('pmax_per_head', 32, 16, tuple(map(
      tuple, per_head))),)}
  sched = temperature.Temperature(schedule=schedule.TemperatureSchedule(16, cals, 'pmax_per_head'))
  assert sched.label == 'w/ P_max (per head)'
  # 40 tokens: past the last calibrated length; 8 tokens: below L_tr, tau 1.
  np.testing.assert_allclose(sched.taus(tokens), [per_head, np.ones((2, 4))])


@pytest.mark.slow
@pytest.mark.parametrize('scored', [False, True])
@pytest.mark.parametrize('kind', ['scalar', 'per_layer', 'per_head', 'per_head_schedule'])
def test_the_run_its_memory_check_and_the_preflight_compile_one_program(tiny, kind, scored):
  """`EvalJob.program` is the one builder: the run calls its `fn` on the arrays its batches
  make (`temp.taus(tokens)`, placed by rows), the memory check lowers it at its abstract
  arguments, and the pre-flight's `EvalJob.programs` (no data: the tasks' modes from the
  catalog) builds the same; the lowerings are the same text for every temperature shape (a
  per-head one was once checked as `[b, layers]`)."""
  from t5align import jobs  # pylint: disable=g-import-not-at-top
  from t5align.runtime import multihost  # pylint: disable=g-import-not-at-top
  config, params = tiny
  layers, heads = config.num_encoder_layers, config.num_heads
  per_head = tuple(tuple(0.5 + 0.1 * (i + j) for j in range(heads)) for i in range(layers))
  cals = {'pmax_per_head': (calibration.Calibration('pmax_per_head', 32, 16, per_head),)}
  constant = {'scalar': 0.8, 'per_layer': tuple(0.9 - 0.1 * i for i in range(layers)),
              'per_head': per_head, 'per_head_schedule': None}[kind]
  temp = (temperature.Temperature(constant) if constant is not None else
          temperature.Temperature(schedule=schedule.TemperatureSchedule(16, cals,
                                                                        'pmax_per_head')))
  job = jobs.EvalJob(temperature=constant, batch_size=2, max_decode_length=4,
                     mixture_or_task_name='t5align_lm_wiki_2048' if scored else None)
  model, mesh = network.Transformer(config), partitioning.eval_mesh(1)
  program = job.program(model, mesh, params, temp, scored=scored, steps=4, eos_id=1,
                        input_length=40, target_length=3)
  # The run's batch of 2: [2, 40] tokens padded to the 128-token width, targets to 128.
  tokens = batching.pad_batch(batching.pad_tokens([[5] * 40, [6] * 8], min_length=128), 2)
  targets = batching.pad_batch(batching.pad_tokens([[7] * 3, [8] * 2], min_length=128), 2)
  place = lambda x: multihost.global_batch(x, partitioning.batch_sharding(mesh, 2), 2)
  batch = (place(tokens), place(targets), place(temp.taus(tokens)))
  run = program.fn.lower(params, *(batch if scored else batch[::2])).as_text()
  assert program.lower().as_text() == run
  if constant is not None:  # The pre-flight reads the temperature from the job's settings.
    (preflight,) = job.programs(config, mesh, params, length=40)
    assert preflight.lower().as_text() == run


def test_pad_and_strip():
  out = batching.pad_tokens([[1, 2, 3], [4]], multiple=4)
  np.testing.assert_array_equal(out, [[1, 2, 3, 0], [4, 0, 0, 0]])
  assert batching.pad_batch(out, 3).shape == (3, 4)
  assert batching.strip_eos([5, 6, 1, 7, 0]) == [5, 6]


@pytest.fixture(scope='module')
def tiny(load_t5x_fixture):
  config, params, _ = load_t5x_fixture('t5_1_1_tiny')
  return config, params


def test_param_specs_shard_along_model_axis(tiny):
  config, params = tiny
  shardings = partitioning.param_shardings(config, partitioning.eval_mesh(1))
  assert jax.tree.structure(shardings) == jax.tree.structure(params)
  assert all(all(d is None for d in s.spec) for s in jax.tree.leaves(shardings))

  class FakeMesh:
    shape = {'data': 1, 'model': 2}

  names, shapes = partitioning.logical_param_axes(config), network.param_shapes(config)
  spec = lambda *path: dispatch.spec_for(
      functools.reduce(lambda n, k: n[k], path, names),
      functools.reduce(lambda n, k: n[k], path, shapes).shape, FakeMesh(),
      partitioning.standard_logical_axis_rules())
  P = jax.sharding.PartitionSpec
  assert spec('encoder', 'layers_0', 'mlp', 'wi_0', 'kernel') == P(None, 'model')
  assert spec('token_embedder', 'embedding') == P('model', None)
  assert spec('encoder', 'encoder_norm', 'scale') == P(None)


@pytest.mark.slow
def test_score_batch_matches_log_softmax(tiny):
  config, params = tiny
  model = network.Transformer(config)
  inputs = jnp.array([[5, 6, 7, 1, 0], [9, 1, 0, 0, 0]])
  targets = jnp.array([[3, 4, 1], [8, 1, 0]])
  tau = jnp.array([[0.7], [1.0]])
  got = scoring.score_batch(model, params, inputs, targets, tau)
  # Teacher forcing by hand: decoder inputs [0, t0, t1], log-softmax, pick, skip padding.
  dec_in = jnp.array([[0, 3, 4], [0, 8, 1]])
  logits = model.apply({'params': params}, inputs, dec_in, targets, enable_dropout=False,
                       temperature=tau)
  logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  want = [logp[0, 0, 3] + logp[0, 1, 4] + logp[0, 2, 1], logp[1, 0, 8] + logp[1, 1, 1]]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_scheduled_transformer_equals_explicit_temperature(tiny, tmp_path):
  config, params = tiny
  _schedule(tmp_path)
  tokens = jnp.array([[5] * 40 + [1], [5] * 8 + [1] + [0] * 32])
  plain = network.Transformer(config)
  model = scheduled.ScheduledTransformer(config, schedule_path=str(tmp_path / 'schedule.json'))
  got = model.apply({'params': params}, tokens, enable_dropout=False, method='encode')
  want = plain.apply({'params': params}, tokens, enable_dropout=False, method='encode',
                     temperature=jnp.array([[0.5], [1.0]]))
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_scheduled_transformer_applies_the_tasks_own_entry(tiny, tmp_path):
  # A schedule calibrated per task (task_a: tau 0.7 at 32 tokens; pooled: 0.5), as t5x.eval's
  # network gets it from gin/t5x/schedule.gin (schedule_task = MIXTURE_OR_TASK_NAME).
  config, params = tiny
  pooled = _schedule()
  path = str(tmp_path / 'per_task.json')
  dataclasses.replace(pooled, tasks={'task_a': {'pmax': (
      calibration.Calibration('pmax', 32, 16, 0.7),)}}).save(path)
  tokens = jnp.array([[5] * 40 + [1], [5] * 8 + [1] + [0] * 32])
  plain = network.Transformer(config)
  model = scheduled.ScheduledTransformer(config, schedule_path=path, schedule_task='task_a')
  got = model.apply({'params': params}, tokens, enable_dropout=False, method='encode')
  want = plain.apply({'params': params}, tokens, enable_dropout=False, method='encode',
                     temperature=jnp.array([[0.7], [1.0]]))
  pooled_out = plain.apply({'params': params}, tokens, enable_dropout=False, method='encode',
                           temperature=jnp.array([[0.5], [1.0]]))
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  assert not np.allclose(got[0], pooled_out[0], rtol=1e-3, atol=1e-3)
  # Without a task, a per-task schedule is refused rather than applied pooled.
  with pytest.raises(ValueError, match=r'holds per-task calibrations \(task_a\); name the task'):
    scheduled.ScheduledTransformer(config, schedule_path=path)


def test_scheduled_transformer_applies_the_strategys_bias_rule(tiny, tmp_path):
  """A strategy calibrated with a bias rule: t5x.eval's network reads the encoder's bias table
  by that rule (resolved at the input's width, L_tr the schedule's) with the schedule's taus,
  as `network.Transformer` with the rule and those taus; mixed rules are refused."""
  from t5align.attention import reference  # pylint: disable=g-import-not-at-top
  config, params = tiny
  path = str(tmp_path / 'ruled.json')
  name = 'pmax:bias=interpolate'
  schedule.TemperatureSchedule(16, {name: (calibration.Calibration(
      name, 32, 16, 0.6, bias_rule='interpolate'),)}, name).save(path)
  model = scheduled.ScheduledTransformer(config, schedule_path=path)
  assert model.config.encoder_bias_rule == reference.BiasRule('interpolate', reference_length=16)
  tokens = jnp.array([[5] * 40 + [1], [5] * 30 + [1] + [0] * 10])
  got = model.apply({'params': params}, tokens, enable_dropout=False, method='encode')
  taus = schedule.load_schedule(path).temperatures(tokens)  # Row 1 (31 tokens): between 1, 0.6.
  ruled = network.Transformer(model.config)
  want = ruled.apply({'params': params}, tokens, enable_dropout=False, method='encode',
                     temperature=taus)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  plain = network.Transformer(config).apply({'params': params}, tokens, enable_dropout=False,
                                            method='encode', temperature=taus)
  assert not np.allclose(got, plain, rtol=1e-3, atol=1e-3)
  mixed = str(tmp_path / 'mixed.json')
  joint = 'pmax:bias=joint'
  schedule.TemperatureSchedule(16, {joint: (
      calibration.Calibration(joint, 32, 16, 0.6, bias_rule='interpolate'),
      calibration.Calibration(joint, 64, 16, 0.5, bias_rule='extend'))}, joint).save(mixed)
  with pytest.raises(ValueError, match=r"chose the bias rules \['extend', 'interpolate'\]"):
    scheduled.ScheduledTransformer(config, schedule_path=mixed)


def test_a_schedule_of_another_checkpoint_is_refused_unless_allowed(tmp_path):
  """docs/t5x.md's Flan-T5-XL loop once read a schedule calibrated on the shipped model: each
  run would have applied another model's temperatures. The schedule records the content sha256
  of the checkpoint it was calibrated on; eval compares it with its own before loading."""
  path = runs.schedule_with_target(tmp_path / 's.json', 0.5)
  data = json.loads(path.read_text())
  data['provenance'] = {'identity': {'checkpoint': {'sha256': 'f' * 64},
                                     'checkpoint_path': '/models/shipped/checkpoint_5000'}}
  path.write_text(json.dumps(data))
  job = jobs.EvalJob(checkpoint=jobs.Checkpoint('/models/flan_t5_xl/checkpoint_1138000'),
                     schedule_path=str(path))
  loaded = schedule.load_schedule(str(path))
  with pytest.raises(ValueError, match=re.escape(
      f'temperature schedule {path} (SCHEDULE_PATH) was calibrated on '
      '/models/shipped/checkpoint_5000 (content sha256 ffffffffffff), not on this run\'s '
      'checkpoint /models/flan_t5_xl/checkpoint_1138000 (sha256 aaaaaaaaaaaa): its temperatures '
      "are another model's. Calibrate this checkpoint (python -m t5align.calibrate), or set "
      '--gin.ALLOW_SCHEDULE_MISMATCH=True to apply them as they are.')):
    job._check_schedule_model(loaded, {'sha256': 'a' * 64})  # pylint: disable=protected-access
  job._check_schedule_model(loaded, {'sha256': 'f' * 64})  # pylint: disable=protected-access
  dataclasses.replace(job, allow_schedule_mismatch=True)._check_schedule_model(  # pylint: disable=protected-access
      loaded, {'sha256': 'a' * 64})
  del data['provenance']  # A schedule that names no checkpoint claims no model.
  path.write_text(json.dumps(data))
  job._check_schedule_model(  # pylint: disable=protected-access
      schedule.load_schedule(str(path)), {'sha256': 'a' * 64})


# ---------------------------------------------------------------------------------------------
# Report.


def _result(folder, task, label, table, group, column, metrics, model='flan_t5_xl'):
  fileio.write_json_atomic(folder / label.replace(' ', '_') / task / 'metrics.json', {
      'task': task, 'model': model, 'label': label, 'table': table, 'group': group,
      'column': column, 'metrics': metrics, 'primary_metric': 'accuracy'})


def test_report_tables(tmp_path):
  for label, accs in (('w/ P_max', (60.0, 50.0, 40.0)), ('tau = 1', (58.0, 44.0, None))):
    for k, acc in zip((0, 4, 9), accs):
      if acc is not None:
        _result(tmp_path, f'mdqa_10docs_gold{k}', label, 'mdqa', '10 Docs', str(k),
                {'accuracy': acc})
  for label, ppl in (('tau = 1', 35.9), ('w/ P_max', 34.7)):
    _result(tmp_path, 'lm_1024', label, 'lm', 'wiki', '1024', {'perplexity': ppl}, 't5_large_lm')
    _result(tmp_path, 'lm_2048', label, 'lm', 'wiki', '2048',
            {'perplexity': 2000.0 if label == 'tau = 1' else 45.5}, 't5_large_lm')
  _result(tmp_path, 'code', 'tau = 1', 'code', 'stdlib', 'all',
          {'em': 20.0, 'es': 60.0, 'em_1k': 19.6, 'es_1k': 62.4, 'em_10k': 0.0, 'es_10k': 5.0,
           'em_2k': 19.0, 'es_2k': 59.6}, 'codet5p')
  text = tables.render(tables.load_results([tmp_path]))
  assert '| Model | 10 Docs: 0 | 10 Docs: 4 | 10 Docs: 9 | 10 Docs: Avg. |' in text
  # Rows in the paper's order: tau = 1 before P_max; a missing cell and its average are '-'.
  assert '| flan_t5_xl tau = 1 | 58.0 | 44.0 | - | - |' in text
  assert '| w/ P_max | 60.0 | 50.0 | 40.0 | 50.0 |' in text
  assert text.index('tau = 1 | 58.0') < text.index('w/ P_max | 60.0')
  assert '| t5_large_lm tau = 1 | 35.9 | >1k | >1k |' in text  # Avg 1018 shown as >1k.
  assert '| w/ P_max | 34.7 | 45.5 | 40.1 |' in text
  assert '| Model | 1k | 2k | 10k | All |' in text  # Buckets in numeric order.
  assert '| codet5p tau = 1 | 19.6 | 19.0 | 0.0 | 20.0 |' in text
  assert '| codet5p tau = 1 | 62.4 | 59.6 | 5.0 | 60.0 |' in text
  assert text.index('Language modeling') < text.index('Multi-document') < text.index('Code')
  out = tmp_path / 'report.md'
  assert report.main([str(tmp_path), '--output', str(out)]) == 0
  assert out.read_text() == text


_RUN = {'task': 'passkey', 'split': 'test', 'checkpoint': {'sha256': 'a' * 64},
        'checkpoint_path': '/ckpt/checkpoint_5000', 'gin': 'EVAL_OUTPUT_DIR = ...',
        'num_examples': 4, 'examples_sha256': 'b' * 64, 'mode': 'greedy',
        'max_decode_length': 64, 'params_dtype': 'float32',
        'config': {'dtype': 'float32', 'attention_impl': 'auto'}, 'mesh': {'data': 1}}


def _run_result(folder, accuracy, **changes):
  """A task folder as t5align.eval leaves it: metrics.json and run.json (`changes` to _RUN:
  dotted keys into its objects)."""
  run = json.loads(json.dumps(_RUN))
  for key, value in changes.items():
    *parents, last = key.split('.')
    node = run
    for parent in parents:
      node = node[parent]
    node[last] = value
  fileio.write_json_atomic(folder / 'passkey' / 'run.json', run)
  fileio.write_json_atomic(folder / 'passkey' / 'metrics.json', {
      'task': 'passkey', 'model': 'retrieval_t5', 'label': 'tau = 1', 'table': 'retrieval',
      'group': 'Passkey', 'column': '2k', 'metrics': {'accuracy': accuracy},
      'primary_metric': 'accuracy'})


@pytest.mark.parametrize('changes, shown', [
    ({'max_decode_length': 2}, 'max_decode_length=2'),
    # run.json of format 1, read as today's: its params_dtype a setting of the checkpoint.
    ({'config.dtype': 'bfloat16', 'params_dtype': 'bfloat16'},
     'config.dtype=bfloat16, settings.checkpoint.params_dtype=bfloat16'),
    ({'config.attention_impl': 'blockwise'}, 'config.attention_impl=blockwise'),
    ({'num_examples': 2, 'examples_sha256': 'c' * 64}, 'examples_sha256=cccccccc, num_examples=2'),
    ({'checkpoint.sha256': 'd' * 64}, 'checkpoint.sha256=dddddddd'),
])
def test_report_keeps_two_runs_of_one_cell_apart(tmp_path, changes, shown):
  """Two runs whose only difference is what the label does not show (decode length, dtypes,
  attention, examples, checkpoint content: here in folders of the same name) are two rows,
  each naming its folder and the differing settings; given the other way round, the same."""
  base, other = tmp_path / 'x' / 'runs', tmp_path / 'y' / 'runs'
  _run_result(base, 100.0)
  _run_result(other, 0.0, **changes)
  for order in ((base, other), (other, base)):
    text = tables.render(tables.load_results(order))
    rows = [line for line in text.splitlines() if 'tau = 1' in line]
    assert len(rows) == 2, text
    assert any(f'tau = 1 [{other}, {shown}] | 0.0 | 0.0 |' in row for row in rows), text
    assert any(f'tau = 1 [{base}, ' in row and row.endswith('| 100.0 | 100.0 |')
               for row in rows), text


def test_report_counts_one_run_once_and_refuses_what_it_cannot_tell_apart(tmp_path):
  _run_result(tmp_path / 'a', 50.0)
  assert len(tables.load_results([tmp_path / 'a', tmp_path / 'a'])) == 1  # Given twice.
  _run_result(tmp_path / 'copy', 50.0)  # The same run, copied: identical settings and metrics.
  assert len(tables.load_results([tmp_path / 'a', tmp_path / 'copy'])) == 1
  _run_result(tmp_path / 'rescored', 40.0)  # Equal settings, other metrics.
  with pytest.raises(ValueError, match='record the same run .* with different metrics'):
    tables.load_results([tmp_path / 'a', tmp_path / 'rescored'])
  (tmp_path / 'rescored' / 'passkey' / 'run.json').unlink()
  with pytest.raises(ValueError, match='has no run.json to tell the runs apart'):
    tables.load_results([tmp_path / 'a', tmp_path / 'rescored'])


def test_report_without_results(tmp_path, capsys):
  with pytest.raises(SystemExit):
    report.main([str(tmp_path)])
  assert 'no metrics.json' in capsys.readouterr().err


def test_report_lists_unfinished_runs_under_the_table(tmp_path, capsys):
  """A folder with predictions and run.json but no metrics.json (a killed eval) used to vanish
  from the report without a word."""
  _run_result(tmp_path / 'done', 50.0)
  killed = tmp_path / 'killed' / 'passkey'
  killed.mkdir(parents=True)
  (killed / 'run.json').write_text(json.dumps(_RUN))
  (killed / 'predictions.jsonl').write_text('{"index": 0}\n')
  out = tmp_path / 'report.md'
  assert report.main([str(tmp_path / 'done'), str(tmp_path / 'killed'), '--output',
                      str(out)]) == 0
  text = out.read_text()
  assert text.endswith('Left out, unfinished (a run.json or predictions.jsonl, no metrics.json: '
                       'an eval killed, failed or still running; rerun it to finish), 1 task '
                       f'folder:\n\n- {killed}\n'), text
  assert '| retrieval_t5 tau = 1 | 50.0 | 50.0 |' in text
  with pytest.raises(SystemExit):  # Nothing finished: the error names what is unfinished.
    report.main([str(tmp_path / 'killed')])
  assert f'no metrics.json under {tmp_path / "killed"} (1 unfinished task folders: {killed})' in (
      capsys.readouterr().err)


def _checkpoint_result(folder, column, sha, accuracy):
  """passkey at `column` of checkpoint `sha` (None: no run.json), of model retrieval_t5."""
  task = folder / f'passkey_{column}'
  if sha is not None:
    fileio.write_json_atomic(task / 'run.json', {**_RUN, 'checkpoint': {'sha256': sha}})
  fileio.write_json_atomic(task / 'metrics.json', {
      'task': 'passkey', 'model': 'retrieval_t5', 'label': 'tau = 1', 'table': 'retrieval',
      'group': 'Passkey', 'column': column, 'metrics': {'accuracy': accuracy},
      'primary_metric': 'accuracy'})


def test_report_splits_a_row_of_two_checkpoints(tmp_path):
  """Cells of one row (model, label) from two checkpoints of one MODEL_DIR (one model name)
  used to average into one row naming neither; each checkpoint is now a row."""
  _checkpoint_result(tmp_path / 'early', '2k', 'a' * 64, 10.0)
  _checkpoint_result(tmp_path / 'late', '4k', 'd' * 64, 90.0)
  text = tables.render(tables.load_results([tmp_path / 'early', tmp_path / 'late']))
  assert '| retrieval_t5 tau = 1 [checkpoint=aaaaaaaa] | 10.0 | - | - |' in text, text
  assert '| tau = 1 [checkpoint=dddddddd] | - | 90.0 | - |' in text, text
  _checkpoint_result(tmp_path / 'same', '4k', 'a' * 64, 90.0)  # One checkpoint: one row.
  text = tables.render(tables.load_results([tmp_path / 'early', tmp_path / 'same']))
  assert '| retrieval_t5 tau = 1 | 10.0 | 90.0 | 50.0 |' in text, text
  _checkpoint_result(tmp_path / 'unknown', '8k', None, 30.0)  # Two checkpoints and one unknown.
  with pytest.raises(ValueError, match=r'passkey_8k/metrics\.json \(no run\.json, so no '
                                       r'checkpoint recorded\) shares a table row with results '
                                       r'of 2 checkpoints'):
    tables.load_results([tmp_path / 'early', tmp_path / 'late', tmp_path / 'unknown'])


def test_report_shows_a_nan_metric_as_nan(tmp_path):
  """NaN (evaluated, the metric broken) is not '-' (not evaluated)."""
  _run_result(tmp_path / 'a', float('nan'))
  text = tables.render(tables.load_results([tmp_path / 'a']))
  assert '| retrieval_t5 tau = 1 | NaN | NaN |' in text, text
  assert markdown.fmt(None, 'retrieval') == '-'


# ---------------------------------------------------------------------------------------------
# Command line and end to end (seqio).


@pytest.fixture(scope='module')
def e2e_env(tmp_path_factory):
  pytest.importorskip('seqio')
  sentencepiece = pytest.importorskip('sentencepiece')
  root = tmp_path_factory.mktemp('e2e')
  buf = io.BytesIO()
  text = ['The grass is green. The sky is blue. The sun is yellow. Here we go. There and back.',
          'What is the pass key? The pass key is 12345. Remember it.', '0123456789',
          'line a-b: REGISTER_CONTENT is <2416> Tell me what is the number in line']
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(text * 10), model_writer=buf, vocab_size=100, model_type='unigram',
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, hard_vocab_limit=False,
      minloglevel=2)
  (root / 'tiny.model').write_bytes(buf.getvalue())
  lines = root / 'data' / 'longeval' / 'lines' / '200_lines.jsonl'
  lines.parent.mkdir(parents=True)
  lines.write_text(''.join(json.dumps({
      'prompt': f'line a-b: REGISTER_CONTENT is <{100 + i}>\nline c-d: REGISTER_CONTENT is <7>\n'
                'Tell me what is the number in line a-b?', 'expected_number': 100 + i}) + '\n'
                           for i in range(4)))
  env = dict(os.environ, T5ALIGN_VOCABULARY=str(root / 'tiny.model'),
             T5ALIGN_DATA_DIR=str(root / 'data'), JAX_PLATFORMS='cpu',
             PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get('PYTHONPATH', '')]))
  return root, env


def _cli_args(out: pathlib.Path) -> list[str]:
  return ['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/tiny.gin',
          # The t5x fixture's sizes (gin/models/tiny.gin has smaller ones).
          '--gin.NUM_EMBEDDINGS=128', '--gin_bindings=network.T5Config.emb_dim = 64',
          '--gin_bindings=network.T5Config.head_dim = 16',
          '--gin_bindings=network.T5Config.mlp_dim = 128',
          '--gin_bindings=seqio_tasks.options.passkey_examples = 5',
          f'--gin.CHECKPOINT_PATH={FIXTURE}', f'--gin.EVAL_OUTPUT_DIR={out}',
          '--gin.MIXTURE_OR_TASK_NAME=t5align_passkey_2k,t5align_lines_200',
          '--gin.BATCH_SIZE=1', '--gin.MAX_DECODE_LENGTH=8']


def _indices(path: pathlib.Path) -> list[int]:
  return [json.loads(line)['index'] for line in path.read_text().splitlines()]


@pytest.mark.cli
@pytest.mark.tensorflow
@pytest.mark.usefixtures('clean_gin')
def test_end_to_end_kill_and_resume(e2e_env, monkeypatch):
  root, env = e2e_env
  out = root / 'out'
  passkey = out / 't5align_passkey_2k' / 'predictions.jsonl'
  cmd = [sys.executable, '-m', 't5align.eval', *_cli_args(out)]
  proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, start_new_session=True)
  try:
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and proc.poll() is None:
      if passkey.exists() and len(passkey.read_text().splitlines()) >= 2:
        break
      time.sleep(0.1)
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    # A second run into the same folder while the first runs is refused at once, naming it.
    with pytest.raises(outputs.OutputLockedError, match=rf'in use by another run \(pid={proc.pid}'):
      with outputs.claim(out, 'EVAL_OUTPUT_DIR'):
        pass
    os.killpg(proc.pid, signal.SIGKILL)  # Mid-run: some passkey examples done, lines not begun.
  finally:
    proc.wait()
    proc.stderr.close()
  before = {json.loads(l)['index']: json.loads(l) for l in passkey.read_text().splitlines()}
  assert 2 <= len(before) < 5
  assert not (out / 't5align_passkey_2k' / 'metrics.json').exists()
  # Also a record torn mid-write, as a kill during the write would leave it.
  with open(passkey, 'a') as f:
    f.write('{"index": 4, "prediction": "tor')

  for key in ('T5ALIGN_VOCABULARY', 'T5ALIGN_DATA_DIR'):
    monkeypatch.setenv(key, env[key])
  from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(REPO_ROOT)
  results = t5align_eval.main(_cli_args(out))

  assert sorted(results) == ['t5align_lines_200', 't5align_passkey_2k']
  assert _indices(passkey) == list(range(5))  # Each example exactly once, torn line gone.
  lines = out / 't5align_lines_200' / 'predictions.jsonl'
  assert _indices(lines) == list(range(4))
  after = {json.loads(l)['index']: json.loads(l) for l in passkey.read_text().splitlines()}
  assert all(after[i] == before[i] for i in before)  # Nothing redone.
  for task, n in (('t5align_passkey_2k', 5), ('t5align_lines_200', 4)):
    metrics = json.loads((out / task / 'metrics.json').read_text())
    records = [json.loads(l) for l in (out / task / 'predictions.jsonl').read_text().splitlines()]
    assert metrics['num_examples'] == n and metrics['label'] == 'tau = 1'
    # The task metric agrees with the per-example scores.
    mean = 100 * np.mean([r['scores']['accuracy'] for r in records])
    assert metrics['metrics']['accuracy'] == pytest.approx(mean)
    assert all(r['tau'] == [1.0] and isinstance(r['prediction'], str) for r in records)
  assert 'Retrieval accuracy' in tables.render(tables.load_results([out]))


@pytest.mark.cli
@pytest.mark.tensorflow
def test_a_folder_recorded_before_record_formats_resumes(e2e_env, monkeypatch, tmp_path,
                                                          clean_gin):
  """tests/testdata/old_gin_names/eval_run_58d8be9.json is the run.json 58d8be9 wrote (format
  1: gin's bindings under the jobs' old names, settings at the top level; its README has the
  command). A task folder holding it and the first predictions of that command resumes with
  today's code (`run_identity.upgrade` on read), leaving run.json as it was, and ends with the
  predictions and metrics of the same command run through at once."""
  root, env = e2e_env
  for key in ('T5ALIGN_VOCABULARY', 'T5ALIGN_DATA_DIR'):
    monkeypatch.setenv(key, env[key])
  monkeypatch.chdir(REPO_ROOT)
  from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top
  args = ['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/tiny.gin',
          '--gin.NUM_EMBEDDINGS=128', '--gin_bindings=network.T5Config.emb_dim = 64',
          '--gin_bindings=network.T5Config.head_dim = 16',
          '--gin_bindings=network.T5Config.mlp_dim = 128', f'--gin.CHECKPOINT_PATH={FIXTURE}',
          '--gin.MIXTURE_OR_TASK_NAME=t5align_lines_200', '--gin.BATCH_SIZE=1',
          '--gin.MAX_DECODE_LENGTH=8', '--gin_bindings=jobs.EvalJob.temperature = 0.9']
  whole, resumed = tmp_path / 'whole', tmp_path / 'resumed'
  t5align_eval.main([*args, f'--gin.EVAL_OUTPUT_DIR={whole}'])
  task = 't5align_lines_200'
  recorded = (REPO_ROOT / 'tests/testdata/old_gin_names/eval_run_58d8be9.json').read_bytes()
  assert 'format' not in json.loads(recorded)
  (resumed / task).mkdir(parents=True)
  (resumed / task / 'run.json').write_bytes(recorded)
  lines = (whole / task / 'predictions.jsonl').read_text().splitlines(keepends=True)
  (resumed / task / 'predictions.jsonl').write_text(''.join(lines[:2]))
  clean_gin.clear_config()
  t5align_eval.main([*args, f'--gin.EVAL_OUTPUT_DIR={resumed}'])
  for name in ('predictions.jsonl', 'metrics.json'):
    assert (resumed / task / name).read_bytes() == (whole / task / name).read_bytes(), name
  assert (resumed / task / 'run.json').read_bytes() == recorded  # Read as today's, not rewritten.
  assert json.loads((whole / task / 'run.json').read_text())['format'] == run_identity.FORMAT
  assert 'EvalJob.temperature = 0.9' in (whole / task / 'config.gin').read_text()


# Settings refused before any weight is read.


@pytest.mark.parametrize('settings, message', [
    ({'batch_size': 'abc'}, r"^jobs\.EvalJob\.batch_size = 'abc': expected a positive integer\.$"),
    ({'batch_size': 0}, r'^jobs\.EvalJob\.batch_size = 0: expected a positive integer\.$'),
    ({'batch_size': -1}, r'^jobs\.EvalJob\.batch_size = -1: expected a positive integer\.$'),
    # 0 does not become the task's default.
    ({'max_decode_length': -3}, r'^jobs\.EvalJob\.max_decode_length = -3: expected a positive '
                                r"integer or None \(the task's\)\.$"),
    ({'max_decode_length': 0}, r'^jobs\.EvalJob\.max_decode_length = 0: expected a positive'),
    ({'num_examples': 2.0}, r'^jobs\.EvalJob\.num_examples = 2\.0: expected a positive integer '
                            r'or None \(all\)\.$'),
    ({'allow_schedule_mismatch': 'yes'}, r"^jobs\.EvalJob\.allow_schedule_mismatch = 'yes': "
                                         r'expected True or False\.$'),
    ({'temperature': 'abc'}, r"^jobs\.EvalJob\.temperature = 'abc': expected a temperature, "
                             r'finite and > 0, in float32 too .* or None \(the config\'s\)\.$'),
    ({'temperature': (0.9, -1.0)}, r'^jobs\.EvalJob\.temperature = \(0\.9, -1\.0\): expected '
                                   r'.* \(-1\.0 is not\)\.$'),
    ({'split': ''}, r"^jobs\.EvalJob\.split = '': expected a non-blank string\.$"),
    # Built in the test: the checkpoint's settings are refused as it is built.
    (lambda: {'checkpoint': jobs.Checkpoint('/no/such', params_dtype='int8')},
     r"jobs\.Checkpoint\.params_dtype = 'int8': expected a floating dtype's name"),
])
def test_eval_run_settings_are_checked_first(settings, message, tmp_path):
  with pytest.raises(ValueError, match=message):
    settings = settings() if callable(settings) else settings
    jobs.EvalJob(**{'checkpoint': jobs.Checkpoint('/no/such'), 'mixture_or_task_name': 't',
                    'output_dir': str(tmp_path / 'out'), **settings}).run()


def test_temperature_of_the_wrong_form_names_the_flag_and_file(tmp_path):
  config = network.T5Config(vocab_size=32, num_encoder_layers=3)
  with pytest.raises(ValueError, match=r'TEMPERATURE=\(0\.9, 0\.8\): give one temperature, or 3 '
                                       r'numbers \(one per encoder layer of checkpoint C, which '
                                       r'has 3\); got 2 values'):
    temperature.make_temperature(config, (0.9, 0.8), model='checkpoint C')
  with pytest.raises(ValueError, match=r"TEMPERATURE='abc' is not a temperature: give a number "
                                       r'\(e\.g\. TEMPERATURE=0\.8\) or a tuple of 3'):
    temperature.make_temperature(config, 'abc')
  cals = {'pmax_per_layer': tuple(schedule.Calibration(
      'pmax_per_layer', L, 256, (0.9,) * 5) for L in (512, 1024))}
  path = tmp_path / 's.json'
  schedule.TemperatureSchedule(256, cals, 'pmax_per_layer').save(str(path))
  with pytest.raises(ValueError, match=rf"temperature schedule {path} \(SCHEDULE_PATH\): strategy "
                                       r"'pmax_per_layer' has 5 per-layer taus but checkpoint C "
                                       r'has 3 encoder layers'):
    temperature.make_temperature(config, schedule_path=str(path), model='checkpoint C')
  assert temperature.make_temperature(config, (0.9, 0.8, 0.7)).constant == (0.9, 0.8, 0.7)


@pytest.mark.slow
@pytest.mark.tensorflow
def test_a_nan_schedule_target_is_refused_before_the_checkpoint_loads(tmp_path, monkeypatch):
  from t5align import jobs  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(runs.VOCAB))
  path = runs.schedule_with_target(tmp_path / 's.json', float('nan'))

  def fail(*unused_args, **unused_kwargs):
    raise AssertionError('the checkpoint was read before the error')

  monkeypatch.setattr(checkpoints, 'load_params', fail)
  with pytest.raises(ValueError, match=rf"temperature schedule {path}: calibrations\['pmax'\]"
                                       r"\[0\]\['target'\] holds nan"):
    jobs.EvalJob(checkpoint=jobs.Checkpoint(str(runs.CKPT)), mixture_or_task_name=runs.TASK,
                 output_dir=str(tmp_path / 'out'), schedule_path=str(path), num_examples=2,
                 max_decode_length=4).run()


@pytest.mark.tensorflow
def test_vocabulary_larger_than_the_embedding_is_refused_before_work(tmp_path, repo_gin,
                                                                     monkeypatch, no_load):
  big = runs.vocabulary(tmp_path / 'big.model', extra_pieces=2000)
  monkeypatch.setenv('T5ALIGN_VOCABULARY', big)
  with pytest.raises(ValueError, match=rf'vocabulary {big} \(task {runs.TASK}\) has 3000 pieces '
                                       rf'but checkpoint {runs.CKPT} embeds 1024 ids: ids '
                                       r'1024\.\.2999'):
    conftest.run_eval(*runs.eval_args(tmp_path / 'out', runs.CKPT))
  assert not (tmp_path / 'out' / runs.TASK / 'predictions.jsonl').exists()
  # Ids out of range are refused wherever tokens meet the model.
  with pytest.raises(ValueError, match=r"inputs: token ids \[1024\] are outside the model's "
                                       r'0\.\.1023'):
    validate.token_ids(np.array([[5, 1024, 1]]), 1024, 'inputs')
  # Train: a vocabulary already in MODEL_DIR that the model cannot embed.
  model_dir = tmp_path / 'train'
  model_dir.mkdir()
  shutil.copy(big, model_dir / assets.VOCAB_FILE)
  model = network.Transformer(network.T5Config(vocab_size=1024, emb_dim=8, num_heads=2,
                                               num_encoder_layers=1, num_decoder_layers=1,
                                               head_dim=4, mlp_dim=16))
  with pytest.raises(ValueError, match=r'sentencepiece.model has 3000 pieces but the model '
                                       r'\(network.T5Config.vocab_size=1024\) embeds 1024 ids'):
    jobs.TrainJob(model=model, model_dir=str(model_dir), num_steps=1, eval_lengths=()).run()
  assert not list(model_dir.glob('checkpoint_*'))


# A rerun into finished results: refused unless it is the same run (run.json).


# Its tests share one xdist worker: it runs once (~15 s), and they rerun into it in order.
@pytest.fixture(scope='module')
def finished_eval(tmp_path_factory):
  """(output folder, checkpoint copy): a finished eval of 2 passkey examples at tau = 1."""
  root = tmp_path_factory.mktemp('eval')
  checkpoint = root / 'model' / 'checkpoint_5000'
  shutil.copytree(runs.CKPT, checkpoint)
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv('T5ALIGN_VOCABULARY', str(runs.VOCAB))
    mp.chdir(REPO_ROOT)
    conftest.run_eval(*runs.eval_args(root / 'out', checkpoint))
  folder = root / 'out' / runs.TASK
  assert sorted(p.name for p in folder.iterdir()) == ['config.gin', 'metrics.json',
                                                      'predictions.jsonl', 'run.json']
  return root / 'out', checkpoint


@pytest.mark.cli
@pytest.mark.tensorflow
@pytest.mark.xdist_group('run_identity_finished_eval')
def test_a_replaced_checkpoint_at_the_same_path_is_another_run(finished_eval, tmp_path,
                                                               repo_gin, monkeypatch):
  out, checkpoint = finished_eval
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(runs.VOCAB))
  params, _ = checkpoints.load_params(str(checkpoint))
  params['decoder']['decoder_norm']['scale'] = params['decoder']['decoder_norm']['scale'] * 1.5
  other = checkpoints.save_t5x_checkpoint(params, str(tmp_path), 5000)
  moved = checkpoint.parent / 'moved'
  checkpoint.rename(moved)
  shutil.copytree(other, checkpoint)  # Other weights, same path.
  try:
    with pytest.raises(run_identity.RunMismatchError,
                       match=r'holds results of a different run; differing fields \(before -> '
                             r"now\): checkpoint\.bytes: .*checkpoint\.sha256: '[0-9a-f]{64}' -> "
                             r"'[0-9a-f]{64}'\. Use another output folder"):
      conftest.run_eval(*runs.eval_args(out, checkpoint))
  finally:
    shutil.rmtree(checkpoint)
    moved.rename(checkpoint)
  # The same weights under another path are the same run (the path is only informational).
  copy = tmp_path / 'elsewhere' / 'checkpoint_5000'
  shutil.copytree(checkpoint, copy)
  before = (out / runs.TASK / 'predictions.jsonl').read_bytes()
  conftest.run_eval(*runs.eval_args(out, copy))
  assert (out / runs.TASK / 'predictions.jsonl').read_bytes() == before


@pytest.mark.cli
@pytest.mark.tensorflow
@pytest.mark.xdist_group('run_identity_finished_eval')
def test_another_vocabulary_file_is_another_run(finished_eval, tmp_path, repo_gin,
                                                monkeypatch):
  out, checkpoint = finished_eval
  monkeypatch.setenv('T5ALIGN_VOCABULARY', runs.vocabulary(tmp_path / 'other.model', rescore=True))
  with pytest.raises(run_identity.RunMismatchError,
                     match=r'differing fields \(before -> now\): .*vocabulary\.sha256'):
    conftest.run_eval(*runs.eval_args(out, checkpoint))


@pytest.mark.cli
@pytest.mark.tensorflow
@pytest.mark.xdist_group('run_identity_finished_eval')
def test_another_task_seed_is_another_run(finished_eval, repo_gin, monkeypatch):
  out, checkpoint = finished_eval
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(runs.VOCAB))
  with pytest.raises(run_identity.RunMismatchError,
                     match=r'task_options\.seed: 0 -> 7'):
    conftest.run_eval(*runs.eval_args(out, checkpoint,
                                      '--gin_bindings=seqio_tasks.options.seed = 7'))


@pytest.mark.cli
@pytest.mark.tensorflow
@pytest.mark.xdist_group('run_identity_finished_eval')
def test_records_without_run_json_are_refused_and_metrics_state_the_records_taus(
    finished_eval, repo_gin, monkeypatch):
  out, checkpoint = finished_eval
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(runs.VOCAB))
  folder = out / runs.TASK
  metrics = json.loads((folder / 'metrics.json').read_text())
  assert metrics['record_temperatures'] == {'distinct': 1, 'min': [1.0], 'max': [1.0],
                                            'values': [[1.0]]}
  run_json = (folder / 'run.json').read_text()
  (folder / 'run.json').unlink()
  try:
    with pytest.raises(run_identity.RunMismatchError,
                       match=rf'{folder} holds results but no record of the run that made them'):
      conftest.run_eval(*runs.eval_args(out, checkpoint, '--gin.TEMPERATURE=0.5'))
    # A run.json edited to say 0.5: metrics come from the records, which say 1.0.
    edited = json.loads(run_json)
    edited['temperature'], edited['label'] = 0.5, 'tau = 0.5'
    (folder / 'run.json').write_text(json.dumps(edited))
    with pytest.raises(ValueError, match=r'records were made at temperatures \[\(1\.0,\)\], not '
                                         r"this run's 0\.5"):
      conftest.run_eval(*runs.eval_args(out, checkpoint, '--gin.TEMPERATURE=0.5'))
  finally:
    (folder / 'run.json').write_text(run_json)
  assert json.loads((folder / 'metrics.json').read_text())['temperature'] == 1.0


@pytest.mark.cli
@pytest.mark.tensorflow
def test_eval_through_a_repointed_link_uses_one_checkpoint_and_a_resume_is_refused(
    tmp_path, monkeypatch):
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(runs.VOCAB))
  monkeypatch.chdir(REPO_ROOT)
  eight, twelve = runs.two_checkpoints(tmp_path, runs.CKPT)
  link = tmp_path / 'current'
  os.symlink(eight, link)
  fingerprint = run_identity.checkpoint_fingerprint

  def fingerprint_then_repoint(path, **kwargs):
    found = fingerprint(path, **kwargs)
    runs.point(link, twelve)
    return found

  # The reference: the same eval of checkpoint_8 and of checkpoint_12, by their own paths.
  for name, path in (('ref8', eight), ('ref12', twelve)):
    conftest.run_eval(*runs.eval_args(tmp_path / name, path, '--gin.MODEL_NAME=m'))
  reference = {n: (tmp_path / n / runs.TASK / 'predictions.jsonl').read_bytes()
               for n in ('ref8', 'ref12')}
  assert reference['ref8'] != reference['ref12']  # The two models' records differ.
  with monkeypatch.context() as m:
    m.setattr(run_identity, 'checkpoint_fingerprint', fingerprint_then_repoint)
    conftest.run_eval(*runs.eval_args(tmp_path / 'out', str(link), '--gin.MODEL_NAME=m'))
  folder = tmp_path / 'out' / runs.TASK
  assert (folder / 'predictions.jsonl').read_bytes() == reference['ref8']
  recorded = json.loads((folder / 'run.json').read_text())
  assert recorded['checkpoint'] == fingerprint(eight)
  assert (recorded['checkpoint_path'], recorded['checkpoint_resolved_path']) == (
      str(link), os.path.realpath(eight))
  # The link now names checkpoint_12: resuming into the folder is refused, naming the setting.
  with pytest.raises(run_identity.RunMismatchError,
                     match=rf"checkpoint\.sha256: '[0-9a-f]{{64}}' -> '[0-9a-f]{{64}}'\. "
                           r'Use another output folder \(or move this one away\)\. '
                           rf'CHECKPOINT_PATH reads another checkpoint than the one these '
                           rf'results were made from: {link} -> {twelve} now, {link} -> '
                           rf'{os.path.realpath(eight)} then\.'):
    conftest.run_eval(*runs.eval_args(tmp_path / 'out', str(link), '--gin.MODEL_NAME=m'))
  assert (folder / 'predictions.jsonl').read_bytes() == reference['ref8']


def test_a_models_bias_rule_names_its_report_row():
  """gin's BIAS_RULE with a constant temperature: the row says so ('tau = 0.8 (bias ...)'), so a
  report never puts it beside the same tau without the rule under one label."""
  from t5align.attention import reference  # pylint: disable=g-import-not-at-top
  config = network.T5Config(vocab_size=32, num_encoder_layers=2, num_heads=2)
  assert temperature.make_temperature(config, 0.8).label == 'tau = 0.8'
  ruled = config.replace(encoder_bias_rule=reference.BiasRule('interpolate', reference_length=256))
  assert (temperature.make_temperature(ruled, 0.8).label
          == 'tau = 0.8 (bias interpolate (s = L_tr / L, L_tr = 256))')
  assert temperature.make_temperature(ruled, 0.8, label='mine').label == 'mine'
