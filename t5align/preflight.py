r"""Pre-flight check: compile a run's real programs for a TPU slice without a TPU, and say whether
they fit and what they cost, before renting the pod.

    python -m t5align.preflight --gin_file=gin/runs/eval.gin \
      --gin_file=gin/models/flan_t5/xxl.gin --gin.PARAMS_DTYPE=bfloat16 \
      --gin.NUM_PARTITIONS=8 --gin.BATCH_SIZE=2 --topology=v5litepod-16 --length=32768

The gin files and flags are `t5align.eval`'s or `t5align.calibrate`'s (macros the files mark
%gin.REQUIRED, such as CHECKPOINT_PATH, may be left out: nothing is read but the gin files).
`--topology` is a slice ('v5e:4x4', 'v4:2x2x4') or a TPU type name ('v5litepod-16', 'v4-32',
'v5p-8', 'v6e-16'; `t5align.runtime.tpu_chips`); `--length` the encoder input length (calibration:
default the longest of LENGTHS).

How it works: libtpu's compile-only client gives the slice's devices
(`jax.experimental.topologies`); inside `partitioning.target_devices` the run's own mesh builders
lay the same mesh out over them, and the run's own jitted step, with the same shardings, is
lowered with abstract arguments (shapes from the model's gin file via `jax.eval_shape`, no
checkpoint) and compiled by XLA's TPU compiler:
  eval         `evaluation.partitioned_greedy_decode`: encoder, then greedy decoding
               (MAX_DECODE_LENGTH steps, default 64, counted without an early stop);
  calibration  `stats.sweep_fn`: the encoder swept over a tau batch
               (TAU_BATCH_SIZE, default the grid's 11 candidates), with its statistics.
Printed per chip: XLA's memory (arguments, temporaries, outputs, code, and the parameters the
run holds but the program does not read: `memory.Compiled`) against what XLA lets a program use
on the chip (`tpu_chips.Chip.usable_hbm_bytes`; a program the compiler itself refuses for
memory is reported with the temporaries it names); FLOPs and bytes accessed per call and per
example, with loop trip counts applied; and a roofline lower bound of the seconds per example
from the chip's peak bf16 FLOP/s and HBM bandwidth.

Trip counts: `Compiled.cost_analysis()` counts a while loop's body once. Here the compiled
per-device HLO is split into computations; each is costed by XLA's HLO cost analysis (the
`HloCostAnalysis` of `jax`'s CPU client, run on the TPU-optimized module: FLOPs, transcendentals
and bytes accessed of every instruction) and a loop's body and condition are multiplied by its
trip count, read from the HLO (`while` conditions `i < N` on a counter that starts at a constant
and steps by 1, through copies; a condition with more terms, e.g. greedy decoding's early stop,
gives N as a bound). A conditional counts, figure by figure, as its costliest branch with the
branches' loops' trip counts applied (XLA's analysis takes the costliest branch too, but with
loops once): an upper bound, e.g. every tile of 'blockwise' counts as its costliest kind. A
Pallas TPU kernel (`tpu_custom_call`) counts by the cost estimate it declares
(`pallas_tpu._cost` for t5align's). `cost_analysis()`'s own figures are reported beside,
uncorrected. Bytes are logical (TPU tiling padding is not counted; XLA's TPU figure counts it).

Exit status: 0 when the program fits every chip's HBM, 3 when it does not (the message names the
settings to change), 2 for bad flags (1: an error, as for any Python program).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import sys
from typing import Any, Mapping, Sequence

from t5align.runtime import tpu_chips

GiB = 2**30
PROGRAMS = ('eval', 'calibration')
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
# Costs with loop trip counts, from the compiled HLO.


@dataclasses.dataclass(frozen=True)
class Cost:
  """Per-device cost of a program (or computation), as XLA's HLO cost analysis counts it."""

  flops: float = 0.0
  transcendentals: float = 0.0
  bytes_accessed: float = 0.0

  def __add__(self, other: Cost) -> Cost:
    return Cost(self.flops + other.flops, self.transcendentals + other.transcendentals,
                self.bytes_accessed + other.bytes_accessed)

  def __sub__(self, other: Cost) -> Cost:
    return self + other * -1.0

  def __mul__(self, factor: float) -> Cost:
    return Cost(self.flops * factor, self.transcendentals * factor, self.bytes_accessed * factor)

  @staticmethod
  def most(costs: Sequence[Cost]) -> Cost:
    """Each figure's largest value over `costs` (XLA's count of a conditional's branches)."""
    return Cost(*(max(getattr(c, f.name) for c in costs) for f in dataclasses.fields(Cost)))


