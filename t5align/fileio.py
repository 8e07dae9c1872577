"""Atomic file writes: a temporary file in the same folder, fsynced, then renamed over the target."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> None:
  """Writes `data` to `path` so that readers see the old file or the whole new one, never part."""
  path = os.fspath(path)
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=f'.{os.path.basename(path)}.tmp-')
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(data.encode('utf-8') if isinstance(data, str) else data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, allow_nan: bool = True,
                      sort_keys: bool = True) -> None:
  """`write_atomic` of `obj` as indented JSON (keys sorted unless their order means something)."""
  write_atomic(path, json.dumps(obj, indent=1, sort_keys=sort_keys, allow_nan=allow_nan) + '\n')
