"""The loop over an evaluation's examples: the ones not yet recorded, batch by batch, with progress.

No JAX here (`scoring` computes). Files of a task folder: predictions.jsonl (one record per
example, keyed by 'index', a `runtime.records.RecordLog`), run.json (`run_identity.check_run`)
and metrics.json (written atomically once every example has a record, by `jobs.EvalJob`).
"""
from __future__ import annotations

import sys
from typing import IO, Any, Callable, Mapping, Sequence

import tqdm

from t5align.runtime import batching


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
