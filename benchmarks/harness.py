"""What the benchmarks share: worker subprocesses with time limits, timing, results and ratios.

A measurement runs in a worker subprocess (`python -m MODULE ...`, in its own session so that a
time limit ends whatever it started) whose stdout carries its results as `MARK` lines of JSON
(`emit`); everything else it prints goes to a log. `Worker` follows one as it runs (gpu_check's
groups: several rows per process, each update as it comes); `run_worker` runs one to its single
answer (attention_bench, encoder_bench: one row per process, so that its peak memory is its own).
In a worker, `run_row` measures a row and then checks it, an exception being the row's error.

A row of results is a dict: gpu_check's carry `id`, `status` ('pending', 'ok', 'error', 'oom',
'timeout' or 'skipped', with its `reason`), the measured fields (`seconds`, `first_call_s`, ...),
`parity` (its check) and `compare_to` (`{id, label, factor}`: its ratio's base); the one-row
benchmarks' carry their spec's fields, the measured ones, and `error` or `skipped` instead.
Results: `write_json` / `write_text` replace a results file atomically
(`t5align.runtime.fileio.write_atomic`); `add_ratios` sets a row's ratio of seconds against its
base row, which `hf_base` (the HuggingFace row with the same settings) or `named_base` (the row
whose id the row's `compare_to` names) picks. Timing: `time_calls` (compile / warm-up call, median
of the timed calls), `matmul_peak` (the machine's XLA matmul peak), `peak_memory_bytes`. The
command-line flags attention_bench and encoder_bench share: `parse_common_flags`, `variants`,
`repeats_for`, `implementations`.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import queue
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable

from t5align.runtime import fileio

REPO = pathlib.Path(__file__).resolve().parents[1]
MARK = 'BENCH_ROW '  # Prefix of a worker's stdout line carrying one result (JSON).

# A row's base: `(base row or None, factor)`, or None for a row without one (`add_ratios`).
BaseOf = Callable[[dict], 'tuple[dict | None, float] | None']


# ------------------------------------------------------------------------------------ workers


def emit(row_id: str | None = None, **fields) -> None:
  """Sends one result from a worker: `fields` (with `id` unless None) as a `MARK` line."""
  print(MARK + json.dumps(fields if row_id is None else {'id': row_id, **fields}), flush=True)


def kill(proc: subprocess.Popen) -> None:
  """Ends `proc` and whatever it started (its own session's process group)."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  proc.wait()


def tail(path: pathlib.Path, offset: int, lines: int = 3) -> str:
  """The last non-empty `lines` lines `path` got after `offset` (a worker's stderr)."""
  with open(path, 'rb') as f:
    f.seek(offset)
    text = f.read().decode('utf-8', 'replace')
  kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
  return ' / '.join(kept)[-600:]


def error_line(stderr: str) -> str:
  """A failed worker's error: the exception's own line (jax prints a note on traceback filtering
  after it), else the last line of `stderr`."""
  lines = stderr.strip().splitlines() or ['?']
  named = [line for line in lines if re.match(r'[\w.]*(Error|Exception)\b', line)]
  return (named or lines)[-1][:600]


class Worker:
  """A subprocess whose stdout lines are read as they come (stderr goes to `log`).

  `waits`: it gets a pipe on stdin, and a worker told to wait reads one line from it before its
  rows (`go`): started early, it imports its libraries while other workers run. `env` None: this
  process's environment.
  """

  def __init__(self, cmd: list[str], env: dict | None, log, waits: bool = False):
    self.log = log
    log.flush()
    self.proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdin=subprocess.PIPE if waits else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    self.lines: queue.Queue = queue.Queue()
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self) -> None:
    for line in self.proc.stdout:
      self.lines.put(line)
    self.lines.put(None)

  def go(self) -> None:
    """Lets a waiting worker start its rows (if it died meanwhile, `follow` says how)."""
    try:
      self.proc.stdin.write('go\n')
      self.proc.stdin.close()
    except OSError:
      pass

  def kill(self) -> None:
    kill(self.proc)

  def follow(self, timeout_s: float, on_update: Callable[[dict], None]) -> str:
    """Passes each `MARK` line's JSON to `on_update` until the worker ends or `timeout_s` pass.

    Returns:
      '' when it exited with status 0, else why not (its time limit, or its exit status).
    """
    deadline = time.monotonic() + timeout_s
    try:
      while True:
        try:
          line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
          self.kill()
          return f'stopped at its time limit of {timeout_s:.0f} s'
        if line is None:
          break
        if line.startswith(MARK):
          on_update(json.loads(line[len(MARK):]))
        elif line.strip():
          self.log.write(f'stdout: {line}')
          self.log.flush()
    except BaseException:  # Ctrl-C included: no worker outlives this process.
      self.kill()
      raise
    status = self.proc.wait()
    return f'worker exited with status {status}' if status else ''