@dataclasses.dataclass(frozen=True)
class Loop:
  """A while loop of the program and how its trip count was read."""

  body: str
  trips: int | None  # None: not read from the HLO (the body counted once)
  exact: bool  # False: `trips` bounds a loop that may stop early
  op_name: str  # the jax operation it comes from (HLO metadata)


@dataclasses.dataclass(frozen=True)
class _Instruction:
  name: str
  opcode: str
  operands: tuple[str, ...]
  attributes: str  # everything after the operands
  literal: str  # the operand text of a constant


def _close(text: str, start: int) -> int:
  """Index just past the bracket group opening at `text[start]` ('(' '{' '[')."""
  pairs = {'(': ')', '{': '}', '[': ']'}
  stack = []
  quoted = False
  for i in range(start, len(text)):
    c = text[i]
    if c == '"' and text[i - 1] != '\\':
      quoted = not quoted
    elif quoted:
      continue
    elif c in pairs:
      stack.append(pairs[c])
    elif stack and c == stack[-1]:
      stack.pop()
      if not stack:
        return i + 1
  raise ValueError(f'unbalanced HLO text at {text[start:start + 80]!r}')


_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%([^\s=]+)\s*=\s*(.*)$')
_NAME = re.compile(r'%([\w.\-]+)')


def _parse_instruction(line: str) -> _Instruction | None:
  match = _INSTRUCTION.match(line)
  if not match:
    return None
  name, rest = match.groups()
  i = _close(rest, 0) if rest.startswith('(') else rest.index(' ')  # skip the shape
  rest = rest[i:].lstrip()
  paren = rest.index('(')
  opcode = rest[:paren].strip()
  end = _close(rest, paren)
  inside = rest[paren + 1:end - 1]
  return _Instruction(name, opcode, tuple(_NAME.findall(inside)), rest[end:], inside)


