"""One set of defaults: a job built in Python with only its required settings runs what its
command runs with only its required flags, except the differences written out here, each of
which docs/python.md states ("Defaults: Python and the run files").

Each job is built twice: by gin from its run file (and a model file where the run needs one)
with only the required macros set, and by its class with the same required values. Every field
is compared, and every field of the settings objects gin builds for it (`checkpoint.path`,
`search.grid`, `optimizer.learning_rate`, ...); a field that differs and is not listed below
fails the test, as does a listed difference that no longer differs (so the list and the page
stay true).
"""
from __future__ import annotations

import dataclasses

import pytest

from t5align import gin_cli
from t5align import jobs
from t5align import network

# Fields whose Python default is, on purpose, not the run file's: {field: (run file's, Python's)}.
CALIBRATION_DIFFERENCES = {
    # Python: the model config's dtype (float32 without one); gin/calibrate.gin: bfloat16, the
    # T5 1.1 model files' ACTIVATION_DTYPE, which a model file given after it replaces.
    'dtype': ('bfloat16', None),
}
# gin/runs/train_retrieval.gin is the shipped model's recipe; TrainJob()'s defaults are a
# generic small run (AdamW, cosine schedule, equal task weights).
TRAIN_DIFFERENCES = {
    'num_steps': (5000, 1000), 'optimizer.learning_rate': (0.01, 0.001),
    'optimizer.warmup_steps': (200, 100), 'optimizer.name': ('adafactor', 'adamw'),
    'optimizer.schedule': ('wsd', 'cosine'), 'per_example_loss': (True, False),
    'mix.weights': ({'passkey': 0.5, 'passkey_decoys': 0.5, 'lines': 3.0, 'lines_near': 2.0,
                     'kv': 1.5}, None),
    'mix.length_power': (2.0, 1.0),
    'mix.min_units': ({'lines': 2, 'lines_near': 2, 'kv': 2}, None),
    'target_length': (80, 40), 'eval_lengths': ((256, 1024, 4096), (256,)),
    'eval_examples': (50, 100), 'eval_batch_size': (8, 16),
}

CASES = {
    'calibrate': ('t5align.calibrate', 't5align.jobs.CalibrationJob', jobs.CalibrationJob,
                  ['--gin_file=gin/calibrate.gin'],
                  {'CHECKPOINT_PATH': '/ckpt', 'OUTPUT_PATH': '/out/schedule.json',
                   'TEXT_FILE': '/corpus.txt', 'VOCABULARY_PATH': '/spm.model'},
                  CALIBRATION_DIFFERENCES),
    'eval': ('t5align.eval', 't5align.jobs.EvalJob', jobs.EvalJob,
             ['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/tiny.gin'],
             {'CHECKPOINT_PATH': '/ckpt', 'MIXTURE_OR_TASK_NAME': 't5align_passkey_2k',
              'EVAL_OUTPUT_DIR': '/out'}, {}),
    'train': ('t5align.train', 't5align.jobs.TrainJob', jobs.TrainJob,
              ['--gin_file=gin/runs/train_retrieval.gin', '--gin_file=gin/models/tiny.gin'],
              {'MODEL_DIR': '/model'}, TRAIN_DIFFERENCES),
}
# Required macro -> the job field it sets.
FIELDS = {'OUTPUT_PATH': 'output_path',
          'TEXT_FILE': 'text_file', 'VOCABULARY_PATH': 'vocabulary_path',
          'MIXTURE_OR_TASK_NAME': 'mixture_or_task_name', 'EVAL_OUTPUT_DIR': 'output_dir',
          'MODEL_DIR': 'model_dir'}


@pytest.mark.parametrize('command', sorted(CASES))
def test_python_defaults_are_the_run_files(command, clean_gin):
  module, name, cls, files, required, expected = CASES[command]
  __import__(module)  # Registers the job's gin name.
  gin_cli.configure([*files, *[f'--gin.{k}={v!r}' for k, v in required.items()]],
                    prog=f'python -m {module}')
  from_gin = gin_cli.call_configured(name)
  model = getattr(from_gin, 'model', None)
  kwargs = {FIELDS[k]: v for k, v in required.items() if k != 'CHECKPOINT_PATH'}
  if 'CHECKPOINT_PATH' in required:
    kwargs['checkpoint'] = jobs.Checkpoint(required['CHECKPOINT_PATH'])
  if isinstance(model, network.Transformer):  # The model file's: built by gin either way.
    kwargs['model'] = model
  from_python = cls(**kwargs)
  assert _differences(from_gin, from_python) == expected


def _differences(a, b, prefix=''):
  """{field: (a's, b's)} of two dataclasses, a field that is a dataclass compared field by
  field (as 'optimizer.learning_rate')."""
  out = {}
  for f in dataclasses.fields(a):
    x, y = getattr(a, f.name), getattr(b, f.name)
    if dataclasses.is_dataclass(x) and type(x) is type(y) and f.name != 'model':
      out.update(_differences(x, y, f'{prefix}{f.name}.'))
    elif x != y:
      out[prefix + f.name] = (x, y)
  return out
