"""A run is what its record says it is (issue 23): one test per case of the issue.

Resume, several processes and command-line overrides never mix two runs, lose a result or hang;
every setting is checked before any weight is read. The eval cases share one finished 2-example
run on a copy of the shipped model (`finished_eval`); each later case reruns into it and must be
refused before a batch is decoded.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

from flax import serialization
import gin
import numpy as np
import pytest

import conftest

from t5align import calibration
from t5align import checkpoints
from t5align.evaluation import temperature as temperature_lib
from t5align import gin_cli
from t5align import jobs
from t5align.jobs import eval_job
from t5align.jobs import train_job
from t5align import memory
from t5align import network
from t5align import run_identity
from t5align.runtime import fileio
from t5align.runtime import multihost
from t5align.runtime import outputs
from t5align.runtime import records
from t5align.runtime import validate
from t5align import schedule
from t5align.shipped import assets
from t5align import training

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
ASSET = REPO_ROOT / 't5align' / 'shipped' / 'retrieval_t5'
CKPT = pathlib.Path(assets.checkpoint_dir(str(ASSET)))
VOCAB = ASSET / 'sentencepiece.model'
TASK = 't5align_passkey_2k'
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT),
                                                   os.environ.get('PYTHONPATH', '')]))


@pytest.fixture
def clean_gin(clean_gin, monkeypatch):
  """conftest's clean gin config, with the repository root as the working directory (the gin
  files' paths are relative to it)."""
  monkeypatch.chdir(REPO_ROOT)
  return clean_gin


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _vocabulary(path: pathlib.Path, *, extra_pieces: int = 0, rescore: bool = False) -> str:
  """The shipped SentencePiece model with `extra_pieces` more pieces, or one score changed."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(VOCAB.read_bytes())
  for i in range(extra_pieces):
    piece = proto.pieces.add()
    piece.piece, piece.score = f'extra{i}', -100.0 - i
  if rescore:
    proto.pieces[-1].score -= 1.0
  path.write_bytes(proto.SerializeToString())
  return str(path)


def _eval_args(out: pathlib.Path, checkpoint: pathlib.Path, *extra: str,
               num_examples: int = 2) -> list[str]:
  return ['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/retrieval_small.gin',
          f'--gin.CHECKPOINT_PATH={checkpoint}', f'--gin.EVAL_OUTPUT_DIR={out}',
          f'--gin.MIXTURE_OR_TASK_NAME={TASK}', f'--gin.NUM_EXAMPLES={num_examples}',
          '--gin.BATCH_SIZE=2', '--gin.MAX_DECODE_LENGTH=4', *extra]


# Its tests share one xdist worker: it runs once (~15 s), and they rerun into it in order.
@pytest.fixture(scope='module')
def finished_eval(tmp_path_factory):
  """(output folder, checkpoint copy): a finished eval of 2 passkey examples at tau = 1."""
  root = tmp_path_factory.mktemp('eval')
  checkpoint = root / 'model' / 'checkpoint_5000'
  shutil.copytree(CKPT, checkpoint)
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv('T5ALIGN_VOCABULARY', str(VOCAB))
    mp.chdir(REPO_ROOT)
    conftest.run_eval(*_eval_args(root / 'out', checkpoint))
  folder = root / 'out' / TASK
  assert sorted(p.name for p in folder.iterdir()) == ['metrics.json', 'predictions.jsonl',
                                                      'run.json']
  return root / 'out', checkpoint


@pytest.fixture
def no_load(monkeypatch):
  """Makes reading any weights fail the test: what must be refused before that."""
  def fail(*unused_args, **unused_kwargs):
    raise AssertionError('the checkpoint was read before the error')
  monkeypatch.setattr(checkpoints, 'load_params', fail)


# ------------------------------------------------------------------ silently wrong (items 1-9)


@pytest.mark.tensorflow
def test_1_vocabulary_larger_than_the_embedding_is_refused_before_work(tmp_path, clean_gin,
                                                                       monkeypatch, no_load):
  big = _vocabulary(tmp_path / 'big.model', extra_pieces=2000)
  monkeypatch.setenv('T5ALIGN_VOCABULARY', big)
  with pytest.raises(ValueError, match=rf'vocabulary {big} \(task {TASK}\) has 3000 pieces but '
                                       rf'checkpoint {CKPT} embeds 1024 ids: ids 1024\.\.2999'):
    conftest.run_eval(*_eval_args(tmp_path / 'out', CKPT))
  assert not (tmp_path / 'out' / TASK / 'predictions.jsonl').exists()
  # Ids out of range are refused wherever tokens meet the model.
  with pytest.raises(ValueError, match=r"inputs: token ids \[1024\] are outside the model's "
                                       r'0\.\.1023'):
    validate.token_ids(np.array([[5, 1024, 1]]), 1024, 'inputs')
  # Train: a vocabulary already in MODEL_DIR that the model cannot embed.
  model_dir = tmp_path / 'train'
  model_dir.mkdir()
  shutil.copy(big, model_dir / assets.VOCAB_FILE)
  model = network.Transformer(network.T5Config(vocab_size=1024, emb_dim=8, num_heads=2,
                                               num_encoder_layers=1, num_decoder_layers=1,
                                               head_dim=4, mlp_dim=16))
  with pytest.raises(ValueError, match=r'sentencepiece.model has 3000 pieces but the model '
                                       r'\(network.T5Config.vocab_size=1024\) embeds 1024 ids'):
    jobs.TrainJob(model=model, model_dir=str(model_dir), num_steps=1, eval_lengths=()).run()
  assert not list(model_dir.glob('checkpoint_*'))


@pytest.mark.cli
@pytest.mark.tensorflow
@pytest.mark.xdist_group('run_identity_finished_eval')
def test_2_a_replaced_checkpoint_at_the_same_path_is_another_run(finished_eval, tmp_path,
                                                                 clean_gin, monkeypatch):
  out, checkpoint = finished_eval
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(VOCAB))
  params, _ = checkpoints.load_params(str(checkpoint))
  params['decoder']['decoder_norm']['scale'] = params['decoder']['decoder_norm']['scale'] * 1.5
  other = checkpoints.save_t5x_checkpoint(params, str(tmp_path), 5000)
  moved = checkpoint.parent / 'moved'
  checkpoint.rename(moved)
  shutil.copytree(other, checkpoint)  # Other weights, same path.
  try:
    with pytest.raises(run_identity.RunMismatchError,
                       match=r'holds results of a different run; differing fields \(before -> '
                             r"now\): checkpoint\.bytes: .*checkpoint\.sha256: '[0-9a-f]{64}' -> "
                             r"'[0-9a-f]{64}'\. Use another output folder"):
      conftest.run_eval(*_eval_args(out, checkpoint))
  finally:
    shutil.rmtree(checkpoint)
    moved.rename(checkpoint)
  # The same weights under another path are the same run (the path is only informational).
  copy = tmp_path / 'elsewhere' / 'checkpoint_5000'
  shutil.copytree(checkpoint, copy)
  before = (out / TASK / 'predictions.jsonl').read_bytes()
  conftest.run_eval(*_eval_args(out, copy))
  assert (out / TASK / 'predictions.jsonl').read_bytes() == before


@pytest.mark.cli
@pytest.mark.tensorflow
@pytest.mark.xdist_group('run_identity_finished_eval')
def test_3_another_vocabulary_file_is_another_run(finished_eval, tmp_path, clean_gin,
                                                  monkeypatch):
  out, checkpoint = finished_eval
  monkeypatch.setenv('T5ALIGN_VOCABULARY', _vocabulary(tmp_path / 'other.model', rescore=True))
  with pytest.raises(run_identity.RunMismatchError,
                     match=r'differing fields \(before -> now\): .*vocabulary\.sha256'):
    conftest.run_eval(*_eval_args(out, checkpoint))


@pytest.mark.cli
@pytest.mark.tensorflow
@pytest.mark.xdist_group('run_identity_finished_eval')
def test_4_another_task_seed_is_another_run(finished_eval, clean_gin, monkeypatch):
  out, checkpoint = finished_eval
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(VOCAB))
  with pytest.raises(run_identity.RunMismatchError,
                     match=r"gin\.seqio_tasks\.options\.seed: null -> '7'.*"
                           r'task_options\.seed: 0 -> 7'):
    conftest.run_eval(*_eval_args(out, checkpoint, '--gin_bindings=seqio_tasks.options.seed = 7'))


@pytest.mark.tensorflow
def test_5_processes_started_with_different_temperatures_refuse_to_start(clean_gin, monkeypatch):
  """Process 0's and process 1's settings, as `evaluate` hands them to
  `run_identity.check_same_processes`, compared through the collective with process 1's fed in
  (two processes: test 22)."""
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(VOCAB))
  seen = []

  class Stop(Exception):
    pass

  def capture(settings, what='settings'):
    seen.append(json.loads(json.dumps(settings)))
    raise Stop()

  monkeypatch.setattr(eval_job.run_identity, 'check_same_processes', capture)
  for tau in ('1.0', '0.5'):
    with pytest.raises(Stop):
      conftest.run_eval(*_eval_args(pathlib.Path('/tmp/unused'), CKPT, f'--gin.TEMPERATURE={tau}'))
  monkeypatch.undo()
  monkeypatch.setattr(multihost.jax, 'process_count', lambda: 2)
  monkeypatch.setattr(multihost, 'gather_json', lambda values: values + [seen[1]])
  with pytest.raises(run_identity.RunMismatchError,
                     match=r'started with different settings \(process 0 -> the other\): '
                           r"process 1: .*gin\.TEMPERATURE: '1\.0' -> '0\.5'"):
    run_identity.check_same_processes(seen[0])
  monkeypatch.setattr(multihost, 'gather_json', lambda values: values + [seen[0]])
  run_identity.check_same_processes(seen[0])  # The same settings start.


def test_6_a_schedule_is_reused_only_for_what_it_was_calibrated_for(tmp_path):
  cals = {'pmax': (schedule.Calibration('pmax', 2048, 256, 0.9),)}
  wanted = run_identity.make(facts={'checkpoint': {'sha256': 'a'}},
                             settings={'lengths': [2048], 'strategies': ['pmax']})
  saved = schedule.TemperatureSchedule(256, cals, 'pmax', provenance={'identity': wanted})
  saved.save(str(tmp_path / 'schedule.json'))
  loaded = schedule.load_schedule(str(tmp_path / 'schedule.json'))
  run_identity.check_same(loaded.provenance['identity'], wanted, kind='calibration', what='s',
                          hint='')
  other = {**wanted, 'settings': {**wanted['settings'], 'lengths': [512]}}
  with pytest.raises(run_identity.RunMismatchError,
                     match=r'settings\.lengths: \[2048\] -> \[512\]'):
    run_identity.check_same(loaded.provenance['identity'], other, kind='calibration',
                            what=str(tmp_path / 'schedule.json'), hint='Calibrate again.')
  with pytest.raises(run_identity.RunMismatchError, match='no record of the run'):
    run_identity.check_same(None, wanted, kind='calibration', what='schedule.json', hint='')


@pytest.mark.cli
@pytest.mark.tensorflow
@pytest.mark.xdist_group('run_identity_finished_eval')
def test_7_records_without_run_json_are_refused_and_metrics_state_the_records_taus(
    finished_eval, clean_gin, monkeypatch):
  out, checkpoint = finished_eval
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(VOCAB))
  folder = out / TASK
  metrics = json.loads((folder / 'metrics.json').read_text())
  assert metrics['record_temperatures'] == {'distinct': 1, 'min': [1.0], 'max': [1.0],
                                            'values': [[1.0]]}
  run_json = (folder / 'run.json').read_text()
  (folder / 'run.json').unlink()
  try:
    with pytest.raises(run_identity.RunMismatchError,
                       match=rf'{folder} holds results but no record of the run that made them'):
      conftest.run_eval(*_eval_args(out, checkpoint, '--gin.TEMPERATURE=0.5'))
    # A run.json edited to say 0.5: metrics come from the records, which say 1.0.
    edited = json.loads(run_json)
    edited['temperature'], edited['label'] = 0.5, 'tau = 0.5'
    (folder / 'run.json').write_text(json.dumps(edited))
    with pytest.raises(ValueError, match=r'records were made at temperatures \[\(1\.0,\)\], not '
                                         r"this run's 0\.5"):
      conftest.run_eval(*_eval_args(out, checkpoint, '--gin.TEMPERATURE=0.5'))
  finally:
    (folder / 'run.json').write_text(run_json)
  assert json.loads((folder / 'metrics.json').read_text())['temperature'] == 1.0


@pytest.mark.parametrize('num_steps', [-3, 0])
def test_8_train_refuses_a_non_positive_num_steps(tmp_path, num_steps):
  with pytest.raises(ValueError, match=rf'NUM_STEPS must be a positive integer; got {num_steps}'):
    jobs.TrainJob(model=network.Transformer(network.T5Config(vocab_size=1024)),
                  model_dir=str(tmp_path / 'm'), num_steps=num_steps).run()
  assert not list((tmp_path / 'm').glob('*.model'))


def test_8_train_resumes_only_the_run_its_checkpoints_came_from(tmp_path, monkeypatch):
  class Started(Exception):
    pass

  def stop(*unused_args, **unused_kwargs):
    raise Started()

  monkeypatch.setattr(train_job.vocabularies, 'train_sentencepiece', stop)  # Just after the checks.
  model = network.Transformer(network.T5Config(vocab_size=1024))
  with pytest.raises(Started):
    jobs.TrainJob(model=model, model_dir=str(tmp_path),
                  optimizer=training.OptimizerConfig(learning_rate=1e-3)).run()
  assert json.loads((tmp_path / 'run.json').read_text())['settings']['optimizer'][
      'learning_rate'] == 1e-3
  (tmp_path / 'checkpoint_2').mkdir()  # What checkpoint_steps counts as a result.
  (tmp_path / 'checkpoint_2' / 'checkpoint').write_bytes(b'')
  pathlib.Path(training.train_state_path(str(tmp_path), 2)).write_bytes(b'')
  with pytest.raises(run_identity.RunMismatchError,
                     match=r'differing fields \(before -> now\): '
                           r'settings\.optimizer\.learning_rate: 0\.001 -> 0\.002'):
    jobs.TrainJob(model=model, model_dir=str(tmp_path),
                  optimizer=training.OptimizerConfig(learning_rate=2e-3)).run()
  with pytest.raises(Started):  # The same settings resume.
    jobs.TrainJob(model=model, model_dir=str(tmp_path),
                  optimizer=training.OptimizerConfig(learning_rate=1e-3)).run()


def test_9_a_flag_and_a_binding_that_set_one_value_differently_are_refused(clean_gin):
  base = ['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/retrieval_small.gin']
  with pytest.raises(ValueError, match=r"--gin_bindings='jobs.EvalJob.temperature = "
                                       r"0\.7' and --gin\.TEMPERATURE=0\.5 set TEMPERATURE "
                                       r'differently \(t5align\.jobs\.EvalJob\.temperature is '
                                       r'bound to %TEMPERATURE in the gin files\)'):
    gin_cli.configure([*base, '--gin.TEMPERATURE=0.5',
                       '--gin_bindings=jobs.EvalJob.temperature = 0.7'], prog='t')
  gin.clear_config()
  with pytest.raises(ValueError, match=r"--gin_bindings='TEMPERATURE = 0\.6' and "
                                       r'--gin\.TEMPERATURE=0\.5 set TEMPERATURE differently;'):
    gin_cli.configure([*base, '--gin.TEMPERATURE=0.5', '--gin_bindings=TEMPERATURE = 0.6'],
                      prog='t')
  gin.clear_config()
  # The same value twice is no conflict.
  gin_cli.configure([*base, '--gin.TEMPERATURE=0.7', '--gin.CHECKPOINT_PATH=c',
                     '--gin.EVAL_OUTPUT_DIR=o', '--gin.MIXTURE_OR_TASK_NAME=t',
                     '--gin_bindings=jobs.EvalJob.temperature = 0.7'], prog='t')
  assert gin.query_parameter('%TEMPERATURE') == 0.7


# --------------------------------------------------------------- data lost, hang (items 10-13)


def _calibrate_args(tmp_path: pathlib.Path) -> dict:
  return dict(checkpoint=jobs.Checkpoint(str(CKPT)), output_path=str(tmp_path / 'schedule.json'),
              text_file=str(REPO_ROOT / 'README.md'), vocabulary_path=str(VOCAB),
              lengths=(384, 512), strategies=('pmax', 'entropy'), reference_length=256,
              num_samples=1, dtype='float32', attention_impl='reference',
              search=calibration.SearchSettings(grid=(1.0, 0.9, 0.8), batch_size=1))


@pytest.mark.slow
def test_10_a_full_disk_keeps_finished_calibrations_and_the_rerun_resumes(tmp_path,
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
    jobs.CalibrationJob(**_calibrate_args(tmp_path)).run()
  logged = records.RecordLog(log_path, key='key').records
  assert sorted(logged) == ['identity', '|entropy|384', '|pmax|384', '|pmax|512']
  # Freed space for the calibrations, but not for the schedule itself.
  writes.clear()
  calls.clear()
  monkeypatch.setattr(fileio, 'write_synced', disk(1))
  with pytest.raises(OSError, match=rf"No space left on device .*: '{tmp_path / 'schedule.json'}'"):
    jobs.CalibrationJob(**_calibrate_args(tmp_path)).run()
  assert calls == ['entropy']  # Only what was not written.
  assert not (tmp_path / 'schedule.json').exists()
  writes.clear()
  calls.clear()
  monkeypatch.setattr(fileio, 'write_synced', original)
  result = jobs.CalibrationJob(**_calibrate_args(tmp_path)).run()
  assert not calls and not log_path.exists()  # Nothing computed again.
  written = schedule.load_schedule(str(tmp_path / 'schedule.json'))
  for strategy in ('pmax', 'entropy'):
    first = schedule.calibration_from_dict(logged[f'|{strategy}|384']['calibration'], 'log')
    assert written.calibrations[strategy][0] == first == result.calibrations[strategy][0]
  assert written.provenance['identity']['lengths'] == [384, 512]
  # A grid strategy is made again where a continuous search still needs its sweep.
  done = {calibration.calibration_key(None, 'pmax', 512): first}
  resumed = calibration.build._resumed  # pylint: disable=protected-access
  assert resumed(done, None, ('pmax', 'prop1'), 512) == {'pmax': first}
  assert resumed(done, None, ('pmax', 'pmax_bisect'), 512) == {}


_HOLD = '''
import sys
from t5align.runtime import outputs
lock = outputs.FolderLock(outputs.lock_path(sys.argv[1], is_file=sys.argv[2] == 'file'), 'test')
print('locked', flush=True)
sys.stdin.read()
'''


@contextlib.contextmanager
def _held_by_another_process(path: pathlib.Path, kind: str):
  child = subprocess.Popen([sys.executable, '-c', _HOLD, str(path), kind], env=ENV,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    assert child.stdout.readline() == 'locked\n'
    yield child
  finally:
    child.kill()
    child.wait()
    child.stdout.close()
    child.stdin.close()


def test_11_one_lock_per_output_file_shared_by_the_folder_that_holds_it(tmp_path, no_load):
  demo_dir = tmp_path / 'demo'
  demo_dir.mkdir()
  # The demo runs into D (its folder lock): calibrate into D/schedule.json is refused.
  with _held_by_another_process(demo_dir, 'folder') as demo:
    with pytest.raises(outputs.OutputLockedError,
                       match=rf'OUTPUT_PATH {demo_dir / "schedule.json"} is inside {demo_dir}, '
                             rf'the output folder of another run \(pid={demo.pid} '):
      jobs.CalibrationJob(**{**_calibrate_args(tmp_path),
                          'output_path': str(demo_dir / 'schedule.json')}).run()
  # A calibration writes D/schedule.json: a run into D is refused, by any path to it.
  link = tmp_path / 'link'
  link.symlink_to(demo_dir)
  with _held_by_another_process(demo_dir / 'schedule.json', 'file') as cal:
    with pytest.raises(outputs.OutputLockedError,
                       match=rf'--output_dir {demo_dir} holds {demo_dir / "schedule.json"}, the '
                             rf'output file of another run \(pid={cal.pid} '):
      with outputs.claim(demo_dir, '--output_dir'):
        pass
    with pytest.raises(outputs.OutputLockedError, match=rf'pid={cal.pid} '):
      with outputs.claim(link / 'schedule.json', 'OUTPUT_PATH', is_file=True):
        pass
  # One process holding both (the demo claiming its own schedule.json) is no conflict.
  with outputs.claim(demo_dir, '--output_dir'):
    with outputs.claim(demo_dir / 'schedule.json', 'OUTPUT_PATH', is_file=True) as lock:
      assert lock is not None


def test_12_a_missing_process_fails_the_start_within_the_timeout(monkeypatch):
  port = _free_port()
  monkeypatch.setenv('JAX_NUM_PROCESSES', '2')
  monkeypatch.setenv('JAX_PROCESS_ID', '0')
  monkeypatch.setenv('JAX_COORDINATOR_ADDRESS', f'127.0.0.1:{port}')
  monkeypatch.setenv('T5ALIGN_DISTRIBUTED_TIMEOUT_S', '1')
  start = time.monotonic()
  with pytest.raises(multihost.StartError,
                     match=rf'process 0 waited 1 s at the coordinator address 127\.0\.0\.1:{port} '
                           r'\(JAX_COORDINATOR_ADDRESS\) for 2 processes; process 1 did not '
                           r'arrive\.'):
    multihost.initialize()
  monkeypatch.setenv('JAX_PROCESS_ID', '1')  # No process 0 listening.
  with pytest.raises(multihost.StartError,
                     match=rf'process 1 could not reach process 0 at the coordinator address '
                           rf'127\.0\.0\.1:{port} .* within 1 s'):
    multihost.initialize()
  assert time.monotonic() - start < 10
  monkeypatch.setenv('T5ALIGN_DISTRIBUTED_TIMEOUT_S', 'soon')
  with pytest.raises(ValueError, match="T5ALIGN_DISTRIBUTED_TIMEOUT_S='soon': expected a "
                                       'positive number of seconds'):
    multihost.initialize()


@pytest.mark.cli
def test_12_the_eval_command_with_a_missing_process_exits_instead_of_hanging(tmp_path):
  port = _free_port()
  env = dict(ENV, JAX_NUM_PROCESSES='2', JAX_PROCESS_ID='0', JAX_PLATFORMS='cpu',
             JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', T5ALIGN_DISTRIBUTED_TIMEOUT_S='2')
  start = time.monotonic()
  done = subprocess.run([sys.executable, '-m', 't5align.eval', *_eval_args(tmp_path, CKPT)],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 1, done.stderr[-2000:]
  assert (f'StartError: process 0 waited 2 s at the coordinator address 127.0.0.1:{port}'
          in done.stderr), done.stderr[-2000:]
  assert time.monotonic() - start < 120


@pytest.mark.parametrize('umask, mode', [(0o022, 0o755), (0o077, 0o700), (0o002, 0o775)])
def test_13_checkpoint_folders_follow_the_umask(tmp_path, umask, mode):
  params = {'a': np.zeros((2, 3), np.float32)}
  old = os.umask(umask)
  try:
    path = checkpoints.save_t5x_checkpoint(params, str(tmp_path), 1, optimizer_state=None)
  finally:
    os.umask(old)
  assert os.stat(path).st_mode & 0o777 == mode
  assert os.stat(os.path.join(path, 'target.a')).st_mode & 0o777 == mode


# --------------------------------------------------- settings checked first (items 14-22)


def test_14_non_utf8_jsonl_names_file_and_line(tmp_path, no_load):
  jsonl = tmp_path / 'tasks.jsonl'
  jsonl.write_bytes(b'{"inputs": "fine"}\n{"inputs": "bad \xff byte"}\n')
  with pytest.raises(ValueError, match=rf'{jsonl}:2: not UTF-8 text \(invalid start byte at '
                                       r'byte 16\)'):
    jobs.CalibrationJob(**{**_calibrate_args(tmp_path), 'text_file': None,
                        'jsonl_file': str(jsonl)}).run()


@pytest.mark.parametrize('field, value, message', [
    ('feed_forward_proj', None, r'"feed_forward_proj": null; expected a string, one of '
                                r'gated-gelu, gated-gelu_new, '),
    ('layer_norm_epsilon', '1e-6', r'"layer_norm_epsilon": "1e-6", a str; expected a JSON '
                                   r'number: 1e-06 \(no quotes\)'),
])
def test_15_hf_config_of_the_wrong_type(tmp_path, field, value, message):
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  save_file({'shared.weight': np.zeros((4, 2), np.float32)}, str(tmp_path / 'model.safetensors'))
  (tmp_path / 'config.json').write_text(json.dumps({'d_model': 2, field: value}))
  with pytest.raises(ValueError, match=rf'{tmp_path / "config.json"}: HF config has {message}'):
    checkpoints.load_params(str(tmp_path))


def test_16_a_checkpoint_declaring_a_huge_embedding_is_refused_before_allocating(tmp_path):
  config = network.T5Config(vocab_size=32, emb_dim=8, num_heads=2, num_encoder_layers=1,
                            num_decoder_layers=1, head_dim=4, mlp_dim=16,
                            logits_via_embedding=True)
  params = checkpoints.unflatten_params({
      k: np.zeros(v.shape, np.float32)
      for k, v in checkpoints.flatten_params(network.param_shapes(config)).items()})
  path = pathlib.Path(checkpoints.save_t5x_checkpoint(params, str(tmp_path), 1,
                                                      optimizer_state=None))
  rows = 10**12  # 32 TB of float32: more than any host.
  contents = serialization.msgpack_restore((path / 'checkpoint').read_bytes())
  contents['optimizer']['target']['token_embedder']['embedding']['metadata']['shape'] = [rows, 8]
  (path / 'checkpoint').write_bytes(serialization.msgpack_serialize(contents))
  zarray = path / 'target.token_embedder.embedding' / '.zarray'
  zarray.write_text(json.dumps({**json.loads(zarray.read_text()), 'shape': [rows, 8]}))
  for mesh in (None, 'eval'):
    if mesh:
      from t5align import partitioning  # pylint: disable=g-import-not-at-top
      mesh = partitioning.eval_mesh(1)
    with pytest.raises(memory.DoesNotFitError,
                       match=rf'checkpoint {path} declares arrays of 2\.98e\+04 GiB in float32 '
                             r'for this process, .* the largest: token_embedder/embedding '
                             rf'\({rows}, 8\)'):
      checkpoints.load_params(str(path), mesh=mesh)
  assert checkpoints.embedding_rows(str(path)) == rows


def test_17_calibrate_refuses_a_vocabulary_larger_than_the_embedding(tmp_path, no_load):
  big = _vocabulary(tmp_path / 'big.model', extra_pieces=2000)
  with pytest.raises(ValueError, match=rf'VOCABULARY_PATH {big} has 3000 pieces but checkpoint '
                                       rf'{CKPT} embeds 1024 ids'):
    jobs.CalibrationJob(**{**_calibrate_args(tmp_path), 'vocabulary_path': big}).run()


def test_18_temperature_of_the_wrong_form_names_the_flag_and_file(tmp_path):
  config = network.T5Config(vocab_size=32, num_encoder_layers=3)
  with pytest.raises(ValueError, match=r'TEMPERATURE=\(0\.9, 0\.8\): give one temperature, or 3 '
                                       r'numbers \(one per encoder layer of checkpoint C, which '
                                       r'has 3\); got 2 values'):
    temperature_lib.make_temperature(config, (0.9, 0.8), model='checkpoint C')
  with pytest.raises(ValueError, match=r"TEMPERATURE='abc' is not a temperature: give a number "
                                       r'\(e\.g\. TEMPERATURE=0\.8\) or a tuple of 3'):
    temperature_lib.make_temperature(config, 'abc')
  cals = {'pmax_per_layer': tuple(schedule.Calibration(
      'pmax_per_layer', L, 256, (0.9,) * 5) for L in (512, 1024))}
  path = tmp_path / 's.json'
  schedule.TemperatureSchedule(256, cals, 'pmax_per_layer').save(str(path))
  with pytest.raises(ValueError, match=rf"temperature schedule {path} \(SCHEDULE_PATH\): strategy "
                                       r"'pmax_per_layer' has 5 per-layer taus but checkpoint C "
                                       r'has 3 encoder layers'):
    temperature_lib.make_temperature(config, schedule_path=str(path), model='checkpoint C')
  assert temperature_lib.make_temperature(config, (0.9, 0.8, 0.7)).constant == (0.9, 0.8, 0.7)


def test_19_eval_without_a_model_file_names_what_is_missing(clean_gin):
  with pytest.raises(ValueError, match=r'@network\.Transformer\(\) \(called by t5align\.jobs'
                                       r'\.EvalJob\.model\) needs t5align\.network\.Transformer'
                                       r'\.config, which no gin file or flag binds\. Give the '
                                       r'gin files the run needs: gin/runs/eval\.gin plus a '
                                       r'gin/models file\.'):
    gin_cli.configure(['--gin_file=gin/runs/eval.gin'], prog='t',
                      example_file='gin/runs/eval.gin plus a gin/models file')


@pytest.mark.parametrize('setting, message', [
    ({'lengths': (0,)}, r'LENGTHS=\(0,\): 0 is not an integer >= 256 \(REFERENCE_LENGTH, L_tr = '
                        r'256: calibration aligns longer inputs to it\)'),
    ({'lengths': 'abc'}, r"LENGTHS='abc': expected a tuple of integers, e.g. LENGTHS="
                         r'\(512, 1024\)'),
    ({'lengths': 512}, r'LENGTHS=512: expected a tuple of integers'),
    ({'strategies': 'pmax'}, r"STRATEGIES='pmax': expected a tuple of strategy names, e.g. "
                             r"STRATEGIES=\('pmax',\); known: pmax, entropy"),
    ({'strategies': ('pmax', 'p_max')}, r"STRATEGIES=\('pmax', 'p_max'\): 'p_max' is not a "
                                        r'strategy'),
    ({'reference_length': 'x'}, r"REFERENCE_LENGTH must be an integer >= 2; got 'x'"),
])
def test_20_calibrate_settings_are_checked_before_the_checkpoint(tmp_path, no_load, setting,
                                                                 message):
  with pytest.raises(ValueError, match=message):
    jobs.CalibrationJob(**{**_calibrate_args(tmp_path), 'checkpoint': jobs.Checkpoint('/no/such'),
                        **setting}).run()


@pytest.mark.parametrize('setting, message', [
    ({'checkpoint_every': 0}, 'CHECKPOINT_EVERY must be a positive integer; got 0'),
    ({'optimizer': training.OptimizerConfig(learning_rate='abc')},
     r"LEARNING_RATE must be a positive number, e\.g\. LEARNING_RATE=0\.01; got 'abc'"),
    ({'optimizer': training.OptimizerConfig(warmup_steps=-1)},
     'WARMUP_STEPS must be an integer >= 0; got -1'),
    ({'optimizer': training.OptimizerConfig(name='sgd')},
     r"OPTIMIZER='sgd'; expected one of 'adamw', 'adafactor'"),
])
def test_21_train_settings_are_checked_before_work(tmp_path, setting, message):
  with pytest.raises(ValueError, match=message):
    jobs.TrainJob(model=network.Transformer(network.T5Config(vocab_size=1024)),
                  model_dir=str(tmp_path / 'm'), **setting).run()
  assert not (tmp_path / 'm' / assets.VOCAB_FILE).exists()


@pytest.mark.multiprocess
@pytest.mark.cli
@pytest.mark.tensorflow
def test_22_two_processes_with_different_num_examples_both_refuse_to_start(tmp_path):
  port = _free_port()
  procs, logs = [], []
  for i, count in enumerate((8, 16)):
    env = dict(ENV, JAX_NUM_PROCESSES='2', JAX_PROCESS_ID=str(i), JAX_PLATFORMS='cpu',
               JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', T5ALIGN_VOCABULARY=str(VOCAB),
               T5ALIGN_DISTRIBUTED_TIMEOUT_S='60')
    logs.append(tmp_path / f'process{i}.log')
    with open(logs[-1], 'wb') as log:
      procs.append(subprocess.Popen(
          [sys.executable, '-m', 't5align.eval',
           *_eval_args(tmp_path / 'out', CKPT, num_examples=count)],
          cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
  try:
    codes = [p.wait(timeout=180) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
  texts = [log.read_text(errors='replace') for log in logs]
  assert codes == [1, 1], texts
  for text in texts:
    assert ('RunMismatchError: the processes were started with different settings '
            '(process 0 -> the other): process 1: arguments.num_examples: 8 -> 16; '
            "gin.NUM_EXAMPLES: '8' -> '16'") in text, text[-3000:]
  assert not (tmp_path / 'out' / TASK).exists()


def test_a_format_1_record_is_upgraded_once_on_read():
  """58d8be9's run.json (format 1: tests/testdata/old_gin_names) read as format 2: gin's
  bindings gone (config.gin holds them now), the settings moved into 'settings', what format 1
  left out at its default (truncate_inputs, RULER's task options, jax's matmul precision) given
  that default; every other field as it was."""
  recorded = json.loads((REPO_ROOT / 'tests/testdata/old_gin_names/eval_run_58d8be9.json')
                        .read_text())
  upgraded = run_identity.upgrade(recorded, 'eval')
  assert upgraded['format'] == 2 and 'gin' not in upgraded
  assert upgraded['settings'] == {'checkpoint': {'params_dtype': 'float32'}, 'split': 'test',
                                  'truncate_inputs': None}
  assert upgraded['jax_default_matmul_precision'] is None
  assert {k: upgraded['task_options'][k] for k in ('ruler_examples', 'ruler_budget')} == {
      'ruler_examples': 500, 'ruler_budget': 'upstream'}
  moved = {'gin', 'params_dtype', 'split', 'format', 'settings', 'jax_default_matmul_precision',
           'task_options'}
  assert {k: v for k, v in upgraded.items() if k not in moved} == {
      k: v for k, v in recorded.items() if k not in moved}
  assert run_identity.upgrade(upgraded, 'eval') == upgraded  # Once: format 2 is today's.
  # The job gin makes from the record's command records those settings.
  assert upgraded['settings'] == run_identity.settings_record(
      jobs.EvalJob(temperature=0.9, max_decode_length=8, batch_size=1))


@pytest.mark.parametrize('record, kind, message', [
    ({'format': 3}, 'eval', r'a run record of format 3: this t5align reads formats 1 to 2'),
    ({'format': 'x'}, 'eval', r"a run record of format 'x'"),
    ({}, 'evaluation', r"kind='evaluation'; expected one of \('eval', 'calibration'"),
])
def test_a_record_of_an_unknown_format_is_refused(record, kind, message):
  with pytest.raises(ValueError, match=message):
    run_identity.upgrade(record, kind)