class HloProgram:
  """A compiled module's HLO text, split into computations, with costs per computation.

  `cost()` is the whole program's cost with every while loop's body and condition multiplied
  by its trip count (module docstring); `loops` lists the loops it read.
  """

  def __init__(self, text: str):
    self.text = text
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(('%', 'ENTRY')))
    # Module header minus its attributes (the sub-modules have other entry signatures), and the
    # metadata tables (FileNames, StackFrames, ...) the instructions refer to.
    self._header = [lines[0].split(',')[0].split()[0] + ' preflight_sub'] + lines[1:first]
    self.blocks: dict[str, list[str]] = {}
    self.instructions: dict[str, list[_Instruction]] = {}
    self.order: list[str] = []
    self.entry = ''
    current: list[str] | None = None
    for line in lines[first:]:
      if current is None:
        if not line.startswith(('%', 'ENTRY')):
          continue
        is_entry = line.startswith('ENTRY')
        name = line.split()[1 if is_entry else 0].lstrip('%')
        if is_entry:
          self.entry = name
        current = [line[len('ENTRY '):] if is_entry else line]
        self.blocks[name] = current
        self.order.append(name)
        continue
      current.append(line)
      if line.startswith('}'):
        name = self.order[-1]
        self.instructions[name] = [i for i in map(_parse_instruction, current[1:-1]) if i]
        current = None
    self._defs = {c: {i.name: i for i in self.instructions[c]} for c in self.instructions}
    self._fused = {ref for insts in self.instructions.values() for i in insts
                   if i.opcode == 'fusion'
                   for ref in re.findall(r'calls=%([\w.\-]+)', i.attributes)}
    self._raw: dict[str, Cost] = {}
    self._corrected: dict[str, Cost] = {}
    self.loops: list[Loop] = []
    self.custom_calls_without_estimate: list[str] = []

  # The computations a computation refers to (called, fused, loop bodies, reducers, ...).
  def _callees(self, name: str) -> list[str]:
    found = []
    for inst in self.instructions[name]:
      for ref in _NAME.findall(inst.attributes):
        if ref in self.blocks and ref not in found:
          found.append(ref)
    return found

  def _reachable(self, name: str) -> set[str]:
    seen, todo = set(), [name]
    while todo:
      c = todo.pop()
      if c not in seen:
        seen.add(c)
        todo.extend(self._callees(c))
    return seen

  def module_text(self, name: str) -> str:
    """An HLO module whose entry is computation `name` (with what it calls)."""
    keep = self._reachable(name)
    body = ['\n'.join(self.blocks[c]) for c in self.order if c in keep and c != name]
    return '\n\n'.join(['\n'.join(self._header)] + body + ['ENTRY ' + '\n'.join(
        self.blocks[name])]) + '\n'

  def raw_cost(self, name: str) -> Cost:
    """XLA's cost analysis of computation `name`, loops' bodies once, kernels' estimates in."""
    if name not in self._raw:
      from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
      from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
      from jaxlib import _hlo  # pylint: disable=g-import-not-at-top
      module = _hlo.hlo_module_from_text(self.module_text(name))
      costs = _jax.hlo_module_cost_analysis(xla_bridge.get_backend('cpu'), module)
      cost = Cost(float(costs.get('flops', 0.0)), float(costs.get('transcendentals', 0.0)),
                  float(costs.get('bytes accessed', 0.0)))
      self._raw[name] = cost + self._custom_call_cost(name)
    return self._raw[name]

  def _custom_call_cost(self, name: str) -> Cost:
    """Corrections for custom calls, which XLA's generic analysis counts as -1 FLOP (and -1 byte
    outside fusions) each; a Pallas TPU kernel's declared cost estimate is added instead."""
    total = Cost()
    for comp in self._reachable(name):
      for inst in self.instructions[comp]:
        if inst.opcode != 'custom-call':
          continue
        total += Cost(1.0, 0.0, 0.0 if comp in self._fused else 1.0)
        if 'custom_call_target="tpu_custom_call"' not in inst.attributes:
          continue
        estimate = re.search(r'"cost_estimate":\{([^}]*)\}', inst.attributes)
        if estimate is None:
          if inst.name not in self.custom_calls_without_estimate:
            self.custom_calls_without_estimate.append(inst.name)
          continue
        values = dict(re.findall(r'"(\w+)":"?([\d.eE+-]+)"?', estimate.group(1)))
        total += Cost(float(values.get('flops', 0)), float(values.get('transcendentals', 0)),
                      float(values.get('bytes_accessed', 0)))
    return total

  def _control_in(self, name: str) -> tuple[list[_Instruction], list[_Instruction]]:
    """(while, conditional) instructions run by computation `name` itself (through calls, not
    through loops or branches)."""
    loops, branches, todo, seen = [], [], [name], set()
    while todo:
      c = todo.pop()
      if c in seen:
        continue
      seen.add(c)
      for inst in self.instructions[c]:
        if inst.opcode == 'while':
          loops.append(inst)
        elif inst.opcode == 'conditional':
          branches.append(inst)
        elif inst.opcode == 'call':
          todo.extend(r for r in _NAME.findall(inst.attributes) if r in self.blocks)
    return loops, branches

  def trip_count(self, loop: _Instruction) -> tuple[int | None, bool]:
    """(trips, exact) of `loop` (a while instruction), read from the HLO."""
    attrs = loop.attributes
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', attrs)
    if known:
      return int(known.group(1)), True
    cond = re.search(r'condition=%([\w.\-]+)', attrs).group(1)
    body = re.search(r'body=%([\w.\-]+)', attrs).group(1)
    defs = self._defs[cond]
    root = self.instructions[cond][-1]
    for inst in self.instructions[cond]:
      if inst.opcode != 'compare' or 'direction=LT' not in inst.attributes:
        continue
      counter = self._source(defs, inst.operands[0])
      limit = self._constant(defs, inst.operands[1])
      if counter is None or counter.opcode != 'get-tuple-element' or limit is None:
        continue
      index = int(re.search(r'index=(\d+)', counter.attributes).group(1))
      start = self._initial_value(loop, index)
      if start is None or not self._steps_by_one(body, index):
        return None, False
      return max(0, limit - start), inst is root
    return None, False

  @staticmethod
  def _source(defs: Mapping[str, _Instruction], name: str) -> _Instruction | None:
    """Instruction `name`, or what it copies (through copies and bitcasts)."""
    inst = defs.get(name)
    while inst is not None and inst.opcode in ('copy', 'bitcast') and inst.operands:
      inst = defs.get(inst.operands[0])
    return inst

  @classmethod
  def _constant(cls, defs: Mapping[str, _Instruction], name: str) -> int | None:
    """The integer value of instruction `name` if it is a constant (through copies)."""
    inst = cls._source(defs, name)
    if inst is None or inst.opcode != 'constant':
      return None
    try:
      return int(inst.literal)
    except ValueError:
      return None

  def _initial_value(self, loop: _Instruction, index: int) -> int | None:
    """The constant the loop's tuple element `index` starts at, if it is one."""
    for defs in self._defs.values():
      if loop.name in defs and loop.operands and loop.operands[0] in defs:
        init = defs[loop.operands[0]]
        if init.opcode != 'tuple' or index >= len(init.operands):
          return None
        return self._constant(defs, init.operands[index])
    return None

  def _steps_by_one(self, body: str, index: int) -> bool:
    """Whether the body's result element `index` is its parameter's element `index` + 1."""
    defs = self._defs[body]
    root = self.instructions[body][-1]
    if root.opcode != 'tuple' or index >= len(root.operands):
      return False
    step = defs.get(root.operands[index])
    if step is None or step.opcode != 'add' or len(step.operands) != 2:
      return False
    for counter, one in (step.operands, step.operands[::-1]):
      inst = self._source(defs, counter)
      if (inst is not None and inst.opcode == 'get-tuple-element'
          and re.search(rf'index={index}\b', inst.attributes)
          and self._constant(defs, one) == 1):
        return True
    return False

  def cost(self, name: str | None = None) -> Cost:
    """The cost of computation `name` (default: the entry) with loop trip counts applied."""
    name = name or self.entry
    if name in self._corrected:
      return self._corrected[name]
    total = self.raw_cost(name)
    loops, conditionals = self._control_in(name)
    for loop in loops:
      body = re.search(r'body=%([\w.\-]+)', loop.attributes).group(1)
      cond = re.search(r'condition=%([\w.\-]+)', loop.attributes).group(1)
      trips, exact = self.trip_count(loop)
      op = re.search(r'op_name="([^"]*)"', loop.attributes)
      self.loops.append(Loop(body, trips, exact, op.group(1) if op else ''))
      if trips is None:
        continue
      # raw_cost(name) holds the body and condition once; the loop runs the body `trips`
      # times and the condition `trips + 1` times.
      total += self.cost(body) * trips - self.raw_cost(body) + self.raw_cost(cond) * trips
    for conditional in conditionals:
      # raw_cost(name) holds each figure of the costliest branch (XLA's analysis), loops once;
      # the same with the branches' loops' trip counts applied.
      branches = list(dict.fromkeys(
          r for r in _NAME.findall(conditional.attributes) if r in self.blocks))
      total += (Cost.most([self.cost(b) for b in branches])
                - Cost.most([self.raw_cost(b) for b in branches]))
    self._corrected[name] = total
    return total


