"""Peak host memory of sharded checkpoint loading, 8 processes x 1 CPU device; prints JSON.

Run from the repository root:
  python -m benchmarks.load_bench --model base   # T5 1.1 base, 248 M params, 944 MiB float32

Writes a random-weight checkpoint in each format ('legacy': t5x msgpack + zarr, chunks <= 64 MiB;
'orbax': Orbax defaults, one chunk per array; 'orbax_8mib': chunks <= 8 MiB, as a sharded t5x
save writes them), then loads each with `checkpoints.load_params(path, mesh=(1, 8))` in 8
processes (`jax.distributed` on localhost, one CPU device each; fresh processes per format).
Every process reports its peak RSS growth during the load (kernel high-water mark, reset just
before); 'ratio' is the largest growth over the float32 size of the model. 'reference' is today's
unsharded load (`load_params(path)`, no mesh) in one process, measured the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

MODELS = {
    # T5 1.1 base (the released checkpoint's sizes): 248 M parameters.
    'base': dict(vocab_size=32128, emb_dim=768, num_heads=12, num_encoder_layers=12,
                 num_decoder_layers=12, head_dim=64, mlp_dim=2048,
                 mlp_activations=('gelu', 'linear'), logits_via_embedding=False),
    # The CI test's model (tests/checkpoints/sharded_loading_test.py): 6+6 layers of width 512,
    # mlp 2048, vocab 4096: 61 M parameters, 243 MB. Its largest stored chunk (the 8.4 MB
    # embedding or head, one chunk in either format) is 3.5% of the model (base: 5% legacy, 10%
    # Orbax default; XXL: 0.2% legacy, 1.2% Orbax default).
    'ci': dict(vocab_size=4096, emb_dim=512, num_heads=8, num_encoder_layers=6,
               num_decoder_layers=6, head_dim=64, mlp_dim=2048,
               mlp_activations=('gelu', 'linear'), logits_via_embedding=False),
}
FORMATS = ('legacy', 'orbax', 'orbax_8mib')
PROCESSES = 8


def write_checkpoints(root: str, model: dict, formats=FORMATS) -> dict[str, str]:
  """Writes one random float32 checkpoint per format under `root`; returns `{format: path}`."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from t5align import checkpoints, network  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: rng.standard_normal(s.shape, dtype=np.float32),
                        network.param_shapes(network.T5Config(**model)))
  paths = {}
  for fmt in formats:
    if fmt == 'legacy':
      paths[fmt] = checkpoints.save_t5x_checkpoint(params, os.path.join(root, fmt), 1)
      continue
    # t5x's Orbax layout: checkpoint_N/state with the params under 'target'.
    paths[fmt] = os.path.join(root, fmt, 'checkpoint_1')
    tree = {'target': params}
    chunk = {'orbax': None, 'orbax_8mib': 8 * 2**20}[fmt]
    save_args = jax.tree.map(lambda _, c=chunk: ocp.SaveArgs(chunk_byte_size=c), tree)
    ocp.PyTreeCheckpointer().save(os.path.join(paths[fmt], 'state'),
                                  args=ocp.args.PyTreeSave(tree, save_args=save_args))
  return paths


