"""The calibrate CLI and jobs.CalibrationJob: fidelity to the paper (evaluation's precision,
per-task calibration), settings and inputs refused before any work, and no lost work.

Bad settings (LENGTHS, STRATEGIES, REFERENCE_LENGTH, RELPOS_HEADS, a folder as OUTPUT_PATH, a file
as ANALYSIS_DIR), a non-UTF-8 JSONL_FILE and a vocabulary larger than the checkpoint's embedding
are refused before the checkpoint is read or anything written; RELPOS_HEADS against the
checkpoint's own head count once its weights are read. A full disk keeps every finished
calibration (schedule.json.partial.jsonl), and the rerun computes only the rest.
"""
from __future__ import annotations

import errno
import hashlib
import os
import pathlib

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import runs

from t5align import calibrate
from t5align import calibration
from t5align.calibration import samples
from t5align import checkpoints
from t5align.evaluation import temperature as temperature_lib
from t5align import jobs
from t5align.jobs import calibration_job
from t5align import network
from t5align.runtime import fileio
from t5align.runtime import records
from t5align import schedule
from t5align.shipped import assets
from t5align import vocabularies

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
ASSET = REPO_ROOT / 't5align' / 'shipped' / 'retrieval_t5'
CKPT = pathlib.Path(assets.checkpoint_dir(str(ASSET)))
TINY = REPO_ROOT / 'tests' / 'testdata' / 't5x' / 't5_1_0_tiny' / 'legacy' / 'checkpoint_0'
MODEL_BINDINGS = []  # gin/models/retrieval_small.gin as shipped.


@pytest.fixture
def clean_gin(clean_gin, monkeypatch):
  """conftest's clean gin config, with the repository root as the working directory (the gin
  files' paths are relative to it)."""
  monkeypatch.chdir(REPO_ROOT)
  return clean_gin


def _text_file(tmp_path: pathlib.Path) -> str:
  """Filler text like the shipped model's training data (its SentencePiece model reads it)."""
  rng = np.random.default_rng(0)
  words = ['The', 'grass', 'is', 'green.', 'sky', 'blue.', 'sun', 'yellow.', 'Here', 'we', 'go.',
           'There', 'and', 'back', 'again.', 'pass', 'key', '12345.', 'Remember', 'it.']
  text = tmp_path / 'corpus.txt'
  text.write_text('\n'.join(' '.join(rng.choice(words, 30)) for _ in range(40)) + '\n')
  return str(text)


def _eval_path_stats(dtype: str, tokens: np.ndarray, taus) -> np.ndarray:
  """Mean row P_max per tau as t5align.eval's model computes it (gin/runs/eval.gin + tiny.gin)."""
  gin.clear_config()
  gin.parse_config_files_and_bindings(
      ['gin/runs/eval.gin', 'gin/models/retrieval_small.gin'],
      [f"ACTIVATION_DTYPE = '{dtype}'"], finalize_config=False)
  model = gin.get_configurable(network.Transformer)()
  gin.clear_config()
  # As jobs.EvalJob loads it (PARAMS_DTYPE float32, the model file's config).
  params, config = checkpoints.load_params(CKPT, model.config, dtype=jnp.float32)
  model = network.Transformer(config)

  @jax.jit  # Evaluation's encoder runs jit-compiled (decoding.greedy_decode).
  def pmax(tau):
    _, state = model.apply({'params': params}, tokens, method='encode', enable_dropout=False,
                           temperature=tau, mutable=['intermediates'])
    return network.mean_row_stats(
        network.encoder_row_stats(state['intermediates'], config.num_encoder_layers))['pmax']

  return np.asarray([pmax(jnp.float32(tau)) for tau in taus], np.float64)


