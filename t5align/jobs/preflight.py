"""The pre-flight check: a job's own programs (`job.programs`) compiled for a TPU slice without a
TPU (libtpu's compile-only client), with XLA's memory per chip and the costs with loop trip counts
(`runtime.hlo_cost`), before renting the pod. `t5align.preflight` is its command line.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from typing import Any, Mapping

from t5align.runtime import hlo_cost
from t5align.runtime import tpu_chips

GiB = 2**30
PROGRAMS = ('eval', 'calibration', 'train')
# The job each program is, and the run file that configures it.
_JOBS = {'eval': ('eval_job.EvalJob', 'gin/runs/eval.gin'),
         'calibration': ('calibration_job.CalibrationJob', 'gin/calibrate.gin'),
         'train': ('train_job.TrainJob', 'gin/runs/train_retrieval.gin or gin/runs/finetune.gin')}
DOES_NOT_FIT = 3  # The CLI's exit status for a program that does not fit.
PLATFORM = 'tpu'  # What the programs are compiled for ('auto' and 'pallas' pick its kernels).


def compile_only_environment(target: tpu_chips.Target | None = None) -> None:
  """JAX_PLATFORMS=cpu unless set (the host runs nothing but the compiler), and libtpu's
  environment for a machine without TPUs (`tpu_chips.libtpu_without_tpus`). Call before jax
  starts a backend."""
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  tpu_chips.libtpu_without_tpus(target.type_name if target else None)


def libtpu_available() -> bool:
  """Whether libtpu (the TPU compiler; `pip install "jax[tpu]"`) is installed."""
  from jax._src import cloud_tpu_init  # pylint: disable=g-import-not-at-top
  return cloud_tpu_init.get_tpu_library_path() is not None


@functools.lru_cache(maxsize=16)
def compile_only_devices(target: tpu_chips.Target) -> tuple[Any, ...]:
  """The slice's devices from libtpu's compile-only client (no TPU needed)."""
  if not libtpu_available():
    raise RuntimeError('compiling for TPU without one needs libtpu: pip install '
                       '"jax[tpu]==<the installed jax version>".')
  compile_only_environment(target)
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  return tuple(topologies.get_topology_desc(**target.topology_kwargs()).devices)


# ---------------------------------------------------------------------------------------------
# The programs of a run, lowered for the target slice.


@dataclasses.dataclass(frozen=True)
class Case:
  """One pre-flight check: a run's job (a `jobs.Job`: `EvalJob`, `CalibrationJob` or
  `TrainJob`, as gin configures it), the model it runs (`network.T5Config`, its attention_impl
  and dtype as the run uses them), the slice (`tpu_chips.parse_target`) and the encoder input
  length (None: the job's own)."""

  job: Any
  config: Any
  target: tpu_chips.Target
  length: int | None

  def __post_init__(self):
    from t5align import jobs  # pylint: disable=g-import-not-at-top
    from t5align.runtime import validate  # pylint: disable=g-import-not-at-top
    if not isinstance(self.job, jobs.Job):
      raise ValueError(f'job={self.job!r}: expected a jobs.Job (jobs.EvalJob, '
                       'jobs.CalibrationJob or jobs.TrainJob).')
    if self.length is not None:
      validate.positive_int(self.length, '--length')


def programs(case: Case) -> list[tuple[Any, Any]]:
  """The job's own programs (`job.programs`) over the run's mesh laid out on the slice's
  devices, with the parameters as the run places them: [(jobs.Program, mesh)]."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  from t5align import partitioning  # pylint: disable=g-import-not-at-top
  devices = compile_only_devices(case.target)
  with partitioning.target_devices(devices):
    # Calibration without MESH_SHAPE on one host, and training, run on one device: a mesh of
    # that one here.
    mesh = case.job.mesh() or partitioning.calibration_mesh(1, 1, 1)
  dtype = np.dtype(jnp.dtype(case.job.params_dtype)).name
  params = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, dtype, sharding=sh),
                        network.param_shapes(case.config),
                        partitioning.param_shardings(case.config, mesh))
  return [(p, mesh) for p in case.job.programs(case.config, mesh, params, length=case.length)]


def memory_estimate(program: Any) -> Any:
  """`memory.estimate`, the analytic figure, for a program's workload on the target platform
  (the report sets it beside XLA's)."""
  return program.workload.estimate(PLATFORM)


# ---------------------------------------------------------------------------------------------
# The check.


@dataclasses.dataclass(frozen=True)
class Report:
  """What `check` found for one program of a `Case`; `to_json()` is the CLI's JSON.

  `cost` is per chip per call with loop trip counts applied; None when the compiler refused the
  program (`compile_error`: XLA's out-of-memory message; `memory` then holds the temporaries it
  names and the parameters and inputs as placed, not XLA's argument figure).
  """

  case: Case
  program: Any  # jobs.Program
  mesh: Mapping[str, int]
  attention_impl: str
  shapes: Mapping[str, tuple[int, ...]]
  memory: Any  # memory.Compiled
  cost: hlo_cost.Cost | None
  xla_cost: Mapping[str, float]  # `Compiled.cost_analysis()`: flops, bytes accessed (loops once)
  loops: tuple[hlo_cost.Loop, ...]
  units_per_call: int
  unit: str
  compile_seconds: float
  custom_calls_without_estimate: tuple[str, ...] = ()
  compile_error: str | None = None

  @property
  def chip(self) -> tpu_chips.Chip:
    return self.case.target.chip

  @property
  def fits(self) -> bool:
    return self.compile_error is None and self.memory.total <= self.chip.usable_hbm_bytes

  @property
  def chips(self) -> int:
    return math.prod(self.mesh.values())

  def roofline_seconds_per_call(self) -> float | None:
    """Lower bound: the slower of compute at peak FLOP/s and traffic at peak HBM bandwidth."""
    if self.cost is None:
      return None
    return max(self.cost.flops / self.chip.peak_bf16_flops,
               self.cost.bytes_accessed / self.chip.hbm_bytes_per_s)

  def per_unit(self) -> dict[str, float] | None:
    """FLOPs and bytes of all chips together, and roofline seconds, per example (unit)."""
    if self.cost is None:
      return None
    return {'flops': self.cost.flops * self.chips / self.units_per_call,
            'bytes_accessed': self.cost.bytes_accessed * self.chips / self.units_per_call,
            'roofline_seconds': self.roofline_seconds_per_call() / self.units_per_call}

  def settings_to_change(self) -> list[str]:
    """The settings that lower the memory per chip, for a refusal (empty when it fits)."""
    if self.fits:
      return []
    hints = self.program.workload.settings_to_change()
    dtype = self.program.workload.params_dtype
    if self.memory.arguments > self.memory.temporaries and dtype != 'bfloat16':
      hints.insert(0, f"PARAMS_DTYPE='bfloat16' (now {dtype!r}: arguments take "
                      f'{self.memory.arguments / GiB:.2f} GiB per chip)')
    return hints

  def estimate_json(self) -> dict[str, Any] | None:
    """`memory.estimate`'s figure for the same run, and its ratio to XLA's total; None for a
    train step (the estimate models inference)."""
    if self.program.workload.training:
      return None
    est = memory_estimate(self.program)
    return {'params': est.params, 'attention': est.attention, 'hidden': est.hidden,
            'cache': est.cache, 'total': est.total,
            'ratio_to_xla': est.total / self.memory.total}

  def to_json(self) -> dict[str, Any]:
    target, dtype = self.case.target, self.program.workload.config.dtype
    return {
        'program': self.program.name, 'fits': self.fits, 'compile_error': self.compile_error,
        'target': {'topology': target.topology, 'type_name': target.type_name,
                   'chips': target.num_chips, 'chip': dataclasses.asdict(self.chip)},
        'settings': {**self.program.settings,
                     'activation_dtype': str(getattr(dtype, '__name__', dtype)),
                     'attention_impl': self.attention_impl},
        'compiled': self.program.description,
        'mesh': dict(self.mesh), 'shapes': {k: _shape_json(v) for k, v in self.shapes.items()},
        'memory_per_chip': {**dataclasses.asdict(self.memory), 'total': self.memory.total,
                            'usable_hbm': self.chip.usable_hbm_bytes,
                            'hbm': self.chip.hbm_bytes},
        'memory_estimate': self.estimate_json(),
        'per_chip_per_call': None if self.cost is None else {
            **dataclasses.asdict(self.cost), 'roofline_seconds': self.roofline_seconds_per_call()},
        'xla_cost_analysis_loops_once': dict(self.xla_cost),
        'units_per_call': self.units_per_call, 'unit': self.unit, 'per_unit': self.per_unit(),
        'loops': [dataclasses.asdict(loop) for loop in self.loops],
        'custom_calls_without_estimate': list(self.custom_calls_without_estimate),
        'compile_seconds': self.compile_seconds,
        'settings_to_change': self.settings_to_change(),
    }

  def summary(self) -> str:
    """The human-readable report the CLI prints."""
    target, m, chip = self.case.target, self.memory, self.chip
    name = target.topology + (f' ({target.type_name})' if target.type_name else '')
    lines = [
        f'{self.program.name}, {self.program.description}, on {name}: {target.num_chips} x '
        f'{chip.generation} chips, mesh '
        f'{dict(self.mesh)}, {self.program.workload.length} tokens, attention '
        f'{self.attention_impl!r}, arguments '
        + ', '.join(f'{k} {_shape_json(v)}' for k, v in self.shapes.items())]
    if self.compile_error is not None:
      lines.append(f'XLA refused it for {chip.generation}: {self.compile_error}')
    else:
      lines.append(
          f'memory per chip (XLA, GiB): {m.describe()} of {chip.usable_hbm_bytes / GiB:.2f} GiB '
          'usable HBM: ' + ('fits' if self.fits else 'DOES NOT FIT'))
      per = self.per_unit()
      unknown = sum(loop.trips is None for loop in self.loops)
      bounded = sum(loop.trips is not None and not loop.exact for loop in self.loops)
      lines += [
          f'per chip per call ({self.units_per_call} x {self.unit}), loop trip counts applied: '
          f'{self.cost.flops:.4g} FLOPs, {self.cost.bytes_accessed / 1e9:.4g} GB accessed '
          f'(XLA cost_analysis, loops once: {self.xla_cost.get("flops", 0):.4g} FLOPs, '
          f'{self.xla_cost.get("bytes accessed", 0) / 1e9:.4g} GB)',
          f'per {self.unit} (all chips): {per["flops"]:.4g} FLOPs, '
          f'{per["bytes_accessed"] / 1e9:.4g} GB; roofline >= {per["roofline_seconds"]:.4g} s '
          f'({chip.peak_bf16_flops / 1e12:g} TFLOP/s bf16, {chip.hbm_bytes_per_s / 1e9:g} GB/s '
          f'per chip)',
          f'{len(self.loops)} loops: {len(self.loops) - unknown - bounded} exact trip counts, '
          f'{bounded} bounds (early stop not counted), {unknown} unread (counted once); '
          f'compiled in {self.compile_seconds:.1f} s']
      if self.custom_calls_without_estimate:
        lines.append(f'{len(self.custom_calls_without_estimate)} Pallas kernels declare no cost '
                     'estimate: their FLOPs and bytes are not counted.')
    if not self.fits:
      lines.append(f'Does not fit: {m.total / GiB:.2f} GiB per chip > '
                   f'{chip.usable_hbm_bytes / GiB:.2f} GiB. Set '
                   + '; or '.join(self.settings_to_change()) + '.')
    return '\n'.join(lines)


def _is_shape(value: Any) -> bool:
  return isinstance(value, tuple) and all(isinstance(d, int) for d in value)


def _shape_json(shape: Any) -> Any:
  """An argument's shape as the report shows it: a list; a dict of lists for a dict of arrays
  (a train batch); 'N arrays' for any other tree (an optimizer state)."""
  if _is_shape(shape):
    return list(shape)
  if isinstance(shape, Mapping) and all(_is_shape(v) for v in shape.values()):
    return {k: list(v) for k, v in shape.items()}
  import jax  # pylint: disable=g-import-not-at-top
  return f'{len(jax.tree.leaves(shape, is_leaf=_is_shape))} arrays'


_OUT_OF_MEMORY = re.compile(r'required for HLO temporaries \(([\d.]+)G\)')


def check(case: Case) -> list[Report]:
  """Compiles each of the case's programs for the slice and reads XLA's memory and cost
  figures."""
  return [check_program(case, program, mesh) for program, mesh in programs(case)]


def check_program(case: Case, program: Any, mesh: Any) -> Report:
  """Compiles one of `programs(case)` (a program the compiler refuses for memory is reported
  with the temporaries it names)."""
  import time  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from t5align import memory as memory_lib  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  common = dict(case=case, program=program, mesh=dict(mesh.shape),
                attention_impl=network.encoder_attention_impl(
                    case.config, program.workload.length, PLATFORM),
                shapes=program.shapes, units_per_call=program.units, unit=program.unit)
  start = time.time()
  try:
    compiled = program.lower().compile()
  except jax.errors.JaxRuntimeError as e:
    refused = _OUT_OF_MEMORY.search(str(e))
    if refused is None:
      raise
    temporaries = int(float(refused.group(1)) * GiB)
    memory = memory_lib.Compiled(program.parameter_bytes + program.input_bytes, temporaries,
                                 0, 0, 0)
    return Report(**common, memory=memory, cost=None, xla_cost={}, loops=(),
                  compile_seconds=time.time() - start,
                  compile_error=str(e).strip().splitlines()[0])
  seconds = time.time() - start
  memory = program.figures(compiled)
  hlo = hlo_cost.HloProgram(compiled.as_text())
  cost = hlo.cost()
  xla = compiled.cost_analysis() or {}
  return Report(
      **common, memory=memory, cost=cost,
      xla_cost={k: float(xla[k]) for k in ('flops', 'bytes accessed', 'transcendentals')
                if k in xla},
      loops=tuple(hlo.loops), compile_seconds=seconds,
      custom_calls_without_estimate=tuple(hlo.custom_calls_without_estimate))


# ---------------------------------------------------------------------------------------------
# Command line: the job t5align.eval's or t5align.calibrate's gin configuration makes.

def _configured_job(program: str) -> Any:
  """The job class of `program` when the gin files bind it (`_JOBS`), else None. A job whose
  module no gin file imported is not configured (and is not imported: gin's configuration is
  locked, so a module registering configurables now would be refused)."""
  import sys  # pylint: disable=g-import-not-at-top
  import gin  # pylint: disable=g-import-not-at-top
  module, name = _JOBS[program][0].split('.')
  if f't5align.jobs.{module}' not in sys.modules:
    return None
  job = getattr(sys.modules[f't5align.jobs.{module}'], name)
  try:
    return job if gin.get_bindings(job) else None
  except ValueError:  # Not registered: no gin file names it.
    return None


def _gin_model_config() -> Any:
  """The `network.T5Config` a gin/models file binds."""
  import gin  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  try:
    bound = gin.get_bindings(network.T5Config)
  except ValueError:
    bound = {}
  if 'vocab_size' not in bound:
    raise ValueError('t5align.preflight reads no checkpoint, so it takes the model\'s shapes from '
                     'a gin/models file: add e.g. --gin_file=gin/models/flan_t5/xxl.gin.')
  return gin.get_configurable(network.T5Config)()


def case_from_gin(target: tpu_chips.Target, length: int | None = None,
                  program: str | None = None) -> Case:
  """The run gin is configured for (`gin_cli.configure` first): its job, as the command would
  make it, and its model.

  `program`: one of `PROGRAMS`; None: the one the gin files configure (`_JOBS`: gin/runs/eval.gin
  binds `jobs.EvalJob`, gin/calibrate.gin `jobs.CalibrationJob`, gin/runs/train_retrieval.gin
  and finetune.gin `jobs.TrainJob`).
  """
  import gin  # pylint: disable=g-import-not-at-top
  configured = [p for p in PROGRAMS if _configured_job(p) is not None]
  if program is None:
    if len(configured) != 1:
      raise ValueError(f'--program={" or --program=".join(PROGRAMS)}: the gin files configure '
                       f'{" and ".join(configured) or "none of them"} (one of '
                       f'{", ".join(f for _, f in _JOBS.values())}, plus a gin/models file).')
    program = configured[0]
  elif program not in configured:
    raise ValueError(f'--program={program}: the gin files do not configure it (include '
                     f'{_JOBS[program][1]}).')
  job = gin.get_configurable(_configured_job(program))()
  if program == 'calibration':
    config = job.model_config(job.config or _gin_model_config())
    return Case(job, config, target, length or max(job.lengths))
  if program == 'eval' and length is None:
    raise ValueError('--length (the encoder input tokens, e.g. --length=32768) is required.')
  return Case(job, job.model.config, target, length)
