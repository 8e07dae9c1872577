"""Training-free temperatures of other work (InfoScale, Llama 4's length term, YaRN's mscale) as
calibration strategies: each formula against values written out by hand (numpy float64) and
against YARDSTICKS.md section 8's table, their floors, and the strategies through calibration,
the schedule eval reads, the demo's --full plan and the report's rows."""
from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest

from t5align import calibration
from t5align.demo import planning
from t5align.demo import timing
from t5align.evaluation import tables
from t5align.evaluation import temperature
from t5align import labels
from t5align import schedule as schedule_lib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
NEW = ('infoscale_head', 'infoscale_model', 'llama4_length', 'yarn_mscale')
# The worked example: T5 at L_tr = 512, an input of 4096 tokens, 8 heads of d_h = 64.
L_TR, L_EX, HEADS, D_H = 512, 4096, 8, 64


def test_infoscale_written_out():
  # tau = sqrt((1 - N^(-2/d)) / (1 - n^(-2/d))); with n = 2^12, N = 2^9 the powers are powers of 2.
  # d = d_h = 64: n^(-2/64) = 2^(-24/64) = 2^-0.375 = 0.771105..., N^(-2/64) = 2^-0.28125 =
  # 0.822878...; tau = sqrt(0.177122 / 0.228895) = 0.879668.
  head = np.sqrt((1 - 2.0 ** -0.28125) / (1 - 2.0 ** -0.375))
  assert head == pytest.approx(0.879668, abs=1e-6)
  # d = heads x d_h = 512: 2^(-24/512) = 2^-0.046875, 2^(-18/512) = 2^-0.03515625;
  # tau = sqrt(0.0240739 / 0.0319691) = 0.867777.
  model = np.sqrt((1 - 2.0 ** -0.03515625) / (1 - 2.0 ** -0.046875))
  assert model == pytest.approx(0.867777, abs=1e-6)
  np.testing.assert_allclose(calibration.infoscale_tau(L_EX, L_TR, D_H), head, rtol=1e-12)
  np.testing.assert_allclose(calibration.infoscale_tau(L_EX, L_TR, HEADS * D_H), model,
                             rtol=1e-12)
  # The strategies: d_h, and heads x d_h as the authors' T5 code, from the model's shape.
  for name, dim, expected in (('infoscale_head', D_H, head), ('infoscale_model', 512, model)):
    tau, details = calibration.formula_tau(name, L_EX, L_TR, num_heads=HEADS, head_dim=D_H)
    assert tau == pytest.approx(expected, rel=1e-12) and details == {'dim': dim}


def test_infoscale_conventions_differ_as_expected():
  lengths = np.array([1024, 2048, 4096, 8192, 16384])
  head = calibration.infoscale_tau(lengths, L_TR, D_H)
  model = calibration.infoscale_tau(lengths, L_TR, HEADS * D_H)
  # The larger d sharpens more (smaller tau) at every L_ex > L_tr; both are milder than
  # log-length, and as d grows tau -> sqrt(log_{L_ex} L_tr) (1 - x^(-2/d) ~ (2/d) ln x).
  log_length = np.log(L_TR) / np.log(lengths)
  assert np.all(model < head) and np.all(head < 1) and np.all(model > log_length)
  limit = np.sqrt(log_length)  # sqrt(9/12) = 0.866025 at 4096
  assert np.all(np.abs(model - limit) < np.abs(head - limit))
  np.testing.assert_allclose(calibration.infoscale_tau(lengths, L_TR, 10**6), limit, atol=2e-5)


# YARDSTICKS.md section 8, "tau = 1/lambda for T5 at N = L_tr = 512" (3 decimals): log-length,
# InfoScale at d = 64, 512, 2048, 4096, the Llama-4 style term floored at 512 and at Llama 4's own
# 8192.
YARDSTICKS_LENGTHS = (1024, 2048, 4096, 8192, 16384)
YARDSTICKS_TABLE = {
    'log_length': (0.900, 0.818, 0.750, 0.692, 0.643),
    64: (0.954, 0.914, 0.880, 0.850, 0.823),
    512: (0.949, 0.906, 0.868, 0.834, 0.804),
    2048: (0.949, 0.905, 0.866, 0.833, 0.802),
    4096: (0.949, 0.905, 0.866, 0.832, 0.802),
    'llama4_512': (0.901, 0.861, 0.820, 0.779, 0.741),
    'llama4_8192': (1.000, 1.000, 1.000, 0.935, 0.901),
}


