"""Every field of every job and of every settings object a job holds (the model's config
among them) carries its check in its declaration (`t5align.fields.setting`), run when the object
is built: a bad value is refused there, naming the field in gin's form (and the macro that set
it), before anything loads.

The settings objects are found from the jobs' fields (each field whose default is a dataclass),
so a new settings object, or a new field declared without a check, fails
`test_every_settings_field_declares_its_check`.
"""
from __future__ import annotations

import dataclasses
import math
import re

import pytest

from t5align import calibration
from t5align import gin_cli
from t5align import jobs
from t5align import network
from t5align import training
from t5align.calibration import closed_form
from t5align import fields
from t5align.shipped import train_data

JOBS = (jobs.EvalJob, jobs.CalibrationJob, jobs.TrainJob)
# Written out: the jobs and the settings objects they hold, and how many fields each has (102
# in all: 61 of the jobs, 41 of their settings objects).
EXPECTED = {'jobs.EvalJob': 17, 'jobs.CalibrationJob': 21, 'jobs.TrainJob': 23,
            'jobs.Checkpoint': 4, 'calibration.SearchSettings': 9,
            'training.OptimizerConfig': 7, 'train_data.Mix': 4, 'network.T5Config': 17}


def _settings_objects() -> dict[str, type]:
  found = {job.GIN_NAME: job for job in JOBS}
  for job in JOBS:
    for f in dataclasses.fields(job):
      if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
          found[type(value).GIN_NAME] = type(value)
  # Held with no default: TrainJob's initial_checkpoint (None), the model's config (the jobs'
  # `model`, a network.Transformer, is None by default; its config is built by gin/models).
  found['jobs.Checkpoint'] = jobs.Checkpoint
  found['network.T5Config'] = network.T5Config
  return found


def test_every_settings_field_declares_its_check():
  objects = _settings_objects()
  assert {name: len(dataclasses.fields(cls)) for name, cls in objects.items()} == EXPECTED
  missing = [f'{name}.{f.name}' for name, cls in objects.items()
             for f in dataclasses.fields(cls) if not isinstance(f.metadata.get(fields.CHECK),
                                                                fields.Check)]
  assert not missing, f'declared without a check (fields.setting): {missing}'
  assert sum(EXPECTED.values()) == 102


def test_every_default_passes_its_own_check():
  # A default its check refuses would make the object unbuildable without that field.
  for name, cls in _settings_objects().items():
    for f in dataclasses.fields(cls):
      default = (f.default_factory() if f.default_factory is not dataclasses.MISSING
                 else f.default)
      if default is dataclasses.MISSING:  # Required (T5Config.vocab_size).
        continue
      assert f.metadata[fields.CHECK](default) == default, f'{name}.{f.name}'


def test_a_field_without_a_check_is_a_programming_error():
  @dataclasses.dataclass(frozen=True)
  class Bare:
    x: int = 1
    GIN_NAME = 'tests.Bare'

    def __post_init__(self):
      fields.check_fields(self)

  with pytest.raises(TypeError, match=r'tests\.Bare\.x is declared without a check'):
    Bare()


@pytest.mark.parametrize('build, message', [
    (lambda: training.OptimizerConfig(clip_norm=-1.0),
     'training.OptimizerConfig.clip_norm = -1.0: expected a positive number or None (no '
     'clipping).'),
    (lambda: training.OptimizerConfig(clip_norm='1.0'),
     "training.OptimizerConfig.clip_norm = '1.0': expected a positive number or None (no "
     'clipping).'),
    (lambda: training.OptimizerConfig(decay_fraction=-0.2),
     'training.OptimizerConfig.decay_fraction = -0.2: expected a number in (0, 1].'),
    (lambda: training.OptimizerConfig(name='sgd'),
     "training.OptimizerConfig.name = 'sgd': expected one of 'adamw', 'adafactor'."),
    (lambda: calibration.SearchSettings(bracket=(1.0, 0.5)),
     'calibration.SearchSettings.bracket = (1.0, 0.5): expected two temperatures (low, high), '
     'low < high.'),
    (lambda: calibration.SearchSettings(points=0),
     "calibration.SearchSettings.points = 0: expected a positive integer or None (the mesh's "
     "'tau' size, else 2)."),
    (lambda: calibration.SearchSettings(grid=('x',)),
     "calibration.SearchSettings.grid = ('x',): expected a non-empty tuple of temperatures "
     '(finite, > 0).'),
    (lambda: calibration.SearchSettings(batch_size=0),
     'calibration.SearchSettings.batch_size = 0: expected a positive integer or None (all at '
     'once).'),
    (lambda: train_data.Mix(weights=[1, 2]),
     'train_data.Mix.weights = [1, 2]: expected a dict from some of passkey, passkey_decoys, '
     'lines, kv, lines_near to numbers >= 0, not all 0 or None (the evaluated tasks equally).'),
    (lambda: train_data.Mix(min_length=-1), 'train_data.Mix.min_length = -1: expected an '
     'integer >= 0.'),
    (lambda: jobs.Checkpoint('/c', check_finite='no'),
     "jobs.Checkpoint.check_finite = 'no': expected True or False."),
    (lambda: jobs.Checkpoint('/c', params_dtype='int8'),
     "jobs.Checkpoint.params_dtype = 'int8': expected a floating dtype's name ('float32' or "
     "'bfloat16')."),
    (lambda: jobs.Checkpoint(5),
     'jobs.Checkpoint.path = 5 (--gin.CHECKPOINT_PATH): expected a path (a string).'),
])
def test_a_bad_field_is_refused_when_built_naming_its_gin_form(build, message, clean_gin):
  with pytest.raises(ValueError) as e:
    build()
  assert str(e.value) == message


