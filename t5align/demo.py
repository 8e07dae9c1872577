r"""The main job: the shipped retrieval T5, calibrated and evaluated past its training length.

    python -m t5align.demo [--output_dir=demo_output] [--full] [--controls]
                           [--lengths 512 1024 2048 4096] [--num_examples=N] [--num_samples=N]
                           [--num_references=N] [--calibration_seeds=N] [--strategies S ...]
                           [--model_dir=PATH]

Default (`make demo`): calibrate the encoder temperature per task, as the paper does (each task's
prompts at L_ex against the same task's at L_tr), for line and key-value retrieval at each
length L_ex (2x..16x L_tr) with every evaluated strategy (P_max, entropy, log-length, P_max per
layer); the pooled P_max / entropy / log-length temperatures come from the same sweeps. Then
measure the attention's dispersion and evaluate lines and key-value retrieval at L_tr and each
L_ex with tau = 1 and each strategy, 50 held-out examples per cell.
--controls: passkey (plain and with decoys) evaluated too, at tau = 1 only, as controls (this
model does not lose it).
--full: every task calibrated and evaluated with every row, P_max per head (a row beside P_max
per layer), Propositions 1-2 and the pooled per-layer and per-head calibrations too, and the
temperatures of 5 calibration seeds (their spread reported).
Writes a report folder (report.md, results.json, schedule.json, PNGs, and per evaluated cell
predictions/<row>_<length>_<task>.jsonl with each example's answer and score). Results are
saved cell by cell (atomically); rerunning the same command resumes where it stopped, and a
schedule.json is reused only if it was calibrated for the settings asked.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from t5align import calibration
from t5align import checkpoints
from t5align import gin_cli
from t5align import labels
from t5align import network
from t5align import partitioning
from t5align import report
from t5align import run_identity
from t5align.runtime import batching
from t5align.runtime import fileio
from t5align.runtime import multihost
from t5align.runtime import outputs
from t5align.runtime import validate
from t5align import schedule as schedule_lib
from t5align.shipped import assets
from t5align.shipped import heldout
from t5align.shipped import train_data
from t5align import vocabularies

# Strategies the full mode calibrates; all but `TABULATED` are also evaluated (report rows).
STRATEGIES = ('pmax', 'entropy', 'log_length', 'prop1', 'prop2', 'pmax_per_layer',
              'pmax_per_head')
TABULATED = ('prop1', 'prop2')  # Calibrated and tabulated, not evaluated.
EVALUATED = tuple(s for s in STRATEGIES if s not in TABULATED)
FULL_ONLY = ('pmax_per_head',)  # Evaluated in the full mode only (its search costs ~2x per layer).
# Report rows: 'tau=1' and the strategies, named as every other table names them.
ROW_LABELS = {'tau=1': labels.TAU_ONE, **labels.STRATEGY_LABELS}
CALIBRATION_SEED = 7  # Calibration samples and evaluation examples never share a seed.
EVAL_SEED = 2000


@dataclasses.dataclass(frozen=True)
class Mode:
  """What a run calibrates and evaluates (`DEFAULT`, or `FULL` with --full)."""

  name: str
  strategies: tuple[str, ...]  # Calibrated per task; those not in TABULATED are evaluated.
  tuned_tasks: tuple[str, ...]  # Calibrated and evaluated with every row.
  pooled: tuple[str, ...]  # Strategies also calibrated pooled over the tuned tasks' prompts.
  calibration_seeds: int  # Sampling seeds calibrated; the first one's temperatures are used.


# The default: the tasks where tau matters for this model (passkey stays at 96-100% with tau = 1
# up to 16x L_tr: --controls evaluates it at tau = 1 only), pooled only where the per-task sweeps
# give it for free (Algorithm 1's grid, log-length).
DEFAULT = Mode('default', tuple(s for s in EVALUATED if s not in FULL_ONLY), ('lines', 'kv'),
               ('pmax', 'entropy', 'log_length'), 1)
FULL = Mode('full', STRATEGIES, train_data.TASKS, STRATEGIES, 5)


@dataclasses.dataclass(frozen=True)
class Settings:
  """One demo run (the command-line flags of `main`)."""

  output_dir: str = 'demo_output'
  model_dir: str = assets.ASSET_DIR
  full: bool = False
  controls: bool = False  # Also the tasks not tuned (passkey, passkey_decoys), at tau = 1 only.
  lengths: tuple[int, ...] = ()  # () -> 2x, 4x, 8x and 16x L_tr.
  strategies: tuple[str, ...] = ()  # () -> the mode's.
  num_examples: int = 50  # Evaluation examples per cell.
  # Calibration prompts per task at the longest length; a length L gets num_samples x
  # (longest // L), so every length averages about as many attention rows.
  num_samples: int = 1
  num_references: int = 64  # Prompts per task at L_tr (the target statistic).
  calibration_seeds: int = 0  # 0 -> the mode's.
  batch_size: int = 50
  attention_impl: str = 'blockwise'

  @property
  def mode(self) -> Mode:
    return FULL if self.full else DEFAULT

  def check(self) -> None:
    """Raises ValueError naming the flag at fault and the accepted form."""
    for name in ('num_examples', 'num_samples', 'num_references', 'batch_size'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'--{name}={value!r}: expected a positive integer.')
    seeds = self.calibration_seeds
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 0:
      raise ValueError(f'--calibration_seeds={seeds!r}: expected a positive integer (0: the '
                       "mode's).")
    bad = [L for L in self.lengths if isinstance(L, bool) or not isinstance(L, int) or L < 2]
    if bad:
      raise ValueError(f'--lengths {bad}: expected integers > L_tr.')
    for s in self.strategies:
      if s not in STRATEGIES:
        raise ValueError(f'--strategies {s}: expected some of {" ".join(STRATEGIES)}.')


@dataclasses.dataclass(frozen=True)
class Plan:
  """A run's resolved settings: what is calibrated on which prompts, and what is evaluated."""

  reference_length: int
  lengths: tuple[int, ...]  # L_ex, increasing.
  strategies: tuple[str, ...]
  rows: tuple[str, ...]  # 'tau=1' and the evaluated strategies.
  tuned_tasks: tuple[str, ...]
  control_tasks: tuple[str, ...]  # Evaluated at tau = 1 only.
  pooled: tuple[str, ...]
  samples: Mapping[int, int]  # Calibration prompts per task at each L_ex.
  num_references: int
  seeds: tuple[int, ...]

  @property
  def eval_lengths(self) -> tuple[int, ...]:
    return (self.reference_length, *self.lengths)

  @property
  def tasks(self) -> tuple[str, ...]:
    """Every evaluated task, in `train_data.TASKS` order."""
    return tuple(t for t in train_data.TASKS if t in self.tuned_tasks + self.control_tasks)

  def row_tasks(self, row: str) -> tuple[str, ...]:
    """The tasks evaluated in a row: the controls too at tau = 1, the tuned ones in the others."""
    return self.tasks if row == 'tau=1' else self.tuned_tasks


