"""A demo run's clock: the seconds of its phases as results.json records them (`Phases`), the time
its remaining work will take (`Eta`, measured on the work done), and the relative costs those
estimates start from (`calibration_passes`, `EVAL_LINEAR`).
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from t5align import calibration


class Phases:
  """Wall-clock and process CPU seconds of a run's phases (results.json 'timing'): CPU seconds
  beyond the wall's say how much of the machine the run used (2 cores: at most 2x)."""

  def __init__(self):
    self.seconds: dict[str, float] = {}
    self.wall, self.cpu = time.time(), time.process_time()

  @contextlib.contextmanager
  def __call__(self, name: str):
    wall, cpu = time.time(), time.process_time()
    yield
    self.seconds[f'{name}_s'] = round(time.time() - wall, 1)
    self.seconds[f'{name}_cpu_s'] = round(time.process_time() - cpu, 1)

  def totals(self) -> dict[str, float]:
    return {**self.seconds, 'total_s': round(time.time() - self.wall, 1),
            'total_cpu_s': round(time.process_time() - self.cpu, 1)}


def _duration(seconds: float) -> str:
  seconds = max(0, int(round(seconds)))
  return f'{seconds // 60}m{seconds % 60:02d}s'


class Eta:
  """Time left in a run's remaining work, from the seconds measured on the work done.

  Work comes in pieces, each at an input length L with a multiplier m (examples, or encoder
  passes x prompts): a piece costs m x g(L), plus a compilation for the first piece at each L.
  g(L) is measured: at a length with pieces done, their mean seconds per unit of m (the first
  piece's own excluded once others ran; while it is alone, its seconds less a compilation's);
  at a length not reached yet, the nearest
  measured one's scaled by a power law (L/L_m)^p, p fitted between the two measured lengths
  nearest L (clipped to [1, 2]), or by `prior(L) / prior(L_m)` while one length is measured. A
  compilation costs what the first pieces ran longer than the others at their length. Work runs
  longest first, so the first pieces measure the work that dominates.
  """

  def __init__(self, pieces: Mapping[Any, tuple[int, float]],
               clock: Callable[[], float] = time.monotonic,
               prior: Callable[[float], float] = lambda L: L * (L + EVAL_LINEAR)):
    self.pieces = dict(pieces)  # key -> (length, multiplier)
    self.clock = clock
    self.prior = prior
    self.last = clock()
    self.finished: dict[Any, tuple[float, bool]] = {}  # key -> (seconds, first at its length)

  def _per_unit(self) -> tuple[dict[int, float], float]:
    """({length: measured seconds per unit}, seconds per compilation)."""
    by_length: dict[int, list[tuple[float, float, bool]]] = {}
    for key, (seconds, first) in self.finished.items():
      length, m = self.pieces[key]
      if m > 0:
        by_length.setdefault(length, []).append((seconds, m, first))
    rate, extra = {}, []
    for length, items in by_length.items():
      later = [(s, m) for s, m, first in items if not first]
      if later:
        rate[length] = sum(s for s, _ in later) / sum(m for _, m in later)
        extra += [s - m * rate[length] for s, m, first in items if first]
    compile_s = max(0.0, float(np.mean(extra))) if extra else 0.0
    for length, items in by_length.items():
      if length not in rate:  # Only its first piece ran: its seconds less a compilation.
        [(s, m, _)] = items
        rate[length] = max(s - compile_s, 0.1 * s) / m
    return rate, compile_s

  def _scale(self, length: int, rate: Mapping[int, float]) -> float:
    """Seconds per unit at a length not measured yet."""
    near = sorted(rate, key=lambda L: (abs(math.log(L / length)), L))
    if len(near) == 1:
      return rate[near[0]] * self.prior(length) / self.prior(near[0])
    (l1, l2), (g1, g2) = near[:2], (rate[near[0]], rate[near[1]])
    p = min(2.0, max(1.0, math.log(g2 / g1) / math.log(l2 / l1))) if g1 > 0 and g2 > 0 else 2.0
    return g1 * (length / l1) ** p

  def seconds_left(self) -> float:
    """Estimated seconds to finish; NaN until a piece with a multiplier has finished."""
    rate, compile_s = self._per_unit()
    if not rate:
      return math.nan
    left, new = 0.0, set()
    for key, (length, m) in self.pieces.items():
      if key in self.finished:
        continue
      if length not in rate:
        new.add(length)
        rate[length] = self._scale(length, {L: g for L, g in rate.items() if L not in new})
      left += m * rate[length]
    return left + compile_s * len(new)

  def advance(self, key: Any) -> str:
    """Records that piece `key` finished; returns ', ETA 1m05s' ('' while there is no rate)."""
    now = self.clock()
    length = self.pieces[key][0]
    first = all(self.pieces[k][0] != length for k in self.finished)
    self.finished[key] = (now - self.last, first)
    self.last = now
    left = self.seconds_left()
    return '' if math.isnan(left) else f', ETA {_duration(left)}'


# Relative costs for the progress estimates. An evaluation example at length L costs about
# L x (L + EVAL_LINEAR): attention grows with L^2, the rest (projections, MLPs, decoding) with L.
EVAL_LINEAR = 1024


# Encoder passes (one tau each) per calibration search: Algorithm 1's sweep (shared by the grid
# strategies), a per-layer search's rounds (a one-tau continuous search: 0.6 of them), layer 0's
# sorted logits (shared by the closed forms) in passes' worth of time; the data-free formulas
# (log-length and the others of `calibration.FORMULAS`) compute nothing.
SWEEP_PASSES = {'grid': len(calibration.PAPER_GRID), 'bisect': 10, 'closed_form': 8}
# A search's rounds relative to a per-layer one's (gin/calibrate.gin: per head, 6-21 calls
# where per layer makes 5-9, on the shipped model).
SEARCH_SCOPE_PASSES = {'encoder': 0.6, 'layer': 1.0, 'head': 2.0}


def calibration_passes(strategies: Sequence[str], done: Sequence[str] = ()) -> dict[str, float]:
  """Encoder passes (`SWEEP_PASSES`) each strategy's calibration makes on its prompts, the
  searches in `done` already made (remembered, `calibration.Memo`): a sweep shared by several
  strategies is counted once, on the first of them."""
  passes, made = {}, set(done)
  for s in strategies:
    _, search, scope = calibration.parse_strategy(s)
    n = 0.0
    if s in calibration.FORMULAS:  # Computes nothing (the closed forms' logits are still to make).
      passes[s] = n
      continue
    if search == 'bisect' or search not in made:
      n = SWEEP_PASSES[search] * (SEARCH_SCOPE_PASSES[scope] if search == 'bisect' else 1.0)
    made.add(search)
    passes[s] = n
  return passes
