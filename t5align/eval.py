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

seqio is imported inside functions only; the library part is `t5align.evaluation`.
"""
from __future__ import annotations

import dataclasses
# gin's file reader (gin.resource_reader) uses importlib.util without importing it.
import importlib.util  # pylint: disable=unused-import  # noqa: F401
import os
import sys
import warnings
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from t5align import checkpoints
from t5align.evaluation import predictions
from t5align.evaluation import scoring
from t5align.evaluation import temperature as temperature_lib
from t5align import gin_cli
from t5align import memory
from t5align import network
from t5align import partitioning
from t5align import run_identity
from t5align.runtime import batching
from t5align.runtime import fileio
from t5align.runtime import multihost
from t5align.runtime import outputs
from t5align.runtime import validate
from t5align import schedule as schedule_lib

DEFAULT_MAX_DECODE_LENGTH = 64
INPUT_WIDTH_MULTIPLE = 128  # Batches are padded to a multiple of this many tokens.
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
                     label: str | None = None, model: str = 'the model'
                     ) -> temperature_lib.Temperature:
  """A constant (the override, else the config's) or a schedule file's temperatures, checked
  against the model's encoder layers (`model` names it in errors, e.g. its checkpoint)."""
  layers = config.num_encoder_layers
  if temperature is not None and schedule_path:
    raise ValueError('set TEMPERATURE or SCHEDULE_PATH, not both.')
  if schedule_path:
    schedule = schedule_lib.load_schedule(schedule_path, schedule_strategy)
    calibrated = schedule.provenance.get('dtype')
    if calibrated and jnp.dtype(calibrated) != jnp.dtype(config.dtype):
      warnings.warn(f'{schedule_path} was calibrated with {calibrated} activations; this model '
                    f'computes in {jnp.dtype(config.dtype).name}: its taus are for other logits '
                    '(calibrate with the same ACTIVATION_DTYPE).', stacklevel=2)
    fits = {(), (layers,), (layers, config.num_heads)}
    for task, cals in [('', schedule.calibrations), *schedule.tasks.items()]:
      shapes = {np.shape(c.tau) for c in cals[schedule.strategy]}
      if shapes - fits:
        shape = max(shapes - fits)
        raise ValueError(
            f'temperature schedule {schedule_path} (SCHEDULE_PATH): strategy '
            f'{schedule.strategy!r}{f" of task {task!r}" if task else ""} has '
            + (f'{shape[0]} per-layer taus' if len(shape) == 1 else
               f'[{shape[0]}][{shape[1]}] per-layer, per-head taus')
            + f' but {model} has {layers} encoder layers of {config.num_heads} heads: '
            'calibrate it for this model.')
    return temperature_lib.Temperature(schedule=schedule, label=label or '')
  if schedule_strategy:
    raise ValueError('SCHEDULE_STRATEGY needs SCHEDULE_PATH.')
  if temperature is None:
    temperature = validate.temperature_setting(
        config.encoder_attention_temperature, 'network.T5Config.encoder_attention_temperature '
        '(ENCODER_TEMPERATURE)', layers, model, config.num_heads)
  else:
    temperature = validate.temperature_setting(temperature, 'TEMPERATURE', layers, model,
                                               config.num_heads)
  return temperature_lib.Temperature(constant=temperature, label=label or '')


def task_temperature(temp: temperature_lib.Temperature, task: str) -> temperature_lib.Temperature:
  """A schedule's entry calibrated on `task` (paper: per task and setting), else as given (a
  schedule with per-task entries but none for `task` warns and uses its pooled calibrations)."""
  if temp.schedule is None:
    return temp
  return dataclasses.replace(temp, schedule=temp.schedule.for_task(task))


@outputs.claims('output_dir', 'EVAL_OUTPUT_DIR')
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
             show_progress: bool = True,
             check_finite: bool = True) -> dict[str, dict[str, Any]]:
  """Runs every task of `mixture_or_task_name`; returns {task: metrics} of finished tasks.

  With several processes, only process 0 writes files and returns metrics (the others: {}).

  Args:
    model: the network (gin: @network.Transformer() from a gin/models file); its config is
      checked against the checkpoint. None infers the config from the checkpoint.
    checkpoint_path: any format `checkpoints.load_params` reads.
    mixture_or_task_name: a registered seqio task or mixture (e.g. 't5align_passkey'), or several
      separated by commas.
    output_dir: results folder; one subfolder per task.
    temperature: encoder temperature override (a float, one per layer, or `[layers][heads]`
      tuples); None: the config's.
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
    check_finite: refuse a checkpoint holding NaN or inf (`checkpoints.load_params`).
  """
  gin_cli.require('evaluate', checkpoint_path=checkpoint_path,
                  mixture_or_task_name=mixture_or_task_name, output_dir=output_dir)
  validate.run_settings(batch_size=batch_size, num_partitions=num_partitions,
                        num_examples=num_examples, max_decode_length=max_decode_length,
                        params_dtype=params_dtype, truncate_inputs=truncate_inputs)
  import seqio  # pylint: disable=g-import-not-at-top
  import seqio_tasks  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  from seqio_tasks import catalog  # pylint: disable=g-import-not-at-top
  from seqio_tasks import metrics as task_metrics  # pylint: disable=g-import-not-at-top

  tasks = [t for name in str(mixture_or_task_name).split(',') if name.strip()
           for t in seqio.get_subtasks(seqio.get_mixture_or_task(name.strip()))]
  vocabularies = {t.name: t.output_features['targets'].vocabulary for t in tasks}
  vocabulary_ids = {t: run_identity.vocabulary_fingerprint(v) for t, v in vocabularies.items()}
  options = catalog.options()
  # Every process must run the same command: compared before any checkpoint is read.
  run_identity.check_same_processes({
      'gin': run_identity.gin_config(ignore=()), 'task_options': options,
      'vocabularies': vocabulary_ids, 'arguments': {
          'checkpoint_path': str(checkpoint_path), 'output_dir': str(output_dir),
          'tasks': [t.name for t in tasks], 'temperature': temperature,
          'schedule_path': schedule_path, 'num_examples': num_examples,
          'split': split, 'truncate_inputs': truncate_inputs}})
  rows = checkpoints.embedding_rows(checkpoint_path)
  for name, vocab in vocabularies.items():
    files = ','.join(run_identity.vocabulary_files(vocab))
    validate.vocabulary_fits(vocab.vocab_size, rows, model=f'checkpoint {checkpoint_path}',
                             vocabulary=f'vocabulary {files} (task {name})')
  if truncate_inputs is not None and label is None:
    label = TRUNCATION_LABEL
  model_label = f'checkpoint {checkpoint_path}'
  temp = None if model is None else make_temperature(
      model.config, temperature, schedule_path, schedule_strategy, label, model_label)
  # What the records depend on (run.json): the checkpoint's content, not its path.
  base_identity = {
      'checkpoint': (run_identity.checkpoint_fingerprint(checkpoint_path)
                     if multihost.is_writer() else None),
      'checkpoint_path': str(checkpoint_path), 'gin': run_identity.gin_config(),
      'task_options': options}

  mesh = partitioning.eval_mesh(num_partitions)
  # Read sharded: each process reads only the slices its devices hold (T5X formats).
  params, config = checkpoints.load_params(checkpoint_path, None if model is None else model.config,
                                           dtype=jnp.dtype(params_dtype), mesh=mesh,
                                           check_finite=check_finite)
  model = network.Transformer(config)
  if temp is None:
    temp = make_temperature(config, temperature, schedule_path, schedule_strategy, label,
                            model_label)
  data_size = mesh.shape['data']
  batch_size = batching.round_up(batch_size, data_size)
  model_name = model_name or _model_name(checkpoint_path)
  rows_sharding = partitioning.batch_sharding(mesh, 2)
  my_rows = multihost.process_rows(rows_sharding, batch_size)  # This process's rows of a batch.
  # Processes feeding the same rows form a group; each group reads only its share of the
  # examples (seqio ShardInfo: example i belongs to group i % groups).
  groups, group = multihost.data_groups(rows_sharding, batch_size)
  show_progress = show_progress and multihost.is_writer()

  results = {}
  pooled_temp = temp
  for task in tasks:
    temp = task_temperature(pooled_temp, task.name)
    spec = catalog.SPECS.get(task.name)
    scored, steps = task_mode(spec, task, max_decode_length)
    vocab = vocabularies[task.name]
    eos_id = vocab.eos_id
    shard = seqio.ShardInfo(index=group, num_shards=groups) if groups > 1 else None
    dataset = task.get_dataset(sequence_length=None, split=split, shuffle=False,
                               shard_info=shard)
    examples = []  # This group's share, with global indices.
    for j, ex in enumerate(dataset.as_numpy_iterator()):
      index = group + groups * j
      if num_examples is not None and index >= num_examples:
        break
      examples.append({**ex, 'index': index})
    # [processes, 4]: group, examples, longest input and target; a group's processes report
    # the same.
    shares = np.asarray(multihost.gather(np.array(
        [[group, len(examples)] + [max([len(ex.get(k, ())) for ex in examples] + [0])
                                   for k in ('inputs', 'targets')]], np.int64))).reshape(-1, 4)
    total = int(sum({int(g): int(n) for g, n, _, _ in shares}.values()))
    if not total:
      raise ValueError(f'{task.name} ({split}) has no examples.')
    if groups > 1:
      print(f'{task.name}: process {jax.process_index()} reads {len(examples)} of {total} '
            f'examples (share {group} of {groups})', file=sys.stderr, flush=True)
    # Before anything is written or run: the step for the widest batch fits the devices.
    longest = int(shares[:, 2].max())
    _check_memory(model, mesh, params, temp, scored=scored, steps=steps, eos_id=eos_id,
                  batch_size=batch_size, longest_target=int(shares[:, 3].max()),
                  longest_input=min(longest, truncate_inputs or longest))
    folder = os.path.join(output_dir, task.name)
    # NOTE: process_count, device_count and mesh joined run.json's settings with multi-host
    # support; a folder written before then reads as a different run (start a new folder).
    settings = {
        **base_identity, 'task': task.name, 'split': split,
        'vocabulary': vocabulary_ids[task.name], 'examples_sha256': _examples_sha256(examples),
        'num_examples': total, 'mode': 'score' if scored else 'greedy',
        'max_decode_length': None if scored else steps, 'params_dtype': params_dtype,
        **({'truncate_inputs': truncate_inputs} if truncate_inputs is not None else {}),
        'config': {f.name: str(getattr(config, f.name)) for f in dataclasses.fields(config)},
        'process_count': jax.process_count(), 'device_count': jax.device_count(),
        'mesh': dict(mesh.shape), **temp.describe()}
    log = SharedLog.open(folder, settings, total)

    def target_text(ex):
      if 'targets_pretokenized' in ex:
        return _text(ex['targets_pretokenized'])
      return vocab.decode([int(t) for t in ex['targets']])

    def process(batch, task=task, spec=spec, scored=scored, steps=steps, eos_id=eos_id,
                vocab=vocab, target_text=target_text, batch_size=batch_size):
      # This process's rows of one global batch of `batch_size` rows (all-padding rows fill
      # it, so shapes repeat across batches); every process pads to the same width.
      rows = len(my_rows)
      inputs = [ex['inputs'] if truncate_inputs is None
                else keep_last(ex['inputs'], truncate_inputs) for ex in batch]
      width = _global_width(inputs)
      place = lambda x: multihost.global_batch(x, rows_sharding, batch_size)
      tokens = batching.pad_batch(batching.pad_tokens(inputs, min_length=width), rows)
      validate.token_ids(tokens, config.vocab_size, f'{task.name} inputs')
      taus = temp.taus(tokens)
      taus[len(batch):] = 1.0
      # What the metrics compare, made here where the example was read (see `_write_metrics`).
      targets = [task.postprocess_fn(target_text(ex), example=ex, is_target=True)
                 for ex in batch]
      records = []
      if scored:
        target_tokens = batching.pad_batch(batching.pad_tokens(
            [ex['targets'] for ex in batch],
            min_length=_global_width([ex['targets'] for ex in batch])), rows)
        ll = multihost.gather(step(model, mesh, scored=True, steps=steps, eos_id=eos_id)(
            params, place(tokens), place(target_tokens), place(taus)))[my_rows]
        for j, ex in enumerate(batch):
          records.append({'log_likelihood': float(ll[j]),
                          'num_target_tokens': int(np.sum(target_tokens[j] > 0))})
      else:
        out = multihost.gather(step(model, mesh, scored=False, steps=steps, eos_id=eos_id)(
            params, place(tokens), place(taus)))[my_rows]
        for j, ex in enumerate(batch):
          prediction = vocab.decode(batching.strip_eos(out[j], eos_id))
          record = {'prediction': prediction}
          processed = task.postprocess_fn(prediction, example=ex, is_target=False)
          if processed != prediction:
            record['postprocessed_prediction'] = processed
          if spec is not None:
            record['scores'] = task_metrics.score_example(spec.family, targets[j], prediction)
          records.append(record)
      for j, ex in enumerate(batch):
        records[j].update({'index': int(ex['index']), 'id': _text(ex.get('id', ex['index'])),
                           'input_length': int(np.sum(np.asarray(ex['inputs']) > 0)),
                           'target': target_text(ex), 'tau': taus[j].tolist(),
                           'postprocessed_target': targets[j]})
      return records

    predictions.run_examples(examples, log, process, batch_size=len(my_rows), desc=task.name,
                            show_progress=show_progress, total=total,
                            collect=multihost.gather_json)
    metrics = multihost.on_writer(
        lambda: _write_metrics(task, spec, total, log.log, folder, scored,
                               model_name=model_name, temp=temp, checkpoint_path=checkpoint_path),
        f'writing {folder}/metrics.json')
    if metrics is not None:
      results[task.name] = metrics
    multihost.barrier(f't5align.eval:{task.name}')
  return results


