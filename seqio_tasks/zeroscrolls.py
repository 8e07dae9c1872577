"""ZeroSCROLLS (Shaham et al., 2023) over the user's files: examples truncated as the official
runner truncates them, and the leaderboard's CSV (no seqio needed).

Tasks (`TASKS`) and splits: 'validation' (about 20 examples per task, with gold outputs: scored)
and 'test' (gold outputs private: predicted, for the leaderboard's CSV, `leaderboard_csv`).

Files, as published at https://huggingface.co/datasets/tau/zero_scrolls (data card licence
"Unknown"; each source data set has its own terms): one zip per task, `{task}.zip` holding
`{task}/{split}.jsonl`, used as is or extracted (`{task}/{split}.jsonl`), in the folder
`zeroscrolls_dir()`: the gin binding `seqio_tasks.zeroscrolls_dir.path`, else
$T5ALIGN_ZEROSCROLLS_DIR, else `<data dir>/zero_scrolls` (`seqio_tasks.data.data_dir`).

A record is {id, pid, input, output, document_start_index, document_end_index, query_start_index,
query_end_index, truncation_seperator[, inner_docs_start_indices]}; `input` is the whole prompt
(instruction, document, query, response header), `output` the gold (None in 'test'). Rows that
share an `id` share their input and hold one reference each: an example is an id, with every
reference of its rows (the first is its 'targets').

Truncation to L tokens, as tau-nlp/zero_scrolls:experiments/hf/run_hf_model.py's
`process_model_input` (each tokenization with EOS appended, as HF's T5Tokenizer appends it): an
input whose tokens + EOS fit in L is kept whole; a longer one becomes
`tokens(input[:query_start_index]) + EOS`, cut to `L - n` tokens, then the n tokens of
`tokens(truncation_seperator + input[query_start_index:]) + EOS`: exactly L tokens ending in EOS,
the instruction and the document's start kept, the query and response header whole after the
separator. Examples hold these tokens ('inputs', so seqio must not trim them) and their
'targets_pretokenized'.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import os
import pathlib
import zipfile
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

import gin
import numpy as np

from seqio_tasks import data
from seqio_tasks import suite
from t5align.evaluation.suites import zeroscrolls as layout

Encode = Callable[[str], Sequence[int]]

# The README's order; the paper's columns, as the report's layout writes them (its one place).
TASKS = ('gov_report', 'summ_screen_fd', 'qmsum', 'squality', 'qasper', 'narrative_qa', 'quality',
         'musique', 'space_digest', 'book_sum_sort')
COLUMNS = dict(zip(TASKS, layout.LAYOUT.columns, strict=True))
# Each task's metric (a `seqio_tasks.suite_metrics` family).
FAMILIES = {'gov_report': 'rouge_geo', 'summ_screen_fd': 'rouge_geo', 'qmsum': 'rouge_geo',
            'squality': 'rouge_geo', 'qasper': 'f1_unidecode', 'narrative_qa': 'f1_unidecode',
            'quality': 'letter_acc', 'musique': 'f1_unidecode', 'space_digest': 'exp_sim',
            'book_sum_sort': 'c_index'}
SPLITS = ('validation', 'test')
# The paper's input lengths (Flan-T5-XXL's curve; the runner's own is 8192).
LENGTHS = (512, 1024, 2048, 4096, 8192)
# The runner's `max_new_tokens`, greedy, for every task.
MAX_DECODE_LENGTH = 1024

ENV_DIR = 'T5ALIGN_ZEROSCROLLS_DIR'
SETTING = ("$T5ALIGN_ZEROSCROLLS_DIR or the gin binding seqio_tasks.zeroscrolls_dir.path = "
           "'/path'")
SOURCE = 'https://huggingface.co/datasets/tau/zero_scrolls'
CSV_COLUMNS = ('Task', 'ID', 'Prediction')
# The verifier reads the CSV with pandas, `keep_default_na=False, na_values=[this]`: a
# prediction equal to it reads back as missing, which the verifier refuses.
VERIFIER_NA = '!@#$%^&*()'
# Fields the truncation reads, and the types of the others when present.
_USED = {'id': str, 'input': str, 'query_start_index': int, 'truncation_seperator': str}
_OTHER = {'pid': str, 'document_start_index': int, 'document_end_index': int,
          'query_end_index': int, 'inner_docs_start_indices': list}


def zip_url(task: str) -> str:
  """Where `{task}.zip` is published."""
  return f'{SOURCE}/resolve/main/{task}.zip'


@gin.configurable(module='seqio_tasks')
def zeroscrolls_dir(path: str | None = None) -> pathlib.Path:
  """The ZeroSCROLLS folder: gin binding, then $T5ALIGN_ZEROSCROLLS_DIR, then
  `<data dir>/zero_scrolls`."""
  return pathlib.Path(path or os.environ.get(ENV_DIR) or data.data_dir() / 'zero_scrolls')


def _check(task: str, split: str) -> None:
  if task not in TASKS:
    raise ValueError(f'no ZeroSCROLLS task {task!r}; the tasks are {", ".join(TASKS)}.')
  if split not in SPLITS:
    raise ValueError(f'ZeroSCROLLS has no split {split!r}; its splits are {SPLITS}.')


def find_file(task: str, split: str) -> tuple[pathlib.Path, str | None]:
  """(file, zip member): `{task}/{split}.jsonl` in `zeroscrolls_dir()`, else `{task}.zip` and
  its member `{task}/{split}.jsonl`.

  Raises:
    FileNotFoundError: when neither is there, saying where to get the zip and which setting
      names the folder.
  """
  _check(task, split)
  folder = zeroscrolls_dir()
  extracted = folder / task / f'{split}.jsonl'
  if extracted.is_file():
    return extracted, None
  archive = folder / f'{task}.zip'
  if archive.is_file():
    return archive, f'{task}/{split}.jsonl'
  raise FileNotFoundError(
      f'ZeroSCROLLS {task} ({split}): neither {archive} nor {extracted} exists. Download '
      f'{zip_url(task)} (the per-task zips of {SOURCE}) into {folder}, or point {SETTING} at '
      'the folder that holds them.')


@contextlib.contextmanager
def _open(task: str, path: pathlib.Path, member: str | None) -> Iterator[io.TextIOBase]:
  if member is None:
    with open(path, encoding='utf-8') as f:
      yield f
    return
  try:
    archive = zipfile.ZipFile(path)
  except (zipfile.BadZipFile, OSError) as e:
    raise data.DataError(f'{path}: not a readable zip ({e}); download it again from '
                         f'{zip_url(task)}.') from e
  with archive:
    names = archive.namelist()
    if member not in names:
      raise data.DataError(f'{path}: holds no {member} (it holds {names[:8]}); expected the '
                           f'published {zip_url(task)}.')
    with archive.open(member) as raw:
      yield io.TextIOWrapper(raw, encoding='utf-8')


def read_records(task: str, split: str) -> Iterator[tuple[str, int, dict[str, Any]]]:
  """(where, line, record) for each record of a task's split, its fields checked.

  `where` names the file (a zip and its member: 'qasper.zip:qasper/test.jsonl').

  Raises:
    FileNotFoundError: see `find_file`.
    data.DataError: on a file that cannot be read, a line that is not a JSON object, a missing
      or mistyped field, a query_start_index outside the input, a 'validation' record without
      its output, or a file with no records; naming the file and line.
  """
  path, member = find_file(task, split)
  where = str(path) if member is None else f'{path}:{member}'
  count = 0
  try:
    with _open(task, path, member) as lines:
      for number, line in enumerate(lines, start=1):
        if line.strip():
          yield where, number, _record(line, where, number, split)
          count += 1
  except (EOFError, OSError, UnicodeDecodeError, zipfile.BadZipFile) as e:
    raise data.DataError(f'{where}: cannot be read ({type(e).__name__}: {e}); download it again '
                         f'from {zip_url(task)}.') from e
  if count == 0:
    raise data.DataError(f'{where}: no records (empty file).')


def _record(line: str, where: str, number: int, split: str) -> dict[str, Any]:
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    raise data.DataError(f'{where}:{number}: not valid JSON ({e.msg} at column {e.colno}).') from e
  if not isinstance(record, dict):
    raise data.DataError(f'{where}:{number}: expected a JSON object, got '
                         f'{type(record).__name__}.')
  used = (*_USED, 'output') if split == 'validation' else tuple(_USED)
  missing = [k for k in used if k not in record]
  if missing:
    raise data.DataError(f'{where}:{number}: missing field(s) {missing} of the ZeroSCROLLS record '
                         f'format; the record has {sorted(record)}.')
  for key, kind in {**_USED, **{k: v for k, v in _OTHER.items() if k in record}}.items():
    data.field(record, key, kind, where, number)
  if split == 'validation' or record.get('output') is not None:
    data.field(record, 'output', str, where, number)
  if not 0 <= record['query_start_index'] <= len(record['input']):
    raise data.DataError(f'{where}:{number}: query_start_index {record["query_start_index"]} '
                         f'is outside the input (length {len(record["input"])}).')
  return record


@dataclasses.dataclass(frozen=True)
class Entry:
  """One example: a record id, its input and every reference of its rows."""

  id: str
  input: str
  query_start_index: int
  separator: str  # the record's 'truncation_seperator'
  outputs: tuple[str, ...]  # () in 'test'
  line: int  # of its first row


def read_entries(task: str, split: str) -> list[Entry]:
  """The task's examples in file order, rows sharing an id merged (their outputs in order).

  Raises:
    data.DataError: see `read_records`; also for rows sharing an id with different inputs.
  """
  def as_row(where: str, line: int, record: dict[str, Any]) -> suite.Row[None]:
    same = (record['input'], record['query_start_index'], record['truncation_seperator'])
    return suite.Row(record['id'], same, record.get('output'), line, lambda: None,
                     lambda first: f'{where}:{line}: id {record["id"]!r} repeats line {first} '
                     'with another input, query_start_index or truncation_seperator.')

  groups = suite.group_by_id(as_row(*r) for r in read_records(task, split))
  return [Entry(g.id, *g.same, tuple(g.outputs), g.position) for g in groups]


def record_ids(task: str, split: str = 'test') -> list[str]:
  """The ids of a task's split (each once, in file order): what the leaderboard expects."""
  return [e.id for e in read_entries(task, split)]