@pytest.mark.cli
def test_calibration_computes_in_the_evaluation_dtype(tmp_path, clean_gin):
  # One macro, ACTIVATION_DTYPE, sets the dtype of both: calibrate.gin's `dtype` and the model
  # file's T5Config.dtype (the config t5align.eval runs).
  text, vocab = _text_file(tmp_path), str(ASSET / 'sentencepiece.model')
  out = tmp_path / 'schedule.json'
  calibrate.main([
      '--gin_file=gin/calibrate.gin', '--gin_file=gin/models/retrieval_small.gin',
      '--gin_bindings=jobs.CalibrationJob.config = @network.T5Config()',
      "--gin.ACTIVATION_DTYPE='bfloat16'", f'--gin.CHECKPOINT_PATH={CKPT}',
      f'--gin.TEXT_FILE={text}', f'--gin.VOCABULARY_PATH={vocab}', f'--gin.OUTPUT_PATH={out}',
      '--gin.LENGTHS=(128,)', '--gin.REFERENCE_LENGTH=64', '--gin.NUM_SAMPLES=2',
      "--gin.STRATEGIES=('pmax',)"])
  loaded = schedule.load_schedule(str(out))
  assert loaded.provenance['dtype'] == 'bfloat16'
  cal = loaded.calibrations['pmax'][0]
  stream = samples.text_file_stream(text, vocabularies.load_vocabulary(vocab))
  tokens = samples.sample_windows(stream, 2, 128, seed=0, eos_id=1)
  reference = calibration.cut_to_length(tokens, 64, 1)
  grid = cal.details['grid']
  calibrated = np.asarray([cal.target] + list(cal.details['values']))
  bf16 = np.concatenate([_eval_path_stats('bfloat16', reference, [1.0]),
                         _eval_path_stats('bfloat16', tokens, grid)])
  f32 = np.concatenate([_eval_path_stats('float32', reference, [1.0]),
                        _eval_path_stats('float32', tokens, grid)])
  # Measured on the project's 2-core CPU: calibration and evaluation paths at bfloat16 agree to
  # 8.3e-5 relative (the encoder compiled in two programs); loading the parameters in bfloat16
  # (what calibrate did before, with dtype = 'bfloat16') moved them by 1.4e-3.
  np.testing.assert_allclose(calibrated, bf16, rtol=2e-4)
  # The bfloat16 statistics are not the float32 ones (their gap on this small model is only
  # ~6e-5 relative, within the tolerance above: the dtype itself is checked exactly).
  assert np.any(f32 != bf16)
  with pytest.raises(ValueError, match='the dtype evaluation uses'):
    calibration_job.activation_dtype(network.T5Config(vocab_size=8, dtype=jnp.float32), 'bfloat16')


def _task_jsonl(tmp_path: pathlib.Path) -> str:
  """Two tasks' whole inputs: passkey-style prompts and numbered-line prompts (~150-250 tokens)."""
  import json  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  filler = ('The grass is green. The sky is blue. The sun is yellow. Here we go. '
            'There and back again.')
  records = []
  for i in range(2):
    key = int(rng.integers(10000, 99999))
    records.append({'task': 'passkey', 'inputs': (
        'There is an important info hidden inside a lot of irrelevant text. Find it. '
        + ' '.join([filler] * (3 + i)) + f' The pass key is {key}. Remember it. '
        + ' '.join([filler] * 3) + ' What is the pass key? The pass key is')})
    lines = ' '.join(f'line {w}: REGISTER_CONTENT is <{int(rng.integers(1000, 9999))}>.'
                     for w in range(12 + 4 * i))
    records.append({'task': 'lines', 'inputs': lines + ' Tell me what is the number in line 3?'})
  path = tmp_path / 'tasks.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in records))
  return str(path)