def _examples_sha256(examples: Sequence[Mapping[str, Any]]) -> str:
  """One fingerprint of every process's examples (index, input and target tokens), in index
  order: the data, seed, options and tokenizer the records were made from."""
  mine = [[int(ex['index']), run_identity.array_fingerprint([ex['inputs'], ex['targets']])]
          for ex in examples]
  everyone = dict(map(tuple, multihost.gather_json(mine)))  # A group's processes agree.
  return run_identity.array_fingerprint(
      [np.frombuffer(f'{i}:{everyone[i]}'.encode(), np.uint8) for i in sorted(everyone)])


def task_mode(spec: Any, task: Any, max_decode_length: int | None) -> tuple[bool, int]:
  """(scored, decoding steps) of a task as eval runs it: a catalog task (`spec`, a
  `seqio_tasks.catalog.TaskSpec`) is scored when its spec decodes nothing, another seqio `task`
  when it has score metrics and no predict metrics; steps: MAX_DECODE_LENGTH, else the spec's,
  else `DEFAULT_MAX_DECODE_LENGTH`."""
  scored = (spec.max_decode_length == 0) if spec else (
      bool(task.score_metric_fns) and not task.predict_metric_fns)
  steps = max_decode_length or (spec.max_decode_length if spec else DEFAULT_MAX_DECODE_LENGTH)
  return scored, steps


