"""RULER's variable tracking generator (NVIDIA/RULER:scripts/data/synthetic/variable_tracking.py,
c3f5e3b), its random draws in upstream's order.

A chain `VAR A = 12345`, `VAR B = VAR A `, ... of `num_hops + 1` variables (5 random upper-case
letters each; the value `np.random.randint(10000, 99999)`) is scattered over `size` noise lines;
the answer is the chain's variables. First a one-shot example is made the same way at
max_seq_length 500 (3-letter variables, value 12345, nothing reserved for generation); each
sample then gets it, its variables and value redrawn (`randomize_icl`), before the prompt, and the
search counts its tokens. Only the noise haystack is ported (RULER's `vt` uses it).
"""
from __future__ import annotations

import random
import string
from typing import Any, Mapping

import numpy as np

from seqio_tasks.ruler import search
from seqio_tasks.ruler import templates

_ICL_LENGTH = 500


class VariableTracking:
  """One task's draws, sharing one `random.Random` and one legacy `np.random.RandomState`."""

  def __init__(self, args: Mapping[str, Any], rng: random.Random, np_rng: np.random.RandomState):
    if args['type_haystack'] != 'noise':
      raise ValueError(f'RULER vt: haystack {args["type_haystack"]!r} is not ported; only noise '
                       '(RULER\'s vt task) is.')
    self.num_chains = args['num_chains']
    self.num_hops = args['num_hops']
    self.rng = rng
    self.np_rng = np_rng

  def _chains(self, is_icl: bool) -> tuple[list[list[str]], list[list[str]]]:
    """generate_chains."""
    k = 3 if is_icl else 5
    hops = min(10, self.num_hops) if is_icl else self.num_hops
    letters = string.ascii_uppercase
    names = [''.join(self.rng.choices(letters, k=k)).upper()
             for _ in range((hops + 1) * self.num_chains)]
    while len(set(names)) < self.num_chains * (hops + 1):
      names.append(''.join(self.rng.choices(letters, k=k)).upper())
    variables, chains = [], []
    for i in range(0, len(names), hops + 1):
      these = names[i:i + hops + 1]
      variables.append(these)
      value = '12345' if is_icl else str(self.np_rng.randint(10000, 99999))
      chain = [f'VAR {these[0]} = {value}']
      for j in range(hops):
        chain.append(f'VAR {these[j + 1]} = VAR {these[j]} ')
      chains.append(chain)
    return variables, chains

  def draw(self, size: int, is_icl: bool) -> tuple[str, list[str]]:
    """generate_input_output(num_noises=size) for the noise haystack."""
    variables, chains = self._chains(is_icl)
    value = chains[0][0].split('=')[-1].strip()
    sentences = [templates.NOISE] * size
    for chain in chains:
      positions = sorted(self.rng.sample(range(len(sentences)), len(chain)))
      for position, j in zip(positions, range(len(chain))):
        sentences.insert(position + j, chain[j])
    context = '\n'.join(sentences).replace('. \n', '.\n')
    text = templates.prompt('variable_tracking').format(context=context, query=value,
                                                        num_v=self.num_hops + 1)
    return text, variables[0]

  def randomize_icl(self, example: str) -> str:
    """randomize_icl: the example's variables (its last num_hops + 1 words) and value redrawn."""
    for item in example.strip().split()[-self.num_hops - 1:]:
      new = ''.join(self.rng.choices(string.ascii_uppercase, k=len(item))).upper()
      example = example.replace(item, new)
    return example.replace('12345', str(self.np_rng.randint(10000, 99999)))


def generate(task: str, args: Mapping[str, Any], tokenizer: search.Tokenizer, *,
             max_seq_length: int, reserve: int, seed: int, num_samples: int,
             progress: search.Progress) -> list[dict[str, Any]]:
  """variable_tracking.py's main: the one-shot example, then the records it writes."""
  rng, np_rng = random.Random(seed), np.random.RandomState(seed)
  vt = VariableTracking(args, rng, np_rng)

  # sys_vartrack_w_noise_random(num_samples=1, max_seq_length=500, incremental=5): is_icl.
  icl_draw = lambda size: vt.draw(size, is_icl=True)  # noqa: E731
  size = search.haystack_size(icl_draw, tokenizer, max_seq_length=_ICL_LENGTH, incremental=5,
                              estimate_at=5, upper_bound=search.upper_bound_3x, reserve=0)
  icl_text, icl_answer, _ = search.sample(icl_draw, tokenizer, size=size, incremental=5,
                                          max_seq_length=_ICL_LENGTH, reserve=0,
                                          task=f'{task} (one-shot example)', unit='lines')
  example = icl_text + ' ' + ' '.join(icl_answer) + '\n'
  example_tokens = len(tokenizer.text_to_tokens(example))

  step = 5 if max_seq_length < 4096 else 10
  main_draw = lambda size: vt.draw(size, is_icl=False)  # noqa: E731
  size = search.haystack_size(main_draw, tokenizer, max_seq_length=max_seq_length,
                              incremental=step, estimate_at=step,
                              upper_bound=search.upper_bound_3x, reserve=reserve,
                              extra=example_tokens)
  head = templates.GENERATORS['variable_tracking']['template'][:20]

  def with_example(size: int) -> tuple[str, list[str]]:
    text, answer = main_draw(size)
    cut = text.index(head)
    return text[:cut] + vt.randomize_icl(example) + '\n' + text[cut:], answer

  marker = templates.answer_prefix_marker('variable_tracking')
  records = []
  for index in range(num_samples):
    text, answer, length = search.sample(with_example, tokenizer, size=size, incremental=step,
                                         max_seq_length=max_seq_length, reserve=reserve,
                                         task=task, unit='lines')
    records.append(search.record(index, text, answer, length, marker))
    progress()
  return records
