"""One command for a lent GPU: test subset, attention, encoders, sweep, decoding, HF; one table.

Run from the repository root (t5align on PYTHONPATH, not installed; jax with CUDA, flax,
gin-config, and torch + transformers for the HF rows):
  python -m benchmarks.gpu_check                    # one H100 / H200: about 8 minutes at most
  python -m benchmarks.gpu_check --smoke            # tiny shapes on the CPU, under a minute
  python -m benchmarks.gpu_check --groups hf decode --output_dir gpu_check_rest   # a subset

Where jax's default backend is not a GPU, the command runs the smoke mode whether or not
`--smoke` is given; `--smoke` runs it on the CPU (JAX_PLATFORMS=cpu) even beside a GPU. Smoke
mode runs the same kinds of rows through the same code at tiny shapes in float32, each code path
at least once (the Pallas kernels in interpret mode; jax.nn.dot_product_attention's 'xla'
implementation beside the cuDNN rows, which say 'cudnn: no GPU'; compiling is most of its time,
so its JAX groups share one process, XLA's CPU backend runs without LLVM optimizations and a
persistent compilation cache in a temporary folder compiles a repeated program once), so that CI
catches rot; its parity checks agree to float32 rounding (~1e-6).

Everything goes to `--output_dir` (default gpu_check_output/): results.json (every planned row,
rewritten atomically after each update, so a run cut short keeps what it finished and names what
it did not), table.md (the table printed at the end), log.txt (the workers' stderr), pytest.txt
and pytest.xml (the test subset). The JSON is also printed, then the table. The exit status is 1
when a row failed or was stopped, a parity check failed or a test failed (JSON: `failures`), else
0; a row that ran out of device memory says 'oom' and is no failure.

Rows, most important first. Each group runs in its own subprocess, one after another (JAX workers
with XLA_PYTHON_CLIENT_PREALLOCATE=false), under its own time limit and the global `--budget_s`
(default 450 s): a group that would start after it is recorded as skipped with the reason; one
that runs into it is stopped, and its unfinished rows say so. Every row names what produced it
(implementation, shapes, dtype, tau, repeats, device, jax / torch versions). Times are the median
of `repeats` calls after a warm-up call, each program compiled ahead of time first (`compile_s`)
so that XLA's memory figures (`jax.jit(f).lower(...).compile().memory_analysis()`: temporaries,
arguments, outputs) come with it; `peak_bytes` is the device's `peak_bytes_in_use` on a GPU
(torch: `max_memory_allocated`, reset per row), the process's max RSS on the CPU: a running
maximum over the rows of a group (`peak_set_by_this_row` says whether this row raised it).
1. tests: pytest on tests/attention/pallas_mgpu_test.py, attention_test.py, network_impl_test.py,
   network_test.py (in that order, JAX_PLATFORMS=cuda, cut at 150 s, which on an H200 ends in
   network_impl_test; on a Hopper GPU the 'pallas_mgpu' kernel runs natively against
   'reference'; smoke: a `-k` selection on the CPU), before any other GPU work: passed / failed
   / skipped counts and the failures' names (junit XML).
2. attention: one layer, batch 1, Flan-T5-XL's 32 heads x 64, bf16, tau 0.8, T5's relative
   bias, row statistics on, at 4k / 16k / 32k tokens: 'reference' (4k), 'blockwise', 'pallas'
   (`dispatch.resolve`: 'pallas_mgpu' on Hopper), the platform's other fused kernels
   ('pallas_gpu', Triton), cuDNN flash attention without bias (the floor) and
   with T5's bias materialized `[1, h, L, L]` from the table in the timed call (4k, 16k). Parity
   on the same inputs against 'reference' where it runs, else 'blockwise': output relative L2
   error, largest P_max / entropy errors; the kernel also against 'reference' on a padded batch
   of 2 with two taus (`attention_bench.check_against_reference`). TFLOP/s = 4 L^2 H D / t.
3. encoder: Flan-T5-XL's encoder (random weights, bf16 weights and activations, batch 1) with
   'pallas' at 4k / 15k / 32k, 'pallas_gpu' at 4k / 15k and 'blockwise' at 4k. Parity:
   'pallas' against 'reference' with the same weights at 4k (`encoder_bench.check_model`:
   batch 2, row 1 padded), 'blockwise'
   against 'pallas' on the same tokens; longer rows carry the 4k check and their own finiteness.
4. sweep: the 11-tau calibration sweep (`stats.encoder_attention_stats`, the compiled program
   `CalibrationJob.programs` sizes) of the XL encoder, 'blockwise' at 4k, 'pallas' and
   'pallas_gpu' at 4k and 15k; parity: the 11 mean P_max / entropy values against 'blockwise'.
5. xxl: Flan-T5-XXL's encoder (emb 4096, 64 heads x 64, mlp 10240) at 32k with 'pallas'; parity:
   the kernel at XXL's heads against 'reference' (padded batch of 2), and a finite output.
6. decode: greedy decoding of 16 tokens (EOS off) after a 15k-token input by Flan-T5-XL
   (`decoding.greedy`: encoder with 'pallas', then the decoder over its cache, cross-attention
   keys/values projected once), end to end; parity: the tokens teacher-forced through the
   decoder without its cache are each their position's argmax, or within the model tolerance of
   it (relative to the argmax's distance from the mean logit: bf16 near-ties with random weights).
7. hf: HuggingFace's T5EncoderModel (the same XL shapes, bf16, its own random weights: only
   times compare with t5align's) with 'eager' and 'sdpa' at 4k and 15k (parity: sdpa against
   eager, same weights), and T5ForConditionalGeneration.generate(max_new_tokens=16,
   min_new_tokens=16, do_sample=False) after 15k tokens ('eager'), in a torch process (no JAX)
   started after the tests: it imports torch and transformers while the JAX groups run and
   touches the GPU only once every JAX worker has exited.
The table's ratio is the named reference row's seconds over this row's: the cuDNN floor for
attention rows, HF eager for the encoder rows, HF generate for decoding, t5align for HF rows, 11
forward passes for a sweep; its H200 column holds that row's figure measured on an H200 on
2026-11-27 (for orientation; benchmarks/results/gpu_h200.json, its `orientation` figures).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import tempfile
import time
from xml.etree import ElementTree

from benchmarks import gpu_plan
from benchmarks import gpu_report
from benchmarks import harness

REPO = harness.REPO
MIN_GROUP_S = 30  # No group starts with less of the budget left (a worker takes ~10 s to start).


def _child_env(jax_platforms: str | None, cache_dir: str | None = None) -> dict:
  """The workers' environment: the checkout first on PYTHONPATH, JAX without preallocation.

  `cache_dir` (smoke mode, where compiling is most of the time): XLA's CPU backend without its
  LLVM optimizations, and a persistent compilation cache there, so that a program compiled twice
  (the XXL stand-in is the smoke encoder again) is compiled once.
  """
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE='false')
  env['PYTHONPATH'] = os.pathsep.join(p for p in (str(REPO), env.get('PYTHONPATH')) if p)
  if jax_platforms:
    env['JAX_PLATFORMS'] = jax_platforms
  if cache_dir:
    env['XLA_FLAGS'] = (env.get('XLA_FLAGS', '') + ' --xla_backend_optimization_level=0').strip()
    env.update(JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')
  return env


def _probe(env: dict, log, timeout_s: float) -> dict:
  """jax's backend, device and versions, from a worker (so that this process holds no GPU)."""
  answer = {}
  why = harness.stream(_worker_command([{'group': 'env'}]), env, timeout_s, log, answer.update)
  if why or 'backend' not in answer:
    raise RuntimeError(f'the environment probe failed ({why or "no answer"}): see log.txt')
  return answer


