"""Bad input gets a named error, nothing is silently wrong, no work is lost or blocked (issue 16).

One test per case of the README's "What bad input gets" table. None compiles a model.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from t5align.calibration import samples
from t5align import checkpoints
from t5align import gin_cli
from t5align import jobs
from t5align.jobs import calibration_job
from t5align.jobs import train_job
from t5align import network
from t5align.evaluation import tables
from t5align import run_identity
from t5align.runtime import fileio
from t5align.runtime import outputs
from t5align.runtime import records
from t5align.runtime import validate
from t5align import schedule
from t5align import training
from t5align import vocabularies

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTDATA = REPO_ROOT / 'tests' / 'testdata' / 't5x' / 't5_1_0_tiny'
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT),
                                                   os.environ.get('PYTHONPATH', '')]))


def _copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
  shutil.copytree(src, dst)
  for root, dirs, files in os.walk(dst):
    for name in dirs + files:
      os.chmod(os.path.join(root, name), 0o755)
  return dst


# ---------------------------------------------------------------- temperatures, dtypes, settings


@pytest.mark.parametrize('tau', [1e-50, 1e-40, 0.0, -0.5, float('nan'), float('inf'), 1e39])
def test_temperature_outside_float32_or_nonpositive_is_refused(tau):
  with pytest.raises(ValueError, match=r'TEMPERATURE must be finite and > 0, in float32'):
    validate.temperatures(tau, 'TEMPERATURE')
  with pytest.raises(ValueError, match='must be finite and > 0'):
    network.T5Config(vocab_size=8, encoder_attention_temperature=tau)
  validate.temperatures([1e-30, 0.5, 3e38])  # Normal float32 values pass.


def test_non_float_dtype_is_refused_before_reading():
  with pytest.raises(ValueError, match=r"PARAMS_DTYPE\)='int8' is not a floating dtype"):
    checkpoints.load_params('/no/such/checkpoint', dtype='int8')
  with pytest.raises(ValueError, match='T5Config.dtype'):
    network.T5Config(vocab_size=8, dtype='int32')


@pytest.mark.parametrize('settings, message', [
    ({'batch_size': 'abc'}, "BATCH_SIZE must be a positive integer; got 'abc'"),
    ({'batch_size': 0}, 'BATCH_SIZE must be a positive integer; got 0'),
    ({'batch_size': -1}, 'BATCH_SIZE must be a positive integer; got -1'),
    ({'max_decode_length': -3}, 'MAX_DECODE_LENGTH must be a positive integer; got -3'),
    ({'max_decode_length': 0}, 'MAX_DECODE_LENGTH must be a positive integer; got 0'),
    ({'checkpoint': jobs.Checkpoint('/no/such', params_dtype='int8')},
     "PARAMS_DTYPE='int8' is not a floating dtype"),
])
def test_eval_run_settings_are_checked_first(settings, message, tmp_path):
  with pytest.raises(ValueError, match=message):
    jobs.EvalJob(**{'checkpoint': jobs.Checkpoint('/no/such'), 'mixture_or_task_name': 't',
                    'output_dir': str(tmp_path / 'out'), **settings}).run()


def test_mean_row_stats_of_an_all_padding_batch_raises():
  stats = {'pmax_sum': np.zeros((2, 3, 4)), 'entropy_sum': np.zeros((2, 3, 4)),
           'rows': np.zeros(3, np.int32)}
  with pytest.raises(ValueError, match='no non-pad query row'):
    network.mean_row_stats(stats)


# ---------------------------------------------------------------- schedules


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


# ---------------------------------------------------------------- loaded weights


def _nan_params(config: network.T5Config) -> dict:
  rng = np.random.default_rng(0)
  params = {k: rng.standard_normal(v.shape).astype(np.float32)
            for k, v in checkpoints.flatten_params(network.param_shapes(config)).items()}
  params['encoder/layers_0/attention/query/kernel'][1, 2] = np.nan
  return checkpoints.unflatten_params(params)


@pytest.mark.parametrize('layout', ['zarr', 'msgpack', 'orbax'])
def test_nan_weights_are_refused_naming_parameter_and_checkpoint(layout, tmp_path):
  config = network.T5Config(vocab_size=32, emb_dim=8, num_heads=2, num_encoder_layers=1,
                            num_decoder_layers=1, head_dim=4, mlp_dim=16)
  params = _nan_params(config)
  if layout == 'orbax':
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    path = tmp_path / 'checkpoint_1'
    ocp.PyTreeCheckpointer().save(str(path / 'state'),
                                  args=ocp.args.PyTreeSave({'target': params}))
  else:
    path = pathlib.Path(checkpoints.save_t5x_checkpoint(
        params, str(tmp_path), 1, inline_max_bytes=0 if layout == 'zarr' else 1 << 30))
  with pytest.raises(ValueError, match=rf'checkpoint {path} has non-finite values .* encoder/'
                                       r'layers_0/attention/query/kernel \(1 of 64 values\)'):
    checkpoints.load_params(str(path), config)
  loaded, _ = checkpoints.load_params(str(path), config, check_finite=False)  # The opt-out.
  assert np.isnan(loaded['encoder']['layers_0']['attention']['query']['kernel'][1, 2])


# ---------------------------------------------------------------- readers name their file


def test_plain_file_as_checkpoint(tmp_path):
  path = tmp_path / 'a_file'
  path.write_text('x')
  with pytest.raises(ValueError, match=rf'{path} is a file, not a checkpoint'):
    checkpoints.load_params(str(path))


def test_invalid_hf_config(tmp_path):
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  save_file({'shared.weight': np.zeros((4, 2), np.float32)}, str(tmp_path / 'model.safetensors'))
  (tmp_path / 'config.json').write_text('{"d_model": 8,\n oops}')
  with pytest.raises(checkpoints.CheckpointReadError,
                     match=rf'HF config {tmp_path / "config.json"}:2: not valid JSON'):
    checkpoints.load_params(str(tmp_path))


def test_hf_layer_norm_epsilon_other_than_t5s_is_refused():
  with pytest.raises(ValueError, match=r'layer_norm_epsilon=1e-05; T5X .* use 1e-6'):
    checkpoints.hf_config_hints({'layer_norm_epsilon': 1e-5})
  assert checkpoints.hf_config_hints({'layer_norm_epsilon': 1e-6}) == {'mlp_activations': ('relu',)}


def test_orbax_without_manifest(tmp_path):
  path = _copy(TESTDATA / 'orbax' / 'checkpoint_0', tmp_path / 'checkpoint_0')
  os.remove(path / 'state' / 'manifest.ocdbt')
  with pytest.raises(checkpoints.CheckpointReadError,
                     match=rf'Orbax checkpoint {path / "state"}: its metadata lists no arrays'):
    checkpoints.read_params(str(path))


@pytest.mark.tensorflow
def test_garbage_mesh_tf_index(tmp_path):
  pytest.importorskip('tensorflow')
  (tmp_path / 'model.ckpt-1.index').write_bytes(b'garbage' * 10)
  with pytest.raises(checkpoints.CheckpointReadError,
                     match=rf'Cannot read Mesh-TF checkpoint {tmp_path / "model.ckpt-1"}'):
    checkpoints.read_params(str(tmp_path / 'model.ckpt-1'))


def test_non_utf8_calibration_text_and_prediction_line(tmp_path):
  text = tmp_path / 'corpus.txt'
  text.write_bytes(b'fine line\nbad \xff line\n')
  with pytest.raises(ValueError, match=rf'{text}:2: not UTF-8 text'):
    samples.text_file_stream(str(text), 'unused.model')
  log = tmp_path / 'predictions.jsonl'
  log.write_bytes(b'{"index": 0}\n{"index": 1, "prediction": "\xff"}\n')
  with pytest.raises(ValueError, match=rf'{log}:2: not UTF-8 text'):
    records.RecordLog(log)


@pytest.mark.parametrize('line, message', [
    ('{"inputs": "unterminated, "task": "a"}',
     r'expected a JSON object with an "inputs" string \(Expecting .,. delimiter'),
    ('{"task": "a"}', r'expected a JSON object with an "inputs" string \(.inputs.\)'),
    ('["a list"]', r'expected a JSON object with an "inputs" string'),
    ('{"inputs": ""}', r'"inputs" must be a non-empty string'),
    ('{"inputs": 7}', r'"inputs" must be a non-empty string'),
])
def test_malformed_calibration_jsonl_line_names_file_and_line(tmp_path, line, message):
  jsonl = tmp_path / 'inputs.jsonl'
  jsonl.write_text('{"inputs": "a fine first line", "task": "a"}\n' + line + '\n')
  with pytest.raises(ValueError, match=rf'{jsonl}:2: ' + message):
    samples.jsonl_examples(str(jsonl), lambda text: [3] * len(text.split()), 1, 4)


@pytest.mark.parametrize('content, message', [
    ('{"group": "Passkey", "col', r'metrics.json:1: not valid JSON .*truncated'),
    ('{"group": "Passkey", "metrics": {}}', r'metrics.json is incomplete: it lacks column'),
])
def test_corrupt_metrics_json_in_report(content, message, tmp_path):
  (tmp_path / 'task').mkdir()
  (tmp_path / 'task' / 'metrics.json').write_text(content)
  with pytest.raises(ValueError, match=message) as e:
    tables.load_results([tmp_path])
  assert str(tmp_path / 'task' / 'metrics.json') in str(e.value)


def test_a_string_metric_in_metrics_json_names_the_file_and_metric(tmp_path):
  (tmp_path / 'task').mkdir()
  (tmp_path / 'task' / 'metrics.json').write_text(json.dumps(
      {'group': 'Passkey', 'column': '4k', 'metrics': {'accuracy': 'high'}}))
  with pytest.raises(ValueError, match=r"metric 'accuracy' is 'high'; expected a number") as e:
    tables.load_results([tmp_path])
  assert str(tmp_path / 'task' / 'metrics.json') in str(e.value)


_READ = {  # Each reader of an input file, by its setting, as a script of the path in argv[1].
    'TEXT_FILE': 'from t5align.calibration import samples; '
                 'samples.text_file_stream(sys.argv[1], None)',
    'JSONL_FILE': 'from t5align.calibration import samples; '
                  'samples.jsonl_examples(sys.argv[1], None, 1, 1)',
    'metrics file': 'from t5align.evaluation import tables; tables.load_results([sys.argv[1]])',
    'schedule': 'from t5align import schedule; schedule.load_schedule(sys.argv[1])',
}


@pytest.mark.parametrize('what, kind', [
    (what, kind) for what in sorted(_READ) for kind in ('fifo', 'dev_zero', 'folder')
    if (what, kind) != ('metrics file', 'folder')])  # The report searches a folder it is given.
def test_an_input_that_is_no_regular_file_is_refused_at_once(what, kind, tmp_path):
  """A fifo would block the reader forever and /dev/zero read until memory runs out: each is
  refused before it is opened, naming the setting (in a process bounded to 60 s)."""
  if kind == 'dev_zero':
    path = pathlib.Path('/dev/zero')
  elif kind == 'folder':
    path = tmp_path / 'folder'
    path.mkdir()
  else:
    path = tmp_path / 'pipe'
    os.mkfifo(path)
  if what == 'metrics file':  # The report finds metrics.json in the folders it is given.
    os.makedirs(tmp_path / 'run' / 'task')
    (tmp_path / 'run' / 'task' / 'metrics.json').symlink_to(path)
    path = tmp_path / 'run'
  result = subprocess.run([sys.executable, '-c', 'import sys; ' + _READ[what], str(path)],
                          env=ENV, capture_output=True, text=True, timeout=60, check=False)
  assert result.returncode == 1, result.stderr
  wanted = {'fifo': 'a fifo', 'dev_zero': 'a device', 'folder': 'a folder'}[kind]
  assert f'is {wanted}, not a regular file' in result.stderr, result.stderr
  assert what in result.stderr, result.stderr


def test_an_input_over_the_size_limit_is_refused_naming_the_setting(tmp_path, monkeypatch):
  text = tmp_path / 'corpus.txt'
  text.write_text('a line of text\n' * 10)
  monkeypatch.setenv(fileio.MAX_INPUT_ENV, '100')
  with pytest.raises(ValueError, match=rf'TEXT_FILE {text} is over 100 bytes, the input size '
                     rf'limit; raise {fileio.MAX_INPUT_ENV}'):
    samples.text_file_stream(str(text), None)


def test_a_short_calibration_input_names_its_file():
  with pytest.raises(ValueError, match=r'JSONL_FILE data.jsonl has 16 tokens; a sample of length '
                     r'64 needs 63'):
    samples.sample_windows(np.arange(16), 2, 64, eos_id=1, source='JSONL_FILE data.jsonl')


def test_corrupt_demo_results_json(tmp_path):
  from t5align.demo import store  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'results.json'
  path.write_text('{"settings": {}, "acc')
  with pytest.raises(ValueError, match=rf'demo results {path}:1: not valid JSON'):
    store.Results(str(path), {})


# ---------------------------------------------------------------- output folders

_HOLD_LOCK = '''
import sys, time
from t5align.runtime import outputs
lock = outputs.FolderLock(outputs.lock_path(sys.argv[1]), 'test')
print('locked', flush=True)
time.sleep(120)
'''


def test_second_run_into_a_folder_is_refused_and_a_dead_holder_taken_over(tmp_path, caplog):
  out = tmp_path / 'out'
  with outputs.claim(out, 'EVAL_OUTPUT_DIR'):  # In-process: another open handle is refused.
    with pytest.raises(outputs.OutputLockedError, match=rf'pid={os.getpid()} host='):
      with outputs.claim(out, 'EVAL_OUTPUT_DIR'):
        pass
  child = subprocess.Popen([sys.executable, '-c', _HOLD_LOCK, str(out)], env=ENV,
                           stdout=subprocess.PIPE, text=True)
  try:
    assert child.stdout.readline() == 'locked\n'
    with pytest.raises(outputs.OutputLockedError,
                       match=rf'EVAL_OUTPUT_DIR {out} is in use by another run \(pid={child.pid}'):
      with outputs.claim(out, 'EVAL_OUTPUT_DIR'):
        pass
  finally:
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
  with outputs.claim(out, 'EVAL_OUTPUT_DIR') as lock:  # Killed: its lock is stale, taken over.
    assert lock is not None
  assert f'taking over the stale lock of EVAL_OUTPUT_DIR {out} (pid={child.pid}' in caplog.text


def test_concurrent_eval_into_one_folder_is_refused_and_the_first_results_stay(tmp_path):
  out = tmp_path / 'out'
  log = records.RecordLog(out / 'task' / 'predictions.jsonl')
  with outputs.claim(out, 'EVAL_OUTPUT_DIR'):  # The first run, mid-way.
    log.append([{'index': 0, 'prediction': 'a'}])
    before = log.path and pathlib.Path(log.path).read_bytes()
    with pytest.raises(outputs.OutputLockedError, match='in use by another run'):
      jobs.EvalJob(checkpoint=jobs.Checkpoint('/no/such'), mixture_or_task_name='t',
                   output_dir=str(out)).run()
    log.append([{'index': 1, 'prediction': 'b'}])
  assert pathlib.Path(log.path).read_bytes() == before + b'{"index": 1, "prediction": "b"}\n'
  assert sorted(records.RecordLog(log.path).records) == [0, 1]


def test_calibrate_refuses_a_directory_output_path_before_any_work(tmp_path):
  (tmp_path / 'schedule.json').mkdir()
  with pytest.raises(IsADirectoryError, match=rf'OUTPUT_PATH {tmp_path / "schedule.json"} is a '
                                              'directory'):
    jobs.CalibrationJob(checkpoint=jobs.Checkpoint('/no/such/checkpoint'),
                        output_path=str(tmp_path / 'schedule.json'),
                        text_file='x').run()


def test_unwritable_output_folder_is_refused(tmp_path):
  (tmp_path / 'file').write_text('x')
  with pytest.raises(OSError, match=rf'MODEL_DIR {tmp_path / "file" / "m"}: cannot write'):
    outputs.check_writable(tmp_path / 'file' / 'm', name='MODEL_DIR')
  with pytest.raises(NotADirectoryError, match=rf'MODEL_DIR {tmp_path / "file"} is a file'):
    outputs.check_writable(tmp_path / 'file', name='MODEL_DIR')
  if os.geteuid() != 0:  # Root writes anywhere.
    tmp_path.chmod(0o500)
    try:
      with pytest.raises(OSError, match=rf'MODEL_DIR {tmp_path / "m"}: cannot write'):
        outputs.check_writable(tmp_path / 'm', name='MODEL_DIR')
    finally:
      tmp_path.chmod(0o700)


def test_stale_tmp_files_and_checkpoint_folders_are_removed_at_start(tmp_path):
  keep = [tmp_path / 'task' / 'metrics.json', tmp_path / 'checkpoint_5' / 'checkpoint',
          tmp_path / 'tmp-notes.txt']
  stale = [tmp_path / 'task' / '.metrics.json.tmp-abc12', tmp_path / '.run.json.tmp-x',
           tmp_path / 'checkpoint_7.tmp-k3j' / 'checkpoint']
  for path in keep + stale:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('x')
  with outputs.claim(tmp_path, 'MODEL_DIR'):
    pass
  assert all(p.exists() for p in keep)
  assert not any(p.exists() for p in stale) and not (tmp_path / 'checkpoint_7.tmp-k3j').exists()
  # An output file's folder may be shared: only that file's own leftovers go.
  mine, theirs = tmp_path / '.schedule.json.tmp-1', tmp_path / '.other.json.tmp-2'
  mine.write_text('x')
  theirs.write_text('x')
  with outputs.claim(tmp_path / 'schedule.json', 'OUTPUT_PATH', is_file=True):
    pass
  assert not mine.exists() and theirs.exists()


_HOLD_FOLDER_AND_FILE = '''
import pathlib, sys, time
from t5align.runtime import outputs
folder = outputs.FolderLock(outputs.lock_path(sys.argv[1]), 'MODEL_DIR')
file = outputs.FolderLock(outputs.lock_path(sys.argv[2], is_file=True), 'OUTPUT_PATH')
pathlib.Path(sys.argv[3]).write_text('locked')
time.sleep(60)
'''


def test_stale_cleanup_leaves_the_temporaries_of_a_live_run_below_alone(tmp_path):
  """Issue 34 item 4: an eval into P while a train holds P/m removed the train's live
  checkpoint_400.tmp-live; only a dead holder's temporaries are stale."""
  out, model_dir = tmp_path / 'P', tmp_path / 'P' / 'm'
  live = [model_dir / 'checkpoint_400.tmp-live' / 'checkpoint', model_dir / '.x.tmp-123',
          model_dir / 'sub' / 'deeper' / '.y.tmp-1']
  held_deep = out / 'checkpoint_9.tmp-z' / 'a' / 'b' / 'out.json'  # A file lock 3 levels in.
  for path in live + [held_deep]:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('x')
  marker = tmp_path / 'locked'
  child = subprocess.Popen([sys.executable, '-c', _HOLD_FOLDER_AND_FILE, str(model_dir),
                            str(held_deep), str(marker)], env=ENV)
  try:
    deadline = time.monotonic() + 20
    while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
      time.sleep(0.02)
    assert marker.exists(), f'the lock holder did not start (exit status {child.poll()})'
    with outputs.claim(out, 'EVAL_OUTPUT_DIR'):  # What eval's start does.
      pass
    assert all(p.exists() for p in live + [held_deep])
  finally:
    child.kill()
    child.wait(timeout=10)
  with outputs.claim(out, 'EVAL_OUTPUT_DIR'):
    pass
  assert not (model_dir / 'checkpoint_400.tmp-live').exists()
  assert not (model_dir / '.x.tmp-123').exists() and not (out / 'checkpoint_9.tmp-z').exists()
  assert live[2].exists()  # Below the cleanup's two levels, as before.


