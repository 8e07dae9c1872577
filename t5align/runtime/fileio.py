"""Output files, local or in a bucket (`gs://...`), with atomic writes.

Local paths use the OS: a write goes to a temporary file in the same folder, is fsynced, then
renamed over the target. URLs (`scheme://...`, e.g. `gs://bucket/dir/file`) go through
`etils.epath` (tf.io.gfile or fsspec underneath): an object store's write of a whole object is
atomic by itself, so it is written directly; there are no folders to create (epath makes what the
store needs). A URL is never turned into a local path, so no local folder named `gs:` appears.

Every remote operation (here, and the checkpoint readers' tensorstore reads of `gs://`) must
answer within `remote_timeout_s()` seconds, $T5ALIGN_REMOTE_TIMEOUT_S (default 120: one
operation may read one whole array, up to ~0.5 GB for T5-XXL's float32 embedding), else it
raises `RemoteTimeoutError` naming the path and the timeout: a bucket without network or
credentials fails in two minutes with a message, not after many silent retries.
"""
from __future__ import annotations

import builtins
import errno
import json
import os
import posixpath
import stat
import tempfile
import threading
from typing import IO, Any, Callable, TypeVar

PathLike = str | os.PathLike[str]
T = TypeVar('T')

REMOTE_TIMEOUT_ENV = 'T5ALIGN_REMOTE_TIMEOUT_S'
DEFAULT_REMOTE_TIMEOUT_S = 120.0
# The largest input file (text, JSONL, JSON) read whole: $T5ALIGN_MAX_INPUT_BYTES, default 2 GiB.
MAX_INPUT_ENV = 'T5ALIGN_MAX_INPUT_BYTES'
DEFAULT_MAX_INPUT_BYTES = 2 << 30


class RemoteTimeoutError(TimeoutError):
  """A remote store (`gs://`) did not answer within `remote_timeout_s()` seconds."""

  def __init__(self, what: str, path: str, timeout_s: float):
    self.path, self.timeout_s = path, timeout_s
    super().__init__(
        f'{what} {path}: no answer within {timeout_s:g} s ({REMOTE_TIMEOUT_ENV}). Is there a '
        f'network route to the bucket, and credentials (gcloud auth application-default login)? '
        f'Set {REMOTE_TIMEOUT_ENV} higher for a slow link.')


def remote_timeout_s() -> float:
  """Seconds a remote operation may take: $T5ALIGN_REMOTE_TIMEOUT_S, else 120."""
  value = os.environ.get(REMOTE_TIMEOUT_ENV, '').strip()
  if not value:
    return DEFAULT_REMOTE_TIMEOUT_S
  try:
    timeout = float(value)
  except ValueError:
    timeout = float('nan')
  if not timeout > 0 or timeout == float('inf'):
    raise ValueError(f'{REMOTE_TIMEOUT_ENV}={value!r}: expected a positive number of seconds.')
  return timeout


def call_with_timeout(fn: Callable[[], T], what: str, path: PathLike) -> T:
  """`fn()` (a blocking remote call), or `RemoteTimeoutError` after `remote_timeout_s()`.

  NOTE: a Python call cannot be interrupted: on timeout `fn` is left running in a daemon thread
  (it does not keep the process alive) and the caller gets the error at once.
  """
  timeout = remote_timeout_s()
  outcome: dict[str, Any] = {}

  def run():
    try:
      outcome['value'] = fn()
    except BaseException as e:  # pylint: disable=broad-except  (re-raised in the caller)
      outcome['error'] = e

  thread = threading.Thread(target=run, name=f't5align remote: {what}', daemon=True)
  thread.start()
  thread.join(timeout)
  if thread.is_alive():
    raise RemoteTimeoutError(what, os.fspath(path), timeout)
  if 'error' in outcome:
    raise outcome['error']
  return outcome['value']


def is_remote(path: PathLike) -> bool:
  """True for URLs such as `gs://bucket/x` (written through etils.epath)."""
  return '://' in os.fspath(path)


def _epath(path: PathLike):
  from etils import epath  # pylint: disable=g-import-not-at-top
  return epath.Path(os.fspath(path))


def join(base: PathLike, *parts: str) -> str:
  base = os.fspath(base)
  return posixpath.join(base, *parts) if is_remote(base) else os.path.join(base, *parts)


def dirname(path: PathLike) -> str:
  path = os.fspath(path)
  return posixpath.dirname(path) if is_remote(path) else os.path.dirname(os.path.abspath(path))


def makedirs(path: PathLike) -> None:
  """Creates the folder `path` and its parents if missing."""
  if is_remote(path):
    call_with_timeout(lambda: _epath(path).mkdir(parents=True, exist_ok=True),
                      'Creating the folder', path)
  else:
    os.makedirs(os.fspath(path), exist_ok=True)


def exists(path: PathLike) -> bool:
  if is_remote(path):
    return call_with_timeout(_epath(path).exists, 'Looking for', path)
  return os.path.exists(os.fspath(path))


def open(path: PathLike, mode: str = 'r', **kwargs: Any) -> IO[Any]:  # pylint: disable=redefined-builtin
  """`open` for local paths and URLs (epath's file object; the opening is timed, not its reads)."""
  if is_remote(path):
    return call_with_timeout(lambda: _epath(path).open(mode, **kwargs), 'Opening', path)
  return builtins.open(os.fspath(path), mode, **kwargs)


