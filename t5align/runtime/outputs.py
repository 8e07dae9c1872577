"""Output folders and files of a run: an exclusive lock, a writability check, leftovers cleaned.

A run that writes into a folder (eval's EVAL_OUTPUT_DIR, the demo's output, train's MODEL_DIR) or
a file (calibrate's OUTPUT_PATH) first takes `FolderLock`: `fcntl.flock` on a lock file that holds
the owner's pid and host. A second run into the same place is refused at once, naming the holder;
the kernel drops the lock when its process dies, so a killed run never blocks the next one (its
pid left in the file is reported as a stale lock taken over). Holding the lock, the run removes
what killed runs leave: `.NAME.tmp-*` files of `fileio.write_atomic` and `checkpoint_N.tmp-*`
folders of the T5X writer, but nothing in a subfolder whose lock a live run holds. Only the
writing process (JAX process 0) locks; remote (`gs://`) outputs are not locked (object stores
have no flock).

A file's lock is keyed on the file itself (`.NAME.lock` beside it, its folder's real path), so
every run that writes that file takes the same lock, whatever path it was given. File and
folder locks coexist: a run claiming a file refuses while another run holds the folder it is in
(or that folder's parent: a folder's run writes and cleans two levels deep), and a run claiming
a folder refuses while another run holds the lock of a file in it (or in a subfolder).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from typing import Any, Iterator

from absl import logging

from t5align.runtime import fileio

LOCK_NAME = '.t5align.lock'
_HELD: set[str] = set()  # Lock files this process holds.
_TMP = re.compile(r'^(\..+\.tmp-.+|checkpoint_\d+\.tmp-.+)$')


class OutputLockedError(RuntimeError):
  """Another live run holds the output folder or file."""


def _is_writer() -> bool:
  if 'jax' not in sys.modules:
    return True
  return sys.modules['jax'].process_index() == 0


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class FolderLock:
  """An exclusive, non-blocking `flock` on `lock_path`; `release()` (or `with`) gives it back."""

  def __init__(self, lock_path: str, what: str):
    self.path, self.what = lock_path, what
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    while True:
      self._fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
      if not _try_lock(self._fd, fcntl.LOCK_EX):
        holder = self._holder()
        os.close(self._fd)
        raise OutputLockedError(
            f'{what} is in use by another run ({holder or "holder unknown"}; lock file '
            f'{lock_path}). Wait for it to finish or use another output path.') from None
      # A releasing holder unlinks the file before unlocking it: if ours is no longer the file
      # at `lock_path`, we locked an orphan; open the path again.
      try:
        if os.stat(lock_path).st_ino == os.fstat(self._fd).st_ino:
          break
      except FileNotFoundError:
        pass
      os.close(self._fd)
    previous = self._holder()
    if previous:
      self._take_over(previous)
    os.ftruncate(self._fd, 0)
    os.write(self._fd, f'pid={os.getpid()} host={socket.gethostname()}\n'.encode())
    os.fsync(self._fd)
    _HELD.add(lock_path)

  def _holder(self) -> str:
    with open(self.path, encoding='utf-8', errors='replace') as f:
      return f.read().strip()

  def _take_over(self, previous: str) -> None:
    fields = dict(part.split('=', 1) for part in previous.split() if '=' in part)
    host, pid = fields.get('host'), fields.get('pid', '')
    if host == socket.gethostname() or not host:
      state = 'dead' if pid.isdigit() and not _pid_alive(int(pid)) else 'no longer holding it'
      logging.warning('warning: taking over the stale lock of %s (%s, %s).', self.what, previous,
                      state)
      return
    os.close(self._fd)
    raise OutputLockedError(
        f'{self.what} was locked by a run on another host ({previous}; lock file {self.path}), '
        'whose liveness cannot be checked from here. If that run is gone, delete the lock file.')

  def release(self) -> None:
    if self._fd is None:
      return
    # Unlinked while still locked: a run that opened it meanwhile sees an orphan and retries.
    _HELD.discard(self.path)
    os.unlink(self.path)
    fcntl.flock(self._fd, fcntl.LOCK_UN)
    os.close(self._fd)
    self._fd = None

  def __enter__(self) -> FolderLock:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.release()


def _try_lock(fd: int, mode: int, tries: int = 3) -> bool:
  """`flock(fd, mode | LOCK_NB)`; a few quick retries ride out another run's probe (`_probe`)."""
  for attempt in range(tries):
    try:
      fcntl.flock(fd, mode | fcntl.LOCK_NB)
      return True
    except BlockingIOError:
      if attempt + 1 < tries:
        time.sleep(0.02)
  return False


