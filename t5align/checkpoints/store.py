"""Checkpoint trees, locations and byte reads shared by every format's reader.

Parameter trees are nested dicts; '/'-joined paths name their leaves
(`encoder/layers_0/attention/query/kernel`). Locations are local paths or `gs://bucket/path`
URLs, read through tensorstore key-value stores. A `gs://` operation must answer within
`fileio.remote_timeout_s()` ($T5ALIGN_REMOTE_TIMEOUT_S) or raises `fileio.RemoteTimeoutError`
naming the location; local reads wait as long as the file system takes.
"""
from __future__ import annotations

import os
import posixpath
import queue
from typing import Any, Callable, Mapping

from flax import serialization
import tensorstore as ts

from t5align.runtime import fileio

Params = dict[str, Any]


class CheckpointReadError(ValueError):
  """A checkpoint file exists but cannot be read (truncated msgpack, corrupt chunk, bad spec)."""


class CheckpointDtypeError(ValueError):
  """The checkpoint holds arrays of a dtype the caller did not allow."""


class CheckpointMismatchError(ValueError):
  """The checkpoint's parameters differ from the expected tree.

  Attributes:
    missing: paths expected but absent.
    unexpected: paths present but not expected.
    mismatched: `{path: (checkpoint_shape, expected_shape)}`.
  """

  def __init__(self, missing=(), unexpected=(), mismatched=None, source: str = ''):
    self.missing = sorted(missing)
    self.unexpected = sorted(unexpected)
    self.mismatched = dict(sorted((mismatched or {}).items()))
    where = f'Checkpoint {source}' if source else 'Checkpoint'
    lines = [f'{where} does not match the expected parameters:']
    lines += [f'  missing:    {p}' for p in self.missing]
    lines += [f'  unexpected: {p}' for p in self.unexpected]
    lines += [f'  shape:      {p}: checkpoint {got} != expected {want}'
              for p, (got, want) in self.mismatched.items()]
    super().__init__('\n'.join(lines))


# Trees.


def flatten_params(tree: Mapping[str, Any], prefix: str = '',
                   is_leaf: Callable[[Any], bool] | None = None) -> dict[str, Any]:
  """Nested dict -> `{'a/b/c': leaf}`; a dict for which `is_leaf` is True stays a leaf."""
  flat = {}
  for key, value in tree.items():
    path = f'{prefix}{key}'
    if isinstance(value, Mapping) and not (is_leaf and is_leaf(value)):
      flat.update(flatten_params(value, path + '/', is_leaf))
    else:
      flat[path] = value
  return flat


def unflatten_params(flat: Mapping[str, Any]) -> Params:
  """`{'a/b/c': leaf}` -> nested dict."""
  tree: Params = {}
  for path, value in flat.items():
    *parents, leaf = path.split('/')
    node = tree
    for key in parents:
      node = node.setdefault(key, {})
    node[leaf] = value
  return tree


# Locations and reads.


def is_gcs(location: str) -> bool:
  return str(location).startswith('gs://')


def check_utf8_path(path: str, setting: str, resolved_from: str | None = None) -> None:
  """Refuses a path holding bytes that are not UTF-8 (Python keeps them as surrogate escapes;
  tensorstore, which reads T5X and Orbax arrays, takes UTF-8 paths only), naming `setting`, the
  path (repr) and the first such byte."""
  try:
    path.encode('utf-8')
  except UnicodeEncodeError as e:
    byte = os.fsencode(path[e.start:e.start + 1])
    where = f'{resolved_from!r} resolves to {path!r}, which' if resolved_from else f'{path!r}'
    raise ValueError(
        f'{setting} {where} holds a byte that is not UTF-8 ({byte!r} at character {e.start}); '
        'checkpoints are read through tensorstore, which takes UTF-8 paths only. Rename the '
        'folder to a UTF-8 name (a symlink would not do: the path is resolved).') from None


def resolve_location(path: str, setting: str = 'checkpoint path') -> str:
  """The one place a checkpoint is read from: a local path made absolute with every symlink
  resolved (`os.path.realpath`; a link re-pointed later changes nothing), a `gs://` URL as
  given. Refuses a path that is not UTF-8 (`check_utf8_path`), naming `setting`."""
  path = os.fspath(path)
  check_utf8_path(path, setting)
  if is_gcs(path):
    return path
  resolved = os.path.realpath(path.removeprefix('file://'))
  check_utf8_path(resolved, setting, resolved_from=path)
  return resolved


def location_stamp(path: str) -> tuple[int, ...] | None:
  """(device, inode, mtime in ns) of a resolved local checkpoint (its folder or `checkpoint`
  file; a Mesh-TF prefix's `.index`): another value later means it was replaced or had files
  added or removed. None for `gs://` or a path that does not exist."""
  if is_gcs(path):
    return None
  for candidate in (path, path + '.index'):
    try:
      st = os.stat(candidate)
    except OSError:
      continue
    return st.st_dev, st.st_ino, st.st_mtime_ns
  return None


