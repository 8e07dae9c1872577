"""t5align/runtime/multihost.py's start (`multihost.initialize`): a start that cannot complete ends
with a StartError naming JAX_COORDINATOR_ADDRESS and T5ALIGN_DISTRIBUTED_TIMEOUT_S, within the
timeout, never JAX's own abort or a hang.

A missing process 1 (or process 0), the coordinator's port in use, a process that passes the
start-up check as process 1 and never starts JAX; and the eval command with a process missing.
None needs seqio (multihost_test.py, whose two-process runs read seqio tasks, is tensorflow's).
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

import runs

from t5align.runtime import multihost


def test_a_missing_process_fails_the_start_within_the_timeout(monkeypatch):
  port = runs.free_port()
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


@pytest.mark.cli
def test_the_eval_command_with_a_missing_process_exits_instead_of_hanging(tmp_path):
  port = runs.free_port()
  env = dict(runs.ENV, JAX_NUM_PROCESSES='2', JAX_PROCESS_ID='0', JAX_PLATFORMS='cpu',
             JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', T5ALIGN_DISTRIBUTED_TIMEOUT_S='2')
  start = time.monotonic()
  done = subprocess.run(
      [sys.executable, '-m', 't5align.eval', *runs.eval_args(tmp_path, runs.CKPT)],
      cwd=runs.REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 1, done.stderr[-2000:]
  assert (f'StartError: process 0 waited 2 s at the coordinator address 127.0.0.1:{port}'
          in done.stderr), done.stderr[-2000:]
  assert time.monotonic() - start < 120


def _start(port: int, process_id: int) -> subprocess.Popen:
  env = dict(runs.ENV, JAX_NUM_PROCESSES='2', JAX_PROCESS_ID=str(process_id), JAX_PLATFORMS='cpu',
             JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', T5ALIGN_DISTRIBUTED_TIMEOUT_S='3')
  return subprocess.Popen(
      [sys.executable, '-c', 'from t5align.runtime import multihost; multihost.initialize(); '
       'print("started")'], cwd=runs.REPO_ROOT, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)


@pytest.mark.multiprocess
def test_a_process_impersonating_process_1_ends_process_0_with_a_start_error():
  port = runs.free_port()
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
