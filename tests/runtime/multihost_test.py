"""Two processes x 4 simulated CPU devices (jax.distributed on 127.0.0.1, gloo collectives).

`python -m t5align.eval` and `python -m t5align.calibrate` on the shipped retrieval model give
what one process gives (run in this test's own process as the reference); process 0 alone
writes; a kill -9 mid-run and a restart of both processes records every example exactly once.
Every subprocess runs in its own process group under a deadline and is killed on any failure.
"""
from __future__ import annotations

import json
import os
import pathlib
import time

import numpy as np
import pytest

pytest.importorskip('seqio')

from t5align.shipped import assets  # pylint: disable=g-import-not-at-top

pytestmark = pytest.mark.tensorflow

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL_DIR = REPO_ROOT / 't5align' / 'shipped' / 'retrieval_t5'
CHECKPOINT = pathlib.Path(assets.checkpoint_dir(str(MODEL_DIR)))
VOCABULARY = MODEL_DIR / 'sentencepiece.model'
NUM_EXAMPLES = 12  # 3 global batches of 4 (data axis 4 = 2 rows per process).


def _eval_args(out: pathlib.Path, num_partitions: int) -> list[str]:
  return ['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/retrieval_small.gin',
          f'--gin.CHECKPOINT_PATH={CHECKPOINT}', f'--gin.EVAL_OUTPUT_DIR={out}',
          '--gin.MIXTURE_OR_TASK_NAME=t5align_passkey_2k',
          f'--gin_bindings=seqio_tasks.options.passkey_examples = {NUM_EXAMPLES}',
          '--gin.BATCH_SIZE=4', '--gin.MAX_DECODE_LENGTH=8',
          f'--gin.NUM_PARTITIONS={num_partitions}']


def _records(path: pathlib.Path) -> list[dict]:
  """The complete (newline-ended) records of a prediction log."""
  return [json.loads(line) for line in path.read_text().split('\n')[:-1]]


@pytest.mark.multiprocess
@pytest.mark.cli
def test_eval_two_processes_kill_resume_equal_one_process(tmp_path, processes, monkeypatch,
                                                          clean_gin):
  # Reference: one process, one device, in this process.
  from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(VOCABULARY))
  monkeypatch.chdir(REPO_ROOT)
  t5align_eval.main(_eval_args(tmp_path / 'one', 1))
  task = 't5align_passkey_2k'
  reference = _records(tmp_path / 'one' / task / 'predictions.jsonl')
  assert [r['index'] for r in reference] == list(range(NUM_EXAMPLES))

  # Two processes, mesh data=4 x model=2 (the data axis spans both processes).
  out = tmp_path / 'two'
  folder = out / task
  args = ['t5align.eval', *_eval_args(out, 2)]
  env = {'T5ALIGN_VOCABULARY': str(VOCABULARY)}
  run = processes(args, tmp_path / 'logs1', env=env)
  predictions = folder / 'predictions.jsonl'
  while time.monotonic() < run.deadline and run.procs[0].poll() is None:
    if predictions.exists() and predictions.read_text().count('\n') >= 4:
      break
    time.sleep(0.02)
  run.kill(0)  # kill -9 of the writer, mid-run: at least one batch of three is recorded.
  run.kill()  # Process 1 would wait for it forever in its next collective.
  before = _records(predictions)
  assert 4 <= len(before) < NUM_EXAMPLES, run.tails()
  assert not (folder / 'metrics.json').exists()

  restart = processes(args, tmp_path / 'logs2', env=env)
  restart.wait()  # Restart both.
  # Each process read (and tokenized) only its half of the examples.
  for i, log in enumerate(restart.logs):
    assert (f'{task}: process {i} reads {NUM_EXAMPLES // 2} of {NUM_EXAMPLES} examples '
            f'(share {i} of 2)') in log.read_text(), restart.tails()
  after = _records(predictions)
  assert sorted(r['index'] for r in after) == list(range(NUM_EXAMPLES))  # Each exactly once.
  assert after[:len(before)] == before  # Nothing redone.
  assert sorted(p.name for p in folder.iterdir()) == ['config.gin', 'metrics.json',
                                                      'predictions.jsonl', 'run.json']
  # The same predictions (and record fields) as one process.
  assert sorted(after, key=lambda r: r['index']) == reference
  metrics = [json.loads((o / task / 'metrics.json').read_text()) for o in (tmp_path / 'one', out)]
  assert metrics[0]['metrics'] == metrics[1]['metrics']
  run_json = json.loads((folder / 'run.json').read_text())
  assert (run_json['process_count'], run_json['device_count'], run_json['mesh']) == (
      2, 8, {'data': 4, 'model': 2})


