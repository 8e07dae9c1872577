"""Resumable per-example records of an evaluation: the prediction log, its run check, the loop.

No JAX here (`scoring` computes; this keeps what was computed). Files of a task folder:
  predictions.jsonl  one JSON record per example, keyed by 'index', appended batch by batch
                     (one write + fsync each); a torn last line from a kill is dropped on reopen.
  run.json           the run identity the records were made with (`run_identity`: content
                     fingerprints, gin configuration, settings); a rerun must match it field by
                     field, and records without a run.json are never added to.
  metrics.json       written atomically once every example has a record (by `t5align.eval`).
"""
from __future__ import annotations

import json
import os
import sys
from typing import IO, Any, Callable, Mapping, Sequence

import tqdm

from t5align import run_identity
from t5align.runtime import batching
from t5align.runtime import fileio
from t5align.runtime import outputs


class PredictionLog:
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


def check_run(folder: str | os.PathLike[str], settings: Mapping[str, Any],
              has_results: bool | None = None) -> None:
  """Writes run.json, or checks that the run that made the folder's results had the same
  identity (`run_identity.check_same`: every field but `run_identity.INFORMATIONAL`).

  A run.json whose folder holds no result yet (by default: no prediction record, no
  metrics.json; the run failed before its first batch) is replaced, so a corrected rerun is not
  refused. Results without a run.json are refused: nothing says which run made them.
  """
  path = fileio.join(folder, 'run.json')
  settings = json.loads(json.dumps(settings, sort_keys=True))
  predictions = fileio.join(folder, 'predictions.jsonl')
  if has_results is None:
    has_results = fileio.exists(fileio.join(folder, 'metrics.json')) or (
        fileio.exists(predictions) and b'\n' in fileio.read_bytes(predictions))
  if has_results:
    before = outputs.read_json(path, 'run record') if fileio.exists(path) else None
    run_identity.check_same(before, settings, what=os.fspath(folder),
                            hint='Use another output folder (or move this one away).')
    return
  fileio.write_json_atomic(path, settings)


class _Lines:
  """A stream for tqdm off a terminal: each redraw becomes one plain line (no carriage returns)."""

  def __init__(self, stream: IO[str]):
    self.stream = stream

  def write(self, text: str) -> None:
    for part in text.split('\r'):
      part = part.rstrip()
      if part:
        self.stream.write(part + '\n')

  def flush(self) -> None:
    self.stream.flush()


def progress_bar(total: int, desc: str = '', done: int = 0,
                 stream: IO[str] | None = None) -> tqdm.tqdm:
  """A tqdm bar of examples on `stream` (stderr). On a terminal it redraws in place; elsewhere
  (a log file, CI) it writes a line at most every 30 s, and the last one when closed."""
  stream = stream or sys.stderr
  tty = hasattr(stream, 'isatty') and stream.isatty()
  return tqdm.tqdm(total=total, initial=done, desc=desc, unit='ex', dynamic_ncols=tty,
                   file=stream if tty else _Lines(stream), mininterval=0.1 if tty else 30.0,
                   ascii=not tty)


def run_examples(examples: Sequence[Mapping[str, Any]], log: Any,
                 process: Callable[[Sequence[Mapping[str, Any]]], list[dict[str, Any]]], *,
                 batch_size: int, desc: str = '', show_progress: bool = True,
                 total: int | None = None,
                 collect: Callable[[list[Any]], list[Any]] = list,
                 stream: IO[str] | None = None) -> None:
  """Runs `process` on batches of the examples that `log` lacks and appends its records.

  Args:
    examples: dicts with an int 'index' (unique); with several processes, this one's share.
    log: where records go (`PredictionLog`, or anything with `in`, `len` and `append`);
      examples whose index it holds are skipped.
    process: batch of examples -> one record (with the same 'index') per example. With several
      processes every one calls it equally often; a process out of examples passes [].
    batch_size: examples per call.
    desc: progress label.
    show_progress: draw the progress bar (`progress_bar`).
    total: examples over all processes (default: len(examples)), for the progress bar.
    collect: this process's records -> every process's (`multihost.gather_json`); a record
      made by several processes (same index) is kept once.
    stream: where the progress bar goes (default stderr).
  """
  todo = [e for e in examples if int(e['index']) not in log]
  total = len(examples) if total is None else total
  # The same count on every process.
  steps = max(collect([batching.ceil_div(len(todo), batch_size)]))
  progress = progress_bar(total, desc, len(log), stream) if show_progress else None
  for step in range(steps):
    batch = todo[step * batch_size:(step + 1) * batch_size]
    records = process(batch)
    if sorted(int(r['index']) for r in records) != sorted(int(e['index']) for e in batch):
      raise ValueError('process() must return one record per example, with its index.')
    unique = list({int(r['index']): r for r in reversed(collect(records))}.values())[::-1]
    log.append(sorted(unique, key=lambda r: int(r['index'])))
    if progress:
      progress.update(len(unique))
  if progress:
    progress.close()
