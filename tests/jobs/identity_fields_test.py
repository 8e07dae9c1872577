"""Every job field, and every field of the settings objects a job holds (`checkpoint.path`,
`search.grid`, `optimizer.learning_rate`, ...), is part of the run's identity (recorded in its
'settings', `run_identity.settings_record`, so a resume with another value is refused) or says
in its metadata why not (`run_identity.NOT_IDENTITY`); the tables here are the expectation, and
the jobs' identity methods do what they say.

A field added to a job without a line here fails `test_every_field_is_classified`: a new setting
that changes results would otherwise resume silently into a folder made with another value. For
each field marked IDENTITY the test changes it and checks the identity changes; for each field
marked with a reason, that it does not. Fields the identity reads through something else (the
inputs' fingerprint, the temperature's description) say so and name the test that covers them.
"""
from __future__ import annotations

import dataclasses
import pathlib

import jax
import numpy as np
import pytest

from t5align import jobs
from t5align import network
from t5align import run_identity

TESTDATA = pathlib.Path(__file__).resolve().parents[1] / 'testdata' / 't5x'
CKPT = TESTDATA / 't5_1_1_tiny' / 'legacy' / 'checkpoint_0'
IDENTITY = 'identity'

# A settings object's fields, as the jobs hold them.
CHECKPOINT = {
    'checkpoint.path': 'identity: its content (checkpoint fingerprint)',
    'checkpoint.params_dtype': IDENTITY,
    'checkpoint.check_finite': 'a refusal of NaN or inf weights: refused runs have no results',
    'checkpoint.flag': 'the setting errors name',
}
CALIBRATION = {
    **CHECKPOINT,
    'output_path': 'where the schedule goes',
    'text_file': 'through the inputs: their fingerprint (samples.read_inputs, calibrate_test)',
    'vocabulary_path': 'through the inputs: their fingerprint (samples.read_inputs)',
    'seqio_task': 'through the inputs: their fingerprint (samples.read_inputs)',
    'seqio_split': 'through the inputs: their fingerprint (samples.read_inputs)',
    'jsonl_file': 'through the inputs: their fingerprint (samples.read_inputs)',
    'per_task': IDENTITY, 'reference_tasks': IDENTITY, 'lengths': IDENTITY,
    'strategies': IDENTITY, 'reference_length': IDENTITY, 'num_samples': IDENTITY,
    'seed': IDENTITY,
    'config': 'checked against the checkpoint; its dtype and attention enter as dtype and '
              'attention_impl',
    'dtype': 'through dtype, the dtype computed in', 'mesh_shape': IDENTITY,
    'attention_impl': 'through attention_impl, the implementation that runs',
    'search.batch_size': 'how many samples share an encoder call: statistics are sums, equal',
    'search.tau_batch_size': 'how many temperatures share an encoder call: equal results',
    'search.grid': IDENTITY, 'search.tol': IDENTITY, 'search.bracket': IDENTITY,
    'search.points': IDENTITY,
    'search.mesh': 'set by the run from mesh_shape (identity)',
    'search.eos_id': 'set by the run from the inputs\' vocabulary (their fingerprint)',
    'search.chunk': 'how many queries share a call of the closed forms: equal values',
    'analysis_dir': 'figures written beside the schedule',
    'relpos_heads': 'which heads the analysis figure draws',
}
EVAL = {
    'model': 'its config enters as config',
    **CHECKPOINT,
    'checkpoint.path': 'identity: its content, through the run base (eval_test)',
    'mixture_or_task_name': 'one folder per task: the task name',
    'output_dir': 'where the results go',
    'temperature': 'through the temperature description (make_temperature, eval_test)',
    'schedule_path': 'through the temperature description: the schedule\'s content',
    'schedule_strategy': 'through the temperature description',
    'allow_schedule_mismatch': 'through the temperature description (the entry applied)',
    'label': 'the row name in reports',
    'model_name': 'the row name in reports',
    'batch_size': 'padding is masked: equal predictions (tests/model/partitioning_test.py)',
    'num_partitions': 'through the mesh (recorded as mesh)',
    'num_examples': 'through num_examples and examples_sha256',
    'split': IDENTITY, 'max_decode_length': 'through max_decode_length (the steps decoded)',
    'truncate_inputs': IDENTITY, 'show_progress': 'a progress bar',
}
TRAIN = {
    'model': 'its config enters as config', 'model_dir': 'where the run goes',
    'seed': IDENTITY, 'num_steps': IDENTITY, 'batch_size': IDENTITY,
    'optimizer.learning_rate': IDENTITY, 'optimizer.warmup_steps': IDENTITY,
    'optimizer.weight_decay': IDENTITY, 'optimizer.name': IDENTITY,
    'optimizer.schedule': IDENTITY, 'optimizer.clip_norm': IDENTITY,
    'optimizer.decay_fraction': IDENTITY,
    'per_example_loss': IDENTITY, 'mix.weights': IDENTITY, 'mix.length_power': IDENTITY,
    'mix.min_units': IDENTITY, 'mix.min_length': IDENTITY, 'input_length': IDENTITY,
    'target_length': IDENTITY, 'vocab_size': IDENTITY,
    'checkpoint_every': 'when checkpoints are written', 'keep_checkpoints': 'how many are kept',
    'log_every': 'how often the log is written',
    'eval_lengths': 'the held-out evaluation at the end, redone by every run',
    'eval_examples': 'the held-out evaluation at the end, redone by every run',
    'eval_seed': 'the held-out evaluation at the end, redone by every run',
    'eval_batch_size': 'the held-out evaluation at the end, redone by every run',
    'export_dir': 'where the final weights are copied', 'export_dtype': 'the copy\'s dtype',
    'command': 'recorded in training.json',
    'mixture_or_task_name': IDENTITY,
    'initial_checkpoint': IDENTITY,
}
# A value other than the default, for each IDENTITY field.
OTHER = {
    'search.bracket': (0.1, 1.0), 'search.points': 3, 'optimizer.clip_norm': 0.5,
    'optimizer.decay_fraction': 0.5, 'mix.min_length': 8,
    'optimizer.learning_rate': 0.5, 'optimizer.warmup_steps': 3, 'optimizer.weight_decay': 0.1,
    'optimizer.name': 'adafactor', 'optimizer.schedule': 'wsd', 'mix.weights': {'kv': 1.0},
    'mix.length_power': 2.0, 'mix.min_units': {'kv': 3},
    'checkpoint.params_dtype': 'bfloat16', 'search.grid': (1.0, 0.9), 'search.tol': 0.01,
    'per_task': False, 'reference_tasks': {'a': 'b'}, 'lengths': (4096,),
    'strategies': ('entropy',), 'reference_length': 256, 'num_samples': 3, 'seed': 5,
    'dtype': 'bfloat16', 'attention_impl': 'reference', 'mesh_shape': (1, 1),
    'split': 'validation', 'truncate_inputs': 64, 'num_steps': 7, 'batch_size': 3,
    'per_example_loss': True, 'input_length': 64, 'target_length': 9, 'vocab_size': 500,
    'mixture_or_task_name': 't5align_train_kv',
    'initial_checkpoint': jobs.Checkpoint(str(CKPT), flag='INITIAL_CHECKPOINT_PATH'),
}
TINY = network.T5Config(vocab_size=128, emb_dim=16, num_heads=2, num_encoder_layers=1,
                        num_decoder_layers=1, head_dim=8, mlp_dim=32)


