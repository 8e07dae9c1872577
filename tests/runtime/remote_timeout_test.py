"""Remote (gs://) reads end within $T5ALIGN_REMOTE_TIMEOUT_S with a message naming the path.

This machine has no route to Google Cloud Storage: tensorstore's gcs driver retries for minutes
there, so these are real offline reads. Each runs in a daemon thread joined with a deadline, so
a read that hangs fails the test instead of hanging it.
"""
from __future__ import annotations

import threading
import time

import pytest

from t5align import checkpoints
from t5align.runtime import fileio

TIMEOUT_S = 2
DEADLINE_S = 30  # Far above TIMEOUT_S (a loaded machine), far below tensorstore's retries.
BUCKET = 'gs://t5align-test-no-such-bucket/model'


def _outcome(fn) -> tuple[BaseException | None, float]:
  """(the exception `fn()` raised, seconds taken); fails if `fn` runs past DEADLINE_S."""
  result: dict[str, BaseException | None] = {'error': None}

  def run():
    try:
      fn()
    except BaseException as e:  # pylint: disable=broad-except
      result['error'] = e

  start = time.monotonic()
  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(DEADLINE_S)
  assert not thread.is_alive(), f'still waiting after {DEADLINE_S} s: no timeout'
  return result['error'], time.monotonic() - start


@pytest.mark.parametrize('path,fmt', [
    (f'{BUCKET}/checkpoint_100', 'auto'),  # detect_format lists the bucket.
    (f'{BUCKET}/checkpoint_100/checkpoint', 't5x'),  # Reads the msgpack.
    (f'{BUCKET}/checkpoint_100', 't5x_orbax'),  # Looks for state/_METADATA.
])
def test_offline_gs_checkpoint_times_out_with_the_path(monkeypatch, path, fmt):
  monkeypatch.setenv(fileio.REMOTE_TIMEOUT_ENV, str(TIMEOUT_S))
  error, seconds = _outcome(lambda: checkpoints.load_params(path, format=fmt))
  assert isinstance(error, fileio.RemoteTimeoutError), repr(error)
  message = str(error)
  assert path.removesuffix('/checkpoint') in message, message
  assert f'no answer within {TIMEOUT_S} s (T5ALIGN_REMOTE_TIMEOUT_S)' in message, message
  assert TIMEOUT_S <= seconds < DEADLINE_S


def test_fileio_remote_read_times_out(monkeypatch):
  """An epath read that never answers (a black-holed route; here a blocked call)."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv(fileio.REMOTE_TIMEOUT_ENV, '1')
  never = threading.Event()
  monkeypatch.setattr(type(epath.Path('gs://b/x')), 'read_bytes', lambda self: never.wait())
  error, seconds = _outcome(lambda: fileio.read_bytes('gs://b/run/metrics.json'))
  never.set()
  assert isinstance(error, fileio.RemoteTimeoutError), repr(error)
  assert str(error).startswith('Reading gs://b/run/metrics.json: no answer within 1 s')
  assert 1 <= seconds < DEADLINE_S


@pytest.mark.parametrize('value', ['abc', '0', '-5', 'inf'])
def test_bad_timeout_setting_is_named(monkeypatch, value):
  monkeypatch.setenv(fileio.REMOTE_TIMEOUT_ENV, value)
  with pytest.raises(ValueError, match=f"T5ALIGN_REMOTE_TIMEOUT_S='{value}': expected a positive"):
    fileio.remote_timeout_s()


@pytest.mark.tensorflow
def test_offline_gs_mesh_tf_checkpoint_times_out(monkeypatch):
  pytest.importorskip('tensorflow')
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv(fileio.REMOTE_TIMEOUT_ENV, '1')
  never = threading.Event()
  # A black-holed route (here DNS fails at once, so the hang is simulated).
  monkeypatch.setattr(tf.train, 'load_checkpoint', lambda path: never.wait())
  path = f'{BUCKET}/mesh_tf/model.ckpt-100'
  error, seconds = _outcome(lambda: checkpoints.read_params(path, format='mesh_tf'))
  never.set()
  assert isinstance(error, fileio.RemoteTimeoutError), repr(error)
  assert str(error).startswith(f'Opening the Mesh-TF checkpoint {path}: no answer within 1 s')
  assert 1 <= seconds < DEADLINE_S
