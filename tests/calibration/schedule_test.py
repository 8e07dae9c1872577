"""Schedule tests: JSON and gin round trips, log-length interpolation, per-example taus reaching
the encoder, and the calibrate CLI end to end on the t5x fixture checkpoint.

A malformed schedule file (lengths below L_tr, JSON cut off or not UTF-8, a key missing, a value of
the wrong type, a tau or an informational target that is not finite) is refused naming the file
and key."""
from __future__ import annotations

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import runs

from t5align import calibrate
from t5align import calibration
from t5align.calibration import samples
from t5align import network
from t5align import schedule

pytestmark = pytest.mark.newest_jax

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE_CKPT = REPO_ROOT / 'tests' / 'testdata' / 't5x' / 't5_1_1_tiny' / 'legacy' / 'checkpoint_0'


def _cal(strategy, length, tau, **kw):
  return calibration.Calibration(strategy=strategy, length=length, reference_length=512, tau=tau,
                                 **kw)


def _schedule() -> schedule.TemperatureSchedule:
  return schedule.TemperatureSchedule(
      reference_length=512, strategy='pmax',
      calibrations={
          'pmax': (_cal('pmax', 2048, 0.85, target=0.28, achieved=0.279,
                        details={'grid': [1.0, 0.95], 'values': [0.1, 0.2]}),
                   _cal('pmax', 1024, 0.9, target=0.28, achieved=0.281),
                   _cal('pmax', 4096, 0.8, target=0.28, achieved=0.28, clamped=True)),
          'pmax_per_layer': (_cal('pmax_per_layer', 1024, (0.9, 0.8), target=(0.3, 0.2)),
                             _cal('pmax_per_layer', 4096, (0.7, 0.6), target=(0.3, 0.2))),
          'log_length': tuple(_cal('log_length', L, math.log(512) / math.log(L))
                              for L in (1024, 2048, 4096)),
      },
      provenance={'checkpoint': 'gs://bucket/checkpoint_1', 'num_samples': 8, 'seed': 0})


def test_json_round_trip_is_atomic_and_exact(tmp_path):
  sched = _schedule()
  path = tmp_path / 'out' / 'schedule.json'
  sched.save(str(path))
  sched.save(str(path))  # Overwrites in place.
  assert os.listdir(path.parent) == ['schedule.json']  # No temporary file left behind.
  data = json.loads(path.read_text())
  assert data['format'] == schedule.FORMAT
  assert data['provenance']['checkpoint'] == 'gs://bucket/checkpoint_1'
  assert [c['length'] for c in data['calibrations']['pmax']] == [1024, 2048, 4096]
  loaded = schedule.load_schedule(str(path))
  assert loaded == sched
  assert schedule.load_schedule(str(path), strategy='log_length').strategy == 'log_length'


def test_gin_loads_schedule(tmp_path, clean_gin):
  path = tmp_path / 'schedule.json'
  _schedule().save(str(path))
  gin.parse_config([f"t5align.schedule.load_schedule.path = '{path}'",
                    "t5align.schedule.load_schedule.strategy = 'pmax_per_layer'"])
  loaded = schedule.load_schedule()
  assert loaded == _schedule().with_strategy('pmax_per_layer')
  gin.clear_config()
  # The dynamic-registration style of t5x run files.
  gin.parse_config('\n'.join([
      'from __gin__ import dynamic_registration',
      'from t5align import schedule',
      f"schedule.load_schedule.path = '{path}'"]))
  assert schedule.load_schedule() == _schedule()


