"""One strategy-label table (labels.py) for every printout; report.py off JAX; one JSON cleaner."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from t5align import calibration
from t5align.demo import planning
from t5align.evaluation import temperature
from t5align import labels
from t5align.evaluation import tables
from t5align import schedule

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_strategy_has_one_label():
  assert set(labels.STRATEGY_LABELS) == set(calibration.STRATEGIES)
  assert len(set(labels.STRATEGY_LABELS.values())) == len(labels.STRATEGY_LABELS)
  with pytest.raises(ValueError, match="strategy='pmx' has no label"):
    labels.strategy_label('pmx')


def _schedule() -> schedule.TemperatureSchedule:
  cals = {s: (calibration.Calibration(s, 32, 16, 0.5),) for s in ('pmax', 'entropy', 'log_length',
                                                                 'prop1', 'prop2')}
  cals['pmax_per_layer'] = (calibration.Calibration('pmax_per_layer', 32, 16, (0.5, 0.6)),)
  return schedule.TemperatureSchedule(reference_length=16, calibrations=cals, strategy='pmax')


def test_printed_labels_come_from_the_table():
  table = set(labels.STRATEGY_LABELS.values())
  # The demo's report rows: the table's labels, options in words after them.
  for row in ('tau=1', *planning.STRATEGIES):
    base = row.split(':')[0]
    label = labels.row_label(row)
    assert label == (labels.TAU_ONE if base in ('tau=1', 'none') else labels.STRATEGY_LABELS[base]
                     ) + ('' if ':' not in row else label[label.index(' ('):])
  assert labels.row_label('pmax:from_layer=1:bias=joint') == 'w/ P_max (from layer 1, bias joint)'
  assert labels.row_label('none:bias=extend') == 'tau = 1 (bias extend)'
  assert {labels.row_label(r) for r in planning.STRATEGIES if ':' not in r} <= table
  # The schedule's temperature table: each row starts with a strategy's label.
  sched = _schedule()
  rows = sched.table().splitlines()[3:]
  for strategy in sched.calibrations:
    label = labels.strategy_label(strategy)
    assert any(r.startswith(label + ' ') for r in rows), (label, rows)
  # t5align.eval's metrics.json label, which t5align.report orders.
  for strategy in sched.calibrations:
    temp = temperature.Temperature(schedule=dataclasses.replace(sched, strategy=strategy))
    assert temp.label == labels.strategy_label(strategy)
  assert temperature.Temperature(constant=1.0).label == labels.TAU_ONE
  # The report puts the paper's rows first, in the paper's order.
  shuffled = ['w/ other', labels.STRATEGY_LABELS['log_length'], labels.TAU_ONE,
              labels.STRATEGY_LABELS['entropy'], labels.STRATEGY_LABELS['pmax']]
  assert sorted(shuffled, key=labels.label_order) == [
      labels.TAU_ONE, 'w/ P_max', 'w/ H', 'w/ log_Lex L_tr', 'w/ other']
  assert tables.labels is labels


def test_report_imports_no_jax():
  code = ('import sys; import t5align.report; '
          'bad = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "flax")); '
          'print(bad); sys.exit(1 if bad else 0)')
  env = {**os.environ, 'PYTHONPATH': REPO_ROOT}
  done = subprocess.run([sys.executable, '-c', code], env=env, cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stdout + done.stderr


def test_jsonable_converts_numpy_and_handles_non_finite():
  import numpy as np  # pylint: disable=g-import-not-at-top
  from t5align.runtime import outputs  # pylint: disable=g-import-not-at-top
  value = {1: (np.float32(0.5), np.arange(2)), 'x': [np.int64(3), float('nan')]}
  assert outputs.jsonable(value, non_finite='null') == {'1': [0.5, [0, 1]], 'x': [3, None]}
  with pytest.raises(ValueError, match='non-finite value nan cannot be stored in a schedule'):
    outputs.jsonable(value, what='a schedule')