def step(model: network.Transformer, mesh: jax.sharding.Mesh, *, scored: bool, steps: int,
         eos_id: int) -> Callable:
  """A task's step on `mesh`, the one function its batches and its memory check call:
  `(params, inputs, targets, taus) -> [b]` log-likelihoods for a scored task, else greedy
  decoding `(params, inputs, taus) -> [b, steps]` tokens."""
  if scored:
    return scoring.partitioned_score(model, mesh)
  return scoring.partitioned_greedy_decode(model, mesh, steps, eos_id)


def step_arguments(mesh: jax.sharding.Mesh, params: Any, temp: temperature_lib.Temperature, *,
                   scored: bool, batch_size: int, input_width: int,
                   target_width: int) -> tuple[Any, ...]:
  """`step`'s abstract arguments for a global batch of `batch_size` rows `input_width` tokens
  wide (targets `target_width`), as the run places them: every batch argument sharded by rows,
  the taus shaped as `temp.taus` makes them (`[b, 1]`, `[b, layers]` or `[b, layers, heads]`)."""
  rows = partitioning.batch_sharding(mesh, 2)
  tokens = jax.ShapeDtypeStruct((batch_size, input_width), jnp.int32, sharding=rows)
  # [1, width] -> [1, 1 | layers (, heads)]
  tau_shape = temp.taus(np.ones((1, input_width), np.int32)).shape[1:]
  taus = jax.ShapeDtypeStruct((batch_size, *tau_shape), jnp.float32, sharding=rows)
  if not scored:
    return params, tokens, taus
  targets = jax.ShapeDtypeStruct((batch_size, target_width), jnp.int32, sharding=rows)
  return params, tokens, targets, taus