@pytest.mark.cli
def test_per_task_calibration_on_the_shipped_model(tmp_path, clean_gin, capsys):
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  from t5align.evaluation import temperature  # pylint: disable=g-import-not-at-top
  vocab = str(ASSET / 'sentencepiece.model')
  jsonl = _task_jsonl(tmp_path)
  out = tmp_path / 'schedule.json'
  calibrate.main([
      '--gin_file=gin/calibrate.gin', '--gin_file=gin/models/retrieval_small.gin',
      '--gin_bindings=jobs.CalibrationJob.config = @network.T5Config()',
      f'--gin.CHECKPOINT_PATH={CKPT}', f'--gin.JSONL_FILE={jsonl}',
      f'--gin.VOCABULARY_PATH={vocab}', f'--gin.OUTPUT_PATH={out}', '--gin.LENGTHS=(128,)',
      f'--gin.ANALYSIS_DIR={tmp_path / "analysis"}', '--gin.RELPOS_HEADS=(2, 0)',
      '--gin.REFERENCE_LENGTH=64', '--gin.NUM_SAMPLES=2',
      "--gin.STRATEGIES=('pmax', 'log_length')"])
  printed = capsys.readouterr().out
  loaded = schedule.load_schedule(str(out))
  assert sorted(loaded.tasks) == ['lines', 'passkey']
  sp = spm.SentencePieceProcessor(model_file=vocab)
  period = {i for i in range(sp.get_piece_size()) if sp.id_to_piece(i).endswith('.')}
  for task, cals in loaded.tasks.items():
    record = loaded.provenance['per_task'][task]
    cal = cals['pmax'][0]
    # L_ex is the task's longest whole input; the reference is the task cut below L_tr = 64.
    assert cal.length == record['length'] > 128 and record['reference_width'] <= 64
    # Algorithm 1: the grid tau whose statistic is nearest the L_tr target.
    values = np.asarray(cal.details['values'])
    assert cal.tau == cal.details['grid'][int(np.argmin(np.abs(values - cal.target)))]
    np.testing.assert_allclose(cals['log_length'][0].tau, np.log(64) / np.log(cal.length))
    # The per-task vs pooled table reports this task's tau, the pooled tau at its L_ex and the
    # difference.
    pooled = float(loaded.tau_for_length(cal.length, 'pmax'))
    assert f'{task:<32}{cal.length:>8}{cal.tau:>10.3f}{pooled:>12.3f}{cal.tau - pooled:>+8.3f}' \
        in printed
  # Tables 1 and 7 per task are printed and written.
  assert 'Dispersion per task' in printed and 'l_max' in printed
  assert 'Dispersion per task' in (tmp_path / 'analysis' / 'dispersion.txt').read_text()
  # The reference rows end at a sentence boundary ('.' piece) then EOS.
  rows = samples.jsonl_examples(jsonl, sp.encode, sp.eos_id(), 2)['passkey']
  _, ref = samples.task_inputs(rows, 64, sp.eos_id(), sorted(period))
  for row in ref:
    row = row[row > 0]
    assert row[-1] == sp.eos_id() and row[-2] in period and len(row) <= 64
  # t5align.eval applies a task's own entry; another task is refused, or given the pooled one
  # (with a warning) when the user allows it.
  temp = temperature.Temperature(schedule=loaded)
  tokens = np.ones((1, loaded.tasks['lines']['pmax'][0].length), np.int32)
  np.testing.assert_allclose(temperature_lib.task_temperature(temp, 'lines').taus(tokens),
                             [[loaded.tasks['lines']['pmax'][0].tau]], rtol=1e-6)
  with pytest.raises(ValueError, match=r"^the schedule has no calibration for task 'other' "
                                       r'\(it has .*lines.*\): its pooled temperatures'):
    temperature_lib.task_temperature(temp, 'other')
  with pytest.warns(UserWarning, match="no calibration for task 'other'"):
    other = temperature_lib.task_temperature(temp, 'other', allow_pooled=True)
  assert other.schedule is loaded


