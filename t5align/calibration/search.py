"""Searches over tau: Algorithm 1's grid, and the continuous search (one tau, one per layer, or
one per layer and head).

Each takes `evaluate`, a function from candidate taus `[t]` to the statistic `[t]` (one call of
`stats.encoder_attention_stats` for all of them), so the candidates of a round go
through one vmapped call; a search makes few calls, each of the same size (one compilation).
The searches are written as generators of their rounds (`grid_steps`, `bisect_steps`: each
yields the taus it wants evaluated and receives their values), so that one driver runs a
search alone (`run_steps`) and another runs many independent searches together, one call per
round for all of them (`run_lockstep`; the heads of a layer in `align_heads`).
"""
from __future__ import annotations

from typing import Callable, Generator, Sequence

import numpy as np

from t5align.runtime import validate

PAPER_GRID = tuple(round(1.0 - 0.05 * i, 2) for i in range(11))  # 1.0, 0.95, ..., 0.5
# How far on each side of a `guess` the first round of `bisect_steps` looks. On the t5x tiny
# fixture's per-head searches (81 and 160 tokens), 0.01 took layer 1 2-4 rounds, 0.025 took
# 4-5; a guess further off costs a secant round or two more.
GUESS_SPREAD = 0.01

# A search as a generator: yields float64 `[t]` taus, receives their `[t]` statistic, returns
# (tau, its statistic, details).
Steps = Generator[np.ndarray, np.ndarray, tuple[float, float, dict]]


def run_steps(steps: Steps, evaluate: Callable[[np.ndarray], np.ndarray]
              ) -> tuple[float, float, dict]:
  """Runs one search generator, each round's taus through `evaluate`; returns its result."""
  try:
    taus = next(steps)
    while True:
      taus = steps.send(np.asarray(evaluate(np.asarray(taus, np.float64)), np.float64))
  except StopIteration as done:
    return done.value


def run_lockstep(searches: Sequence[Steps], evaluate: Callable[[np.ndarray], np.ndarray]
                 ) -> list[tuple[float, float, dict]]:
  """Runs `k` independent searches together: one `evaluate` call per round for all of them.

  Each round, search j's taus form column j of a `[t, k]` array, `t` the most taus any search
  asks for (a shorter column repeats its last tau; a finished search's column holds its
  answer). `evaluate` maps `[t, k]` taus to `[t, k]` values, column j's values depending on
  column j's taus only (e.g. the heads of one layer, each at its own tau).

  Returns:
    Each search's (tau, its statistic, details), in order.
  """
  results: list[tuple[float, float, dict] | None] = [None] * len(searches)
  asks: dict[int, np.ndarray] = {}

  def advance(j: int, values: np.ndarray | None) -> None:
    try:
      asks[j] = np.asarray(next(searches[j]) if values is None else searches[j].send(values),
                           np.float64)
    except StopIteration as done:
      results[j] = done.value
      asks.pop(j, None)

  for j in range(len(searches)):
    advance(j, None)
  while asks:
    t = max(len(x) for x in asks.values())
    if t == 0:  # Nothing new to measure this round.
      values = np.zeros((0, len(searches)))
    else:
      columns = [np.pad(asks[j], (0, t - len(asks[j])), mode='edge') if len(asks.get(j, ()))
                 else np.full(t, results[j][0] if results[j] else 1.0)
                 for j in range(len(searches))]
      values = np.asarray(evaluate(np.stack(columns, axis=1)), np.float64)  # [t, k]
    for j in list(asks):
      advance(j, values[:len(asks[j]), j])
  return results


def grid_search(evaluate: Callable[[np.ndarray], np.ndarray], target: float,
                grid: Sequence[float] = PAPER_GRID) -> tuple[float, float, dict]:
  """Algorithm 1: the grid tau whose statistic is closest to `target` (first on ties).

  Returns:
    (tau, its statistic, details); details['clamped'] is True when no grid interval holds the
    target (the target lies beyond every grid value).
  """
  return run_steps(grid_steps(target, grid), evaluate)


