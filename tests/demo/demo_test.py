"""A shortened demo on the shipped model; its report is checked against a recomputation.

Its results and schedules are reused only for the run that made them; a corrupt results.json is
named; a calibration killed after k of its calibrations resumes from its progress log to the
schedule.json of an uninterrupted run."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import runs

from seqio_tasks import metrics
from t5align import calibration
from t5align import labels
from t5align import network
from t5align import run_identity
from t5align.demo import command
from t5align.demo import inputs
from t5align.demo import job
from t5align.demo import planning
from t5align.demo import reporting
from t5align.demo import store
from t5align.demo import temperatures
from t5align.demo import timing
from t5align.runtime import outputs
from t5align.shipped import assets
from t5align.shipped import heldout
from t5align.shipped import train_data

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_DIR = os.environ.get('T5ALIGN_MODEL_DIR', assets.ASSET_DIR)
STRATEGIES = ('pmax', 'log_length')
NUM_EXAMPLES = 4
NUM_REFERENCES = 3


def _settings(out: str, length: int, **changes) -> planning.DemoSettings:
  return dataclasses.replace(planning.DemoSettings(
      output_dir=out, model_dir=MODEL_DIR, lengths=(length,), strategies=STRATEGIES,
      num_examples=NUM_EXAMPLES, num_samples=1, num_references=NUM_REFERENCES,
      batch_size=NUM_EXAMPLES, controls=True), **changes)


# A demo run (~60 s on the 2-core machine): its tests are slow and share one xdist worker, in
# order (some rerun into its folder).
@pytest.fixture(scope='module')
def shortened(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('demo'))
  reference_length = assets.training_length(MODEL_DIR)
  length = 2 * reference_length
  results = job.run(_settings(out, length))
  return out, results, reference_length, length


@pytest.mark.slow
@pytest.mark.xdist_group('demo_shortened')
def test_report_files(shortened):
  out, _, _, _ = shortened
  for name in ('report.md', 'results.json', 'schedule.json', 'accuracy.png', 'analysis.json',
               'statistic_curves.png', 'temperature_curves.png', 'relpos_bias.png'):
    assert os.path.getsize(os.path.join(out, name)) > 0, name


def _model():
  params, config, vocab = assets.load_shipped(MODEL_DIR)
  config = dataclasses.replace(config, attention_impl='blockwise', dropout_rate=0.0)
  return network.Transformer(config), params, config, vocab


@pytest.mark.slow
@pytest.mark.xdist_group('demo_shortened')
def test_accuracy_equals_recomputation(shortened):
  out, results, reference_length, length = shortened
  model, params, _, vocab = _model()
  schedule = json.load(open(os.path.join(out, 'schedule.json'), encoding='utf-8'))
  expected = heldout.retrieval_accuracy(model, params, vocab, length=length,
                                        num_examples=NUM_EXAMPLES, seed=inputs.EVAL_SEED,
                                        batch_size=NUM_EXAMPLES, temperature=1.0)
  for task, value in expected.items():  # Every task at tau = 1 (passkey as a control).
    assert results['accuracy']['tau=1'][task][str(length)] == value, task
  # The tuned tasks, each at its own calibrated temperature; the controls at tau = 1 only.
  assert set(schedule['tasks']) == set(planning.DEFAULT.tuned_tasks) == {'lines', 'kv'}
  for task in planning.DEFAULT.tuned_tasks:
    tau = schedule['tasks'][task]['pmax'][0]['tau']
    value = heldout.retrieval_accuracy(model, params, vocab, tasks=[task], length=length,
                                       num_examples=NUM_EXAMPLES, seed=inputs.EVAL_SEED,
                                       batch_size=NUM_EXAMPLES, temperature=tau)[task]
    assert results['accuracy']['pmax'][task][str(length)] == value, task
  assert set(results['accuracy']['pmax']) == {'lines', 'kv'}
  # The report's Markdown tables print the same numbers.
  report = open(os.path.join(out, 'report.md'), encoding='utf-8').read()
  for task in train_data.TASKS:
    section = report.split(f'## Accuracy: {task}')[1]
    found = re.search(r'\| tau = 1 \| ([0-9]+) \[([0-9]+)-([0-9]+)\] '
                      r'\| ([0-9]+) \[([0-9]+)-([0-9]+)\] \|', section)
    cells = [int(c) for c in found.groups()]
    assert cells[0::3] == [
        round(results['accuracy']['tau=1'][task][str(L)]) for L in (reference_length, length)]
    for value, low, high in zip(cells[0::3], cells[1::3], cells[2::3]):  # 95% Wilson bounds.
      assert low <= value <= high and (low, high) != (0, 100), (task, cells)


def _read_predictions(out: str, row: str, length: int, task: str) -> list[dict]:
  with open(store.predictions_path(out, row, length, task), encoding='utf-8') as f:
    return [json.loads(line) for line in f]


# Each family's answer check, written out from the metrics' primitives (not `score_example`).
RESCORE = {
    'passkey': lambda target, prediction: metrics.first_integer(prediction) == int(target),
    'lines': lambda target, prediction: metrics.last_integer(prediction) == int(target),
    'kv': lambda target, prediction: target.lower() in prediction.lower(),
}


@pytest.mark.slow
@pytest.mark.xdist_group('demo_shortened')
def test_accuracy_rescored_from_written_predictions(shortened):
  """Every evaluated cell's accuracy from its predictions file, re-scored and averaged in float64;
  the examples' targets regenerated from their seed."""
  out, results, reference_length, length = shortened
  vocab = assets.load_shipped(MODEL_DIR)[2]
  for row, by_task in results['accuracy'].items():
    for task in by_task:
      for L in (reference_length, length):
        path = store.predictions_path(out, row, L, task)
        if not os.path.exists(path):  # A cell copied from an earlier row with the same tau.
          continue
        records = _read_predictions(out, row, L, task)
        examples = train_data.eval_examples(task, vocab, L, NUM_EXAMPLES, inputs.EVAL_SEED)
        assert [r['index'] for r in records] == list(range(NUM_EXAMPLES)), path
        assert [(r['target'], r['answer']) for r in records] == [
            (e.targets, e.answer) for e in examples], path
        assert all(r['input_tokens'] <= L for r in records), path
        hits = np.array([RESCORE[train_data.FAMILY[task]](r['answer'], r['prediction'])
                         for r in records], np.float64)
        assert results['accuracy'][row][task][str(L)] == pytest.approx(100.0 * hits.mean(),
                                                                       abs=1e-9), path
  # tau = 1 at L_ex is evaluated, never copied: its files exist for every task.
  for task in train_data.TASKS:
    assert os.path.exists(store.predictions_path(out, 'tau=1', length, task))