def lock_path(path: fileio.PathLike, *, is_file: bool = False) -> str:
  """The lock file of an output folder (inside it) or an output file (beside it), by real path:
  one lock per folder or file, whatever path (symbolic links, `..`) names it."""
  path = os.path.realpath(os.fspath(path))
  if is_file:
    return os.path.join(os.path.dirname(path), f'.{os.path.basename(path)}.lock')
  return os.path.join(path, LOCK_NAME)


def _probe(lock_file: str) -> str | None:
  """The holder of `lock_file` if another open lock holds it (this process's locks excepted)."""
  if lock_file in _HELD:
    return None
  try:
    fd = os.open(lock_file, os.O_RDONLY)
  except OSError:  # No such lock (or gone meanwhile): nobody holds it.
    return None
  try:
    if _try_lock(fd, fcntl.LOCK_SH, tries=1):
      fcntl.flock(fd, fcntl.LOCK_UN)
      return None
    with open(lock_file, encoding='utf-8', errors='replace') as f:
      return f.read().strip() or 'holder unknown'
  finally:
    os.close(fd)


def _check_neighbours(path: str, what: str, *, is_file: bool) -> None:
  """Raises `OutputLockedError` if another run holds a lock that overlaps `path`'s (see the
  module docstring): the folder (or its parent) of an output file, or a file lock inside (or
  one level below) an output folder."""
  path = os.path.realpath(path)
  if is_file:
    parent = os.path.dirname(path)
    for folder in (parent, os.path.dirname(parent)):
      holder = _probe(os.path.join(folder, LOCK_NAME))
      if holder:
        raise OutputLockedError(
            f'{what} is inside {folder}, the output folder of another run ({holder}; lock file '
            f'{os.path.join(folder, LOCK_NAME)}), which writes and cleans files there. Wait for '
            'it to finish or use another output path.')
    return
  folders = [path] + [e.path for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
  for folder in folders:
    for entry in os.scandir(folder):
      if entry.name.startswith('.') and entry.name.endswith('.lock') and entry.name != LOCK_NAME:
        holder = _probe(entry.path)
        if holder:
          target = os.path.join(folder, entry.name[1:-len('.lock')])
          raise OutputLockedError(
              f'{what} holds {target}, the output file of another run ({holder}; lock file '
              f'{entry.path}). Wait for it to finish or use another output path.')


def check_writable(path: fileio.PathLike, *, is_file: bool = False, name: str = 'output') -> None:
  """Raises unless `path` (a folder, or with `is_file` a file) can be written: made if missing."""
  path = os.fspath(path)
  if fileio.is_remote(path):
    return
  if is_file and os.path.isdir(path):
    raise IsADirectoryError(f'{name} {path} is a directory; give the path of a file to write.')
  if not is_file and os.path.exists(path) and not os.path.isdir(path):
    raise NotADirectoryError(f'{name} {path} is a file; give a folder to write into.')
  folder = os.path.dirname(os.path.abspath(path)) if is_file else path
  try:
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):
      pass
  except OSError as e:
    raise OSError(e.errno, f'{name} {path}: cannot write in {folder} ({e.strerror})') from e


def _live_lock(folder: str, *, deep: bool = False) -> str | None:
  """A lock file in `folder` (with `deep`, at any depth below it) that a live run holds, a
  folder's or a file's: another process's, or one this process holds."""
  for root, unused_dirs, files in os.walk(folder):
    for name in files:
      if name.startswith('.') and name.endswith('.lock'):
        path = os.path.join(root, name)
        real = os.path.realpath(path)
        if real in _HELD or _probe(real):
          return path
    if not deep:
      break
  return None


def remove_stale_tmp(folder: fileio.PathLike, depth: int = 2,
                     only: str | None = None) -> list[str]:
  """Removes `.NAME.tmp-*` files and `checkpoint_N.tmp-*` folders under `folder` (to `depth`),
  which the caller holds (`claim`).

  With `only`, just the temporary files of the file `only` in `folder` (`.only.tmp-*`): a folder
  shared with others may hold their live temporary files. A subfolder in which a live run holds
  a lock (a folder's or a file's) is neither cleaned nor entered, and a temporary folder with
  such a lock at any depth stays.
  """
  removed = []
  folder = os.fspath(folder)
  if fileio.is_remote(folder) or not os.path.isdir(folder):
    return removed
  for entry in os.scandir(folder):
    is_dir = entry.is_dir(follow_symlinks=False)
    if (entry.name.startswith(f'.{only}.tmp-') if only else _TMP.match(entry.name)):
      if not is_dir:
        os.remove(entry.path)
      elif _live_lock(entry.path, deep=True):
        continue
      else:
        shutil.rmtree(entry.path, ignore_errors=True)
      removed.append(entry.path)
    elif depth > 1 and is_dir and not _live_lock(entry.path):
      removed += remove_stale_tmp(entry.path, depth - 1)
  return removed