def model_input(text: str, query_start_index: int, separator: str, max_tokens: int,
                encode: Encode, eos_id: int) -> tuple[np.ndarray, int]:
  """The runner's truncation of one input to `max_tokens` (see the module docstring).

  Args:
    text: the record's 'input'.
    query_start_index: where its query starts (a character index into `text`).
    separator: the record's 'truncation_seperator'.
    max_tokens: L.
    encode: text -> token ids, without EOS.
    eos_id: the EOS id appended to each tokenization.

  Returns:
    (tokens int32 `[n]`, the untruncated input's length with its EOS); n = L when truncated.
  """
  full = [*encode(text), eos_id]
  if len(full) <= max_tokens:
    return np.asarray(full, np.int32), len(full)
  tail = [*encode(separator + text[query_start_index:]), eos_id]
  head = [*encode(text[:query_start_index]), eos_id]
  # NOTE: a Python slice, as upstream's torch slice: a tail longer than max_tokens makes the stop
  # negative, which drops that many tokens from the head's end instead (kept for parity).
  return np.asarray(head[:max_tokens - len(tail)] + tail, np.int32), len(full)


def examples(task: str, split: str, max_tokens: int, encode: Encode,
             eos_id: int) -> Iterator[dict[str, Any]]:
  """A task's examples at `max_tokens` input tokens (the seqio tasks' `build`).

  Each is {'id': the record id, 'inputs': int32 `[n <= max_tokens]` (`model_input`), 'targets':
  the first reference's tokens + EOS (test: EOS alone), 'targets_pretokenized': that reference
  ('' in test), 'meta': JSON of {'outputs': every reference, 'task', 'line', 'input_tokens': the
  untruncated length}}.
  """
  for entry in read_entries(task, split):
    tokens, full = model_input(entry.input, entry.query_start_index, entry.separator,
                               max_tokens, encode, eos_id)
    target = entry.outputs[0] if entry.outputs else ''
    example = data.example(entry.id, '', target, outputs=list(entry.outputs), task=task,
                           line=entry.line, input_tokens=full)
    example['inputs'] = tokens
    example['targets'] = np.asarray([*encode(target), eos_id] if entry.outputs else [eos_id],
                                    np.int32)
    example['targets_pretokenized'] = target
    yield example