def _check_memory(model: network.Transformer, mesh: jax.sharding.Mesh, params: Any,
                  temp: temperature_lib.Temperature, *, scored: bool, steps: int, eos_id: int,
                  batch_size: int, longest_input: int, longest_target: int) -> memory.Compiled:
  """Compiles the task's step for its widest batch and refuses it if XLA's memory figure
  exceeds the device's (`memory.check_compiled`): the program of `step` and `step_arguments`,
  which the run calls."""
  width = batching.round_up(max(longest_input, 1), INPUT_WIDTH_MULTIPLE)
  args = step_arguments(mesh, params, temp, scored=scored, batch_size=batch_size,
                        input_width=width, target_width=batching.round_up(
                            max(longest_target, 1), INPUT_WIDTH_MULTIPLE))
  lowered = step(model, mesh, scored=scored, steps=steps, eos_id=eos_id).lower(*args)
  compiled = memory.Compiled.of(lowered.compile(), parameter_bytes=memory.per_device_bytes(
      params), input_bytes=memory.per_device_bytes(args[1:]))
  return memory.check_compiled(compiled, hints=memory.settings_to_change(
      model_shards=mesh.shape['model'], batch_size=batch_size, length=width,
      attention_impl=network.encoder_attention_impl(model.config, width)))