def kvstore_spec(location: str) -> dict[str, str]:
  """A tensorstore kvstore spec for a local path or a `gs://bucket/path` URL."""
  location = str(location)
  if is_gcs(location):
    bucket, _, path = location[len('gs://'):].partition('/')
    return {'driver': 'gcs', 'bucket': bucket, 'path': path}
  if location.startswith('file://'):
    location = location[len('file://'):]
  slash = '/' if location.endswith('/') else ''
  return {'driver': 'file', 'path': os.path.abspath(location) + slash}


def spec_location(kvstore: Mapping[str, Any]) -> str:
  """The location a (gcs or file) kvstore spec points at, for messages."""
  if kvstore.get('driver') == 'gcs':
    return f"gs://{kvstore['bucket']}/{kvstore['path']}"
  if kvstore.get('driver') == 'ocdbt':
    return spec_location(kvstore['base']) + kvstore.get('path', '')
  return str(kvstore.get('path', ''))


def _is_remote_spec(kvstore: Mapping[str, Any]) -> bool:
  return spec_location(kvstore).startswith('gs://')


def call(fn: Callable[[], Any], what: str, location: str) -> Any:
  """`fn()`, a blocking read of `location`; within the remote timeout if it is `gs://`."""
  return fileio.call_with_timeout(fn, what, location) if is_gcs(location) else fn()


def wait(future: Any, what: str, location: str) -> Any:
  """`future.result()` of a tensorstore operation on `location`; within the remote timeout if
  `location` is `gs://` (`fileio.RemoteTimeoutError` naming it), unbounded if local."""
  if not is_gcs(location):
    return future.result()
  timeout = fileio.remote_timeout_s()
  try:
    return future.result(timeout=timeout)
  except TimeoutError as e:
    future.cancel()
    raise fileio.RemoteTimeoutError(what, location, timeout) from e


def wait_all(futures: Mapping[str, Any], where: Mapping[str, Mapping[str, Any]],
             what: str) -> None:
  """Waits for concurrent tensorstore operations (`where[name]`: their specs).

  A remote batch times out only when none of its operations finishes for `remote_timeout_s()`
  (reads sharing a slow link each take longer than alone, but one keeps finishing). Failures
  are left for `ts_result` to report, per parameter.
  """
  remote = [name for name in futures if _is_remote_spec(where[name]['kvstore'])]
  if not remote:
    return
  done: queue.Queue[str] = queue.Queue()
  for name in remote:
    futures[name].add_done_callback(lambda _, name=name: done.put(name))
  timeout = fileio.remote_timeout_s()
  pending = set(remote)
  while pending:
    try:
      pending.discard(done.get(timeout=timeout))
    except queue.Empty:
      for name in pending:
        futures[name].cancel()
      first = sorted(pending)[0]
      raise fileio.RemoteTimeoutError(
          f'{what} ({len(pending)} parameters pending, e.g. {first})',
          spec_location(where[first]['kvstore']), timeout) from None


def ts_result(name: str, spec: Mapping[str, Any], future: Any) -> Any:
  """`future.result()`; a failure names the parameter and its array folder; a remote one must
  answer within the remote timeout."""
  where = spec_location(spec['kvstore'])
  try:
    return wait(future, f'Parameter {name}: reading the array at', where)
  except ValueError as e:
    if 'NOT_FOUND' in str(e):
      raise FileNotFoundError(f'Parameter {name}: array missing at {where}: {e}') from e
    raise CheckpointReadError(f'Parameter {name}: cannot read array at {where}: {e}') from e


def read_bytes(location: str) -> bytes:
  """Reads a whole file through a tensorstore kvstore (local or gcs); names the file on failure."""
  store = wait(ts.KvStore.open(kvstore_spec(posixpath.dirname(location) + '/')),
               'Opening the folder of', location)
  try:
    result = wait(store.read(posixpath.basename(location)), 'Reading', location)
  except ValueError as e:
    raise CheckpointReadError(f'Cannot read {location}: {e}') from e
  if result.state == 'missing':
    raise FileNotFoundError(f'No such checkpoint file: {location}')
  return result.value


def exists(location: str) -> bool:
  if not is_gcs(location):
    return os.path.exists(location)
  spec = kvstore_spec(location)
  key = spec.pop('path').encode()
  store = wait(ts.KvStore.open(spec), 'Opening the bucket of', location)
  return bool(wait(store.list(ts.KvStore.KeyRange(key, key + b'\xff')), 'Looking for', location))


def restore_msgpack(location: str) -> dict[str, Any]:
  """A flax msgpack file (T5X's `checkpoint`, HF's `flax_model.msgpack`) as a nested dict."""
  data = read_bytes(location)
  try:
    # Decodes flax's ext types (ndarray, complex, numpy scalar) and reassembles
    # '__msgpack_chunked_array__' dicts (arrays over 1 GiB).
    contents = serialization.msgpack_restore(data)
  except Exception as e:  # msgpack raises several unrelated types on truncation.
    raise CheckpointReadError(f'Corrupt or truncated msgpack {location}: {e!r}') from e
  if not isinstance(contents, dict):
    raise CheckpointReadError(f'{location} is not a T5X checkpoint (top level {type(contents)})')
  return contents
