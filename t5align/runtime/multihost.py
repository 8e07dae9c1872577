"""Several processes (TPU pod hosts, or CPU processes on one machine) running one program.

Entry points call `initialize()` before anything touches a JAX backend. Every process then runs
the same code on the same global arrays; the helpers here cover what differs per process:
  - which rows of a global batch it supplies (`process_rows`, `global_batch`),
  - bringing small results back to every host (`gather`, `broadcast`),
  - writing files from process 0 only (`is_writer`, `on_writer`), then `barrier`;
With one process each helper reduces to the plain single-host operation.

Starting is bounded: with JAX_NUM_PROCESSES, `initialize` first meets every process at the
coordinator address (`rendezvous`) for at most $T5ALIGN_DISTRIBUTED_TIMEOUT_S seconds (default
300), and raises naming the address and the processes that did not arrive, rather than waiting
in `jax.distributed.initialize`, whose timeout aborts the process without a Python error. Should
JAX's own start then not finish within that timeout (a process that passed the meeting did not
start JAX: another program answering as it, or one that died), the process ends with a
`StartError` message and exit status 1 before JAX's later deadline would abort it.
"""
from __future__ import annotations

import json
import math
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, TypeVar

from absl import logging
import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

from t5align.runtime import tpu_chips

T = TypeVar('T')

# Environment variables that say a multi-host TPU, SLURM or Open MPI job is running (what
# jax._src.clusters checks), with the value that counts its processes or hosts.
_CLUSTER_SIZE_VARS = (
    ('TPU_PROCESS_ADDRESSES', lambda v: len(v.split(','))),
    ('TPU_WORKER_HOSTNAMES', lambda v: len(v.split(','))),
    ('SLURM_NTASKS', int),
    ('OMPI_COMM_WORLD_SIZE', int),
)


def _env_process_count() -> tuple[int, str]:
  """(processes the environment announces, the variable saying so); (1, '') when none does."""
  for name, count in (('JAX_NUM_PROCESSES', int), *_CLUSTER_SIZE_VARS):
    value = os.environ.get(name, '').strip()
    if not value:
      continue
    try:
      n = count(value)
    except ValueError as e:
      raise ValueError(f'{name}={value!r} is not a process count.') from e
    if name == 'JAX_NUM_PROCESSES' or n > 1:
      return (n, name) if n > 1 else (1, '')
  return 1, ''


DISTRIBUTED_TIMEOUT_ENV = 'T5ALIGN_DISTRIBUTED_TIMEOUT_S'
DEFAULT_DISTRIBUTED_TIMEOUT_S = 300.0
# JAX's own start deadline comes this long after ours: past it JAX aborts the process (SIGABRT,
# DEADLINE_EXCEEDED) without a Python error, so ours must come first.
JAX_DEADLINE_MARGIN_S = 30


class StartError(RuntimeError):
  """The processes of a multi-process run did not all start within the timeout."""


def distributed_timeout_s() -> float:
  """Seconds the processes may take to meet: $T5ALIGN_DISTRIBUTED_TIMEOUT_S, else 300."""
  value = os.environ.get(DISTRIBUTED_TIMEOUT_ENV, '').strip()
  if not value:
    return DEFAULT_DISTRIBUTED_TIMEOUT_S
  try:
    timeout = float(value)
  except ValueError:
    timeout = float('nan')
  if not 0 < timeout < float('inf'):
    raise ValueError(f'{DISTRIBUTED_TIMEOUT_ENV}={value!r}: expected a positive number of '
                     'seconds.')
  return timeout


def _host_port(address: str) -> tuple[str, int]:
  host, _, port = address.rpartition(':')
  if not host or not port.isdigit():
    raise ValueError(f'JAX_COORDINATOR_ADDRESS={address!r}: expected host:port.')
  return host.strip('[]'), int(port)


def _readline(conn: socket.socket, deadline: float) -> str:
  data = b''
  while not data.endswith(b'\n'):
    conn.settimeout(max(0.01, deadline - time.monotonic()))
    chunk = conn.recv(256)
    if not chunk:
      break
    data += chunk
  return data.decode('utf-8', 'replace').strip()


def rendezvous(address: str, num_processes: int, process_id: int, timeout_s: float) -> None:
  """Meets every process at `address` (host:port of process 0) before JAX starts there.

  Process 0 listens on the port and waits for processes 1..n-1 to connect and say who they
  are, then releases them and closes the port for the coordination service to take it; the
  others connect (retrying until process 0 listens) and wait for the release.

  Raises:
    StartError: within `timeout_s`, naming the address and the processes that did not arrive
      (process 0), or that process 0 was not reached or gave up (the others).
  """
  host, port = _host_port(address)
  deadline = time.monotonic() + timeout_s
  if process_id == 0:
    _await_processes(address, port, num_processes, timeout_s, deadline)
  else:
    _join(address, host, port, num_processes, process_id, timeout_s, deadline)


