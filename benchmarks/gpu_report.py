"""gpu_check's results: the rows and the run's description saved atomically after each update
(results.json, table.md), the failures, the Markdown table, and the H200 figures its table shows.

The H200 column holds each row's figure measured on one H200 on 2026-11-27: the figures of
benchmarks/results/gpu_h200.json marked `orientation` (a data file naming each figure's source,
date, commit and machine; `reference_seconds`).
"""
from __future__ import annotations

import decimal
import json
import pathlib
import sys
import time

from benchmarks import harness

H200_RESULTS = harness.REPO / 'benchmarks' / 'results' / 'gpu_h200.json'


def reference_seconds(path: pathlib.Path = H200_RESULTS) -> dict[str, float]:
  """{row id: seconds} of the figures in `path` marked `orientation` (times in `ms` or
  `seconds`, read as decimals so that each is the float its digits name)."""
  with open(path, encoding='utf-8') as f:
    document = json.load(f, parse_float=decimal.Decimal)
  return {row['id']: float(row['ms'] / 1000 if 'ms' in row else row['seconds'])
          for rows in document.values() if isinstance(rows, list)
          for row in rows if row.get('orientation')}


KNOWN_H200 = reference_seconds()


class Results:
  """The rows and the run's description; `save` rewrites results.json and table.md atomically."""

  def __init__(self, out_dir: pathlib.Path, meta: dict, rows: list[dict], log, start: float):
    self.out_dir, self.meta, self.log, self.start = out_dir, meta, log, start
    self.rows = {row['id']: row for row in rows}

  def update(self, fields: dict) -> None:
    """Merges one worker update (`id` plus fields) into its row, then saves."""
    row = self.rows.get(fields.get('id'))
    if row is None:
      self.note(f'update for an unplanned row ignored: {json.dumps(fields)[:300]}')
      return
    row.update(fields)
    if 'status' in fields:
      self.note(f'{row["id"]}: {status_text(row)}')
    elif 'parity' in fields:
      self.note(f'{row["id"]}: parity {_parity_text(row)}')
    self.save()

  def note(self, text: str) -> None:
    """A progress line on stderr and in log.txt."""
    line = f'[{time.monotonic() - self.start:6.1f} s] {text}'
    print(line, file=sys.stderr, flush=True)
    self.log.write(f'gpu_check {line}\n')
    self.log.flush()

  def document(self) -> dict:
    """results.json's content: the run's description, its failures and the rows with ratios."""
    rows = list(self.rows.values())
    harness.add_ratios(rows, harness.named_base(rows))
    return {**self.meta, 'elapsed_s': round(time.monotonic() - self.start, 1),
            'failures': failures(rows), 'rows': rows}

  def save(self) -> None:
    document = self.document()
    harness.write_json(self.out_dir / 'results.json', document)
    harness.write_text(self.out_dir / 'table.md', table(document['rows']) + '\n')


def failures(rows: list[dict]) -> list[str]:
  """Why the run failed, one line per row: an error, a stop, a failed parity check, failed
  tests, or a row left pending."""
  out = []
  for row in rows:
    if row['status'] in ('error', 'timeout', 'pending'):
      out.append(f'{row["id"]}: {row["status"]}: {row.get("reason", "")}')
    elif row['kind'] == 'tests' and row['status'] == 'ok' and (
        row.get('failed') or row.get('errors') or not row.get('passed')):
      out.append(f'tests: {row.get("failed")} failed, {row.get("errors")} errors, '
                 f'{row.get("passed")} passed')
    parity = row.get('parity') or {}
    if row['status'] == 'ok' and ('error' in parity or parity.get('ok') is False):
      out.append(f'{row["id"]}: parity {_parity_text(row)}')
  return out


def _seconds_text(seconds: float | None) -> str:
  if seconds is None:
    return '-'
  return f'{seconds * 1e3:.3g} ms' if seconds < 1 else f'{seconds:.3g} s'


def _bytes_text(count: int | None) -> str:
  if count is None or count < 0:
    return '?'
  return f'{count / 2**30:.2f} GiB' if count >= 2**30 else f'{count / 2**20:.1f} MiB'


def status_text(row: dict) -> str:
  """A row's status as the progress lines and the table say it."""
  if row['status'] != 'ok':
    return f'{row["status"]}: {row.get("reason", "")}'
  if row['kind'] == 'tests':
    return (f'{row.get("passed")} passed, {row.get("failed")} failed, {row.get("errors")} '
            f'errors, {row.get("skipped")} skipped in {row.get("seconds")} s'
            + (f' ({row["reason"]})' if row.get('reason') else ''))
  return f'ok, {_seconds_text(row.get("seconds"))}'


def _memory_text(row: dict) -> str:
  parts = []
  xla = row.get('xla_memory')
  if xla:
    parts.append(f'XLA temp {_bytes_text(xla["temp_bytes"])} + args '
                 f'{_bytes_text(xla["argument_bytes"])}')
  if row.get('peak_bytes') is not None:
    bound = '' if row.get('peak_set_by_this_row', True) else '<= '
    parts.append(f'peak {bound}{_bytes_text(row["peak_bytes"])}')
  return '; '.join(parts) or '-'


def _parity_text(row: dict) -> str:
  parity = row.get('parity')
  if row['kind'] == 'tests':
    names = row.get('failures') or []
    return ('failed: ' + ', '.join(names[:3]) + (' ...' if len(names) > 3 else '')
            if names else '-')
  if not parity:
    return '-'
  if 'error' in parity:
    return f'error: {parity["error"]}'
  parts = []
  for key, short in (('out_rel_err', 'rel'), ('pmax_max_abs_err', 'pmax'),
                     ('entropy_max_abs_err', 'ent')):
    if parity.get(key) is not None:
      parts.append(f'{short} {parity[key]:.1e}')
  if 'argmax_tokens' in parity:
    parts.append(f'{parity["argmax_tokens"]}/{parity["tokens"]} tokens the argmax, gap '
                 f'{parity["largest_relative_gap"]:.1e}')
  if 'generated_tokens' in parity:
    parts.append(f'{parity["generated_tokens"]} tokens generated')
  if parity.get('vs'):
    parts.append(f'vs {parity["vs"]}' + (f' @{parity["checked_at"]}'
                                         if 'checked_at' in parity else ''))
  elif not parts:
    parts.append(parity.get('role', 'finite only'))
  if parity.get('all_finite') is False:
    parts.append('NOT FINITE')
  if parity.get('ok') is False:
    parts.append('FAILED')
  return ', '.join(parts)


def table(rows: list[dict]) -> str:
  """The Markdown table: one line per row."""
  lines = ['| row | status | time | TFLOP/s | memory | parity | ratio | H200 |',
           '|---|---|---|---|---|---|---|---|']
  for row in rows:
    if row['status'] == 'ok':
      status = 'ok' if row['kind'] != 'tests' else status_text(row)
    else:
      status = f'{row["status"]}: {row.get("reason", "")}'.replace('|', '/')[:160]
    ratio = (f'{row["ratio"]:.3g} ({row["compare_to"]["label"]})' if 'ratio' in row else '-')
    tflops = row.get('tflops_per_s')
    known = KNOWN_H200.get(row['id'])
    lines.append(f'| {row["id"]} | {status} | {_seconds_text(row.get("seconds"))} | '
                 f'{"-" if tflops is None else f"{tflops:.4g}"} | {_memory_text(row)} | '
                 f'{_parity_text(row).replace("|", "/")} | {ratio} | '
                 f'{"-" if known is None else _seconds_text(known)} |')
  return '\n'.join(lines)