def test_log_length_interpolation_clamps_at_the_ends():
  sched = _schedule()
  np.testing.assert_allclose(sched.tau_for_length([1024, 2048, 4096]), [0.9, 0.85, 0.8])
  np.testing.assert_allclose(sched.tau_for_length(math.sqrt(1024 * 2048)), 0.875)
  np.testing.assert_allclose(sched.tau_for_length(math.sqrt(512 * 1024)), 0.95)  # L_tr anchor
  np.testing.assert_allclose(sched.tau_for_length([10, 512, 10**6]), [1.0, 1.0, 0.8])
  per_layer = sched.tau_for_length([300, 2048, 9000], strategy='pmax_per_layer')
  np.testing.assert_allclose(per_layer, [[1.0, 1.0], [0.8, 0.7], [0.7, 0.6]])
  tokens = np.zeros((3, 5000), np.int32)
  for row, n in zip(tokens, (300, 1500, 5000)):
    row[:n] = 7
  taus = jax.jit(sched.temperatures)(tokens)
  assert taus.shape == (3, 1)
  np.testing.assert_allclose(taus[:, 0], sched.tau_for_length([300, 1500, 5000]), rtol=1e-6)
  assert sched.temperatures(tokens, strategy='pmax_per_layer').shape == (3, 2)


def test_invalid_schedules_raise():
  with pytest.raises(ValueError, match='finite and > 0'):
    schedule.TemperatureSchedule(512, {'pmax': (_cal('pmax', 1024, float('nan')),)}, 'pmax')
  with pytest.raises(ValueError, match='distinct'):
    schedule.TemperatureSchedule(512, {'pmax': (_cal('pmax', 1024, 0.9),) * 2}, 'pmax')
  with pytest.raises(ValueError, match=r'mixes tau shapes \[\(\), \(2,\)\]'):
    schedule.TemperatureSchedule(
        512, {'pmax': (_cal('pmax', 1024, 0.9), _cal('pmax', 2048, (0.8, 0.7)))}, 'pmax')
  with pytest.raises(ValueError, match='this schedule has'):
    _schedule().with_strategy('entropy')
  with pytest.raises(ValueError, match='not a temperature schedule'):
    schedule.TemperatureSchedule.from_dict({'format': 'other'})
  with pytest.raises(FileNotFoundError):
    schedule.load_schedule('/nonexistent/schedule.json')


@pytest.mark.slow
def test_per_example_taus_reach_the_encoder():
  config = network.T5Config(vocab_size=32, emb_dim=8, num_heads=2, num_encoder_layers=2,
                            num_decoder_layers=1, head_dim=4, mlp_dim=16, dropout_rate=0.0)
  params = network.init_variables(config, jax.random.PRNGKey(0))['params']
  model = network.Transformer(config)
  encode = jax.jit(lambda tokens, tau: model.apply(
      {'params': params}, tokens, method='encode', enable_dropout=False, temperature=tau))
  cal = lambda s, L, tau: calibration.Calibration(s, L, 8, tau)
  sched = schedule.TemperatureSchedule(8, {
      'pmax': (cal('pmax', 16, 0.8), cal('pmax', 32, 0.6)),
      'pmax_per_layer': (cal('pmax_per_layer', 16, (0.8, 0.9)),
                         cal('pmax_per_layer', 32, (0.5, 0.7)))}, 'pmax')
  rng = np.random.default_rng(0)
  lengths = (40, 20, 6)
  tokens = rng.integers(2, 32, (3, 40)).astype(np.int32)
  for row, n in zip(tokens, lengths):
    row[n:] = 0
  for strategy in sched.strategies:
    taus = sched.temperatures(tokens, strategy)  # [3, 1] or [3, 2]
    batched = encode(tokens, taus)
    for i, n in enumerate(lengths):
      # The example run alone, unpadded, with its own tau (as [1, layers]: one compilation).
      alone = encode(tokens[i:i + 1, :n], jnp.broadcast_to(taus[i:i + 1], (1, 2)))
      np.testing.assert_allclose(batched[i, :n], alone[0], rtol=1e-5, atol=1e-6)
      if i == 1:  # The output depends on the tau: tau = 1 differs.
        assert not np.allclose(encode(tokens[1:2, :n], jnp.ones((1, 2)))[0], alone[0], atol=1e-4)
    # Different lengths really got different temperatures.
    assert len(np.unique(np.round(np.asarray(taus), 6), axis=0)) == 3