def grid_steps(target: float, grid: Sequence[float] = PAPER_GRID,
               known: tuple[Sequence[float], Sequence[float]] | None = None,
               guess: float | None = None) -> Steps:
  """`grid_search` as a generator (`run_steps`); `known` and `guess` are accepted for the
  drivers' sake and ignored (the grid is always evaluated whole, in one call)."""
  del known, guess
  grid = validate.temperature_array(grid, 'grid')
  if grid.ndim != 1:
    raise ValueError(f'grid must be 1-D; got shape {grid.shape}.')
  values = yield grid
  i = int(np.argmin(np.abs(values - target)))
  clamped = bool(np.all(values > target) or np.all(values < target))
  return float(grid[i]), float(values[i]), {'grid': grid.tolist(), 'values': values.tolist(),
                                            'clamped': clamped}


def bisect_search(evaluate: Callable[[np.ndarray], np.ndarray], target: float, *,
                  increasing: bool, bracket: tuple[float, float] = (0.05, 1.0),
                  tol: float = 1e-3, points: int = 2,
                  known: tuple[Sequence[float], Sequence[float]] | None = None,
                  step: float = 0.025) -> tuple[float, float, dict]:
  """Solves statistic(tau) = target for a monotone statistic, to `tol` in tau.

  A safeguarded bracketing search (Brent-style): each round evaluates `points` taus in one call
  and keeps the narrowest interval known to hold the crossing. The points of a round lie within
  `tol` of the crossing as inverse quadratic interpolation through the known values nearest
  the interval estimates it (so a smooth statistic is usually solved in one or two rounds); a
  round that fails to halve the interval is followed by one of `points` evenly spaced taus
  (k-section), so the interval always shrinks geometrically. The answer is the end of the
  final interval (width <= tol) whose statistic is nearer the target: within `tol` of the
  crossing, as plain bisection's answer is, though not necessarily the same float.

  `known` = (taus, values) already computed (e.g. Algorithm 1's grid, or a value the previous
  layer's search measured) warm-starts the search: with values on both sides of the crossing it
  starts from the interval between them; with one side only, it looks beyond the nearest known
  tau around where the secant through it and its nearest known neighbour meets the target (or,
  without a usable secant, steps outwards by `step`, growing, up to the end of `bracket`).
  Without any, the first call evaluates the bracket's ends. A target outside the bracket's values
  returns the nearer end with details['clamped'] = True.

  Returns:
    (tau, its statistic, details); details['calls'] counts the calls made, details['bracket']
    is the final interval.
  """
  return run_steps(bisect_steps(target, increasing=increasing, bracket=bracket, tol=tol,
                                points=points, known=known, step=step), evaluate)