@pytest.mark.parametrize('cls, table', [(jobs.CalibrationJob, CALIBRATION),
                                        (jobs.EvalJob, EVAL), (jobs.TrainJob, TRAIN)])
def test_every_field_is_classified(cls, table):
  fields = _fields(cls())
  assert sorted(table) == sorted(fields), (
      f'{cls.__name__}: classify {sorted(set(fields) - set(table))} (drop '
      f'{sorted(set(table) - set(fields))}) in tests/jobs/identity_fields_test.py')
  # The code says the same: the identity fields are recorded, every other one says why not.
  for field, why in fields.items():
    assert (why is None) == (table[field] == IDENTITY), (
        f'{cls.__name__}.{field}: the table says {table[field]!r}, its metadata {why!r}')
    assert why is None or why.strip(), f'{cls.__name__}.{field}: an empty reason'
  recorded = _leaves(run_identity.settings_record(cls()))
  assert sorted(recorded) == sorted(f for f, kind in table.items() if kind == IDENTITY)


def _leaves(record, prefix=''):
  """The dotted fields of a settings record (a settings object's as 'checkpoint.params_dtype':
  in a default job's record, only the settings objects are objects)."""
  out = []
  for key, value in record.items():
    if isinstance(value, dict):
      out += _leaves(value, f'{prefix}{key}.')
    else:
      out.append(prefix + key)
  return out


def _calibration_identity(job):
  return job.identity({'inputs': 'fingerprint'})


def _eval_identity(job):
  return job.identity({'task': 't5align_passkey_2k', 'temperature': 1.0, 'process_count':
                       jax.process_count()})


def _train_identity(job):
  return job.identity({})


