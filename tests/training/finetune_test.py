"""Tests for fine-tuning through `python -m t5align.train` (TrainJob.mixture_or_task_name,
gin/runs/finetune.gin): the shipped retrieval T5 fine-tuned on a SCROLLS task over mocked TFDS
data (`tfds.testing.mock_data`, rows written here in SCROLLS' record format; no suite data is
committed), its vocabulary the shipped SentencePiece file.

References: the batches against the rows tokenized here with `sentencepiece` directly and cut as
written out (the first L - 1 tokens and EOS); the first step's loss against a float64 numpy cross
entropy of the initial model's logits; a killed and resumed run against an uninterrupted one;
run.json's fields of a synthetic run written out.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import jax
import numpy as np
import pytest

from t5align import checkpoints
from t5align import jobs
from t5align import network
from t5align import run_identity
from t5align.shipped import assets
from t5align.shipped import train_data
from t5align import training

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = REPO_ROOT / 't5align' / 'shipped' / 'retrieval_t5'
VOCABULARY = SHIPPED / 'sentencepiece.model'
CHECKPOINT = SHIPPED / 'checkpoint_5000'
TASK = 't5align_scrolls_qasper'
EOS = 1
L_IN, L_OUT, BATCH = 48, 12, 2
TINY = network.T5Config(vocab_size=1024, emb_dim=16, num_heads=2, num_encoder_layers=1,
                        num_decoder_layers=1, head_dim=8, mlp_dim=32,
                        mlp_activations=('gelu', 'linear'), dropout_rate=0.0)

PAPER = ' '.join(['We store the passkey 4821 in line 12 of the ledger.',
                  'The ledger has forty lines and each line holds a number.'] * 8)
# Qasper as SCROLLS publishes it: the question, two newlines, the paper. Row 0's input is cut at
# L_IN, row 2's target at L_OUT; row 1 fits.
ROWS = [
    {'id': 'a', 'pid': 'a_0', 'input': f'What is stored in line 12?\n\n{PAPER}',
     'output': 'The passkey 4821.'},
    {'id': 'b', 'pid': 'b_0', 'input': 'How many lines?\n\nThe ledger has forty lines.',
     'output': 'Forty.'},
    {'id': 'c', 'pid': 'c_0', 'input': 'What holds a number?\n\nEach line holds a number.',
     'output': 'Each line of the ledger holds one number, from line one to line forty.'},
]


@pytest.fixture(scope='module')
def processor():
  sentencepiece = pytest.importorskip('sentencepiece')
  return sentencepiece.SentencePieceProcessor(model_file=str(VOCABULARY))


@pytest.fixture
def scrolls_rows(monkeypatch):
  """seqio's tasks on the shipped vocabulary, TFDS scrolls/qasper's train split mocked to ROWS."""
  seqio = pytest.importorskip('seqio')
  tf = pytest.importorskip('tensorflow')
  tfds = pytest.importorskip('tensorflow_datasets')
  from seqio_tasks import scrolls  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(VOCABULARY))
  monkeypatch.setattr(seqio.utils.LazyTfdsLoader, '_MEMOIZED_BUILDERS', {})

  def as_dataset(builder, split, **kwargs):
    del kwargs
    assert (builder.name, builder.builder_config.name, str(split)) == ('scrolls', 'qasper',
                                                                      'train')
    return tf.data.Dataset.from_generator(
        lambda: iter(ROWS), output_signature={k: tf.TensorSpec([], tf.string)
                                              for k in scrolls.FEATURES})
  with tfds.testing.mock_data(as_dataset_fn=as_dataset,
                              policy=tfds.testing.MockPolicy.USE_CODE):
    yield


def _expected_rows(processor) -> list[tuple[list[int], list[int]]]:
  """Each row's (inputs, targets) cut at L_IN / L_OUT: the first L - 1 tokens, then EOS."""
  out = []
  for row in ROWS:
    inputs, targets = processor.encode(row['input']), processor.encode(row['output'])
    out.append(([*inputs[:L_IN - 1], EOS], [*targets[:L_OUT - 1], EOS]))
  return out


