"""t5align/runtime/outputs.py: output places locked, checked and cleaned; lines read as UTF-8.

A second run into a folder in use is refused at once, naming the holder, and a dead holder's lock
taken over; a folder's lock and the locks of the files inside it exclude each other, by any path.
An output place that cannot be written is refused before any work. The temporaries a killed run
left are removed at the next start, but never those of a live run below the folder. A line that
is not UTF-8 (of TEXT_FILE, of predictions.jsonl) is named with its file and line.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import runs

from t5align.calibration import samples
from t5align import jobs
from t5align.runtime import outputs
from t5align.runtime import records


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
  child = subprocess.Popen([sys.executable, '-c', _HOLD_LOCK, str(out)], env=runs.ENV,
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


_HOLD = '''
import sys
from t5align.runtime import outputs
lock = outputs.FolderLock(outputs.lock_path(sys.argv[1], is_file=sys.argv[2] == 'file'), 'test')
print('locked', flush=True)
sys.stdin.read()
'''


@contextlib.contextmanager
def _held_by_another_process(path: pathlib.Path, kind: str):
  child = subprocess.Popen([sys.executable, '-c', _HOLD, str(path), kind], env=runs.ENV,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    assert child.stdout.readline() == 'locked\n'
    yield child
  finally:
    child.kill()
    child.wait()
    child.stdout.close()
    child.stdin.close()


def test_one_lock_per_output_file_shared_by_the_folder_that_holds_it(tmp_path, no_load):
  demo_dir = tmp_path / 'demo'
  demo_dir.mkdir()
  # The demo runs into D (its folder lock): calibrate into D/schedule.json is refused.
  with _held_by_another_process(demo_dir, 'folder') as demo:
    with pytest.raises(outputs.OutputLockedError,
                       match=rf'OUTPUT_PATH {demo_dir / "schedule.json"} is inside {demo_dir}, '
                             rf'the output folder of another run \(pid={demo.pid} '):
      jobs.CalibrationJob(**{**runs.calibrate_args(tmp_path),
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
                            str(held_deep), str(marker)], env=runs.ENV)
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


def test_non_utf8_calibration_text_and_prediction_line(tmp_path):
  text = tmp_path / 'corpus.txt'
  text.write_bytes(b'fine line\nbad \xff line\n')
  with pytest.raises(ValueError, match=rf'{text}:2: not UTF-8 text'):
    samples.text_file_stream(str(text), 'unused.model')
  log = tmp_path / 'predictions.jsonl'
  log.write_bytes(b'{"index": 0}\n{"index": 1, "prediction": "\xff"}\n')
  with pytest.raises(ValueError, match=rf'{log}:2: not UTF-8 text'):
    records.RecordLog(log)