def make_plan(settings: Settings, reference_length: int) -> Plan:
  mode = settings.mode
  lengths = tuple(sorted(set(settings.lengths))) or tuple(reference_length * k for k in (2, 4, 8,
                                                                                        16))
  for L in lengths:
    if L <= reference_length:
      raise ValueError(f'--lengths {L}: every length must exceed L_tr = {reference_length}.')
  strategies = tuple(settings.strategies) or mode.strategies
  samples = {L: settings.num_samples * max(1, lengths[-1] // L) for L in lengths}
  seeds = settings.calibration_seeds or mode.calibration_seeds
  controls = tuple(t for t in train_data.TASKS
                   if settings.controls and t not in mode.tuned_tasks)
  return Plan(reference_length, lengths, strategies,
              ('tau=1', *(s for s in strategies if s not in TABULATED)), mode.tuned_tasks,
              controls, tuple(s for s in strategies if s in mode.pooled), samples,
              settings.num_references, tuple(CALIBRATION_SEED + k for k in range(seeds)))


def _log(message: str, start: float) -> None:
  if multihost.is_writer():
    print(f'[{time.time() - start:7.1f}s] {message}', file=sys.stderr, flush=True)


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
# sorted logits (shared by the closed forms) in passes' worth of time; log-length computes
# nothing.
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
    if s != 'log_length' and (search == 'bisect' or search not in made):
      n = SWEEP_PASSES[search] * (SEARCH_SCOPE_PASSES[scope] if search == 'bisect' else 1.0)
    made.add(search)
    passes[s] = n
  return passes


def calibration_tokens(vocab, length: int, per_task: int, seed: int = CALIBRATION_SEED
                       ) -> np.ndarray:
  """`[tasks * per_task, length]` int32 held-out prompts of every task filled to `length`.

  A prompt fills to at most `length` tokens (whole sentences/records); the rest is padding.
  """
  return np.concatenate([task_prompts(vocab, task, length, per_task, seed)
                         for task in train_data.TASKS])


def task_prompts(vocab, task: str, length: int, count: int, seed: int = CALIBRATION_SEED
                 ) -> np.ndarray:
  """`[count, length]` int32: a task's held-out prompts filled to `length` (0-padded)."""
  rows = [ex.input_ids for ex in train_data.eval_examples(task, vocab, length, count, seed)]
  return batching.pad_tokens(rows, multiple=length, min_length=length)


def task_calibration_inputs(vocab, task: str, lengths: Sequence[int], reference_length: int,
                            per_task: int | Mapping[int, int], seed: int = CALIBRATION_SEED,
                            num_references: int | None = None) -> list[tuple]:
  """Per length L_ex: (`[n_L, L_ex]` the task's held-out prompts filled to L_ex,
  `[n_ref, L_tr]` the same task's prompts at L_tr), for `calibration.calibrate_tasks`: the
  paper's per-task calibration, its L_tr reference being the task at its training length.

  `per_task`: n_L, one count for every length or {L_ex: count}; `num_references`: n_ref
  (default: `per_task` if it is one count).
  """
  counts = per_task if isinstance(per_task, Mapping) else {L: per_task for L in lengths}
  if num_references is None:
    if isinstance(per_task, Mapping):
      raise ValueError('num_references is needed when per_task is a mapping.')
    num_references = per_task
  reference = task_prompts(vocab, task, reference_length, num_references, seed)
  return [(task_prompts(vocab, task, L, counts[L], seed), reference) for L in lengths]


def row_temperature(schedule: schedule_lib.TemperatureSchedule, row: str, length: int
                    ) -> float | np.ndarray:
  """The encoder temperature of a report row at `length`: 1, or the strategy's calibrated tau
  (a per-layer tau as `[1, layers]`, a per-head one as `[1, layers, heads]`: never ambiguous)."""
  if row == 'tau=1':
    return 1.0
  tau = np.asarray(schedule.tau_for_length(length, row), np.float32)
  return float(tau) if tau.ndim == 0 else tau[None]


def encoder_temperature(tau: Any, layers: int) -> np.ndarray:
  """float32 `[1, layers]` for a scalar or per-layer tau (which the encoder applies alike, so one
  compiled decoder per length serves both); a `[1, layers, heads]` tau as it is."""
  tau = np.asarray(tau, np.float32)
  return tau if tau.ndim == 3 else np.broadcast_to(tau.reshape(1, -1), (1, layers)).copy()


def check_vocabulary(model_dir: str) -> None:
  """Refuses, before any weight is read, a model directory whose vocabulary has more pieces than
  its checkpoint embeds (those ids would have no embedding row)."""
  checkpoint = assets.checkpoint_dir(model_dir)
  path = os.path.join(model_dir, assets.VOCAB_FILE)
  validate.vocabulary_fits(vocabularies.SentencePieceVocabulary(path, t5_ids=True).vocab_size,
                           checkpoints.embedding_rows(checkpoint),
                           vocabulary=f'--model_dir vocabulary {path}',
                           model=f'checkpoint {checkpoint}')


def reusable_schedule(path: str, saved: Mapping[str, Any], identity: Mapping[str, Any],
                      log: Callable[[str], None]) -> schedule_lib.TemperatureSchedule | None:
  """The schedule saved at `path` if its provenance's run identity ('identity') is `identity`
  (`run_identity.check_same`: checkpoint and vocabulary content, lengths, strategies, tasks,
  prompts, seeds, dtypes, attention); else None, after logging each differing field (the caller
  recalibrates and replaces it)."""
  recorded = (saved.get('provenance') or {}).get('identity')
  try:
    run_identity.check_same(recorded, identity, what=f'temperature schedule {path}',
                            hint='Recalibrating; the new calibration replaces it.')
  except run_identity.RunMismatchError as e:
    log(str(e))
    return None
  return schedule_lib.TemperatureSchedule.from_dict(saved, source=path)


class Results:
  """results.json: settings plus one accuracy cell per (row, task, length), saved as it grows."""

  def __init__(self, path: str, settings: Mapping[str, Any]):
    self.path = path
    settings = json.loads(json.dumps(settings))
    self.data = multihost.read_on_writer(lambda: self._read(settings), f'reading {path}')

  def _read(self, settings: Mapping[str, Any]) -> dict[str, Any]:
    if not fileio.exists(self.path):
      return {'settings': settings, 'accuracy': {}}
    old = outputs.read_json(self.path, 'demo results')
    if not isinstance(old, dict) or not isinstance(old.get('accuracy'), dict):
      raise ValueError(f'demo results {self.path} lack an "accuracy" object; delete the file to '
                       'start over.')
    # The settings hold the run identity: the model's and vocabulary's content, not their paths.
    run_identity.check_same(old.get('settings'), settings, what=f'demo results {self.path}',
                            hint='Use another --output_dir, or delete it to start over.',
                            ignore=(*run_identity.INFORMATIONAL, 'model_dir'))
    return old

  def _save(self) -> None:
    multihost.on_writer(lambda: fileio.write_json_atomic(self.path, self.data, sort_keys=False),
                        f'writing {self.path}')

  def get(self, row: str, task: str, length: int) -> float | None:
    return self.data['accuracy'].get(row, {}).get(task, {}).get(str(length))

  def put(self, row: str, task: str, length: int, value: float) -> None:
    self.put_cells([(row, task, length, value)])

  def put_cells(self, cells: Sequence[tuple[str, str, int, float]]) -> None:
    """Stores (row, task, length, accuracy) cells; one write of the file for all of them."""
    for row, task, length, value in cells:
      self.data['accuracy'].setdefault(row, {}).setdefault(task, {})[str(length)] = value
    self._save()

  def put_section(self, key: str, value: Any) -> None:
    self.data[key] = value
    self._save()


def _cell(results: Mapping[str, Any], row: str, task: str, length: int) -> float | None:
  return results['accuracy'].get(row, {}).get(task, {}).get(str(length))


def accuracy_table(results: Mapping[str, Any], rows: Sequence[str], task: str,
                   lengths: Sequence[int]) -> str:
  """Markdown: one row per strategy evaluated on `task`, one column per length, accuracy in
  percent with its 95% Wilson interval over the run's `num_examples` examples ('90 [79-96]')."""
  trials = results['settings']['num_examples']
  table = []
  for row in rows:
    cells = [_cell(results, row, task, L) for L in lengths]
    if all(c is None for c in cells):
      continue
    table.append([ROW_LABELS[row],
                  *('' if c is None else report.accuracy_cell(c, trials) for c in cells)])
  return report.markdown_table(['', *map(str, lengths)], table)


def headline_table(results: Mapping[str, Any], plan: Plan) -> str:
  """Markdown: strategy x length, each cell the tuned tasks' accuracies (%) in `TASKS` order;
  with --controls one more row gives the control tasks at tau = 1."""
  tuned = [t for t in plan.tasks if t in plan.tuned_tasks]
  controls = list(plan.control_tasks)
  header = [f'accuracy % ({" / ".join(tuned)})',
            *(f'{L} (L_tr)' if L == plan.reference_length else str(L)
              for L in plan.eval_lengths)]
  fmt = lambda row, tasks, L: '/'.join(
      '-' if _cell(results, row, t, L) is None else f'{_cell(results, row, t, L):.0f}'
      for t in tasks)
  table = [[ROW_LABELS[row], *(fmt(row, tuned, L) for L in plan.eval_lengths)]
           for row in plan.rows]
  if controls:
    table.append([f'{labels.TAU_ONE}: {" / ".join(controls)} (control)',
                  *(fmt('tau=1', controls, L) for L in plan.eval_lengths)])
  return report.markdown_table(header, table)


def observations(results: Mapping[str, Any], plan: Plan) -> list[str]:
  """Plain statements read off the numbers, whatever they show (no tuning, no selection):
  'better' / 'worse' than tau = 1 only where the 95% intervals do not overlap."""
  trials = results['settings']['num_examples']
  lengths = plan.eval_lengths
  out = []
  for task in plan.tasks:
    base = [_cell(results, 'tau=1', task, L) for L in lengths]
    drop = base[0] - min(base[1:]) if len(base) > 1 else 0.0
    control = '' if task in plan.tuned_tasks else ' (control: evaluated at tau = 1 only)'
    out.append(f'{task}{control}: tau = 1 scores {base[0]:.0f}% at L_tr = {lengths[0]} and '
               f'{", ".join(f"{b:.0f}% at {L}" for b, L in zip(base[1:], lengths[1:]))} '
               f'(largest drop {drop:.0f} points).')
    if task not in plan.tuned_tasks:
      continue
    for L in lengths[1:]:
      cell = {r: _cell(results, r, task, L) for r in plan.rows}
      base = cell['tau=1']
      verdict = {r: report.compare_accuracies(cell[r], base, trials) for r in plan.rows[1:]}
      listed = lambda word: ', '.join(f'{ROW_LABELS[r]} {cell[r]:.0f}%'
                                      for r in plan.rows[1:] if verdict[r] == word)
      parts = [f'{word} than tau = 1 ({base:.0f}%): {listed(word)}' for word in ('better', 'worse')
               if listed(word)]
      if listed('within noise'):
        parts.append(f'within noise of tau = 1 ({base:.0f}%; 95% intervals overlap): '
                     f'{listed("within noise")}')
      out.append(f'  at {L}: ' + '; '.join(parts) + '.')
  return out


def plot_accuracy(results: Mapping[str, Any], plan: Plan, path: str) -> None:
  """Accuracy vs length, one panel per task, one line per row with its 95% Wilson interval,
  L_tr marked; the legend below the panels."""
  from t5align.calibration import analysis  # pylint: disable=g-import-not-at-top
  plt = analysis.pyplot()
  trials = results['settings']['num_examples']
  lengths = np.asarray(plan.eval_lengths, np.float64)
  tasks = plan.tasks
  fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.9), sharey=True,
                           squeeze=False)
  for ax, task in zip(axes.flat, tasks):
    rows = [r for r in plan.rows if task in plan.row_tasks(r)]
    for i, row in enumerate(rows):
      ys = np.array([_cell(results, row, task, L) for L in plan.eval_lengths], np.float64)
      bounds = np.array([report.accuracy_interval(y, trials) for y in ys])  # [l, 2]
      # Rows spread a little sideways (x 2^(+-0.06)) so that their intervals stay readable.
      xs = lengths * 2.0 ** (0.06 * (i - (len(rows) - 1) / 2))
      errors = np.maximum(np.stack([ys - bounds[:, 0], bounds[:, 1] - ys]), 0.0)  # [2, l]
      ax.errorbar(xs, ys, yerr=errors, marker='o', ms=4,
                  capsize=2, lw=1.2, label=ROW_LABELS[row], color=f'C{plan.rows.index(row)}')
    ax.axvline(plan.reference_length, color='0.5', ls='--', lw=1)
    ax.text(plan.reference_length * 1.06, 3, 'L_tr', color='0.4', fontsize=8)
    ax.set_xscale('log', base=2)
    ax.set_xticks(lengths, [str(L) for L in plan.eval_lengths])
    ax.minorticks_off()
    ax.set_title(task if task in plan.tuned_tasks else f'{task} (control, tau = 1)', fontsize=10)
    ax.set_xlabel('input length (tokens)')
    ax.set_ylim(-3, 103)
  axes.flat[0].set_ylabel(f'accuracy (%), {trials} examples, 95% interval')
  # The legend of the panel with every row, below the panels (never over a panel's lines).
  handles, names = max((ax.get_legend_handles_labels() for ax in axes.flat),
                       key=lambda h: len(h[1]))
  fig.legend(handles, names, loc='lower center', ncol=len(names), fontsize=9, frameon=False)
  fig.tight_layout(rect=(0, 0.08, 1, 1))
  fileio.save_figure(fig, path, dpi=110)
  plt.close(fig)