@pytest.mark.cli
@pytest.mark.tensorflow
def test_per_task_calibration_of_seqio_tasks(tmp_path, clean_gin, monkeypatch):
  # passkey at 5k characters (1 example, ~1.5k tokens with the shipped vocabulary) against its
  # setting nearest L_tr = 600: passkey at 2k characters (599 tokens), as in the paper.
  import seqio  # pylint: disable=g-import-not-at-top
  import seqio_tasks  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401  (registers the tasks)
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(ASSET / 'sentencepiece.model'))
  out = tmp_path / 'schedule.json'
  calibrate.main([
      '--gin_file=gin/calibrate.gin', '--gin_file=gin/models/retrieval_small.gin',
      '--gin_bindings=jobs.CalibrationJob.config = @network.T5Config()',
      '--gin_bindings=seqio_tasks.options.passkey_examples = 1',
      '--gin.SEQIO_SPLIT=test',
      f'--gin.CHECKPOINT_PATH={CKPT}', f'--gin.OUTPUT_PATH={out}',
      '--gin.SEQIO_TASK=t5align_passkey_5k', '--gin.LENGTHS=(640,)',
      '--gin_bindings=calibration.SearchSettings.grid = (1.0, 0.8)',
      "--gin.REFERENCE_TASKS={'t5align_passkey_5k': 't5align_passkey_2k'}",
      '--gin.REFERENCE_LENGTH=600', '--gin.NUM_SAMPLES=1', "--gin.STRATEGIES=('pmax',)"])
  loaded = schedule.load_schedule(str(out))
  record = loaded.provenance['per_task']['t5align_passkey_5k']
  cal = loaded.tasks['t5align_passkey_5k']['pmax'][0]
  example = lambda name: next(seqio.get_mixture_or_task(name).get_dataset(
      sequence_length=None, split='test', shuffle=False).as_numpy_iterator())['inputs']
  long, short = example('t5align_passkey_5k'), example('t5align_passkey_2k')
  assert record['reference'] == 't5align_passkey_2k' and record['reference_width'] == len(short)
  assert cal.length == len(long) > 1024 and cal.details['grid'] == [1.0, 0.8]
  # The target is the 2k setting's whole input at tau = 1, computed here by the model directly.
  params, config = checkpoints.load_params(CKPT, dtype=jnp.float32)
  _, state = network.Transformer(config).apply(
      {'params': params}, short[None], method='encode', enable_dropout=False, temperature=1.0,
      mutable=['intermediates'])
  target = network.mean_row_stats(
      network.encoder_row_stats(state['intermediates'], config.num_encoder_layers))['pmax']
  np.testing.assert_allclose(cal.target, target, rtol=1e-5)


@pytest.mark.cli
@pytest.mark.tensorflow
def test_seqio_task_takes_several_comma_separated_tasks(tmp_path, clean_gin):
  # As gin/calibrate.gin documents: SEQIO_TASK names several tasks; the pooled calibration samples
  # all of them, and each gets its own entry. No `import seqio_tasks` binding is needed, and the
  # tasks' vocabulary is bound on the command line.
  out = tmp_path / 'schedule.json'
  calibrate.main([
      '--gin_file=gin/calibrate.gin', '--gin_file=gin/models/retrieval_small.gin',
      '--gin_bindings=jobs.CalibrationJob.config = @network.T5Config()',
      f'--gin.seqio_tasks.vocabulary_path.path={ASSET / "sentencepiece.model"}',
      '--gin_bindings=seqio_tasks.options.passkey_examples = 1',
      '--gin.SEQIO_SPLIT=test',
      f'--gin.CHECKPOINT_PATH={CKPT}', f'--gin.OUTPUT_PATH={out}',
      '--gin.SEQIO_TASK=t5align_passkey_2k, t5align_passkey_5k', '--gin.LENGTHS=(512,)',
      '--gin_bindings=calibration.SearchSettings.grid = (1.0, 0.8)', '--gin.REFERENCE_LENGTH=256',
      '--gin.NUM_SAMPLES=1', "--gin.STRATEGIES=('pmax',)"])
  loaded = schedule.load_schedule(str(out))
  assert sorted(loaded.tasks) == ['t5align_passkey_2k', 't5align_passkey_5k']
  assert loaded.provenance['seqio_task'] == 't5align_passkey_2k, t5align_passkey_5k'
  # The pooled samples are windows of both tasks' inputs, concatenated.
  stream = np.concatenate([samples.seqio_task_stream(t, 'test')
                           for t in ('t5align_passkey_2k', 't5align_passkey_5k')])
  want = samples.sample_windows(stream, 1, 512, 0, eos_id=1)
  assert loaded.provenance['samples_sha256'] == hashlib.sha256(want.tobytes()).hexdigest()


@pytest.mark.tensorflow
def test_a_split_the_task_lacks_is_refused_naming_seqio_split(tmp_path, clean_gin, monkeypatch):
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(ASSET / 'sentencepiece.model'))
  with pytest.raises(ValueError, match=r"SEQIO_SPLIT = 'validation': the task t5align_passkey_2k "
                                       r"has the split\(s\) 'test'; pass --gin.SEQIO_SPLIT="):
    calibrate.main([
        '--gin_file=gin/calibrate.gin', f'--gin.CHECKPOINT_PATH={CKPT}',
        f'--gin.OUTPUT_PATH={tmp_path / "s.json"}', '--gin.SEQIO_TASK=t5align_passkey_2k',
        '--gin.REFERENCE_LENGTH=256', '--gin.LENGTHS=(512,)'])
  assert not (tmp_path / 's.json').exists()


