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

seqio is imported inside functions only; the library part is `t5align.evaluation`.
"""
from __future__ import annotations

import dataclasses
import importlib.util  # pylint: disable=unused-import  (gin's file reader needs it loaded)
import os
import sys
import warnings
from typing import Any, Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from t5align import checkpoints
from t5align import decoding
from t5align import evaluation
from t5align import fileio
from t5align import gin_cli
from t5align import network

DEFAULT_MAX_DECODE_LENGTH = 64
TRUNCATION_LABEL = 'w/ truncation'  # paper Table 6's baseline row


def keep_last(tokens: Any, length: int) -> np.ndarray:
  """The last `length` non-pad tokens of one input (its EOS stays last): Table 6's
  'truncation' baseline, which feeds the model only the L_tr tokens nearest the completion."""
  tokens = np.asarray(tokens)
  if length < 1:
    raise ValueError(f'TRUNCATE_INPUTS={length} must be >= 1.')
  tokens = tokens[tokens > 0]
  return tokens[-length:]


def _model_name(checkpoint_path: str) -> str:
  parts = [p for p in str(checkpoint_path).rstrip('/').split('/') if p]
  if len(parts) > 1 and parts[-1].startswith('checkpoint'):
    return parts[-2]
  return parts[-1] if parts else str(checkpoint_path)


def _text(value: Any) -> str:
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value.item()
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


def _plain(value: Any) -> Any:
  """Metric values as JSON numbers (seqio may return Scalar objects or numpy values)."""
  value = getattr(value, 'value', value)
  if isinstance(value, (np.generic, np.ndarray)):
    return value.tolist()
  return value


def make_temperature(config: network.T5Config, temperature: Any = None,
                     schedule_path: str | None = None, schedule_strategy: str | None = None,
                     label: str | None = None) -> evaluation.Temperature:
  """A constant (the override, else the config's) or a schedule file's temperatures."""
  if temperature is not None and schedule_path:
    raise ValueError('set TEMPERATURE or SCHEDULE_PATH, not both.')
  if schedule_path:
    schedule = evaluation.schedule_lib.load_schedule(schedule_path, schedule_strategy)
    calibrated = schedule.provenance.get('dtype')
    if calibrated and jnp.dtype(calibrated) != jnp.dtype(config.dtype):
      warnings.warn(f'{schedule_path} was calibrated with {calibrated} activations; this model '
                    f'computes in {jnp.dtype(config.dtype).name}: its taus are for other logits '
                    '(calibrate with the same ACTIVATION_DTYPE).', stacklevel=2)
    return evaluation.Temperature(schedule=schedule, label=label or '')
  if schedule_strategy:
    raise ValueError('SCHEDULE_STRATEGY needs SCHEDULE_PATH.')
  if temperature is None:
    temperature = config.encoder_attention_temperature
  if isinstance(temperature, (list, tuple)):
    temperature = tuple(float(t) for t in temperature)
  else:
    temperature = float(temperature)
  network.check_temperature(temperature, 'TEMPERATURE')
  return evaluation.Temperature(constant=temperature, label=label or '')


def task_temperature(temp: evaluation.Temperature, task: str) -> evaluation.Temperature:
  """A schedule's entry calibrated on `task` (paper: per task and setting), else as given (a
  schedule with per-task entries but none for `task` warns and uses its pooled calibrations)."""
  if temp.schedule is None:
    return temp
  return dataclasses.replace(temp, schedule=temp.schedule.for_task(task))


def evaluate(*,
             model: network.Transformer | None = None,
             checkpoint_path: str | None = None,
             mixture_or_task_name: str | None = None,
             output_dir: str | None = None,
             temperature: Any = None,
             schedule_path: str | None = None,
             schedule_strategy: str | None = None,
             label: str | None = None,
             model_name: str | None = None,
             batch_size: int = 8,
             num_partitions: int = 1,
             num_examples: int | None = None,
             split: str = 'test',
             max_decode_length: int | None = None,
             params_dtype: str = 'float32',
             truncate_inputs: int | None = None,
             show_progress: bool = True) -> dict[str, dict[str, Any]]:
  """Runs every task of `mixture_or_task_name`; returns {task: metrics} of finished tasks.

  Args:
    model: the network (gin: @network.Transformer() from a gin/models file); its config is
      checked against the checkpoint. None infers the config from the checkpoint.
    checkpoint_path: any format `checkpoints.load_params` reads.
    mixture_or_task_name: a registered seqio task or mixture (e.g. 't5align_passkey'), or several
      separated by commas.
    output_dir: results folder; one subfolder per task.
    temperature: encoder temperature override (float or one per layer); None: the config's.
    schedule_path: a `t5align.schedule` JSON file giving per-example temperatures instead.
    schedule_strategy: which of the schedule's strategies to apply (default: its own).
    label: row label in reports (default: 'tau = x' or the schedule strategy's, e.g. 'w/ P_max').
    model_name: model name in reports (default: from the checkpoint path).
    batch_size: examples per decoding step (rounded up to a multiple of the 'data' axis).
    num_partitions: devices along the mesh's 'model' axis.
    num_examples: evaluate only the first n examples of each task.
    split: dataset split.
    max_decode_length: decoding steps; default: the task's (t5align tasks) or 64.
    params_dtype: dtype the parameters are cast to ('float32' or 'bfloat16').
    truncate_inputs: keep only each input's last `truncate_inputs` tokens (the paper's
      'truncation' baseline at L_tr, Table 6; label 'w/ truncation' by default). Records keep
      the full input length, so length buckets are the untruncated inputs'.
    show_progress: draw a progress bar per task.
  """
  gin_cli.require('evaluate', checkpoint_path=checkpoint_path,
                  mixture_or_task_name=mixture_or_task_name, output_dir=output_dir)
  import seqio  # pylint: disable=g-import-not-at-top
  import seqio_tasks  # pylint: disable=g-import-not-at-top,unused-import
  from seqio_tasks import catalog  # pylint: disable=g-import-not-at-top
  from seqio_tasks import metrics as task_metrics  # pylint: disable=g-import-not-at-top

  params, config = checkpoints.load_params(checkpoint_path, None if model is None else model.config,
                                           dtype=jnp.dtype(params_dtype))
  model = network.Transformer(config)
  if truncate_inputs is not None and label is None:
    label = TRUNCATION_LABEL
  temp = make_temperature(config, temperature, schedule_path, schedule_strategy, label)
  mesh = evaluation.make_mesh(num_partitions)
  params = evaluation.shard_params(config, params, mesh)
  data_size = mesh.shape['data']
  batch_size = -(-batch_size // data_size) * data_size
  model_name = model_name or _model_name(checkpoint_path)

  results = {}
  tasks = [t for name in str(mixture_or_task_name).split(',') if name.strip()
           for t in seqio.get_subtasks(seqio.get_mixture_or_task(name.strip()))]
  pooled_temp = temp
  for task in tasks:
    temp = task_temperature(pooled_temp, task.name)
    spec = catalog.SPECS.get(task.name)
    scored = (spec.max_decode_length == 0) if spec else (
        bool(task.score_metric_fns) and not task.predict_metric_fns)
    steps = max_decode_length or (spec.max_decode_length if spec else DEFAULT_MAX_DECODE_LENGTH)
    vocab = task.output_features['targets'].vocabulary
    eos_id = vocab.eos_id
    dataset = task.get_dataset(sequence_length=None, split=split, shuffle=False)
    examples = []
    for i, ex in enumerate(dataset.as_numpy_iterator()):
      if num_examples is not None and i >= num_examples:
        break
      examples.append({**ex, 'index': i})
    if not examples:
      raise ValueError(f'{task.name} ({split}) has no examples.')
    folder = os.path.join(output_dir, task.name)
    evaluation.check_run(folder, {
        'task': task.name, 'split': split, 'checkpoint': str(checkpoint_path),
        'num_examples': len(examples), 'mode': 'score' if scored else 'greedy',
        'max_decode_length': None if scored else steps, 'params_dtype': params_dtype,
        **({'truncate_inputs': truncate_inputs} if truncate_inputs is not None else {}),
        'config': {f.name: str(getattr(config, f.name)) for f in dataclasses.fields(config)},
        **temp.describe()})
    log = evaluation.PredictionLog(os.path.join(folder, 'predictions.jsonl'))

    def target_text(ex):
      if 'targets_pretokenized' in ex:
        return _text(ex['targets_pretokenized'])
      return vocab.decode([int(t) for t in ex['targets']])

    def process(batch, task=task, spec=spec, scored=scored, steps=steps, eos_id=eos_id,
                vocab=vocab, target_text=target_text, batch_size=batch_size):
      # Always `batch_size` rows (all-padding rows at the end), so shapes repeat across batches.
      size = batch_size
      rows = [ex['inputs'] if truncate_inputs is None else keep_last(ex['inputs'], truncate_inputs)
              for ex in batch]
      tokens = evaluation.pad_batch(evaluation.pad_tokens(rows), size)
      taus = temp.taus(tokens)
      taus[len(batch):] = 1.0
      inputs = evaluation.shard_batch(tokens, mesh)
      records = []
      if scored:
        targets = evaluation.pad_batch(evaluation.pad_tokens([ex['targets'] for ex in batch]),
                                       size)
        ll = np.asarray(evaluation.score_batch(model, params, inputs,
                                               evaluation.shard_batch(targets, mesh), taus))
        for j, ex in enumerate(batch):
          records.append({'log_likelihood': float(ll[j]),
                          'num_target_tokens': int(np.sum(targets[j] > 0))})
      else:
        out = np.asarray(decoding.greedy_decode(model, params, inputs, max_decode_length=steps,
                                                eos_id=eos_id, temperature=taus))
        for j, ex in enumerate(batch):
          prediction = vocab.decode(evaluation.strip_eos(out[j], eos_id))
          record = {'prediction': prediction}
          if spec is not None:
            target = task.postprocess_fn(target_text(ex), example=ex, is_target=True)
            record['scores'] = task_metrics.score_example(spec.family, target, prediction)
          records.append(record)
      for j, ex in enumerate(batch):
        records[j].update({'index': int(ex['index']), 'id': _text(ex.get('id', ex['index'])),
                           'input_length': int(np.sum(np.asarray(ex['inputs']) > 0)),
                           'target': target_text(ex), 'tau': taus[j].tolist()})
      return records

    evaluation.run_examples(examples, log, process, batch_size=batch_size, desc=task.name,
                            show_progress=show_progress)
    results[task.name] = _write_metrics(task, spec, examples, log, folder, scored, target_text,
                                        model_name=model_name, temp=temp,
                                        checkpoint_path=checkpoint_path)
  return results


def _write_metrics(task, spec, examples, log, folder, scored, target_text, *, model_name, temp,
                   checkpoint_path) -> dict[str, Any]:
  """Metrics of a finished task from its log, with the task's own seqio metric functions."""
  records = [log.records[int(ex['index'])] for ex in examples]
  targets = [task.postprocess_fn(target_text(ex), example=ex, is_target=True) for ex in examples]
  values: dict[str, Any] = {}
  if scored:
    scores = np.array([r['log_likelihood'] for r in records])
    for fn in task.score_metric_fns:
      values.update(fn(targets, scores))
  else:
    predictions = [task.postprocess_fn(r['prediction'], example=ex, is_target=False)
                   for r, ex in zip(records, examples)]
    for fn in task.predict_metric_fns:
      values.update(fn(targets, predictions))
  result = {
      'task': task.name, 'model': model_name, 'label': temp.label,
      'checkpoint': str(checkpoint_path), 'num_examples': len(examples),
      'metrics': {k: _plain(v) for k, v in values.items()},
      'family': spec.family if spec else None, 'table': spec.table if spec else 'other',
      'group': spec.group if spec else task.name, 'column': spec.column if spec else 'all',
      'primary_metric': 'perplexity' if scored else 'accuracy',
      **{k: v for k, v in temp.describe().items() if k != 'schedule'},
  }
  fileio.write_json_atomic(os.path.join(folder, 'metrics.json'), result)
  return result


# ---------------------------------------------------------------------------------------------
# Command line.


def main(argv: Sequence[str] | None = None) -> Mapping[str, Any]:
  gin_cli.configure(sys.argv[1:] if argv is None else argv, prog='python -m t5align.eval',
                    description=__doc__,
                    example_file='gin/runs/eval.gin plus a gin/models file')
  return gin_cli.call_configured('t5align.eval.evaluate')


if __name__ == '__main__':
  main()