@pytest.mark.parametrize('cls, table, identity, base', [
    (jobs.CalibrationJob, CALIBRATION, _calibration_identity,
     dict(checkpoint=jobs.Checkpoint(str(CKPT)), output_path='/out/schedule.json',
          text_file='/t.txt')),
    (jobs.EvalJob, EVAL, _eval_identity, dict(checkpoint=jobs.Checkpoint(str(CKPT)))),
    (jobs.TrainJob, TRAIN, _train_identity,
     dict(model=network.Transformer(TINY), model_dir='/model')),
])
def test_identity_fields_change_the_identity_and_the_others_do_not(cls, table, identity, base):
  job = cls(**base)
  before = identity(job)
  for field, kind in table.items():
    if kind == IDENTITY or kind.startswith('through') and field in OTHER:
      changed = identity(_replace(job, field, OTHER[field]))
      assert changed != before, f'{cls.__name__}.{field} is classified identity but is not'
    elif not kind.startswith(('identity', 'through', 'its config', 'one folder', 'checked')):
      value = _another(job, field)
      assert identity(_replace(job, field, value)) == before, (
          f'{cls.__name__}.{field} changes the identity but is classified "{kind}"')


def _fields(job, prefix=''):
  """{field: why it is not identity (its metadata), or None} of the job, a settings object's
  fields as 'checkpoint.path' (those the default job holds)."""
  out = {}
  for f in dataclasses.fields(job):
    value = getattr(job, f.name)
    if dataclasses.is_dataclass(value) and not isinstance(value, network.Transformer):
      out.update(_fields(value, f'{prefix}{f.name}.'))
    else:
      out[prefix + f.name] = f.metadata.get(run_identity.NOT_IDENTITY)
  return out


def _replace(job, field, value):
  """The job with `field` ('search.grid': a settings object's) set to `value`."""
  if '.' not in field:
    return dataclasses.replace(job, **{field: value})
  owner, name = field.split('.')
  return dataclasses.replace(job, **{owner: dataclasses.replace(getattr(job, owner),
                                                                **{name: value})})


def _another(job, field):
  """A value for a field outside the identity, other than the job's."""
  value = job
  for part in field.split('.'):
    value = getattr(value, part)
  if isinstance(value, bool):
    return not value
  if isinstance(value, int):
    return value + 1
  if isinstance(value, tuple):
    return value[:1]
  if value is not None and not isinstance(value, str):
    return None
  # A string or unset: the first of a path, a dtype, a count, heads and a mesh that the field
  # takes and it does not hold (its check refuses the others as the object is built).
  for candidate in ('/elsewhere', 'bfloat16', 2, (0,),
                    jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',))):
    if candidate == value:
      continue
    try:
      _replace(job, field, candidate)
    except ValueError:
      continue
    return candidate
  raise AssertionError(f'no other value for {field}')


@pytest.mark.usefixtures('clean_gin')
def test_every_job_records_jax_matmul_precision():
  # One rule forms every identity (`run_identity.make`): eval's base too, which once left out
  # the precision, so a run resumed with TF32 opted in would have mixed both in its records.
  assert _eval_identity(jobs.EvalJob(checkpoint=jobs.Checkpoint(str(CKPT))))[
      'jax_default_matmul_precision'] is None
  with jax.default_matmul_precision('tensorfloat32'):
    job = jobs.EvalJob(checkpoint=jobs.Checkpoint(str(CKPT)))
    assert _eval_identity(job)['jax_default_matmul_precision'] == 'tensorfloat32'
    calibration = _calibration_identity(jobs.CalibrationJob(checkpoint=jobs.Checkpoint(str(CKPT))))
    assert calibration['jax_default_matmul_precision'] == 'tensorfloat32'
  model = network.Transformer(TINY)
  with jax.default_matmul_precision('bfloat16'):
    assert _train_identity(jobs.TrainJob(model=model, model_dir='/m'))[
        'jax_default_matmul_precision'] == 'bfloat16'


def test_every_record_carries_its_format():
  model = network.Transformer(TINY)
  for identity in (_eval_identity(jobs.EvalJob(checkpoint=jobs.Checkpoint(str(CKPT)))),
                   _calibration_identity(jobs.CalibrationJob(checkpoint=jobs.Checkpoint(
                       str(CKPT)))),
                   _train_identity(jobs.TrainJob(model=model, model_dir='/m'))):
    assert identity['format'] == run_identity.FORMAT == 3
    assert 'gin' not in identity


@pytest.mark.parametrize('cls', [jobs.EvalJob, jobs.CalibrationJob, jobs.TrainJob])
def test_every_job_is_a_job_of_one_shape(cls):
  """`jobs.Job`: the pre-flight takes any of them; `programs` and `identity` have one
  signature."""
  import inspect  # pylint: disable=g-import-not-at-top
  assert isinstance(cls(), jobs.Job)
  assert list(inspect.signature(cls.programs).parameters) == [
      'self', 'config', 'mesh', 'params', 'length']
  assert inspect.signature(cls.programs).parameters['length'].kind == inspect.Parameter.KEYWORD_ONLY
  assert list(inspect.signature(cls.identity).parameters) == ['self', 'facts']
  assert cls.KIND in run_identity.KINDS
