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
import json
import sys
from typing import Callable

from benchmarks import harness

PRESETS = {
    'cpu-small': dict(lengths=[2048, 4096, 8192, 16384], heads=[4], depth=32, dtype='float32',
                      impls=['reference', 'blockwise', 'pallas'], repeats=2,
                      max_length={'reference': 4096, 'pallas': 2048, 'hf': 4096}),
    'gpu': dict(lengths=[2048, 4096, 8192, 16384, 32768], heads=[32, 64], depth=64,
                dtype='bfloat16', impls=['reference', 'blockwise', 'pallas'], repeats=5,
                max_length={'reference': 8192, 'hf': 8192}),
}


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


def attention_call(impl: str, dtype, temperature, options: dict | None = None) -> Callable:
  """`(q, k, v, table, ids) -> (out, RowStats)`: `dispatch.self_attention` by `impl` in `dtype`
  with row statistics, at `temperature`; `options`: `impl`'s kernel keywords (`kernel_options`).
  q, k, v `[b, l, h, d]`, table `[h, num_buckets]`, ids `[b, l]`."""
  from t5align.attention import dispatch  # pylint: disable=g-import-not-at-top
  return lambda q, k, v, table, ids: dispatch.self_attention(
      q, k, v, rel_embedding=table, segment_ids=ids, temperature=temperature, impl=impl,
      dtype=dtype, with_stats=True, **(options or {}))


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
  from t5align.attention import reference  # pylint: disable=g-import-not-at-top
  keys = jax.random.split(jax.random.PRNGKey(42), 4)
  q, k, v = (jax.random.normal(key, (2, length, heads, depth), dtype) for key in keys[:3])
  table = 3.0 * jax.random.normal(keys[3], (heads, reference.NUM_BUCKETS), jnp.float32)
  ids = jnp.stack([jnp.ones(length, jnp.int32),
                   (jnp.arange(length) < int(length * 0.7)).astype(jnp.int32)])  # [2, l]
  taus = jnp.asarray([0.8, 0.6], jnp.float32)
  run = lambda name, options=None: jax.jit(attention_call(name, dtype, taus, options))(
      q, k, v, table, ids)
  (out, stats), (ref, ref_stats) = run(impl, options), run('reference')
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
  fn = jax.jit(attention_call(spec['impl'], dtype, 0.8, options))
  result, _ = harness.time_calls(lambda: fn(q, k, v, table, ids), jax.block_until_ready,
                                 spec['repeats'])
  if check is not None:
    result['check_vs_reference'] = check
  return {**result, 'device': str(jax.devices()[0].device_kind)}


def _torch_worker(spec: dict) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import T5Config  # pylint: disable=g-import-not-at-top
  from transformers.models.t5.modeling_t5 import T5Attention  # pylint: disable=g-import-not-at-top
  length, heads, depth = spec['length'], spec['heads'], spec['depth']
  device, dtype = harness.torch_device_and_dtype(spec['dtype'])
  config = T5Config(d_model=heads * depth, d_kv=depth, num_heads=heads, dropout_rate=0.0,
                    attn_implementation='eager')
  layer = T5Attention(config, has_relative_attention_bias=True).to(device, dtype).eval()
  hidden = torch.randn(1, length, heads * depth, device=device, dtype=dtype)
  with torch.no_grad():
    result, _ = harness.time_calls(lambda: layer(hidden), harness.torch_block(device),
                                   spec['repeats'])
  return {**result, 'device': torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}


def worker(spec: dict) -> dict:
  framework = 'torch' if spec['impl'] == 'hf' else 'jax'
  result = (_torch_worker if framework == 'torch' else _jax_worker)(spec)
  flops = attention_flops(spec['length'], spec['heads'], spec['depth'])
  result['tflops_per_s'] = round(flops / result['seconds'] / 1e12, 4)
  result['peak_bytes'] = harness.peak_memory_bytes(framework)
  lxl = spec['length'] ** 2 * spec['heads'] * 4
  # An [h, L, L] float32 array; blockwise/pallas should stay far below it.
  result['peak_over_hLL_f32'] = round(result['peak_bytes'] / lxl, 4)
  return {**spec, **result}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--preset', choices=sorted(PRESETS), default='cpu-small')
  parser.add_argument('--lengths', type=int, nargs='+', help='override the preset lengths')
  parser.add_argument('--heads', type=int, nargs='+', help='override the preset head counts')
  parser.add_argument('--depth', type=int, help='head dim')
  args = harness.parse_common_flags(parser, argv, timeout=1800)
  if harness.answer_worker(args.worker, worker):
    return
  preset = PRESETS[args.preset]
  impls = harness.implementations(args, preset)
  rows = []
  for heads in args.heads or preset['heads']:
    for length in args.lengths or preset['lengths']:
      for impl in impls:
        if length > preset['max_length'].get(impl, length):
          continue
        for extra in harness.variants(args, impl):
          spec = dict(impl=impl, length=length, heads=heads, depth=args.depth or preset['depth'],
                      dtype=preset['dtype'], repeats=harness.repeats_for(args, preset, impl),
                      **extra)
          rows.append(harness.run_worker('benchmarks.attention_bench', spec, args.timeout))
          print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  harness.add_ratios(rows, harness.hf_base(rows, ('length', 'heads')), 'hf_over_this')
  print(json.dumps({'benchmark': 'attention', 'preset': args.preset, 'rows': rows}, indent=1))


if __name__ == '__main__':
  main()