def test_yardsticks_table():
  lengths = np.array(YARDSTICKS_LENGTHS)
  got = {'log_length': calibration.log_length_tau(lengths, L_TR),
         'llama4_512': calibration.llama4_length_tau(lengths, L_TR),
         'llama4_8192': calibration.llama4_length_tau(lengths, L_TR, floor_scale=8192)}
  got.update({d: calibration.infoscale_tau(lengths, L_TR, d) for d in (64, 512, 2048, 4096)})
  for key, row in YARDSTICKS_TABLE.items():
    np.testing.assert_allclose(got[key], row, atol=5e-4 + 1e-12, err_msg=str(key))


def test_llama4_length_written_out_and_its_floor():
  # lambda = 1 + 0.1 ln(floor(4096 / 512) + 1) = 1 + 0.1 ln 9 = 1 + 0.1 x 2.1972246 = 1.2197225.
  assert calibration.llama4_length_tau(L_EX, L_TR) == pytest.approx(1 / 1.21972246, rel=1e-8)
  tau, _ = calibration.formula_tau('llama4_length', L_EX, L_TR, num_heads=HEADS, head_dim=D_H)
  assert tau == pytest.approx(0.8198586, abs=1e-7)
  # The floor at L_tr: 1 below it; at L_tr itself the source's step (pos + 1 = floor_scale)
  # gives floor(1) + 1 = 2: 1 / (1 + 0.1 ln 2) = 0.9351784; the same up to 2 L_tr - 1; then ln 3.
  taus = calibration.llama4_length_tau(np.array([2, 511, 512, 1023, 1024]), L_TR)
  np.testing.assert_allclose(taus, [1, 1, 0.9351784, 0.9351784, 1 / (1 + 0.1 * math.log(3))],
                             rtol=1e-7)
  # Llama 4's own floor (8192) leaves every length below it at tau = 1; attn_scale is its 0.1.
  assert calibration.llama4_length_tau(8191, L_TR, floor_scale=8192) == 1.0
  assert calibration.llama4_length_tau(L_EX, L_TR, attn_scale=0.2) == pytest.approx(
      1 / (1 + 0.2 * math.log(9)), rel=1e-12)


def test_yarn_mscale_written_out():
  # s = 4096 / 512 = 8; mscale = 0.1 ln 8 + 1 = 1.2079442; q and k are both scaled by it, so the
  # logits by mscale^2 = 1.4591291 = 1/t, and tau = t = 0.6853403 (not 1 / mscale = 0.8278535).
  assert calibration.yarn_mscale_tau(L_EX, L_TR) == pytest.approx(0.6853403, abs=1e-7)
  tau, _ = calibration.formula_tau('yarn_mscale', L_EX, L_TR, num_heads=HEADS, head_dim=D_H)
  assert tau == pytest.approx(1 / (1 + 0.1 * math.log(8)) ** 2, rel=1e-12)
  # s <= 1: mscale = 1 (the source's `if scale <= 1: return 1.0`), at and below L_tr.
  np.testing.assert_array_equal(calibration.yarn_mscale_tau(np.array([100, 511, 512]), L_TR), 1.0)
  assert calibration.yarn_mscale_tau(L_EX, L_TR, coefficient=0.0) == 1.0


def test_infoscale_is_one_up_to_l_tr():
  # The authors' T5 code clamps lambda >= 1: tau = 1 for n <= N (unclamped it would exceed 1).
  np.testing.assert_array_equal(calibration.infoscale_tau(np.array([1, 100, 512]), L_TR, 64), 1)