def stream(cmd: list[str], env: dict | None, timeout_s: float, log,
           on_update: Callable[[dict], None]) -> str:
  """Runs `cmd` as a `Worker` and follows it (`Worker.follow`)."""
  return Worker(cmd, env, log).follow(timeout_s, on_update)


def run_worker(module: str, spec: dict, timeout: int) -> dict:
  """Runs `python -m module --worker SPEC` to its one answer (`emit`); on failure `spec` with
  `error`: the time limit, or the worker's exception line."""
  answers = []
  with tempfile.TemporaryFile('w+', encoding='utf-8') as log:
    why = stream([sys.executable, '-m', module, '--worker', json.dumps(spec)], None, timeout,
                 log, answers.append)
    if why.startswith('stopped'):
      return {**spec, 'error': f'timeout after {timeout} s'}
    if why or not answers:
      log.seek(0)
      return {**spec, 'error': error_line(log.read())}
  return answers[-1]


def answer_worker(spec: str | None, worker: Callable[[dict], dict]) -> bool:
  """In a `run_worker` process (`spec`: its --worker JSON), emits `worker(spec)`'s answer and
  returns True; elsewhere (`spec` None) returns False."""
  if spec is None:
    return False
  emit(**worker(json.loads(spec)))
  return True


def reason(error: BaseException) -> str:
  """An exception as one line of at most 600 characters."""
  return ' '.join(f'{type(error).__name__}: {error}'.split())[:600]


def run_row(row: dict, measure: Callable[[], dict],
            parity: Callable[[], dict] | None = None) -> bool:
  """One row in a worker: `measure()`'s fields are emitted with status 'ok', then `parity()`'s
  check as `parity`. An exception is the row's error (its traceback goes to stderr; out of
  memory is status 'oom', a finding about the device rather than a bug) and the next row still
  runs. Returns whether `measure` succeeded."""
  try:
    fields = measure()
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    why = reason(e)
    oom = 'out of memory' in why.lower() or 'RESOURCE_EXHAUSTED' in why
    emit(row['id'], status='oom' if oom else 'error', reason=why)
    return False
  emit(row['id'], status='ok', **fields)
  if parity is not None:
    try:
      emit(row['id'], parity=parity())
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      emit(row['id'], parity={'error': reason(e)})
  return True


# ------------------------------------------------------------------------------ timing, memory


def time_calls(fn: Callable[[], Any], block: Callable[[Any], Any], repeats: int,
               peak: Callable[[], float] | None = None) -> tuple[dict, Any]:
  """Compile/warm-up time of the first call, median wall time of `repeats` more, last output.

  `peak` (`matmul_peak`): timed once before every timed call (after the first call when
  `repeats` is 0), interleaved with them in this process, so that the row and the machine's peak
  see the same load; the median is returned as `peak_tflops_per_s`.
  """
  start = time.perf_counter()
  out = block(fn())
  first = time.perf_counter() - start
  times, peaks = [], []
  for _ in range(repeats):
    if peak is not None:
      peaks.append(peak())
    start = time.perf_counter()
    out = block(fn())
    times.append(time.perf_counter() - start)
  # NOTE: repeats=0 reports the first call (for minute-long reference runs).
  seconds = statistics.median(times) if times else first
  result = {'first_call_s': round(first, 4), 'seconds': round(seconds, 5)}
  if peak is not None:
    result['peak_tflops_per_s'] = round(statistics.median(peaks or [peak()]), 4)
  return result, out


def matmul_peak(dtype: str, size: int) -> Callable[[], float]:
  """The machine's own peak as XLA reaches it: a callable timing one `[size, size]` x
  `[size, size]` matmul in `dtype` (jit-compiled, compiled and warmed up here) and returning its
  TFLOP/s (2 size^3 FLOPs).

  Each call draws its inputs on the device (untimed) and drops them after, so that the peak
  memory a row reports is not raised by matrices held between its calls.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  draw = jax.jit(lambda key: tuple(jax.random.normal(k, (size, size), jnp.dtype(dtype))
                                   for k in jax.random.split(key)))
  product = jax.jit(jnp.matmul)
  jax.block_until_ready(product(*draw(jax.random.PRNGKey(0))))

  def measure() -> float:
    a, b = jax.block_until_ready(draw(jax.random.PRNGKey(1)))
    start = time.perf_counter()
    out = jax.block_until_ready(product(a, b))
    seconds = time.perf_counter() - start
    del a, b, out
    return 2.0 * size ** 3 / seconds / 1e12

  return measure


def peak_memory_bytes(framework: str) -> int:
  """Peak memory of this process: accelerator bytes on GPU, else max RSS."""
  if framework == 'jax':
    import jax  # pylint: disable=g-import-not-at-top
    device = jax.devices()[0]
    if device.platform != 'cpu':
      return int((device.memory_stats() or {}).get('peak_bytes_in_use', -1))
  elif framework == 'torch':
    import torch  # pylint: disable=g-import-not-at-top
    if torch.cuda.is_available():
      return int(torch.cuda.max_memory_allocated())
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB.


def versions(*names: str) -> dict:
  """The installed versions of the distributions `names` (those not installed are left out)."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  out = {}
  for name in names:
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  return out