@pytest.mark.multiprocess
@pytest.mark.cli
def test_calibrate_two_processes_equal_one_process(tmp_path, processes, clean_gin):
  rng = np.random.default_rng(0)
  words = ('the pass key is remember it grass green sky blue sun yellow here we go there and '
           'back again line number content register').split()
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text('\n'.join(' '.join(rng.choice(words, 30)) for _ in range(100)) + '\n')
  args = ['--gin_file=gin/calibrate.gin', f'--gin.CHECKPOINT_PATH={CHECKPOINT}',
          f'--gin.TEXT_FILE={corpus}', f'--gin.VOCABULARY_PATH={VOCABULARY}',
          '--gin.LENGTHS=(512,)', '--gin.REFERENCE_LENGTH=256', '--gin.NUM_SAMPLES=2',
          "--gin.STRATEGIES=('pmax',)",
          # float32: the 1e-6 comparison below is for the mesh, not bf16's reduction order.
          "--gin.ACTIVATION_DTYPE='float32'",
          '--gin_bindings=calibration.SearchSettings.grid = (1.0, 0.95, 0.9, 0.85)']
  from t5align import calibrate  # pylint: disable=g-import-not-at-top
  from t5align import schedule  # pylint: disable=g-import-not-at-top
  one_path = tmp_path / 'one' / 'schedule.json'
  cwd = os.getcwd()
  os.chdir(REPO_ROOT)
  try:
    calibrate.main([*args, f'--gin.OUTPUT_PATH={one_path}'])
  finally:
    os.chdir(cwd)

  two_dir = tmp_path / 'two'
  processes(['t5align.calibrate', *args, f'--gin.OUTPUT_PATH={two_dir / "schedule.json"}',
             '--gin.MESH_SHAPE=(2, 2, 2)'], tmp_path / 'logs',
            env={'T5ALIGN_VOCABULARY': str(VOCABULARY)}).wait()
  # No temporaries left: the schedule and gin's configuration beside it.
  assert sorted(p.name for p in two_dir.iterdir()) == ['schedule.json',
                                                       'schedule.json.config.gin']
  one, two = (schedule.load_schedule(str(p)) for p in (one_path, two_dir / 'schedule.json'))
  assert two.provenance['process_count'] == 2 and two.provenance['device_count'] == 8
  assert two.provenance['settings']['mesh'] == {'tau': 2, 'data': 2, 'model': 2}
  assert two.provenance['samples_sha256'] == one.provenance['samples_sha256']
  a, b = one.calibrations['pmax'][0], two.calibrations['pmax'][0]
  assert a.tau == b.tau
  np.testing.assert_allclose(b.details['values'], a.details['values'], rtol=1e-6)
  np.testing.assert_allclose(b.target, a.target, rtol=1e-6)
  assert not a.clamped  # The chosen tau lies inside the grid: a real choice, made the same way.


# ---------------------------------------------------------------------------------------------
# The environment checks of `initialize` and the one-process forms of the helpers.