@pytest.mark.parametrize('call, message', [
    (lambda: calibration.infoscale_tau(L_EX, L_TR, 0), r'InfoScale: dim=0; expected a positive'),
    (lambda: calibration.infoscale_tau(L_EX, L_TR, 64.0), r'dim=64\.0; expected a positive'),
    (lambda: calibration.infoscale_tau(0, L_TR, 64), r'InfoScale: lengths must be >= 1'),
    (lambda: calibration.llama4_length_tau(L_EX, L_TR, floor_scale=0),
     r'Llama 4 length: floor_scale=0'),
    (lambda: calibration.llama4_length_tau(L_EX, 1),
     r'Llama 4 length: reference_length \(L_tr\)=1; expected an integer >= 2'),
    (lambda: calibration.yarn_mscale_tau(L_EX, L_TR, coefficient=-0.1),
     r'YaRN mscale: coefficient=-0\.1'),
    (lambda: calibration.formula_tau('prop1', L_EX, L_TR, num_heads=8, head_dim=64),
     r"strategy='prop1' is not a data-free formula"),
])
def test_bad_inputs_name_the_value(call, message):
  with pytest.raises(ValueError, match=message):
    call()


def test_the_new_strategies_are_strategies_with_labels():
  assert set(calibration.FORMULAS) == {'log_length', *NEW}
  for s in NEW:
    assert s in calibration.STRATEGIES and calibration.parse_strategy(s)[1:] == (
        'closed_form', 'encoder')
  assert [labels.strategy_label(s) for s in NEW] == [
      'w/ InfoScale (d_h)', 'w/ InfoScale (h x d_h)', 'w/ Llama 4 length', 'w/ YaRN mscale']


@pytest.fixture(scope='module')
def tiny(load_t5x_fixture):
  return load_t5x_fixture('t5_1_1_tiny')


