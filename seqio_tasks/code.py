"""Code tasks: next-line completion and code key retrieval (no seqio needed).

Sources of code:
  lcc     a user's LCC-format JSONL file (LongCoder's Python test split): one object per line with
          "context" (the code before the line) and "gt" (the next line); LongBench's variant with
          "answers" (a list) instead of "gt" is read too.
  stdlib  real Python source files of the installed standard library (no tests, no
          site-packages), sorted by path. Deterministic for a given Python version.

Token budgets use the task vocabulary through `count_tokens(text) -> int`, so contexts have the
intended length in the model's tokens. Generated examples are seeded per example index.
"""
from __future__ import annotations

import functools
import os
import pathlib
import sysconfig
from typing import Callable, Iterator, Sequence

import numpy as np

from seqio_tasks import data

CountTokens = Callable[[str], int]
# Test and tooling folders left out of the standard-library corpus.
_EXCLUDED_PARTS = frozenset({'test', 'tests', 'idle_test', 'site-packages', 'dist-packages',
                             '__pycache__', 'lib2to3', 'turtledemo'})
# Key retrieval (after Code Llama's key retrieval task): the function hiding the key, and the
# completion asked for at the end.
KEY_FUNCTION = ('def my_function() -> int:\n'
                '    """Note that this function is used at the end\n'
                '    """\n'
                '    return {key}\n')
KEY_QUESTION = '\n\nassert my_function() == '
KEY_MAX = 100


@functools.cache
def stdlib_files(root: str | None = None) -> tuple[pathlib.Path, ...]:
  """Sorted .py files of the standard library under `root` (default: this interpreter's)."""
  root_path = pathlib.Path(root or sysconfig.get_paths()['stdlib'])
  files = []
  for dirpath, dirnames, filenames in os.walk(root_path):
    dirnames[:] = sorted(d for d in dirnames if d not in _EXCLUDED_PARTS)
    files.extend(pathlib.Path(dirpath) / f for f in sorted(filenames)
                 if f.endswith('.py') and not f.startswith('test_'))
  if not files:
    raise FileNotFoundError(f'no Python source files under {root_path}; pass an LCC file.')
  return tuple(sorted(files, key=lambda p: p.relative_to(root_path).as_posix()))


def read_source(path: pathlib.Path) -> list[str]:
  """Lines of a source file without line endings; undecodable files give no lines."""
  try:
    return path.read_text(encoding='utf-8').splitlines()
  except (UnicodeDecodeError, OSError):
    return []


def read_lcc(path: str | os.PathLike[str]) -> Iterator[tuple[int, str, str]]:
  """(line, context, next line) for each record of an LCC-format file."""
  path = data.find_file(str(path), 'lcc')
  for line, record in data.read_jsonl(path, ('context',)):
    context = data.field(record, 'context', str, path, line)
    if 'gt' in record:
      gt = data.field(record, 'gt', str, path, line)
    elif isinstance(record.get('answers'), list) and record['answers'] and isinstance(
        record['answers'][0], str):
      gt = record['answers'][0]
    else:
      raise data.DataError(f"{path}:{line}: missing field 'gt' (or a non-empty 'answers' "
                           'list) with the next line of code.')
    if not gt.strip():
      raise data.DataError(f"{path}:{line}: field 'gt' is blank; the next line must have code.")
    yield line, context, gt


def trim_left(lines: Sequence[str], budget: int, count_tokens: CountTokens) -> list[str]:
  """The longest suffix of whole lines whose joined text has at most `budget` tokens."""
  lo, hi = 0, len(lines)  # Smallest start index whose suffix fits: binary search.
  while lo < hi:
    mid = (lo + hi) // 2
    if count_tokens('\n'.join(lines[mid:])) <= budget:
      hi = mid
    else:
      lo = mid + 1
  return list(lines[lo:])


# ---------------------------------------------------------------------------------------------
# Next-line completion.


def lcc_completion_examples(path: str, num_examples: int | None = None
                            ) -> Iterator[data.Example]:
  """LCC examples as is: inputs = context, target = the next line."""
  for i, (line, context, gt) in enumerate(read_lcc(path)):
    if num_examples is not None and i >= num_examples:
      return
    yield data.example(f'lcc/{line}', context, gt.strip())


