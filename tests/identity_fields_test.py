"""Every job field is classified as part of the run's identity (what run.json or the calibration
log records, so a resume with another value is refused) or not (with why), and the
classification is what the jobs' identity methods do.

A field added to a job without a line here fails `test_every_field_is_classified`: a new setting
that changes results would otherwise resume silently into a folder made with another value. For
each field marked IDENTITY the test changes it and checks the identity changes; for each field
marked with a reason, that it does not. Fields the identity reads through something else (the
inputs' fingerprint, the temperature's description) say so and name the test that covers them.
"""
from __future__ import annotations

import dataclasses
import pathlib
import types

import jax
import pytest

from t5align import jobs
from t5align import network

TESTDATA = pathlib.Path(__file__).resolve().parent / 'testdata' / 't5x'
CKPT = TESTDATA / 't5_1_1_tiny' / 'legacy' / 'checkpoint_0'
IDENTITY = 'identity'

CALIBRATION = {
    'checkpoint_path': 'identity: its content (checkpoint fingerprint)',
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
    'dtype': IDENTITY, 'params_dtype': IDENTITY, 'attention_impl': IDENTITY,
    'mesh_shape': IDENTITY,
    'batch_size': 'how many samples share an encoder call: statistics are sums, equal',
    'tau_batch_size': 'how many temperatures share an encoder call: equal results',
    'grid': IDENTITY, 'tol': IDENTITY,
    'analysis_dir': 'figures written beside the schedule',
    'check_finite': 'a refusal of NaN or inf weights: refused runs have no results',
    'relpos_heads': 'which heads the analysis figure draws',
}
EVAL = {
    'model': 'its config enters as config',
    'checkpoint_path': 'identity: its content, through the run base (eval_test)',
    'mixture_or_task_name': 'one folder per task: the task name',
    'output_dir': 'where the results go',
    'temperature': 'through the temperature description (make_temperature, eval_test)',
    'schedule_path': 'through the temperature description: the schedule\'s content',
    'schedule_strategy': 'through the temperature description',
    'label': 'the row name in reports',
    'model_name': 'the row name in reports',
    'batch_size': 'padding is masked: equal predictions (tests/partitioning_test.py)',
    'num_partitions': 'through the mesh (recorded as mesh)',
    'num_examples': 'through num_examples and examples_sha256',
    'split': IDENTITY, 'max_decode_length': 'through max_decode_length (the steps decoded)',
    'params_dtype': IDENTITY, 'truncate_inputs': IDENTITY,
    'show_progress': 'a progress bar', 'check_finite': 'a refusal: refused runs have no results',
}
TRAIN = {
    'model': 'its config enters as config', 'model_dir': 'where the run goes',
    'seed': IDENTITY, 'num_steps': IDENTITY, 'batch_size': IDENTITY, 'learning_rate': IDENTITY,
    'warmup_steps': IDENTITY, 'weight_decay': IDENTITY, 'optimizer': IDENTITY,
    'schedule': IDENTITY, 'per_example_loss': IDENTITY, 'mix': IDENTITY,
    'length_power': IDENTITY, 'min_units': IDENTITY, 'input_length': IDENTITY,
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
    'initial_checkpoint_path': 'identity when fine-tuning: its content (finetune_test)',
}
# A value other than the default, for each IDENTITY field.
OTHER = {
    'per_task': False, 'reference_tasks': {'a': 'b'}, 'lengths': (4096,),
    'strategies': ('entropy',), 'reference_length': 256, 'num_samples': 3, 'seed': 5,
    'dtype': 'bfloat16', 'params_dtype': 'bfloat16', 'attention_impl': 'reference',
    'mesh_shape': (1, 1), 'grid': (1.0, 0.9), 'tol': 0.01, 'split': 'validation',
    'truncate_inputs': 64, 'num_steps': 7, 'batch_size': 3, 'learning_rate': 0.5,
    'warmup_steps': 3, 'weight_decay': 0.1, 'optimizer': 'adafactor', 'schedule': 'wsd',
    'per_example_loss': True, 'mix': {'kv': 1.0}, 'length_power': 2.0,
    'min_units': {'kv': 3}, 'input_length': 64, 'target_length': 9, 'vocab_size': 500,
    'mixture_or_task_name': 't5align_train_kv',
}
TINY = network.T5Config(vocab_size=128, emb_dim=16, num_heads=2, num_encoder_layers=1,
                        num_decoder_layers=1, head_dim=8, mlp_dim=32)


@pytest.mark.parametrize('cls, table', [(jobs.CalibrationJob, CALIBRATION),
                                        (jobs.EvalJob, EVAL), (jobs.TrainJob, TRAIN)])
def test_every_field_is_classified(cls, table):
  fields = [f.name for f in dataclasses.fields(cls)]
  assert sorted(table) == sorted(fields), (
      f'{cls.__name__}: classify {sorted(set(fields) - set(table))} (drop '
      f'{sorted(set(table) - set(fields))}) in tests/identity_fields_test.py')


def _calibration_identity(job):
  data = types.SimpleNamespace(identity={'inputs': 'fingerprint'})
  identity = job.identity(data)
  identity.pop('created_unix', None)
  return identity


def _eval_identity(job):
  temp = types.SimpleNamespace(describe=lambda: {'temperature': 1.0})
  mesh = types.SimpleNamespace(shape={'data': 1, 'model': 1})
  return job.identity(types.SimpleNamespace(name='t5align_passkey_2k'), TINY, mesh, temp,
                      base={}, vocabulary='v', examples_sha256='s', total=2, scored=False,
                      steps=8)


def _train_identity(job):
  return job.identity()


@pytest.mark.parametrize('cls, table, identity, base', [
    (jobs.CalibrationJob, CALIBRATION, _calibration_identity,
     dict(checkpoint_path=str(CKPT), output_path='/out/schedule.json', text_file='/t.txt')),
    (jobs.EvalJob, EVAL, _eval_identity, {}),
    (jobs.TrainJob, TRAIN, _train_identity,
     dict(model=network.Transformer(TINY), model_dir='/model')),
])
def test_identity_fields_change_the_identity_and_the_others_do_not(cls, table, identity, base):
  job = cls(**base)
  before = identity(job)
  for field, kind in table.items():
    if kind == IDENTITY:
      changed = identity(dataclasses.replace(job, **{field: OTHER[field]}))
      assert changed != before, f'{cls.__name__}.{field} is classified identity but is not'
    elif not kind.startswith(('identity', 'through', 'its config', 'one folder', 'checked')):
      value = _another(job, field)
      assert identity(dataclasses.replace(job, **{field: value})) == before, (
          f'{cls.__name__}.{field} changes the identity but is classified "{kind}"')


def _another(job, field):
  """A value for a field outside the identity, other than the job's."""
  value = getattr(job, field)
  if isinstance(value, bool):
    return not value
  if isinstance(value, int):
    return value + 1
  if isinstance(value, tuple):
    return value[:1]
  return '/elsewhere' if value is None or isinstance(value, str) else None


def test_the_classification_sees_jax_process_count():
  # The eval identity records the processes and devices; they are not job fields.
  assert _eval_identity(jobs.EvalJob())['process_count'] == jax.process_count()