def _layer_taus(tau: Any) -> np.ndarray:
  """A tau's values per layer: a per-head `[layers, heads]` tau's mean over heads `[layers]`."""
  tau = np.asarray(tau, np.float64)
  return tau.mean(-1) if tau.ndim == 2 else tau.ravel()


def temperature_table(tasks: Mapping[str, Mapping[str, Sequence[calibration.Calibration]]],
                      strategies: Sequence[str], lengths: Sequence[int]) -> str:
  """Plain text: per task and strategy, the calibrated tau at each length (per-layer taus
  joined by '/'; per-head ones as each layer's mean over its heads, joined by '/')."""
  head = f'{"task":<16}{"strategy":<24}' + ''.join(f'{L:>18}' for L in lengths)
  lines = [head, '-' * len(head)]
  for task, cals in tasks.items():
    for s in strategies:
      by_length = {c.length: c for c in cals.get(s, ())}
      cells = ['-' if L not in by_length else '/'.join(
          f'{t:.3f}' for t in _layer_taus(by_length[L].tau)) + ('*' if by_length[L].clamped
                                                                 else '') for L in lengths]
      lines.append(f'{task:<16}{labels.strategy_label(s):<24}' + ''.join(f'{c:>18}'
                                                                          for c in cells))
  return '\n'.join(lines)


