r"""Calibrates encoder temperatures for a checkpoint and writes a TemperatureSchedule (JSON).

  python -m t5align.calibrate --gin_file=gin/calibrate.gin \
    --gin.CHECKPOINT_PATH=/path/checkpoint_1138000 --gin.TEXT_FILE=/path/corpus.txt \
    --gin.VOCABULARY_PATH=/path/sentencepiece.model --gin.OUTPUT_PATH=/tmp/schedule.json

Flags as in t5x (see `t5align.gin_cli`): --gin_file (repeatable), --gin_search_paths,
--gin_bindings and --gin.NAME=VALUE, where VALUE is a gin literal or else taken as a string.

"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import gin
import jax
import numpy as np

from t5align import calibration
from t5align.calibration import samples
from t5align import gin_cli
from t5align import run_identity
from t5align.runtime import fileio
from t5align.runtime import multihost
from t5align.runtime import outputs
from t5align.runtime import validate
from t5align import schedule as schedule_lib

if TYPE_CHECKING:  # Annotations only: the model is imported where the run needs it.
  from t5align import network

if __name__ == '__main__':
  # `python -m t5align.calibrate`: gin files' `from t5align import calibrate` must find this
  # module, not import a second copy that would register `run` with gin twice.
  sys.modules.setdefault('t5align.calibrate', sys.modules[__name__])


def activation_dtype(config: network.T5Config | None, dtype: str | None) -> str:
  """The dtype calibration computes in: `dtype`, else `config.dtype`, else 'float32'.

  The temperature found is for the logits the model computes in that dtype, so it must be the
  dtype evaluation uses (one gin macro, ACTIVATION_DTYPE, sets both); a config and an explicit
  dtype that disagree raise ValueError.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  if config is not None and dtype is not None and jnp.dtype(config.dtype) != jnp.dtype(dtype):
    raise ValueError(f'calibrate.run.dtype={dtype!r} but the model config computes in '
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
  print(f'[{done:>3}/{total}] L_ex={c.length:<6} {c.strategy:<18} tau={tau:.3f}{flag}  '
        f'{time.time() - start:7.1f} s', file=sys.stderr, flush=True)


@gin.configurable(module='t5align.calibrate')
@outputs.claims('output_path', 'OUTPUT_PATH', is_file=True)
def run(
    checkpoint_path: str | None = None,
    output_path: str | None = None,
    *,
    text_file: str | None = None,
    vocabulary_path: str | None = None,
    seqio_task: str | None = None,
    seqio_split: str = 'validation',
    jsonl_file: str | None = None,
    per_task: bool = True,
    reference_tasks: Mapping[str, str] | None = None,
    lengths: Sequence[int] = (1024, 2048, 4096, 8192, 15000),
    strategies: Sequence[str] = ('pmax', 'entropy', 'log_length'),
    reference_length: int = 512,
    num_samples: int = 8,
    seed: int = 0,
    config: network.T5Config | None = None,
    dtype: str | None = None,
    params_dtype: str = 'float32',
    attention_impl: str | None = None,
    mesh_shape: tuple[int, ...] | None = None,
    batch_size: int | None = None,
    tau_batch_size: int | None = None,
    grid: Sequence[float] = calibration.PAPER_GRID,
    tol: float = 1e-3,
    analysis_dir: str | None = None,
    check_finite: bool = True,
    relpos_heads: Sequence[int] | None = None,
) -> schedule_lib.TemperatureSchedule:
  """Loads a checkpoint, samples inputs, calibrates, prints the table and writes the schedule.

  Args:
    checkpoint_path: any checkpoint `checkpoints.load_params` reads.
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
    params_dtype: dtype the parameters are loaded in, as `t5align.eval`'s PARAMS_DTYPE (both
      default to float32): the layer-norm scales and the relative-position table are used
      unrounded, so bfloat16 parameters change the statistics even at the same `dtype`.
    attention_impl: encoder attention implementation ('blockwise' keeps long inputs in memory);
      the config's if None.
    mesh_shape: (tau, data, model) device mesh, e.g. (4, 2, 1); (tau, data) means model = 1.
      None: one device, or with several processes every device along 'data'. Parameters
      shard over 'model', candidate taus over 'tau', samples over 'data'.
    batch_size: examples per encoder call.
    tau_batch_size: candidate temperatures per encoder call.
    grid: Algorithm 1's grid.
    tol: tolerance of the continuous searches.
    analysis_dir: if set, also write the analysis figures and numbers there (Tables 1 and 7,
      per task too when calibrated per task).
    check_finite: refuse a checkpoint holding NaN or inf (`checkpoints.load_params`).
    relpos_heads: the heads (0-based) Figure 1 draws; default the first 16.

  Returns:
    The schedule written to `output_path`.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from t5align import checkpoints  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  from t5align.shipped import assets  # pylint: disable=g-import-not-at-top
  _check_settings(checkpoint_path, output_path, (text_file, seqio_task, jsonl_file), lengths,
                  strategies, reference_length, num_samples, seed, batch_size, tau_batch_size,
                  params_dtype, grid, tol, mesh_shape)
  _check_analysis_settings(analysis_dir, relpos_heads, config)
  dtype = activation_dtype(config, dtype)
  assets.check_reference_length(checkpoint_path, reference_length, 'REFERENCE_LENGTH')
  lengths = sorted(set(lengths))
  start = time.time()
  # The inputs, read, tokenized and checked against the model before any weight is read.
  data = samples.read_inputs(text_file=text_file, vocabulary_path=vocabulary_path,
                             seqio_task=seqio_task, seqio_split=seqio_split,
                             jsonl_file=jsonl_file, num_samples=num_samples)
  eos_id = data.eos_id
  embedded = checkpoints.embedding_rows(checkpoint_path)
  validate.vocabulary_fits(data.vocab_size, embedded, vocabulary=data.vocabulary_name,
                           model=f'checkpoint {checkpoint_path}')
  validate.token_ids(data.stream, embedded, data.source_name)
  samples.check_stream_length(data.stream, max(lengths), data.source_name)
  inputs = {}
  if per_task and text_file is None:
    if seqio_task is not None:
      inputs = samples.seqio_task_inputs(seqio_task, seqio_split, num_samples, reference_length,
                                  reference_tasks or {})
    else:
      boundaries = samples.boundary_ids(data.vocab.decode, data.vocab.vocab_size)
      inputs = {t: samples.task_inputs(rows, reference_length, eos_id, boundaries)
                for t, rows in data.by_task.items()}
    for task, (tokens, reference) in inputs.items():
      validate.token_ids(tokens, embedded, f'{data.source_name}, task {task}')
      validate.token_ids(reference, embedded, f'{data.source_name}, task {task} reference')
  identity = run_identity.make(checkpoint=checkpoint_path, settings={
      **data.identity, 'lengths': lengths, 'strategies': list(strategies),
      'reference_length': reference_length, 'num_samples': num_samples, 'seed': seed,
      'dtype': dtype, 'params_dtype': jnp.dtype(params_dtype).name,
      'attention_impl': attention_impl or (config.attention_impl if config is not None else {
          f.name: f.default for f in dataclasses.fields(network.T5Config)}['attention_impl']),
      'per_task': bool(per_task), 'reference_tasks': reference_tasks, 'grid': list(grid),
      'tol': tol, 'mesh_shape': mesh_shape})
  # Every process must run the same command: compared before any weight is read.
  run_identity.check_same_processes({'gin': run_identity.gin_config(ignore=()), **identity})
  log_path = progress_path(output_path)
  log = multihost.on_writer(lambda: calibration.CalibrationLog(log_path, identity),
                            f'opening {log_path}')
  previous = calibration.resumed_calibrations(
      multihost.broadcast_json(log.done() if log is not None else {}), log_path)
  if previous and multihost.is_writer():
    print(f'resuming: {len(previous)} calibrations done before are in {log_path}',
          file=sys.stderr, flush=True)

  def record(task, c):
    multihost.on_writer(lambda: log.add(task, c), f'writing {log_path}')

  print(f'loading {checkpoint_path} ({dtype} activations)', file=sys.stderr, flush=True)
  mesh = mesh_for(mesh_shape)
  # With a mesh, read sharded: each process reads only the slices its devices hold.
  params, config = checkpoints.load_params(checkpoint_path, config,
                                           dtype=jnp.dtype(params_dtype), mesh=mesh,
                                           check_finite=check_finite)
  config = run_config(config, dtype, attention_impl)
  if relpos_heads is not None:  # The range, first checked here where no config was given.
    from t5align.calibration import analysis  # pylint: disable=g-import-not-at-top
    analysis.check_heads(relpos_heads, config.num_heads, 'RELPOS_HEADS')
  # Every process draws the same samples (same seed); on a mesh each copies to its devices
  # only the rows of its 'data' shards (partitioning.global_array).
  tokens = samples.sample_windows(data.stream, num_samples, max(lengths), seed, eos_id=eos_id,
                                  source=data.source_name)
  # Before any sweep: the widest one (every sample at the longest length) fits the devices.
  calibration.check_sweep_memory(params, config, length=max(lengths),
                                 batch_size=batch_size or num_samples,
                                 taus=tau_batch_size or len(grid), mesh=mesh)
  print(f'{num_samples} samples of {max(lengths)} tokens from {len(data.stream)}; '
        f'{len(lengths)} lengths x {len(strategies)} strategies', file=sys.stderr, flush=True)
  memo = calibration.Memo()  # The analysis reuses the calibration's sweeps.
  progress = (lambda d, t, c: _progress(d, t, c, start)) if multihost.is_writer() else None
  settings = calibration.Settings(grid=tuple(grid), tol=tol, mesh=mesh, batch_size=batch_size,
                                  tau_batch_size=tau_batch_size, eos_id=eos_id)
  schedule = calibration.build_schedule(
      params, config, tokens, lengths, strategies, reference_length=reference_length,
      provenance={'checkpoint': checkpoint_path, 'seed': seed, 'dtype': dtype,
                  'params_dtype': params_dtype,
                  'attention_impl': config.attention_impl, **data.source,
                  'process_count': jax.process_count(), 'device_count': jax.device_count(),
                  'created_unix': int(time.time()), 'identity': identity},
      progress=progress, previous=previous, record=record, settings=settings, memo=memo)
  if inputs:
    tasks = calibration.calibrate_tasks(
        params, config, inputs, strategies, reference_length=reference_length,
        progress=progress, previous=previous, record=record, settings=settings, memo=memo)
    schedule = dataclasses.replace(schedule, tasks=tasks, provenance={
        **schedule.provenance, 'per_task': {
            t: {'num_examples': int(len(x)), 'length': int(x.shape[1]),
                'reference': (reference_tasks or {}).get(t, 'inputs cut at a boundary before L_tr'),
                'reference_width': int(r.shape[1])} for t, (x, r) in inputs.items()}})
  # Every process computed the same schedule; process 0 writes it, the others wait for that.
  multihost.on_writer(lambda: (schedule.save(output_path), log.remove()), f'writing {output_path}')
  if multihost.is_writer():
    print(schedule.table())
    for strategy in strategies:
      if schedule.tasks and calibration.parse_strategy(strategy)[1] != 'closed_form':
        print(schedule.task_table(strategy))
    print(f'wrote {output_path}', file=sys.stderr)
  multihost.barrier('t5align.calibrate:schedule')
  if analysis_dir:
    from t5align.calibration import analysis  # pylint: disable=g-import-not-at-top
    numbers = analysis.collect(params, config, tokens, lengths, reference_length=reference_length,
                               grid=grid, eos_id=eos_id, mesh=mesh, batch_size=batch_size,
                               tau_batch_size=tau_batch_size, memo=memo)
    tasks = analysis.task_statistics(params, config, inputs, memo=memo, mesh=mesh,
                                     batch_size=batch_size, tau_batch_size=tau_batch_size)
    multihost.on_writer(lambda: analysis.write_analysis(numbers, analysis_dir, schedule,
                                                        tasks=tasks, heads=relpos_heads),
                        f'writing {analysis_dir}')
    if multihost.is_writer():
      print(analysis.dispersion_table(numbers))
      print(analysis.lmax_table(numbers))
      if tasks:
        print(analysis.task_tables(tasks))
      print(f'wrote analysis to {analysis_dir}', file=sys.stderr)
    multihost.barrier('t5align.calibrate:analysis')
  return schedule


def progress_path(output_path: str) -> str:
  """Where calibrate logs its finished calibrations until the schedule is written."""
  return f'{output_path}.partial.jsonl'


def _check_settings(checkpoint_path: Any, output_path: Any, sources: Sequence[Any],
                    lengths: Any, strategies: Any, reference_length: Any, num_samples: Any,
                    seed: Any, batch_size: Any, tau_batch_size: Any, params_dtype: Any,
                    grid: Any, tol: Any, mesh_shape: Any) -> None:
  """Every setting of `run` that needs no file, each error naming its macro and the form
  accepted."""
  if not isinstance(checkpoint_path, str) or not isinstance(output_path, str):
    raise ValueError('set CHECKPOINT_PATH and OUTPUT_PATH '
                     '(e.g. --gin.CHECKPOINT_PATH=/path/checkpoint_N).')
  if sum(x is not None for x in sources) != 1:
    raise ValueError('set exactly one of TEXT_FILE (with VOCABULARY_PATH), SEQIO_TASK and '
                     'JSONL_FILE (with VOCABULARY_PATH).')
  validate.positive_int(reference_length, 'REFERENCE_LENGTH', minimum=2)
  validate.int_tuple(lengths, 'LENGTHS', minimum=reference_length,
                     why=f'REFERENCE_LENGTH, L_tr = {reference_length}: calibration aligns '
                         'longer inputs to it',
                     example=f'({2 * reference_length}, {4 * reference_length})')
  validate.strategy_names(strategies, 'STRATEGIES', calibration.STRATEGIES)
  validate.run_settings(num_samples=num_samples, batch_size=batch_size or 1,
                        tau_batch_size=tau_batch_size, seed=seed, params_dtype=params_dtype)
  validate.temperature_array(grid, 'calibrate.run.grid')
  validate.number(tol, 'calibrate.run.tol', positive=True)
  if mesh_shape is not None:
    validate.int_tuple(mesh_shape, 'MESH_SHAPE', minimum=1, example='(4, 2, 1)')
    if len(mesh_shape) not in (2, 3):
      raise ValueError(f'MESH_SHAPE={mesh_shape}: expected (tau, data) or (tau, data, model).')


def _check_analysis_settings(analysis_dir: Any, relpos_heads: Any,
                             config: network.T5Config | None) -> None:
  """ANALYSIS_DIR and RELPOS_HEADS, before any work (they were once refused after the whole
  calibration, leaving a half-written analysis): RELPOS_HEADS's form, and its range where the
  model's config is given (else `run` checks the range once the weights are read, before any
  sweep)."""
  from t5align.calibration import analysis  # pylint: disable=g-import-not-at-top
  if analysis_dir is not None:
    if not isinstance(analysis_dir, (str, os.PathLike)):
      raise ValueError(f'ANALYSIS_DIR={analysis_dir!r}: expected the path of a folder, or None.')
    if (not fileio.is_remote(analysis_dir) and os.path.exists(analysis_dir)
        and not os.path.isdir(analysis_dir)):
      raise NotADirectoryError(f'ANALYSIS_DIR {analysis_dir} is a file; give a folder to write '
                               'the analysis into.')
  if relpos_heads is not None:
    analysis.check_heads(relpos_heads, None if config is None else config.num_heads,
                         'RELPOS_HEADS')


def run_config(config: network.T5Config, dtype: str,
               attention_impl: str | None) -> network.T5Config:
  """The `network.T5Config` calibration computes with: `dtype` activations, no dropout, and
  `attention_impl` (None: the config's)."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  return dataclasses.replace(config, dtype=jnp.dtype(dtype), dropout_rate=0.0,
                             attention_impl=attention_impl or config.attention_impl)


def mesh_for(mesh_shape: Sequence[int] | None) -> Any:
  """The ('tau', 'data', 'model') mesh of MESH_SHAPE (see `run`), or None for one device.

  Over `partitioning.all_devices()`: jax's, or a TPU topology's in `t5align.preflight`.
  """
  from t5align import partitioning  # pylint: disable=g-import-not-at-top
  if not mesh_shape:
    if partitioning.process_count() == 1:
      return None
    return partitioning.calibration_mesh(1, len(partitioning.all_devices()), 1)
  shape = tuple(int(s) for s in mesh_shape)
  if len(shape) not in (2, 3):
    raise ValueError(f'MESH_SHAPE={mesh_shape}: expected (tau, data) or (tau, data, model).')
  return partitioning.calibration_mesh(*shape)


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
  run()


if __name__ == '__main__':
  main()