def _worker_command(work: list[dict]) -> list[str]:
  """The command of a worker process running `work` (`gpu_rows.run`)."""
  return [sys.executable, '-m', 'benchmarks.gpu_rows', json.dumps(work)]


def _torch_missing() -> str | None:
  for name in ('torch', 'transformers'):
    if importlib.util.find_spec(name) is None:
      return f'{name} not installed'
  return None


def _git_commit() -> str | None:
  try:
    out = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=REPO, capture_output=True, text=True,
                         timeout=10, check=True).stdout.strip()
    dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=REPO,
                           capture_output=True, text=True, timeout=10, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return out + (' (with uncommitted changes)' if dirty else '')


def _junit_counts(path: pathlib.Path) -> dict:
  """passed / failed / errors / skipped and the failures' names from pytest's junit XML."""
  counts = dict(passed=0, failed=0, errors=0, skipped=0, failures=[])
  for case in ElementTree.parse(path).getroot().iter('testcase'):
    name = f'{case.get("classname", "")}::{case.get("name", "")}'
    tags = {child.tag for child in case}
    if 'failure' in tags:
      counts['failed'] += 1
      counts['failures'].append(name)
    elif 'error' in tags:
      counts['errors'] += 1
      counts['failures'].append(f'{name} (error)')
    elif 'skipped' in tags:
      counts['skipped'] += 1
    else:
      counts['passed'] += 1
  return counts