def stdlib_completion_examples(num_examples: int, count_tokens: CountTokens, *,
                               min_tokens: int = 1000, max_tokens: int = 16000, seed: int = 0,
                               files: Sequence[pathlib.Path] | None = None,
                               chars_per_token: float = 2.0) -> Iterator[data.Example]:
  """Next-line examples cut from standard-library files, context lengths spread over buckets.

  Example i aims at a context of `budget` tokens drawn from bucket (i mod #buckets) of
  [min_tokens, max_tokens) split in 1000-token buckets. It picks a file with enough text, a
  non-blank line to predict after at least `budget` tokens of context where the file allows,
  and keeps the preceding whole lines that fit the budget. A file too short for the budget gives
  a shorter context; scoring buckets by the actual length.
  """
  files = list(files or stdlib_files())
  starts = list(range(min_tokens, max_tokens, 1000)) or [min_tokens]
  sizes = np.array([f.stat().st_size for f in files])
  for i in range(num_examples):
    rng = data.rng_for(seed, 1, i)
    lo = starts[i % len(starts)]
    budget = int(rng.integers(lo, min(lo + 1000, max_tokens) if max_tokens > lo else lo + 1))
    need = budget * chars_per_token
    candidates = np.flatnonzero(sizes >= need)
    if not candidates.size:
      candidates = np.argsort(sizes)[-10:]
    for _ in range(20):  # Files of blank lines only are skipped.
      lines = read_source(files[int(rng.choice(candidates))])
      targets = [j for j, text in enumerate(lines) if text.strip() and j > 0]
      if targets:
        break
    else:
      raise RuntimeError('no standard-library file with code found; pass an LCC file instead.')
    # Prefer a target line with about `budget` tokens' worth of characters before it.
    chars_before = np.cumsum([0] + [len(text) + 1 for text in lines])
    late = [j for j in targets if chars_before[j] >= need] or targets[-1:]
    j = int(late[int(rng.integers(len(late)))])
    context = '\n'.join(trim_left(lines[:j], budget, count_tokens)) + '\n'
    yield data.example(f'stdlib/{i}', context, lines[j].strip(), budget=budget)


# ---------------------------------------------------------------------------------------------
# Code key retrieval.


def _code_stream(rng: np.random.Generator, files: Sequence[pathlib.Path],
                 contexts: Sequence[str] | None, min_lines: int) -> list[str]:
  """Lines of randomly chosen files (or LCC contexts), concatenated until `min_lines`."""
  lines: list[str] = []
  while len(lines) < min_lines:
    if contexts:
      text = contexts[int(rng.integers(len(contexts)))].splitlines()
    else:
      text = read_source(files[int(rng.integers(len(files)))])
    if text:
      lines.extend(text + ['', ''])
  return lines


def code_key_examples(num_tokens: int, num_examples: int, count_tokens: CountTokens, *,
                      seed: int = 0, files: Sequence[pathlib.Path] | None = None,
                      lcc_path: str | None = None) -> Iterator[data.Example]:
  """Key retrieval: a function returning an integer in 1..100 hidden in ~`num_tokens` of code.

  Example i: code files drawn with a generator seeded (seed, num_tokens, i) fill the budget; the
  key function goes in at a random top-level line (one not indented), and the input ends with
  `assert my_function() == ` for the model to complete with the key.
  """
  files = list(files or ()) if lcc_path else list(files or stdlib_files())
  contexts = [c for _, c, _ in read_lcc(lcc_path)] if lcc_path else None
  for i in range(num_examples):
    rng = data.rng_for(seed, num_tokens, i)
    key = int(rng.integers(1, KEY_MAX + 1))
    function = KEY_FUNCTION.format(key=key)
    budget = num_tokens - count_tokens(function) - count_tokens(KEY_QUESTION)
    if budget <= 0:
      raise ValueError(f'num_tokens={num_tokens} leaves no room for code around the key.')
    stream = _code_stream(rng, files, contexts, min_lines=max(budget // 10, 8))
    while count_tokens('\n'.join(stream)) < budget:
      stream += _code_stream(rng, files, contexts, min_lines=len(stream))
    # The last lines of the stream that fit the budget, then the key at a top-level line.
    code = trim_left(stream, budget, count_tokens)
    tops = [j for j, text in enumerate(code) if text and not text[0].isspace()] or [0]
    at = int(tops[int(rng.integers(len(tops)))])
    body = '\n'.join(code[:at] + function.splitlines() + [''] + code[at:]).rstrip()
    yield data.example(f'code_key_{num_tokens}/{i}', body + KEY_QUESTION, str(key),
                       depth=at / max(len(code), 1))
