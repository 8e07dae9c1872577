"""RULER's length search: the haystack size that fills a length budget, found as upstream finds it.

NVIDIA/RULER's niah.py, variable_tracking.py, common_words_extraction.py and qa.py (c3f5e3b) share
one procedure, and the random draws it makes decide every later example, so it is followed step
for step:

  1. estimate: build one input at a fixed size `estimate_at`; its tokens per unit of haystack give
     an upper bound (`upper_bound`, per script);
  2. binary search over [incremental, upper] for the largest size whose input fits: tokens
     + `extra` + `reserve` <= max_seq_length, one freshly drawn input per probe (no fit at all:
     the size is `incremental`);
  3. each sample: draw an input at that size; while it does not fit (or cannot be drawn:
     `DrawError`), draw again at `incremental` fewer, and at the same size once the size can fall
     no further.

At the smallest size upstream's step 3 redraws until a draw happens to fit. Some do after a few
draws (documents or words of other lengths), which is reproduced; below the task's smallest input
none ever does (with the 1,000-piece vocabulary: vt and niah_multikey_3 at 512 tokens, cwe at
512, 1,024 and 4,096), and upstream loops forever. `sample` raises `RulerLengthError` there,
naming the task, the length and the shortest input drawn, after `MAX_REDRAWS` draws in a row that
all overflow (a run that upstream would end later than that is refused too).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Protocol, Sequence

from absl import logging


class Tokenizer(Protocol):
  """RULER's tokenizer interface (scripts/data/tokenizer.py): only the token count is used."""

  def text_to_tokens(self, text: str) -> Sequence[object]:
    ...


class RulerLengthError(ValueError):
  """A length at which upstream's scripts would never finish (the smallest input overflows)."""


class DrawError(ValueError):
  """A draw upstream's `random.sample` refuses (e.g. fewer QA documents than gold ones); its
  sample loop swallows it (a bare `except`) and steps the size down as for an overflow."""


# Draws at the smallest size, all overflowing, after which `sample` gives up.
MAX_REDRAWS = 10_000

# (text, answers) for a haystack size.
Draw = Callable[[int], tuple[str, list[str]]]


def upper_bound_3x(max_seq_length: int, tokens_per_unit: float) -> int:
  """niah.py, variable_tracking.py, qa.py: `int((max_seq_length / tokens_per_unit) * 3)`."""
  return int((max_seq_length / tokens_per_unit) * 3)


def upper_bound_2x(max_seq_length: int, tokens_per_unit: float) -> int:
  """common_words_extraction.py: `int(max_seq_length // tokens_per_unit) * 2`."""
  return int(max_seq_length // tokens_per_unit) * 2


def haystack_size(draw: Draw, tokenizer: Tokenizer, *, max_seq_length: int, incremental: int,
                  estimate_at: int, upper_bound: Callable[[int, float], int], reserve: int,
                  extra: int = 0) -> int:
  """Steps 1 and 2 of the module docstring: the haystack size every sample starts from."""
  text, _ = draw(estimate_at)
  tokens_per_unit = len(tokenizer.text_to_tokens(text)) / estimate_at
  lower, upper = incremental, max(upper_bound(max_seq_length, tokens_per_unit), incremental * 2)
  best = None
  while lower <= upper:
    mid = (lower + upper) // 2
    text, _ = draw(mid)
    if len(tokenizer.text_to_tokens(text)) + extra + reserve <= max_seq_length:
      best, lower = mid, mid + 1
    else:
      upper = mid - 1
  return incremental if best is None else best


def sample(draw: Draw, tokenizer: Tokenizer, *, size: int, incremental: int, max_seq_length: int,
           reserve: int, task: str, unit: str) -> tuple[str, list[str], int]:
  """Step 3 of the module docstring: (text, answers, length) of one sample, `length` being its
  tokens + `reserve` (upstream's record 'length').

  Raises:
    RulerLengthError: at the smallest size, `MAX_REDRAWS` draws in a row overflow, or the draw
      cannot be made (upstream would loop on).
  """
  redraws, shortest = 0, None
  while True:
    try:
      text, answers = draw(size)
    except DrawError as e:
      if size > incremental:
        size -= incremental
        continue
      # random.sample refuses before drawing anything, so upstream fails alike forever.
      raise RulerLengthError(
          f'RULER {task} at max_seq_length={max_seq_length}: its smallest input ({size} {unit}) '
          f'cannot be drawn ({e}), so upstream\'s scripts would retry it forever; use a larger '
          'length.') from e
    length = len(tokenizer.text_to_tokens(text)) + reserve
    if length <= max_seq_length:
      return text, answers, length
    if size > incremental:
      size -= incremental
      continue
    # Upstream redraws the smallest size until a draw fits (another draw can be shorter).
    redraws += 1
    shortest = length if shortest is None else min(shortest, length)
    if redraws == MAX_REDRAWS:
      hint = (" or budget='encoder' (1 token reserved)" if reserve > 1 and
              shortest - reserve + 1 <= max_seq_length else '')
      raise RulerLengthError(
          f'RULER {task} at max_seq_length={max_seq_length}: its smallest input ({size} {unit}) '
          f'is at least {shortest} tokens ({shortest - reserve} of input + {reserve} reserved) in '
          f'{MAX_REDRAWS} draws, so upstream\'s scripts would redraw it without end; use a larger '
          f'length{hint}.')


def record(index: int, text: str, outputs: list[str], length: int, marker: str) -> dict[str, Any]:
  """One record as upstream's scripts write it: the prompt cut before its last `marker` (the
  answer prefix's start) into 'input' and 'answer_prefix' (niah.py's then sets 'index' and adds
  'token_position_answer')."""
  cut = text.rfind(marker)
  return {'index': index, 'input': text[:cut], 'outputs': outputs, 'length': length,
          'length_w_model_temp': length, 'answer_prefix': text[cut:]}


class Progress:
  """A generation's progress, logged (absl, INFO) after a sample at most every `every_s`
  seconds: the samples done, the time a sample takes and the time left. Generation costs about
  25 us per token per sample at 10^6 tokens (niah_single_1, vt; 12 us at 16k; SentencePiece
  pieces, 2-core CPU VM, 2026-12-02), so 500 samples of 10^6 tokens take hours: this says so
  while it runs."""

  def __init__(self, task: str, max_seq_length: int, total: int, *, every_s: float = 30.0,
               clock: Callable[[], float] = time.monotonic):
    self.task, self.max_seq_length, self.total = task, max_seq_length, total
    self.every_s, self.clock = every_s, clock
    self.done = 0
    self.start = self.last = clock()

  def __call__(self) -> None:
    """One more sample done."""
    self.done += 1
    now = self.clock()
    if self.done < self.total and now - self.last >= self.every_s:
      each = (now - self.start) / self.done
      logging.info('RULER %s at %d tokens: %d of %d samples (%.1f s each; about %.0f s left).',
                   self.task, self.max_seq_length, self.done, self.total, each,
                   each * (self.total - self.done))
      self.last = now