def _naive_greedy(apply, steps, eos_id, tau):
  """Greedy decoding without a cache: the whole model re-run on the growing prefix each step."""
  out = np.zeros((1, steps), np.int32)
  for t in range(steps):
    dec_in = np.zeros((1, steps), np.int32)
    dec_in[0, 1:t + 1] = out[0, :t]
    out[0, t] = int(np.argmax(np.asarray(apply(jnp.asarray(dec_in), tau))[0, t]))
    if out[0, t] == eos_id:
      break
  return out[0]


@pytest.mark.slow
@pytest.mark.xdist_group('demo_shortened')
@pytest.mark.parametrize('task,row', [('passkey', 'tau=1'), ('lines', 'pmax')])
def test_written_prediction_equals_uncached_greedy_decoding(shortened, task, row):
  """A cell's first answer at L_ex: the same text from a decoder that re-runs the whole model per
  token for the family's own steps (no cache, no `decoding` module), where the demo decoded
  every family for the longest answer's steps and cut the answer to its family's."""
  out, _, _, length = shortened
  model, params, _, vocab = _model()
  schedule = json.load(open(os.path.join(out, 'schedule.json'), encoding='utf-8'))
  [example] = train_data.eval_examples(task, vocab, length, 1, inputs.EVAL_SEED)
  tokens = np.zeros((1, length), np.int32)
  tokens[0, :len(example.input_ids)] = example.input_ids
  steps = heldout.DECODE_LENGTH[train_data.FAMILY[task]]
  # [1, length] inputs, [1, steps] decoder tokens -> [1, steps, vocab].
  apply = jax.jit(lambda dec, tau: model.apply(
      {'params': params}, jnp.asarray(tokens), dec, jnp.ones_like(dec), enable_dropout=False,
      temperature=tau))
  tau = 1.0 if row == 'tau=1' else schedule['tasks'][task][row][0]['tau']
  recorded = _read_predictions(out, row, length, task)[0]['prediction']
  naive = _naive_greedy(apply, steps, vocab.eos_id, jnp.float32(tau))
  assert vocab.decode(naive) == recorded


def test_decode_length_shorter_than_an_answer_is_refused():
  model, params, _, vocab = _model()
  with pytest.raises(ValueError, match=r"decode_length=8 is shorter than the 20 steps"):
    heldout.retrieval_predictions(model, params, vocab, tasks=['passkey', 'lines'], length=256,
                                  num_examples=1, decode_length=8)