@pytest.mark.slow
@pytest.mark.tensorflow
def test_a_mixtures_stream_is_each_of_its_tasks_once(clean_gin, monkeypatch):
  # seqio's mixture dataset samples by rate and repeats without end: read through it, the stream
  # was 10M tokens drawn from the same few examples (and took half a minute per calibration).
  pytest.importorskip('seqio')
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(ASSET / 'sentencepiece.model'))
  import seqio  # pylint: disable=g-import-not-at-top
  import seqio_tasks  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  clean_gin.bind_parameter('seqio_tasks.options.passkey_examples', 2)
  tasks = [t.name for t in seqio.get_subtasks(seqio.get_mixture_or_task('t5align_passkey'))]
  assert len(tasks) == 8
  pieces = []
  for task in tasks:
    for ex in seqio.get_mixture_or_task(task).get_dataset(
        None, split='test', shuffle=False).as_numpy_iterator():
      assert ex['inputs'][-1] == 1 and (ex['inputs'][:-1] > 1).all()  # EOS only at the end.
      pieces.append(ex['inputs'][:-1])
  np.testing.assert_array_equal(samples.seqio_task_stream('t5align_passkey', 'test'),
                                np.concatenate(pieces))


def test_reference_length_other_than_the_models_training_length_warns():
  with pytest.warns(UserWarning, match=r'REFERENCE_LENGTH=512, but .*checkpoint_5000 was trained '
                                       r'at L_tr = 256 .*training.json.*Set REFERENCE_LENGTH=256'):
    assets.check_reference_length(str(CKPT), 512, 'REFERENCE_LENGTH')
  import warnings  # pylint: disable=g-import-not-at-top
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    assets.check_reference_length(str(CKPT), 256)
    assets.check_reference_length('/no/such/checkpoint_1', 512)  # Not knowable: silent.


# Settings and inputs refused before any work; a full disk loses no finished calibration.


def _no_work(monkeypatch):
  """Makes reading the inputs or the weights fail the test: the settings must be refused first."""
  def fail(*args, **kwargs):
    raise AssertionError('work started before the settings were checked')
  monkeypatch.setattr(samples, 'read_inputs', fail)
  monkeypatch.setattr(checkpoints, 'load_params', fail)


THREE_HEADS = network.T5Config(vocab_size=8, num_heads=3)


def test_calibrate_refuses_a_directory_output_path_before_any_work(tmp_path):
  (tmp_path / 'schedule.json').mkdir()
  with pytest.raises(IsADirectoryError, match=rf'OUTPUT_PATH {tmp_path / "schedule.json"} is a '
                                              'directory'):
    jobs.CalibrationJob(checkpoint=jobs.Checkpoint('/no/such/checkpoint'),
                        output_path=str(tmp_path / 'schedule.json'),
                        text_file='x').run()


@pytest.mark.parametrize('setting, message', [
    ({'lengths': (100,)}, r'^LENGTHS=\(100,\): 100 is not an integer >= 256 \(REFERENCE_LENGTH, '
                          r'L_tr = 256: calibration aligns longer inputs to it\)\.$'),
    # The fields' own checks, as the job is built.
    ({'lengths': 'abc'}, r"^jobs\.CalibrationJob\.lengths = 'abc': expected a non-empty tuple "
                         r'of integers >= 2\.$'),
    ({'lengths': 512}, r'^jobs\.CalibrationJob\.lengths = 512: expected a non-empty tuple'),
    ({'strategies': 'pmax'}, r"^jobs\.CalibrationJob\.strategies = 'pmax': expected distinct "
                             r'strategy names .*STRATEGIES=\(\'pmax\',\); known: pmax, entropy'),
    ({'strategies': ('pmax', 'p_max')}, r"STRATEGIES=\('pmax', 'p_max'\): 'p_max' is not a "
                                        r'strategy'),
    ({'reference_length': 'x'}, r"^jobs\.CalibrationJob\.reference_length = 'x': expected an "
                                r'integer >= 2\.$'),
    ({'per_task': 'no'}, r"^jobs\.CalibrationJob\.per_task = 'no': expected True or False\.$"),
    ({'num_samples': 0}, r'^jobs\.CalibrationJob\.num_samples = 0: expected a positive '
                         r'integer\.$'),
    ({'mesh_shape': (2, 0)}, r'^jobs\.CalibrationJob\.mesh_shape = \(2, 0\): expected a '
                             r'non-empty tuple of positive integers or None \(one device\) '
                             r'\(0 is not\)\.$'),
    ({'dtype': 'int8'}, r"^jobs\.CalibrationJob\.dtype = 'int8': expected a floating dtype's "
                        r'name'),
    ({'reference_tasks': ['t']}, r"^jobs\.CalibrationJob\.reference_tasks = \['t'\]: expected "
                                 r'a dict from strings to a non-blank string or None\.$'),
])
def test_calibrate_settings_are_checked_before_the_checkpoint(tmp_path, no_load, setting,
                                                              message):
  with pytest.raises(ValueError, match=message):
    jobs.CalibrationJob(**{**runs.calibrate_args(tmp_path),
                           'checkpoint': jobs.Checkpoint('/no/such'), **setting}).run()