# ---------------------------------------------------------------------------------------------
# The programs of a run, lowered for the target slice.


@dataclasses.dataclass(frozen=True)
class Settings:
  """One pre-flight check: a program of a run, its model and settings, and the TPU slice.

  Attributes:
    program: 'eval' (encoder + greedy decoding) or 'calibration' (the tau sweep).
    config: the model (`network.T5Config`; its attention_impl and dtype as the run uses them).
    target: the slice (`tpu_chips.parse_target`).
    length: encoder input tokens (eval pads them to a multiple of 128, as `t5align.eval`).
    batch_size: examples per call, before rounding up to the 'data' axis.
    params_dtype: dtype the parameters are held in (PARAMS_DTYPE).
    num_partitions: eval: devices along 'model' (NUM_PARTITIONS).
    max_decode_length: eval: decoding steps; None: `t5align.eval`'s default for tasks without
      their own (64).
    layer_taus: eval: one temperature per layer (`[b, layers]`, a per-layer TEMPERATURE or a
      schedule) rather than one per example (`[b, 1]`).
    mesh_shape: calibration: MESH_SHAPE, (tau, data[, model]); None as `t5align.calibrate`.
    tau_batch: calibration: candidate temperatures per call (TAU_BATCH_SIZE, else the grid).
    eos_id: eval: the vocabulary's EOS.
    scored: eval: the tasks are scored (`scoring.partitioned_score` over `target_length`-token
      targets), not decoded.
    target_length: eval, scored: target tokens (eval pads them to a multiple of 128).
    tasks: eval: the tasks of MIXTURE_OR_TASK_NAME that run this program (empty: none given).
  """

  program: str
  config: Any
  target: tpu_chips.Target
  length: int
  batch_size: int
  params_dtype: str = 'float32'
  num_partitions: int = 1
  max_decode_length: int | None = None
  layer_taus: bool = False
  mesh_shape: tuple[int, ...] | None = None
  tau_batch: int = 11
  eos_id: int = 1
  scored: bool = False
  target_length: int = 0
  tasks: tuple[str, ...] = ()

  def __post_init__(self):
    if self.program not in PROGRAMS:
      raise ValueError(f'program={self.program!r}: expected one of {PROGRAMS}.')
    from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top
    from t5align.runtime import validate  # pylint: disable=g-import-not-at-top
    if self.max_decode_length is None:
      object.__setattr__(self, 'max_decode_length', t5align_eval.DEFAULT_MAX_DECODE_LENGTH)
    validate.positive_int(self.length, '--length')
    if self.scored:
      validate.positive_int(self.target_length, 'target_length')
    validate.run_settings(batch_size=self.batch_size, num_partitions=self.num_partitions,
                          max_decode_length=self.max_decode_length,
                          params_dtype=self.params_dtype, tau_batch_size=self.tau_batch)