@pytest.mark.parametrize('env, expected', [
    ({}, (1, '')),
    ({'TPU_WORKER_HOSTNAMES': 'host0'}, (1, '')),
    ({'TPU_WORKER_HOSTNAMES': 'host0,host1,host2,host3'}, (4, 'TPU_WORKER_HOSTNAMES')),
    ({'SLURM_NTASKS': '8'}, (8, 'SLURM_NTASKS')),
    ({'JAX_NUM_PROCESSES': '2', 'TPU_WORKER_HOSTNAMES': 'a,b,c,d'}, (2, 'JAX_NUM_PROCESSES')),
])
def test_process_count_from_environment(monkeypatch, env, expected):
  from t5align.runtime import multihost  # pylint: disable=g-import-not-at-top
  for name in ('JAX_NUM_PROCESSES', 'TPU_PROCESS_ADDRESSES', 'TPU_WORKER_HOSTNAMES',
               'SLURM_NTASKS', 'OMPI_COMM_WORLD_SIZE'):
    monkeypatch.delenv(name, raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  assert multihost._env_process_count() == expected  # pylint: disable=protected-access


def test_initialize_names_missing_settings(monkeypatch):
  from t5align.runtime import multihost  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('JAX_NUM_PROCESSES', '2')
  monkeypatch.delenv('JAX_COORDINATOR_ADDRESS', raising=False)
  monkeypatch.setenv('JAX_PROCESS_ID', '0')
  with pytest.raises(ValueError, match='needs JAX_COORDINATOR_ADDRESS'):
    multihost.initialize()
  monkeypatch.setenv('JAX_COORDINATOR_ADDRESS', '127.0.0.1:1')
  monkeypatch.setenv('JAX_PROCESS_ID', '2')
  with pytest.raises(ValueError, match=r'JAX_PROCESS_ID=2 must be in 0\.\.1'):
    multihost.initialize()
  monkeypatch.setenv('JAX_NUM_PROCESSES', 'two')
  with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two' is not a process count"):
    multihost.initialize()
  monkeypatch.setenv('JAX_NUM_PROCESSES', '1')
  assert not multihost.initialize()  # One process: nothing to do.


def test_one_process_helpers():
  import jax  # pylint: disable=g-import-not-at-top
  from t5align import partitioning  # pylint: disable=g-import-not-at-top
  from t5align.runtime import multihost  # pylint: disable=g-import-not-at-top
  sharding = partitioning.batch_sharding(partitioning.eval_mesh(1), 2)
  np.testing.assert_array_equal(multihost.process_rows(sharding, 4), [0, 1, 2, 3])
  x = np.arange(8, dtype=np.int32).reshape(4, 2)
  placed = multihost.global_batch(x, sharding, 4)
  assert isinstance(placed, jax.Array) and placed.sharding == sharding
  np.testing.assert_array_equal(multihost.gather(placed), x)
  assert multihost.is_writer() and multihost.broadcast_json({'a': [1]}) == {'a': [1]}
  assert multihost.on_writer(lambda: 3, 'three') == 3
  multihost.barrier('one process')


def test_json_collectives_as_two_processes(monkeypatch):
  """broadcast_json on process 1 and gather_json on process 0 against fake collectives that
  hold the other process's JSON bytes (written here with json.dumps): sizes, padding, order."""
  from t5align.runtime import multihost  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  sent = json.dumps({'schedule': [0.5, 2.0], 'name': 'ü'}).encode('utf-8')

  def broadcast_from_0(x):  # Process 0's scalar size, then its (equal-shape) padded buffer.
    x = np.asarray(x)
    if x.ndim == 0:
      return np.int64(len(sent))
    assert x.shape == (len(sent),) and not x.any()  # Process 1 sends zeros of the right size.
    return np.frombuffer(sent, np.uint8)

  monkeypatch.setattr(multihost, 'is_writer', lambda: False)
  monkeypatch.setattr(multihost, 'broadcast', broadcast_from_0)
  assert multihost.broadcast_json('ignored') == {'schedule': [0.5, 2.0], 'name': 'ü'}

  peer = json.dumps([{'index': 7, 'prediction': 'long answer é'}, 3]).encode('utf-8')

  def gather_with_peer(x):  # Process 0's `x` stacked with process 1's.
    x = np.asarray(x)
    if x.shape == (1,):
      return np.array([x[0], len(peer)], np.int64)
    assert x.shape[1] == max(len(peer), len(json.dumps(['a']).encode()))
    theirs = np.zeros_like(x)
    theirs[0, :len(peer)] = np.frombuffer(peer, np.uint8)
    return np.concatenate([x, theirs])

  monkeypatch.setattr(multihost, 'gather', gather_with_peer)
  assert multihost.gather_json(['a']) == ['a', {'index': 7, 'prediction': 'long answer é'}, 3]