def _await_processes(address: str, port: int, num_processes: int, timeout_s: float,
                     deadline: float) -> None:
  """`rendezvous` on process 0: every other process must connect and say its id."""
  dual = socket.has_dualstack_ipv6()  # Like JAX's service: every interface, IPv4 and 6.
  try:
    server = socket.create_server(('', port), family=socket.AF_INET6 if dual else socket.AF_INET,
                                  dualstack_ipv6=dual)
  except OSError as e:
    raise StartError(
        f'process 0 cannot listen at the coordinator address {address} '
        f'(JAX_COORDINATOR_ADDRESS): port {port}: {os.strerror(e.errno) if e.errno else e}. '
        'Another program (or an earlier run still going) holds it; choose a free port for '
        'JAX_COORDINATOR_ADDRESS and start every process with it.') from e
  arrived: dict[int, socket.socket] = {}
  try:
    while len(arrived) < num_processes - 1:
      server.settimeout(max(0.01, deadline - time.monotonic()))
      conn = None
      try:
        conn, _ = server.accept()
        words = _readline(conn, deadline).split()
      except OSError:  # socket.timeout included.
        if conn is not None:
          conn.close()
        if time.monotonic() < deadline:
          continue
        missing = sorted(set(range(1, num_processes)) - set(arrived))
        for conn in arrived.values():
          conn.sendall(f'fail processes {missing} did not arrive\n'.encode())
        raise StartError(
            f'process 0 waited {timeout_s:g} s at the coordinator address {address} '
            f'(JAX_COORDINATOR_ADDRESS) for {num_processes} processes; '
            f'process{"es" if len(missing) > 1 else ""} {", ".join(map(str, missing))} did '
            f'not arrive. Start every process with the same JAX_COORDINATOR_ADDRESS and '
            f'JAX_NUM_PROCESSES={num_processes} (ids 0..{num_processes - 1}), or raise '
            f'{DISTRIBUTED_TIMEOUT_ENV} (now {timeout_s:g}).') from None
      if len(words) != 2 or not all(w.isdigit() for w in words):
        conn.close()  # Not one of ours (a port scan): ignore it.
        continue
      pid, count = int(words[0]), int(words[1])
      problem = None
      if count != num_processes:
        problem = f'JAX_NUM_PROCESSES={count} but process 0 has {num_processes}'
      elif not 0 < pid < num_processes or pid in arrived:
        problem = f'JAX_PROCESS_ID={pid} is out of range or taken twice'
      if problem:
        conn.sendall(f'fail {problem}\n'.encode())
        conn.close()
        for other in arrived.values():
          other.sendall(f'fail {problem}\n'.encode())
        raise StartError(f'coordinator {address}: {problem}.')
      arrived[pid] = conn
    for conn in arrived.values():
      conn.sendall(b'go\n')
    for conn in arrived.values():  # They close first: the port is free for JAX at once.
      _readline(conn, deadline + 10)
  finally:
    for conn in arrived.values():
      conn.close()
    server.close()


def _join(address: str, host: str, port: int, num_processes: int, process_id: int,
          timeout_s: float, deadline: float) -> None:
  """`rendezvous` on the other processes: connect to process 0, say who we are, await 'go'."""
  setting = f'{DISTRIBUTED_TIMEOUT_ENV}={timeout_s:g}'
  answer = ''
  while True:
    try:
      with socket.create_connection((host, port), timeout=max(0.01, deadline - time.monotonic())
                                    ) as conn:
        conn.sendall(f'{process_id} {num_processes}\n'.encode())
        answer = _readline(conn, deadline + 1)
      break
    except OSError:  # Refused (process 0 not listening yet) or timed out.
      if time.monotonic() >= deadline:
        raise StartError(
            f'process {process_id} could not reach process 0 at the coordinator address '
            f'{address} (JAX_COORDINATOR_ADDRESS) within {timeout_s:g} s: is process 0 '
            f'running, with the same address? ({setting})') from None
      time.sleep(0.2)
  if answer != 'go':
    why = answer.removeprefix('fail ') or (
        f'no answer: is another process already started as JAX_PROCESS_ID={process_id}, or '
        'another program listening there?')
    raise StartError(f'process {process_id}: the coordinator {address} (process 0) refused the '
                     f'start: {why} ({setting}).')


