"""Attention alone: each t5align implementation beside HuggingFace's T5Attention; prints JSON.

Run from the repository root:
  python -m benchmarks.attention_bench --preset cpu-small   # CPU, 4 heads x 32, L 2k..16k
  python -m benchmarks.attention_bench --preset gpu         # 32 and 64 heads x 64, L 2k..32k

Every measurement runs in its own subprocess so that its peak memory is its own: on GPU the JAX
device's `peak_bytes_in_use` (torch: `max_memory_allocated`), on CPU the process's max RSS.
One layer, batch 1, encoder (bidirectional) attention with the T5 relative bias, row statistics
on. TFLOP/s counts the attention core only, 4 L^2 H D (q.k and p.v); HF's T5Attention time also
includes its q/k/v/o projections and its materialized `[1, H, L, L]` bias.

Before timing, each blockwise/Pallas worker checks itself against 'reference' on a padded batch
of 2 with two taus (`check_vs_reference`: output relative error, P_max / entropy errors), so a
kernel that compiles but computes the wrong thing shows in the same JSON. `--pallas-configs
128,64,4,2 ...` measures the GPU kernel at other blocks / warps / stages, one row each. 'pallas' is
the platform's fused kernel (dispatch.FUSED): on CPU the TPU kernel in interpret mode.
"""
from __future__ import annotations

import argparse
import functools
import json
import re
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

PRESETS = {
    'cpu-small': dict(lengths=[2048, 4096, 8192, 16384], heads=[4], depth=32, dtype='float32',
                      impls=['reference', 'blockwise', 'pallas'], repeats=2,
                      max_length={'reference': 4096, 'pallas': 2048, 'hf': 4096}),
    'gpu': dict(lengths=[2048, 4096, 8192, 16384, 32768], heads=[32, 64], depth=64,
                dtype='bfloat16', impls=['reference', 'blockwise', 'pallas'], repeats=5,
                max_length={'reference': 8192, 'hf': 8192}),
}


# ---------------------------------------------------------------- shared with encoder_bench.py


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


def torch_available() -> bool:
  try:
    import torch  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
    import transformers  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  except ImportError:
    return False
  return True


def torch_device_and_dtype(dtype: str):
  import torch  # pylint: disable=g-import-not-at-top
  device = 'cuda' if torch.cuda.is_available() else 'cpu'
  return device, getattr(torch, dtype)


def torch_block(device: str):
  import torch  # pylint: disable=g-import-not-at-top
  if device != 'cuda':
    return lambda x: x
  return lambda x: (torch.cuda.synchronize(), x)[1]


def run_worker(module: str, spec: dict, timeout: int) -> dict:
  """Runs `python -m module --worker spec` and returns its JSON line (or the error)."""
  cmd = [sys.executable, '-m', module, '--worker', json.dumps(spec)]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
  except subprocess.TimeoutExpired:
    return {**spec, 'error': f'timeout after {timeout} s'}
  lines = [l for l in proc.stdout.splitlines() if l.startswith('{')]
  if proc.returncode or not lines:
    # The exception's own line (jax prints a note on traceback filtering after it), else the last.
    err = proc.stderr.strip().splitlines() or ['?']
    named = [l for l in err if re.match(r'[\w.]*(Error|Exception)\b', l)]
    return {**spec, 'error': (named or err)[-1][:600]}
  return json.loads(lines[-1])


def add_ratios(rows: list[dict], keys: tuple[str, ...]) -> None:
  """Adds `hf_over_this` (HF seconds / this row's seconds) to rows sharing `keys` with an HF row."""
  hf = {tuple(r[k] for k in keys): r for r in rows if r['impl'] == 'hf' and 'seconds' in r}
  for row in rows:
    match = hf.get(tuple(row[k] for k in keys))
    if match and 'seconds' in row and row['impl'] != 'hf':
      row['hf_over_this'] = round(match['seconds'] / row['seconds'], 3)