def calibration_spread(per_seed: Sequence[Mapping[str, Mapping[str, Sequence[Any]]]]
                       ) -> dict[str, dict[str, dict[str, Any]]]:
  """{task: {strategy: {L: {'taus': [per seed], 'spread': max - min (largest over layers)}}}}
  of the calibrations of several sampling seeds (`calibrate_per_task` results)."""
  out = {}
  for task, cals in per_seed[0].items():
    for s, items in cals.items():
      for c in items:
        taus = [np.ravel(next(x.tau for x in seed[task][s] if x.length == c.length)).tolist()
                for seed in per_seed]
        values = np.asarray(taus, np.float64)  # [seeds, layers or 1]
        out.setdefault(task, {}).setdefault(s, {})[str(c.length)] = {
            'taus': [t[0] if len(t) == 1 else t for t in taus],
            'spread': float(np.max(values.max(0) - values.min(0)))}
  return out


def spread_table(spread: Mapping[str, Any], seeds: Sequence[int], lengths: Sequence[int]) -> str:
  """Plain text: per task and strategy, the first seed's tau [the range over every seed] at each
  length (per-layer and per-head strategies: their largest spread over layers and heads)."""
  head = f'{"task":<16}{"strategy":<24}' + ''.join(f'{L:>20}' for L in lengths)
  lines = [f'Calibrated tau [range over seeds {", ".join(map(str, seeds))}]; per layer (head): '
           'the largest range over seeds of one layer\'s (head\'s) tau', head, '-' * len(head)]
  for task, by_strategy in spread.items():
    for s, by_length in by_strategy.items():
      cells = []
      for L in lengths:
        item = by_length.get(str(L))
        if item is None:
          cells.append('-')
          continue
        values = np.asarray(item['taus'], np.float64).reshape(len(item['taus']), -1)
        if values.shape[1] == 1:
          cells.append(f'{values[0, 0]:.3f} [{values.min():.3f}-{values.max():.3f}]')
        else:
          cells.append(f'range {item["spread"]:.3f}')
      lines.append(f'{task:<16}{labels.strategy_label(s):<24}' + ''.join(f'{c:>20}'
                                                                          for c in cells))
  return '\n'.join(lines)


