"""The settings objects gin builds for the jobs (jobs.Checkpoint, calibration.SearchSettings,
training.OptimizerConfig, train_data.Mix): built by the run files from the macros, the only
place each setting is (the jobs' flat fields of before were removed in 0.2.0)."""
from __future__ import annotations

import pytest

from t5align import calibration
from t5align import gin_cli
from t5align import jobs
from t5align import network
from t5align import training
from t5align.shipped import train_data

_CALIBRATE = ['--gin_file=gin/calibrate.gin', '--gin.CHECKPOINT_PATH=/ckpt',
              '--gin.OUTPUT_PATH=/out/schedule.json', '--gin.TEXT_FILE=/corpus.txt',
              '--gin.VOCABULARY_PATH=/spm.model']


def test_the_run_file_builds_the_objects_from_its_macros(clean_gin):
  import t5align.calibrate  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  gin_cli.configure([*_CALIBRATE, '--gin.PARAMS_DTYPE=bfloat16', '--gin.BATCH_SIZE=2',
                     '--gin_bindings=calibration.SearchSettings.grid = (1.0, 0.9)'], prog='t')
  job = gin_cli.call_configured('t5align.jobs.CalibrationJob')
  assert job.checkpoint == jobs.Checkpoint('/ckpt', params_dtype='bfloat16')
  assert job.search == calibration.SearchSettings(grid=(1.0, 0.9), batch_size=2)


def test_an_old_field_binding_is_refused_by_gin(clean_gin):
  import t5align.calibrate  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  with pytest.raises(ValueError, match=r"CalibrationJob.* parameter named 'tol'"):
    gin_cli.configure([*_CALIBRATE, '--gin_bindings=jobs.CalibrationJob.tol = 0.01'], prog='t')


@pytest.mark.parametrize('keyword, value', [
    ('learning_rate', 0.5), ('warmup_steps', 3), ('weight_decay', 0.1), ('schedule', 'wsd'),
    ('length_power', 2.0), ('min_units', {'kv': 2}), ('initial_checkpoint_path', '/c')])
def test_old_python_keywords_are_refused(keyword, value):
  model = network.Transformer(network.T5Config(vocab_size=1024))
  with pytest.raises(TypeError, match=rf"unexpected keyword argument '{keyword}'"):
    jobs.TrainJob(model=model, model_dir='/m', **{keyword: value})


@pytest.mark.parametrize('field, value, expected', [
    ('optimizer', 'adafactor', r'training\.OptimizerConfig'),
    ('mix', {'kv': 1.0}, r'train_data\.Mix'),
    ('initial_checkpoint', '/c', r'jobs\.Checkpoint')])
def test_a_value_where_a_settings_object_goes_is_refused_by_name(field, value, expected):
  model = network.Transformer(network.T5Config(vocab_size=1024))
  with pytest.raises(TypeError, match=rf'jobs\.TrainJob\.{field}=.*: expected a {expected}'):
    jobs.TrainJob(model=model, model_dir='/m', **{field: value})


def test_num_steps_and_l_tr_are_the_jobs_alone():
  # Stored once: the optimizer's schedule spans NUM_STEPS, the mix's budget is L_TR, passed
  # where they are used.
  assert 'total_steps' not in {f.name for f in _fields(training.OptimizerConfig)}
  assert 'max_length' not in {f.name for f in _fields(train_data.Mix)}
  model = network.Transformer(network.T5Config(vocab_size=1024))
  job = jobs.TrainJob(model=model, model_dir='/m', num_steps=10,
                      optimizer=training.OptimizerConfig(warmup_steps=2, schedule='cosine'))
  lr = job.optimizer.learning_rate_schedule(job.num_steps)
  assert float(lr(2)) == pytest.approx(1e-3) and float(lr(10)) == pytest.approx(1e-4)


def _fields(cls):
  import dataclasses  # pylint: disable=g-import-not-at-top
  return dataclasses.fields(cls)


def test_a_path_where_the_checkpoint_object_goes_is_refused_by_name():
  with pytest.raises(TypeError, match=r"jobs\.EvalJob\.checkpoint='/ckpt': expected a "
                                      r'jobs\.Checkpoint \(in gin: checkpoint = '
                                      r'@jobs\.Checkpoint\(\)'):
    jobs.EvalJob(checkpoint='/ckpt')


def test_a_checkpoint_path_that_is_not_a_path_is_refused_by_its_flag():
  with pytest.raises(ValueError, match=r'CHECKPOINT_PATH=5: expected the path of a checkpoint'):
    jobs.Checkpoint(5)
  with pytest.raises(ValueError, match=r'INITIAL_CHECKPOINT_PATH=\(1,\)'):
    jobs.Checkpoint((1,), flag='INITIAL_CHECKPOINT_PATH')
