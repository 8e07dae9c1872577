"""Jobs: a command's settings as one frozen object that owns its programs and its run.

Each job holds the settings gin binds (its fields), builds the programs it compiles (the run, its
memory check and the pre-flight compile the same ones), says what its run records (run.json) and
runs: `EvalJob` (eval_job), `CalibrationJob` (calibration_job), `TrainJob` (train_job), each a
`Job`, over `Checkpoint` and `Program` (common). preflight compiles any job's programs for a TPU
slice. The
commands are flags/gin -> job -> `job.run()`.

The names load lazily, so importing the package (e.g. for `jobs.preflight`, which must set up
libtpu's environment before JAX starts) imports no JAX.
"""
import importlib
from typing import Any

_WHERE = {'CalibrationJob': 'calibration_job', 'Checkpoint': 'common', 'EvalJob': 'eval_job',
          'Job': 'common', 'Program': 'common', 'TrainJob': 'train_job'}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
  if name not in _WHERE:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  return getattr(importlib.import_module(f'{__name__}.{_WHERE[name]}'), name)