def read_bytes(path: PathLike) -> bytes:
  if is_remote(path):
    return call_with_timeout(lambda: _epath(path).read_bytes(), 'Reading', path)
  with open(path, 'rb') as f:
    return f.read()


def max_input_bytes() -> int:
  """$T5ALIGN_MAX_INPUT_BYTES, else `DEFAULT_MAX_INPUT_BYTES`."""
  value = os.environ.get(MAX_INPUT_ENV, '')
  if not value:
    return DEFAULT_MAX_INPUT_BYTES
  if not value.isdigit() or int(value) < 1:
    raise ValueError(f'{MAX_INPUT_ENV}={value!r}: expected a positive number of bytes.')
  return int(value)


def read_input(path: PathLike, what: str) -> bytes:
  """An input file's bytes, read whole; a local path must be a regular file (a fifo, a device
  such as /dev/zero or a folder is refused before it is opened, so nothing waits or reads
  without end) of at most `max_input_bytes()`. `what` names the setting or kind of file
  ('--gin.TEXT_FILE', 'metrics file') in the errors."""
  if is_remote(path):
    return read_bytes(path)
  path = os.fspath(path)
  try:
    info = os.stat(path)
  except OSError as e:
    raise ValueError(f'{what} {path}: cannot be read ({e.strerror}).') from e
  if not stat.S_ISREG(info.st_mode):
    kind = ('a folder' if stat.S_ISDIR(info.st_mode) else 'a fifo' if stat.S_ISFIFO(info.st_mode)
            else 'a device' if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
            else 'a socket' if stat.S_ISSOCK(info.st_mode) else 'not a file')
    raise ValueError(f'{what} {path} is {kind}, not a regular file: give a file.')
  limit = max_input_bytes()
  with open(path, 'rb') as f:
    data = f.read(limit + 1)
  if len(data) > limit:
    raise ValueError(f'{what} {path} is over {limit} bytes, the input size limit; raise '
                     f'{MAX_INPUT_ENV} to read it.')
  return data


def _umask() -> int:
  """The process umask (read from /proc where possible: setting it to read it is not
  thread-safe)."""
  try:
    with builtins.open('/proc/self/status', encoding='ascii') as f:
      for line in f:
        if line.startswith('Umask:'):
          return int(line.split()[1], 8)
  except (OSError, ValueError):
    pass
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def folder_mode() -> int:
  """The permissions `os.makedirs` gives a new folder: 0777 less the process umask."""
  return 0o777 & ~_umask()


def write_atomic(path: PathLike, data: bytes | str) -> None:
  """Writes `data` to `path` so that readers see the old file or the whole new one, never part.

  The file gets the permissions `open` would give a new file (0666 less the umask), not
  mkstemp's 0600.
  """
  data = data.encode('utf-8') if isinstance(data, str) else data
  if is_remote(path):
    makedirs(dirname(path))

    def upload():
      with _epath(path).open('wb') as f:  # One object upload: atomic in GCS.
        f.write(data)
    call_with_timeout(upload, 'Writing', path)
    return
  path = os.fspath(path)
  folder = dirname(path)
  tmp = None
  try:
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f'.{os.path.basename(path)}.tmp-')
    os.fchmod(fd, 0o666 & ~_umask())
    with os.fdopen(fd, 'wb') as f:
      write_synced(f, data)
    os.replace(tmp, path)
  except BaseException as e:
    if tmp is not None and os.path.exists(tmp):
      os.remove(tmp)
    if isinstance(e, OSError):
      raise write_error(e, path) from e
    raise


def write_synced(f: IO[bytes], data: bytes) -> None:
  """Writes `data` to the open local file `f`, flushes and fsyncs it: every local result write
  (`write_atomic`, `append_text`) goes through here."""
  f.write(data)
  f.flush()
  os.fsync(f.fileno())


def write_error(error: OSError, path: PathLike) -> OSError:
  """`error` (of the same class and errno) with a message naming `path`; a full disk (ENOSPC)
  also says that what was written before is kept for the rerun to resume from."""
  if error.filename is not None or os.fspath(path) in str(error):
    return error
  hint = (' (what was written before stays; free space and rerun the same command to resume)'
          if error.errno == errno.ENOSPC else '')
  return type(error)(error.errno, f'{error.strerror or error}{hint}', os.fspath(path))


def append_text(path: PathLike, text: str) -> None:
  """Appends `text` to a local file in one write, then fsyncs (a kill leaves at most a torn last
  line, which `outputs.repair_jsonl` cuts); an OSError names the file."""
  try:
    with builtins.open(os.fspath(path), 'ab') as f:
      write_synced(f, text.encode('utf-8'))
  except OSError as e:
    raise write_error(e, path) from e


def write_json_atomic(path: PathLike, obj: Any, *, allow_nan: bool = True,
                      sort_keys: bool = True) -> None:
  """`write_atomic` of `obj` as indented JSON (keys sorted unless their order means something)."""
  write_atomic(path, json.dumps(obj, indent=1, sort_keys=sort_keys, allow_nan=allow_nan) + '\n')


def save_figure(fig: Any, path: PathLike, **kwargs: Any) -> None:
  """`fig.savefig` into `path` (local or URL) through `write_atomic`; format from the suffix."""
  import io  # pylint: disable=g-import-not-at-top
  buffer = io.BytesIO()
  fig.savefig(buffer, format=os.path.splitext(os.fspath(path))[1][1:] or None, **kwargs)
  write_atomic(path, buffer.getvalue())
