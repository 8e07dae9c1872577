"""Bias rules through the commands: `t5align.calibrate` writes a schedule whose calibrations
carry their rule, and `t5align.eval` applies a schedule's rule exactly as gin's BIAS_RULE gives
it (the same predictions, the same encoder), on the shipped model."""
from __future__ import annotations

import json

import pytest

import conftest
import runs
from t5align import jobs
from t5align import schedule

pytestmark = [pytest.mark.cli, pytest.mark.tensorflow]


def _predictions(out) -> list[dict]:
  lines = (out / runs.TASK / 'predictions.jsonl').read_text().splitlines()
  return sorted((json.loads(x) for x in lines), key=lambda r: r['index'])


@pytest.mark.slow
def test_calibrate_records_rules_and_eval_applies_them_as_bias_rule_does(tmp_path, repo_gin,
                                                                         monkeypatch):
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(runs.VOCAB))  # The tasks' tokens: the model's.
  settings = runs.calibrate_args(tmp_path)
  settings['strategies'] = ('pmax:bias=joint', 'none:bias=extend', 'pmax:from_layer=1')
  jobs.CalibrationJob(**settings).run()
  path = tmp_path / 'schedule.json'
  saved = json.loads(path.read_text())
  assert saved['format'] == schedule.FORMAT
  loaded = schedule.load_schedule(str(path))
  joint = loaded.calibrations['pmax:bias=joint']
  assert [c.length for c in joint] == [384, 512]
  for c in joint:  # The chosen pair is the nearest of the 3 rules x 3 taus to the target.
    pairs = c.details['pairs']
    best = min(((abs(v - c.target), rule, tau) for rule, values in pairs.items()
                for tau, v in zip(c.details['grid'], values)), key=lambda x: x[0])
    assert (c.bias_rule, c.tau) == best[1:]
  assert {c.bias_rule for c in loaded.calibrations['none:bias=extend']} == {'extend'}
  assert all(c.tau == 1.0 for c in loaded.calibrations['none:bias=extend'])
  assert all(c.tau[0] == 1.0 and len(c.tau) == 3
             for c in loaded.calibrations['pmax:from_layer=1'])
  # Eval: the schedule's rule (tau 1) and gin's BIAS_RULE with TEMPERATURE=1 are one encoder.
  scheduled, gin_rule, plain = tmp_path / 'scheduled', tmp_path / 'gin_rule', tmp_path / 'plain'
  conftest.run_eval(*runs.eval_args(scheduled, runs.CKPT, f'--gin.SCHEDULE_PATH={path}',
                                    '--gin.SCHEDULE_STRATEGY=none:bias=extend'))
  conftest.run_eval(*runs.eval_args(gin_rule, runs.CKPT, '--gin.BIAS_RULE=extend',
                                    '--gin.TEMPERATURE=1.0'))
  conftest.run_eval(*runs.eval_args(plain, runs.CKPT, '--gin.TEMPERATURE=1.0'))
  ours, theirs = _predictions(scheduled), _predictions(gin_rule)
  assert [r['prediction'] for r in ours] == [r['prediction'] for r in theirs]
  # The rule is part of what was run: recorded in each run's identity.
  identity = lambda out: json.loads((out / runs.TASK / 'run.json').read_text())
  rule = identity(gin_rule)['config']['encoder_bias_rule']
  assert "kind='extend'" in rule and 'reference_length=256' in rule
  assert "kind='none'" in identity(plain)['config']['encoder_bias_rule']
  metrics = json.loads((gin_rule / runs.TASK / 'metrics.json').read_text())
  assert 'bias extend' in json.dumps(metrics)
  # Both ways at once is refused, naming both.
  with pytest.raises(ValueError, match=r"encoder_bias_rule=.*'interpolate'.*calibrated its own "
                                       r"\('extend'\)"):
    conftest.run_eval(*runs.eval_args(tmp_path / 'both', runs.CKPT, f'--gin.SCHEDULE_PATH={path}',
                                      '--gin.SCHEDULE_STRATEGY=none:bias=extend',
                                      '--gin.BIAS_RULE=interpolate'))