def describe_program(settings: Settings) -> str:
  """Which program the settings compile, in words ('greedy decoding of 64 steps (tasks ...)')."""
  if settings.program == 'calibration':
    return 'the calibration sweep'
  what = (f'scoring of {settings.target_length}-token targets' if settings.scored
          else f'greedy decoding of {settings.max_decode_length} steps')
  return what + (f' (tasks {", ".join(settings.tasks)})' if settings.tasks else
                 ' (no MIXTURE_OR_TASK_NAME given)')


@dataclasses.dataclass(frozen=True)
class Program:
  """A program lowered for the slice: what `check` compiles and how to read its figures."""

  lowered: Any  # jax.stages.Lowered
  mesh: Any  # jax.sharding.Mesh over the slice's devices
  units_per_call: int  # examples (eval) or encoder passes, sample x tau (calibration)
  unit: str
  shapes: Mapping[str, tuple[int, ...]]  # the batch arguments' shapes
  parameter_bytes: int  # per chip: the whole `params` tree, as the run places it
  input_bytes: int  # per chip: the batch arguments


def _abstract_params(config: Any, dtype: str) -> Any:
  """The model's `params` tree as `jax.ShapeDtypeStruct`s in `dtype` (no allocation)."""
  import jax  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype),
                      network.param_shapes(config))


