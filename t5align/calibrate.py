r"""Calibrates encoder temperatures for a checkpoint and writes a TemperatureSchedule (JSON).

  python -m t5align.calibrate --gin_file=gin/calibrate.gin \
    --gin.CHECKPOINT_PATH=/path/checkpoint_1138000 --gin.TEXT_FILE=/path/corpus.txt \
    --gin.VOCABULARY_PATH=/path/sentencepiece.model --gin.OUTPUT_PATH=/tmp/schedule.json

Flags as in t5x (see `t5align.gin_cli`): --gin_file (repeatable), --gin_search_paths,
--gin_bindings and --gin.NAME=VALUE, where VALUE is a gin literal or else taken as a string.
The job is `t5align.jobs.CalibrationJob`: gin/calibrate.gin binds its fields as
`jobs.CalibrationJob.NAME` and builds the settings objects it takes, `jobs.Checkpoint` and
`calibration.SearchSettings` (`--gin_bindings='calibration.SearchSettings.grid = (1.0, 0.9)'`).
"""
from __future__ import annotations

import sys
from typing import Sequence

from t5align import gin_cli
from t5align.runtime import multihost


def main(argv: Sequence[str] | None = None) -> None:
  gin_cli.log_plainly()
  multihost.initialize()  # First: before anything starts a JAX backend.
  argv = sys.argv[1:] if argv is None else argv
  if any('SEQIO_TASK' in arg or 'seqio_tasks.' in arg for arg in argv):
    # Registers the t5align_* tasks and the seqio_tasks.* configurables the flags may bind
    # (importing seqio costs seconds, so only when they are named).
    import seqio_tasks  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  gin_cli.configure(argv, prog='python -m t5align.calibrate',
                    description=__doc__, example_file='gin/calibrate.gin')
  job = gin_cli.call_configured('t5align.jobs.CalibrationJob')
  schedule = gin_cli.run_job(job, 'python -m t5align.calibrate')
  if multihost.is_writer():  # The results; progress went to the log (stderr).
    print(job.tables(schedule))


if __name__ == '__main__':
  main()
