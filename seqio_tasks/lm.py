"""Language-model perplexity for the LM-adapted (prefix LM) T5 checkpoints (no seqio needed).

An example is a window of real text: its first `length - 1` tokens and EOS go to the encoder
(the prefix), the next `continuation` tokens are the decoder targets whose log-likelihood is
scored. Sources:
  wiki  built in: the Wikipedia passages of nq-open-oracle (title, newline, text), concatenated in
        an order drawn per example from a generator seeded (seed, length, i).
  text  a user's JSONL file of documents with a "text" field, concatenated in file order and cut
        into consecutive windows.
The paper does not name its corpus; real long documents (e.g. PG-19 via `text`) suit long-context
perplexity better than concatenated passages.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np

from seqio_tasks import data
from seqio_tasks import qa

Encode = Callable[[str], Sequence[int]]
CONTINUATION = 128


def _window(tokens: np.ndarray, length: int, continuation: int, eos_id: int):
  inputs = np.concatenate([tokens[:length - 1], [eos_id]]).astype(np.int32)
  return inputs, tokens[length - 1:length - 1 + continuation].astype(np.int32)


def _lm_example(example_id: str, inputs, targets, **meta) -> dict:
  out = data.example(example_id, '', '', **meta)
  out['inputs'], out['targets'] = inputs, targets
  return out


def wiki_documents() -> list[str]:
  path = data.find_file('lost_in_the_middle/nq-open-oracle.jsonl', 'lost_in_the_middle')
  return [f'{docs[0][0]}\n{docs[0][1]}' for _, _, _, docs in qa.read_qa_file(path)]


def wiki_examples(length: int, num_examples: int, encode: Encode, *,
                  continuation: int = CONTINUATION, seed: int = 0,
                  eos_id: int = 1) -> Iterator[dict]:
  """Windows of shuffled Wikipedia passages (see the module docstring)."""
  docs = [np.asarray(encode(d), np.int64) for d in wiki_documents()]
  total = sum(len(d) for d in docs)
  need = length - 1 + continuation
  if total < need:
    raise ValueError(f'the passages hold {total} tokens; a window needs {need}.')
  for i in range(num_examples):
    rng = data.rng_for(seed, length, i)
    parts, count = [], 0
    for j in rng.permutation(len(docs)):
      parts.append(docs[j])
      count += len(docs[j])
      if count >= need:
        break
    inputs, targets = _window(np.concatenate(parts), length, continuation, eos_id)
    yield _lm_example(f'lm_wiki_{length}/{i}', inputs, targets)


def text_examples(path: str, length: int, num_examples: int, encode: Encode, *,
                  continuation: int = CONTINUATION, eos_id: int = 1) -> Iterator[dict]:
  """Consecutive windows of a JSONL file's documents (see the module docstring)."""
  path = data.find_file(str(path), 'text')
  need = length - 1 + continuation
  buffer = np.zeros((0,), np.int64)
  produced = 0
  for line, record in data.read_jsonl(path, ('text',)):
    text = data.field(record, 'text', str, path, line)
    buffer = np.concatenate([buffer, np.asarray(encode(text), np.int64)])
    while len(buffer) >= need and produced < num_examples:
      inputs, targets = _window(buffer, length, continuation, eos_id)
      yield _lm_example(f'lm_text_{length}/{produced}', inputs, targets, line=line)
      buffer = buffer[need:]
      produced += 1
    if produced >= num_examples:
      return
  if produced == 0:
    raise data.DataError(f'{path}: its documents hold fewer than {need} tokens, not enough for '
                         f'one window of {length} + {continuation}.')
