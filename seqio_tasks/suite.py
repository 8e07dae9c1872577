"""What the catalog needs of a long-context suite (`Suite`; `FileSuite`, a suite read from files of
several splits), and the reader of rows that share an id (`group_by_id`), which ZeroSCROLLS and
SCROLLS both publish (no seqio needed).

A suite is a set of tasks evaluated at several input lengths: `seqio_tasks.catalog` makes the
spec `{suite.name}_{task}_{L}` of each task and length of every suite in `catalog.SUITES`, and
the mixtures `{suite.name}_{L}` (and one per subset: `{suite.name}_{subset}_{L}`). The report
lays a suite's results out by `t5align.evaluation.suites`' layout of the same name.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Generic, Hashable, Iterable, Iterator, Mapping, Protocol, TypeVar

from seqio_tasks import data

T = TypeVar('T')


class Tokenizer(Protocol):
  """What example builders need of a vocabulary: `encode(text) -> ids` (no EOS) and `eos_id`."""

  eos_id: int

  def encode(self, text: str) -> Any:  # A sequence of ids.
    ...


class Suite(Protocol):
  """A long-context suite: its tasks, their report columns and metric families, its splits,
  lengths and decode lengths, and its examples.

  Attributes:
    name: the specs' prefix, mixture prefix and report table ('zeroscrolls').
    tasks: the task names, in the report's order.
    columns: task -> its report column (metrics.json's 'column').
    families: task -> its metric family (a key of `seqio_tasks.metrics.FAMILIES`).
    splits: the evaluation splits; the first is the default.
    lengths: the input lengths, in tokens of the task vocabulary.
    decode_lengths: task -> its greedy decoding steps.
    tokenized: the examples hold int32 'inputs' / 'targets' (cut by the suite, not by seqio).
    subsets: subset name -> its tasks; each is a mixture `{name}_{subset}_{L}` beside
      `{name}_{L}` (all tasks).
  """

  name: str
  tasks: tuple[str, ...]
  columns: Mapping[str, str]
  families: Mapping[str, str]
  splits: tuple[str, ...]
  lengths: tuple[int, ...]
  decode_lengths: Mapping[str, int]
  tokenized: bool
  subsets: Mapping[str, tuple[str, ...]]

  def examples(self, task: str, split: str, length: int, tokenizer: Tokenizer,
               options: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The examples of `task` in `split` at `length` input tokens.

    Args:
      task: one of `tasks`.
      split: one of `splits`.
      length: one of `lengths`.
      tokenizer: the task vocabulary.
      options: `seqio_tasks.options()` (seed, example counts, file settings).
    """
    ...


@dataclasses.dataclass(frozen=True)
class FileSuite:
  """A `Suite` read from files of several splits, each example's tokens cut by the suite
  (ZeroSCROLLS, SCROLLS): `read(task, split, length, encode, eos_id)` gives the examples; the
  files' place is the suite's own setting, not an option."""

  name: str
  tasks: tuple[str, ...]
  columns: Mapping[str, str]
  families: Mapping[str, str]
  splits: tuple[str, ...]
  lengths: tuple[int, ...]
  decode_lengths: Mapping[str, int]
  read: Callable[..., Iterator[dict[str, Any]]]
  tokenized: bool = True
  subsets: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

  def examples(self, task: str, split: str, length: int, tokenizer: Tokenizer,
               options: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    del options
    return self.read(task, split, length, tokenizer.encode, tokenizer.eos_id)


@dataclasses.dataclass(frozen=True)
class Row(Generic[T]):
  """One row of a file whose rows may share an id (`group_by_id`).

  Attributes:
    id: the example id.
    same: what every row of an id must share (its input, or a digest of it).
    output: the row's reference; None: none.
    position: where the row is (its line, its row number), the group's when it is the first.
    first: what the example takes from an id's first row (called for that row only).
    conflict: the error message for this row when its `same` differs from the first row's,
      given the first row's position.
    pid: the row's own id, if it has one.
  """

  id: str
  same: Hashable
  output: str | None
  position: int
  first: Callable[[], T]
  conflict: Callable[[int], str]
  pid: str | None = None


@dataclasses.dataclass
class Group(Generic[T]):
  """The rows of one id: what its first row gave (`Row.first`) and every reference, in order."""

  id: str
  first: T
  position: int  # of its first row
  outputs: list[str]
  pids: list[str | None]
  same: Hashable


def group_by_id(rows: Iterable[Row[T]]) -> list[Group[T]]:
  """One group per id, in the order of each id's first row, with every row's reference.

  Raises:
    data.DataError: for a row whose `same` differs from its id's first row's (`Row.conflict`).
  """
  groups: dict[str, Group[T]] = {}
  for row in rows:
    group = groups.get(row.id)
    if group is None:
      group = groups[row.id] = Group(row.id, row.first(), row.position, [], [], row.same)
    elif group.same != row.same:
      raise data.DataError(row.conflict(group.position))
    group.pids.append(row.pid)
    if row.output is not None:
      group.outputs.append(row.output)
  return list(groups.values())