def test_the_values_stored_are_the_fields_types():
  s = calibration.SearchSettings(grid=[1, 0.9], bracket=[0.1, 1])
  assert s.grid == (1.0, 0.9) and s.bracket == (0.1, 1.0)
  assert isinstance(s.grid[0], float)
  assert training.OptimizerConfig(learning_rate=1).learning_rate == 1.0
  assert training.OptimizerConfig(clip_norm=None).clip_norm is None


def test_gin_value_refused_naming_the_macro_that_set_it(clean_gin):
  import t5align.train  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  gin_cli.configure(['--gin_file=gin/runs/train_retrieval.gin',
                     '--gin_file=gin/models/retrieval_small.gin', '--gin.MODEL_DIR=/tmp/m',
                     '--gin.LEARNING_RATE=-1.0'], prog='t')
  with pytest.raises(ValueError, match=re.escape(
      'training.OptimizerConfig.learning_rate = -1.0 (--gin.LEARNING_RATE): expected a positive '
      'number.')):
    gin_cli.call_configured('t5align.jobs.TrainJob')


@pytest.mark.parametrize('flags, job, message', [
    (['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/retrieval_small.gin',
      '--gin.CHECKPOINT_PATH=/c', '--gin.EVAL_OUTPUT_DIR=/o',
      "--gin.MIXTURE_OR_TASK_NAME='t'", '--gin.BATCH_SIZE=0'], 'EvalJob',
     'jobs.EvalJob.batch_size = 0 (--gin.BATCH_SIZE): expected a positive integer.'),
    (['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/retrieval_small.gin',
      '--gin.CHECKPOINT_PATH=/c', '--gin.EVAL_OUTPUT_DIR=/o',
      "--gin.MIXTURE_OR_TASK_NAME='t'", '--gin.MAX_DECODE_LENGTH=0'], 'EvalJob',
     "jobs.EvalJob.max_decode_length = 0 (--gin.MAX_DECODE_LENGTH): expected a positive "
     "integer or None (the task's)."),
    (['--gin_file=gin/calibrate.gin', '--gin.CHECKPOINT_PATH=/c', '--gin.OUTPUT_PATH=/s.json',
      "--gin.TEXT_FILE='/t.txt'", '--gin.NUM_SAMPLES=-2'], 'CalibrationJob',
     'jobs.CalibrationJob.num_samples = -2 (--gin.NUM_SAMPLES): expected a positive integer.'),
    (['--gin_file=gin/runs/train_retrieval.gin', '--gin_file=gin/models/retrieval_small.gin',
      '--gin.MODEL_DIR=/tmp/m', '--gin.NUM_STEPS=0'], 'TrainJob',
     'jobs.TrainJob.num_steps = 0 (--gin.NUM_STEPS): expected a positive integer.'),
])
def test_a_jobs_gin_value_is_refused_as_gin_builds_it(flags, job, message, clean_gin):
  import t5align.calibrate  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  import t5align.eval  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  import t5align.train  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  gin_cli.configure(flags, prog='t')
  with pytest.raises(ValueError, match=re.escape(message)):
    gin_cli.call_configured(f't5align.jobs.{job}')


def test_mix_min_length_over_the_input_length_names_both(tmp_path):
  model = network.Transformer(network.T5Config(vocab_size=1000))
  job = jobs.TrainJob(model=model, model_dir=str(tmp_path), input_length=256,
                      mix=train_data.Mix(min_length=100000))
  with pytest.raises(ValueError, match=re.escape(
      "train_data.Mix.min_length = 100000: over the run's input length "
      '(jobs.TrainJob.input_length = 256, L_TR): no example can be that long.')):
    job.check()
  with pytest.raises(ValueError, match=re.escape(  # Drawn directly: before any tokenizing.
      'train_data.Mix.min_length = 300: over max_length=256: no example can be that long.')):
    train_data.train_example(None, train_data.Mix(min_length=300), 0, 0, max_length=256)


@pytest.mark.parametrize('fn, name', [
    (lambda L_tr: closed_form.yarn_mscale_tau(1024, L_tr), 'YaRN mscale'),
    (lambda L_tr: closed_form.infoscale_tau(1024, L_tr, 64), 'InfoScale'),
    (lambda L_tr: closed_form.llama4_length_tau(1024, L_tr), 'Llama 4 length'),
    (lambda L_tr: closed_form.log_length_tau(1024, L_tr), 'log-length')])
@pytest.mark.parametrize('reference', [math.nan, math.inf, '256', 256.0])
def test_literature_temperatures_refuse_a_reference_length_that_is_not_a_count(fn, name,
                                                                               reference):
  with pytest.raises(ValueError, match=re.escape(
      f'{name}: reference_length (L_tr)={reference!r}; expected an integer >= 2')):
    fn(reference)


def test_llama4_refuses_a_text_attn_scale_naming_it():
  with pytest.raises(ValueError, match=re.escape(
      "Llama 4 length: attn_scale='0.1'; expected a number >= 0.")):
    closed_form.llama4_length_tau(1024, 256, attn_scale='0.1')