@contextlib.contextmanager
def claim(path: fileio.PathLike | None, what: str, *,
          is_file: bool = False) -> Iterator[FolderLock | None]:
  """Checks `path` is writable, locks it (writer process, local paths), cleans leftovers.

  Yields the lock (None on other processes, for remote paths and for an unset path: None or a
  placeholder such as gin.REQUIRED, which the run's own checks report); released on exit.
  """
  if (not isinstance(path, (str, os.PathLike)) or fileio.is_remote(path)
      or not _is_writer()):
    yield None
    return
  check_writable(path, is_file=is_file, name=what)
  with FolderLock(lock_path(path, is_file=is_file), f'{what} {os.fspath(path)}') as lock:
    _check_neighbours(os.fspath(path), f'{what} {os.fspath(path)}', is_file=is_file)
    if is_file:
      path = os.path.abspath(os.fspath(path))
      leftovers = remove_stale_tmp(os.path.dirname(path), 1, only=os.path.basename(path))
    else:
      leftovers = remove_stale_tmp(path)
    for leftover in leftovers:
      logging.warning('removed %s (left by an interrupted run)', leftover)
    yield lock


def whole_lines(raw: bytes) -> bytes:
  """`raw` up to and including its last newline: without a torn last line (no newline: the
  writer died mid-line), which is no record."""
  return raw[:raw.rfind(b'\n') + 1]


def repair_jsonl(path: fileio.PathLike) -> bytes:
  """Cuts a torn last line (no newline: the writer died mid-line) off a local JSONL file.

  Returns the file's bytes up to and including its last newline (b'' if it does not exist).
  """
  path = os.fspath(path)
  if not fileio.exists(path):
    return b''
  raw = fileio.read_bytes(path)
  keep = len(whole_lines(raw))
  if keep < len(raw) and not fileio.is_remote(path):
    logging.warning('%s: dropped a torn last line (%d bytes, an interrupted write).', path,
                    len(raw) - keep)
    with open(path, 'r+b') as f:
      f.truncate(keep)
  return raw[:keep]


def decode_lines(raw: bytes, path: str) -> list[str]:
  """`raw`'s lines as text; a line that is not UTF-8 raises, naming the file and line."""
  lines = raw.split(b'\n')
  if not lines[-1]:
    lines.pop()  # After the last newline (or an empty file): no line.
  out = []
  for number, line in enumerate(lines, start=1):
    try:
      out.append(line.decode('utf-8'))
    except UnicodeDecodeError as e:
      raise ValueError(f'{path}:{number}: not UTF-8 text ({e.reason} at byte {e.start}).') from e
  return out


def read_json(path: fileio.PathLike, what: str = 'JSON file',
              error: type[ValueError] = ValueError) -> Any:
  """A JSON file's value; a non-UTF-8 or invalid file, or one that is not a regular file
  (`fileio.read_input`), raises `error` naming it (and line)."""
  path = os.fspath(path)
  try:
    raw = fileio.read_input(path, what)
  except ValueError as e:
    raise error(str(e)) from e
  try:
    return json.loads(raw.decode('utf-8'))
  except UnicodeDecodeError as e:
    raise error(f'{what} {path}: not UTF-8 text ({e.reason} at byte {e.start}).') from e
  except json.JSONDecodeError as e:
    raise error(f'{what} {path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno}); '
                'is it truncated?') from e


def jsonable(x: Any, *, non_finite: str = 'raise', what: str = 'a JSON file') -> Any:
  """`x` as plain JSON values: str keys, lists for tuples and arrays, Python numbers.

  Args:
    x: dicts, lists, tuples, numpy arrays and scalars (anything with `.tolist()`), plain values.
    non_finite: what a NaN or infinite float becomes: 'raise' (ValueError naming `what`) or
      'null' (None).
    what: the file or record being written, for the error.
  """
  if non_finite not in ('raise', 'null'):
    raise ValueError(f"non_finite={non_finite!r}; expected 'raise' or 'null'.")
  if isinstance(x, dict):
    return {str(k): jsonable(v, non_finite=non_finite, what=what) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v, non_finite=non_finite, what=what) for v in x]
  if hasattr(x, 'tolist'):  # numpy arrays and scalars
    return jsonable(x.tolist(), non_finite=non_finite, what=what)
  if isinstance(x, float) and not math.isfinite(x):
    if non_finite == 'null':
      return None
    raise ValueError(f'non-finite value {x} cannot be stored in {what}.')
  return x