def bisect_steps(target: float, *, increasing: bool, bracket: tuple[float, float] = (0.05, 1.0),
                 tol: float = 1e-3, points: int = 2,
                 known: tuple[Sequence[float], Sequence[float]] | None = None,
                 step: float = 0.025, guess: float | None = None) -> Steps:
  """`bisect_search` as a generator of its rounds (`run_steps`, `run_lockstep`).

  `guess`: a tau believed near the crossing (e.g. predicted from a related sweep). With nothing
  known in the bracket, the first round evaluates `guess -/+ GUESS_SPREAD` (and, for `points`
  > 2, taus between them) instead of the bracket's ends; the search then looks outwards or
  narrows as it would from any known values. It only changes which taus are evaluated, never
  what counts as the answer.
  """
  lo, hi = (float(x) for x in validate.temperature_array(bracket, 'bracket'))
  if not (lo < hi and tol > 0 and points >= 1 and step > 0):
    raise ValueError(f'need bracket lo < hi, tol > 0, points >= 1, step > 0; got {bracket}, '
                     f'{tol}, {points}, {step}.')
  sign = 1.0 if increasing else -1.0  # sign * (value - target) increases with tau.
  values: dict[float, float] = {}
  if known is not None:
    for x, v in zip(np.asarray(known[0], np.float64).tolist(),
                    np.asarray(known[1], np.float64).tolist()):
      if lo <= x <= hi:
        values[x] = v
  calls = 0

  def above(x: float) -> bool:
    return sign * (values[x] - target) >= 0

  def interval() -> tuple[float | None, float | None]:
    """(largest tau below the crossing, smallest above it); None where none is known yet."""
    below = [x for x in values if not above(x)]
    over = [x for x in values if above(x)]
    return (max(below) if below else None), (min(over) if over else None)

  def fill(xs: list[float], a: float, b: float) -> list[float]:
    """`xs` topped up to `points` distinct new taus with evenly spaced ones in (a, b)."""
    xs = sorted({x for x in xs if x not in values})
    extra = [x for x in np.linspace(a, b, points + 2)[1:-1].tolist() if x not in values]
    while len(xs) < points and extra:
      xs = sorted(set(xs) | {extra.pop(len(extra) // 2)})
    return xs[:points]

  def beyond(edge: float, end: float) -> list[float]:
    """`points` taus between `edge` (the known tau nearest the crossing) and `end`, around
    where the secant through `edge` and its nearest known neighbour meets the target, `step`
    or a quarter of the way from `edge` apart, whichever is more; [] without such a secant."""
    others = [x for x in values if x != edge]
    if not others:
      return []
    near = min(others, key=lambda x: abs(x - edge))
    if values[near] == values[edge]:
      return []
    guess = edge + (target - values[edge]) * (near - edge) / (values[near] - values[edge])
    if (guess - edge) * (end - edge) <= 0:
      return []
    spread = max(step, abs(guess - edge) / 4)
    xs = np.linspace(guess - spread, guess + spread, points) if points > 1 else [guess]
    return [float(np.clip(x, min(edge, end), max(edge, end))) for x in xs]

  # Find an interval holding the crossing (or learn that the bracket does not hold it).
  a, b = interval()
  reach = step
  while a is None or b is None:
    if not values and guess is not None:
      near = (min(hi, max(lo, guess - GUESS_SPREAD)), min(hi, max(lo, guess + GUESS_SPREAD)))
      xs = fill(list(near), *near)
    elif not values:
      xs = fill([lo, hi], lo, hi)
    elif a is None:  # Every known tau is above the crossing: look lower.
      edge = min(values)
      if edge <= lo:
        break
      xs = fill(beyond(edge, lo) or [max(lo, edge - reach * k) for k in range(1, points + 1)],
                lo, edge)
    else:  # Every known tau is below the crossing: look higher.
      edge = max(values)
      if edge >= hi:
        break
      xs = fill(beyond(edge, hi) or [min(hi, edge + reach * k) for k in range(1, points + 1)],
                edge, hi)
    xs = np.asarray(xs, np.float64)
    values.update(zip(xs.tolist(), np.asarray((yield xs), np.float64).tolist()))
    calls += 1
    reach *= 2 * points
    a, b = interval()
  if a is None or b is None:
    tau = lo if a is None else hi
    return tau, float(values[tau]), {'bracket': [lo, hi], 'calls': calls, 'clamped': True}

  safeguard = False
  while b - a > tol:
    width = b - a
    if safeguard:
      xs = np.linspace(a, b, points + 2)[1:-1].tolist()
    else:
      guess = _inverse_interpolation(values, a, b, target)
      offsets = np.linspace(-0.5, 0.5, points) * tol if points > 1 else np.zeros(1)
      margin = min(tol / 4, width / (2 * (points + 1)))
      xs = np.clip(guess + offsets, a + margin, b - margin).tolist()
    xs = np.asarray(fill(xs, a, b), np.float64)
    values.update(zip(xs.tolist(), np.asarray((yield xs), np.float64).tolist()))
    calls += 1
    a, b = interval()
    safeguard = not safeguard and (b - a) > width / 2
  tau = a if abs(values[a] - target) <= abs(values[b] - target) else b
  return float(tau), float(values[tau]), {'bracket': [float(a), float(b)], 'calls': calls,
                                          'clamped': False}


def _inverse_interpolation(values: dict[float, float], a: float, b: float,
                           target: float) -> float:
  """tau where the statistic meets `target`, by inverse quadratic interpolation through `a`,
  `b` and the known tau nearest the interval (linear through `a`, `b` where that is not
  monotone or lands outside (a, b))."""
  linear = a + (target - values[a]) * (b - a) / (values[b] - values[a])
  others = sorted((x for x in values if x not in (a, b)),
                  key=lambda x: min(abs(x - a), abs(x - b)))
  if not others:
    return linear
  xs = np.array(sorted([a, b, others[0]]))
  ys = np.array([values[x] for x in xs]) - target
  if not (np.all(np.diff(ys) > 0) or np.all(np.diff(ys) < 0)):
    return linear
  # Lagrange form of tau(y) through the three points, at y = 0.
  tau = sum(xs[i] * np.prod([ys[j] / (ys[j] - ys[i]) for j in range(3) if j != i])
            for i in range(3))
  return float(tau) if a < tau < b else linear


def align_layers(evaluate_rows: Callable[[np.ndarray], np.ndarray], targets: Sequence[float], *,
                 increasing: bool, search: Callable[..., tuple[float, float, dict]],
                 known_first: tuple[np.ndarray, np.ndarray] | None = None
                 ) -> tuple[tuple[float, ...], tuple[float, ...], list[dict]]:
  """One tau per layer, layers in order: layer i's tau is searched with layers < i at their
  chosen taus and layers >= i at the candidate (the paper's future work).

  Args:
    evaluate_rows: `[t, n]` per-layer taus -> `[t, n]` the statistic of every layer.
    targets: `[n]` the statistic per layer at L_tr.
    increasing: whether the statistic grows with tau.
    search: `bisect_search`- or `grid_search`-like, called as `search(evaluate, target,
      known=...)`.
    known_first: (taus `[g]`, `[g, n]` every layer's statistic with all layers at each tau),
      e.g. Algorithm 1's sweep: exact for layer 0, whose statistic depends on its own tau only,
      and for layer 1 at the tau layer 0 chooses.

  Layers > i cannot change layer i's statistic, so each layer's value at its choice is final;
  and the row that measured layer i at its chosen tau c also measured layer i + 1 at c, which
  warm-starts layer i + 1's search.
  """
  n = len(targets)
  measured: dict[tuple[float, ...], np.ndarray] = {}  # row of taus -> [n] statistic per layer
  if known_first is not None:
    for tau, row in zip(np.asarray(known_first[0], np.float64).tolist(), known_first[1]):
      measured[(tau,) * n] = np.asarray(row, np.float64)
  chosen: list[float] = []
  values, infos = [], []
  for i in range(n):
    def rows_of(taus: np.ndarray) -> np.ndarray:
      # [t] -> [t, n]: layers < i at their chosen taus, layers >= i at the candidate.
      return np.concatenate([np.tile(chosen, (len(taus), 1)), np.tile(taus[:, None], n - i)], 1)

    def evaluate(taus: np.ndarray, i: int = i) -> np.ndarray:
      rows = rows_of(np.asarray(taus, np.float64))
      out = np.asarray(evaluate_rows(rows), np.float64)  # [t, n]
      measured.update(zip(map(tuple, rows.tolist()), out))
      return out[:, i]

    # What earlier rows already measured of layer i's statistic, at layers < i as chosen.
    known = [(row[i], v[i]) for row, v in measured.items()
             if list(row[:i]) == chosen and len(set(row[i:])) == 1]
    known_pair = (np.array([k[0] for k in known]), np.array([k[1] for k in known]))
    tau, value, info = search(evaluate, float(targets[i]), known=known_pair if known else None)
    chosen.append(tau)
    values.append(value)
    infos.append(info)
  return tuple(chosen), tuple(values), infos


def align_heads(evaluate_rows: Callable[[np.ndarray], np.ndarray], targets: np.ndarray, *,
                steps: Callable[..., Steps],
                known_first: tuple[np.ndarray, np.ndarray] | None = None
                ) -> tuple[np.ndarray, np.ndarray, list[dict]]:
  """One tau per head of each layer: layers in order, the heads of a layer searched together.

  Head j of layer i is aligned to its own target `targets[i, j]`. Its statistic depends on its
  own tau and on the layers before i (their output is layer i's input), not on the other heads
  of layer i (each head's softmax has its own tau) nor on later layers. So layer i's heads are
  searched with layers < i at their chosen taus, as independent searches run in lockstep
  (`run_lockstep`): each round is one `evaluate_rows` call whose row r puts every head j of
  layers >= i at its search's r-th candidate. A layer costs as many calls as its slowest head
  needs, about what `align_layers` spends on one layer.

  Args:
    evaluate_rows: `[t, n, h]` taus -> `[t, n, h]` the statistic of every head.
    targets: `[n, h]` the statistic per head at L_tr.
    steps: `bisect_steps`- or `grid_steps`-like, called as `steps(target, known=...,
      guess=...)`.
    known_first: (taus `[g]`, `[g, n, h]` every head's statistic with all heads at each tau),
      e.g. Algorithm 1's sweep: exact for layer 0's heads, whose statistics depend on their own
      taus only. For later layers no measured row has their inputs at the chosen taus; there
      the sweep's crossing of each head's target (its curve with every layer at the same tau)
      is only a `guess` where the search starts.

  Returns:
    (chosen taus `[n, h]`, the statistic at them `[n, h]`, per layer {'calls': its
    `evaluate_rows` calls, 'heads': each head's search details}).
  """
  targets = np.asarray(targets, np.float64)
  n, h = targets.shape
  chosen = np.ones((n, h))
  values = np.zeros((n, h))
  infos = []
  for i in range(n):
    calls = 0

    def evaluate(columns: np.ndarray, i: int = i) -> np.ndarray:
      # [t, h] candidates of layer i's heads -> [t, n, h] rows: layers < i as chosen, layers
      # >= i at the candidates.
      nonlocal calls
      calls += 1
      t = len(columns)
      rows = np.concatenate([np.broadcast_to(chosen[:i], (t, i, h)),
                             np.repeat(columns[:, None, :], n - i, axis=1)], axis=1)
      return np.asarray(evaluate_rows(rows), np.float64)[:, i]  # [t, h]

    known, guess = [None] * h, [None] * h
    if known_first is not None:
      taus, stats = (np.asarray(x, np.float64) for x in known_first)  # [g], [g, n, h]
      if i == 0:
        known = [(taus, stats[:, 0, j]) for j in range(h)]
      else:
        guess = [_crossing(taus, stats[:, i, j], targets[i, j]) for j in range(h)]
    results = run_lockstep([steps(float(targets[i, j]), known=known[j], guess=guess[j])
                            for j in range(h)], evaluate)
    chosen[i] = [r[0] for r in results]
    values[i] = [r[1] for r in results]
    infos.append({'calls': calls, 'heads': [r[2] for r in results]})
  return chosen, values, infos


def _crossing(taus: np.ndarray, values: np.ndarray, target: float) -> float:
  """The tau where the piecewise-linear curve `values(taus)` meets `target`: the first crossing
  in increasing tau; beyond the curve's ends, the line through the two taus nearest the target
  (or the nearest tau where that line is flat or leads back into the curve)."""
  order = np.argsort(taus)
  x, y = taus[order], values[order] - target
  for k in range(len(x) - 1):
    if y[k] == 0 or y[k] * y[k + 1] < 0:
      return float(x[k] - y[k] * (x[k + 1] - x[k]) / (y[k + 1] - y[k]))
  if len(x) < 2:
    return float(x[0])
  i, j = (0, 1) if abs(y[0]) <= abs(y[-1]) else (len(x) - 1, len(x) - 2)
  if y[i] == y[j]:
    return float(x[i])
  guess = x[i] - y[i] * (x[j] - x[i]) / (y[j] - y[i])
  return float(guess) if (guess - x[i]) * (x[j] - x[i]) < 0 else float(x[i])
