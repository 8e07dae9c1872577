"""What a demo run does: its flags as one frozen `DemoSettings`, the two modes (`DEFAULT`, and
`FULL` with --full), and `make_plan`, which resolves them against the model's L_tr into a `Plan`:
the lengths, strategies, report rows, tuned and control tasks, prompt counts and seeds.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from t5align.demo import inputs
from t5align.shipped import assets
from t5align.shipped import train_data

# Strategies the full mode calibrates; all but `TABULATED` are also evaluated (report rows).
# The training-free temperatures of other work sit beside log-length (`calibration.FORMULAS`).
LITERATURE = ('infoscale_head', 'infoscale_model', 'llama4_length', 'yarn_mscale')
# The positional rules (`calibration.parse_name`'s options): the relative bias read by a rule
# alone and with P_max's tau, the joint (rule, tau) choice, and the temperature from layer 1 on
# (the shipped model has 3 encoder layers).
POSITIONAL = ('none:bias=interpolate', 'none:bias=extend', 'pmax:bias=interpolate',
              'pmax:bias=extend', 'pmax:bias=joint', 'pmax:from_layer=1')
STRATEGIES = ('pmax', 'entropy', 'log_length', *LITERATURE, 'prop1', 'prop2', 'pmax_per_layer',
              'pmax_per_head', *POSITIONAL)
TABULATED = ('prop1', 'prop2')  # Calibrated and tabulated, not evaluated.
EVALUATED = tuple(s for s in STRATEGIES if s not in TABULATED)
# Evaluated in the full mode only: per head (its search costs ~2x per layer), the literature's
# formulas (free to calibrate, but each a row of evaluation cells) and the positional rules.
FULL_ONLY = ('pmax_per_head', *LITERATURE, *POSITIONAL)


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
class DemoSettings:
  """One demo run (the command-line flags of `command.main`)."""

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


def make_plan(settings: DemoSettings, reference_length: int) -> Plan:
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
              settings.num_references, tuple(inputs.CALIBRATION_SEED + k for k in range(seeds)))