def test_calibration_writes_a_schedule_eval_reads(tiny, tmp_path):
  config, params, ref = tiny  # 4 heads of d_h = 16
  tokens = ref['encoder_input_tokens']  # int [2, 160]
  lengths, l_tr = (64, 128), 32
  strategies = (*NEW, 'log_length')
  built = calibration.build_schedule(params, config, tokens, lengths, strategies,
                                     reference_length=l_tr)
  expected = {  # By hand, as the tests above: d = 16 and 4 x 16 = 64, s = L_ex / 32.
      'infoscale_head': lambda L: math.sqrt((1 - l_tr ** (-2 / 16)) / (1 - L ** (-2 / 16))),
      'infoscale_model': lambda L: math.sqrt((1 - l_tr ** (-2 / 64)) / (1 - L ** (-2 / 64))),
      'llama4_length': lambda L: 1 / (1 + 0.1 * math.log(L // l_tr + 1)),
      'yarn_mscale': lambda L: 1 / (1 + 0.1 * math.log(L / l_tr)) ** 2,
      'log_length': lambda L: math.log(l_tr) / math.log(L)}
  for s in strategies:
    for c, L in zip(built.calibrations[s], lengths):
      assert c.length == L and not c.clamped
      assert c.tau == pytest.approx(expected[s](L), rel=1e-12), (s, L)
  assert built.calibrations['infoscale_model'][0].details == {'dim': 64}
  table = built.table()
  assert all(labels.strategy_label(s) in table for s in NEW)
  path = tmp_path / 'schedule.json'
  built.save(str(path))
  # t5align.eval's reader (SCHEDULE_PATH, SCHEDULE_STRATEGY): per-example taus from each row's
  # non-pad length, the metrics.json label from the strategy.
  rows = np.zeros((2, 128), np.int32)
  rows[0, :64], rows[1, :128] = 5, 5  # [2, 128]: 64 and 128 non-pad tokens
  for s in NEW:
    temp = temperature.make_temperature(config, schedule_path=str(path), schedule_strategy=s)
    assert temp.label == labels.strategy_label(s)
    np.testing.assert_allclose(temp.taus(rows), [[expected[s](64)], [expected[s](128)]],
                               rtol=1e-6)  # float32


def test_formulas_need_no_model_pass():
  # The calibration of a data-free strategy reads the config's shape only: no parameters at all.
  from t5align import network  # pylint: disable=g-import-not-at-top
  config = network.T5Config(vocab_size=8, num_heads=HEADS, head_dim=D_H)
  c = calibration.calibrate(None, config, np.ones((1, L_EX), np.int32), 'infoscale_model',
                            reference_length=L_TR)
  assert c.tau == pytest.approx(0.867777, abs=1e-6) and c.details == {'dim': 512}


def test_demo_full_mode_plans_them():
  full = planning.make_plan(planning.DemoSettings(full=True), 256)
  for s in NEW:
    assert s in full.strategies and s in full.rows and s in full.pooled
    assert labels.row_label(s) == labels.strategy_label(s)
  default = planning.make_plan(planning.DemoSettings(), 256)
  assert not set(NEW) & set(default.strategies)
  planning.DemoSettings(strategies=NEW).check()  # --strategies takes them
  # They make no encoder pass, and leave the closed forms' sorted logits to prop1.
  assert timing.calibration_passes(('log_length', *NEW, 'prop1', 'prop2')) == {
      'log_length': 0.0, **{s: 0.0 for s in NEW},
      'prop1': timing.SWEEP_PASSES['closed_form'], 'prop2': 0.0}


def test_report_has_a_row_per_new_label():
  cals = {s: (calibration.Calibration(s, 64, 32, 0.9),) for s in ('pmax', *NEW)}
  sched = schedule_lib.TemperatureSchedule(reference_length=32, calibrations=cals,
                                           strategy='pmax')
  results = []
  for i, s in enumerate((None, 'pmax', *NEW)):
    label = (labels.TAU_ONE if s is None else
             temperature.Temperature(schedule=sched.with_strategy(s)).label)
    results.append({'table': 'retrieval', 'group': 'Passkey', 'column': '64', 'label': label,
                    'model': 'tiny', 'metrics': {'accuracy': 50.0 + i}})
  text = tables.render(results)
  lines = [line for line in text.splitlines() if line.startswith('| ')][1:]  # past the header
  assert [line.split('|')[1].strip() for line in lines] == [
      'tiny tau = 1', 'w/ P_max', 'w/ InfoScale (d_h)', 'w/ InfoScale (h x d_h)',
      'w/ Llama 4 length', 'w/ YaRN mscale']
  for i, line in enumerate(lines):
    assert f'{50.0 + i:.1f}' in line


@pytest.mark.cli
def test_calibrate_cli_per_task_on_the_shipped_model(tmp_path, clean_gin, monkeypatch, capsys):
  import json  # pylint: disable=g-import-not-at-top
  from t5align import calibrate  # pylint: disable=g-import-not-at-top
  from t5align import checkpoints  # pylint: disable=g-import-not-at-top
  from t5align.shipped import assets  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(REPO_ROOT)
  asset = REPO_ROOT / 't5align' / 'shipped' / 'retrieval_t5'
  ckpt = assets.checkpoint_dir(str(asset))
  words = 'The grass is green. The sky is blue. Here we go. There and back again.'
  jsonl = tmp_path / 'tasks.jsonl'
  jsonl.write_text(''.join(json.dumps({'task': t, 'inputs': ' '.join([words] * k)}) + '\n'
                           for t, k in (('a', 36), ('a', 40), ('b', 45), ('b', 33))))
  out = tmp_path / 'schedule.json'
  calibrate.main([
      '--gin_file=gin/calibrate.gin', f'--gin.CHECKPOINT_PATH={ckpt}',
      f'--gin.JSONL_FILE={jsonl}', f'--gin.VOCABULARY_PATH={asset / "sentencepiece.model"}',
      f'--gin.OUTPUT_PATH={out}', '--gin.LENGTHS=(512,)', '--gin.REFERENCE_LENGTH=256',
      '--gin.NUM_SAMPLES=2', f'--gin.STRATEGIES={NEW!r}', "--gin.ACTIVATION_DTYPE='float32'"])
  printed = capsys.readouterr().out
  _, config = checkpoints.load_params(ckpt)
  loaded = schedule_lib.load_schedule(str(out))
  assert sorted(loaded.tasks) == ['a', 'b'] and loaded.strategies == NEW
  for s in NEW:
    assert labels.strategy_label(s) in printed
    for cals in (loaded.calibrations, *loaded.tasks.values()):
      for c in cals[s]:
        tau, _ = calibration.formula_tau(s, c.length, 256, num_heads=config.num_heads,
                                         head_dim=config.head_dim)
        assert c.tau == tau and c.length >= 512
    # Evaluation applies each task's own entry.
    temp = temperature.task_temperature(temperature.make_temperature(
        config, schedule_path=str(out), schedule_strategy=s), 'b')
    c = loaded.tasks['b'][s][0]
    np.testing.assert_allclose(temp.taus(np.ones((1, c.length), np.int32)), [[c.tau]], rtol=1e-6)