def _use_gloo() -> None:
  # Cross-process collectives of the CPU backend (only it reads this option; TPU and GPU
  # backends have their own), so it is set whatever the platform.
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')


def initialize() -> bool:
  """Calls `jax.distributed.initialize` when the environment says there are several processes.

  - JAX_NUM_PROCESSES > 1: JAX_COORDINATOR_ADDRESS (host:port of process 0) and JAX_PROCESS_ID
    are required; they are passed explicitly.
  - TPU pods (TPU_WORKER_HOSTNAMES / TPU_PROCESS_ADDRESSES with several hosts), SLURM and Open MPI
    jobs with several tasks, or T5ALIGN_DISTRIBUTED=1 (e.g. a Cloud TPU VM pod whose hosts
    are known only to the metadata server): jax's own cluster detection fills in everything.
  CPU collectives across processes use gloo, selected before initializing. With
  JAX_NUM_PROCESSES, the processes first meet (`rendezvous`) within `distributed_timeout_s()`;
  every `jax.distributed.initialize` gets that timeout too.

  Returns:
    True if this call (or an earlier one) initialized several processes.
  """
  tpu_chips.libtpu_without_tpus()  # An installed libtpu without TPUs: no start-up noise.
  if jax.distributed.is_initialized():
    return jax.process_count() > 1
  count, source = _env_process_count()
  forced = os.environ.get('T5ALIGN_DISTRIBUTED', '') == '1'
  if count <= 1 and not forced:
    return False
  if source == 'JAX_NUM_PROCESSES':
    missing = [v for v in ('JAX_COORDINATOR_ADDRESS', 'JAX_PROCESS_ID') if not os.environ.get(v)]
    if missing:
      raise ValueError(f'JAX_NUM_PROCESSES={count} needs {" and ".join(missing)} as well '
                       '(host:port of process 0, and this process\'s id in 0..n-1).')
    process_id = int(os.environ['JAX_PROCESS_ID'])
    if not 0 <= process_id < count:
      raise ValueError(f'JAX_PROCESS_ID={process_id} must be in 0..{count - 1} '
                       f'(JAX_NUM_PROCESSES={count}).')
    address, timeout = os.environ['JAX_COORDINATOR_ADDRESS'], distributed_timeout_s()
    logging.info('process %d of %d: meeting the others at %s (at most %g s, %s)', process_id,
                 count, address, timeout, DISTRIBUTED_TIMEOUT_ENV)
    rendezvous(address, count, process_id, timeout)
    _use_gloo()
    _initialize_within(
        timeout, f'process {process_id} of {count}: JAX\'s coordination service at {address} '
        f'(JAX_COORDINATOR_ADDRESS) did not see every process start within {timeout:g} s '
        f'({DISTRIBUTED_TIMEOUT_ENV}), though every process had passed the start-up check there. '
        'One that passed it is not running this start: another program '
        'answering as that process, or a process that stopped after the check. Start every '
        f'process with the same command, JAX_COORDINATOR_ADDRESS and JAX_NUM_PROCESSES={count}.',
        coordinator_address=address, num_processes=count, process_id=process_id)
  else:
    _use_gloo()
    timeout = distributed_timeout_s()
    _initialize_within(timeout, f'jax.distributed.initialize (processes found by the cluster '
                       f'environment) did not finish within {timeout:g} s '
                       f'({DISTRIBUTED_TIMEOUT_ENV}): are all hosts running this command?')
  return jax.process_count() > 1


def _initialize_within(timeout_s: float, message: str, **kwargs: Any) -> None:
  """`jax.distributed.initialize(**kwargs)`; not finished within `timeout_s`, the process writes
  'StartError: `message`' to stderr and exits with status 1, before JAX's own deadline
  (`JAX_DEADLINE_MARGIN_S` later) would abort it without a word (the call cannot be
  interrupted)."""
  def expire():
    sys.stderr.write(f'{__name__}.StartError: {message}\n')
    sys.stderr.flush()
    os._exit(1)  # pylint: disable=protected-access

  timer = threading.Timer(timeout_s, expire)
  timer.daemon = True
  timer.start()
  try:
    jax.distributed.initialize(
        initialization_timeout=math.ceil(timeout_s) + JAX_DEADLINE_MARGIN_S, **kwargs)
  finally:
    timer.cancel()


def is_writer() -> bool:
  """True on the process that writes output files (process 0)."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier called `name`."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def broadcast(value: Any) -> Any:
  """Process 0's `value` (a pytree of numpy arrays / scalars of equal shapes everywhere)."""
  if jax.process_count() == 1:
    return value
  return jax.tree.map(np.asarray, multihost_utils.broadcast_one_to_all(value))


