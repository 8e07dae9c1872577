"""t5align/runtime/fileio.py: URLs go through etils.epath (never a local 'gs:' folder); local writes
atomic, with the permissions the umask gives.

Every reader of an input file (TEXT_FILE, JSONL_FILE, metrics files, schedules) goes through
`fileio.read_input`: a fifo, a device or a folder is refused before it is opened, and a file over
T5ALIGN_MAX_INPUT_BYTES before it is read, each naming the setting."""
from __future__ import annotations

import builtins
import json
import os
import pathlib
import subprocess
import sys

import pytest

import runs

from t5align.calibration import samples
from t5align import run_identity
from t5align.runtime import fileio
from t5align.runtime import records


@pytest.fixture
def fake_bucket(tmp_path, monkeypatch):
  """epath's gs:// path class redirected into tmp_path/bucket; records every call made."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  root = tmp_path / 'bucket'
  root.mkdir()
  calls = []
  monkeypatch.chdir(tmp_path)  # A stray local 'gs:' folder would appear here.
  gpath = type(epath.Path('gs://b/x'))

  def redirect(name, fn):
    def method(self, *args, **kwargs):
      calls.append((name, os.fspath(self)))
      return fn(str(root / os.fspath(self).removeprefix('gs://')), *args, **kwargs)
    return method

  monkeypatch.setattr(gpath, 'open', redirect('open', builtins.open))
  monkeypatch.setattr(gpath, 'exists', redirect('exists', os.path.exists))
  monkeypatch.setattr(gpath, 'mkdir',
                      redirect('mkdir', lambda p, **k: os.makedirs(p, exist_ok=True)))
  yield root, calls
  assert not (tmp_path / 'gs:').exists()


def test_gs_writes_go_through_epath(fake_bucket):
  root, calls = fake_bucket
  fileio.write_json_atomic('gs://b/run/metrics.json', {'a': 1})
  assert json.loads((root / 'b/run/metrics.json').read_text()) == {'a': 1}
  assert ('open', 'gs://b/run/metrics.json') in calls
  assert fileio.exists('gs://b/run/metrics.json') and not fileio.exists('gs://b/run/other')


def test_prediction_log_on_gs_rewrites_the_object_and_reopens(fake_bucket):
  root, _ = fake_bucket
  run_identity.check_run('gs://b/eval/task', run_identity.make(facts={'k': 1}),
                         kind='eval')
  log = records.RecordLog('gs://b/eval/task/predictions.jsonl')
  log.append([{'index': 0, 'prediction': 'x'}])
  log.append([{'index': 1, 'prediction': 'y'}])
  lines = (root / 'b/eval/task/predictions.jsonl').read_text().splitlines()
  assert [json.loads(line)['index'] for line in lines] == [0, 1]
  again = records.RecordLog('gs://b/eval/task/predictions.jsonl')
  assert [r['prediction'] for r in again.ordered()] == ['x', 'y']
  run_identity.check_run('gs://b/eval/task', run_identity.make(facts={'k': 1}),
                         kind='eval')  # The same run resumes.
  with pytest.raises(ValueError, match='different run'):
    run_identity.check_run('gs://b/eval/task', run_identity.make(facts={'k': 2}),
                         kind='eval')


def test_gs_without_the_mock_uses_the_library_not_a_local_folder(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  from etils import epath  # pylint: disable=g-import-not-at-top
  attempted = []

  def fail(self, *args, **kwargs):
    attempted.append(os.fspath(self))
    raise PermissionError(f'no credentials for {self}')

  monkeypatch.setattr(type(epath.Path('gs://b/x')), 'open', fail)
  monkeypatch.setattr(type(epath.Path('gs://b/x')), 'mkdir', lambda *a, **k: None)
  with pytest.raises(PermissionError, match='gs://b/x/out.json'):
    fileio.write_atomic('gs://b/x/out.json', b'{}')
  assert attempted == ['gs://b/x/out.json']
  assert os.listdir(tmp_path) == []


def test_local_write_atomic_keeps_the_old_file_on_failure(tmp_path):
  path = tmp_path / 'sub' / 'f.txt'
  fileio.write_atomic(path, 'old')

  with pytest.raises(TypeError):
    fileio.write_atomic(path, 123)  # type: ignore[arg-type]
  assert path.read_text() == 'old'
  assert sorted(os.listdir(path.parent)) == ['f.txt']  # No temporary left behind.


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
                          env=runs.ENV, capture_output=True, text=True, timeout=60, check=False)
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