def _train_sentencepiece(tmp_path) -> tuple[str, str]:
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  words = ['alpha', 'beta', 'gamma', 'delta', 'kappa', 'lambda', 'sigma', 'omega', 'tau', 'rho',
           'river', 'stone', 'cloud', 'green', 'blue', 'quiet', 'swift', 'north', 'south', 'east']
  lines = [' '.join(rng.choice(words, 12)) for _ in range(200)]
  text = tmp_path / 'corpus.txt'
  text.write_text('\n'.join(lines) + '\n')
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_prefix=str(tmp_path / 'spm'), vocab_size=40,
      hard_vocab_limit=False, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
  return str(text), str(tmp_path / 'spm.model')


@pytest.mark.cli
def test_cli_end_to_end(tmp_path, capsys, clean_gin):
  text, vocab = _train_sentencepiece(tmp_path)
  out = tmp_path / 'schedule.json'
  analysis_dir = tmp_path / 'analysis'
  calibrate.main([
      f'--gin_file={REPO_ROOT / "gin" / "calibrate.gin"}',
      f'--gin_search_paths={REPO_ROOT}',
      f"--gin.CHECKPOINT_PATH='{FIXTURE_CKPT}'",
      f"--gin.TEXT_FILE='{text}'",
      f"--gin.VOCABULARY_PATH='{vocab}'",
      f"--gin.OUTPUT_PATH='{out}'",
      f"--gin.ANALYSIS_DIR='{analysis_dir}'",
      '--gin.LENGTHS=(32, 64)',
      '--gin.REFERENCE_LENGTH=16',
      '--gin.NUM_SAMPLES=2',
      "--gin.ATTENTION_IMPL='reference'",
      "--gin.STRATEGIES=('pmax', 'log_length', 'prop2', 'pmax_per_layer')",
  ])
  printed = capsys.readouterr()
  assert 'Temperatures (L_tr = 16' in printed.out and 'w/ P_max' in printed.out
  assert '[  8/8]' in printed.err  # Progress lines.
  loaded = schedule.load_schedule(str(out))
  assert loaded.strategies == ('pmax', 'log_length', 'prop2', 'pmax_per_layer')
  assert loaded.provenance['checkpoint'] == str(FIXTURE_CKPT)
  assert loaded.provenance['num_samples'] == 2 and loaded.provenance['lengths'] == [32, 64]
  assert loaded.provenance['text_file'] == text
  np.testing.assert_allclose(loaded.tau_for_length([32, 64], 'log_length'),
                             [math.log(16) / math.log(32), math.log(16) / math.log(64)])
  grid_cal = loaded.calibrations['pmax'][0]
  assert grid_cal.tau in calibration.PAPER_GRID and len(grid_cal.details['values']) == 11
  assert len(loaded.calibrations['pmax_per_layer'][0].tau) == 2
  for name in ('analysis.json', 'statistic_curves.png', 'temperature_curves.png',
               'relpos_bias.png', 'qq_layer0.png'):
    assert (analysis_dir / name).stat().st_size > 0