def lower(settings: Settings) -> Program:
  """Builds the run's mesh over the slice's devices and lowers its jitted step (no compile)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from t5align.calibration import stats  # pylint: disable=g-import-not-at-top
  from t5align import memory as memory_lib  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  from t5align import partitioning  # pylint: disable=g-import-not-at-top
  from t5align.runtime import batching  # pylint: disable=g-import-not-at-top
  devices = compile_only_devices(settings.target)
  config = settings.config
  layers = config.num_encoder_layers

  def placed(mesh):  # The `params` tree as `jax.ShapeDtypeStruct`s placed as the run places it.
    dtype = np.dtype(jnp.dtype(settings.params_dtype)).name
    return jax.tree.map(lambda p, sh: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=sh),
                        _abstract_params(config, dtype),
                        partitioning.param_shardings(config, mesh))

  if settings.program == 'eval':
    from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top
    from t5align.evaluation import temperature  # pylint: disable=g-import-not-at-top
    with partitioning.target_devices(devices):
      mesh = partitioning.eval_mesh(settings.num_partitions)
    batch = batching.round_up(settings.batch_size, mesh.shape['data'])
    width = batching.round_up(settings.length, t5align_eval.INPUT_WIDTH_MULTIPLE)
    temp = temperature.Temperature((1.0,) * layers if settings.layer_taus else 1.0)
    # The run's own step and arguments (`t5align.eval`).
    args = t5align_eval.step_arguments(
        mesh, placed(mesh), temp, scored=settings.scored, batch_size=batch, input_width=width,
        target_width=batching.round_up(max(settings.target_length, 1),
                                       t5align_eval.INPUT_WIDTH_MULTIPLE))
    lowered = t5align_eval.step(network.Transformer(config), mesh, scored=settings.scored,
                                steps=settings.max_decode_length,
                                eos_id=settings.eos_id).lower(*args)
    names = ('inputs', 'targets', 'taus') if settings.scored else ('inputs', 'taus')
    return Program(lowered, mesh, batch, 'example',
                   {k: a.shape for k, a in zip(names, args[1:])},
                   memory_lib.per_device_bytes(args[0]), memory_lib.per_device_bytes(args[1:]))
  from t5align import calibrate  # pylint: disable=g-import-not-at-top
  with partitioning.target_devices(devices):
    # No MESH_SHAPE on one host: the run uses one device, here a mesh of that one device.
    mesh = calibrate.mesh_for(settings.mesh_shape) or partitioning.calibration_mesh(1, 1, 1)
  batch = batching.round_up(settings.batch_size, mesh.shape['data'])
  taus = batching.round_up(settings.tau_batch, mesh.shape['tau'])
  # Calibration windows are exactly the length (no padding to a multiple).
  shapes = {'inputs': (batch, settings.length), 'taus': (taus, layers, 1)}
  params = placed(mesh)
  fn = stats.sweep_fn(config, mesh, stats.default_tau_chunk(devices[0].platform),
                      tuple(sorted(params)))
  inputs = (jax.ShapeDtypeStruct(shapes['inputs'], jnp.int32,
                                 sharding=partitioning.batch_sharding(mesh, 2)),
            jax.ShapeDtypeStruct(shapes['taus'], jnp.float32, sharding=stats.tau_sharding(mesh)))
  return Program(fn.lower(params, *inputs), mesh, batch * taus,
                 'encoder pass (one sample at one tau)', shapes,
                 memory_lib.per_device_bytes(params), memory_lib.per_device_bytes(inputs))


def memory_estimate(settings: Settings, mesh: Mapping[str, int]) -> Any:
  """`memory.estimate` (the analytic figure the runs check before compiling) for the settings
  on a mesh of these axis sizes, with the arguments `t5align.eval` / `t5align.calibrate` give."""
  from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top
  from t5align import memory as memory_lib  # pylint: disable=g-import-not-at-top
  from t5align.runtime import batching  # pylint: disable=g-import-not-at-top
  calibration = settings.program == 'calibration'
  length = (settings.length if calibration else
            batching.round_up(settings.length, t5align_eval.INPUT_WIDTH_MULTIPLE))
  return memory_lib.estimate(
      settings.config, length=length, batch_size=settings.batch_size,
      params_dtype=settings.params_dtype, model_shards=mesh.get('model', 1),
      data_shards=mesh.get('data', 1), taus=settings.tau_batch if calibration else 1,
      tau_shards=mesh.get('tau', 1), decoding=not calibration, platform=PLATFORM)


# ---------------------------------------------------------------------------------------------
# The check.


@dataclasses.dataclass(frozen=True)
class Report:
  """What `check` found for one `Settings`; `to_json()` is the CLI's JSON.

  `cost` is per chip per call with loop trip counts applied; None when the compiler refused the
  program (`compile_error`: XLA's out-of-memory message; `memory` then holds the temporaries it
  names and the parameters and inputs as placed, not XLA's argument figure).
  """

  settings: Settings
  mesh: Mapping[str, int]
  attention_impl: str
  shapes: Mapping[str, tuple[int, ...]]
  memory: Any  # memory.Compiled
  cost: Cost | None
  xla_cost: Mapping[str, float]  # `Compiled.cost_analysis()`: flops, bytes accessed (loops once)
  loops: tuple[Loop, ...]
  units_per_call: int
  unit: str
  compile_seconds: float
  custom_calls_without_estimate: tuple[str, ...] = ()
  compile_error: str | None = None

  @property
  def chip(self) -> tpu_chips.Chip:
    return self.settings.target.chip

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
    from t5align import memory as memory_lib  # pylint: disable=g-import-not-at-top
    if self.fits:
      return []
    s = self.settings
    calibration = s.program == 'calibration'
    hints = memory_lib.settings_to_change(
        model_shards=self.mesh.get('model', 1), batch_size=s.batch_size,
        attention_impl=self.attention_impl, length=s.length,
        taus=s.tau_batch if calibration else 1,
        model_setting="MESH_SHAPE's third entry" if calibration else 'NUM_PARTITIONS')
    if self.memory.arguments > self.memory.temporaries and s.params_dtype != 'bfloat16':
      hints.insert(0, f"PARAMS_DTYPE='bfloat16' (now {s.params_dtype!r}: arguments take "
                      f'{self.memory.arguments / GiB:.2f} GiB per chip)')
    return hints

  def estimate_json(self) -> dict[str, Any]:
    """`memory.estimate`'s figure for the same run, and its ratio to XLA's total."""
    est = memory_estimate(self.settings, self.mesh)
    return {'params': est.params, 'attention': est.attention, 'hidden': est.hidden,
            'cache': est.cache, 'total': est.total,
            'ratio_to_xla': est.total / self.memory.total}

  def to_json(self) -> dict[str, Any]:
    s = self.settings
    return {
        'program': s.program, 'fits': self.fits, 'compile_error': self.compile_error,
        'target': {'topology': s.target.topology, 'type_name': s.target.type_name,
                   'chips': s.target.num_chips, 'chip': dataclasses.asdict(self.chip)},
        'settings': {'length': s.length, 'batch_size': s.batch_size,
                     'params_dtype': s.params_dtype,
                     'activation_dtype': str(getattr(s.config.dtype, '__name__', s.config.dtype)),
                     'attention_impl': self.attention_impl,
                     **({'num_partitions': s.num_partitions,
                         'max_decode_length': s.max_decode_length, 'scored': s.scored,
                         'target_length': s.target_length, 'tasks': list(s.tasks)}
                        if s.program == 'eval'
                        else {'mesh_shape': s.mesh_shape, 'tau_batch': s.tau_batch})},
        'compiled': describe_program(s),
        'mesh': dict(self.mesh), 'shapes': {k: list(v) for k, v in self.shapes.items()},
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
    s, m, chip = self.settings, self.memory, self.chip
    name = s.target.topology + (f' ({s.target.type_name})' if s.target.type_name else '')
    lines = [
        f'{s.program}, {describe_program(s)}, on {name}: {s.target.num_chips} x '
        f'{chip.generation} chips, mesh '
        f'{dict(self.mesh)}, {s.length} tokens, attention {self.attention_impl!r}, arguments '
        + ', '.join(f'{k} {list(v)}' for k, v in self.shapes.items())]
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


_OUT_OF_MEMORY = re.compile(r'required for HLO temporaries \(([\d.]+)G\)')


def check(settings: Settings) -> Report:
  """Compiles the settings' program for the slice and reads XLA's memory and cost figures."""
  import time  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from t5align import memory as memory_lib  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  program = lower(settings)
  common = dict(settings=settings, mesh=dict(program.mesh.shape),
                attention_impl=network.encoder_attention_impl(settings.config, settings.length,
                                                              PLATFORM),
                shapes=program.shapes, units_per_call=program.units_per_call, unit=program.unit)
  start = time.time()
  try:
    compiled = program.lowered.compile()
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
  memory = memory_lib.Compiled.of(compiled, parameter_bytes=program.parameter_bytes,
                                  input_bytes=program.input_bytes)
  hlo = HloProgram(compiled.as_text())
  cost = hlo.cost()
  xla = compiled.cost_analysis() or {}
  return Report(
      **common, memory=memory, cost=cost,
      xla_cost={k: float(xla[k]) for k in ('flops', 'bytes accessed', 'transcendentals')
                if k in xla},
      loops=tuple(hlo.loops), compile_seconds=seconds,
      custom_calls_without_estimate=tuple(hlo.custom_calls_without_estimate))


# ---------------------------------------------------------------------------------------------
# Command line: settings from t5align.eval's or t5align.calibrate's gin configuration.


def _arguments(fn: Any) -> dict[str, Any]:
  """`fn`'s arguments as gin would call it: its defaults, overridden by the gin bindings."""
  import inspect  # pylint: disable=g-import-not-at-top
  import gin  # pylint: disable=g-import-not-at-top
  try:
    bound = gin.get_bindings(fn)
  except ValueError:  # Not registered: no gin file names it.
    return {}
  if not bound:
    return {}
  params = inspect.signature(inspect.unwrap(fn)).parameters
  return {**{k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty},
          **bound}


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


def settings_from_gin(target: tpu_chips.Target, length: int | None = None,
                      program: str | None = None) -> tuple[Settings, ...]:
  """The programs of the run gin is configured for (`gin_cli.configure` first, after importing
  `t5align.eval` and `t5align.calibrate`, whose configurables gin must know before it locks):
  one `Settings` per distinct program, in task order (`eval_programs`).

  `program`: 'eval' or 'calibration'; None: the one the gin files configure (gin/runs/eval.gin
  binds `t5align.eval.evaluate`, gin/calibrate.gin `t5align.calibrate.run`).
  """
  from t5align import calibrate  # pylint: disable=g-import-not-at-top
  from t5align import calibration  # pylint: disable=g-import-not-at-top
  from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top
  runs = {'eval': _arguments(t5align_eval.evaluate), 'calibration': _arguments(calibrate.run)}
  configured = [p for p in PROGRAMS if runs[p]]
  if program is None:
    if len(configured) != 1:
      raise ValueError('--program=eval or --program=calibration: the gin files configure '
                       f'{" and ".join(configured) or "neither"} (gin/runs/eval.gin or '
                       'gin/calibrate.gin, plus a gin/models file).')
    program = configured[0]
  elif program not in configured:
    raise ValueError(f'--program={program}: the gin files do not configure it (include '
                     f'{"gin/runs/eval.gin" if program == "eval" else "gin/calibrate.gin"}).')
  args = runs[program]
  if program == 'eval':
    if length is None:
      raise ValueError('--length (the encoder input tokens, e.g. --length=32768) is required.')
    model = args['model']
    if args.get('schedule_path') and args.get('temperature') is not None:
      raise ValueError('set TEMPERATURE or SCHEDULE_PATH, not both.')
    truncate = args.get('truncate_inputs')
    return tuple(Settings(
        program='eval', config=model.config, target=target,
        length=min(length, truncate) if truncate else length,
        batch_size=args['batch_size'], params_dtype=args['params_dtype'],
        num_partitions=args['num_partitions'],
        # A schedule file may give one tau per layer (it need not exist yet): assume it does.
        layer_taus=bool(args.get('schedule_path'))
        or isinstance(args.get('temperature'), (list, tuple)), **task_program)
        for task_program in eval_programs(args.get('mixture_or_task_name'),
                                          args.get('max_decode_length')))
  config = args.get('config') or _gin_model_config()
  dtype = calibrate.activation_dtype(args.get('config'), args.get('dtype'))
  config = calibrate.run_config(config, dtype, args.get('attention_impl'))
  return (Settings(
      program='calibration', config=config, target=target,
      length=length or max(args['lengths']),
      batch_size=args.get('batch_size') or args['num_samples'],
      params_dtype=args['params_dtype'],
      mesh_shape=tuple(args['mesh_shape']) if args.get('mesh_shape') else None,
      tau_batch=args.get('tau_batch_size') or len(args.get('grid') or calibration.PAPER_GRID)),)


def eval_programs(mixture_or_task_name: str | None,
                  max_decode_length: int | None) -> list[dict[str, Any]]:
  """`Settings` fields of each distinct program `t5align.eval` runs for the tasks, in task
  order: scoring for a scored task (its continuation as targets), else greedy decoding of
  MAX_DECODE_LENGTH or the task's own steps. Without tasks: decoding of MAX_DECODE_LENGTH or
  eval's default.

  Raises:
    ValueError: naming a task that is not one of t5align's (seqio_tasks.catalog): whether it is
      scored, and its target length, are not known without its data.
  """
  if not mixture_or_task_name:
    return [dict(max_decode_length=max_decode_length)]
  from seqio_tasks import catalog  # pylint: disable=g-import-not-at-top
  from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top
  programs: dict[tuple[bool, int | None, int], list[str]] = {}
  for name in [n.strip() for n in str(mixture_or_task_name).split(',') if n.strip()]:
    try:
      tasks = catalog.resolve(name)
    except KeyError as e:
      raise ValueError(
          f'MIXTURE_OR_TASK_NAME={name!r} is not a t5align task or mixture, so the pre-flight '
          'cannot tell whether eval scores or decodes it, nor its target length. Check a '
          't5align task with the same input length and decoding (e.g. '
          'MIXTURE_OR_TASK_NAME=t5align_passkey_20k for decoding, t5align_lm_wiki_15000 for '
          'scoring), or leave MIXTURE_OR_TASK_NAME out to check decoding of MAX_DECODE_LENGTH '
          'steps.') from e
    for task in tasks:
      scored, steps = t5align_eval.task_mode(catalog.SPECS[task], None, max_decode_length)
      key = ((True, None, catalog.options()['lm_continuation']) if scored
             else (False, steps, 0))
      programs.setdefault(key, []).append(task)
  return [dict(scored=scored, max_decode_length=steps, target_length=targets, tasks=tuple(names))
          for (scored, steps, targets), names in programs.items()]


def flag_parser() -> Any:
  """The CLI's own flags (an `argparse.ArgumentParser`); the others go to gin (`gin_cli`)."""
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(
      prog='python -m t5align.preflight', description=__doc__,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--topology', required=True,
                      help="TPU slice: 'v5e:4x4', 'v4:2x2x4', ... or 'v5litepod-16', 'v4-32', ...")
  parser.add_argument('--length', type=int, help='encoder input tokens (calibration: default '
                      'the longest of LENGTHS)')
  parser.add_argument('--program', choices=PROGRAMS,
                      help='default: the one the gin files configure')
  parser.add_argument('--json_output', help='also write the report as JSON there (atomically; '
                      'a mixture of several programs: {"programs": [one report each]})')
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """The CLI (module docstring); returns the exit status."""
  parser = flag_parser()
  args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
  try:
    target = tpu_chips.parse_target(args.topology)
  except ValueError as e:
    parser.error(str(e))
  compile_only_environment(target)  # Before anything starts a JAX backend.
  if libtpu_available():  # Without it, `check` says what to install.
    import jax  # pylint: disable=g-import-not-at-top
    try:
      compile_only_devices(target)
    except jax.errors.JaxRuntimeError as e:  # A shape libtpu has no slice of.
      parser.error(f'--topology={args.topology}: libtpu has no such slice '
                   f'({str(e).splitlines()[0]}); {tpu_chips.slice_examples(target)}')
  # The run modules register their gin configurables before the configuration is locked.
  from t5align import calibrate  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  import t5align.eval  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  from t5align import gin_cli  # pylint: disable=g-import-not-at-top
  from t5align.runtime import fileio  # pylint: disable=g-import-not-at-top
  gin_cli.configure(rest, prog='python -m t5align.preflight', unset_required=True,
                    example_file='gin/runs/eval.gin (or gin/calibrate.gin) plus a gin/models file')
  try:
    programs = settings_from_gin(target, args.length, args.program)
  except ValueError as e:
    parser.error(str(e))
  reports = []
  for settings in programs:
    reports.append(check(settings))
    print(reports[-1].summary())
  if args.json_output:
    fileio.write_json_atomic(args.json_output, reports[0].to_json() if len(reports) == 1 else
                             {'programs': [r.to_json() for r in reports]})
  return 0 if all(r.fits for r in reports) else DOES_NOT_FIT


if __name__ == '__main__':
  sys.exit(main())
