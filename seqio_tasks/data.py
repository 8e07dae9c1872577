"""Data files (where they live, how they are read, errors naming the file and line) and examples.

Nothing here imports seqio. Files are found under a data directory, resolved in this order:
`data_dir(path=...)` bound in gin (`seqio_tasks.data.data_dir.path = '/data'`), the environment
variable `T5ALIGN_DATA_DIR`, then `./data`. Its layout mirrors the upstream repositories:

  longeval/lines/{N}_lines.jsonl[.gz]            LongChat LongEval line retrieval
  longeval/topics/{N}_topics.jsonl[.gz]          LongChat LongEval topic retrieval
  lost_in_the_middle/nq-open-oracle.jsonl[.gz]   Lost in the Middle: NQ-open with gold documents
  lost_in_the_middle/kv-retrieval-{N}_keys.jsonl[.gz]
  lost_in_the_middle/qa_data/{N}_total_documents/nq-open-{N}_total_documents_gold_at_{K}.jsonl[.gz]

A file given by absolute path (e.g. `lcc_path`) is used as is. Every task module builds its
examples with `example` and draws random content from `rng_for` generators.
"""
from __future__ import annotations

import gzip
import json
import os
import pathlib
from typing import Any, Iterator, Sequence

import gin
import numpy as np

ENV_DATA_DIR = 'T5ALIGN_DATA_DIR'

# Where each family of files comes from, for the error raised when one is missing.
SOURCES = {
    'longeval': 'LongChat LongEval test cases: github.com/DachengLi1/LongChat, folder '
                'longeval/evaluation/{lines,topics}/testcases/ (Apache-2.0)',
    'lost_in_the_middle': 'Lost in the Middle data: github.com/nelson-liu/lost-in-the-middle, '
                          'folders qa_data/ and kv_retrieval_data/ (MIT)',
    'lcc': 'LCC (LongCoder) Python test split, one JSON object per line with "context" and "gt" '
           '(the microsoft/LCC_python data set on the HuggingFace hub)',
    'text': 'a JSONL file of documents with a "text" field (e.g. PG-19 or any long-form corpus)',
}


# A task example: {'id', 'inputs', 'targets', 'meta'} ('meta': a JSON string of what the metrics
# need beyond 'targets').
Example = dict[str, str]


def rng_for(*keys: int) -> np.random.Generator:
  """A generator seeded by integers only (no hash()), so examples are the same in every run."""
  return np.random.default_rng([int(k) for k in keys])


def example(example_id: str, inputs: str, targets: str, **meta) -> Example:
  """A task example; `meta` is stored as a JSON string."""
  return {'id': example_id, 'inputs': inputs, 'targets': targets,
          'meta': json.dumps(meta, ensure_ascii=False, sort_keys=True)}


class DataError(ValueError):
  """A data file is malformed; the message names the file and (1-based) line."""


@gin.configurable(module='seqio_tasks.data')
def data_dir(path: str | None = None) -> pathlib.Path:
  """The data directory: gin binding, then $T5ALIGN_DATA_DIR, then ./data."""
  return pathlib.Path(path or os.environ.get(ENV_DATA_DIR) or 'data')


def find_file(relative: str, source: str) -> pathlib.Path:
  """`relative` under the data directory, as .jsonl or .jsonl.gz; raises if neither exists.

  Args:
    relative: a path ending in '.jsonl', relative to `data_dir()`, or an absolute path.
    source: a key of `SOURCES`, used in the error message.
  """
  base = pathlib.Path(relative)
  if not base.is_absolute():
    base = data_dir() / base
  stem = str(base)[:-len('.gz')] if str(base).endswith('.gz') else str(base)
  for candidate in (pathlib.Path(stem), pathlib.Path(stem + '.gz')):
    if candidate.is_file():
      return candidate
  raise FileNotFoundError(
      f'data file {stem}[.gz] not found. Get it from {SOURCES[source]}, and point the data '
      f'directory at it with ${ENV_DATA_DIR} or the gin binding '
      f"seqio_tasks.data.data_dir.path = '...' (currently {data_dir()}).")


def _open_text(path: pathlib.Path):
  if str(path).endswith('.gz'):
    return gzip.open(path, 'rt', encoding='utf-8')
  return open(path, encoding='utf-8')


def read_jsonl(path: str | os.PathLike[str],
               fields: Sequence[str] = ()) -> Iterator[tuple[int, dict[str, Any]]]:
  """Yields `(line_number, record)` for each non-blank line of a JSONL(.gz) file.

  Raises:
    DataError: on a line that is not a JSON object, a record missing one of `fields`, or a file
      with no records, naming the file and line.
  """
  path = pathlib.Path(path)
  count = 0
  try:
    with _open_text(path) as f:
      for number, line in enumerate(f, start=1):
        if not line.strip():
          continue
        try:
          record = json.loads(line)
        except json.JSONDecodeError as e:
          raise DataError(f'{path}:{number}: not valid JSON ({e.msg} at column {e.colno}).') from e
        if not isinstance(record, dict):
          raise DataError(f'{path}:{number}: expected a JSON object, got '
                          f'{type(record).__name__}.')
        missing = [k for k in fields if k not in record]
        if missing:
          raise DataError(f'{path}:{number}: missing field(s) {missing}; '
                          f'the record has {sorted(record)}.')
        count += 1
        yield number, record
  except (EOFError, OSError, UnicodeDecodeError) as e:
    if isinstance(e, FileNotFoundError):
      raise
    raise DataError(f'{path}: cannot be read ({type(e).__name__}: {e}).') from e
  if count == 0:
    raise DataError(f'{path}: no records (empty file).')


def field(record: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Any,
          line: int) -> Any:
  """`record[key]`, checked to be of `kind`; raises DataError naming file and line."""
  value = record.get(key)
  if not isinstance(value, kind) or isinstance(value, bool) and bool not in (
      kind if isinstance(kind, tuple) else (kind,)):
    names = kind.__name__ if isinstance(kind, type) else '/'.join(k.__name__ for k in kind)
    raise DataError(f'{path}:{line}: field {key!r} should be {names}, got '
                    f'{type(value).__name__} ({str(value)[:60]!r}).')
  return value
