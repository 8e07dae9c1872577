"""Costs of a compiled XLA program with its while loops' trip counts applied, from its HLO text.

`Compiled.cost_analysis()` counts a loop's body once. `HloProgram` costs each computation of the
compiled per-device HLO with XLA's HLO cost analysis and multiplies a loop's body and condition
by its trip count: XLA's `known_trip_count`, else the `N` of a condition `i < N` on a counter
that starts at a constant and steps by 1 (through copies), a bound where the condition has more
terms (an early stop). A conditional counts, figure by figure, as its costliest branch with trip
counts applied (an upper bound); a Pallas TPU kernel by the cost estimate it declares. Bytes are
logical (TPU tile padding is not counted).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Sequence


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
    self._header = [lines[0].split(',')[0].split()[0] + ' hlo_cost_sub'] + lines[1:first]
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
    """XLA's cost analysis of computation `name`, loops' bodies once, kernels' estimates in (the
    `HloCostAnalysis` of jax's CPU client, run on the module as compiled, for any platform)."""
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