@pytest.mark.cli
def test_demo_needs_no_seqio():
  """With seqio unimportable, the demo's modules import and its examples score (no TensorFlow)."""
  code = ('import sys; sys.modules["seqio"] = None\n'
          'from t5align import vocabularies\n'
          'from t5align.demo import command\n'
          'from t5align.shipped import assets, heldout, train_data\n'
          'import os\n'
          'v = vocabularies.SentencePieceVocabulary(\n'
          '    os.path.join(assets.ASSET_DIR, assets.VOCAB_FILE), t5_ids=True)\n'
          '[ex] = train_data.eval_examples("passkey", v, 256, 1, 1)\n'
          'assert ex.score(ex.targets) == 1.0\n'
          'heavy = [m for m in ("seqio", "tensorflow") if sys.modules.get(m) is not None]\n'
          'print(heavy); sys.exit(1 if heavy else 0)\n')
  env = {**os.environ, 'PYTHONPATH': REPO_ROOT, 'JAX_PLATFORMS': 'cpu'}
  done = subprocess.run([sys.executable, '-c', code], env=env, cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.cli
def test_command_line_is_the_package():
  """`python -m t5align.demo` runs `command.main`, whose docstring is the usage."""
  env = {**os.environ, 'PYTHONPATH': REPO_ROOT, 'JAX_PLATFORMS': 'cpu'}
  done = subprocess.run([sys.executable, '-m', 't5align.demo', '--help'], env=env, cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert done.stdout.startswith('usage: python -m t5align.demo [-h] [--output_dir OUTPUT_DIR]')
  assert command.__doc__.splitlines()[0] in done.stdout


def test_library_is_layered_and_never_imports_the_command():
  """Each library module of the demo imports only those listed before it (t5align/demo's
  docstring), none the command; neither do the benchmarks built on them."""
  from project import imports_test  # pylint: disable=g-import-not-at-top
  root = imports_test.REPO_ROOT
  order = ('__init__', 'inputs', 'planning', 'timing', 'store', 'temperatures', 'reporting',
           'job')
  assert {p.stem for p in (root / 't5align' / 'demo').glob('*.py')} == {
      *order, 'command', '__main__'}
  for i, name in enumerate(order):
    ours = {m for m in imports_test._imports(root / 't5align' / 'demo' / f'{name}.py')
            if m.startswith('t5align.demo')}
    assert ours <= {f't5align.demo.{m}' for m in order[1:i]}, (name, sorted(ours))
  for path in sorted(root.glob('benchmarks/*.py')):
    assert not imports_test._imports(path) & {'t5align.demo.command', 't5align.demo.__main__'}, (
        f'{path} imports the demo command')


@pytest.mark.slow
@pytest.mark.xdist_group('demo_shortened')
def test_temperatures_equal_recomputation(shortened):
  out, _, reference_length, length = shortened
  _, params, config, vocab = _model()
  schedule = json.load(open(os.path.join(out, 'schedule.json'), encoding='utf-8'))
  tuned = planning.DEFAULT.tuned_tasks
  # Per task: the task's prompts at L_ex against NUM_REFERENCES of the same task's at L_tr.
  pairs = {}
  for task in tuned:
    [(long, short)] = inputs.task_calibration_inputs(vocab, task, [length], reference_length, 1,
                                                     num_references=NUM_REFERENCES)
    assert long.shape == (1, length) and short.shape == (NUM_REFERENCES, reference_length)
    pairs[task] = (long, short)
    c = calibration.calibrate(params, config, long, 'pmax', reference_tokens=short,
                              reference_length=reference_length)
    assert schedule['tasks'][task]['pmax'][0]['tau'] == pytest.approx(c.tau)
  # Pooled: Algorithm 1 on the tasks' prompts together (the demo pools the per-task sweeps).
  long = np.concatenate([pairs[t][0] for t in tuned])
  short = np.concatenate([pairs[t][1] for t in tuned])
  c = calibration.calibrate(params, config, long, 'pmax', reference_tokens=short,
                            reference_length=reference_length)
  assert schedule['calibrations']['pmax'][0]['tau'] == pytest.approx(c.tau)
  assert schedule['calibrations']['pmax'][0]['achieved'] == pytest.approx(c.achieved, rel=1e-6)
  assert schedule['calibrations']['log_length'][0]['tau'] == pytest.approx(
      math.log(reference_length) / math.log(length))
  report = open(os.path.join(out, 'report.md'), encoding='utf-8').read()
  assert 'Per-task vs pooled temperatures' in report
  # Dispersion at tau = 1 equals the statistics of the same prompts.
  results = json.load(open(os.path.join(out, 'results.json'), encoding='utf-8'))
  stats = calibration.encoder_attention_stats(params, config, long, [1.0])
  np.testing.assert_allclose(results['dispersion'][str(length)]['pmax'], stats.pmax[0],
                             rtol=1e-5)


@pytest.mark.slow
@pytest.mark.xdist_group('demo_shortened')
def test_rerun_resumes_and_rejects_other_settings(shortened):
  out, results, _, length = shortened
  again = job.run(_settings(out, length))
  assert again['accuracy'] == results['accuracy']
  with pytest.raises(run_identity.RunMismatchError,
                     match=r'demo results .*results.json holds results of a different run; '
                           r'differing fields \(before -> now\): num_examples: 4 -> 5\.'):
    job.run(_settings(out, length, num_examples=NUM_EXAMPLES + 1))


class _Recalibrating(Exception):
  pass


@pytest.mark.slow
@pytest.mark.xdist_group('demo_shortened')
def test_schedule_of_another_calibration_is_recalibrated(shortened, tmp_path, monkeypatch,
                                                         capsys):
  """A schedule.json calibrated for other lengths or strategies is never reused (issue 23 #6):
  the run says which identity fields differ and calibrates again."""
  out, _, _, length = shortened
  saved = json.load(open(os.path.join(out, 'schedule.json'), encoding='utf-8'))
  identity = saved['provenance']['identity']
  # The recorded identity: the checkpoint's and vocabulary's content, not their paths.
  assert identity['checkpoint']['sha256'] == run_identity.checkpoint_fingerprint(
      assets.checkpoint_dir(MODEL_DIR))['sha256']
  assert identity['vocabulary'] == run_identity.file_fingerprint(
      os.path.join(MODEL_DIR, assets.VOCAB_FILE))
  assert (identity['lengths'], identity['strategies']) == ([length], list(STRATEGIES))
  logged = []
  assert store.reusable_schedule('s.json', saved, identity, logged.append) is not None
  assert logged == []
  # Calibrated elsewhere at the same content: the path is informational only.
  moved = {**identity, 'checkpoint_path': '/elsewhere/checkpoint_5000'}
  assert store.reusable_schedule('s.json', saved, moved, logged.append) is not None
  assert store.reusable_schedule('s.json', saved, {**identity, 'strategies': ['pmax']},
                                 logged.append) is None
  assert logged == ["temperature schedule s.json holds results of a different run; differing "
                    "fields (before -> now): strategies: [\"pmax\", \"log_length\"] -> "
                    "[\"pmax\"]. Recalibrating; the new calibration replaces it."]
  no_identity = {**saved, 'provenance': {}}
  assert store.reusable_schedule('s.json', no_identity, identity, logged.append) is None
  assert 'no record of the run that made them' in logged[-1]
  # Through `run`: the schedule of a 2 x L_tr calibration, a run asking 4 x L_tr.
  other = tmp_path / 'other'
  other.mkdir()
  shutil.copy(os.path.join(out, 'schedule.json'), other / 'schedule.json')

  def calibrate(*args, **kwargs):
    raise _Recalibrating()

  monkeypatch.setattr(job, '_calibrate', calibrate)
  with pytest.raises(_Recalibrating):
    job.run(_settings(str(other), 2 * length))
  assert f'lengths: [{length}] -> [{2 * length}]' in capsys.readouterr().err
  assert not (other / 'results.json').exists()


def test_results_of_other_weights_are_refused(tmp_path):
  """results.json records the model's content: cells made with other weights are never added
  to, whatever the path; a model folder moved elsewhere resumes."""
  # Written as format 1 (before records had a format), compared as today's (`upgrade`).
  recorded = {'model_dir': '/a', 'num_examples': 4,
              'checkpoint': {'sha256': 'aa', 'bytes': 10}, 'checkpoint_path': '/a/checkpoint_5'}
  settings = {**recorded, 'format': run_identity.FORMAT, 'jax_default_matmul_precision': None}
  path = str(tmp_path / 'results.json')
  json.dump({'settings': recorded, 'accuracy': {'tau=1': {'lines': {'512': 50.0}}}},
            open(path, 'w', encoding='utf-8'))
  moved = {**settings, 'model_dir': '/b', 'checkpoint_path': '/b/checkpoint_5'}
  assert store.Results(path, moved).get('tau=1', 'lines', 512) == 50.0
  with pytest.raises(run_identity.RunMismatchError,
                     match=r"differing fields \(before -> now\): checkpoint.sha256: 'aa' -> "
                           r"'bb'\. Use another --output_dir"):
    store.Results(path, {**settings, 'checkpoint': {'sha256': 'bb', 'bytes': 10}})
  json.dump({'accuracy': {}}, open(path, 'w', encoding='utf-8'))
  with pytest.raises(run_identity.RunMismatchError, match='no record of the run'):
    store.Results(path, settings)


def test_schedule_lock_is_calibrates_output_path_lock(tmp_path):
  """The demo holds the per-file lock of its schedule.json, the one calibrate takes on its
  OUTPUT_PATH: a calibration writing there is refused while the demo runs (issue 23 #11)."""
  out = tmp_path / 'demo'
  with store.claim_outputs(str(out)):
    with pytest.raises(outputs.OutputLockedError, match=r'OUTPUT_PATH .*schedule.json is in use '
                                                        r'by another run'):
      with outputs.claim(str(out / 'schedule.json'), 'OUTPUT_PATH', is_file=True):
        pass
  with outputs.claim(str(out / 'schedule.json'), 'OUTPUT_PATH', is_file=True):
    pass  # Released with the demo.


def test_vocabulary_larger_than_the_embedding_is_refused(tmp_path):
  """Before any weight is read or anything written (issue 23 #1)."""
  model_dir = tmp_path / 'model'
  model_dir.mkdir()
  checkpoint = assets.checkpoint_dir(MODEL_DIR)
  os.symlink(checkpoint, model_dir / os.path.basename(checkpoint))
  shutil.copy(os.path.join(MODEL_DIR, 'training.json'), model_dir)
  runs.vocabulary(model_dir / assets.VOCAB_FILE, extra_pieces=2000)
  out = tmp_path / 'out'
  with pytest.raises(ValueError, match=r'--model_dir vocabulary .*sentencepiece.model has 3000 '
                                       r'pieces but checkpoint .*checkpoint_\d+ embeds 1024 ids'):
    job.run(_settings(str(out), 512, model_dir=str(model_dir)))
  assert os.listdir(out) == []


def test_bad_settings_name_the_flag():
  for changes, message in (({'num_examples': 0}, '--num_examples=0'),
                           ({'num_samples': -1}, '--num_samples=-1'),
                           ({'calibration_seeds': -2}, '--calibration_seeds=-2'),
                           ({'strategies': ('pmx',)}, '--strategies pmx')):
    with pytest.raises(ValueError, match=re.escape(message)):
      dataclasses.replace(planning.DemoSettings(), **changes).check()
  with pytest.raises(ValueError, match='--lengths 256: every length must exceed L_tr = 256'):
    planning.make_plan(planning.DemoSettings(lengths=(256, 512)), 256)


def test_plan_of_each_mode():
  plan = planning.make_plan(planning.DemoSettings(), 256)
  assert plan.lengths == (512, 1024, 2048, 4096) and plan.eval_lengths[0] == 256
  assert plan.samples == {4096: 1, 2048: 2, 1024: 4, 512: 8}
  assert plan.rows == ('tau=1', 'pmax', 'entropy', 'log_length', 'pmax_per_layer')
  # Passkey only with --controls, and then at tau = 1 only.
  assert plan.row_tasks('tau=1') == plan.row_tasks('pmax') == plan.tasks == ('lines', 'kv')
  assert plan.control_tasks == ()
  controls = planning.make_plan(planning.DemoSettings(controls=True), 256)
  assert controls.control_tasks == ('passkey', 'passkey_decoys')
  assert controls.row_tasks('tau=1') == train_data.TASKS
  assert controls.row_tasks('pmax') == ('lines', 'kv')
  assert plan.seeds == (inputs.CALIBRATION_SEED,) and 'pmax_per_layer' not in plan.pooled
  full = planning.make_plan(planning.DemoSettings(full=True), 256)
  assert full.strategies == planning.STRATEGIES and full.row_tasks('pmax') == train_data.TASKS
  assert len(full.seeds) == 5 and 'prop1' not in full.rows and 'pmax_per_layer' in full.pooled
  both = planning.DemoSettings(full=True, controls=True)
  assert planning.make_plan(both, 256).control_tasks == ()


def _results(cells: dict, trials: int = 50) -> dict:
  """A results dict: {(row, task, length): accuracy}."""
  accuracy = {}
  for (row, task, length), value in cells.items():
    accuracy.setdefault(row, {}).setdefault(task, {})[str(length)] = value
  return {'settings': {'num_examples': trials}, 'accuracy': accuracy}


def _plan(rows=('tau=1', 'pmax', 'entropy')) -> planning.Plan:
  return planning.Plan(256, (1024, 4096), ('pmax', 'entropy'), rows, ('lines', 'kv'),
                       ('passkey', 'passkey_decoys'), (), {1024: 1, 4096: 1}, 1, (7,))


def _toy_results() -> dict:
  cells = {}
  for task in train_data.TASKS:
    for L in (256, 1024, 4096):
      cells[('tau=1', task, L)] = 100.0
  # The cases: lines at 1024 78 [65-87] vs 92 [81-97], kv at 4096 0 [0-7] vs 12 [6-24]
  # (intervals overlap: within noise); 0 vs 42 [29-56] (better); 96 [87-99] vs 70 [56-81]
  # (worse).
  cells.update({('tau=1', 'lines', 1024): 78.0, ('pmax', 'lines', 1024): 92.0,
                ('entropy', 'lines', 1024): 80.0, ('tau=1', 'kv', 4096): 0.0,
                ('pmax', 'kv', 4096): 42.0, ('entropy', 'kv', 4096): 12.0,
                ('tau=1', 'lines', 4096): 96.0, ('pmax', 'lines', 4096): 70.0,
                ('entropy', 'lines', 4096): 94.0, ('pmax', 'kv', 1024): 100.0,
                ('entropy', 'kv', 1024): 100.0})
  for row in ('pmax', 'entropy'):
    for task in ('lines', 'kv'):
      cells[(row, task, 256)] = cells[('tau=1', task, 256)]
  return _results(cells)


def test_observations_say_better_only_where_intervals_do_not_overlap():
  notes = reporting.observations(_toy_results(), _plan())
  text = '\n'.join(notes)
  lines_1024 = next(n for n in notes if n.startswith('  at 1024') and '78%' in n)
  assert 'better' not in lines_1024 and 'within noise of tau = 1 (78%' in lines_1024
  assert 'w/ P_max 92%' in lines_1024
  kv_4096 = [n for n in notes if n.startswith('  at 4096')][1]
  assert kv_4096 == ('  at 4096: better than tau = 1 (0%): w/ P_max 42%; within noise of tau = 1 '
                     '(0%; 95% intervals overlap): w/ H 12%.')
  lines_4096 = [n for n in notes if n.startswith('  at 4096')][0]
  assert lines_4096.startswith('  at 4096: worse than tau = 1 (96%): w/ P_max 70%;')
  assert 'passkey (control: evaluated at tau = 1 only)' in text


def test_headline_table_lists_controls_apart():
  table = reporting.headline_table(_toy_results(), _plan()).splitlines()
  assert table[0] == '| accuracy % (lines / kv) | 256 (L_tr) | 1024 | 4096 |'
  assert table[3] == '| w/ P_max | 100/100 | 92/100 | 70/42 |'
  assert table[-1] == ('| tau = 1: passkey / passkey_decoys (control) | 100/100 | 100/100 | '
                       '100/100 |')


def test_without_controls_no_control_row_panel_or_note():
  plan = dataclasses.replace(_plan(), control_tasks=())
  results = _toy_results()
  assert reporting.headline_table(results, plan).splitlines()[-1].startswith('| w/ H |')
  assert not any('passkey' in n for n in reporting.observations(results, plan))
  assert plan.tasks == ('lines', 'kv')


def test_accuracy_figure_intervals_marker_and_legend(saved_figure, tmp_path):
  results = _toy_results()
  fig = saved_figure(lambda: reporting.plot_accuracy(results, _plan(), str(tmp_path / 'a.png')))
  axes = fig.axes
  assert [ax.get_title() for ax in axes] == [
      'passkey (control, tau = 1)', 'passkey_decoys (control, tau = 1)', 'lines', 'kv']
  # The legend is the figure's, below the panels, never inside one.
  assert all(ax.get_legend() is None for ax in axes) and len(fig.legends) == 1
  assert [t.get_text() for t in fig.legends[0].get_texts()] == ['tau = 1', 'w/ P_max', 'w/ H']
  lines = axes[2]
  # One error bar per row (3) and the L_tr line; kv at 4096, w/ P_max: 42 [29-56].
  assert len(lines.containers) == 3
  assert any(np.allclose(l.get_xdata(), 256) for l in lines.get_lines())
  kv = axes[3].containers[1]
  y = kv.lines[0].get_ydata()[-1]
  segment = kv.lines[2][0].get_segments()[-1]
  assert y == 42.0 and segment[0][1] == pytest.approx(29.4, abs=0.1) and segment[1][1] == (
      pytest.approx(55.8, abs=0.1))
  assert [t.get_text() for t in lines.get_xticklabels()] == ['256', '1024', '4096']


# Seconds per evaluation cell measured in one default run (2-core machine, see README): a
# compilation at each length's first cell, then a cost per cell; the Eta is checked against them
# and against made-up splits between the L^2 and L parts of the cost.
def _simulated_cells(compile_s: float, quadratic: float, linear: float, fixed: float):
  lengths = [4096] * 12 + [2048] * 12 + [1024] * 12 + [512] * 12 + [256] * 4
  cost = [fixed + 50 * (quadratic * L * L + linear * L) for L in lengths]
  return [(L, c + (compile_s if i == 0 or lengths[i - 1] != L else 0.0))
          for i, (L, c) in enumerate(zip(lengths, cost))]


@pytest.mark.parametrize('compile_s,quadratic,linear,fixed', [
    (3.0, 0.28 / 4096**2, 0.0, 0.3),  # attention only
    (3.0, 0.20 / 4096**2, 0.08 / 4096, 0.3),  # a linear part as the prior assumes
    (6.0, 0.14 / 4096**2, 0.14 / 4096, 1.0),  # half linear at 4096, slow compiles
    (1.0, 0.30 / 4096**2, 0.0, 0.0),
])
def test_eta_within_2x_after_a_tenth_of_the_cells(compile_s, quadratic, linear, fixed):
  cells = _simulated_cells(compile_s, quadratic, linear, fixed)
  now = [0.0]
  eta = timing.Eta({i: (L, 50) for i, (L, _) in enumerate(cells)}, clock=lambda: now[0])
  for i, (_, seconds) in enumerate(cells):
    now[0] += seconds
    eta.advance(i)
    truth = sum(s for _, s in cells[i + 1:])
    if i + 1 >= math.ceil(len(cells) / 10):
      # Within 2x; in the last seconds (the L_tr cells), within 5 s.
      left = eta.seconds_left()
      assert truth / 2 <= left <= 2 * truth or abs(left - truth) < 5, (i, left, truth)


def test_eta_text_rate_and_compilations():
  now = [100.0]
  eta = timing.Eta({'a': (512, 0.0), 'b': (512, 1.0), 'c': (512, 3.0)}, clock=lambda: now[0])
  assert eta.advance('a') == ''  # Nothing with a multiplier done: no estimate.
  now[0] += 30.0
  assert eta.advance('b') == ', ETA 1m30s'  # 30 s per unit, 3 units to go.
  # 12 s for the first piece at 2048, 10 s for the next: 2 s of compiling; 1024 not reached
  # yet: its units cost (1024 / 2048)^p of 2048's, p = 2 (the prior, one length measured).
  eta = timing.Eta({0: (2048, 1.0), 1: (2048, 1.0), 2: (2048, 1.0), 3: (1024, 4.0)},
                   clock=lambda: now[0], prior=lambda L: L * L)
  now[0] += 12.0
  eta.advance(0)
  now[0] += 10.0
  eta.advance(1)
  assert eta.seconds_left() == pytest.approx(10.0 + 4 * 10.0 / 4 + 2.0)
  # p fitted between two measured lengths: 8 s per unit at 4096, 2.83 at 2048 -> p = 1.5.
  eta = timing.Eta({0: (4096, 1.0), 1: (4096, 1.0), 2: (2048, 1.0), 3: (2048, 1.0),
                    4: (1024, 1.0)}, clock=lambda: now[0])
  for key, seconds in enumerate((8.0, 8.0, 2.0 ** 1.5, 2.0 ** 1.5)):
    now[0] += seconds
    eta.advance(key)
  assert eta.seconds_left() == pytest.approx(1.0)


def test_calibration_passes_count_a_shared_sweep_once():
  assert timing.calibration_passes(('pmax', 'entropy', 'log_length', 'pmax_per_layer')) == {
      'pmax': 11, 'entropy': 0.0, 'log_length': 0.0, 'pmax_per_layer': 10}
  assert timing.calibration_passes(('pmax', 'entropy'), done=('grid',)) == {'pmax': 0.0,
                                                                           'entropy': 0.0}


def test_spread_table_and_calibration_spread():
  c = lambda s, L, tau: calibration.Calibration(s, L, 256, tau)
  seeds = [{'lines': {'pmax': (c('pmax', 512, 0.9), c('pmax', 1024, 0.85)),
                      'pmax_per_layer': (c('pmax_per_layer', 512, (0.90, 0.92)),)}},
           {'lines': {'pmax': (c('pmax', 512, 0.9), c('pmax', 1024, 0.80)),
                      'pmax_per_layer': (c('pmax_per_layer', 512, (0.91, 0.95)),)}}]
  spread = temperatures.calibration_spread(seeds)
  assert spread['lines']['pmax']['1024'] == {'taus': [0.85, 0.80], 'spread': pytest.approx(0.05)}
  assert spread['lines']['pmax_per_layer']['512']['spread'] == pytest.approx(0.03)
  table = reporting.spread_table(spread, [7, 8], [512, 1024])
  assert '0.850 [0.800-0.850]' in table and '0.900 [0.900-0.900]' in table
  assert 'range 0.030' in table


def test_report_states_the_calibration_sample():
  """Prompt counts per length with their noun's number, the seeds that drew them (issue 24:
  never '1 prompts')."""
  plan = planning.make_plan(planning.DemoSettings(), 256)
  assert reporting.calibration_sample(plan) == (
      'Temperatures calibrated per task (lines, kv) on 1 prompt of the task at 4096 tokens, '
      '2 prompts at 2048, 4 prompts at 1024, 8 prompts at 512 against 64 of its prompts at '
      'L_tr = 256 (sampling seed 7).')
  plan = planning.make_plan(planning.DemoSettings(full=True, num_samples=2, lengths=(512, 1024),
                                                  num_references=1), 256)
  assert reporting.calibration_sample(plan) == (
      'Temperatures calibrated per task (passkey, passkey_decoys, lines, kv) on 2 prompts of '
      'the task at 1024 tokens, 4 prompts at 512 against 1 of its prompts at L_tr = 256 '
      '(sampling seed 7; the calibration repeated with seeds 8, 9, 10, 11 for the spread '
      'below).')


@pytest.mark.slow
@pytest.mark.xdist_group('demo_shortened')
def test_report_of_the_run_states_its_sample(shortened):
  out, _, reference_length, length = shortened
  report = open(os.path.join(out, 'report.md'), encoding='utf-8').read()
  assert (f'on 1 prompt of the task at {length} tokens against {NUM_REFERENCES} of its prompts '
          f'at L_tr = {reference_length} (sampling seed {inputs.CALIBRATION_SEED}).') in report
  assert '1 prompts' not in report


def test_full_mode_runs_per_head_beside_per_layer():
  full = planning.make_plan(planning.DemoSettings(full=True), 256)
  at = full.rows.index('pmax_per_layer')
  assert full.rows[at:at + 2] == ('pmax_per_layer', 'pmax_per_head')
  assert full.rows[at + 2:] == planning.POSITIONAL
  default = planning.make_plan(planning.DemoSettings(), 256).strategies
  assert 'pmax_per_head' not in default and not set(planning.POSITIONAL) & set(default)
  assert labels.row_label('pmax_per_head') == 'w/ P_max (per head)'
  c = lambda s, tau: calibration.Calibration(s, 512, 256, tau)
  per_head = np.array([[0.8, 0.9], [1.0, 0.6], [0.7, 0.7]])  # [layers, heads]
  table = reporting.temperature_table(
      {'lines': {'pmax_per_layer': (c('pmax_per_layer', (0.9, 0.8, 0.7)),),
                 'pmax_per_head': (c('pmax_per_head', per_head),)}},
      ('pmax_per_layer', 'pmax_per_head'), (512,)).splitlines()
  assert table[2].split()[-1] == '0.900/0.800/0.700'
  assert table[3].split()[-1] == '0.850/0.800/0.700'  # Each layer's mean over its heads.
  # A per-head tau reaches the encoder as [1, layers, heads]; per layer as [1, layers].
  assert temperatures.encoder_temperature(per_head[None], 3).shape == (1, 3, 2)
  assert temperatures.encoder_temperature((0.9, 0.8, 0.7), 3).shape == (1, 3)
  assert timing.calibration_passes(('pmax_per_head', 'pmax_bisect')) == {
      'pmax_per_head': 20.0, 'pmax_bisect': 6.0}


def test_corrupt_demo_results_json(tmp_path):
  from t5align.demo import store  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'results.json'
  path.write_text('{"settings": {}, "acc')
  with pytest.raises(ValueError, match=rf'demo results {path}:1: not valid JSON'):
    store.Results(str(path), {})


class _Killed(Exception):
  pass


@pytest.mark.slow
def test_demo_calibration_killed_after_k_calibrations_resumes_to_the_same_schedule(
    tmp_path, monkeypatch):
  from t5align import calibration  # pylint: disable=g-import-not-at-top
  from t5align.calibration import strategies  # pylint: disable=g-import-not-at-top
  from t5align.demo import inputs, job, planning, store as demo_store  # pylint: disable=g-import-not-at-top
  settings = planning.DemoSettings(
      output_dir=str(tmp_path), model_dir=str(runs.ASSET), strategies=('pmax', 'log_length'),
      num_examples=2, num_samples=1, num_references=2, batch_size=2)
  reference_length = assets.training_length(str(runs.ASSET))
  settings = dataclasses.replace(settings, lengths=(2 * reference_length,))
  params, config, vocab = assets.load_shipped(str(runs.ASSET))
  config = dataclasses.replace(config, attention_impl=settings.attention_impl, dropout_rate=0.0)
  plan = planning.make_plan(settings, reference_length)
  prompts = [{t: {L: inputs.task_prompts(vocab, t, L, plan.samples[L], seed) for L in plan.lengths}
              for t in plan.tuned_tasks} for seed in plan.seeds]
  references = [{t: inputs.task_prompts(vocab, t, plan.reference_length, plan.num_references,
                                        seed) for t in plan.tuned_tasks} for seed in plan.seeds]
  identity = demo_store.calibration_identity(settings, plan, config, prompts, references)
  calibrate = strategies.calibrate
  calls = []

  def counted(*args, **kwargs):
    calls.append(args[3])  # The strategy.
    if kill_after is not None and len(calls) > kill_after:
      raise _Killed()
    return calibrate(*args, **kwargs)

  monkeypatch.setattr(strategies, 'calibrate', counted)

  def run(folder):
    folder.mkdir(exist_ok=True)
    return job._calibrate(params, config, plan, prompts, references, identity,  # pylint: disable=protected-access
                          calibration.Memo(), None, time.time(), str(folder))

  kill_after = None
  run(tmp_path / 'whole')
  total = len(calls)
  assert total >= 4  # Per task and pooled, of each strategy.
  kill_after, calls[:] = total // 2, []
  with pytest.raises(_Killed):
    run(tmp_path / 'killed')
  log = tmp_path / 'killed' / 'schedule.json.partial.jsonl'
  logged = [json.loads(line) for line in log.read_text().splitlines()]
  assert logged[0]['key'] == 'identity' and len(logged) == 1 + kill_after
  assert not (tmp_path / 'killed' / 'schedule.json').exists()
  kill_after, calls[:] = None, []
  run(tmp_path / 'killed')
  assert len(calls) == total - total // 2  # Only what the kill left undone.
  assert not log.exists()
  assert ((tmp_path / 'killed' / 'schedule.json').read_bytes()
          == (tmp_path / 'whole' / 'schedule.json').read_bytes())