# ZeroSCROLLS as a `suite.Suite`: `t5align_zeroscrolls_{task}_{L}`, splits 'validation' and
# 'test', read from `zeroscrolls_dir()`.
SUITE = suite.FileSuite('zeroscrolls', TASKS, COLUMNS, FAMILIES, SPLITS, LENGTHS,
                        dict.fromkeys(TASKS, MAX_DECODE_LENGTH), examples)


# ---------------------------------------------------------------------------------------------
# The leaderboard's CSV (tau-nlp/zero_scrolls:submission/, verify_submission.py's rules).


def submission_problems(predictions: Mapping[str, Mapping[str, Any]],
                        expected_ids: Mapping[str, Collection[str]] | None = None
                        ) -> tuple[list[str], list[str]]:
  """What the leaderboard's verifier would refuse, as (missing, invalid) messages.

  Missing: a task of `TASKS` without predictions; ids of `expected_ids` (the test split's, per
  task) without one. Invalid: a task that is not ZeroSCROLLS'; an id or prediction that is not a
  string, or a prediction the verifier's CSV reader reads as missing (`VERIFIER_NA`); an id
  that is not in `expected_ids`.
  """
  missing, invalid = [], []
  absent = [t for t in TASKS if t not in predictions]
  if absent:
    missing.append(f'no predictions for the task(s) {", ".join(absent)} (the leaderboard '
                   'takes all 10 tasks at once)')
  unknown = [t for t in predictions if t not in TASKS]
  if unknown:
    invalid.append(f'unknown task(s) {", ".join(map(str, unknown))}; the tasks are '
                   f'{", ".join(TASKS)}')
  for task in [t for t in TASKS if t in predictions]:
    given = predictions[task]
    bad = [i for i, p in given.items() if not isinstance(i, str) or not isinstance(p, str)
           or p == VERIFIER_NA]
    if bad:
      invalid.append(f'{task}: ids {bad[:5]} have a prediction that is not a string (or is '
                     f'{VERIFIER_NA!r}, which the verifier reads as missing)')
    if expected_ids is None or task not in expected_ids:
      continue
    want = set(expected_ids[task])
    lacking = [i for i in expected_ids[task] if i not in given]
    extra = [i for i in given if i not in want]
    if lacking:
      missing.append(f'{task}: {len(lacking)} of the {len(want)} test ids have no prediction '
                     f'(e.g. {lacking[:3]})')
    if extra:
      invalid.append(f'{task}: {len(extra)} ids are not test ids of the task (e.g. {extra[:3]})')
  return missing, invalid


def leaderboard_csv(predictions: Mapping[str, Mapping[str, str]]) -> str:
  """The CSV text: header Task,ID,Prediction, then one row per (task, id), tasks in `TASKS`
  order, ids in the order given (a mapping: each id once). Rows end in CRLF, the csv module's
  default, so that a field holding either character is quoted (with '\n' alone, a lone '\r'
  would be written bare, and pandas, which the verifier reads with, would break the row there)."""
  out = io.StringIO()
  writer = csv.writer(out)
  writer.writerow(CSV_COLUMNS)
  for task in [t for t in TASKS if t in predictions]:
    for example_id, prediction in predictions[task].items():
      writer.writerow((task, example_id, prediction))
  return out.getvalue()
