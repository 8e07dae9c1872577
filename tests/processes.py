"""Two local processes of one `python -m ...` command (jax.distributed on 127.0.0.1, gloo
collectives, simulated CPU devices), each in its own process group under a deadline and killed
on any failure: what conftest's `processes` fixture starts for the multi-process tests."""
from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DEADLINE_S = 240


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class Processes:
  """Two processes of one `python -m ...` command, each in its own process group."""

  def __init__(self, args: list[str], logs: pathlib.Path, cache: pathlib.Path, *,
               devices: int = 4, env: dict[str, str] | None = None):
    port = _free_port()
    logs.mkdir(parents=True, exist_ok=True)
    self.logs = [logs / f'process{i}.log' for i in range(2)]
    self.procs = []
    for i in range(2):
      full = dict(os.environ, JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', JAX_NUM_PROCESSES='2',
                  JAX_PROCESS_ID=str(i), JAX_PLATFORMS='cpu',
                  XLA_FLAGS=f'--xla_force_host_platform_device_count={devices} '
                            '--xla_backend_optimization_level=0',  # Compiles faster.
                  PYTHONPATH=str(REPO_ROOT),
                  # A restart reuses the first run's compiled programs (saves time, not a check).
                  JAX_COMPILATION_CACHE_DIR=str(cache),
                  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
                  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0', **(env or {}))
      with open(self.logs[i], 'wb') as log:
        self.procs.append(subprocess.Popen([sys.executable, '-m', *args], cwd=REPO_ROOT,
                                           env=full, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))
    self.deadline = time.monotonic() + DEADLINE_S

  def tails(self) -> str:
    return '\n'.join(f'--- process {i} ---\n' + path.read_text(errors='replace')[-3000:]
                     for i, path in enumerate(self.logs))

  def kill(self, i: int | None = None) -> None:
    for j, proc in enumerate(self.procs):
      if i in (None, j) and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
          os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

  def wait(self) -> None:
    """Both exit 0 before the deadline, or both are killed and the test fails with their logs."""
    try:
      for proc in self.procs:
        proc.wait(timeout=max(1.0, self.deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      self.kill()
      pytest.fail(f'timed out after {DEADLINE_S} s:\n{self.tails()}')
    if any(p.returncode for p in self.procs):
      self.kill()
      pytest.fail(f'exit codes {[p.returncode for p in self.procs]}:\n{self.tails()}')