@pytest.mark.cli
def test_cli_module_entry_point_and_flag_errors(tmp_path):
  # `python -m` runs the module as __main__; the gin file's import must not register twice.
  env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), JAX_PLATFORMS='cpu')
  proc = subprocess.run(
      [sys.executable, '-m', 't5align.calibrate', f'--gin_file={REPO_ROOT}/gin/calibrate.gin'],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert ('CHECKPOINT_PATH (jobs.Checkpoint.path) is required: pass '
          '--gin.CHECKPOINT_PATH=VALUE') in proc.stderr, proc.stderr[-2000:]
  with pytest.raises(ValueError, match='has 5 tokens'):
    samples.sample_windows(np.arange(5), 2, 64, eos_id=1)
  windows = samples.sample_windows(np.arange(3, 200), 3, 16, seed=1, eos_id=1)
  assert windows.shape == (3, 16) and np.all(windows[:, -1] == 1) and np.all(windows > 0)


def _per_head_schedule(tasks=None) -> schedule.TemperatureSchedule:
  taus = {1024: ((0.9, 0.8, 1.0), (0.85, 0.95, 0.7)), 4096: ((0.7, 0.6, 0.9), (0.65, 0.75, 0.5))}
  cals = {'pmax_per_head': tuple(
              _cal('pmax_per_head', L, t, target=((0.3, 0.2, 0.1), (0.4, 0.5, 0.6)),
                   achieved=((0.3, 0.2, 0.1), (0.4, 0.5, 0.61)),
                   details={'layers': [{'calls': 3, 'heads': [{'calls': 3}] * 3}] * 2})
              for L, t in taus.items()),
          'pmax': (_cal('pmax', 1024, 0.9), _cal('pmax', 4096, 0.8))}
  return schedule.TemperatureSchedule(512, cals, 'pmax_per_head', tasks=tasks or {})


def test_per_head_schedule_round_trip_interpolation_and_tasks(tmp_path):
  """`[layers, heads]` taus: JSON round trip (pooled and per task), log-length interpolation
  of every head, per-example `[batch, layers, heads]` taus, the `encode` form and the table."""
  task = {'pmax_per_head': (_cal('pmax_per_head', 2048, ((0.5,) * 3, (0.6,) * 3)),)}
  sched = _per_head_schedule({'lines': task})
  path = tmp_path / 'schedule.json'
  sched.save(str(path))
  data = json.loads(path.read_text())
  assert data['calibrations']['pmax_per_head'][0]['tau'] == [[0.9, 0.8, 1.0], [0.85, 0.95, 0.7]]
  loaded = schedule.load_schedule(str(path))
  assert loaded == sched and loaded.calibrations['pmax_per_head'][1].tau == (
      (0.7, 0.6, 0.9), (0.65, 0.75, 0.5))
  # Halfway in log-length between 1024 and 4096 (2048): the mean of the two, head by head.
  expected = np.array([[0.8, 0.7, 0.95], [0.75, 0.85, 0.6]])
  np.testing.assert_allclose(loaded.tau_for_length(2048), expected)
  np.testing.assert_allclose(loaded.tau_for_length([512, 10**6]),
                             [np.ones((2, 3)), [[0.7, 0.6, 0.9], [0.65, 0.75, 0.5]]])
  assert loaded.tau_for_length(4096, 'pmax').shape == ()
  tokens = np.zeros((2, 4096), np.int32)
  tokens[0, :2048], tokens[1, :] = 7, 7
  taus = np.asarray(loaded.temperatures(tokens))
  assert taus.shape == (2, 2, 3)
  np.testing.assert_allclose(taus, [expected, loaded.tau_for_length(4096)], rtol=1e-6)
  form = loaded.encode_temperature(2048)
  assert form.shape == (1, 2, 3) and form.dtype == np.float32
  assert loaded.encode_temperature(2048, 'pmax') == pytest.approx(0.85)
  np.testing.assert_allclose(loaded.for_task('lines').tau_for_length(2048), np.full((2, 3), 0.5)
                             + np.array([[0.0], [0.1]]))
  table = loaded.table()
  assert 'w/ P_max (per head) L1 mean' in table and f'{np.mean([0.85, 0.95, 0.7]):.3f}' in table


@pytest.mark.parametrize('tau,where', [
    ([[0.9, 0.8], [0.7]], "calibrations['pmax_per_head'][0]['tau']"),
    ([[[0.9, 0.8]], [[0.7, 0.6]]], "calibrations['pmax_per_head'][0]['tau']"),
    ([[0.9, 'x'], [0.7, 0.6]], "calibrations['pmax_per_head'][0]['tau']"),
    ([[], []], "calibrations['pmax_per_head'][0]['tau']"),
    ([[0.9, True], [0.7, 0.6]], "calibrations['pmax_per_head'][0]['tau']"),
])
def test_malformed_per_head_taus_name_the_file_and_field(tmp_path, tau, where):
  data = _per_head_schedule().to_dict()
  data['calibrations']['pmax_per_head'][0]['tau'] = tau
  path = tmp_path / 'bad.json'
  path.write_text(json.dumps(data))
  with pytest.raises(ValueError, match=rf'temperature schedule {path}: {re.escape(where)} must be '
                                       'a number, a list of numbers .* or a list of equal-length '
                                       'lists of numbers'):
    schedule.load_schedule(str(path))


def test_per_head_schedule_rejects_mixed_shapes_and_bad_values(tmp_path):
  data = _per_head_schedule().to_dict()
  first = data['calibrations']['pmax_per_head'][0]
  data['tasks'] = {'kv': {'pmax_per_head': [dict(first, length=2048, tau=[0.5, 0.6]),
                                            dict(first, length=4096)]}}
  path = tmp_path / 'mixed.json'
  path.write_text(json.dumps(data))
  with pytest.raises(ValueError, match=rf"temperature schedule {path}: task 'kv': strategy "
                                       r"'pmax_per_head' mixes tau shapes \[\(2,\), \(2, 3\)\]"):
    schedule.load_schedule(str(path))
  data = _per_head_schedule().to_dict()
  data['calibrations']['pmax_per_head'][1]['tau'][1][2] = -0.5
  path.write_text(json.dumps(data))
  with pytest.raises(ValueError, match=rf'temperature schedule {path}: pmax_per_head taus must be '
                                       'finite and > 0'):
    schedule.load_schedule(str(path))
  data = _per_head_schedule().to_dict()
  data['tasks'] = {'kv': {'pmax_per_head': [dict(data['calibrations']['pmax_per_head'][0],
                                                 tau=[[0.5, 0.6], [0.7]])]}}
  path.write_text(json.dumps(data))
  with pytest.raises(ValueError, match=re.escape("tasks['kv']['pmax_per_head'][0]['tau'] must be")):
    schedule.load_schedule(str(path))


# Malformed schedule files: refused naming the file and key.


def _schedule_dict(lengths, reference_length=256, taus=None):
  taus = taus or [0.9] * len(lengths)
  return {'format': schedule.FORMAT, 'reference_length': reference_length, 'strategy': 'pmax',
          'calibrations': {'pmax': [{'strategy': 'pmax', 'length': n, 'tau': t,
                                     'reference_length': reference_length}
                                    for n, t in zip(lengths, taus)]}}


@pytest.mark.parametrize('lengths', [[0, 512], [-4, 512], [128, 512]])
def test_schedule_lengths_below_reference_are_refused(lengths, tmp_path):
  path = tmp_path / 's.json'
  path.write_text(json.dumps(_schedule_dict(lengths)))
  with pytest.raises(ValueError, match=rf'{path}: .*calibrated length {lengths[0]} is not an '
                                       r'integer >= reference_length \(L_tr = 256\)'):
    schedule.load_schedule(str(path))


@pytest.mark.parametrize('content, message', [
    ('{"format": ', r's.json:1: not valid JSON'),
    (b'\xff\xfe', 'not UTF-8 text'),
    (json.dumps({**_schedule_dict([512]), 'reference_length': '256'}),
     r"\['reference_length'\] must be int; got '256'"),
    (json.dumps({k: v for k, v in _schedule_dict([512]).items() if k != 'strategy'}),
     "the file has no key 'strategy'"),
    (json.dumps({**_schedule_dict([512]), 'calibrations': {'pmax': [{'strategy': 'pmax'}]}}),
     r"calibrations\['pmax'\]\[0\] has no key 'length'"),
    (json.dumps(_schedule_dict([512], taus=[1e-50])), 'must be finite and > 0'),
])
def test_malformed_schedule_names_file_and_key(content, message, tmp_path):
  path = tmp_path / 's.json'
  (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
  with pytest.raises(ValueError, match=message) as e:
    schedule.load_schedule(str(path))
  assert str(path) in str(e.value)


@pytest.mark.parametrize('target, shown', [
    (float('nan'), 'nan'), (float('inf'), 'inf'), ([0.5, float('nan')], 'nan')])
def test_a_non_finite_schedule_target_names_the_file_and_key(tmp_path, target, shown):
  path = runs.schedule_with_target(tmp_path / 's.json', target)
  with pytest.raises(ValueError,
                     match=rf"temperature schedule {path}: calibrations\['pmax'\]\[0\]\['target'\] "
                           rf'holds {shown}; every number there must be finite'):
    schedule.load_schedule(str(path))


# Format 2: each calibration's bias rule; format 1 files upgraded on read.


def test_format_1_schedules_load_with_t5s_bias_and_format_2_keeps_the_rule(tmp_path):
  """A format-1 file (no `bias_rule`) loads as before, every calibration with T5's bias; a
  format-2 file round-trips its rules, and the file on disk is not rewritten."""
  old = {**_schedule_dict([512, 1024]), 'format': 't5align.temperature_schedule.v1'}
  path = tmp_path / 'old.json'
  path.write_text(json.dumps(old))
  loaded = schedule.load_schedule(str(path))
  assert [c.bias_rule for c in loaded.calibrations['pmax']] == ['none', 'none']
  assert [c.tau for c in loaded.calibrations['pmax']] == [0.9, 0.9]
  assert json.loads(path.read_text()) == old
  joint = schedule.TemperatureSchedule(512, {'pmax:bias=joint': (
      _cal('pmax:bias=joint', 1024, 0.9, bias_rule='none'),
      _cal('pmax:bias=joint', 4096, 0.8, bias_rule='interpolate'))}, 'pmax:bias=joint')
  joint.save(str(tmp_path / 'new.json'))
  again = schedule.load_schedule(str(tmp_path / 'new.json'))
  assert json.loads((tmp_path / 'new.json').read_text())['format'] == schedule.FORMAT
  assert [c.bias_rule for c in again.calibrations['pmax:bias=joint']] == ['none', 'interpolate']
  # The rule of an input width: its nearest calibrated length's, T5's at and below L_tr.
  assert [again.bias_rule(n) for n in (512, 1400, 2200, 8192)] == [
      'none', 'none', 'interpolate', 'interpolate']


def test_an_unknown_bias_rule_or_format_is_refused_naming_the_key(tmp_path):
  data = _schedule_dict([512])
  data['calibrations']['pmax'][0]['bias_rule'] = 'stretch'
  path = tmp_path / 's.json'
  path.write_text(json.dumps(data))
  with pytest.raises(ValueError, match=re.escape(
      f"{path}: calibrations['pmax'][0]['bias_rule'] must be one of")):
    schedule.load_schedule(str(path))
  path.write_text(json.dumps({**data, 'format': 't5align.temperature_schedule.v9'}))
  with pytest.raises(ValueError, match="format 't5align.temperature_schedule.v9', expected"):
    schedule.load_schedule(str(path))


def test_a_schedules_bias_rule_reaches_the_model_once():
  """An eval (`Temperature.model_config`) gives the encoder the schedule's rule for the task's
  width; with the model's own rule too (gin's BIAS_RULE) it is refused naming both."""
  from t5align.attention import reference  # pylint: disable=g-import-not-at-top
  from t5align.evaluation import temperature  # pylint: disable=g-import-not-at-top
  ruled = schedule.TemperatureSchedule(512, {'pmax:bias=interpolate': (
      _cal('pmax:bias=interpolate', 2048, 0.8, bias_rule='interpolate'),)},
      'pmax:bias=interpolate')
  temp = temperature.Temperature(schedule=ruled)
  config = network.T5Config(vocab_size=32, num_encoder_layers=2, num_heads=2)
  assert temp.model_config(config, 2048).encoder_bias_rule == reference.BiasRule(
      'interpolate', reference_length=512)
  assert temp.model_config(config, 512) is config  # At L_tr: T5's bias.
  assert temperature.Temperature(constant=0.8).model_config(config, 2048) is config
  own = config.replace(encoder_bias_rule=reference.BiasRule('extend', scale=2.0))
  with pytest.raises(ValueError, match=r"encoder_bias_rule=.*'extend'.*calibrated its own "
                                       r"\('interpolate'\): set one of them"):
    temp.model_config(own, 2048)
