"""Resumable records: an append-only JSONL file of records with a unique key, fsynced per write.

What every resumable output of t5align keeps its finished work in (an evaluation's per-example
predictions, a calibration's finished calibrations). Opening reads what is there and cuts a torn
last line (the writer died mid-line); a rerun then does only what is missing.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

from t5align.runtime import fileio
from t5align.runtime import outputs


class RecordLog:
  """Append-only JSONL of records with a unique key: an int 'index' (per-example records), or
  another field's value.

  Opening reads the records already there. A last line without its newline (the process died
  while writing it) is cut off, so its examples are simply redone. A duplicated key or a bad
  line elsewhere is corruption and raises, naming the file and line.
  """

  def __init__(self, path: str | os.PathLike[str], key: str = 'index'):
    self.path = os.fspath(path)
    self.key = key
    self.records: dict[Any, dict[str, Any]] = {}
    fileio.makedirs(fileio.dirname(self.path))
    raw = outputs.repair_jsonl(self.path)
    for number, line in enumerate(outputs.decode_lines(raw, self.path), start=1):
      try:
        record = json.loads(line)
        value = self._key(record)
      except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f'{self.path}:{number}: not a {self._what} record ({e}).') from e
      if value in self.records:
        raise ValueError(f'{self.path}:{number}: {self.key} {value} recorded twice.')
      self.records[value] = record

  @property
  def _what(self) -> str:
    return 'prediction' if self.key == 'index' else f'keyed ({self.key!r})'

  def _key(self, record: Mapping[str, Any]) -> Any:
    return int(record['index']) if self.key == 'index' else str(record[self.key])

  def __contains__(self, key: Any) -> bool:
    return key in self.records

  def __len__(self) -> int:
    return len(self.records)

  def append(self, records: Sequence[Mapping[str, Any]]) -> None:
    """Adds records in one write and fsyncs; raises on a key already present."""
    lines = []
    for record in records:
      value = self._key(record)
      if value in self.records:
        raise ValueError(f'{self.path}: {self.key} {value} is already recorded.')
      lines.append(json.dumps(record, ensure_ascii=False, sort_keys=True, allow_nan=True))
    if not lines:
      return
    if fileio.is_remote(self.path):  # Object stores cannot append: rewrite the whole object.
      old = [json.dumps(r, ensure_ascii=False, sort_keys=True, allow_nan=True)
             for r in self.records.values()]
      fileio.write_atomic(self.path, '\n'.join(old + lines) + '\n')
    else:
      fileio.append_text(self.path, '\n'.join(lines) + '\n')
    for record in records:
      self.records[self._key(record)] = dict(record)

  def ordered(self) -> list[dict[str, Any]]:
    return [self.records[i] for i in sorted(self.records)]