def _global_width(rows: Sequence[Sequence[int]], multiple: int = INPUT_WIDTH_MULTIPLE) -> int:
  """The padded width (a multiple of `multiple`) of the longest row over every process."""
  longest = max([len(r) for r in rows] + [1])
  return int(np.asarray(multihost.gather(np.array([batching.round_up(longest, multiple)]))).max())


class SharedLog:
  """The prediction log as every process sees it: process 0 owns the file, all know the indices.

  Resume: process 0 alone opens (and, after a kill, repairs) predictions.jsonl and broadcasts
  which examples it holds, so every process skips the same ones and the global batches agree.
  Reading the file on every host instead would need every host to see the output folder, and
  two processes could both cut a torn last line. Appends happen on process 0 only.
  """

  def __init__(self, log: predictions.PredictionLog | None, done: np.ndarray):
    self.log = log  # On process 0; None elsewhere.
    self.done = set(int(i) for i in np.flatnonzero(done))

  @classmethod
  def open(cls, folder: str, settings: Mapping[str, Any], num_examples: int) -> SharedLog:
    """Checks or writes run.json and opens predictions.jsonl (process 0), then broadcasts."""
    def open_log():
      predictions.check_run(folder, settings)
      return predictions.PredictionLog(os.path.join(folder, 'predictions.jsonl'))

    log = multihost.on_writer(open_log, f'opening {folder}')
    done = np.zeros(num_examples, np.int32)
    if log is not None:
      done[[i for i in log.records if 0 <= i < num_examples]] = 1
    return cls(log, multihost.broadcast(done))

  def __contains__(self, index: int) -> bool:
    return index in self.done

  def __len__(self) -> int:
    return len(self.done)

  def append(self, records: Sequence[Mapping[str, Any]]) -> None:
    multihost.on_writer(lambda: self.log.append(records), 'appending predictions')
    self.done.update(int(r['index']) for r in records)


def _write_metrics(task, spec, total, log, folder, scored, *, model_name, temp,
                   checkpoint_path) -> dict[str, Any]:
  """Metrics of a finished task from its log, with the task's own seqio metric functions.

  Records carry the postprocessed target (and prediction), made where the example was read,
  so the writing process needs no example of another process's share.
  """
  records = [log.records[i] for i in range(total)]
  taus = sorted({tuple(np.ravel(r['tau']).tolist()) for r in records})
  constant = temp.describe().get('temperature')
  if constant is not None and taus != [tuple(np.ravel(np.float32(constant)).tolist())]:
    raise ValueError(f'{folder}: the records were made at temperatures {taus[:8]}, not this '
                     f'run\'s {constant}: the folder mixes runs; evaluate into a new folder.')
  targets = [r['postprocessed_target'] for r in records]
  values: dict[str, Any] = {}
  if scored:
    scores = np.array([r['log_likelihood'] for r in records])
    for fn in task.score_metric_fns:
      values.update(fn(targets, scores))
  else:
    predicted = [r.get('postprocessed_prediction', r['prediction']) for r in records]
    for fn in task.predict_metric_fns:
      values.update(fn(targets, predicted))
  result = {
      'task': task.name, 'model': model_name, 'label': temp.label,
      'checkpoint': str(checkpoint_path), 'num_examples': total,
      'metrics': {k: _plain(v) for k, v in values.items()},
      'family': spec.family if spec else None, 'table': spec.table if spec else 'other',
      'group': spec.group if spec else task.name, 'column': spec.column if spec else 'all',
      'primary_metric': 'perplexity' if scored else 'accuracy',
      **{k: v for k, v in temp.describe().items() if k != 'schedule'},
      # From the records: the temperatures the metrics' predictions were made at.
      'record_temperatures': {'distinct': len(taus), 'min': [min(t) for t in zip(*taus)],
                              'max': [max(t) for t in zip(*taus)],
                              **({'values': [list(t) for t in taus]} if len(taus) <= 8 else {})},
  }
  fileio.write_json_atomic(os.path.join(folder, 'metrics.json'), result)
  return result


# ---------------------------------------------------------------------------------------------
# Command line.


def main(argv: Sequence[str] | None = None) -> Mapping[str, Any]:
  gin_cli.log_plainly()
  multihost.initialize()  # First: before anything starts a JAX backend.
  gin_cli.configure(sys.argv[1:] if argv is None else argv, prog='python -m t5align.eval',
                    description=__doc__,
                    example_file='gin/runs/eval.gin plus a gin/models file')
  return gin_cli.call_configured('t5align.eval.evaluate')


if __name__ == '__main__':
  main()
