"""A task's examples and their records: the loop over the ones not yet recorded, batch by batch,
with progress (`run_examples`); the prediction log as every process sees it (`SharedLog`); the
fields of a record (`keep_last`, `target_text`), the examples' fingerprint and the batch width
every process pads to.

The model runs elsewhere (`scoring`). Files of a task folder: predictions.jsonl (one record per
example, keyed by 'index', a `runtime.records.RecordLog`), run.json (`run_identity.check_run`)
and metrics.json (written atomically once every example has a record, `metrics.write_metrics`).
"""
from __future__ import annotations

import os
import sys
from typing import IO, Any, Callable, Mapping, Sequence

import numpy as np
import tqdm

from t5align import run_identity
from t5align.runtime import batching
from t5align.runtime import multihost
from t5align.runtime import records

INPUT_WIDTH_MULTIPLE = 128  # Batches are padded to a multiple of this many tokens.


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
    log: where records go (`runtime.records.RecordLog`, or anything with `in`, `len` and `append`);
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


def keep_last(tokens: Any, length: int) -> np.ndarray:
  """The last `length` non-pad tokens of one input (its EOS stays last): Table 6's
  'truncation' baseline, which feeds the model only the L_tr tokens nearest the completion."""
  tokens = np.asarray(tokens)
  if length < 1:
    raise ValueError(f'TRUNCATE_INPUTS={length} must be >= 1.')
  tokens = tokens[tokens > 0]
  return tokens[-length:]


def text(value: Any) -> str:
  """A record's text from an example's field (bytes as UTF-8, a 0-d array's item)."""
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value.item()
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


def target_text(ex: Mapping[str, Any], *, vocab: Any) -> str:
  """An example's target as text: its 'targets_pretokenized', else its target tokens decoded."""
  if 'targets_pretokenized' in ex:
    return text(ex['targets_pretokenized'])
  return vocab.decode([int(t) for t in ex['targets']])


def examples_sha256(examples: Sequence[Mapping[str, Any]]) -> str:
  """One fingerprint of every process's examples (index, input and target tokens), in index
  order: the data, seed, options and tokenizer the records were made from."""
  mine = [[int(ex['index']), run_identity.array_fingerprint([ex['inputs'], ex['targets']])]
          for ex in examples]
  everyone = dict(map(tuple, multihost.gather_json(mine)))  # A group's processes agree.
  return run_identity.array_fingerprint(
      [np.frombuffer(f'{i}:{everyone[i]}'.encode(), np.uint8) for i in sorted(everyone)])


def global_width(rows: Sequence[Sequence[int]], multiple: int = INPUT_WIDTH_MULTIPLE) -> int:
  """The padded width (a multiple of `multiple`) of the longest row over every process."""
  longest = max([len(r) for r in rows] + [1])
  return int(np.asarray(multihost.gather(np.array([batching.round_up(longest, multiple)]))).max())


class SharedLog:
  """The prediction log as every process sees it: process 0 owns the file, all know the indices.

  Resume: process 0 alone opens (and, after a kill, repairs) predictions.jsonl and broadcasts
  which examples it holds, so every process skips the same ones and the global batches agree.
  Reading the file on every host instead would need every host to see the output folder, and
  two processes could both cut a torn last line. Appends happen on process 0 only.
  """

  def __init__(self, log: records.RecordLog | None, done: np.ndarray):
    self.log = log  # On process 0; None elsewhere.
    self.done = set(int(i) for i in np.flatnonzero(done))

  @classmethod
  def open(cls, folder: str, settings: Mapping[str, Any], num_examples: int) -> SharedLog:
    """Checks or writes run.json and opens predictions.jsonl (process 0), then broadcasts."""
    def open_log():
      run_identity.check_run(folder, settings, kind='eval')
      return records.RecordLog(os.path.join(folder, 'predictions.jsonl'))

    log = multihost.on_writer(open_log, f'opening {folder}')
    done = np.zeros(num_examples, np.int32)
    if log is not None:
      done[[i for i in log.records if 0 <= i < num_examples]] = 1
    return cls(log, multihost.broadcast(done))

  def __contains__(self, index: int) -> bool:
    return index in self.done

  def __len__(self) -> int:
    return len(self.done)

  def append(self, records: Sequence[Mapping[str, Any]]) -> None:
    multihost.on_writer(lambda: self.log.append(records), 'appending predictions')
    self.done.update(int(r['index']) for r in records)
