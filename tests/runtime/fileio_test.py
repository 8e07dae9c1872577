"""t5align/runtime/fileio.py: URLs go through etils.epath (never a local 'gs:' folder); local writes
atomic."""
from __future__ import annotations

import builtins
import json
import os

import pytest

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