def calibrate_per_task(params, config, prompts: Mapping[str, Mapping[int, np.ndarray]],
                       references: Mapping[str, np.ndarray], plan: Plan, *,
                       settings: calibration.Settings, memo: calibration.Memo,
                       progress: Callable[[calibration.Calibration, str], None]
                       ) -> dict[str, dict[str, tuple[calibration.Calibration, ...]]]:
  """Each tuned task calibrated on its own prompts at every L_ex against its own at L_tr,
  longest length first (so the progress estimate measures the dominant work first)."""
  out = {task: {s: [] for s in plan.strategies} for task in prompts}
  for L in reversed(plan.lengths):
    for task in prompts:
      found = calibration.calibrate_tasks(
          params, config, {task: (prompts[task][L], references[task])}, plan.strategies,
          reference_length=plan.reference_length, settings=settings, memo=memo,
          progress=lambda d, t, c, task=task: progress(c, task))
      for s, items in found[task].items():
        out[task][s].extend(items)
  return {t: {s: tuple(v) for s, v in cals.items()} for t, cals in out.items()}


def run(settings: Settings) -> dict[str, Any]:
  """Runs (or resumes) the demo; returns the results dict also written to results.json."""
  settings.check()
  with claim_outputs(settings.output_dir):
    return _execute(settings)


@contextlib.contextmanager
def claim_outputs(output_dir: str):
  """Locks the output folder and its schedule.json with the per-file lock calibrate takes on
  its OUTPUT_PATH, so a calibration writing the same file and the demo exclude each other."""
  with outputs.claim(output_dir, '--output_dir'), outputs.claim(
      os.path.join(output_dir, 'schedule.json'), '--output_dir schedule.json', is_file=True):
    yield


