"""The settings objects gin builds for the jobs (jobs.Checkpoint, calibration.SearchSettings,
training.OptimizerConfig, train_data.Mix): built by the run files from the same macros, set
through the jobs' fields of before with a warning, recorded in run.json under those fields."""
from __future__ import annotations

import warnings

import pytest

from t5align import calibration
from t5align import gin_cli
from t5align import jobs
from t5align import network
from t5align import training
from t5align.jobs import common
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


def test_an_old_field_binding_sets_the_object_and_warns_once(clean_gin):
  import t5align.calibrate  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  common._WARNED.discard('jobs.CalibrationJob.tol')  # pylint: disable=protected-access
  gin_cli.configure([*_CALIBRATE, '--gin_bindings=jobs.CalibrationJob.tol = 0.01'], prog='t')
  with pytest.warns(FutureWarning, match=r'jobs\.CalibrationJob\.tol is the old place of '
                                         r'calibration\.SearchSettings\.tol'):
    job = gin_cli.call_configured('t5align.jobs.CalibrationJob')
  assert job.search.tol == 0.01 and job.search.batch_size == 1  # The file's BATCH_SIZE kept.
  with warnings.catch_warnings():
    warnings.simplefilter('error')  # Once per process.
    assert gin_cli.call_configured('t5align.jobs.CalibrationJob').search.tol == 0.01


def test_old_python_keywords_land_in_the_objects():
  model = network.Transformer(network.T5Config(vocab_size=1024))
  with pytest.warns(FutureWarning):
    job = jobs.TrainJob(model=model, model_dir='/m', learning_rate=0.5, optimizer='adafactor',
                        mix={'kv': 1.0}, min_units={'kv': 2}, initial_checkpoint_path='/c')
  assert job.optimizer == training.OptimizerConfig(learning_rate=0.5, name='adafactor')
  assert job.mix == train_data.Mix(weights={'kv': 1.0}, min_units={'kv': 2})
  assert job.initial_checkpoint == jobs.Checkpoint('/c', flag='INITIAL_CHECKPOINT_PATH')
  # The identity reads them where they are now, under the names run.json always had.
  settings = job.settings()
  assert (settings['learning_rate'], settings['optimizer'], settings['mix'],
          settings['min_units']) == (0.5, 'adafactor', {'kv': 1.0}, {'kv': 2})


def test_a_second_place_for_num_steps_or_l_tr_must_agree():
  model = network.Transformer(network.T5Config(vocab_size=1024))
  job = jobs.TrainJob(model=model, model_dir='/m', num_steps=10,
                      optimizer=training.OptimizerConfig(total_steps=20))
  with pytest.raises(ValueError, match=r'training\.OptimizerConfig\.total_steps=20 but '
                                       r'NUM_STEPS \(jobs\.TrainJob\) is 10'):
    job.check()
  job = jobs.TrainJob(model=model, model_dir='/m', mix=train_data.Mix(max_length=64))
  with pytest.raises(ValueError, match=r'train_data\.Mix\.max_length=64 but L_TR'):
    job.check()


def test_run_json_records_the_objects_under_the_fields_of_before(clean_gin):
  import t5align.calibrate  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  gin_cli.configure(_CALIBRATE, prog='t')
  record = common.gin_record(jobs.CalibrationJob)
  job = 't5align.jobs.CalibrationJob'
  # What 0f3d22d's calibration log header held for these bindings (as calibrate.run.NAME).
  assert {k: record[k] for k in (f'{job}.checkpoint_path', f'{job}.params_dtype',
                                 f'{job}.batch_size', f'{job}.tau_batch_size')} == {
      f'{job}.checkpoint_path': '%CHECKPOINT_PATH', f'{job}.params_dtype': '%PARAMS_DTYPE',
      f'{job}.batch_size': '%BATCH_SIZE', f'{job}.tau_batch_size': '%TAU_BATCH_SIZE'}
  assert not [k for k in record if 'Checkpoint.' in k or 'SearchSettings.' in k
              or k in (f'{job}.checkpoint', f'{job}.search')]
  # A setting with no field of before is recorded where it is bound.
  clean_gin.clear_config()
  gin_cli.configure([*_CALIBRATE, '--gin_bindings=calibration.SearchSettings.points = 3'],
                    prog='t')
  assert common.gin_record(jobs.CalibrationJob)[
      't5align.calibration.SearchSettings.points'] == '3'


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
