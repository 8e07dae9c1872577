"""Token batches: padding rows to a common length, padding batches to a device multiple.

numpy only (no JAX), so data code and reports can use it without a backend.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def ceil_div(n: int | np.ndarray, d: int) -> int | np.ndarray:
  """`ceil(n / d)` for an integer or an integer array, elementwise (exact, unlike float
  division); `d` must be positive."""
  if d <= 0:
    raise ValueError(f'divisor must be positive; got {d}.')
  if isinstance(n, np.ndarray):
    return -(-n // int(d))
  return -(-int(n) // int(d))


def round_up(n: int | np.ndarray, multiple: int) -> int | np.ndarray:
  """The smallest multiple of `multiple` that is >= `n` (elementwise for an array)."""
  return ceil_div(n, multiple) * int(multiple)


def pad_tokens(rows: Sequence[Sequence[int]], multiple: int = 128,
               min_length: int = 1) -> np.ndarray:
  """int32 `[b, l]`, zero-padded; l is the longest row rounded up to `multiple` (fewer compiles)."""
  longest = max([len(r) for r in rows] + [min_length])
  out = np.zeros((len(rows), round_up(longest, multiple)), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def pad_batch(tokens: np.ndarray, size: int) -> np.ndarray:
  """Adds all-padding rows up to `size` (a multiple of the data axis); callers drop them."""
  if tokens.shape[0] >= size:
    return tokens
  return np.concatenate([tokens, np.zeros((size - tokens.shape[0], *tokens.shape[1:]),
                                          tokens.dtype)])


def strip_eos(row: Sequence[int], eos_id: int = 1) -> list[int]:
  """Tokens before the first EOS (and without padding zeros)."""
  out = []
  for t in row:
    if t == eos_id:
      break
    if t != 0:
      out.append(int(t))
  return out
