"""What every job shares: the checkpoint it reads, the programs it compiles, and `Job`, the shape
the commands, the pre-flight and the tests hold every job to."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, ClassVar, Mapping, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from t5align import checkpoints
from t5align.checkpoints import store
from t5align import memory
from t5align import run_identity
from t5align import fields


class CheckpointChangedError(RuntimeError):
  """The checkpoint's folder was replaced (or had files added or removed) while a run read it."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """A checkpoint a job reads: where, the dtype its parameters are held in (PARAMS_DTYPE), and
  whether NaN or inf is refused (`checkpoints.load_params`).

  The path is resolved once, on first use (`resolved`: symlinks followed, made absolute), and
  everything is read from there: the fingerprint, the metadata, the format and the arrays. A
  symlink re-pointed while the job runs changes nothing it reads; a folder replaced there is
  refused after the load (`CheckpointChangedError`). `flag` is the setting errors name
  (CHECKPOINT_PATH; the fine-tuning start's INITIAL_CHECKPOINT_PATH).

  gin builds it for the jobs (`jobs.EvalJob.checkpoint = @jobs.Checkpoint()`, its `path` bound
  to %CHECKPOINT_PATH), as t5x's run files build `utils.RestoreCheckpointConfig`.
  """

  path: str | None = fields.setting(
      None, check=fields.required(fields.path()),
      unrecorded="its content is recorded ('checkpoint'); the path only beside it")
  params_dtype: str = fields.setting('float32', check=fields.dtype())
  check_finite: bool = fields.setting(
      True, check=fields.boolean(),
      unrecorded='it refuses a checkpoint or not; a result is the same')
  flag: str = fields.setting('CHECKPOINT_PATH', check=fields.text(),
                             unrecorded='the setting errors name')

  GIN_NAME: ClassVar[str] = 'jobs.Checkpoint'

  def __post_init__(self):
    fields.check_fields(self)  # Unset (None, %gin.REQUIRED): the job's check names it.

  def field_macro(self, name: str) -> str | None:
    """The flag a field's error names: `flag` for the path (a job holds two checkpoints)."""
    return self.flag if name == 'path' else None

  @property
  def name(self) -> str:
    """How errors name it: 'checkpoint PATH'."""
    return f'checkpoint {self.path}'

  @functools.cached_property
  def _place(self) -> tuple[str, Any]:
    """(resolved path, its `store.location_stamp` then), computed once."""
    resolved = store.resolve_location(self.path, self.flag)
    return resolved, store.location_stamp(resolved)

  @property
  def resolved(self) -> str:
    """The path resolved (once): the place every read of this checkpoint goes to."""
    return self._place[0]

  def load(self, config: Any, mesh: Any) -> tuple[Any, Any]:
    """(params, config): read sharded over `mesh` (each process reads only its devices'
    slices), checked against `config` (None: inferred); refused if the checkpoint was replaced
    since it was resolved."""
    loaded = checkpoints.load_params(self.resolved, config, dtype=jnp.dtype(self.params_dtype),
                                     mesh=mesh, check_finite=self.check_finite)
    self.check_unchanged()
    return loaded

  def check_unchanged(self) -> None:
    """Raises `CheckpointChangedError` if the resolved checkpoint is not the one first seen
    (another folder or file at that path, or files added or removed)."""
    resolved, stamp = self._place
    if store.location_stamp(resolved) != stamp:
      raise CheckpointChangedError(
          f'{self.flag} {self.path!r} ({resolved}) was replaced or changed while this run '
          'read it, so its fingerprint and its weights may come from different checkpoints. '
          'Rerun once it is no longer being written.')

  def embedding_rows(self) -> int:
    """Rows of the token embedding, read from the checkpoint's metadata (no weights)."""
    return checkpoints.embedding_rows(self.resolved)

  def fingerprint(self) -> Any:
    """The content's identity for run.json (`run_identity.checkpoint_fingerprint`)."""
    return run_identity.checkpoint_fingerprint(self.resolved)


def settings_object(kind: type, field: str, *, none: str | None = None) -> fields.Check:
  """The check of a job's `field` that holds a settings object of `kind` (named by its
  `GIN_NAME`; None passes with `none`, what None means): anything else is refused with the form
  it takes, so a path given where a `Checkpoint` goes (the jobs once took one) is told where the
  path goes."""
  name = kind.GIN_NAME
  bound = ('its path bound as jobs.Checkpoint.path' if kind is Checkpoint
           else f'its fields bound as {name}.NAME')
  example = 'path' if kind is Checkpoint else '...'

  def convert(value):
    if not isinstance(value, kind):
      raise fields.Refused(f'in gin: {field} = @{name}(), {bound}; in Python: '
                           f'{field}={name}({example})')
    return value
  check = fields.Check(f'a {name}', convert)
  return check if none is None else fields.optional(check, none)


@dataclasses.dataclass(frozen=True)
class Program:
  """One compiled program of a job, the same for the run, its memory check and the pre-flight.

  `fn` is the jitted function the run calls; `args` its abstract arguments as the run places them
  (`jax.ShapeDtypeStruct`s with shardings; `args[0]` the parameters); `names` name `args[1:]`.
  `units` is the work of one call (`unit`: an example, or an encoder pass at one tau);
  `workload` what one call computes (lengths, batch, dtype, mesh), stated once: the refusal's
  advice, the analytic estimate and the reports read it.
  """

  name: str
  description: str
  fn: Callable
  args: tuple[Any, ...]
  names: tuple[str, ...]
  units: int
  unit: str
  workload: memory.Workload

  @property
  def settings(self) -> dict[str, Any]:
    """What the program depends on, for reports (`memory.Workload.settings`)."""
    return self.workload.settings()

  def lower(self) -> Any:
    return self.fn.lower(*self.args)

  @property
  def shapes(self) -> dict[str, Any]:
    """The shape of each argument after the parameters (a tree of shapes for a tree)."""
    return {k: jax.tree.map(lambda x: tuple(x.shape), a)
            for k, a in zip(self.names, self.args[1:])}

  @property
  def parameter_bytes(self) -> int:
    """Per device: the whole parameter tree, as the run places it."""
    return memory.per_device_bytes(self.args[0])

  @property
  def input_bytes(self) -> int:
    """Per device: the batch arguments."""
    return memory.per_device_bytes(self.args[1:])

  def figures(self, compiled: Any) -> memory.Compiled:
    """XLA's memory figures of the compiled program, with the parameters it does not read."""
    return memory.Compiled.of(compiled, parameter_bytes=self.parameter_bytes,
                              input_bytes=self.input_bytes)

  def check_memory(self, what: str = 'This run') -> memory.Compiled:
    """Compiles the program and refuses it if XLA's memory figure exceeds the device's
    (`memory.check_compiled`); the run then calls the same jitted function."""
    return memory.check_compiled(self.figures(self.lower().compile()), what=what,
                                 hints=self.workload.settings_to_change())


@runtime_checkable
class Job(Protocol):
  """What a job is: a frozen dataclass of the settings gin binds (each field in its `identity`
  unless its metadata says why not: `run_identity.NOT_IDENTITY`) that checks them, builds the
  programs it compiles and runs. `t5align.preflight` compiles `programs` for a TPU slice; the
  run compiles the same ones.

  Attributes:
    REQUIRED: {field: its gin macro} of the settings a run needs (`gin_cli.require`).
    KIND: what its records are (`run_identity.KINDS`), for reading old ones.
  """

  REQUIRED: ClassVar[Mapping[str, str | None]]
  KIND: ClassVar[str]

  @property
  def params_dtype(self) -> str:
    """The dtype its parameters are held in."""

  def check(self) -> None:
    """Every setting that needs no file, each error naming its macro."""

  def mesh(self) -> Any:
    """The device mesh its programs run over (None: one device)."""

  def programs(self, config: Any, mesh: Any, params: Any, *,
               length: int | None = None) -> list[Program]:
    """Each distinct program it compiles for `config` over `mesh`, with `params` (arrays or
    `jax.ShapeDtypeStruct`s, placed as the run places them), for `length`-token inputs (None:
    the job's own)."""

  def identity(self, facts: Mapping[str, Any]) -> dict[str, Any]:
    """Its record (`run_identity.make`): its settings and `facts`, what its run found."""

  def run(self) -> Any:
    """The run."""

  def resume_note(self) -> str:
    """What a run stopped midway keeps and how to resume it (the command's last line when a
    signal stops it: `gin_cli.run_job`)."""