def run_tests(spec: dict, out_dir: pathlib.Path, env: dict, timeout_s: float) -> dict:
  """The test subset in its own process (pytest.txt, pytest.xml): the 'tests' row's fields.

  At the time limit pytest gets SIGINT, which makes it stop after the running test and still
  write its summary and XML (then SIGKILL, 20 s later, if it has not ended).
  """
  xml = out_dir / 'pytest.xml'
  cmd = [sys.executable, '-m', 'pytest', *spec['files'], '-p', 'no:cacheprovider', '-rfE',
         f'--junitxml={xml}']
  if spec['select']:
    cmd += ['-k', spec['select']]
  start = time.monotonic()
  interrupted = False
  with open(out_dir / 'pytest.txt', 'w') as out:
    out.write(f'$ {" ".join(cmd)}\n')
    out.flush()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
      proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      interrupted = True
      os.killpg(proc.pid, signal.SIGINT)
      try:
        proc.wait(timeout=20)
      except subprocess.TimeoutExpired:
        harness.kill(proc)
    except BaseException:
      harness.kill(proc)
      raise
  fields = dict(command=' '.join(cmd[1:]), seconds=round(time.monotonic() - start, 1),
                exit_status=proc.returncode, jax_platforms=env.get('JAX_PLATFORMS'))
  if not xml.exists():
    return dict(fields, status='error', reason=f'pytest wrote no {xml.name} (exit status '
                f'{proc.returncode}{", stopped at the time limit" if interrupted else ""}): '
                'see pytest.txt')
  fields.update(_junit_counts(xml), status='ok')
  if interrupted:
    fields['reason'] = (f'interrupted at its time limit of {timeout_s:.0f} s: the tests after '
                        'the last one counted did not run')
  return fields


def _start_batch(groups: tuple[str, ...], plan: dict, results: gpu_report.Results, env: dict,
                 waits: bool = False) -> harness.Worker:
  """A worker for the groups' pending rows (`waits`: it imports, then waits for `go`)."""
  work = [{'group': g, 'plan': plan[g], 'wait': waits,
           'rows': [r for r in results.rows.values()
                    if r['group'] == g and r['status'] == 'pending']} for g in groups]
  return harness.Worker(_worker_command(work), env, results.log, waits)