def _execute(settings: Settings) -> dict[str, Any]:
  from t5align.calibration import analysis  # pylint: disable=g-import-not-at-top
  start = time.time()
  phases = Phases()
  output_dir = settings.output_dir
  with phases('setup'):
    check_vocabulary(settings.model_dir)
    params, config, vocab = assets.load_shipped(settings.model_dir)
    config = dataclasses.replace(config, attention_impl=settings.attention_impl,
                                 dropout_rate=0.0)
    plan = make_plan(settings, assets.training_length(settings.model_dir))
    multihost.on_writer(lambda: fileio.makedirs(output_dir), f'creating {output_dir}')
    # Several devices (or processes): calibration examples split over 'data'. Evaluation runs
    # on every process's first device with host parameters (the model is small).
    mesh = (partitioning.calibration_mesh(1, jax.device_count(), 1) if jax.device_count() > 1
            else None)
    _log(f'model {config.num_encoder_layers}+{config.num_decoder_layers} layers, L_tr = '
         f'{plan.reference_length}, lengths {list(plan.lengths)}, {settings.mode.name} mode',
         start)
    # The calibration prompts of every seed: the first seed's temperatures are used, the others
    # measure how much the temperatures move with the sample.
    prompts = [{task: {L: task_prompts(vocab, task, L, plan.samples[L], seed)
                       for L in plan.lengths} for task in plan.tuned_tasks}
               for seed in plan.seeds]
    references = [{task: task_prompts(vocab, task, plan.reference_length, plan.num_references,
                                      seed) for task in plan.tuned_tasks} for seed in plan.seeds]
    identity = calibration_identity(settings, plan, config, prompts, references)
    results = Results(os.path.join(output_dir, 'results.json'), {
        'model_dir': os.path.abspath(settings.model_dir), 'mode': settings.mode.name,
        **identity, 'rows': list(plan.rows), 'control_tasks': list(plan.control_tasks),
        'num_examples': settings.num_examples,
        'calibration_seed': plan.seeds[0], 'eval_seed': EVAL_SEED, 'calibration': 'per task'})
    schedule_path = os.path.join(output_dir, 'schedule.json')
    saved = multihost.read_on_writer(
        lambda: outputs.read_json(schedule_path, 'temperature schedule')
        if fileio.exists(schedule_path) else None, f'reading {schedule_path}')

  memo = calibration.Memo()  # The analysis reuses the calibration's sweeps.
  schedule = None if saved is None else reusable_schedule(
      schedule_path, saved, identity, lambda message: _log(message, start))
  if schedule is not None:
    _log(f'reusing {schedule_path} (its run identity is this calibration\'s)', start)
  else:
    with phases('calibration'):
      schedule = _calibrate(params, config, plan, prompts, references, identity, memo, mesh,
                            start)
      multihost.on_writer(lambda: schedule.save(schedule_path), f'writing {schedule_path}')
  temperatures = '\n\n'.join(
      [schedule.table(), 'Per-task temperatures (the ones evaluated)',
       temperature_table(schedule.tasks, plan.strategies, plan.lengths)] +
      [schedule.task_table(s) for s in plan.pooled if s in ('pmax', 'entropy')])
  spread = schedule.provenance.get('calibration_spread')
  if multihost.is_writer():
    print(temperatures, file=sys.stderr)

  # Dispersion and the analysis figures, from the calibration's sweeps of the first seed's
  # prompts (pooled over the tasks); layer 0's sorted logits from one prompt per task at the
  # longest length and as many attention rows at each shorter one.
  with phases('analysis'):
    groups = {L: [prompts[0][t][L] for t in plan.tuned_tasks] for L in plan.lengths}
    groups[plan.reference_length] = [references[0][t] for t in plan.tuned_tasks]
    longest = plan.lengths[-1]
    layer0 = {L: np.concatenate([g[:max(1, longest // L)] for g in groups[L]]) for L in groups}
    numbers = analysis.collect(params, config, groups, plan.lengths,
                               reference_length=plan.reference_length, mesh=mesh, memo=memo,
                               layer0_tokens=layer0, tau_batch_size=1)
    multihost.on_writer(lambda: analysis.write_analysis(numbers, output_dir, schedule),
                        f'writing the analysis to {output_dir}')
    dispersion = analysis.dispersion_table(numbers)
    one = list(numbers['grid']).index(1.0)
    results.put_section('dispersion', {
        str(L): {k: numbers['statistics'][str(L)][k][one] for k in ('pmax', 'entropy')}
        for L in numbers['lengths']})
  _log(f'dispersion and analysis figures written ({phases.seconds["analysis_s"]:.0f} s)', start)

  with phases('evaluation'):
    cell_seconds = _evaluate(params, config, vocab, plan, schedule, results, settings, start)
  notes = observations(results.data, plan)

  def write():
    plot_accuracy(results.data, plan, os.path.join(output_dir, 'accuracy.png'))
    timing = {**phases.totals(), 'cells': cell_seconds}
    results.put_section('timing', timing)
    write_report(output_dir, results.data, plan, temperatures, spread, dispersion, notes,
                 timing)
    _log(f'wrote {output_dir}/report.md; wall time {timing_summary(timing)}', start)

  multihost.on_writer(write, f'writing {output_dir}/report.md')
  multihost.barrier('t5align.demo:done')
  return results.data


def calibration_identity(settings: Settings, plan: Plan, config: network.T5Config, prompts,
                         references) -> dict[str, Any]:
  """The run identity of a calibration (`run_identity.make`): the checkpoint's and vocabulary's
  content fingerprints, lengths, strategies, tasks, the prompts (counts, seeds and a fingerprint
  of their tokens), dtypes and the attention implementation."""
  tokens = [x for p, r in zip(prompts, references) for task in plan.tuned_tasks
            for x in (*p[task].values(), r[task])]
  return run_identity.make(
      checkpoint=assets.checkpoint_dir(settings.model_dir),
      vocabulary=os.path.join(settings.model_dir, assets.VOCAB_FILE), gin=False, settings={
          'reference_length': plan.reference_length, 'lengths': list(plan.lengths),
          'strategies': list(plan.strategies), 'tasks': list(plan.tuned_tasks),
          'pooled_strategies': list(plan.pooled),
          'prompts_per_length': {str(L): n for L, n in plan.samples.items()},
          'num_references': plan.num_references, 'seeds': list(plan.seeds),
          'prompts_sha256': run_identity.array_fingerprint(tokens),
          'dtype': np.dtype(config.dtype).name, 'params_dtype': 'float32',
          'attention_impl': settings.attention_impl})


def _calibrate(params, config, plan: Plan, prompts, references, identity, memo, mesh,
               start: float) -> schedule_lib.TemperatureSchedule:
  """The per-task calibrations of every seed, the pooled one of the first, as a schedule."""
  # Progress: a piece per (task, seed, length, strategy), the pooled strategies after them.
  pieces = {}
  for k in range(len(plan.seeds)):
    for task in plan.tuned_tasks:
      for L in plan.lengths:
        for s, n in calibration_passes(plan.strategies).items():
          pieces[(task, k, L, s)] = (L, n * plan.samples[L])
  for L in plan.lengths:
    for s, n in calibration_passes(plan.pooled, done=('grid',)).items():
      pieces[('pooled', 0, L, s)] = (L, n * plan.samples[L] * len(plan.tuned_tasks))
  eta = Eta(pieces)

  def progress(c: calibration.Calibration, task: str, k: int) -> None:
    where = task if len(plan.seeds) == 1 or task == 'pooled' else f'{task} (seed {plan.seeds[k]})'
    left = eta.advance((task, k, c.length, c.strategy))
    _log(f'calibrated {len(eta.finished)}/{len(pieces)} {where}: {c.strategy} @ {c.length} -> '
         f'tau {np.round(c.tau, 3).tolist()}{" (calibration" + left[1:] + ")" if left else ""}',
         start)

  settings = calibration.Settings(mesh=mesh, tau_batch_size=1)
  per_seed = []
  for k in range(len(plan.seeds)):
    per_seed.append(calibrate_per_task(
        params, config, prompts[k], references[k], plan, settings=settings, memo=memo,
        progress=lambda c, task, k=k: progress(c, task, k)))
  # Pooled over the tuned tasks: the grid strategies from the per-task sweeps (computing
  # nothing), the others (full mode) searched on the pooled prompts.
  pooled_inputs = []
  refs = [references[0][t] for t in plan.tuned_tasks]
  memo.pooled_stats(params, config, refs, [1.0], **settings.stats_kwargs())
  for L in plan.lengths:
    groups = [prompts[0][t][L] for t in plan.tuned_tasks]
    if 'grid' in {calibration.parse_strategy(s)[1] for s in plan.pooled}:
      memo.pooled_stats(params, config, groups, settings.grid, **settings.stats_kwargs())
    pooled_inputs.append((np.concatenate(groups), np.concatenate(refs)))
  pooled = calibration.calibrate_tasks(
      params, config, {'pooled': list(reversed(pooled_inputs))}, plan.pooled,
      reference_length=plan.reference_length, settings=settings, memo=memo,
      progress=lambda d, t, c: progress(c, 'pooled', 0))['pooled']
  provenance = {
      'identity': identity, 'source': 'held-out prompts of ' + ', '.join(plan.tuned_tasks),
      'calibration': 'per task (tasks); pooled over the tasks (calibrations)'}
  if len(plan.seeds) > 1:
    provenance['calibration_spread'] = {'seeds': list(plan.seeds),
                                        'tasks': calibration_spread(per_seed)}
  return schedule_lib.TemperatureSchedule(
      reference_length=plan.reference_length, calibrations=pooled, strategy=plan.strategies[0],
      provenance=provenance, tasks=per_seed[0])


def _evaluate(params, config, vocab, plan: Plan, schedule, results: Results,
              settings: Settings, start: float) -> list[dict[str, Any]]:
  """Evaluates every cell not in `results` yet, longest length first; returns each evaluated
  cell's seconds. A row whose temperature for a task at L equals an earlier row's (at L_tr
  every strategy's is 1 by construction) copies that cell instead."""
  model = network.Transformer(config)
  layers = config.num_encoder_layers
  cells, copies = [], []
  for L in reversed(plan.eval_lengths):
    seen = []  # (row, tau, task) evaluated at L
    for row in plan.rows:
      for task in plan.row_tasks(row):
        # Each task at the temperature calibrated on it (per task, as the paper does).
        tau = encoder_temperature(
            1.0 if L == plan.reference_length or row == 'tau=1'
            else row_temperature(schedule.for_task(task), row, L), layers)
        same = next((r for r, t, k in seen if k == task and t.shape == tau.shape
                     and np.array_equal(t, tau)), None)
        if same is None:
          seen.append((row, tau, task))
          if results.get(row, task, L) is None:
            cells.append((L, row, tau, task))
        else:
          copies.append((L, row, same, task))
  # One compiled decoder per length: every task decodes the longest answer's steps.
  decode_length = max(heldout.DECODE_LENGTH.values())
  eta = Eta({i: (L, settings.num_examples) for i, (L, *_) in enumerate(cells)})
  seconds = []
  for i, (L, row, tau, task) in enumerate(cells):
    compiles = i == 0 or cells[i - 1][0] != L
    t0 = time.time()
    records = heldout.retrieval_predictions(
        model, params, vocab, tasks=[task], length=L, num_examples=settings.num_examples,
        seed=EVAL_SEED, batch_size=min(settings.batch_size, settings.num_examples),
        temperature=tau, decode_length=decode_length)
    write_predictions(settings.output_dir, row, L, records)
    value = heldout.accuracy(records)[task]
    results.put(row, task, L, value)
    seconds.append({'length': L, 'row': row, 'task': task, 'compiled': compiles,
                    'seconds': round(time.time() - t0, 2)})
    _log(f'{ROW_LABELS[row]:>20} @ {L:>5} {task}: {value:.0f}% '
         f'(cell {i + 1}/{len(cells)}{eta.advance(i)})', start)
  results.put_cells([(row, task, L, results.get(same, task, L)) for L, row, same, task in copies])
  return seconds


def predictions_path(output_dir: str, row: str, length: int, task: str) -> str:
  """predictions/<row>_<length>_<task>.jsonl: an evaluated cell's per-example records."""
  return os.path.join(output_dir, 'predictions', f'{row}_{length}_{task}.jsonl')


def write_predictions(output_dir: str, row: str, length: int,
                      records: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
  """One JSONL file per (row, length, task) cell, written atomically (`heldout` records)."""
  def write():
    for task, items in records.items():
      path = predictions_path(output_dir, row, length, task)
      fileio.makedirs(os.path.dirname(path))
      fileio.write_atomic(path, ''.join(json.dumps(r, sort_keys=True) + '\n' for r in items))
  multihost.on_writer(write, f'writing {output_dir}/predictions')


def timing_summary(timing: Mapping[str, Any]) -> str:
  """'301 s (setup 9 s, calibration 80 s, ...; 530 CPU s)' from a `Phases` record."""
  parts = [f'{name} {timing[f"{name}_s"]:.0f} s' for name in
           ('setup', 'calibration', 'analysis', 'evaluation') if f'{name}_s' in timing]
  if 'calibration_s' not in timing:
    parts.insert(1, 'calibration reused')
  return (f'{timing.get("total_s", 0):.0f} s ({", ".join(parts)}; '
          f'{timing.get("total_cpu_s", 0):.0f} CPU s)')


def _count(n: int, noun: str) -> str:
  return f'{n} {noun}' + ('' if n == 1 else 's')


def calibration_sample(plan: Plan) -> str:
  """What the temperatures were calibrated on, e.g. 'Temperatures calibrated per task (lines,
  kv) on 1 prompt of the task at 4096 tokens, 2 prompts at 2048, ... against 64 of its prompts
  at L_tr = 256 (sampling seed 7).'"""
  counts = [f'{_count(n, "prompt")} at {L}' for L, n in sorted(plan.samples.items(),
                                                                 reverse=True)]
  counts[0] = counts[0].replace(' at ', ' of the task at ', 1) + ' tokens'
  seeds = plan.seeds
  seed = (f'sampling seed {seeds[0]}' if len(seeds) == 1 else
          f'sampling seed {seeds[0]}; the calibration repeated with seeds '
          f'{", ".join(map(str, seeds[1:]))} for the spread below')
  return (f'Temperatures calibrated per task ({", ".join(plan.tuned_tasks)}) on '
          f'{", ".join(counts)} against {plan.num_references} of its prompts at L_tr = '
          f'{plan.reference_length} ({seed}).')


def write_report(output_dir: str, results: Mapping[str, Any], plan: Plan, temperatures: str,
                 spread: Mapping[str, Any] | None, dispersion: str, notes: Sequence[str],
                 timing: Mapping[str, Any]) -> None:
  """report.md: what was run, the numbers, and what they show."""
  s = results['settings']
  controls = plan.control_tasks
  parts = [
      '# t5align demo: attention alignment on the shipped retrieval T5', '',
      f'Model: `{s["model_dir"]}` (trained by the project at L_tr = {s["reference_length"]}). '
      f'Accuracy (%) on {s["num_examples"]} held-out examples per task and length (seed '
      f'{s["eval_seed"]}). {calibration_sample(plan)} '
      + (f'{" and ".join(controls)}: evaluated at tau = 1 only, as controls. ' if controls else
         '`--controls` adds passkey (plain and with decoys) at tau = 1 only, as controls. '
         if plan.tuned_tasks != train_data.TASKS else '')
      + f'Encoder attention: {s["attention_impl"]}. Mode: {s["mode"]}. Wall time of this run: '
      f'{timing_summary(timing)}.', '',
      '## Headline', '', headline_table(results, plan), '',
      '## What the numbers show', '',
      'Better or worse than tau = 1 only where the two 95% Wilson intervals do not overlap.', '',
      *[f'- {n}' if not n.startswith('  ') else f'  - {n[2:]}' for n in notes], '',
      '## Temperatures', '', '```', temperatures, '```', '',
      '## Calibration sample', '',
  ]
  if spread:
    parts += [f'The per-task calibration repeated on the prompts of {len(spread["seeds"])} '
              'sampling seeds (the same counts each); the first seed\'s temperatures are the ones '
              'evaluated.', '', '```', spread_table(spread['tasks'], spread['seeds'],
                                                    plan.lengths), '```', '']
  else:
    parts += [f'One sampling seed ({plan.seeds[0]}). `--calibration_seeds 5` (or `--full`) '
              'repeats the calibration on 4 more seeds and reports the temperatures\' spread.',
              '']
  parts += ['## Dispersion (tau = 1; pooled over the calibrated tasks\' prompts)', '', '```',
            dispersion, '```', '']
  for task in plan.tasks:
    parts += [f'## Accuracy: {task}', '',
              'Accuracy (%) [95% Wilson interval] over the examples of each cell.', '',
              accuracy_table(results, plan.rows, task, plan.eval_lengths), '']
  parts += ['## Figures', '', '![accuracy](accuracy.png)', '',
            'Also: the statistic-vs-tau curves, temperature curves, relative-position bias and '
            'QQ plot PNGs beside this file (see analysis.json for their numbers).', '']
  fileio.write_atomic(os.path.join(output_dir, 'report.md'), '\n'.join(parts))


def main(argv: Sequence[str] | None = None) -> None:
  gin_cli.log_plainly()
  multihost.initialize()  # First: before anything starts a JAX backend.
  parser = argparse.ArgumentParser(prog='python -m t5align.demo', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  defaults = Settings()
  parser.add_argument('--output_dir', default=defaults.output_dir)
  parser.add_argument('--model_dir', default=defaults.model_dir)
  parser.add_argument('--full', action='store_true',
                      help='every task with every strategy (P_max per head too), Props. 1-2, '
                      'the pooled per-layer and per-head calibrations and 5 calibration seeds '
                      '(see README for its time)')
  parser.add_argument('--controls', action='store_true',
                      help='also evaluate passkey and passkey_decoys at tau = 1 only, as '
                      'controls (see README for its time)')
  parser.add_argument('--lengths', type=int, nargs='+', default=[],
                      help='L_ex (default: 2x, 4x, 8x, 16x L_tr)')
  parser.add_argument('--strategies', nargs='+', default=[],
                      help=f'calibrated strategies (default: the mode\'s; any of {STRATEGIES})')
  parser.add_argument('--num_examples', type=int, default=defaults.num_examples,
                      help='evaluation examples per cell')
  parser.add_argument('--num_samples', type=int, default=defaults.num_samples,
                      help='calibration prompts per task at the longest length (x L_max / L at '
                      'a shorter L)')
  parser.add_argument('--num_references', type=int, default=defaults.num_references,
                      help='calibration prompts per task at L_tr')
  parser.add_argument('--calibration_seeds', type=int, default=0,
                      help='sampling seeds calibrated, their spread reported (default: 1; '
                      '--full: 5)')
  parser.add_argument('--attention_impl', default=defaults.attention_impl)
  args = parser.parse_args(argv)
  settings = Settings(
      output_dir=args.output_dir, model_dir=args.model_dir, full=args.full,
      controls=args.controls,
      lengths=tuple(args.lengths), strategies=tuple(args.strategies),
      num_examples=args.num_examples, num_samples=args.num_samples,
      num_references=args.num_references, calibration_seeds=args.calibration_seeds,
      batch_size=args.num_examples, attention_impl=args.attention_impl)
  try:
    settings.check()
  except ValueError as e:
    parser.error(str(e))
  run(settings)


if __name__ == '__main__':
  main()
