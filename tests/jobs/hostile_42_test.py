"""Issue 42's hostile cases (found on 0f3d22d): each now gets a named error or the right result.

1. CHECKPOINT_PATH a symlink re-pointed while a run starts (once, or before every array read):
   everything is read from the path resolved once; run.json records it; a resume against
   another resolved checkpoint is refused naming CHECKPOINT_PATH.
2. A CHECKPOINT_PATH holding a non-UTF-8 byte: named, with the path's repr.
3. A process answering the start-up check as process 1 that never starts JAX: process 0 ends
   with a StartError naming JAX_COORDINATOR_ADDRESS (exit 1), not JAX's abort.
4. An HF checkpoint's own lm_head under a config without (or with a string)
   `tie_word_embeddings`; an int32 HF tensor; the coordinator's port in use; a NaN `target` in a
   schedule: each names the file and key, the checkpoint, or JAX_COORDINATOR_ADDRESS.
5. The demo's calibration, killed after k calibrations, resumes from its progress log and
   writes the schedule.json of an uninterrupted run.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import conftest

from t5align import checkpoints
from t5align import run_identity
from t5align import schedule
from t5align.checkpoints import store
from t5align.jobs import common
from t5align.runtime import multihost
from t5align.shipped import assets

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO_ROOT / 'tests' / 'testdata' / 't5x' / 't5_1_0_tiny' / 'legacy' / 'checkpoint_0'
ASSET = pathlib.Path(assets.ASSET_DIR)
CKPT = pathlib.Path(assets.checkpoint_dir(str(ASSET)))
VOCAB = ASSET / 'sentencepiece.model'
TASK = 't5align_passkey_2k'
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT),
                                                   os.environ.get('PYTHONPATH', '')]))


def _two_checkpoints(root: pathlib.Path, source: pathlib.Path) -> tuple[str, str]:
  """checkpoint_8 (a copy of `source`) and checkpoint_12 (every weight negated) under `root`."""
  eight = root / 'run8' / 'checkpoint_8'
  shutil.copytree(source, eight)
  params = checkpoints.read_params(str(eight))
  negated = {k: -np.asarray(v) for k, v in checkpoints.flatten_params(params).items()}
  twelve = checkpoints.save_t5x_checkpoint(checkpoints.unflatten_params(negated),
                                           str(root / 'run12'), 12, optimizer_state=None)
  return str(eight), twelve


def _point(link: pathlib.Path, target: str) -> None:
  """Re-points `link` at `target` atomically (a new link renamed over it), as `ln -sfn` would."""
  tmp = link.with_name(link.name + '.new')
  os.symlink(target, tmp)
  os.replace(tmp, link)


def _flat(params) -> dict[str, np.ndarray]:
  return {k: np.asarray(v) for k, v in checkpoints.flatten_params(params).items()}


# ------------------------------------------------------------------ 1. a re-pointed symlink


def test_link_repointed_after_the_fingerprint_is_read_from_the_resolved_place(tmp_path,
                                                                              monkeypatch):
  eight, twelve = _two_checkpoints(tmp_path, TINY)
  link = tmp_path / 'current'
  os.symlink(eight, link)
  want, other = _flat(checkpoints.read_params(eight)), _flat(checkpoints.read_params(twelve))
  fingerprint = run_identity.checkpoint_fingerprint

  def fingerprint_then_repoint(path, **kwargs):
    found = fingerprint(path, **kwargs)
    _point(link, twelve)  # Between the fingerprint and every later read.
    return found

  monkeypatch.setattr(run_identity, 'checkpoint_fingerprint', fingerprint_then_repoint)
  checkpoint = common.Checkpoint(str(link))
  assert checkpoint.fingerprint() == fingerprint(eight)
  assert os.readlink(link) == twelve
  assert checkpoint.resolved == os.path.realpath(eight)
  assert checkpoint.embedding_rows() == want['token_embedder/embedding'].shape[0]
  params, _ = checkpoint.load(None, None)
  got = _flat(params)
  assert got.keys() == want.keys()
  for name, array in want.items():
    np.testing.assert_array_equal(got[name], array, err_msg=name)
    assert not np.array_equal(got[name], other[name]) or not array.any(), name


def test_link_repointed_before_every_array_read_still_reads_one_checkpoint(tmp_path,
                                                                           monkeypatch):
  eight, twelve = _two_checkpoints(tmp_path, TINY)
  link = tmp_path / 'current'
  os.symlink(eight, link)
  want, other = _flat(checkpoints.read_params(eight)), _flat(checkpoints.read_params(twelve))
  result = store.ts_result
  reads = []

  def repoint_then_read(name, spec, future):  # Every array opened or read: the link flips.
    reads.append(name)
    _point(link, twelve if len(reads) % 2 else eight)
    return result(name, spec, future)

  monkeypatch.setattr(store, 'ts_result', repoint_then_read)
  # The hook works: a loader reopening the link's path mixes the two checkpoints.
  mixed = _flat(checkpoints.load_params(str(link))[0])
  assert {k for k in want if np.array_equal(mixed[k], want[k]) and want[k].any()}
  assert {k for k in want if np.array_equal(mixed[k], other[k]) and want[k].any()}
  _point(link, eight)
  reads.clear()
  got = _flat(common.Checkpoint(str(link)).load(None, None)[0])
  assert len(reads) >= len(want)
  for name, array in want.items():
    np.testing.assert_array_equal(got[name], array, err_msg=name)


def test_checkpoint_replaced_at_its_resolved_path_during_the_load_is_refused(tmp_path,
                                                                             monkeypatch):
  eight, twelve = _two_checkpoints(tmp_path, TINY)
  checkpoint = common.Checkpoint(eight)
  checkpoint.fingerprint()
  load = checkpoints.load_params

  def load_then_replace(*args, **kwargs):
    loaded = load(*args, **kwargs)
    os.rename(eight, eight + '.old')
    shutil.copytree(twelve, eight)  # Another folder at the same (resolved) path.
    return loaded

  monkeypatch.setattr(checkpoints, 'load_params', load_then_replace)
  with pytest.raises(common.CheckpointChangedError,
                     match=rf"CHECKPOINT_PATH '{eight}' \({eight}\) was replaced or changed "
                           r'while this run read it'):
    checkpoint.load(None, None)


def _eval_args(out: pathlib.Path, checkpoint: str) -> list[str]:
  return ['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/retrieval_small.gin',
          f'--gin.CHECKPOINT_PATH={checkpoint}', f'--gin.EVAL_OUTPUT_DIR={out}',
          f'--gin.MIXTURE_OR_TASK_NAME={TASK}', '--gin.NUM_EXAMPLES=2', '--gin.BATCH_SIZE=2',
          '--gin.MAX_DECODE_LENGTH=4', '--gin.MODEL_NAME=m']


@pytest.mark.cli
@pytest.mark.tensorflow
def test_eval_through_a_repointed_link_uses_one_checkpoint_and_a_resume_is_refused(
    tmp_path, monkeypatch):
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(VOCAB))
  monkeypatch.chdir(REPO_ROOT)
  eight, twelve = _two_checkpoints(tmp_path, CKPT)
  link = tmp_path / 'current'
  os.symlink(eight, link)
  fingerprint = run_identity.checkpoint_fingerprint

  def fingerprint_then_repoint(path, **kwargs):
    found = fingerprint(path, **kwargs)
    _point(link, twelve)
    return found

  # The reference: the same eval of checkpoint_8 and of checkpoint_12, by their own paths.
  for name, path in (('ref8', eight), ('ref12', twelve)):
    conftest.run_eval(*_eval_args(tmp_path / name, path))
  reference = {n: (tmp_path / n / TASK / 'predictions.jsonl').read_bytes()
               for n in ('ref8', 'ref12')}
  assert reference['ref8'] != reference['ref12']  # The two models' records differ.
  with monkeypatch.context() as m:
    m.setattr(run_identity, 'checkpoint_fingerprint', fingerprint_then_repoint)
    conftest.run_eval(*_eval_args(tmp_path / 'out', str(link)))
  folder = tmp_path / 'out' / TASK
  assert (folder / 'predictions.jsonl').read_bytes() == reference['ref8']
  recorded = json.loads((folder / 'run.json').read_text())
  assert recorded['checkpoint'] == fingerprint(eight)
  assert (recorded['checkpoint_path'], recorded['checkpoint_resolved_path']) == (
      str(link), os.path.realpath(eight))
  # The link now names checkpoint_12: resuming into the folder is refused, naming the setting.
  with pytest.raises(run_identity.RunMismatchError,
                     match=rf"checkpoint\.sha256: '[0-9a-f]{{64}}' -> '[0-9a-f]{{64}}'\. "
                           r'Use another output folder \(or move this one away\)\. '
                           rf'CHECKPOINT_PATH reads another checkpoint than the one these '
                           rf'results were made from: {link} -> {twelve} now, {link} -> '
                           rf'{os.path.realpath(eight)} then\.'):
    conftest.run_eval(*_eval_args(tmp_path / 'out', str(link)))
  assert (folder / 'predictions.jsonl').read_bytes() == reference['ref8']


# ------------------------------------------------------------------ 2. a non-UTF-8 path


def test_checkpoint_path_with_a_non_utf8_byte_is_named(tmp_path):
  path = os.fsdecode(os.fsencode(str(tmp_path)) + b'/checkpoint_\xff8')
  shutil.copytree(TINY, path)
  message = (rf'CHECKPOINT_PATH {repr(path)}'.replace('\\', '\\\\')
             + r" holds a byte that is not UTF-8 \(b'\\xff' at character \d+\); checkpoints "
               r'are read through tensorstore, which takes UTF-8 paths only\. Rename')
  checkpoint = common.Checkpoint(path)
  for call in (checkpoint.fingerprint, checkpoint.embedding_rows,
               lambda: checkpoint.load(None, None)):
    with pytest.raises(ValueError, match=message):
      call()
  with pytest.raises(ValueError, match=r'checkpoint path .* holds a byte that is not UTF-8'):
    checkpoints.load_params(path)
  link = tmp_path / 'plain'
  os.symlink(path, link)  # A UTF-8 link to it: the resolved path is named too.
  with pytest.raises(ValueError, match=rf"CHECKPOINT_PATH '{link}' resolves to .*, which "
                                       r'holds a byte that is not UTF-8'):
    common.Checkpoint(str(link)).fingerprint()


# ------------------------------------------------------------------ 3. an impersonated process 1


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _start(port: int, process_id: int) -> subprocess.Popen:
  env = dict(ENV, JAX_NUM_PROCESSES='2', JAX_PROCESS_ID=str(process_id), JAX_PLATFORMS='cpu',
             JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', T5ALIGN_DISTRIBUTED_TIMEOUT_S='3')
  return subprocess.Popen(
      [sys.executable, '-c', 'from t5align.runtime import multihost; multihost.initialize(); '
       'print("started")'], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)


@pytest.mark.multiprocess
def test_a_process_impersonating_process_1_ends_process_0_with_a_start_error():
  port = _free_port()
  zero = _start(port, 0)
  try:
    deadline = time.monotonic() + 60
    while True:  # The impersonator: passes the start-up check, then never starts JAX.
      try:
        with socket.create_connection(('127.0.0.1', port), timeout=5) as conn:
          conn.sendall(b'1 2\n')
          assert conn.recv(16) == b'go\n'
        break
      except ConnectionRefusedError:
        assert time.monotonic() < deadline, 'process 0 never listened'
        time.sleep(0.1)
    late = _start(port, 1)  # The real process 1, after the impersonator.
    late_out, late_err = late.communicate(timeout=120)
    out, err = zero.communicate(timeout=120)
  finally:
    zero.kill()
  assert zero.returncode == 1, err[-3000:]
  assert 'started' not in out
  assert (f"StartError: process 0 of 2: JAX's coordination service at 127.0.0.1:{port} "
          '(JAX_COORDINATOR_ADDRESS) did not see every process start within 3 s '
          '(T5ALIGN_DISTRIBUTED_TIMEOUT_S), though every process had passed the start-up check '
          'there.') in err, err[-3000:]
  assert 'DEADLINE_EXCEEDED' not in err
  assert late.returncode == 1 and 'started' not in late_out
  # Which named start error the real process 1 gets depends on when it arrives: while process 0
  # waits (refused: its id is taken), or after process 0 gave up (nothing listens). On a loaded
  # machine its own start-up can take longer than the 3 s, so both are right.
  refused = (f'StartError: process 1: the coordinator 127.0.0.1:{port} (process 0) refused the '
             'start')
  unreached = (f'StartError: process 1 could not reach process 0 at the coordinator address '
               f'127.0.0.1:{port} (JAX_COORDINATOR_ADDRESS)')
  assert refused in late_err or unreached in late_err, late_err[-3000:]


# ------------------------------------------------------------------ 4. cryptic messages


def _hf_dir(root: pathlib.Path, config: dict, *, own_head: bool = True) -> pathlib.Path:
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  root.mkdir()
  state = {'shared.weight': np.zeros((4, 2), np.float32)}
  if own_head:
    state['lm_head.weight'] = np.ones((4, 2), np.float32)
  save_file(state, str(root / 'model.safetensors'))
  (root / 'config.json').write_text(json.dumps(config))
  return root


@pytest.mark.parametrize('config, said', [
    ({'d_model': 2}, r'no "tie_word_embeddings" \(HF\'s default: true\)'),
    ({}, r'no "tie_word_embeddings" \(HF\'s default: true\)'),
    ({'d_model': 2, 'tie_word_embeddings': True}, '"tie_word_embeddings": true'),
    ({'d_model': 2, 'scale_decoder_outputs': True}, '"scale_decoder_outputs": true'),
])
def test_hf_own_head_under_a_tied_config_names_the_file_and_key(tmp_path, config, said):
  path = _hf_dir(tmp_path / 'hf', config)
  with pytest.raises(checkpoints.CheckpointReadError,
                     match=rf'{path / "config.json"}: HF config has {said}, a head tied to '
                           r'shared\.weight and scaled by d_model\*\*-0\.5, but the weights hold '
                           r'their own lm_head\.weight, .* set "tie_word_embeddings": false\.'):
    checkpoints.load_params(str(path))


@pytest.mark.parametrize('key, value, shown', [
    ('tie_word_embeddings', 'false', r'"false", a str'),
    ('tie_word_embeddings', 0, '0, a int'),
    ('scale_decoder_outputs', None, 'null, a NoneType'),
])
def test_hf_head_flag_of_the_wrong_type_names_the_file_and_key(tmp_path, key, value, shown):
  path = _hf_dir(tmp_path / 'hf', {'d_model': 2, key: value}, own_head=False)
  with pytest.raises(checkpoints.CheckpointReadError,
                     match=rf'{path / "config.json"}: HF config has "{key}": {shown}; expected '
                           r'JSON true or false \(no quotes\)\.'):
    checkpoints.load_params(str(path))


@pytest.mark.slow
@pytest.mark.torch
def test_an_int32_tensor_in_an_hf_checkpoint_names_the_checkpoint(tmp_path):
  transformers = pytest.importorskip('transformers')
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  model = transformers.T5ForConditionalGeneration(transformers.T5Config(
      vocab_size=40, d_model=16, d_kv=6, num_heads=2, d_ff=24, num_layers=1,
      num_decoder_layers=1, feed_forward_proj='relu'))
  model.save_pretrained(tmp_path / 'hf')
  weights = tmp_path / 'hf' / 'model.safetensors'
  state = load_file(str(weights))
  name = 'encoder.block.0.layer.0.SelfAttention.q.weight'
  state[name] = state[name].astype(np.int32)
  save_file(state, str(weights), metadata={'format': 'pt'})
  with pytest.raises(checkpoints.CheckpointDtypeError) as e:
    checkpoints.load_params(str(tmp_path / 'hf'))
  assert str(e.value) == (
      f'Checkpoint {tmp_path / "hf"} stores parameters in dtypes other than float32, bfloat16, '
      'float16:\n  encoder/layers_0/attention/query/kernel: int32\nConvert it to one of those '
      '(an integer array holds quantized or corrupt weights); callers of '
      'checkpoints.load_params or cast_params may allow a cast with source_dtypes=.')


def test_coordinator_port_in_use_names_jax_coordinator_address(monkeypatch):
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
    taken.bind(('', 0))  # Every interface, as the coordinator listens.
    taken.listen()
    port = taken.getsockname()[1]
    monkeypatch.setenv('JAX_NUM_PROCESSES', '2')
    monkeypatch.setenv('JAX_PROCESS_ID', '0')
    monkeypatch.setenv('JAX_COORDINATOR_ADDRESS', f'127.0.0.1:{port}')
    monkeypatch.setenv('T5ALIGN_DISTRIBUTED_TIMEOUT_S', '2')
    with pytest.raises(multihost.StartError,
                       match=rf'process 0 cannot listen at the coordinator address '
                             rf'127\.0\.0\.1:{port} \(JAX_COORDINATOR_ADDRESS\): port {port}: '
                             r'Address already in use\. Another program .* choose a free port '
                             r'for JAX_COORDINATOR_ADDRESS'):
      multihost.initialize()


def _schedule_with_target(path: pathlib.Path, target) -> pathlib.Path:
  data = {'format': schedule.FORMAT, 'reference_length': 256, 'strategy': 'pmax',
          'calibrations': {'pmax': [{'strategy': 'pmax', 'length': 512, 'tau': 0.9,
                                     'reference_length': 256, 'target': target}]}}
  path.write_text(json.dumps(data))  # json writes NaN for float('nan').
  return path


@pytest.mark.parametrize('target, shown', [
    (float('nan'), 'nan'), (float('inf'), 'inf'), ([0.5, float('nan')], 'nan')])
def test_a_non_finite_schedule_target_names_the_file_and_key(tmp_path, target, shown):
  path = _schedule_with_target(tmp_path / 's.json', target)
  with pytest.raises(ValueError,
                     match=rf"temperature schedule {path}: calibrations\['pmax'\]\[0\]\['target'\] "
                           rf'holds {shown}; every number there must be finite'):
    schedule.load_schedule(str(path))


@pytest.mark.slow
@pytest.mark.tensorflow
def test_a_nan_schedule_target_is_refused_before_the_checkpoint_loads(tmp_path, monkeypatch):
  from t5align import jobs  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(VOCAB))
  path = _schedule_with_target(tmp_path / 's.json', float('nan'))

  def fail(*unused_args, **unused_kwargs):
    raise AssertionError('the checkpoint was read before the error')

  monkeypatch.setattr(checkpoints, 'load_params', fail)
  with pytest.raises(ValueError, match=rf"temperature schedule {path}: calibrations\['pmax'\]"
                                       r"\[0\]\['target'\] holds nan"):
    jobs.EvalJob(checkpoint=jobs.Checkpoint(str(CKPT)), mixture_or_task_name=TASK,
                 output_dir=str(tmp_path / 'out'), schedule_path=str(path), num_examples=2,
                 max_decode_length=4).run()


# ------------------------------------------------------------------ 5. the demo's calibration


class _Killed(Exception):
  pass


@pytest.mark.slow
def test_demo_calibration_killed_after_k_calibrations_resumes_to_the_same_schedule(
    tmp_path, monkeypatch):
  from t5align import calibration  # pylint: disable=g-import-not-at-top
  from t5align.calibration import strategies  # pylint: disable=g-import-not-at-top
  from t5align.demo import inputs, job, planning, store as demo_store  # pylint: disable=g-import-not-at-top
  settings = planning.DemoSettings(
      output_dir=str(tmp_path), model_dir=str(ASSET), strategies=('pmax', 'log_length'),
      num_examples=2, num_samples=1, num_references=2, batch_size=2)
  reference_length = assets.training_length(str(ASSET))
  settings = dataclasses.replace(settings, lengths=(2 * reference_length,))
  params, config, vocab = assets.load_shipped(str(ASSET))
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