def _json_bytes(value: Any) -> np.ndarray:
  """`value` as UTF-8 JSON, a `[num_bytes]` uint8 array (shipped padded by `_padded`)."""
  return np.frombuffer(json.dumps(value).encode('utf-8'), np.uint8)


def _padded(data: np.ndarray, size: int) -> np.ndarray:
  """`[num_bytes]` -> `[size]`, zero-padded: equal shapes on every process for a collective."""
  buffer = np.zeros(size, np.uint8)
  buffer[:data.size] = data
  return buffer


def _json_value(buffer: np.ndarray, size: int) -> Any:
  """The value `_json_bytes` packed into the first `size` bytes of `buffer`."""
  return json.loads(bytes(np.asarray(buffer, np.uint8)[:int(size)]).decode('utf-8'))


def broadcast_json(value: Any) -> Any:
  """Process 0's JSON-able `value` on every process (the others' `value` is ignored)."""
  if jax.process_count() == 1:
    return value
  data = _json_bytes(value) if is_writer() else np.zeros(0, np.uint8)
  size = int(broadcast(np.int64(data.size)))
  return _json_value(broadcast(_padded(data, size)), size)


def read_on_writer(fn: Callable[[], T], what: str) -> T:
  """`fn()` run on process 0 (e.g. reading a results file), its JSON-able result everywhere."""
  return broadcast_json(on_writer(fn, what))


def on_writer(fn: Callable[[], T], what: str) -> T | None:
  """Runs `fn` on process 0 only; every process raises if it failed there.

  Without this, an error on process 0 (say, a results folder of a different run) would leave
  the other processes waiting in their next collective. Returns `fn()` on process 0, else None.
  """
  if jax.process_count() == 1:
    return fn()
  result, error = None, None
  if is_writer():
    try:
      result = fn()
    except Exception as e:  # pylint: disable=broad-except  (re-raised below, on every process)
      error = e
  failed = bool(broadcast(np.int32(error is not None)))
  if error is not None:
    raise error
  if failed:
    raise RuntimeError(f'{what} failed on process 0; its log says why.')
  return result


def process_rows(sharding: NamedSharding, num_rows: int) -> np.ndarray:
  """Indices of the rows of a `[num_rows, ...]` global array that this process supplies.

  Rows are split over the mesh axis that `sharding` maps axis 0 to ('data'); a process whose
  devices span several data shards supplies all of them, in order. With data=1, or one process,
  every process supplies every row.
  """
  # Devices that share a data shard share its slice; distinct slices of one sharding do not
  # overlap, so the rows are the distinct (start, stop, step) ranges, in order.
  spans = sorted({index[0].indices(num_rows)
                  for index in sharding.addressable_devices_indices_map((num_rows,)).values()})
  return np.concatenate([np.arange(*span, dtype=np.int64) for span in spans])


def global_batch(local: np.ndarray, sharding: NamedSharding, num_rows: int) -> jax.Array:
  """The `[num_rows, ...]` global array whose rows `process_rows(sharding, num_rows)` are
  `local`."""
  shape = (num_rows, *local.shape[1:])
  if jax.process_count() == 1:
    return jax.device_put(local, sharding)
  return jax.make_array_from_process_local_data(sharding, local, shape)


def gather(x: Any) -> Any:
  """Numpy copies of (possibly sharded, multi-process) `jax.Array`s, whole, on every process."""
  if jax.process_count() == 1:
    return jax.device_get(x)
  return multihost_utils.process_allgather(x, tiled=True)


def data_groups(sharding: NamedSharding, num_rows: int) -> tuple[int, int]:
  """(number of distinct row sets, this process's) for a `[num_rows, ...]` global batch.

  Processes that supply the same rows (they share the data shards: 'data' does not span them)
  form one group and must feed identical rows; each group reads its own share of the examples.
  With one process: (1, 0).
  """
  mine = process_rows(sharding, num_rows)
  if jax.process_count() == 1:
    return 1, 0
  everyone = np.asarray(gather(mine[None])).reshape(jax.process_count(), -1)
  groups = sorted({tuple(int(r) for r in rows) for rows in everyone})
  return len(groups), groups.index(tuple(int(r) for r in mine))


def gather_json(values: list[Any]) -> list[Any]:
  """Every process's JSON-able list, concatenated in process order, on every process."""
  if jax.process_count() == 1:
    return list(values)
  data = _json_bytes(values)
  sizes = np.asarray(gather(np.array([data.size], np.int64)))
  everyone = np.asarray(gather(_padded(data, int(sizes.max()))[None])).reshape(len(sizes), -1)
  return [v for row, size in zip(everyone, sizes) for v in _json_value(row, size)]
