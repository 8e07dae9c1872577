r"""lm-eval's own command line with t5align's model registered: every argument is lm-eval's.

    python -m t5align.lm_eval --model t5align \
      --model_args pretrained=/ckpt/flan_t5_xl,schedule=schedule.json \
      --tasks longbench_e --batch_size 1 --output_path results/ --log_samples

Several processes (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID; or a TPU pod's
hosts) run the same command over one mesh: each runs every request, and process 0 alone writes
--output_path and logs to the trackers.
"""
from __future__ import annotations

import sys
from typing import Sequence

from t5align.runtime import multihost


def _quiet() -> None:
  """On processes other than 0: lm-eval's writers (results, samples, the hub, trackers) become
  no-ops, since process 0 writes the same results."""
  from lm_eval import loggers  # pylint: disable=g-import-not-at-top

  class Tracker(loggers.EvaluationTracker):

    def save_results_aggregated(self, *args, **kwargs):
      del args, kwargs

    def save_results_samples(self, *args, **kwargs):
      del args, kwargs

    def recreate_metadata_card(self, *args, **kwargs):
      del args, kwargs

  class Silent:

    def __init__(self, *args, **kwargs):
      del args, kwargs

    def __getattr__(self, name):
      return lambda *args, **kwargs: None

  loggers.EvaluationTracker = Tracker
  loggers.WandbLogger = Silent
  loggers.TrackioLogger = Silent


def main(argv: Sequence[str] | None = None) -> None:
  multihost.initialize()  # First: before anything starts a JAX backend.
  import t5align.lm_eval  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401  (registers)
  from lm_eval import __main__ as lm_eval_main  # pylint: disable=g-import-not-at-top
  if not multihost.is_writer():
    _quiet()
  sys.argv = ['lm-eval', *(sys.argv[1:] if argv is None else argv)]
  lm_eval_main.cli_evaluate()


if __name__ == '__main__':
  main()
