"""What every job shares: the checkpoint it reads, the programs it compiles, and the keywords
of its settings' old places."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from typing import Any, Callable, Sequence
import warnings

import jax
import jax.numpy as jnp

from t5align import checkpoints
from t5align import gin_cli
from t5align.checkpoints import store
from t5align import memory
from t5align import run_identity


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

  path: str | None = None
  params_dtype: str = 'float32'
  check_finite: bool = True
  flag: str = 'CHECKPOINT_PATH'

  def __post_init__(self):
    # Unset (None, %gin.REQUIRED): the job's check names it.
    if not (gin_cli.is_unset(self.path) or isinstance(self.path, (str, os.PathLike))):
      raise ValueError(f'{self.flag}={self.path!r}: expected the path of a checkpoint (a '
                       'string).')

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


class _Unset:
  """The default of a keyword that names a setting's old place: not given. Read from a job
  (`job.params_dtype`), it is this default, not the setting: read the object's
  (`job.checkpoint.params_dtype`)."""

  def __repr__(self) -> str:
    return 'UNSET'


UNSET = _Unset()
_WARNED: set[str] = set()


def gin_record(job: type) -> dict[str, str]:
  """gin's configuration as a run of `job` records it (`run_identity.gin_config`), with its
  settings objects' bindings under the job's fields of before (`jobs.Checkpoint.path = ...` as
  `jobs.EvalJob.checkpoint_path = ...`, `job.MOVED`) and the job's bindings of the objects
  themselves (`jobs.EvalJob.checkpoint = @jobs.Checkpoint()`) left out: a run recorded before
  gin built these objects reads as the same run, and a new one records what it did."""
  selector = f't5align.jobs.{job.__name__}'
  built = {field: f'@{gin_name}()' for field, (_, gin_name) in job.SETTINGS.items()}
  owners = {f't5align.{gin_name}': field for field, (_, gin_name) in job.SETTINGS.items()}
  old = {place: name for name, place in job.MOVED.items()}
  out = {}
  for key, value in run_identity.gin_config().items():
    scope, _, binding = key.rpartition('/')
    owner, _, attribute = binding.rpartition('.')
    prefix = f'{scope}/' if scope else ''
    if owner == selector and built.get(attribute) == value:
      continue  # `jobs.EvalJob.checkpoint = @jobs.Checkpoint()`
    if (owners.get(owner), attribute) in old:
      key = f'{prefix}{selector}.{old[owners[owner], attribute]}'
    out[key] = value
  return dict(sorted(out.items()))


def _warn_moved(job: Any, old: str) -> None:
  """The FutureWarning, once per process per name, that `job`'s `old` field moved."""
  field, attribute = job.MOVED[old]
  _, gin_name = job.SETTINGS[field]
  name = f'jobs.{type(job).__name__}'
  if f'{name}.{old}' in _WARNED:
    return
  _WARNED.add(f'{name}.{old}')
  warnings.warn(
      f'{name}.{old} is the old place of {gin_name}.{attribute} ({name}.{field}), kept '
      f'until the next release: bind {gin_name}.{attribute} in gin, or pass '
      f'{field}={gin_name.rsplit(".", 1)[-1]}({attribute}=...) in Python.', FutureWarning,
      stacklevel=4)


def move_settings(job: Any, old: Sequence[Any], **renamed: Any) -> None:
  """Puts each keyword that names a setting's old place (a job's flat field of before, e.g.
  `jobs.CalibrationJob.grid`) where the setting lives now (`job.MOVED`: old name -> (field,
  attribute), e.g. ('search', 'grid')), warning once per process per name (FutureWarning: the
  old keywords go in the next release). For the `__post_init__(self, *old)` of a frozen job.

  Args:
    job: the job.
    old: its `dataclasses.InitVar`s' values (default `UNSET`: not given), in declaration order.
    renamed: fields of before that kept their name, their old value (TrainJob's `optimizer` as
      a name, `mix` as weights).

  A field still None gets its defaults first (`job.SETTINGS`: field -> (what makes them, the
  class's gin name)), unless the value is None too (`initial_checkpoint_path=None`: none, as
  before); a settings field holding anything but its class is refused (TypeError naming both).
  """
  names = [n for n, p in inspect.signature(type(job)).parameters.items() if p.default is UNSET]
  for name, value in [*renamed.items(), *zip(names, old, strict=True)]:
    if value is UNSET:
      continue
    field, attribute = job.MOVED[name]
    _warn_moved(job, name)
    current = getattr(job, field)
    if current is None:
      if value is None:
        continue
      current = job.SETTINGS[field][0]()
    object.__setattr__(job, field, dataclasses.replace(current, **{attribute: value}))
  for field, (make, gin_name) in job.SETTINGS.items():
    value = getattr(job, field)
    if value is not None and not isinstance(value, getattr(make, 'func', make)):
      raise TypeError(f'jobs.{type(job).__name__}.{field}={value!r}: expected a {gin_name} '
                      f'(in gin: {field} = @{gin_name}(), its fields bound as '
                      f'{gin_name}.NAME).')


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
