r"""Evaluates a T5 checkpoint on seqio tasks with an encoder temperature, resumably.

    python -m t5align.eval \
      --gin_file=gin/runs/eval.gin --gin_file=gin/models/flan_t5/xl.gin \
      --gin.CHECKPOINT_PATH=gs://t5-data/pretrained_models/t5x/flan_t5_xl/checkpoint_1138000 \
      --gin.MIXTURE_OR_TASK_NAME=t5align_passkey --gin.EVAL_OUTPUT_DIR=/tmp/eval/xl_tau1 \
      [--gin.TEMPERATURE=0.8 | --gin.SCHEDULE_PATH=schedule.json [--gin.SCHEDULE_STRATEGY=pmax]]

`--gin.NAME=VALUE` binds a macro; VALUE is read as a gin literal, or as a string when it is not one
(so paths need no extra quotes). `--gin_bindings` and `--gin_search_paths` work as in t5x; the
repository root is always a search path.

Per task of the mixture, EVAL_OUTPUT_DIR/<task>/ gets predictions.jsonl (one record per example,
appended and fsynced batch by batch), run.json and, once every example is done, metrics.json
(written atomically). Rerunning the same command after an interruption skips the examples already
recorded and finishes the rest. Generation tasks use greedy decoding; the LM tasks score their
targets. The model runs on a ('data', 'model') mesh over all devices (NUM_PARTITIONS along
'model', parameters sharded by their logical axes, batches split along 'data').

Several processes (a TPU pod's hosts; JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
JAX_PROCESS_ID elsewhere, see `t5align.runtime.multihost`) run the same command: the mesh spans
every process's devices, each process places only its rows of each batch, predictions are gathered,
and process 0 alone writes the task folders (resume included).

The job is `t5align.jobs.EvalJob`; gin/runs/eval.gin binds its fields as `jobs.EvalJob.NAME`
(`--gin_bindings='jobs.EvalJob.batch_size = 4'`).
"""
from __future__ import annotations

# gin's file reader (gin.resource_reader) uses importlib.util without importing it.
import importlib.util  # pylint: disable=unused-import  # noqa: F401
import sys
from typing import Any, Mapping, Sequence

from t5align import gin_cli
from t5align.runtime import multihost


def main(argv: Sequence[str] | None = None) -> Mapping[str, Any]:
  gin_cli.log_plainly()
  multihost.initialize()  # First: before anything starts a JAX backend.
  gin_cli.configure(sys.argv[1:] if argv is None else argv, prog='python -m t5align.eval',
                    description=__doc__,
                    example_file='gin/runs/eval.gin plus a gin/models file')
  return gin_cli.run_job(gin_cli.call_configured('t5align.jobs.EvalJob'),
                        'python -m t5align.eval')


if __name__ == '__main__':
  main()
