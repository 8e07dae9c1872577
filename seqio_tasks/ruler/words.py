"""RULER's common- and frequent-word extraction generators (NVIDIA/RULER:scripts/data/synthetic/
common_words_extraction.py and freq_words_extraction.py, c3f5e3b), draws in upstream's order.

CWE: a numbered list of `size` distinct wonderwords words (nouns, adjectives and verbs, sorted,
then shuffled with the seed) in which the first `num_cw` appear `freq_cw` times and the rest
`freq_ucw` times, after one solved example of 40 words (10 / 3 repeats). Below 4,096 tokens
upstream uses 6 / 1 repeats and a 20-word example (3 / 1): the settings RULER's script hard-codes
for short lengths. Upstream draws from a second list (json/english_words.json, kept in Git LFS)
once more than the 8,166 wonderwords are needed; that is not ported and raises.

FWE: a vocabulary of `(max_seq_length - 50) // 50` random 6-letter words (its first replaced by
'...', noise), word k repeated `int(n * k**-alpha / zeta(alpha))` times and shuffled; the answer is
words 2-4. n grows from `(max_seq_length - 50) // 6` in steps of 1/32 of that budget until the
text is at least the budget, then steps back once; each sample redraws the vocabulary and steps n
down while its text overflows. Only alpha = 2 is ported (zeta(2) = pi**2 / 6, equal in float64
to scipy.special.zeta(2.0), which upstream calls).
"""
from __future__ import annotations

import math
import random
import string
from typing import Any, Mapping

import numpy as np

from seqio_tasks.ruler import assets as assets_lib
from seqio_tasks.ruler import search
from seqio_tasks.ruler import templates

# scipy.special.zeta(2.0) == math.pi ** 2 / 6 == 1.6449340668482264 (checked in float64).
_ZETA = {2.0: math.pi ** 2 / 6}


class CommonWords:
  """common_words_extraction.py's draws for one task."""

  def __init__(self, args: Mapping[str, Any], rng: random.Random, seed: int, max_seq_length: int):
    self.args = args
    self.rng = rng
    self.seed = seed
    self.short = max_seq_length < 4096
    words = list(assets_lib.cwe_words())
    random.Random(seed).shuffle(words)
    self.words = words

  def _example(self, num_words: int, common_repeats: int, uncommon_repeats: int,
               common_nums: int) -> tuple[str, list[str]]:
    """get_example."""
    if num_words > len(self.words):
      raise assets_lib.AssetError(
          f'RULER cwe: {num_words} distinct words needed, more than wonderwords\' '
          f'{len(self.words)}; upstream then draws from json/english_words.json (Git LFS), which '
          'is not ported. Use a shorter length.')
    chosen = self.rng.sample(self.words, num_words)
    common, uncommon = chosen[:common_nums], chosen[common_nums:]
    word_list = common * int(common_repeats) + uncommon * int(uncommon_repeats)
    random.Random(self.seed).shuffle(word_list)
    return ' '.join(f'{i + 1}. {word}' for i, word in enumerate(word_list)), common

  def draw(self, num_words: int) -> tuple[str, list[str]]:
    """generate_input_output."""
    num_cw = self.args['num_cw']
    shots = []
    if self.short:
      for _ in range(self.args['num_fewshot']):
        shots.append(self._example(20, 3, 1, num_cw))
      context, answer = self._example(num_words, 6, 1, num_cw)
    else:
      for _ in range(self.args['num_fewshot']):
        shots.append(self._example(40, 10, 3, num_cw))
      context, answer = self._example(num_words, self.args['freq_cw'], self.args['freq_ucw'],
                                      num_cw)
    prompt = templates.prompt('common_words_extraction')
    solved = [prompt.format(num_cw=num_cw, context=c, query='') + ' '
              + ' '.join(f'{i + 1}. {w}' for i, w in enumerate(a)) for c, a in shots]
    text = prompt.format(num_cw=num_cw, context=context, query='')
    return '\n'.join(solved) + '\n' + text, answer


def generate_cwe(task: str, args: Mapping[str, Any], tokenizer: search.Tokenizer, *,
                 max_seq_length: int, reserve: int, seed: int, num_samples: int,
                 progress: search.Progress) -> list[dict[str, Any]]:
  """common_words_extraction.py's sys_word_pair_random: the records it writes."""
  cwe = CommonWords(args, random.Random(seed), seed, max_seq_length)
  step = 10
  size = search.haystack_size(cwe.draw, tokenizer, max_seq_length=max_seq_length,
                              incremental=step, estimate_at=4096,
                              upper_bound=search.upper_bound_2x, reserve=reserve)
  marker = templates.answer_prefix_marker('common_words_extraction')
  records = []
  for index in range(num_samples):
    text, answer, length = search.sample(cwe.draw, tokenizer, size=size, incremental=step,
                                         max_seq_length=max_seq_length, reserve=reserve,
                                         task=task, unit='words')
    records.append(search.record(index, text, answer, length, marker))
    progress()
  return records