def _shipped_config() -> network.T5Config:
  """The shipped model's architecture, without dropout (as gin/models/retrieval_small.gin)."""
  return dataclasses.replace(assets.load_shipped()[1], dropout_rate=0.0)


def _job(model_dir, config=None, **overrides) -> jobs.TrainJob:
  if config is None:
    config = _shipped_config()
  kwargs = dict(model=network.Transformer(config), model_dir=str(model_dir), seed=0,
                num_steps=4, batch_size=BATCH,
                optimizer=training.OptimizerConfig(learning_rate=1e-3, warmup_steps=0,
                                                   name='adafactor', schedule='constant'),
                input_length=L_IN,
                target_length=L_OUT, checkpoint_every=2, keep_checkpoints=5, log_every=1,
                eval_lengths=(), mixture_or_task_name=TASK,
                initial_checkpoint=jobs.Checkpoint(str(CHECKPOINT),
                                                   flag='INITIAL_CHECKPOINT_PATH'))
  return jobs.TrainJob(**{**kwargs, **overrides})


def _float64_loss(config, params, batch) -> float:
  """Token-mean cross entropy of the model's logits, in float64 numpy."""
  logits = network.Transformer(config).apply(
      {'params': params}, batch['encoder_input_tokens'], batch['decoder_input_tokens'],
      batch['decoder_target_tokens'], enable_dropout=False)
  logits = np.asarray(logits, np.float64)  # [b, l, vocab]
  targets = np.asarray(batch['decoder_target_tokens'])  # [b, l]
  top = logits.max(-1, keepdims=True)
  log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]  # [b, l]
  picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]  # [b, l]
  mask = targets > 0
  return float(((log_z - picked) * mask).sum() / mask.sum())


def _log(model_dir) -> list[dict]:
  return [json.loads(line) for line in
          (pathlib.Path(model_dir) / 'train_log.jsonl').read_text().splitlines()]


def _params(model_dir, step, config):
  return checkpoints.load_params(os.path.join(model_dir, f'checkpoint_{step}'), config)[0]