# ---------------------------------------------------------------------------- attention alone


def attention_flops(length: int, heads: int, depth: int) -> float:
  return 4.0 * length * length * heads * depth


def kernel_options(spec: dict) -> dict:
  """`dispatch.self_attention` keywords from `spec['pallas']` (or {}): the positional fields of
  `spec['impl']`'s options class (`dispatch.IMPLEMENTATIONS[impl].options`), e.g. [bq, bk, warps,
  stages] for 'pallas_gpu', [block_q, block_k, steps, schedule_barrier] for 'pallas_mgpu'."""
  if not spec.get('pallas'):
    return {}
  from t5align.attention import dispatch  # pylint: disable=g-import-not-at-top
  impl = dispatch.resolve(spec['impl'], spec['length'], 0, input_dtype=spec['dtype'],
                          dtype=spec['dtype'], head_dim=spec.get('depth', 0))
  return {'options': dispatch.IMPLEMENTATIONS[impl].options(*spec['pallas'])}


def config_options(spec: dict) -> dict:
  """The same settings as `T5Config` fields (for the encoder benchmark)."""
  return {'attention_options': tuple(kernel_options(spec).values())}


def check_against_reference(impl: str, heads: int, depth: int, dtype,
                            options: dict | None = None, length: int = 1000) -> dict:
  """`impl` vs 'reference' on batch 2 of `length` tokens (1000: not a block multiple), row 1
  padded after 70% of them, taus 0.8/0.6.

  Both run in `dtype`; errors over real (non-pad) query rows: relative L2 error of the output,
  largest absolute P_max and entropy differences, and whether any value is not finite.
  `options`: `impl`'s kernel keywords (`kernel_options`).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from t5align.attention import dispatch  # pylint: disable=g-import-not-at-top
  from t5align.attention import reference  # pylint: disable=g-import-not-at-top
  keys = jax.random.split(jax.random.PRNGKey(42), 4)
  q, k, v = (jax.random.normal(key, (2, length, heads, depth), dtype) for key in keys[:3])
  table = 3.0 * jax.random.normal(keys[3], (heads, reference.NUM_BUCKETS), jnp.float32)
  ids = jnp.stack([jnp.ones(length, jnp.int32),
                   (jnp.arange(length) < int(length * 0.7)).astype(jnp.int32)])  # [2, l]
  taus = jnp.asarray([0.8, 0.6], jnp.float32)
  run = lambda name, **kw: jax.jit(functools.partial(
      dispatch.self_attention, impl=name, dtype=dtype, with_stats=True, **kw))(
          q, k, v, rel_embedding=table, segment_ids=ids, temperature=taus)
  (out, stats), (ref, ref_stats) = run(impl, **(options or {})), run('reference')
  real = np.asarray(ids > 0)  # [b, l]
  out, ref = (np.asarray(x, np.float64)[real] for x in (out, ref))  # [rows, h, d]
  pick = lambda x: np.asarray(x, np.float64).transpose(0, 2, 1)[real]  # [b, h, l] -> [rows, h]
  finite = all(np.isfinite(x).all() for x in (out, pick(stats.pmax), pick(stats.entropy)))
  return {
      'out_rel_err': float(np.linalg.norm(out - ref) / np.linalg.norm(ref)),
      'pmax_max_abs_err': float(np.abs(pick(stats.pmax) - pick(ref_stats.pmax)).max()),
      'entropy_max_abs_err': float(np.abs(pick(stats.entropy) - pick(ref_stats.entropy)).max()),
      'all_finite': bool(finite),
  }


def _jax_worker(spec: dict) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from t5align.attention import dispatch  # pylint: disable=g-import-not-at-top
  from t5align.attention import reference  # pylint: disable=g-import-not-at-top
  options = kernel_options(spec)
  length, heads, depth = spec['length'], spec['heads'], spec['depth']
  dtype = jnp.dtype(spec['dtype'])
  check = (None if spec['impl'] == 'reference'
           else check_against_reference(spec['impl'], heads, depth, dtype, options))
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  q, k, v = (jax.random.normal(key, (1, length, heads, depth), dtype) for key in keys[:3])
  table = jax.random.normal(keys[3], (heads, reference.NUM_BUCKETS), jnp.float32)
  ids = jnp.ones((1, length), jnp.int32)
  fn = jax.jit(functools.partial(dispatch.self_attention, impl=spec['impl'], dtype=dtype,
                                 with_stats=True, **options))
  result, _ = time_calls(
      lambda: fn(q, k, v, rel_embedding=table, segment_ids=ids, temperature=0.8),
      jax.block_until_ready, spec['repeats'])
  if check is not None:
    result['check_vs_reference'] = check
  return {**result, 'device': str(jax.devices()[0].device_kind)}


def _torch_worker(spec: dict) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import T5Config  # pylint: disable=g-import-not-at-top
  from transformers.models.t5.modeling_t5 import T5Attention  # pylint: disable=g-import-not-at-top
  length, heads, depth = spec['length'], spec['heads'], spec['depth']
  device, dtype = torch_device_and_dtype(spec['dtype'])
  config = T5Config(d_model=heads * depth, d_kv=depth, num_heads=heads, dropout_rate=0.0,
                    attn_implementation='eager')
  layer = T5Attention(config, has_relative_attention_bias=True).to(device, dtype).eval()
  hidden = torch.randn(1, length, heads * depth, device=device, dtype=dtype)
  with torch.no_grad():
    result, _ = time_calls(lambda: layer(hidden), torch_block(device), spec['repeats'])
  return {**result, 'device': torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}


def worker(spec: dict) -> dict:
  framework = 'torch' if spec['impl'] == 'hf' else 'jax'
  result = (_torch_worker if framework == 'torch' else _jax_worker)(spec)
  flops = attention_flops(spec['length'], spec['heads'], spec['depth'])
  result['tflops_per_s'] = round(flops / result['seconds'] / 1e12, 4)
  result['peak_bytes'] = peak_memory_bytes(framework)
  lxl = spec['length'] ** 2 * spec['heads'] * 4
  # An [h, L, L] float32 array; blockwise/pallas should stay far below it.
  result['peak_over_hLL_f32'] = round(result['peak_bytes'] / lxl, 4)
  return {**spec, **result}


def parse_common_flags(parser: argparse.ArgumentParser, argv, timeout: int) -> argparse.Namespace:
  """Adds the flags both benchmarks share (--impls, --repeats, --no-hf, --timeout) and parses."""
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


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--preset', choices=sorted(PRESETS), default='cpu-small')
  parser.add_argument('--lengths', type=int, nargs='+', help='override the preset lengths')
  parser.add_argument('--heads', type=int, nargs='+', help='override the preset head counts')
  parser.add_argument('--depth', type=int, help='head dim')
  args = parse_common_flags(parser, argv, timeout=1800)
  if args.worker:
    print(json.dumps(worker(json.loads(args.worker))))
    return
  preset = PRESETS[args.preset]
  impls = implementations(args, preset)
  rows = []
  for heads in args.heads or preset['heads']:
    for length in args.lengths or preset['lengths']:
      for impl in impls:
        if length > preset['max_length'].get(impl, length):
          continue
        for extra in variants(args, impl):
          spec = dict(impl=impl, length=length, heads=heads, depth=args.depth or preset['depth'],
                      dtype=preset['dtype'], repeats=repeats_for(args, preset, impl), **extra)
          rows.append(run_worker('benchmarks.attention_bench', spec, args.timeout))
          print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  add_ratios(rows, ('length', 'heads'))
  print(json.dumps({'benchmark': 'attention', 'preset': args.preset, 'rows': rows}, indent=1))


if __name__ == '__main__':
  main()