@pytest.mark.parametrize('heads, config, message', [
    ((99,), THREE_HEADS, r'RELPOS_HEADS=\(99,\): .*3 heads, 0\.\.2'),
    ((0, 3), THREE_HEADS, r'RELPOS_HEADS=\(0, 3\): .*3 heads'),
    ((-1,), None, r'^jobs\.CalibrationJob\.relpos_heads = \(-1,\): expected a non-empty tuple '
                  r'of integers >= 0 or None \(the first 16\) \(-1 is not\)\.$'),
    ((), None, r'^jobs\.CalibrationJob\.relpos_heads = \(\): expected a non-empty tuple'),
    (('a',), None, r"^jobs\.CalibrationJob\.relpos_heads = \('a',\): expected a non-empty tuple"),
], ids=['past_config', 'one_past', 'negative', 'empty', 'not_int'])
def test_calibrate_refuses_bad_relpos_heads_before_any_work(heads, config, message, tmp_path,
                                                            monkeypatch):
  """Once refused only after the whole calibration, unnamed, with 4 of 7 analysis files."""
  _no_work(monkeypatch)
  out, analysis_dir = tmp_path / 'schedule.json', tmp_path / 'analysis'
  with pytest.raises(ValueError, match=message):
    jobs.CalibrationJob(checkpoint=jobs.Checkpoint('/no/such/checkpoint'), output_path=str(out),
                        text_file='corpus.txt',
                        vocabulary_path='v.model', config=config, analysis_dir=str(analysis_dir),
                        relpos_heads=heads).run()
  assert not analysis_dir.exists() and not out.exists()
  assert not os.path.exists(calibration_job.progress_path(str(out)))


def test_calibrate_checks_relpos_heads_once_the_weights_tell_the_heads(tmp_path, monkeypatch):
  """Without a config, the head count is the checkpoint's: checked once its weights are read,
  before any sample is drawn or sweep run, and nothing is written."""
  def fail(*args, **kwargs):
    raise AssertionError('a sweep started before RELPOS_HEADS was checked')
  monkeypatch.setattr(samples, 'sample_windows', fail)
  text = tmp_path / 'corpus.txt'
  text.write_text('some words to tokenize, and some more\n' * 50)
  vocab = tmp_path / 'spm.model'  # Few pieces: the tiny checkpoint embeds 100 ids.
  vocabularies.train_sentencepiece([text.read_text()] * 4, str(vocab), 40)
  out, analysis_dir = tmp_path / 'schedule.json', tmp_path / 'analysis'
  with pytest.raises(ValueError, match=r'RELPOS_HEADS=\(99,\): .*heads, 0\.\.'):
    jobs.CalibrationJob(checkpoint=jobs.Checkpoint(str(TINY)),
                        output_path=str(out), text_file=str(text),
                        vocabulary_path=str(vocab), analysis_dir=str(analysis_dir),
                        relpos_heads=(99,), reference_length=16, lengths=(32,)).run()
  assert not analysis_dir.exists() and not out.exists()