# One process: loads each path (sharded over all processes' devices, or with no mesh for the
# reference) and prints 'RESULT <path> <process> <peak growth> <float32 size> <own shard bytes>'.
_LOAD_SCRIPT = r'''
import gc, sys
import jax, numpy as np
model, port, paths = eval(sys.argv[1]), sys.argv[2], sys.argv[5:]
pid, count = int(sys.argv[3]), int(sys.argv[4])
if count > 1:
  jax.distributed.initialize(f'localhost:{port}', count, pid)
import orbax.checkpoint
from t5align import checkpoints, network, partitioning

def status(field):
  with open('/proc/self/status') as f:
    return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field))

config = network.T5Config(**model)
mesh = partitioning.make_mesh({'data': 1, 'model': count}) if count > 1 else None
# Costs that do not grow with the checkpoint, paid before measuring: tracing the model for its
# shapes and axis names, and jax's first transfer to the device.
checkpoints.load._param_shapes(config)
jax.block_until_ready(jax.device_put(np.zeros(8)))
for path in paths:
  gc.collect()
  with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')  # Resets VmHWM to the current RSS.
  before = status('VmRSS:')
  params, _ = checkpoints.load_params(path, config, mesh=mesh)
  jax.block_until_ready(params)
  growth = status('VmHWM:') - before
  leaves = jax.tree.leaves(params)
  size = 4 * sum(int(np.prod(a.shape)) for a in leaves)
  own = (sum(s.data.nbytes for a in leaves for s in a.addressable_shards) if mesh else size)
  print(f'RESULT {path} {pid} {growth} {size} {own}', flush=True)
  del params, leaves
'''


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def measure_load(paths: list[str], model: dict, processes: int = PROCESSES,
                 timeout: float = 600) -> list[dict]:
  """Loads `paths` in `processes` processes x 1 CPU device (no mesh if 1); one row per load."""
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=1',
             PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(
                 os.path.abspath(__file__))), os.environ.get('PYTHONPATH', '')]))
  port = str(_free_port())
  procs = [subprocess.Popen([sys.executable, '-c', _LOAD_SCRIPT, repr(model), port, str(i),
                             str(processes), *paths], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(processes)]
  try:
    outputs = [p.communicate(timeout=timeout) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for p, (_, err) in zip(procs, outputs):
    if p.returncode:
      raise RuntimeError(f'load process failed ({p.returncode}):\n{err[-3000:]}')
  rows = []
  for out, _ in outputs:
    for line in out.splitlines():
      if line.startswith('RESULT'):
        path, pid, growth, size, own = line.split()[1:]
        rows.append({'path': path, 'process': int(pid), 'peak_rss_growth': int(growth),
                     'float32_bytes': int(size), 'own_shard_bytes': int(own)})
  if len(rows) != processes * len(paths):
    raise RuntimeError(f'expected {processes * len(paths)} results, got {outputs}')
  return rows


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--model', choices=sorted(MODELS), default='base')
  parser.add_argument('--formats', default=','.join(FORMATS))
  parser.add_argument('--dir', default=None, help='where to write (default: a temporary one)')
  args = parser.parse_args(argv)
  formats = args.formats.split(',')
  model = MODELS[args.model]
  with tempfile.TemporaryDirectory(dir=args.dir) as root:
    start = time.perf_counter()
    paths = write_checkpoints(root, model, formats)
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    # Fresh processes per format: memory freed by an earlier load stays in the allocator and
    # would hide part of a later one's growth.
    sharded = [r for path in paths.values() for r in measure_load([path], model)]
    load_s = time.perf_counter() - start
    reference = [r for path in paths.values() for r in measure_load([path], model, processes=1)]
  result = {'model': args.model, 'processes': PROCESSES, 'mesh': [1, PROCESSES],
            'write_s': round(write_s, 1), 'sharded_load_s': round(load_s, 1), 'rows': []}
  for fmt, path in paths.items():
    mine = [r for r in sharded if r['path'] == path]
    (ref,) = [r for r in reference if r['path'] == path]
    size = ref['float32_bytes']
    result['rows'].append({
        'format': fmt, 'float32_mib': round(size / 2**20, 1),
        'peak_rss_growth_mib': [round(r['peak_rss_growth'] / 2**20, 1)
                                for r in sorted(mine, key=lambda r: r['process'])],
        'ratio': round(max(r['peak_rss_growth'] for r in mine) / size, 3),
        'reference_unsharded_ratio': round(ref['peak_rss_growth'] / size, 3)})
  print(json.dumps(result, indent=1))


if __name__ == '__main__':
  main()