def torch_available() -> bool:
  try:
    import torch  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
    import transformers  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  except ImportError:
    return False
  return True


def torch_device_and_dtype(dtype: str):
  """('cuda' where torch sees a GPU, else 'cpu'; torch's dtype named `dtype`)."""
  import torch  # pylint: disable=g-import-not-at-top
  device = 'cuda' if torch.cuda.is_available() else 'cpu'
  return device, getattr(torch, dtype)


def torch_block(device: str) -> Callable[[Any], Any]:
  """`time_calls`' `block` for torch on `device`: waits for the GPU's queued work."""
  import torch  # pylint: disable=g-import-not-at-top
  if device != 'cuda':
    return lambda x: x
  return lambda x: (torch.cuda.synchronize(), x)[1]


# ---------------------------------------------------------------------------- results, ratios


def write_text(path: pathlib.Path, text: str) -> None:
  """Replaces `path` with `text` atomically (readers see the old file or the whole new one)."""
  fileio.write_atomic(path, text)


def write_json(path: pathlib.Path, document: dict) -> None:
  """`document` as indented JSON, replacing `path` atomically."""
  write_text(path, json.dumps(document, indent=1) + '\n')


def add_ratios(rows: list[dict], base_of: BaseOf, field: str = 'ratio') -> None:
  """Sets each row's `field` to factor x its base's seconds / its own, where `base_of(row)`
  names a base and both timed; removes it from the others."""
  for row in rows:
    base, factor = base_of(row) or (None, 1)
    if base is not None and row.get('seconds') and base.get('seconds'):
      row[field] = round(factor * base['seconds'] / row['seconds'], 3)
    else:
      row.pop(field, None)


def hf_base(rows: list[dict], keys: tuple[str, ...]) -> BaseOf:
  """A row's base for `add_ratios`: the HuggingFace row (`impl` 'hf') with the same `keys`."""
  hf = {tuple(r[k] for k in keys): r for r in rows if r['impl'] == 'hf' and 'seconds' in r}
  return lambda row: (None if row['impl'] == 'hf' else (hf.get(tuple(row[k] for k in keys)), 1))


def named_base(rows: list[dict]) -> BaseOf:
  """A row's base for `add_ratios`: the row with status 'ok' whose id its `compare_to`
  (`{id, label, factor}`) names, times its factor."""
  by_id = {row['id']: row for row in rows}

  def base_of(row: dict):
    compare = row.get('compare_to')
    base = by_id.get(compare['id']) if compare else None
    return (base, compare['factor']) if base and base.get('status') == 'ok' else None
  return base_of


# --------------------------------------------------------------- attention_bench, encoder_bench


def parse_common_flags(parser: argparse.ArgumentParser, argv, timeout: int) -> argparse.Namespace:
  """Adds the flags attention_bench and encoder_bench share (--impls, --repeats, --no-hf,
  --timeout, --pallas-configs) and parses."""
  parser.add_argument('--impls', nargs='+', help='subset of reference/blockwise/pallas/hf')
  parser.add_argument('--repeats', type=int, help='timed calls after the first (0: time the first)')
  parser.add_argument('--hf-repeats', type=int, help='--repeats for the HuggingFace rows')
  parser.add_argument('--no-hf', action='store_true', help='skip the HuggingFace torch rows')
  parser.add_argument('--timeout', type=int, default=timeout, help='seconds per measurement')
  parser.add_argument('--pallas-configs', nargs='+', default=[''], metavar='F1,F2,...',
                      help="fused kernel settings to measure (one row each), its options class's "
                      "fields in order; '' = defaults")
  parser.add_argument('--worker', help=argparse.SUPPRESS)
  return parser.parse_args(argv)


def variants(args: argparse.Namespace, impl: str) -> list[dict]:
  """Extra spec keys per measured variant of `impl` (one per --pallas-configs entry for a fused
  kernel: 'pallas', 'pallas_gpu', 'pallas_mgpu', 'pallas_tpu')."""
  if not impl.startswith('pallas'):
    return [{}]
  return [{'pallas': [int(x) for x in c.split(',')]} if c else {} for c in args.pallas_configs]


def repeats_for(args: argparse.Namespace, preset: dict, impl: str) -> int:
  """Timed calls of a row: --repeats or the preset's; HF rows: --hf-repeats or 'hf_repeats'."""
  if impl == 'hf':
    for value in (args.hf_repeats, preset.get('hf_repeats')):
      if value is not None:
        return value
  return args.repeats if args.repeats is not None else preset['repeats']


def implementations(args: argparse.Namespace, preset: dict) -> list[str]:
  """The preset's (or --impls') implementations, plus HuggingFace when torch is importable."""
  impls = list(args.impls or preset['impls'])
  if not args.no_hf and 'hf' not in impls and torch_available():
    impls.append('hf')
  return impls