def test_calibrate_refuses_a_file_as_analysis_dir_before_any_work(tmp_path, monkeypatch):
  _no_work(monkeypatch)
  (tmp_path / 'analysis').write_text('x')
  with pytest.raises(NotADirectoryError, match=rf'ANALYSIS_DIR {tmp_path / "analysis"} is a file'):
    jobs.CalibrationJob(checkpoint=jobs.Checkpoint(str(TINY)),
                        output_path=str(tmp_path / 'schedule.json'),
                        text_file='corpus.txt', vocabulary_path='v.model',
                        analysis_dir=str(tmp_path / 'analysis')).run()


def test_non_utf8_jsonl_names_file_and_line(tmp_path, no_load):
  jsonl = tmp_path / 'tasks.jsonl'
  jsonl.write_bytes(b'{"inputs": "fine"}\n{"inputs": "bad \xff byte"}\n')
  with pytest.raises(ValueError, match=rf'{jsonl}:2: not UTF-8 text \(invalid start byte at '
                                       r'byte 16\)'):
    jobs.CalibrationJob(**{**runs.calibrate_args(tmp_path), 'text_file': None,
                        'jsonl_file': str(jsonl)}).run()


def test_calibrate_refuses_a_vocabulary_larger_than_the_embedding(tmp_path, no_load):
  big = runs.vocabulary(tmp_path / 'big.model', extra_pieces=2000)
  with pytest.raises(ValueError, match=rf'VOCABULARY_PATH {big} has 3000 pieces but checkpoint '
                                       rf'{CKPT} embeds 1024 ids'):
    jobs.CalibrationJob(**{**runs.calibrate_args(tmp_path), 'vocabulary_path': big}).run()


@pytest.mark.slow
def test_a_full_disk_keeps_finished_calibrations_and_the_rerun_resumes(tmp_path,
                                                                       monkeypatch):
  log_path = tmp_path / 'schedule.json.partial.jsonl'
  original = fileio.write_synced
  writes = []

  def disk(space: int):
    """A file system with room for `space` more writes (counted across every file)."""
    def write(f, data):
      if len(writes) >= space:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      writes.append(f.name)
      original(f, data)
    return write

  calls = []
  real_calibrate = calibration.strategies.calibrate
  monkeypatch.setattr(calibration.strategies, 'calibrate',
                      lambda *a, **k: calls.append(a[3]) or real_calibrate(*a, **k))
  # Room for three writes: L_ex = 384's two calibrations (the first with the run identity) and
  # 512's first.
  monkeypatch.setattr(fileio, 'write_synced', disk(3))
  with pytest.raises(OSError, match=rf'\[Errno 28\] No space left on device \(what was written '
                                    rf"before stays; .*\): '{log_path}'"):
    jobs.CalibrationJob(**runs.calibrate_args(tmp_path)).run()
  logged = records.RecordLog(log_path, key='key').records
  assert sorted(logged) == ['identity', '|entropy|384', '|pmax|384', '|pmax|512']
  # Freed space for the calibrations, but not for the schedule itself.
  writes.clear()
  calls.clear()
  monkeypatch.setattr(fileio, 'write_synced', disk(1))
  with pytest.raises(OSError, match=rf"No space left on device .*: '{tmp_path / 'schedule.json'}'"):
    jobs.CalibrationJob(**runs.calibrate_args(tmp_path)).run()
  assert calls == ['entropy']  # Only what was not written.
  assert not (tmp_path / 'schedule.json').exists()
  writes.clear()
  calls.clear()
  monkeypatch.setattr(fileio, 'write_synced', original)
  result = jobs.CalibrationJob(**runs.calibrate_args(tmp_path)).run()
  assert not calls and not log_path.exists()  # Nothing computed again.
  written = schedule.load_schedule(str(tmp_path / 'schedule.json'))
  for strategy in ('pmax', 'entropy'):
    first = schedule.calibration_from_dict(logged[f'|{strategy}|384']['calibration'], 'log')
    assert written.calibrations[strategy][0] == first == result.calibrations[strategy][0]
  assert written.provenance['identity']['settings']['lengths'] == [384, 512]
  # A grid strategy is made again where a continuous search still needs its sweep.
  done = {calibration.calibration_key(None, 'pmax', 512): first}
  resumed = calibration.build._resumed  # pylint: disable=protected-access
  assert resumed(done, None, ('pmax', 'prop1'), 512) == {'pmax': first}
  assert resumed(done, None, ('pmax', 'pmax_bisect'), 512) == {}
