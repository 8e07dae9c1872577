"""t5align/run_identity.py: a run is what its record says it is.

A result is extended or reused only by the run that made it (`check_same`, `check_run`): a folder
whose run failed before its first result takes the corrected rerun; a schedule is reused only for
the lengths and strategies it was calibrated for. Records of format 1 are upgraded once on read
(`upgrade`), unknown formats refused. The processes of one run compare their settings before any
weight is read (`check_same_processes`): started with different ones, every process refuses.
The eval's, calibration's and train's own refusals are in their jobs' tests (eval_test.py,
calibrate_test.py, train_test.py); the fields each record holds in identity_fields_test.py.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

import conftest
import runs

from t5align.attention import reference
from t5align import jobs
from t5align.jobs import eval_job
from t5align import network
from t5align import run_identity
from t5align.runtime import multihost
from t5align import schedule


def test_failed_start_leaves_the_folder_reusable(tmp_path):
  wrong, right = (run_identity.make(facts={'checkpoint': p}) for p in ('/wrong', '/right'))
  run_identity.check_run(tmp_path, wrong, kind='eval')  # Then the run failed.
  run_identity.check_run(tmp_path, right, kind='eval')  # The corrected rerun starts.
  assert json.loads((tmp_path / 'run.json').read_text()) == right


def test_a_schedule_is_reused_only_for_what_it_was_calibrated_for(tmp_path):
  cals = {'pmax': (schedule.Calibration('pmax', 2048, 256, 0.9),)}
  wanted = run_identity.make(facts={'checkpoint': {'sha256': 'a'}},
                             settings={'lengths': [2048], 'strategies': ['pmax']})
  saved = schedule.TemperatureSchedule(256, cals, 'pmax', provenance={'identity': wanted})
  saved.save(str(tmp_path / 'schedule.json'))
  loaded = schedule.load_schedule(str(tmp_path / 'schedule.json'))
  run_identity.check_same(loaded.provenance['identity'], wanted, kind='calibration', what='s',
                          hint='')
  other = {**wanted, 'settings': {**wanted['settings'], 'lengths': [512]}}
  with pytest.raises(run_identity.RunMismatchError,
                     match=r'settings\.lengths: \[2048\] -> \[512\]'):
    run_identity.check_same(loaded.provenance['identity'], other, kind='calibration',
                            what=str(tmp_path / 'schedule.json'), hint='Calibrate again.')
  with pytest.raises(run_identity.RunMismatchError, match='no record of the run'):
    run_identity.check_same(None, wanted, kind='calibration', what='schedule.json', hint='')


def test_a_format_1_record_is_upgraded_once_on_read():
  """58d8be9's run.json (format 1: tests/testdata/old_gin_names) read as today's: gin's
  bindings gone (config.gin holds them now), the settings moved into 'settings', what format 1
  left out at its default (truncate_inputs, RULER's task options, jax's matmul precision) given
  that default; every other field as it was."""
  recorded = json.loads((runs.REPO_ROOT / 'tests/testdata/old_gin_names/eval_run_58d8be9.json')
                        .read_text())
  upgraded = run_identity.upgrade(recorded, 'eval')
  assert upgraded['format'] == run_identity.FORMAT and 'gin' not in upgraded
  assert upgraded['settings'] == {'checkpoint': {'params_dtype': 'float32'}, 'split': 'test',
                                  'truncate_inputs': None}
  assert upgraded['jax_default_matmul_precision'] is None
  assert {k: upgraded['task_options'][k] for k in ('ruler_examples', 'ruler_budget')} == {
      'ruler_examples': 500, 'ruler_budget': 'upstream'}
  moved = {'gin', 'params_dtype', 'split', 'format', 'settings', 'jax_default_matmul_precision',
           'task_options', 'config'}
  assert {k: v for k, v in upgraded.items() if k not in moved} == {
      k: v for k, v in recorded.items() if k not in moved}
  # Format 3: the config gains T5's bias rule.
  assert upgraded['config'] == {**recorded['config'], 'encoder_bias_rule': str(
      reference.BiasRule())}
  assert run_identity.upgrade(upgraded, 'eval') == upgraded  # Once: it is today's format.
  # The job gin makes from the record's command records those settings.
  assert upgraded['settings'] == run_identity.settings_record(
      jobs.EvalJob(temperature=0.9, max_decode_length=8, batch_size=1))


@pytest.mark.parametrize('record, kind, message', [
    ({'format': 4}, 'eval', r'a run record is of format 4: this t5align reads formats 1 to 3'),
    ({'format': 'x'}, 'eval', r"a run record is of format 'x'"),
    ({}, 'evaluation', r"kind='evaluation'; expected one of \('eval', 'calibration'"),
])
def test_a_record_of_an_unknown_format_is_refused(record, kind, message):
  with pytest.raises(ValueError, match=message):
    run_identity.upgrade(record, kind)


@pytest.mark.tensorflow
def test_processes_started_with_different_temperatures_refuse_to_start(repo_gin, monkeypatch):
  """Process 0's and process 1's settings, as `evaluate` hands them to
  `run_identity.check_same_processes`, compared through the collective with process 1's fed in
  (two processes: test_two_processes_with_different_num_examples_both_refuse_to_start)."""
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(runs.VOCAB))
  seen = []

  class Stop(Exception):
    pass

  def capture(settings, what='settings'):
    seen.append(json.loads(json.dumps(settings)))
    raise Stop()

  monkeypatch.setattr(eval_job.run_identity, 'check_same_processes', capture)
  for tau in ('1.0', '0.5'):
    with pytest.raises(Stop):
      conftest.run_eval(*runs.eval_args(pathlib.Path('/tmp/unused'), runs.CKPT,
                                        f'--gin.TEMPERATURE={tau}'))
  monkeypatch.undo()
  monkeypatch.setattr(multihost.jax, 'process_count', lambda: 2)
  monkeypatch.setattr(multihost, 'gather_json', lambda values: values + [seen[1]])
  with pytest.raises(run_identity.RunMismatchError,
                     match=r'started with different settings \(process 0 -> the other\): '
                           r"process 1: .*gin\.TEMPERATURE: '1\.0' -> '0\.5'"):
    run_identity.check_same_processes(seen[0])
  monkeypatch.setattr(multihost, 'gather_json', lambda values: values + [seen[0]])
  run_identity.check_same_processes(seen[0])  # The same settings start.


@pytest.mark.multiprocess
@pytest.mark.cli
@pytest.mark.tensorflow
def test_two_processes_with_different_num_examples_both_refuse_to_start(tmp_path):
  port = runs.free_port()
  procs, logs = [], []
  for i, count in enumerate((8, 16)):
    env = dict(runs.ENV, JAX_NUM_PROCESSES='2', JAX_PROCESS_ID=str(i), JAX_PLATFORMS='cpu',
               JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', T5ALIGN_VOCABULARY=str(runs.VOCAB),
               T5ALIGN_DISTRIBUTED_TIMEOUT_S='60')
    logs.append(tmp_path / f'process{i}.log')
    with open(logs[-1], 'wb') as log:
      procs.append(subprocess.Popen(
          [sys.executable, '-m', 't5align.eval',
           *runs.eval_args(tmp_path / 'out', runs.CKPT, num_examples=count)],
          cwd=runs.REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
          start_new_session=True))
  try:
    codes = [p.wait(timeout=180) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
  texts = [log.read_text(errors='replace') for log in logs]
  assert codes == [1, 1], texts
  for text in texts:
    assert ('RunMismatchError: the processes were started with different settings '
            '(process 0 -> the other): process 1: arguments.num_examples: 8 -> 16; '
            "gin.NUM_EXAMPLES: '8' -> '16'") in text, text[-3000:]
  assert not (tmp_path / 'out' / runs.TASK).exists()


def test_a_format_2_record_reads_with_t5s_bias():
  """Format 2 (0.2.0: no bias rules) records the model's config without `encoder_bias_rule`;
  read as format 3, the config has T5's bias, as today's default records it: the folder
  resumes. Records without a config (calibration, demo) only change their format."""
  config = network.T5Config(vocab_size=32, num_encoder_layers=2, num_heads=2)
  today = {f.name: str(getattr(config, f.name)) for f in dataclasses.fields(config)}
  old = {'format': 2, 'config': {k: v for k, v in today.items() if k != 'encoder_bias_rule'},
         'settings': {}}
  upgraded = run_identity.upgrade(old, 'eval')
  assert upgraded == {'format': 3, 'config': today, 'settings': {}}
  assert run_identity.upgrade({'format': 2, 'settings': {}}, 'calibration') == {
      'format': 3, 'settings': {}}
  ruled = dataclasses.replace(config, encoder_bias_rule=reference.BiasRule(
      'none', reference_length=512))  # gin's default binds L_tr to every kind
  assert str(ruled.encoder_bias_rule) == today['encoder_bias_rule']
