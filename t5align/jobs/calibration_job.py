"""The calibration job: encoder temperatures for a checkpoint, written as a TemperatureSchedule.

Its finished calibrations are logged (`progress_path`) until the schedule is written, so a rerun
resumes; with several processes every process computes the same schedule and process 0 writes it.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, ClassVar, Mapping, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from t5align.attention import dispatch
from t5align import calibration
from t5align.calibration import samples
from t5align.calibration import stats
from t5align import fields
from t5align import gin_cli
from t5align.jobs import common
from t5align import memory
from t5align import network
from t5align import partitioning
from t5align import run_identity
from t5align.runtime import fileio
from t5align.runtime import multihost
from t5align.runtime import outputs
from t5align.runtime import validate
from t5align import schedule as schedule_lib


@dataclasses.dataclass(frozen=True)
class CalibrationJob:
  """`python -m t5align.calibrate`'s settings (gin/calibrate.gin binds its macros to these fields,
  as `jobs.CalibrationJob`: `gin_cli.register_job`) and its run: loads a checkpoint, samples
  inputs, calibrates, prints the table and writes the schedule.

  Attributes:
    checkpoint: the checkpoint (`jobs.Checkpoint`: CHECKPOINT_PATH, any checkpoint
      `checkpoints.load_params` reads; PARAMS_DTYPE, the dtype the parameters are loaded in, as
      `t5align.eval`'s (both default to float32): the layer-norm scales and the
      relative-position table are used unrounded, so bfloat16 parameters change the statistics
      even at the same `dtype`; whether NaN or inf is refused).
    output_path: schedule JSON to write.
    text_file: plain text to sample from (with `vocabulary_path`).
    vocabulary_path: tokenizer of `text_file` / `jsonl_file`: a SentencePiece model, a HF
      tokenizer.json, or a folder with vocab.json + merges.txt (`vocabularies.load_vocabulary`);
      EOS is its EOS.
    seqio_task: registered SeqIO tasks or mixtures to sample from instead, comma-separated
      (needs seqio; the t5align_* tasks are registered here).
    seqio_split: its split.
    jsonl_file: a JSONL file of task inputs instead ({"inputs": text, "task": name} per line;
      task defaults to the file's name), tokenized with `vocabulary_path`.
    per_task: with `seqio_task` (each task of the mixture) or `jsonl_file`, also calibrate each
      task on its first `num_samples` whole inputs (L_ex = the longest) against the same task at
      L_tr, stored in the schedule's `tasks` (t5align.eval applies a task's own entry), and
      print the per-task vs pooled temperatures. The pooled schedule (windows of all inputs
      concatenated, at `lengths`) stays the fallback for tasks without an entry.
    reference_tasks: {task: the same task's setting nearest L_tr} (seqio names), e.g.
      {'t5align_passkey_20k': 't5align_passkey_2k'}; tasks not listed use their own inputs cut
      at the last sentence / line boundary before L_tr (`calibration.cut_at_boundary`).
    lengths: extrapolation lengths L_ex.
    strategies: `calibration.STRATEGIES` names; the first is the schedule's default.
    reference_length: L_tr (512; 768 for CodeT5+).
    num_samples: documents sampled at the longest length; shorter lengths use them cut.
    seed: sampling seed.
    config: a `network.T5Config` to check the checkpoint against; inferred if None.
    dtype: activation dtype ('float32' or 'bfloat16'), which must be the one evaluation
      computes in: gin/calibrate.gin binds it to ACTIVATION_DTYPE, the macro every gin/models
      file binds `network.T5Config.dtype` to. None: `config`'s dtype, else float32. Softmax and
      statistics stay float32 either way.
    attention_impl: encoder attention implementation ('blockwise', the default, keeps long
      inputs in memory); the config's if None.
    mesh_shape: (tau, data, model) device mesh, e.g. (4, 2, 1); (tau, data) means model = 1.
      None: one device, or with several processes every device along 'data'. Parameters
      shard over 'model', candidate taus over 'tau', samples over 'data'.
    search: how the calibrations search and compute (`calibration.SearchSettings`: Algorithm
      1's grid; the continuous searches' bracket, tol and points; examples per encoder call,
      BATCH_SIZE (1), None: NUM_SAMPLES; candidate temperatures per call, TAU_BATCH_SIZE). Its
      mesh and eos_id are set by the run (MESH_SHAPE, the vocabulary).
    analysis_dir: if set, also write the analysis figures and numbers there (Tables 1 and 7,
      per task too when calibrated per task).
    relpos_heads: the heads (0-based) Figure 1 draws; default the first 16.

  The calibration log's header (`identity`) records the fields as settings but those whose
  metadata says what records them or why nothing does.
  """

  checkpoint: common.Checkpoint = fields.setting(
      default_factory=common.Checkpoint,
      check=common.settings_object(common.Checkpoint, 'checkpoint', none='None (unset)'))
  output_path: str | None = fields.setting(None, check=fields.required(fields.path()),
                                           unrecorded='where the schedule goes')
  text_file: str | None = fields.setting(
      None, check=fields.optional(fields.path()),
      unrecorded="its content is recorded (the samples' fingerprint)")
  vocabulary_path: str | None = fields.setting(
      None, check=fields.optional(fields.path()),
      unrecorded="its content is recorded (the samples' fingerprint)")
  seqio_task: str | None = fields.setting(
      None, check=fields.optional(fields.text(blank=False)),
      unrecorded='recorded as the samples read (their fingerprint)')
  seqio_split: str = fields.setting(
      'validation', check=fields.text(blank=False),
      unrecorded='recorded as the samples read (their fingerprint)')
  jsonl_file: str | None = fields.setting(
      None, check=fields.optional(fields.path()),
      unrecorded="its content is recorded (the samples' fingerprint)")
  per_task: bool = fields.setting(True, check=fields.boolean())
  reference_tasks: Mapping[str, str] | None = fields.setting(
      None, check=fields.optional(fields.mapping(None, fields.text(blank=False))))
  # At least L_tr (REFERENCE_LENGTH): `check`.
  lengths: Sequence[int] = fields.setting(
      (1024, 2048, 4096, 8192, 15000), check=fields.integers(2),
      metadata={run_identity.RECORDED_AS: lambda lengths: sorted(set(lengths))})
  # gin/calibrate.gin's STRATEGIES, ATTENTION_IMPL and BATCH_SIZE (tests/jobs/defaults_test.py).
  strategies: Sequence[str] = fields.setting(
      ('pmax', 'entropy', 'log_length', 'prop1', 'prop2', 'infoscale_head', 'infoscale_model',
       'llama4_length', 'yarn_mscale'),
      check=fields.by('distinct strategy names (calibration.STRATEGIES, with options)',
                      lambda v: validate.strategy_names(v, 'STRATEGIES', calibration.STRATEGIES,
                                                        calibration.parse_name)))
  reference_length: int = fields.setting(512, check=fields.integer(2))
  num_samples: int = fields.setting(8, check=fields.integer(1))
  seed: int = fields.setting(0, check=fields.integer(0))
  config: Any = fields.setting(
      None, check=fields.optional(fields.instance(
          network.T5Config, 'a network.T5Config (gin: @network.T5Config())'),
          "None (the checkpoint's)"),
      unrecorded='checked against the checkpoint, whose content is recorded')
  dtype: str | None = fields.setting(None, check=fields.optional(fields.dtype(), "None (the "
                                                                 "config's, else float32)"),
                                     unrecorded="recorded as the dtype computed in ('dtype')")
  attention_impl: str | None = fields.setting(
      'blockwise', check=fields.optional(fields.text(dispatch.NAMES), "None (the config's)"),
      unrecorded="recorded as the implementation that runs ('attention_impl')")
  # (tau, data) or (tau, data, model): `check`.
  mesh_shape: tuple[int, ...] | None = fields.setting(
      None, check=fields.optional(fields.integers(1), 'None (one device)'))
  search: calibration.SearchSettings = fields.setting(
      default_factory=lambda: calibration.SearchSettings(batch_size=1),
      check=common.settings_object(calibration.SearchSettings, 'search'))
  analysis_dir: str | None = fields.setting(
      None, check=fields.optional(fields.path()), unrecorded='where the analysis goes')
  # Below the model's head count: `check` (with `config`), else `run`.
  relpos_heads: Sequence[int] | None = fields.setting(
      None, check=fields.optional(fields.integers(0), 'None (the first 16)'),
      unrecorded='the heads a figure draws')

  GIN_NAME: ClassVar[str] = 'jobs.CalibrationJob'

  # The settings a run needs, by their gin macro (`gin_cli.require`); the inputs are one of
  # TEXT_FILE, SEQIO_TASK and JSONL_FILE (`check`).
  REQUIRED: ClassVar[Mapping[str, str]] = {'checkpoint.path': 'CHECKPOINT_PATH',
                                           'output_path': 'OUTPUT_PATH'}
  KIND: ClassVar[str] = 'calibration'

  def __post_init__(self):
    fields.check_fields(self)  # Unset (None, %gin.REQUIRED): `check` names the macro.

  @property
  def params_dtype(self) -> str:
    return self.checkpoint.params_dtype

  @property
  def activation_dtype(self) -> str:
    """The dtype the calibration computes in (`activation_dtype`)."""
    return activation_dtype(self.config, self.dtype)

  def check(self) -> None:
    """Every setting that needs no file, each error naming its macro and the form accepted;
    then ANALYSIS_DIR and RELPOS_HEADS (`_check_analysis`) and the activation dtype."""
    gin_cli.require(self)
    if sum(x is not None for x in (self.text_file, self.seqio_task, self.jsonl_file)) != 1:
      raise ValueError('set exactly one of TEXT_FILE (with VOCABULARY_PATH), SEQIO_TASK and '
                       'JSONL_FILE (with VOCABULARY_PATH).')
    # Each field was checked as the job (and its settings objects) was built (`fields`); here
    # what one field's check cannot see.
    reference = self.reference_length
    validate.int_tuple(self.lengths, 'LENGTHS', minimum=reference,
                       why=f'REFERENCE_LENGTH, L_tr = {reference}: calibration aligns '
                           'longer inputs to it',
                       example=f'({2 * reference}, {4 * reference})')
    if self.mesh_shape is not None:
      self._mesh_axes()
    self._check_analysis()
    self.activation_dtype  # pylint: disable=pointless-statement

  def _check_analysis(self) -> None:
    """ANALYSIS_DIR and RELPOS_HEADS, before any work (they were once refused after the whole
    calibration, leaving a half-written analysis): ANALYSIS_DIR not a file, RELPOS_HEADS's range
    where the model's config is given (else `run` checks the range once the weights are read,
    before any sweep)."""
    from t5align.calibration import analysis  # pylint: disable=g-import-not-at-top
    folder = self.analysis_dir
    if folder is not None and not fileio.is_remote(folder) and os.path.exists(
        folder) and not os.path.isdir(folder):
      raise NotADirectoryError(f'ANALYSIS_DIR {folder} is a file; give a folder to write the '
                               'analysis into.')
    if self.relpos_heads is not None:
      analysis.check_heads(self.relpos_heads,
                           None if self.config is None else self.config.num_heads,
                           'RELPOS_HEADS')

  def _mesh_axes(self) -> tuple[int, ...]:
    """MESH_SHAPE as (tau, data) or (tau, data, model) sizes."""
    shape = tuple(int(s) for s in self.mesh_shape)
    if len(shape) not in (2, 3):
      raise ValueError(f'MESH_SHAPE={self.mesh_shape}: expected (tau, data) or (tau, data, '
                       'model).')
    return shape

  def mesh(self) -> Any:
    """The ('tau', 'data', 'model') mesh of MESH_SHAPE, or None for one device (with several
    processes and no MESH_SHAPE: every device along 'data'). Over `partitioning.all_devices()`:
    jax's, or a TPU slice's in the pre-flight."""
    if not self.mesh_shape:
      if partitioning.process_count() == 1:
        return None
      return partitioning.calibration_mesh(1, len(partitioning.all_devices()), 1)
    return partitioning.calibration_mesh(*self._mesh_axes())

  def model_config(self, config: network.T5Config) -> network.T5Config:
    """The config the calibration computes with: the activation dtype, no dropout, and
    ATTENTION_IMPL (None: the config's)."""
    return dataclasses.replace(config, dtype=jnp.dtype(self.activation_dtype), dropout_rate=0.0,
                               attention_impl=self.attention_impl or config.attention_impl)

  def programs(self, config: network.T5Config, mesh: Any, params: Any, *,
               length: int | None = None) -> list[common.Program]:  # `common.Job.programs`
    """The sweep this job runs at its widest: BATCH_SIZE (else NUM_SAMPLES) samples of `length`
    tokens (default the longest of LENGTHS) at TAU_BATCH_SIZE (else the grid's) candidates."""
    shape = dict(mesh.shape) if mesh is not None else {}
    workload = memory.Workload(
        config, length or max(self.lengths), self.search.batch_size or self.num_samples,
        self.checkpoint.params_dtype, model_shards=shape.get('model', 1),
        data_shards=shape.get('data', 1),
        tau_shards=shape.get('tau', 1), model_setting="MESH_SHAPE's third entry",
        mesh_shape=self.mesh_shape, taus=self.search.tau_batch_size or len(self.search.grid))
    # The tau chunk of the devices the mesh lays out (a TPU slice's in the pre-flight).
    platform = mesh.devices.flat[0].platform if mesh is not None else None
    fn, args = stats.sweep_program(params, config, length=workload.length,
                                   batch_size=workload.batch_size, taus=workload.taus,
                                   mesh=mesh, tau_chunk=stats.default_tau_chunk(platform))
    return [common.Program(
        name='calibration', description='the calibration sweep', fn=fn, args=args,
        names=('inputs', 'taus'), units=args[1].shape[0] * args[2].shape[0],
        unit='encoder pass (one sample at one tau)', workload=workload)]

  def identity(self, facts: Mapping[str, Any]) -> dict[str, Any]:
    """What the schedule depends on (the calibration log's header): the checkpoint's content,
    the settings, the dtype and attention that compute, and `facts` (the samples' identity,
    `samples.Inputs.identity`)."""
    return run_identity.make(
        checkpoint=self.checkpoint.path, resolved_checkpoint=self.checkpoint.resolved,
        settings=run_identity.settings_record(self), facts={
            **facts, 'dtype': self.activation_dtype,
            'attention_impl': self.attention_impl or (
                self.config or network.T5Config).attention_impl})

  def run(self) -> schedule_lib.TemperatureSchedule:
    """Calibrates and writes OUTPUT_PATH (and ANALYSIS_DIR); returns the schedule."""
    # Unset: `check` reports it.
    with outputs.claim(self.output_path, 'OUTPUT_PATH', is_file=True):
      return self._run()

  def resume_note(self) -> str:
    return (f'The calibrations finished so far are kept in {progress_path(self.output_path)}; '
            'rerun the same command to continue from them (OUTPUT_PATH is written at the end).')

  def tables(self, schedule: schedule_lib.TemperatureSchedule) -> str:
    """What `python -m t5align.calibrate` prints once the run is done: the schedule's table, per
    task (PER_TASK) the per-task against the pooled temperatures of each searched strategy and,
    with ANALYSIS_DIR, its tables (Tables 1 and 7, per task too: dispersion.txt)."""
    parts = [schedule.table()]
    for strategy in self.strategies:
      if schedule.tasks and calibration.parse_strategy(strategy)[1] != 'closed_form':
        parts.append(schedule.task_table(strategy))
    if self.analysis_dir:
      text = fileio.read_bytes(fileio.join(self.analysis_dir, 'dispersion.txt')).decode('utf-8')
      parts.append(text.rstrip())
    return '\n'.join(parts)

  def _inputs(self) -> tuple[Any, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The inputs, read, tokenized and checked against the model before any weight is read:
    the sample source, and per task (PER_TASK) its inputs and its reference at L_tr."""
    from t5align.shipped import assets  # pylint: disable=g-import-not-at-top
    assets.check_reference_length(self.checkpoint.path, self.reference_length,
                                  'REFERENCE_LENGTH')
    data = samples.read_inputs(text_file=self.text_file, vocabulary_path=self.vocabulary_path,
                               seqio_task=self.seqio_task, seqio_split=self.seqio_split,
                               jsonl_file=self.jsonl_file, num_samples=self.num_samples)
    embedded = self.checkpoint.embedding_rows()
    validate.vocabulary_fits(data.vocab_size, embedded, vocabulary=data.vocabulary_name,
                             model=self.checkpoint.name)
    validate.token_ids(data.stream, embedded, data.source_name)
    samples.check_stream_length(data.stream, max(self.lengths), data.source_name)
    inputs = {}
    if self.per_task and self.text_file is None:
      if self.seqio_task is not None:
        inputs = samples.seqio_task_inputs(self.seqio_task, self.seqio_split, self.num_samples,
                                           self.reference_length, self.reference_tasks or {})
      else:
        boundaries = samples.boundary_ids(data.vocab.decode, data.vocab.vocab_size)
        inputs = {t: samples.task_inputs(rows, self.reference_length, data.eos_id, boundaries)
                  for t, rows in data.by_task.items()}
      for task, (tokens, reference) in inputs.items():
        validate.token_ids(tokens, embedded, f'{data.source_name}, task {task}')
        validate.token_ids(reference, embedded, f'{data.source_name}, task {task} reference')
    return data, inputs

  def _run(self) -> schedule_lib.TemperatureSchedule:
    self.check()
    dtype, lengths = self.activation_dtype, sorted(set(self.lengths))
    start = time.time()
    data, inputs = self._inputs()
    eos_id = data.eos_id
    identity = self.identity(data.identity)
    # Every process must run the same command: compared before any weight is read.
    run_identity.check_same_processes({'gin': run_identity.gin_config(), **identity})
    log_path = progress_path(self.output_path)
    log = multihost.on_writer(lambda: self._open_log(log_path, identity), f'opening {log_path}')
    previous = calibration.resumed_calibrations(
        multihost.broadcast_json(log.done() if log is not None else {}), log_path)
    if previous and multihost.is_writer():
      logging.info('resuming: %d calibrations done before are in %s', len(previous), log_path)

    def record(task, c):
      multihost.on_writer(lambda: log.add(task, c), f'writing {log_path}')

    logging.info('loading %s (%s activations)', self.checkpoint.path, dtype)
    mesh = self.mesh()
    params, config = self.checkpoint.load(self.config, mesh)
    config = self.model_config(config)
    if self.relpos_heads is not None:  # The range, first checked here where no config was given.
      from t5align.calibration import analysis  # pylint: disable=g-import-not-at-top
      analysis.check_heads(self.relpos_heads, config.num_heads, 'RELPOS_HEADS')
    # Every process draws the same samples (same seed); on a mesh each copies to its devices
    # only the rows of its 'data' shards (partitioning.global_array).
    tokens = samples.sample_windows(data.stream, self.num_samples, max(lengths), self.seed,
                                    eos_id=eos_id, source=data.source_name)
    # Before any sweep: the widest one (every sample at the longest length) fits the devices.
    (sweep,) = self.programs(config, mesh, params)  # `sweep_program` places the parameters.
    sweep.check_memory('This calibration sweep')
    logging.info('%d samples of %d tokens from %s; %d lengths x %d strategies', self.num_samples,
                 max(lengths), len(data.stream), len(lengths), len(self.strategies))
    memo = calibration.Memo()  # The analysis reuses the calibration's sweeps.
    progress = (lambda d, t, c: _progress(d, t, c, start)) if multihost.is_writer() else None
    search = dataclasses.replace(self.search, mesh=mesh, eos_id=eos_id)
    schedule = calibration.build_schedule(
        params, config, tokens, lengths, self.strategies,
        reference_length=self.reference_length,
        provenance={'checkpoint': self.checkpoint.path, 'seed': self.seed, 'dtype': dtype,
                    'params_dtype': self.checkpoint.params_dtype,
                    'attention_impl': config.attention_impl, **data.source,
                    'process_count': jax.process_count(), 'device_count': jax.device_count(),
                    'created_unix': int(time.time()), 'identity': identity},
        progress=progress, previous=previous, record=record, settings=search, memo=memo)
    if inputs:
      tasks = calibration.calibrate_tasks(
          params, config, inputs, self.strategies, reference_length=self.reference_length,
          progress=progress, previous=previous, record=record, settings=search, memo=memo)
      schedule = dataclasses.replace(schedule, tasks=tasks, provenance={
          **schedule.provenance, 'per_task': {
              t: {'num_examples': int(len(x)), 'length': int(x.shape[1]),
                  'reference': (self.reference_tasks or {}).get(
                      t, 'inputs cut at a boundary before L_tr'),
                  'reference_width': int(r.shape[1])} for t, (x, r) in inputs.items()}})
    # Every process computed the same schedule; process 0 writes it, the others wait for that.
    multihost.on_writer(lambda: (schedule.save(self.output_path), log.remove()),
                        f'writing {self.output_path}')
    if multihost.is_writer():
      logging.info('wrote %s', self.output_path)
    multihost.barrier('t5align.calibrate:schedule')
    if self.analysis_dir:
      self._analysis(params, config, tokens, inputs, schedule, mesh, memo, eos_id)
    return schedule

  def _open_log(self, log_path: str, identity: Mapping[str, Any]) -> calibration.CalibrationLog:
    """The progress log (`calibration.CalibrationLog`, resumed when its header is `identity`),
    with gin's operative configuration beside OUTPUT_PATH (OUTPUT_PATH.config.gin)."""
    run_identity.write_gin_config(f'{self.output_path}.{run_identity.GIN_CONFIG_FILE}')
    return calibration.CalibrationLog(log_path, identity, kind=self.KIND)

  def _analysis(self, params, config, tokens, inputs, schedule, mesh, memo, eos_id) -> None:
    """Writes ANALYSIS_DIR's figures and numbers (reusing the calibration's sweeps)."""
    from t5align.calibration import analysis  # pylint: disable=g-import-not-at-top
    numbers = analysis.collect(
        params, config, tokens, sorted(set(self.lengths)),
        reference_length=self.reference_length, grid=self.search.grid, eos_id=eos_id,
        mesh=mesh, batch_size=self.search.batch_size,
        tau_batch_size=self.search.tau_batch_size, memo=memo)
    tasks = analysis.task_statistics(params, config, inputs, memo=memo, mesh=mesh,
                                     batch_size=self.search.batch_size,
                                     tau_batch_size=self.search.tau_batch_size)
    multihost.on_writer(lambda: analysis.write_analysis(numbers, self.analysis_dir, schedule,
                                                        tasks=tasks, heads=self.relpos_heads),
                        f'writing {self.analysis_dir}')
    if multihost.is_writer():
      logging.info('wrote analysis to %s', self.analysis_dir)
    multihost.barrier('t5align.calibrate:analysis')


gin_cli.register_job(CalibrationJob)


def progress_path(output_path: str) -> str:
  """Where calibrate logs its finished calibrations until the schedule is written."""
  return f'{output_path}.partial.jsonl'


def activation_dtype(config: network.T5Config | None, dtype: str | None) -> str:
  """The dtype calibration computes in: `dtype`, else `config.dtype`, else 'float32'.

  The temperature found is for the logits the model computes in that dtype, so it must be the
  dtype evaluation uses (one gin macro, ACTIVATION_DTYPE, sets both); a config and an explicit
  dtype that disagree raise ValueError.
  """
  if config is not None and dtype is not None and jnp.dtype(config.dtype) != jnp.dtype(dtype):
    raise ValueError(f'jobs.CalibrationJob.dtype={dtype!r} but the model config computes in '
                     f'{jnp.dtype(config.dtype).name}: calibrate at the dtype evaluation uses '
                     '(set ACTIVATION_DTYPE once).')
  if dtype is None:
    dtype = 'float32' if config is None else jnp.dtype(config.dtype).name
  if jnp.dtype(dtype) not in (jnp.float32, jnp.bfloat16):
    raise ValueError(f"dtype={dtype!r}: expected 'float32' or 'bfloat16'.")
  return jnp.dtype(dtype).name


def _progress(done: int, total: int, c: calibration.Calibration, start: float) -> None:
  tau = c.tau if np.ndim(c.tau) == 0 else float(np.mean(c.tau))
  flag = ' (target outside range)' if c.clamped else ''
  rule = '' if c.bias_rule == 'none' else f' bias={c.bias_rule}'
  logging.info('%s', f'[{done:>3}/{total}] L_ex={c.length:<6} {c.strategy:<18} tau={tau:.3f}'
               f'{rule}{flag}  {time.time() - start:7.1f} s')