@pytest.mark.parametrize('umask, mode', [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_result_files_follow_the_umask(umask, mode, tmp_path):
  old = os.umask(umask)
  try:
    fileio.write_json_atomic(tmp_path / 'metrics.json', {'a': 1})
    with open(tmp_path / 'predictions.jsonl', 'w') as f:  # What a plain open gives.
      f.write('\n')
  finally:
    os.umask(old)
  assert (tmp_path / 'metrics.json').stat().st_mode & 0o777 == mode
  assert (tmp_path / 'predictions.jsonl').stat().st_mode & 0o777 == mode


def test_torn_train_log_and_tmp_checkpoint_are_repaired_when_train_starts(tmp_path, monkeypatch):
  log = tmp_path / 'train_log.jsonl'
  log.write_text('{"step": 20, "loss": 2.0, "step_s": 0.5, "token_accuracy": 0.1}\n'
                 '{"step": 40, "loss": 1.')
  (tmp_path / 'checkpoint_40.tmp-k3j').mkdir()  # A kill while writing checkpoint_40.
  with pytest.raises(ValueError, match=rf'{log}:2: not a JSON record'):
    training.logged_training(str(tmp_path))  # What the end of a resumed run used to hit.

  class Started(Exception):
    pass

  def stop(*unused_args, **unused_kwargs):
    raise Started()

  # Just after the repairs.
  monkeypatch.setattr(train_job.vocabularies, 'train_sentencepiece', stop)
  with pytest.raises(Started):
    jobs.TrainJob(model=network.Transformer(network.T5Config(vocab_size=1024)),
                  model_dir=str(tmp_path)).run()
  assert log.read_text().count('\n') == 1
  assert not (tmp_path / 'checkpoint_40.tmp-k3j').exists()
  assert training.logged_training(str(tmp_path)) == {'loss': 2.0, 'token_accuracy': 0.1,
                                                  'loop_s': 10.0}


def test_failed_start_leaves_the_folder_reusable(tmp_path):
  wrong, right = (run_identity.make(facts={'checkpoint': p}) for p in ('/wrong', '/right'))
  run_identity.check_run(tmp_path, wrong, kind='eval')  # Then the run failed.
  run_identity.check_run(tmp_path, right, kind='eval')  # The corrected rerun starts.
  assert json.loads((tmp_path / 'run.json').read_text()) == right


# ---------------------------------------------------------------- gin command lines


def test_misspelt_macro_is_refused_with_the_close_match(tmp_path, clean_gin):
  config = tmp_path / 'run.gin'
  config.write_text('SCHEDULE_PATH = None\nSCHEDULE_STRATEGY = None\nBATCH_SIZE = 8\n')
  with pytest.raises(ValueError, match=r'--gin.SCHEDULE_PAHT: no macro SCHEDULE_PAHT in .*'
                                       r'run.gin.*Did you mean SCHEDULE_PATH'):
    gin_cli.configure([f'--gin_file={config}', '--gin.SCHEDULE_PAHT=x.json'], prog='t')
  clean_gin.clear_config()
  # A new macro is fine where another binding reads it.
  gin_cli.configure([f'--gin_file={config}', '--gin.SCHEDULE_PATH=x.json',
                     '--gin_bindings=NEW = 4', '--gin_bindings=BATCH_SIZE = %NEW'], prog='t')
  assert clean_gin.query_parameter('%SCHEDULE_PATH') == 'x.json'


# ---------------------------------------------------------------- analysis settings (issue 34)


def _no_work(monkeypatch):
  """Makes reading the inputs or the weights fail the test: the settings must be refused first."""
  def fail(*args, **kwargs):
    raise AssertionError('work started before the settings were checked')
  monkeypatch.setattr(samples, 'read_inputs', fail)
  monkeypatch.setattr(checkpoints, 'load_params', fail)


THREE_HEADS = network.T5Config(vocab_size=8, num_heads=3)


@pytest.mark.parametrize('heads, config, message', [
    ((99,), THREE_HEADS, r'RELPOS_HEADS=\(99,\): .*3 heads, 0\.\.2'),
    ((0, 3), THREE_HEADS, r'RELPOS_HEADS=\(0, 3\): .*3 heads'),
    ((-1,), None, r'RELPOS_HEADS=\(-1,\): expected'),
    ((), None, r'RELPOS_HEADS=\(\): expected'),
    (('a',), None, r"RELPOS_HEADS=\('a',\): expected"),
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
    jobs.CalibrationJob(checkpoint=jobs.Checkpoint(str(TESTDATA / 'legacy' / 'checkpoint_0')),
                        output_path=str(out), text_file=str(text),
                        vocabulary_path=str(vocab), analysis_dir=str(analysis_dir),
                        relpos_heads=(99,), reference_length=16, lengths=(32,)).run()
  assert not analysis_dir.exists() and not out.exists()


def test_calibrate_refuses_a_file_as_analysis_dir_before_any_work(tmp_path, monkeypatch):
  _no_work(monkeypatch)
  (tmp_path / 'analysis').write_text('x')
  with pytest.raises(NotADirectoryError, match=rf'ANALYSIS_DIR {tmp_path / "analysis"} is a file'):
    jobs.CalibrationJob(checkpoint=jobs.Checkpoint(str(TESTDATA / 'legacy' / 'checkpoint_0')),
                        output_path=str(tmp_path / 'schedule.json'),
                        text_file='corpus.txt', vocabulary_path='v.model',
                        analysis_dir=str(tmp_path / 'analysis')).run()


def test_write_analysis_refuses_bad_heads_before_writing_any_file(tmp_path):
  from t5align.calibration import analysis  # pylint: disable=g-import-not-at-top
  numbers = {'rel_embedding': np.zeros((4, 32), np.float32), 'lengths': [64]}
  with pytest.raises(ValueError, match=r'heads=\(99,\): .*4 heads, 0\.\.3'):
    analysis.write_analysis(numbers, str(tmp_path / 'analysis'), heads=(99,))
  assert not (tmp_path / 'analysis').exists()
