"""Row labels of the paper's tables: the one name of each temperature strategy, for every printout.

`t5align.eval` (metrics.json 'label'), `t5align.report`, `schedule.TemperatureSchedule.table` and
the demo's report all name a strategy through `strategy_label`. Nothing here imports JAX.
"""
from __future__ import annotations

TAU_ONE = 'tau = 1'
# Every `calibration.STRATEGIES` name (tests/calibration/labels_test.py checks they are the same
# set).
STRATEGY_LABELS = {
    'pmax': 'w/ P_max',
    'entropy': 'w/ H',
    'log_length': 'w/ log_Lex L_tr',
    'pmax_bisect': 'w/ P_max (bisect)',
    'entropy_bisect': 'w/ H (bisect)',
    'pmax_per_layer': 'w/ P_max (per layer)',
    'entropy_per_layer': 'w/ H (per layer)',
    'pmax_per_head': 'w/ P_max (per head)',
    'entropy_per_head': 'w/ H (per head)',
    'prop1': 'w/ Prop. 1 (P_max)',
    'prop2': 'w/ Prop. 2 (H)',
    # Training-free temperatures of other work (`calibration.closed_form.FORMULAS`).
    'infoscale_head': 'w/ InfoScale (d_h)',
    'infoscale_model': 'w/ InfoScale (h x d_h)',
    'llama4_length': 'w/ Llama 4 length',
    'yarn_mscale': 'w/ YaRN mscale',
}
# The paper's row order: tau = 1, then Algorithm 1 and its baseline; other rows follow.
PAPER_ORDER = (TAU_ONE, STRATEGY_LABELS['pmax'], STRATEGY_LABELS['entropy'],
               STRATEGY_LABELS['log_length'])


def strategy_label(strategy: str) -> str:
  """The row label of a calibration strategy, its options (`calibration.strategies.parse_name`)
  in words: 'pmax:from_layer=1:bias=joint' -> 'w/ P_max (from layer 1, bias joint)',
  'none:bias=extend' -> 'tau = 1 (bias extend)'. Raises ValueError naming an unknown base."""
  base, *options = strategy.split(':')
  if base != 'none' and base not in STRATEGY_LABELS:
    raise ValueError(f'strategy={strategy!r} has no label; expected one of '
                     f'{tuple(STRATEGY_LABELS)}, with options.')
  label = TAU_ONE if base == 'none' else STRATEGY_LABELS[base]
  if not options:
    return label
  words = [o.replace('from_layer=', 'from layer ').replace('=', ' ') for o in options]
  return f'{label} ({", ".join(words)})'


def row_label(row: str) -> str:
  """A report row's label: 'tau=1' (no calibration), else its strategy's (`strategy_label`)."""
  return TAU_ONE if row == 'tau=1' else strategy_label(row)


def label_order(label: str) -> tuple[int, str]:
  """Sort key of a table row: `PAPER_ORDER` first, then the rest by name."""
  return (PAPER_ORDER.index(label), label) if label in PAPER_ORDER else (len(PAPER_ORDER), label)