class FrequentWords:
  """freq_words_extraction.py's draws for one task."""

  def __init__(self, args: Mapping[str, Any], rng: random.Random, seed: int,
               tokenizer: search.Tokenizer, vocab_size: int, step: int, task: str,
               max_seq_length: int):
    alpha = float(args['alpha'])
    if alpha not in _ZETA:
      raise ValueError(f'RULER fwe: alpha {alpha} is not ported; only {sorted(_ZETA)} are.')
    self.alpha, self.zeta = alpha, _ZETA[alpha]
    self.wordlen = args['coded_wordlen']
    self.rng, self.seed, self.tokenizer = rng, seed, tokenizer
    self.vocab_size, self.step, self.task = vocab_size, step, task
    self.max_seq_length = max_seq_length

  def _text(self, vocab: list[str], num_words: int) -> tuple[str, list[str], bool]:
    """gen_text; also whether the context is empty (no count reaches 1)."""
    k = np.arange(1, len(vocab) + 1)  # [vocab]
    counts = (num_words * (k ** -self.alpha) / self.zeta).astype(int)  # [vocab]
    sampled = [w for w, n in zip(vocab, counts) for _ in range(n)]
    random.Random(self.seed).shuffle(sampled)
    text = templates.prompt('freq_words_extraction').format(context=' '.join(sampled), query='')
    return text, vocab[1:4], not sampled

  def _tokens(self, text: str) -> int:
    return len(self.tokenizer.text_to_tokens(text))

  def draw(self, max_len: int, num_words: int = -1) -> tuple[str, list[str], int]:
    """generate_input_output: (text, answer, num_words)."""
    letters = string.ascii_lowercase
    vocab = [''.join(self.rng.choices(letters, k=self.wordlen)) for _ in range(self.vocab_size)]
    while len(set(vocab)) < self.vocab_size:
      vocab.append(''.join(self.rng.choices(letters, k=self.wordlen)))
    vocab = sorted(set(vocab))
    random.Random(self.seed).shuffle(vocab)
    vocab[0] = '...'
    if num_words > 0:
      text, answer, empty = self._text(vocab, num_words)
      while self._tokens(text) > max_len:
        if empty or self.step == 0:
          raise search.RulerLengthError(
              f'RULER {self.task} at max_seq_length={self.max_seq_length}: its smallest input '
              f'(no coded words) is already {self._tokens(text)} tokens > {max_len} (the length '
              'less the tokens reserved for the answer), so upstream\'s script would step the '
              'word count down forever; use a larger length.')
        num_words -= self.step
        text, answer, empty = self._text(vocab, num_words)
    else:
      num_words = max_len // self.wordlen
      text, answer, _ = self._text(vocab, num_words)
      while self._tokens(text) < max_len:
        num_words += self.step
        text, answer, _ = self._text(vocab, num_words)
      num_words -= self.step
    text, answer, _ = self._text(vocab, num_words)
    return text, answer, num_words


def generate_fwe(task: str, args: Mapping[str, Any], tokenizer: search.Tokenizer, *,
                 max_seq_length: int, reserve: int, seed: int, num_samples: int,
                 progress: search.Progress) -> list[dict[str, Any]]:
  """freq_words_extraction.py's sys_kwext: the records it writes."""
  budget = max_seq_length - reserve
  if budget < 50:
    raise search.RulerLengthError(
        f'RULER {task} at max_seq_length={max_seq_length}: {budget} tokens are left for the '
        'input, under 50, so upstream\'s vocabulary (a 50th of them) is empty; use a larger '
        'length.')
  vocab_size = budget // 50 if args['vocab_size'] == -1 else args['vocab_size']
  fwe = FrequentWords(args, random.Random(seed), seed, tokenizer, vocab_size, budget // 32, task,
                      max_seq_length)
  _, _, num_words = fwe.draw(budget)
  marker = templates.answer_prefix_marker('freq_words_extraction')
  records = []
  for index in range(num_samples):
    text, answer, _ = fwe.draw(budget, num_words=num_words)
    length = len(tokenizer.text_to_tokens(text)) + reserve
    records.append(search.record(index, text, answer, length, marker))
    progress()
  return records