def _run_batch(groups: tuple[str, ...], plan: dict, results: gpu_report.Results, env: dict,
               timeout_s: float, log_path: pathlib.Path,
               worker: harness.Worker | None = None) -> None:
  """Runs the groups' pending rows in a worker (`worker`: one started waiting, told to go now);
  marks the rows it did not finish, and why."""
  rows = [r for r in results.rows.values() if r['group'] in groups and r['status'] == 'pending']
  offset = log_path.stat().st_size
  if worker is None:
    worker = _start_batch(groups, plan, results, env)
  else:
    worker.go()
  why = worker.follow(timeout_s, results.update)
  tail = harness.tail(log_path, offset) if why else ''
  reason = f'{why}; its stderr ends: {tail}' if tail else why or 'the worker ended without it'
  for row in rows:
    if row['status'] == 'pending':
      row.update(status='timeout' if why.startswith('stopped') else 'error', reason=reason)
      results.note(f'{row["id"]}: {gpu_report.status_text(row)}')
    elif row['status'] == 'ok' and 'parity' not in row:
      row['parity'] = {'error': f'not finished: {reason}'}
  results.save()


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--smoke', action='store_true',
                      help='tiny shapes on the CPU (also what runs where jax has no GPU)')
  parser.add_argument('--output_dir', default='gpu_check_output',
                      help='folder for results.json, table.md, log.txt, pytest.txt, pytest.xml')
  parser.add_argument('--budget_s', type=float, default=450,
                      help='no group starts after this many seconds; a running one is stopped')
  parser.add_argument('--groups', nargs='+', choices=gpu_plan.GROUPS,
                      default=list(gpu_plan.GROUPS),
                      help='the groups to run (the others are recorded as skipped)')
  args = parser.parse_args(argv)
  start = time.monotonic()
  out_dir = pathlib.Path(args.output_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  for name in ('results.json', 'table.md', 'log.txt', 'pytest.txt', 'pytest.xml'):
    (out_dir / name).unlink(missing_ok=True)  # Nothing of an earlier run is read as this one's.
  log_path = out_dir / 'log.txt'
  with open(log_path, 'a') as log, tempfile.TemporaryDirectory(prefix='gpu_check_') as cache:
    env = _child_env('cpu', cache) if args.smoke else _child_env(None)
    try:
      probe = _probe(env, log, timeout_s=180)
    except RuntimeError as e:
      harness.write_json(out_dir / 'results.json',
                         {'benchmark': 'gpu_check', 'failures': [str(e)], 'rows': []})
      print(f'gpu_check: {e}', file=sys.stderr)
      return 1
    smoke = args.smoke or probe['backend'] != 'gpu'
    if smoke and not args.smoke:
      env = _child_env('cpu', cache)
    plan = gpu_plan.SMOKE_PLAN if smoke else gpu_plan.GPU_PLAN
    rows = gpu_plan.plan_rows(plan, probe, _torch_missing(), tuple(args.groups))
    meta = dict(benchmark='gpu_check', mode='smoke' if smoke else 'gpu',
                started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
                command=['python', '-m', 'benchmarks.gpu_check', *(argv or sys.argv[1:])],
                budget_s=args.budget_s, commit=_git_commit(), python=platform.python_version(),
                environment=probe)
    results = gpu_report.Results(out_dir, meta, rows, log, start)
    results.note(f'{meta["mode"]} mode (jax found {probe["device"]}, backend '
                 f'{probe["backend"]}); {len(rows)} rows planned; writing to {out_dir}')
    if smoke and not args.smoke:
      results.note('NOTE: jax sees no GPU, so this is the smoke run on the CPU; on a GPU machine '
                   "that means jax's CUDA plugin did not load (the probe's stderr is in log.txt)")
    results.save()
    early = None  # The HF worker, started once the tests are done: it imports torch meanwhile.
    try:
      for batch in gpu_plan.batches(gpu_plan.SMOKE_BATCHES if smoke else ()):
        pending = [r for r in rows if r['group'] in batch and r['status'] == 'pending']
        left = args.budget_s - (time.monotonic() - start)
        if batch != ('tests',) and early is None and left >= MIN_GROUP_S and any(
            r['group'] == 'hf' and r['status'] == 'pending' for r in rows):
          early = _start_batch(('hf',), plan, results, env, waits=True)
        if not pending:
          continue
        if left < MIN_GROUP_S:
          for row in pending:
            row.update(status='skipped', reason=f'the budget (--budget_s {args.budget_s:g}) '
                       f'was spent ({time.monotonic() - start:.0f} s) before this group started')
          results.note(f'{"+".join(batch)}: skipped, budget spent')
          results.save()
          continue
        timeout_s = min(sum(plan[g]['timeout_s'] for g in batch), left)
        results.note(f'{"+".join(batch)}: starting (time limit {timeout_s:.0f} s)')
        if batch == ('tests',):
          tests_env = dict(env, JAX_PLATFORMS='cpu' if smoke else 'cuda')
          results.update({'id': 'tests', **run_tests(plan['tests'], out_dir, tests_env,
                                                     timeout_s)})
        else:
          _run_batch(batch, plan, results, env, timeout_s, log_path,
                     early if batch == ('hf',) else None)
    finally:
      if early is not None:
        early.kill()  # Ended already, unless the HF rows were skipped.
    document = results.document()
    results.save()
    print(json.dumps(document, indent=1))
    print(gpu_report.table(document['rows']))
    results.note(f'done in {document["elapsed_s"]} s: {len(document["failures"])} failures'
                 + ''.join(f'\n  {line}' for line in document['failures']))
  return 1 if document['failures'] else 0


if __name__ == '__main__':
  sys.exit(main())
