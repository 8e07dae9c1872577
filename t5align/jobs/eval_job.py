"""The evaluation job: a checkpoint on seqio tasks at an encoder temperature, resumably.

Per task of the mixture, `output_dir/<task>/` gets predictions.jsonl (appended and fsynced batch
by batch), run.json (`EvalJob.identity`) and, once every example is done, metrics.json (written
atomically); a rerun skips the examples recorded. With several processes the mesh spans every
process's devices, each places only its rows of a batch, and process 0 alone writes.
seqio is imported inside functions only. The library does the work: `evaluation.scoring` (the
steps), `evaluation.predictions` (the loop, the shared log, the records' fields),
`evaluation.metrics` (metrics.json) and `evaluation.temperature` (the temperature).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Callable, ClassVar, Mapping, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from t5align.evaluation import metrics as metrics_lib
from t5align.evaluation import predictions
from t5align.evaluation import scoring
from t5align.evaluation import temperature as temperature_lib
from t5align import fields
from t5align import gin_cli
from t5align.jobs import common
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
INPUT_WIDTH_MULTIPLE = predictions.INPUT_WIDTH_MULTIPLE  # Batches are padded to a multiple.
TRUNCATION_LABEL = 'w/ truncation'  # paper Table 6's baseline row
# The EOS `programs` decodes with (T5's): the early stop changes no shape of the program.
PREFLIGHT_EOS_ID = 1


@dataclasses.dataclass(frozen=True)
class EvalJob:
  """`python -m t5align.eval`'s settings (gin/runs/eval.gin binds its macros to these fields,
  as `jobs.EvalJob`: `gin_cli.register_job`) and its run.

  Attributes:
    model: the network (gin: @network.Transformer() from a gin/models file); its config is
      checked against the checkpoint. None infers the config from the checkpoint.
    checkpoint: the checkpoint (`jobs.Checkpoint`: CHECKPOINT_PATH, any format
      `checkpoints.load_params` reads; PARAMS_DTYPE, the dtype the parameters are cast to,
      'float32' or 'bfloat16'; whether NaN or inf is refused).
    mixture_or_task_name: a registered seqio task or mixture (e.g. 't5align_passkey'), or several
      separated by commas.
    output_dir: results folder; one subfolder per task.
    temperature: encoder temperature override (a float, one per layer, or `[layers][heads]`
      tuples); None: the config's.
    schedule_path: a `t5align.schedule` JSON file giving per-example temperatures instead.
    schedule_strategy: which of the schedule's strategies to apply (default: its own).
    allow_schedule_mismatch: apply the schedule where it does not match the run: calibrated on
      another checkpoint (its recorded content sha256), or with per-task entries and none for
      a task (its pooled entry). False: both are refused, naming the schedule and the run.
    label: row label in reports (default: 'tau = x' or the schedule strategy's, e.g. 'w/ P_max').
    model_name: model name in reports (default: from the checkpoint path).
    batch_size: examples per decoding step (rounded up to a multiple of the 'data' axis).
    num_partitions: devices along the mesh's 'model' axis.
    num_examples: evaluate only the first n examples of each task.
    split: dataset split.
    max_decode_length: decoding steps; default: the task's (t5align tasks) or 64.
    truncate_inputs: keep only each input's last `truncate_inputs` tokens (the paper's
      'truncation' baseline at L_tr, Table 6; label 'w/ truncation' by default). Records keep
      the full input length, so length buckets are the untruncated inputs'.
    show_progress: draw a progress bar per task.

  run.json (`identity`) records `split`, `truncate_inputs` and `checkpoint.params_dtype` as
  settings; each other field says in its metadata what records it or why nothing does.
  """

  model: network.Transformer | None = fields.setting(
      None, check=fields.optional(fields.instance(
          network.Transformer, 'a network.Transformer (gin: @network.Transformer())'),
          "None (the checkpoint's config)"),
      unrecorded="recorded as 'config', the config the run computes with (the model's or the "
                 "checkpoint's)")
  checkpoint: common.Checkpoint = fields.setting(
      default_factory=common.Checkpoint,
      check=common.settings_object(common.Checkpoint, 'checkpoint', none='None (unset)'))
  mixture_or_task_name: str | None = fields.setting(
      None, check=fields.required(fields.text(blank=False)),
      unrecorded="each task's folder records its task ('task')")
  output_dir: str | None = fields.setting(None, check=fields.required(fields.path()),
                                          unrecorded='where results go')
  temperature: Any = fields.setting(
      None, check=fields.optional(fields.temperature(), "None (the config's)"),
      unrecorded='recorded as the temperatures applied (`Temperature.describe`)')
  schedule_path: str | None = fields.setting(
      None, check=fields.optional(fields.path()),
      unrecorded='recorded as the temperatures applied (`Temperature.describe`)')
  schedule_strategy: str | None = fields.setting(
      None, check=fields.optional(fields.text(blank=False), "None (the schedule's own)"),
      unrecorded='recorded as the temperatures applied (`Temperature.describe`)')
  allow_schedule_mismatch: bool = fields.setting(
      False, check=fields.boolean(),
      unrecorded='recorded as the temperatures applied (`Temperature.describe`)')
  label: str | None = fields.setting(
      None, check=fields.optional(fields.text(), "None (the temperature's)"),
      unrecorded="recorded as the temperatures' label (`Temperature.describe`)")
  model_name: str | None = fields.setting(
      None, check=fields.optional(fields.text(), "None (the checkpoint path's)"),
      unrecorded='a name in reports')
  batch_size: int = fields.setting(
      8, check=fields.integer(1),
      unrecorded='examples are computed independently of their batch')
  num_partitions: int = fields.setting(1, check=fields.integer(1),
                                       unrecorded="recorded as 'mesh'")
  num_examples: int | None = fields.setting(
      None, check=fields.optional(fields.integer(1), 'None (all)'),
      unrecorded="recorded as the task's examples, their count and fingerprint")
  split: str = fields.setting('test', check=fields.text(blank=False))
  max_decode_length: int | None = fields.setting(
      None, check=fields.optional(fields.integer(1), "None (the task's)"),
      unrecorded="recorded as the steps the task decodes ('max_decode_length')")
  truncate_inputs: int | None = fields.setting(
      None, check=fields.optional(fields.integer(1), 'None (whole inputs)'))
  show_progress: bool = fields.setting(True, check=fields.boolean(), unrecorded='draws a bar')

  GIN_NAME: ClassVar[str] = 'jobs.EvalJob'
  # The settings a run needs, by their gin macro (`gin_cli.require`).
  REQUIRED: ClassVar[Mapping[str, str]] = {
      'checkpoint.path': 'CHECKPOINT_PATH', 'mixture_or_task_name': 'MIXTURE_OR_TASK_NAME',
      'output_dir': 'EVAL_OUTPUT_DIR'}
  KIND: ClassVar[str] = 'eval'

  def __post_init__(self):
    fields.check_fields(self)  # Unset (None, %gin.REQUIRED): `check` names the macro.

  @property
  def params_dtype(self) -> str:
    return self.checkpoint.params_dtype

  @property
  def row_label(self) -> str | None:
    """LABEL, else 'w/ truncation' with TRUNCATE_INPUTS, else None (the temperature's)."""
    if self.label is None and self.truncate_inputs is not None:
      return TRUNCATION_LABEL
    return self.label

  def check(self) -> None:
    """The settings that need no file, each error naming its macro."""
    gin_cli.require(self)  # Each field was checked as the job was built (`fields`).

  def mesh(self) -> jax.sharding.Mesh:
    """The ('data', 'model') mesh over every device, NUM_PARTITIONS along 'model'."""
    return partitioning.eval_mesh(self.num_partitions)

  def temperature_of(self, config: network.T5Config) -> temperature_lib.Temperature:
    """A constant (TEMPERATURE, else the config's) or the schedule file's temperatures, checked
    against the model's encoder layers."""
    return temperature_lib.make_temperature(config, self.temperature, self.schedule_path,
                            self.schedule_strategy, self.row_label, self.checkpoint.name)

  def _check_schedule_model(self, schedule: schedule_lib.TemperatureSchedule | None,
                            fingerprint: Any) -> None:
    """Refuses SCHEDULE_PATH's `schedule` (None: no schedule) when it was calibrated on another
    checkpoint than this run's (`fingerprint`, its content's: None on a process that does not
    fingerprint), unless ALLOW_SCHEDULE_MISMATCH. A schedule that records no checkpoint
    (written by hand or by an older calibrate) claims no model and is applied as given."""
    if schedule is None or self.allow_schedule_mismatch or fingerprint is None:
      return
    identity = schedule.provenance.get('identity')
    calibrated = identity.get('checkpoint') if isinstance(identity, Mapping) else None
    if not isinstance(calibrated, Mapping) or calibrated.get('sha256') == fingerprint.get(
        'sha256'):
      return
    where = identity.get('checkpoint_path') or 'a checkpoint'
    raise ValueError(
        f'temperature schedule {self.schedule_path} (SCHEDULE_PATH) was calibrated on {where} '
        f'(content sha256 {str(calibrated.get("sha256"))[:12]}), not on this run\'s '
        f'{self.checkpoint.name} (sha256 {fingerprint["sha256"][:12]}): its temperatures are '
        'another model\'s. Calibrate this checkpoint (python -m t5align.calibrate), or set '
        '--gin.ALLOW_SCHEDULE_MISMATCH=True to apply them as they are.')

  def task_mode(self, spec: Any, task: Any = None) -> tuple[bool, int]:
    """(scored, decoding steps) of a task as this job runs it: a catalog task (`spec`, a
    `seqio_tasks.catalog.TaskSpec`) is scored when its spec decodes nothing, another seqio
    `task` when it has score metrics and no predict metrics; steps: MAX_DECODE_LENGTH, else the
    spec's, else `DEFAULT_MAX_DECODE_LENGTH`."""
    scored = (spec.max_decode_length == 0) if spec else (
        bool(task.score_metric_fns) and not task.predict_metric_fns)
    steps = self.max_decode_length or (spec.max_decode_length if spec
                                       else DEFAULT_MAX_DECODE_LENGTH)
    return scored, steps

  # -------------------------------------------------------------------------------------------
  # Programs: one builder for the run's batches, its memory check and the pre-flight.

  def program(self, model: network.Transformer, mesh: jax.sharding.Mesh, params: Any,
              temp: temperature_lib.Temperature, *, scored: bool, steps: int, eos_id: int,
              input_length: int, target_length: int = 1,
              tasks: Sequence[str] = ()) -> common.Program:
    """A task's step on `mesh` for a global batch of BATCH_SIZE rows (rounded up to the 'data'
    axis) of `input_length` tokens (targets `target_length`), each padded to a multiple of 128:
    `(params, inputs, targets, taus) -> [b]` log-likelihoods for a scored task, else greedy
    decoding `(params, inputs, taus) -> [b, steps]` tokens; the taus shaped as `temp.taus`
    makes them (`[b, 1]`, `[b, layers]` or `[b, layers, heads]`)."""
    target_width = batching.round_up(max(target_length, 1), INPUT_WIDTH_MULTIPLE)
    workload = memory.Workload(
        model.config, input_length, self.batch_size, self.checkpoint.params_dtype,
        pad_to=INPUT_WIDTH_MULTIPLE, model_shards=mesh.shape['model'],
        data_shards=mesh.shape['data'], decoding=True, decode_steps=None if scored else steps,
        target_length=target_width if scored else 0, tasks=tuple(tasks))
    batch, width = workload.rows, workload.width
    rows = partitioning.batch_sharding(mesh, 2)
    tokens = jax.ShapeDtypeStruct((batch, width), jnp.int32, sharding=rows)
    # [1, width] -> [1, 1 | layers (, heads)]
    tau_shape = temp.taus(np.ones((1, width), np.int32)).shape[1:]
    taus = jax.ShapeDtypeStruct((batch, *tau_shape), jnp.float32, sharding=rows)
    if scored:
      fn = scoring.partitioned_score(model, mesh)
      targets = jax.ShapeDtypeStruct((batch, target_width), jnp.int32, sharding=rows)
      args, names = (params, tokens, targets, taus), ('inputs', 'targets', 'taus')
      what = f'scoring of {target_width}-token targets'
    else:
      fn = scoring.partitioned_greedy_decode(model, mesh, steps, eos_id)
      args, names = (params, tokens, taus), ('inputs', 'taus')
      what = f'greedy decoding of {steps} steps'
    return common.Program(
        name='eval', description=what + (f' (tasks {", ".join(tasks)})' if tasks else ''),
        fn=fn, args=args, names=names, units=batch, unit='example', workload=workload)

  def programs(self, config: network.T5Config, mesh: jax.sharding.Mesh, params: Any, *,
               length: int | None = None) -> list[common.Program]:
    """Each distinct program this job runs for `length`-token inputs, in task order, for a
    check before the run (the pre-flight): MIXTURE_OR_TASK_NAME's t5align tasks decide scoring
    and steps, read from `seqio_tasks.catalog`, not from data; no tasks: decoding of
    MAX_DECODE_LENGTH or 64.

    Raises:
      ValueError: `length` None (eval's inputs are as long as the data's: give the length to
        check), or naming a task that is not one of t5align's: whether it is scored, and its
        target length, are not known without its data.
    """
    if length is None:
      raise ValueError('--length (the encoder input tokens, e.g. --length=32768) is required: '
                       "eval's inputs are as long as the task's data.")
    model = network.Transformer(config)
    temp = self._assumed_temperature(config)
    length = min(length, self.truncate_inputs or length)
    modes: dict[tuple[bool, int, int], list[str]] = {}
    for task, spec, target in self._catalog_tasks():
      scored, steps = self.task_mode(spec)
      modes.setdefault((scored, steps, target if scored else 1), []).append(task)
    if not self.mixture_or_task_name:
      modes[(False, self.max_decode_length or DEFAULT_MAX_DECODE_LENGTH, 1)] = []
    return [self.program(model, mesh, params, temp, scored=scored, steps=steps,
                         eos_id=PREFLIGHT_EOS_ID, input_length=length, target_length=target,
                         tasks=tasks)
            for (scored, steps, target), tasks in modes.items()]

  def _catalog_tasks(self) -> list[tuple[str, Any, int]]:
    """(task, spec, target length of a scored task) of MIXTURE_OR_TASK_NAME's t5align tasks."""
    if not self.mixture_or_task_name:
      return []
    from seqio_tasks import catalog  # pylint: disable=g-import-not-at-top
    found = []
    for name in [n.strip() for n in str(self.mixture_or_task_name).split(',') if n.strip()]:
      try:
        tasks = catalog.resolve(name)
      except KeyError as e:
        raise ValueError(
            f'MIXTURE_OR_TASK_NAME={name!r} is not a t5align task or mixture, so the '
            'pre-flight cannot tell whether eval scores or decodes it, nor its target length. '
            'Check a t5align task with the same input length and decoding (e.g. '
            'MIXTURE_OR_TASK_NAME=t5align_passkey_20k for decoding, t5align_lm_wiki_15000 for '
            'scoring), or leave MIXTURE_OR_TASK_NAME out to check decoding of '
            'MAX_DECODE_LENGTH steps.') from e
      found += [(t, catalog.SPECS[t], catalog.options()['lm_continuation']) for t in tasks]
    return found

  def _assumed_temperature(self, config: network.T5Config) -> temperature_lib.Temperature:
    """The temperature, or without the schedule file (the pre-flight may run before it is
    written) one tau per layer, the widest a schedule's calibration per layer gives."""
    if self.schedule_path and self.temperature is None and not fileio.exists(self.schedule_path):
      return temperature_lib.Temperature((1.0,) * config.num_encoder_layers)
    return self.temperature_of(config)

  # -------------------------------------------------------------------------------------------
  # The run.

  @functools.cached_property
  def _base_identity(self) -> dict[str, Any]:
    """What every task's records share (`run_identity.make`), made once per job: the
    checkpoint's content (read by the process that writes; its path informational), the
    settings, the task options and jax's matmul precision."""
    from seqio_tasks import catalog  # pylint: disable=g-import-not-at-top
    return run_identity.make(
        checkpoint=self.checkpoint.path, resolved_checkpoint=self.checkpoint.resolved,
        fingerprint=multihost.is_writer(), settings=run_identity.settings_record(self),
        facts={'task_options': catalog.options()})

  def identity(self, facts: Mapping[str, Any]) -> dict[str, Any]:
    """A task's run.json: what every task shares and `facts`, the task's own (`_Run.facts`:
    the task, its data, the program, the temperatures)."""
    return {**self._base_identity, **json.loads(json.dumps(facts, sort_keys=True))}

  def resume_note(self) -> str:
    return (f'The examples recorded so far are kept in {self.output_dir} (predictions.jsonl '
            'per task); rerun the same command to finish from them.')

  def run(self) -> dict[str, dict[str, Any]]:
    """Runs every task; returns {task: metrics} of finished tasks (with several processes,
    process 0's; the others return {})."""
    with outputs.claim(self.output_dir, 'EVAL_OUTPUT_DIR'):  # Unset: `check` reports it.
      return self._run()

  def _run(self) -> dict[str, dict[str, Any]]:
    self.check()
    import seqio  # pylint: disable=g-import-not-at-top
    import seqio_tasks  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
    from seqio_tasks import catalog  # pylint: disable=g-import-not-at-top

    tasks = [t for name in str(self.mixture_or_task_name).split(',') if name.strip()
             for t in seqio.get_subtasks(seqio.get_mixture_or_task(name.strip()))]
    vocabularies = {t.name: t.output_features['targets'].vocabulary for t in tasks}
    vocabulary_ids = {t: run_identity.vocabulary_fingerprint(v) for t, v in vocabularies.items()}
    options = catalog.options()
    checkpoint = self.checkpoint
    # Every process must run the same command: compared before any checkpoint is read.
    run_identity.check_same_processes({
        'gin': run_identity.gin_config(), 'task_options': options,
        'vocabularies': vocabulary_ids, 'arguments': {
            'checkpoint_path': checkpoint.path, 'checkpoint_resolved_path': checkpoint.resolved,
            'output_dir': str(self.output_dir),
            'tasks': [t.name for t in tasks], 'temperature': self.temperature,
            'schedule_path': self.schedule_path, 'num_examples': self.num_examples,
            'split': self.split, 'truncate_inputs': self.truncate_inputs}})
    rows = checkpoint.embedding_rows()
    for name, vocab in vocabularies.items():
      files = ','.join(run_identity.vocabulary_files(vocab))
      validate.vocabulary_fits(vocab.vocab_size, rows, model=checkpoint.name,
                               vocabulary=f'vocabulary {files} (task {name})')
    # Checked before any weight is read when the model file gives the config.
    temp = None if self.model is None else self.temperature_of(self.model.config)
    schedule = temp.schedule if temp is not None else (  # The file, before any weight is read.
        schedule_lib.load_schedule(self.schedule_path, self.schedule_strategy)
        if self.schedule_path else None)
    # The checkpoint's fingerprint, before its weights are read.
    self._check_schedule_model(schedule, self._base_identity.get('checkpoint'))
    mesh = self.mesh()
    params, config = checkpoint.load(None if self.model is None else self.model.config, mesh)
    run = _Run(self, network.Transformer(config), mesh, params,
               temp or self.temperature_of(config), vocabulary_ids)
    results = {}
    for task in tasks:
      metrics = run.task(task, catalog.SPECS.get(task.name), vocabularies[task.name])
      if metrics is not None:
        results[task.name] = metrics
      multihost.barrier(f't5align.eval:{task.name}')
    return results


gin_cli.register_job(EvalJob)


@dataclasses.dataclass
class _Run:
  """One run of an `EvalJob`: the loaded model on its mesh, task by task."""

  job: EvalJob
  model: network.Transformer
  mesh: jax.sharding.Mesh
  params: Any
  pooled_temp: temperature_lib.Temperature
  vocabulary_ids: Mapping[str, Any]

  def __post_init__(self):
    job = self.job
    self.batch_size = batching.round_up(job.batch_size, self.mesh.shape['data'])
    self.model_name = job.model_name or metrics_lib.model_name(job.checkpoint.path)
    self.rows_sharding = partitioning.batch_sharding(self.mesh, 2)
    self.my_rows = multihost.process_rows(self.rows_sharding, self.batch_size)
    # Processes feeding the same rows form a group; each group reads only its share of the
    # examples (seqio ShardInfo: example i belongs to group i % groups).
    self.groups, self.group = multihost.data_groups(self.rows_sharding, self.batch_size)

  def examples(self, task: Any) -> tuple[list[dict[str, Any]], np.ndarray]:
    """This group's share of the task's examples, with global indices, and every process's
    [group, examples, longest input, longest target]."""
    import seqio  # pylint: disable=g-import-not-at-top
    job, groups, group = self.job, self.groups, self.group
    shard = seqio.ShardInfo(index=group, num_shards=groups) if groups > 1 else None
    dataset = task.get_dataset(sequence_length=None, split=job.split, shuffle=False,
                               shard_info=shard)
    examples = []
    for j, ex in enumerate(dataset.as_numpy_iterator()):
      index = group + groups * j
      if job.num_examples is not None and index >= job.num_examples:
        break
      examples.append({**ex, 'index': index})
    # [processes, 4]; a group's processes report the same.
    shares = np.asarray(multihost.gather(np.array(
        [[group, len(examples)] + [max([len(ex.get(k, ())) for ex in examples] + [0])
                                   for k in ('inputs', 'targets')]], np.int64))).reshape(-1, 4)
    return examples, shares

  def facts(self, task: Any, temp: temperature_lib.Temperature, *, examples_sha256: str,
            total: int, scored: bool, steps: int) -> dict[str, Any]:
    """What a task's records depend on besides the job's settings: the task, its data, the
    program (mode, steps, config, mesh) and the temperatures."""
    config = self.model.config
    # NOTE: process_count, device_count and mesh joined run.json with multi-host support; a
    # folder written before then reads as a different run (start a new folder).
    return {
        'task': task.name, 'vocabulary': self.vocabulary_ids[task.name],
        'examples_sha256': examples_sha256, 'num_examples': total,
        'mode': 'score' if scored else 'greedy',
        'max_decode_length': None if scored else steps,
        'config': {f.name: str(getattr(config, f.name)) for f in dataclasses.fields(config)},
        'process_count': jax.process_count(), 'device_count': jax.device_count(),
        'mesh': dict(self.mesh.shape), **temp.describe()}

  def task(self, task: Any, spec: Any, vocab: Any) -> dict[str, Any] | None:
    """Runs one task to its metrics (None on processes other than 0)."""
    job = self.job
    temp = temperature_lib.task_temperature(
        self.pooled_temp, task.name, allow_pooled=job.allow_schedule_mismatch,
        source=f'temperature schedule {job.schedule_path} (SCHEDULE_PATH)')
    scored, steps = job.task_mode(spec, task)
    examples, shares = self.examples(task)
    total = int(sum({int(g): int(n) for g, n, _, _ in shares}.values()))
    if not total:
      raise ValueError(f'{task.name} ({job.split}) has no examples.')
    if self.groups > 1:
      logging.info('%s: process %d reads %d of %d examples (share %d of %d)', task.name,
                   jax.process_index(), len(examples), total, self.group, self.groups)
    longest = int(shares[:, 2].max())
    # The bias rule (the model's, or the schedule strategy's), resolved once at the task's
    # longest input: every batch reads the table alike, whatever BATCH_SIZE pads it to.
    encoded = min(longest, job.truncate_inputs or longest)
    config = network.bias_rules_at(temp.model_config(self.model.config, encoded), encoded)
    model = self.model if config is self.model.config else network.Transformer(config)
    step = self.job.program(
        model, self.mesh, self.params, temp, scored=scored, steps=steps,
        eos_id=vocab.eos_id, input_length=min(longest, job.truncate_inputs or longest),
        target_length=int(shares[:, 3].max()))
    # Before anything is written or run: the step for the widest batch fits the devices.
    step.check_memory()
    folder = os.path.join(job.output_dir, task.name)
    log = predictions.SharedLog.open(folder, job.identity(self.facts(
        task, temp, examples_sha256=predictions.examples_sha256(examples), total=total,
        scored=scored, steps=steps)), total)
    process = functools.partial(self._batch, task=task, spec=spec, vocab=vocab, temp=temp,
                                scored=scored, step=step.fn)
    predictions.run_examples(examples, log, process, batch_size=len(self.my_rows),
                             desc=task.name, total=total, collect=multihost.gather_json,
                             show_progress=job.show_progress and multihost.is_writer())
    return multihost.on_writer(
        lambda: metrics_lib.write_metrics(task, spec, total, log.log, folder, scored,
                               model_name=self.model_name, temp=temp,
                               checkpoint_path=job.checkpoint.path),
        f'writing {folder}/metrics.json')

  def _batch(self, batch: Sequence[Mapping[str, Any]], *, task: Any, spec: Any, vocab: Any,
             temp: temperature_lib.Temperature, scored: bool,
             step: Callable) -> list[dict[str, Any]]:
    """The records of this process's rows of one global batch (all-padding rows fill it, so
    shapes repeat across batches); every process pads to the same width."""
    from seqio_tasks import metrics as task_metrics  # pylint: disable=g-import-not-at-top
    job, rows = self.job, len(self.my_rows)
    inputs = [ex['inputs'] if job.truncate_inputs is None
              else predictions.keep_last(ex['inputs'], job.truncate_inputs) for ex in batch]
    place = lambda x: multihost.global_batch(x, self.rows_sharding, self.batch_size)
    tokens = batching.pad_batch(
        batching.pad_tokens(inputs, min_length=predictions.global_width(inputs)), rows)
    validate.token_ids(tokens, self.model.config.vocab_size, f'{task.name} inputs')
    taus = temp.taus(tokens)
    taus[len(batch):] = 1.0
    target_text = functools.partial(predictions.target_text, vocab=vocab)
    # What the metrics compare, made here where the example was read (see `_write_metrics`).
    targets = [task.postprocess_fn(target_text(ex), example=ex, is_target=True) for ex in batch]
    records = []
    if scored:
      target_tokens = batching.pad_batch(batching.pad_tokens(
          [ex['targets'] for ex in batch],
          min_length=predictions.global_width([ex['targets'] for ex in batch])), rows)
      ll = multihost.gather(step(self.params, place(tokens), place(target_tokens),
                                 place(taus)))[self.my_rows]
      for j, ex in enumerate(batch):
        records.append({'log_likelihood': float(ll[j]),
                        'num_target_tokens': int(np.sum(target_tokens[j] > 0))})
    else:
      out = multihost.gather(step(self.params, place(tokens), place(taus)))[self.my_rows]
      for j, ex in enumerate(batch):
        prediction = vocab.decode(batching.strip_eos(out[j], vocab.eos_id))
        record = {'prediction': prediction}
        processed = task.postprocess_fn(prediction, example=ex, is_target=False)
        if processed != prediction:
          record['postprocessed_prediction'] = processed
        if spec is not None:
          record['scores'] = task_metrics.score_example(spec.family, targets[j], prediction)
        records.append(record)
    for j, ex in enumerate(batch):
      records[j].update({'index': int(ex['index']),
                         'id': predictions.text(ex.get('id', ex['index'])),
                         'input_length': int(np.sum(np.asarray(ex['inputs']) > 0)),
                         'target': target_text(ex), 'tau': taus[j].tolist(),
                         'postprocessed_target': targets[j]})
    return records
