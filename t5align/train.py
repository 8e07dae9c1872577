r"""Trains a small T5 on synthetic retrieval (passkey with decoys too, lines, kv), or fine-tunes a
checkpoint on a seqio task or mixture (as t5x's finetune.gin), resumably.

    python -m t5align.train \
      --gin_file=gin/runs/train_retrieval.gin --gin_file=gin/models/retrieval_small.gin \
      --gin.MODEL_DIR=/tmp/retrieval_t5
    python -m t5align.train \
      --gin_file=gin/runs/finetune.gin --gin_file=gin/models/retrieval_small.gin \
      --gin.seqio_tasks.vocabulary_path.path=t5align/shipped/retrieval_t5/sentencepiece.model \
      --gin.INITIAL_CHECKPOINT_PATH=t5align/shipped/retrieval_t5/checkpoint_5000 \
      --gin.MIXTURE_OR_TASK_NAME=t5align_scrolls_qasper --gin.L_TR=1024 \
      --gin.TARGET_LENGTH=1024 --gin.NUM_STEPS=2000 --gin.MODEL_DIR=/tmp/rt5_qasper

`--gin.NAME=VALUE` binds a macro (VALUE is a gin literal, or a string when it is not one);
`--gin_bindings` and `--gin_search_paths` work as in t5x; the repository root is a search path.

The job is `t5align.jobs.TrainJob` (what MODEL_DIR gets, and how a rerun resumes):
gin/runs/train_retrieval.gin and gin/runs/finetune.gin bind its fields as `jobs.TrainJob.NAME`.

The small model trained this way ships in t5align/shipped/retrieval_t5/ (`assets.load_shipped`).
"""
from __future__ import annotations

import dataclasses
import shlex
import sys
from typing import Any, Sequence

from t5align import gin_cli


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  gin_cli.log_plainly()
  argv = sys.argv[1:] if argv is None else list(argv)
  gin_cli.configure(argv, prog='python -m t5align.train', description=__doc__,
                    example_file='gin/runs/train_retrieval.gin (or gin/runs/finetune.gin) plus '
                    'gin/models/retrieval_small.gin')
  job = gin_cli.call_configured('t5align.jobs.TrainJob')
  # training.json records the command line that produced the exported weights.
  return gin_cli.run_job(dataclasses.replace(job, command=shlex.join(
      ['python', '-m', 't5align.train', *argv])), 'python -m t5align.train')


if __name__ == '__main__':
  main()
