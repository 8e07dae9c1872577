"""Deviceless TPU compiles of encoder self-attention: the Mosaic kernel beside 'blockwise'; JSON.

No TPU is needed: with libtpu installed (`pip install "jax[tpu]"`), XLA's TPU compiler (and
Mosaic, for the Pallas kernel) compiles for the devices of a topology description. Run from the
repository root:
  JAX_PLATFORMS=cpu python -m benchmarks.tpu_kernel_bench              # attention alone
  JAX_PLATFORMS=cpu python -m benchmarks.tpu_kernel_bench --encoder    # + Flan-T5-XXL encoder
  JAX_PLATFORMS=cpu python -m benchmarks.tpu_kernel_bench --llo        # + the kernel's schedule

Rows, each compiled in its own process:
- 'attention': one chip of `--topology`, Flan-T5-XXL's per-chip share with 64 heads over 8 chips
  (8 heads x 64, batch 1, bfloat16, row statistics on), 'pallas_tpu' and 'blockwise' (its
  default 512 x 512 blocks on TPU): compile seconds, XLA's memory analysis and cost analysis, and
  the kernel's scoped VMEM as Mosaic allocated it. NOTE: XLA's cost analysis counts a while
  loop's body once, so blockwise's figures leave out all but one of its query blocks and key
  blocks (`loops` gives their counts); the kernel's figures are its own `pl.CostEstimate` (Mosaic
  reports none: without it XLA counts the custom call's operands and results once and no FLOPs).
- 'encoder' (`--encoder`): Flan-T5-XXL's encoder (gin/models/flan_t5/xxl.gin, parameters in
  `--params-dtype`) at `--encoder-length` tokens, batch 2, on `--encoder-topology` as data 2 x
  model 8: compile seconds and per-chip memory against `--hbm-gib`.
- 'llo' (`--llo`): libtpu's static LLO schedule of the kernel for one chip (1024 tokens, 512 x
  512 tiles unless `--blocks`): the bundles of each tile branch (bias: band or beyond it; mask:
  none, or ids / causal), from libtpu's dump files. A schedule length, not a timing: stalls and
  DMA waits are not in it.
Real TPU speed is not measured by any row.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import tempfile
import time

from benchmarks import harness

GiB = 2**30
# XXL's per-chip share of the attention with 64 heads over 8 chips ('model' 8).
HEADS, DEPTH = 8, 64
KERNEL = 't5_relpos_attention_tpu'  # pallas_tpu's pallas_call name.


def _topology_devices(topology: str):
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  return topologies.get_topology_desc(topology_name=topology, platform='tpu').devices


def _compiled_facts(compiled) -> dict:
  """Memory, cost and custom calls of a compiled program (per chip)."""
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  text = compiled.as_text()
  vmem = [int(m) for line in text.splitlines() if 'tpu_custom_call' in line
          for m in re.findall(r'"used_scoped_memory_configs":\[\{[^]]*"size":"(\d+)"', line)]
  return {
      'memory_bytes': {'arguments': memory.argument_size_in_bytes,
                       'outputs': memory.output_size_in_bytes,
                       'temporaries': memory.temp_size_in_bytes,
                       'aliased': memory.alias_size_in_bytes,
                       'code': memory.generated_code_size_in_bytes},
      'xla_cost': {k: cost.get(k) for k in ('flops', 'bytes accessed', 'transcendentals')},
      'tpu_custom_calls': len(re.findall(r'custom_call_target="tpu_custom_call"', text)),
      'kernel_scoped_vmem_bytes': max(vmem) if vmem else None,
  }


def _attention_worker(spec: dict) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from t5align.attention import blockwise  # pylint: disable=g-import-not-at-top
  from t5align.attention import dispatch  # pylint: disable=g-import-not-at-top
  from t5align.attention import pallas_tpu  # pylint: disable=g-import-not-at-top
  from t5align.runtime import batching  # pylint: disable=g-import-not-at-top
  device = _topology_devices(spec['topology'])[0]
  mesh = Mesh(np.asarray([device]), ('data',))
  one = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P()))
  length, blocks = spec['length'], spec.get('blocks')
  options = None
  if blocks:
    options = dispatch.IMPLEMENTATIONS[spec['impl']].options(block_q=blocks[0], block_k=blocks[1])
  fn = jax.jit(lambda q, k, v, table, ids, tau: dispatch.self_attention(
      q, k, v, rel_embedding=table, segment_ids=ids, temperature=tau, impl=spec['impl'],
      options=options, dtype=jnp.bfloat16, with_stats=True, bidirectional=spec['bidirectional']))
  qkv = one((1, length, HEADS, DEPTH), jnp.bfloat16)
  start = time.perf_counter()
  with jax.set_mesh(mesh):
    compiled = fn.lower(qkv, qkv, qkv, one((HEADS, 32), jnp.float32), one((1, length), jnp.int32),
                        one((1, HEADS), jnp.float32)).compile()
  row = {'compile_s': round(time.perf_counter() - start, 1), 'device': device.device_kind,
         **_compiled_facts(compiled)}
  if spec['impl'] == 'blockwise':
    bq, bk = blocks or blockwise.default_blocks('tpu')
    row['loops'] = {'query_blocks': batching.ceil_div(length, bq),
                    'key_blocks': batching.ceil_div(length, bk)}
  else:
    row['blocks'] = list(blocks or pallas_tpu.default_blocks(device.device_kind))
  return row


def _encoder_worker(spec: dict) -> dict:
  import gin  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from t5align import network, partitioning  # pylint: disable=g-import-not-at-top
  gin.parse_config_files_and_bindings(
      [spec['gin_file']], [f"ATTENTION_IMPL = '{spec['impl']}'"], finalize_config=False)
  config = gin.get_configurable(network.Transformer)().config
  mesh = partitioning.eval_mesh(num_partitions=spec['model'],
                                devices=_topology_devices(spec['topology']))
  model = network.Transformer(config)
  shardings = partitioning.param_shardings(config, mesh)
  shapes = network.param_shapes(config)
  params = {part: jax.tree.map(
      lambda s, sharding: jax.ShapeDtypeStruct(s.shape, jnp.dtype(spec['params_dtype']),
                                               sharding=sharding), shapes[part], shardings[part])
            for part in ('encoder', 'token_embedder')}
  tokens = jax.ShapeDtypeStruct((spec['batch'], spec['length']), jnp.int32,
                                sharding=partitioning.batch_sharding(mesh, 2))
  encode = lambda params, tokens: model.apply({'params': params}, tokens, method=model.encode,
                                              enable_dropout=False)
  start = time.perf_counter()
  compiled = partitioning.partition(encode, mesh).lower(params, tokens).compile()
  row = {'compile_s': round(time.perf_counter() - start, 1),
         'device': mesh.devices.flat[0].device_kind, 'mesh': dict(mesh.shape),
         'attention_impl': network.encoder_attention_impl(config, spec['length'], 'tpu'),
         **_compiled_facts(compiled)}
  memory = row['memory_bytes']
  per_chip = memory['arguments'] + memory['outputs'] + memory['temporaries'] - memory['aliased']
  row['per_chip_gib'] = round(per_chip / GiB, 3)
  row['fits'] = per_chip <= spec['hbm_gib'] * GiB
  return row


def _llo_worker(spec: dict) -> dict:
  """Compiles the kernel with libtpu's LLO dump on and reads the tile branches' bundles."""
  dump = spec['dump_dir']
  # The four tile branches are the innermost regions holding matmuls, in program order.
  labels = ['band bias, no mask', 'band bias, masked', 'far bias, no mask', 'far bias, masked']
  row = _attention_worker(dict(spec, impl='pallas_tpu'))
  bundles = [f for f in glob.glob(f'{dump}/*{KERNEL}*final_bundles.txt')
             if 'schedule-analysis' not in f]
  usage = glob.glob(f'{dump}/*{KERNEL}*final_hlo-static-per-bundle-utilization.txt')
  if len(bundles) != 1 or len(usage) != 1:
    return {**row, 'error': f'libtpu wrote no single LLO dump of {KERNEL} in {dump}'}
  lines = open(usage[0]).read().split('== UTILIZATION:')[1].split('\n')
  units = open(usage[0]).read().split('== CAPACTIY:')[1].split('\n')[1].replace(',', ' ').split()
  mxu = [int(line.split()[units.index('MXU')]) for line in lines if line.strip()]
  starts, spans = {}, []
  for line in open(bundles[0]):
    found = re.match(r'\s*(0x[0-9a-f]+|\d+)\s', line)
    if not found:
      continue
    at = int(found.group(1), 0)
    for region in re.findall(r'Start region (\d+)', line):
      starts[region] = at
    for region in re.findall(r'End region (\d+)', line):
      if region in starts:
        spans.append((starts[region], at))
  with_mxu = [(a, b) for a, b in spans if sum(mxu[a:b + 1]) > 0]
  inner = sorted({(a, b) for a, b in with_mxu
                  if not any((c, d) != (a, b) and a <= c and d <= b for c, d in with_mxu)})
  if len(inner) != len(labels):
    return {**row, 'error': f'expected {len(labels)} tile branches, found {len(inner)}'}
  tile = spec['blocks'][0] * spec['blocks'][1] if spec.get('blocks') else None
  return {**row, 'total_bundles': len(mxu),
          'tile_branch_bundles': {label: b - a + 1 for label, (a, b) in zip(labels, inner)},
          'tile_elements': tile}


WORKERS = {'attention': _attention_worker, 'encoder': _encoder_worker, 'llo': _llo_worker}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--topology', default='v5e:4x4', help='TPU topology of the attention rows')
  parser.add_argument('--lengths', type=int, nargs='+', default=[8192, 16384, 32768])
  parser.add_argument('--impls', nargs='*', default=['pallas_tpu', 'blockwise'])
  parser.add_argument('--blocks', type=int, nargs=2, metavar=('BQ', 'BK'),
                      help="tiles of the attention rows (default: each implementation's)")
  parser.add_argument('--causal', action='store_true', help='causal attention rows')
  parser.add_argument('--encoder', action='store_true', help='also the Flan-T5-XXL encoder row')
  parser.add_argument('--encoder-topology', default='v5e:4x4')
  parser.add_argument('--encoder-length', type=int, default=32768)
  parser.add_argument('--encoder-impls', nargs='+', default=['pallas'])
  parser.add_argument('--params-dtype', default='bfloat16')
  parser.add_argument('--hbm-gib', type=float, default=16.0, help="a chip's HBM (v5e: 16)")
  parser.add_argument('--llo', action='store_true', help="also the kernel's LLO schedule")
  parser.add_argument('--timeout', type=int, default=3600, help='seconds per row')
  parser.add_argument('--worker', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  # Workers compile for TPU topologies on this host's CPU; libtpu's lock file guards a TPU that
  # a deviceless compile does not use.
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  if harness.answer_worker(args.worker, lambda spec: {**spec, **WORKERS[spec['kind']](spec)}):
    return
  common = dict(topology=args.topology, blocks=args.blocks, bidirectional=not args.causal)
  specs = [dict(kind='attention', impl=impl, length=length, **common)
           for length in args.lengths for impl in args.impls]
  if args.encoder:
    specs += [dict(kind='encoder', impl=impl, gin_file='gin/models/flan_t5/xxl.gin',
                   length=args.encoder_length, batch=2, model=8, topology=args.encoder_topology,
                   params_dtype=args.params_dtype, hbm_gib=args.hbm_gib)
              for impl in args.encoder_impls]
  rows = []
  for spec in specs:
    rows.append(harness.run_worker('benchmarks.tpu_kernel_bench', spec, args.timeout))
    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  if args.llo:
    with tempfile.TemporaryDirectory() as dump:
      flags = (f'--xla_jf_dump_to={dump} --xla_jf_dump_llo_text=true '
               '--xla_jf_dump_hlo_text=false')
      os.environ['LIBTPU_INIT_ARGS'] = f"{os.environ.get('LIBTPU_INIT_ARGS', '')} {flags}"
      spec = dict(common, kind='llo', length=1024, dump_dir=dump,
                  blocks=args.blocks or [512, 512])
      rows.append(harness.run_worker('benchmarks.tpu_kernel_bench', spec, args.timeout))
      rows[-1].pop('dump_dir')  # Gone with the temporary directory.
  print(json.dumps({'benchmark': 'tpu_kernel', 'rows': rows}, indent=1))


if __name__ == '__main__':
  main()