def _flat(tree) -> dict[str, np.ndarray]:
  return {jax.tree_util.keystr(k): np.asarray(v)
          for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.tensorflow
@pytest.mark.slow
def test_batches_are_the_rows_cut_as_seqio_cuts_them_and_counted(scrolls_rows, processor):
  """Every example of the stream is one of the rows tokenized with the task's vocabulary and cut
  at the feature lengths keeping EOS; padded to one shape, decoder inputs shifted right; the cut
  examples are counted; the stream is a function of the seed."""
  expected = _expected_rows(processor)
  assert len(processor.encode(ROWS[0]['input'])) + 1 > L_IN
  assert len(processor.encode(ROWS[2]['output'])) + 1 > L_OUT
  data = training.SeqioBatches(TASK, seed=0, batch_size=BATCH, input_length=L_IN,
                                target_length=L_OUT).start(0)
  batches = [next(data) for _ in range(6)]  # 12 examples: 4 epochs of 3 rows.
  seen = []
  for batch in batches:
    assert batch['encoder_input_tokens'].shape == (BATCH, L_IN)
    assert batch['decoder_target_tokens'].shape == (BATCH, L_OUT)
    np.testing.assert_array_equal(batch['decoder_input_tokens'][:, 1:],
                                  batch['decoder_target_tokens'][:, :-1])
    assert not batch['decoder_input_tokens'][:, 0].any()
    for enc, tgt in zip(batch['encoder_input_tokens'], batch['decoder_target_tokens']):
      pair = (enc[enc > 0].tolist(), tgt[tgt > 0].tolist())
      assert pair in expected
      seen.append(expected.index(pair))
  assert sorted(set(seen)) == [0, 1, 2]
  assert data.trimmed == {'inputs': seen.count(0), 'targets': seen.count(2),
                          'examples': seen.count(0) + seen.count(2)}
  again = training.SeqioBatches(TASK, seed=0, batch_size=BATCH, input_length=L_IN,
                                 target_length=L_OUT)
  resumed = again.start(3)  # Skips the 6 examples of steps 0-2.
  for batch in batches[3:]:
    got = next(resumed)
    for key in batch:
      np.testing.assert_array_equal(got[key], batch[key])


@pytest.mark.tensorflow
@pytest.mark.slow
def test_finetuning_starts_from_the_checkpoint_and_lowers_the_loss(tmp_path, scrolls_rows,
                                                                   processor):
  """The first step's logged loss is the float64 cross entropy of the shipped checkpoint's logits
  on the first batch (fine-tuning starts from INITIAL_CHECKPOINT_PATH); after 6 steps the loss
  on that batch is lower. run.json names the task, the initial checkpoint and the vocabulary."""
  config = _shipped_config()
  summary = _job(tmp_path / 'run', num_steps=6, checkpoint_every=6).run()
  first = next(training.SeqioBatches(TASK, seed=0, batch_size=BATCH, input_length=L_IN,
                                      target_length=L_OUT).start(0))
  initial = checkpoints.load_params(str(CHECKPOINT), config)[0]
  before = _float64_loss(config, initial, first)
  steps = [r for r in _log(tmp_path / 'run') if 'loss' in r]
  assert [r['step'] for r in steps] == [1, 2, 3, 4, 5, 6]
  np.testing.assert_allclose(steps[0]['loss'], before, rtol=1e-4)
  after = _float64_loss(config, _params(str(tmp_path / 'run'), 6, config), first)
  assert after < 0.8 * before, (before, after)
  assert summary['step'] == 6 and summary['loss'] == steps[-1]['loss']
  # 12 examples, row 0 (input cut) and row 2 (target cut) among them: what the log counts.
  assert summary['trimmed']['examples'] == summary['trimmed']['inputs'] + summary['trimmed'][
      'targets'] > 0
  assert summary['trimmed']['inputs'] == sum(r['inputs_trimmed'] for r in steps)
  record = json.loads((tmp_path / 'run' / 'run.json').read_text())
  assert record['settings']['mixture_or_task_name'] == TASK
  assert record['checkpoint'] == run_identity.checkpoint_fingerprint(str(CHECKPOINT))
  assert record['vocabulary'] == run_identity.file_fingerprint(str(VOCABULARY))
  assert not {'mix', 'vocab_size'} & set(record['settings'])
  assert not (tmp_path / 'run' / assets.VOCAB_FILE).exists()  # Nothing trained.


@pytest.mark.tensorflow
@pytest.mark.slow
def test_a_killed_run_resumes_to_the_uninterrupted_runs_params(tmp_path, scrolls_rows,
                                                               monkeypatch):
  """Killed after its step-2 checkpoint (while saving step 4, steps 3-4 already logged), the
  rerun continues the example stream from step 2: its step-4 params, optimizer state and losses
  equal the uninterrupted run's."""
  config = _shipped_config()
  _job(tmp_path / 'full').run()
  save = training.save_checkpoint

  def killed_at_4(model_dir, step, params, opt_state):
    if step == 4:
      raise KeyboardInterrupt('killed')
    return save(model_dir, step, params, opt_state)
  monkeypatch.setattr(training, 'save_checkpoint', killed_at_4)
  with pytest.raises(KeyboardInterrupt):
    _job(tmp_path / 'killed').run()
  monkeypatch.setattr(training, 'save_checkpoint', save)
  assert training.checkpoint_steps(str(tmp_path / 'killed')) == [2]
  summary = _job(tmp_path / 'killed').run()
  assert summary['step'] == 4
  full, killed = _flat(_params(str(tmp_path / 'full'), 4, config)), _flat(
      _params(str(tmp_path / 'killed'), 4, config))
  for key in full:
    np.testing.assert_array_equal(killed[key], full[key], err_msg=key)
  template = _job(tmp_path).optimizer.make(4).init(
      _params(str(tmp_path / 'full'), 4, config))
  _, s_full = training.restore_checkpoint(str(tmp_path / 'full'), 4, config, template)
  _, s_killed = training.restore_checkpoint(str(tmp_path / 'killed'), 4, config, template)
  for key, value in _flat(s_full).items():
    np.testing.assert_array_equal(_flat(s_killed)[key], value, err_msg=key)
  log = _log(tmp_path / 'killed')
  losses = {r['step']: r['loss'] for r in log if 'loss' in r}
  assert losses == {r['step']: r['loss'] for r in _log(tmp_path / 'full') if 'loss' in r}
  assert [r['step'] for r in log if 'loss' in r] == [1, 2, 3, 4]  # Steps 3-4 logged once.
  assert {'event': 'skipped', 'step': 2, 'examples': 4} == {
      k: v for k, v in next(r for r in log if r.get('event') == 'skipped').items()
      if k != 'skip_s'}


@pytest.mark.tensorflow
@pytest.mark.slow  # Its fixture imports seqio and TensorFlow (about 10 s on a loaded 2-core VM).
def test_a_model_config_other_than_the_checkpoints_is_refused(tmp_path, scrolls_rows):
  """The tiny config against the shipped checkpoint: refused naming INITIAL_CHECKPOINT_PATH and
  the mis-shaped parameters, before MODEL_DIR is written."""
  with pytest.raises(checkpoints.CheckpointMismatchError) as error:
    _job(tmp_path / 'run', config=TINY).run()
  message = str(error.value)
  assert f'INITIAL_CHECKPOINT_PATH={CHECKPOINT}' in message
  assert 'token_embedder/embedding: checkpoint (1024, 128) != expected (1024, 16)' in message
  assert not (tmp_path / 'run' / 'run.json').exists()


def test_settings_that_need_a_task_are_refused(tmp_path):
  with pytest.raises(ValueError, match=r'INITIAL_CHECKPOINT_PATH=/ckpt needs '
                                       r'MIXTURE_OR_TASK_NAME'):
    _job(tmp_path, config=TINY, mixture_or_task_name=None,
         initial_checkpoint=jobs.Checkpoint('/ckpt', flag='INITIAL_CHECKPOINT_PATH')).check()
  with pytest.raises(ValueError, match=r"^jobs\.TrainJob\.mixture_or_task_name = ' ': expected a "
                                       r'non-blank string or None \(the synthetic mix\)\.$'):
    _job(tmp_path, config=TINY, mixture_or_task_name=' ')


def test_a_synthetic_runs_record_of_format_1_reads_as_todays(tmp_path):
  """A synthetic run's run.json as format 1 wrote it (the settings at the top level, those added
  later left out at their defaults, no fine-tuning fields) is upgraded on read to exactly what
  the same job records now (format 2: 'settings' from the job's fields), so its MODEL_DIR
  resumes; the same record with another learning rate does not."""
  job = jobs.TrainJob(model=network.Transformer(TINY), model_dir=str(tmp_path), seed=3,
                      num_steps=4, batch_size=2, mix=train_data.Mix({'passkey': 1.0}),
                      input_length=128, target_length=8)
  now = job.identity({})
  assert now['format'] == run_identity.FORMAT and now['settings']['mix'] == {
      'weights': {'passkey': 1.0}, 'min_length': 0, 'length_power': 1.0, 'min_units': None}
  format_1 = {  # What 0f3d22d's TrainJob wrote for these settings.
      'batch_size': 2, 'config': now['config'], 'input_length': 128, 'learning_rate': 1e-3,
      'length_power': 1.0, 'min_units': None, 'mix': {'passkey': 1.0}, 'num_steps': 4,
      'optimizer': 'adamw', 'per_example_loss': False, 'schedule': 'cosine', 'seed': 3,
      'target_length': 8, 'vocab_size': 1000, 'warmup_steps': 100, 'weight_decay': 0.0}
  assert run_identity.upgrade(format_1, 'train') == now
  run_identity.check_same(format_1, now, kind='train', what='MODEL_DIR', hint='')
  with pytest.raises(run_identity.RunMismatchError, match=r'settings\.optimizer\.learning_rate: '
                                                          r'0\.002 -> 0\.001'):
    run_identity.check_same({**format_1, 'learning_rate': 2e-3}, now, kind='train',
                            what='MODEL_DIR', hint='')


def test_a_fine_tuning_runs_record_of_format_1_reads_as_todays(tmp_path):
  """A fine-tuning run's run.json as format 1 wrote it (no synthetic-data settings; the task, the
  initial checkpoint's content and the task vocabulary's) reads as today's record of the same
  job: its initial checkpoint read in float32, as format 1's runs read it."""
  job = _job(tmp_path, config=TINY)
  start = job.initial_checkpoint
  now = job.identity({'vocabulary': {'sha256': 'v', 'bytes': 1}})
  assert now['settings']['initial_checkpoint'] == {'params_dtype': 'float32'}
  assert 'mix' not in now['settings'] and 'vocab_size' not in now['settings']
  format_1 = {  # What 0f3d22d's TrainJob wrote for this fine-tuning job.
      'batch_size': BATCH, 'config': now['config'], 'input_length': L_IN, 'learning_rate': 1e-3,
      'num_steps': 4, 'optimizer': 'adafactor', 'per_example_loss': False,
      'schedule': 'constant', 'seed': 0, 'target_length': L_OUT, 'warmup_steps': 0,
      'weight_decay': 0.0, 'mixture_or_task_name': TASK,
      'checkpoint': run_identity.checkpoint_fingerprint(start.resolved),
      'checkpoint_path': start.path, 'checkpoint_resolved_path': start.resolved,
      'vocabulary': {'sha256': 'v', 'bytes': 1}}
  run_identity.check_same(format_1, now, kind='train', what='MODEL_DIR', hint='')
  with pytest.raises(run_identity.RunMismatchError, match=r'settings\.mixture_or_task_name'):
    run_identity.check_same({**format_1, 'mixture_or_task_name': 'other'}, now, kind='train',
                            what='MODEL_DIR', hint='')


def test_the_constant_schedule_is_t5x_fine_tuning_rate():
  """'constant': the peak after a linear warmup (none: from step 0), as t5x's fine-tuning."""
  flat = training.OptimizerConfig(1e-3, 0, schedule='constant').learning_rate_schedule(100)
  assert [float(flat(s)) for s in (0, 50, 99)] == pytest.approx([1e-3] * 3)
  warm = training.OptimizerConfig(1e-3, 10, schedule='constant').learning_rate_schedule(100)
  assert [float(warm(s)) for s in (0, 5, 10, 80)] == pytest.approx([0.0, 5e-4, 1e-3, 1e-3])


@pytest.mark.cli
@pytest.mark.tensorflow
@pytest.mark.usefixtures('clean_gin')
def test_cli_finetunes_with_the_run_file_and_exports(tmp_path, scrolls_rows, monkeypatch):
  """gin/runs/finetune.gin with the shipped model's file: 2 steps, then the export loads as
  the shipped model does, with the task's vocabulary."""
  from t5align import train  # pylint: disable=g-import-not-at-top
  model_dir, export_dir = tmp_path / 'run', tmp_path / 'export'
  argv = ['--gin_file=gin/runs/finetune.gin', '--gin_file=gin/models/retrieval_small.gin',
          f'--gin.seqio_tasks.vocabulary_path.path={VOCABULARY}',
          f'--gin.INITIAL_CHECKPOINT_PATH={CHECKPOINT}', f'--gin.MIXTURE_OR_TASK_NAME={TASK}',
          f'--gin.L_TR={L_IN}', f'--gin.TARGET_LENGTH={L_OUT}', '--gin.NUM_STEPS=2',
          '--gin.BATCH_SIZE=2', f'--gin.MODEL_DIR={model_dir}', f'--gin.EXPORT_DIR={export_dir}']
  monkeypatch.chdir(REPO_ROOT)
  summary = train.main(argv)
  assert summary['step'] == 2 and np.isfinite(summary['loss'])
  params, config, vocab = assets.load_shipped(str(export_dir))
  assert config == assets.load_shipped()[1]
  assert (export_dir / assets.VOCAB_FILE).read_bytes() == VOCABULARY.read_bytes()
  assert json.loads((export_dir / 'training.json').read_text())['input_length'] == L_IN
  assert vocab.vocab_size == 1000 and params
