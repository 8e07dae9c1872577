"""Calibration samples: token streams and whole examples from a text file, a JSONL file or
registered SeqIO tasks, tokenized, with what identifies them (`read_inputs`, for
`t5align.calibrate`); random windows of a stream; each task's inputs and its L_tr reference.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from t5align.calibration import stats
from t5align import run_identity
from t5align.runtime import batching
from t5align.runtime import fileio
from t5align.runtime import outputs
from t5align import vocabularies


def sample_windows(stream: Any, num_samples: int, length: int, seed: int = 0, *,
                   eos_id: int, source: str = 'the input text') -> np.ndarray:
  """`num_samples` random windows of `length - 1` tokens from a token stream, each + EOS
  (`eos_id`, the vocabulary's); `source` names the stream in errors ('JSONL_FILE data.jsonl').

  Returns:
    int32 `[num_samples, length]` with no padding.
  """
  stream = np.asarray(stream, np.int32)
  if num_samples < 1 or length < 2:
    raise ValueError(f'need num_samples >= 1 and length >= 2; got {num_samples}, {length}.')
  check_stream_length(stream, length, source)
  starts = np.random.default_rng(seed).integers(0, len(stream) - (length - 1) + 1, num_samples)
  windows = np.stack([stream[s:s + length - 1] for s in starts])
  return np.concatenate([windows, np.full((num_samples, 1), eos_id, np.int32)], axis=1)


def check_stream_length(stream: Any, length: int, source: str = 'the input text') -> None:
  """Raises, naming `source`, unless the token stream holds a sample of `length` (`length - 1`
  tokens, then EOS)."""
  if len(stream) < length - 1:
    raise ValueError(f'{source} has {len(stream)} tokens; a sample of length {length} needs '
                     f'{length - 1}. Use a longer text or shorter lengths.')


def _vocabulary(vocabulary_path: str | None, what: str) -> vocabularies.Vocabulary:
  if not vocabulary_path:
    raise ValueError(f'VOCABULARY_PATH (a SentencePiece model, a tokenizer.json, or a folder with '
                     f'vocab.json + merges.txt) is required with {what}.')
  return vocabularies.load_vocabulary(vocabulary_path, what='VOCABULARY_PATH')


def text_file_stream(path: str, vocabulary: vocabularies.Vocabulary) -> np.ndarray:
  """Tokens of a text file (one paragraph per non-empty line), concatenated, no EOS."""
  raw = fileio.read_input(path, 'TEXT_FILE')
  lines = [line.strip() for line in outputs.decode_lines(raw, path) if line.strip()]
  if not lines:
    raise ValueError(f'text file {path} is empty.')
  return np.concatenate([np.asarray(vocabulary.encode(line), np.int32) for line in lines])


def _task_vocabulary(task_or_mixture: Any) -> Any:
  """The 'inputs' vocabulary of a seqio task (of a mixture: its first task's)."""
  import seqio  # pylint: disable=g-import-not-at-top
  return seqio.get_subtasks(task_or_mixture)[0].output_features['inputs'].vocabulary


def check_split(names: Sequence[str], split: str, flag: str = 'SEQIO_SPLIT') -> None:
  """Every task of the tasks / mixtures `names` has `split`, or a ValueError names `flag`, the
  task and the splits it has (the paper's t5align tasks have 'test' alone)."""
  import seqio  # pylint: disable=g-import-not-at-top
  for name in names:
    for task in seqio.get_subtasks(seqio.get_mixture_or_task(name)):
      if split not in task.splits:
        raise ValueError(f'{flag} = {split!r}: the task {task.name} has the split(s) '
                         f'{", ".join(map(repr, task.splits))}; pass --gin.{flag}=... with one '
                         'of them.')


def seqio_task_stream(task: str, split: str = 'validation', feature: str = 'inputs',
                      max_tokens: int = 10_000_000) -> np.ndarray:
  """Token ids of a registered SeqIO task's `feature`, concatenated without EOS / padding
  (imports seqio lazily). A mixture is its tasks' examples, each task's once, in the mixture's
  task order: seqio's mixture dataset samples by rate and repeats without end, so it would give
  `max_tokens` tokens drawn again and again from the same few examples."""
  import seqio  # pylint: disable=g-import-not-at-top
  task_obj = seqio.get_mixture_or_task(task)
  eos_id = _task_vocabulary(task_obj).eos_id
  pieces, total = [], 0
  for subtask in seqio.get_subtasks(task_obj):
    dataset = subtask.get_dataset(sequence_length=None, split=split, shuffle=False)
    for example in dataset.as_numpy_iterator():
      ids = np.asarray(example[feature], np.int32)
      ids = ids[(ids > 0) & (ids != eos_id)]
      pieces.append(ids)
      total += len(ids)
      if total >= max_tokens:
        return np.concatenate(pieces)
  if not pieces:
    raise ValueError(f'SeqIO task {task} split {split} gave no examples.')
  return np.concatenate(pieces)


BOUNDARY_ENDINGS = ('.', '!', '?', '\n', ';', '}')


def boundary_ids(decode: Any, vocab_size: int, endings: Sequence[str] = BOUNDARY_ENDINGS
                 ) -> list[int]:
  """Ids whose text (`decode([id])`) ends a sentence, line or block: where a task input may be
  cut to build its L_tr reference (`stats.cut_at_boundary`)."""
  out = []
  for i in range(vocab_size):
    try:
      text = decode([i])
    except Exception:  # pylint: disable=broad-except  (control / unused ids)
      continue
    if text and text.rstrip(' ').endswith(tuple(endings)):
      out.append(i)
  return out


def task_examples(task: str, split: str, num_examples: int) -> tuple[list[np.ndarray], Any]:
  """The first `num_examples` whole inputs (token ids, EOS included) of a seqio task, and the
  task's input vocabulary."""
  import seqio  # pylint: disable=g-import-not-at-top
  task_obj = seqio.get_mixture_or_task(task)
  dataset = task_obj.get_dataset(sequence_length=None, split=split, shuffle=False)
  rows = []
  for example in dataset.as_numpy_iterator():
    rows.append(np.asarray(example['inputs'], np.int32))
    if len(rows) >= num_examples:
      break
  if not rows:
    raise ValueError(f'SeqIO task {task} split {split} gave no examples.')
  return rows, task_obj.output_features['inputs'].vocabulary


def jsonl_examples(path: str, encode: Any, eos_id: int, num_examples: int
                   ) -> dict[str, list[np.ndarray]]:
  """Whole inputs of a JSONL file ({"inputs": text, "task": optional name} per line), grouped by
  task (default: the file's name), the first `num_examples` of each, tokenized + EOS."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  default = os.path.splitext(os.path.basename(path))[0]
  out: dict[str, list[np.ndarray]] = {}
  # A non-UTF-8 line raises naming it.
  lines = outputs.decode_lines(fileio.read_input(path, 'JSONL_FILE'), path)
  for n, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
      text = record['inputs']
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f'{path}:{n}: expected a JSON object with an "inputs" string ({e}).'
                       ) from e
    if not isinstance(text, str) or not text:
      raise ValueError(f'{path}:{n}: "inputs" must be a non-empty string.')
    rows = out.setdefault(str(record.get('task', default)), [])
    if len(rows) < num_examples:
      rows.append(np.asarray(list(encode(text)) + [eos_id], np.int32))
  if not out:
    raise ValueError(f'JSONL file {path} has no examples.')
  return out


def task_inputs(examples: Sequence[np.ndarray], reference_length: int, eos_id: int,
                boundaries: Sequence[int], reference: Sequence[np.ndarray] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
  """(`[b, L_ex]` whole examples 0-padded, `[b', <= L_tr]` reference) for `calibrate_tasks`.

  The reference is the same task at L_tr: `reference` (examples of the task's setting nearest
  L_tr) when given, else each example cut at its last boundary before L_tr
  (`stats.cut_at_boundary`). Algorithm 1 needs "a short sequence of length L_tr and a long
  sequence of length L_ex" (paper Sec. 4), and the paper reports one temperature per task and
  setting (Tables 8-11), so both come from the task itself.
  """
  tokens = batching.pad_tokens(list(examples), multiple=1)
  if reference is not None:
    ref = batching.pad_tokens(list(reference), multiple=1)
    if ref.shape[1] > reference_length:
      ref = stats.cut_at_boundary(ref, reference_length, boundaries, eos_id)
  else:
    ref = stats.cut_at_boundary(tokens, reference_length, boundaries, eos_id)
  return tokens, ref


def seqio_task_inputs(names: str, split: str, num_examples: int, reference_length: int,
                       reference_tasks: Mapping[str, str]) -> dict[str, tuple[Any, Any]]:
  """{task: (tokens, reference)} for every task of the comma-separated tasks / mixtures."""
  import seqio  # pylint: disable=g-import-not-at-top
  out, boundaries = {}, {}
  for name in [n.strip() for n in names.split(',') if n.strip()]:
    for task in seqio.get_subtasks(seqio.get_mixture_or_task(name)):
      rows, vocab = task_examples(task.name, split, num_examples)
      key = id(vocab)
      if key not in boundaries:
        boundaries[key] = boundary_ids(vocab.decode, vocab.vocab_size)
      reference = None
      if task.name in reference_tasks:
        reference, _ = task_examples(reference_tasks[task.name], split, num_examples)
      out[task.name] = task_inputs(rows, reference_length, vocab.eos_id, boundaries[key],
                                   reference)
  return out


@dataclasses.dataclass(frozen=True)
class Inputs:
  """The text calibration samples from, tokenized, with what identifies it."""

  stream: np.ndarray  # int32 [tokens]: everything, concatenated without EOS
  eos_id: int
  vocab: Any  # the tokenizer (`vocabularies.Vocabulary`, or a seqio task's vocabulary)
  vocab_size: int
  vocabulary_name: str
  source_name: str
  source: dict[str, Any]  # For the schedule's provenance.
  identity: dict[str, Any]  # Content fingerprints, for the run identity.
  by_task: dict[str, list[np.ndarray]]  # JSONL_FILE: each task's whole inputs.


def read_inputs(*, text_file: str | None, vocabulary_path: str | None, seqio_task: str | None,
                 seqio_split: str, jsonl_file: str | None, num_samples: int) -> Inputs:
  """Reads and tokenizes TEXT_FILE, SEQIO_TASK or JSONL_FILE (see `run`)."""
  by_task = {}
  if seqio_task is not None:
    import seqio  # pylint: disable=g-import-not-at-top
    from seqio_tasks import catalog  # pylint: disable=g-import-not-at-top  (t5align_* tasks)
    names = [name.strip() for name in seqio_task.split(',') if name.strip()]
    check_split(names, seqio_split)
    vocab = _task_vocabulary(seqio.get_mixture_or_task(names[0]))
    stream = np.concatenate([seqio_task_stream(name, seqio_split) for name in names])
    source = {'seqio_task': seqio_task, 'seqio_split': seqio_split}
    identity = {'vocabulary': run_identity.vocabulary_fingerprint(vocab),
                'task_options': catalog.options(),
                'samples_sha256': run_identity.array_fingerprint([stream]), **source}
    name = f'SEQIO_TASK {seqio_task}'
    vocabulary_name = f'the vocabulary of {seqio_task}'
  else:
    flag = 'TEXT_FILE' if text_file is not None else 'JSONL_FILE'
    path = text_file if text_file is not None else jsonl_file
    vocab = _vocabulary(vocabulary_path, flag)
    if text_file is not None:
      stream = text_file_stream(text_file, vocab)
    else:
      by_task = jsonl_examples(jsonl_file, vocab.encode, vocab.eos_id, num_samples)
      stream = np.concatenate([row[:-1] for rows in by_task.values() for row in rows])
    source = {flag.lower(): path, 'vocabulary_path': vocabulary_path}
    identity = {'vocabulary': run_identity.vocabulary_fingerprint(vocab),
                flag.lower(): run_identity.file_fingerprint(path)}
    name, vocabulary_name = f'{flag} {path}', f'VOCABULARY_PATH {vocabulary_path}'
  source['eos_id'] = int(vocab.eos_id)
  return Inputs(stream=stream, eos_id=int(vocab.eos_id), vocab=vocab,
                 vocab_size=int(vocab.vocab_size), vocabulary_name=vocabulary_name,
                 source_name=name, source=source, by_task=by_task,
                 identity={**identity, 'eos_id': source['eos_id']})
