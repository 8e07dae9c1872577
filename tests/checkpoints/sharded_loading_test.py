"""checkpoints.load_params(mesh=...): sharded T5X loading on simulated devices and processes."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTDATA = REPO_ROOT / 'tests' / 'testdata' / 't5x'

# Every fixture x format x mesh x dtype, against the unsharded load cast on the host.
_EQUALITY_SCRIPT = r'''
import sys
import jax, jax.numpy as jnp, numpy as np
from t5align import checkpoints
from t5align import partitioning
assert len(jax.devices()) == 8
for path in sys.argv[1:]:
  for dtype in (np.float32, jnp.bfloat16):
    expected = checkpoints.flatten_params(checkpoints.load_params(path, dtype=dtype)[0])
    for data, model in ((8, 1), (2, 4), (1, 8)):
      mesh = partitioning.make_mesh({'data': data, 'model': model})
      params, config = checkpoints.load_params(path, dtype=dtype, mesh=mesh)
      shardings = checkpoints.flatten_params(partitioning.param_shardings(config, mesh))
      got = checkpoints.flatten_params(params)
      assert got.keys() == expected.keys(), (path, sorted(got.keys() ^ expected.keys()))
      for name, array in got.items():
        where = (path, data, model, np.dtype(dtype).name, name)
        assert isinstance(array, jax.Array) and array.dtype == np.dtype(dtype), where
        assert array.sharding.is_equivalent_to(shardings[name], array.ndim), where
        np.testing.assert_array_equal(np.asarray(array), expected[name], err_msg=str(where))
      if model > 1:  # The rules do shard something over 'model'.
        assert any('model' in str(a.sharding.spec) for a in got.values())
print('OK')
'''


def _env(**extra: str) -> dict[str, str]:
  path = os.pathsep.join([str(REPO_ROOT), os.environ.get('PYTHONPATH', '')])
  return dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=path, **extra)


@pytest.mark.slow
def test_sharded_load_equals_unsharded_load_on_8_devices(tmp_path):
  from t5align import checkpoints  # pylint: disable=g-import-not-at-top
  paths = [str(TESTDATA / name / fmt / 'checkpoint_0')
           for name in ('t5_1_1_tiny', 't5_1_0_tiny') for fmt in ('legacy', 'orbax')]
  # Arrays of at most 4 KiB inline in the msgpack (sliced from host memory), the rest zarr.
  params = checkpoints.read_params(paths[0])
  paths.append(checkpoints.save_t5x_checkpoint(params, str(tmp_path), 0, inline_max_bytes=4096))
  out = subprocess.run(
      [sys.executable, '-c', _EQUALITY_SCRIPT, *paths], cwd=REPO_ROOT, capture_output=True,
      text=True, timeout=300,
      env=_env(XLA_FLAGS='--xla_force_host_platform_device_count=8'))
  assert out.returncode == 0 and out.stdout.strip().endswith('OK'), out.stderr[-3000:]


# ---------------------------------------------------------------- peak host memory


@pytest.mark.multiprocess
def test_sharded_load_peak_rss_per_process_is_a_share_plus_one_read(tmp_path):
  """Each of 8 processes holds its 1/8 of the model plus one array's read, not the model.

  A sharded read holds this process's 1/8 plus, while reading one array, one stored chunk
  (compressed and decoded), plus costs that do not scale with the model (tensorstore and jax
  runtime, allocator slack: measured 20-60 MB here, varying from run to run with thread
  scheduling). Issue 10's target, <= 0.35x the float32 model per process, is for base size
  (944 MiB), where those fixed costs are small: `python -m benchmarks.load_bench --model base`
  measured 0.16-0.23x (legacy, Orbax defaults, Orbax 8 MiB chunks; the unsharded load
  1.5-1.8x); writing and loading it take ~5 min on 2 cores, too slow for CI. This model
  (`load_bench.MODELS['ci']`, 232 MiB: width 512, base's mlp 2048, vocab 4096, 6+6 layers) has
  many small arrays as real ones do (its largest chunk is 3.5% of it); at its size the fixed
  costs alone are 0.1-0.25x, so a bare 0.35x bound would be flaky (0.20-0.35x seen). The bound
  below is the structure instead: own share + two of the largest chunk + 64 MiB fixed, and it
  stays far below the unsharded load's 1.5x.
  """
  from benchmarks import load_bench  # pylint: disable=g-import-not-at-top
  model = load_bench.MODELS['ci']
  paths = load_bench.write_checkpoints(str(tmp_path), model, formats=('legacy', 'orbax'))
  largest_chunk = 4096 * 512 * 4  # The embedding (and the head): one chunk in either format.
  for fmt, path in paths.items():
    rows = load_bench.measure_load([path], model, timeout=300)
    print('\n'.join(f"{fmt} process {r['process']}: peak RSS growth "
                    f"{r['peak_rss_growth'] / r['float32_bytes']:.3f}x the float32 size "
                    f"{r['float32_bytes'] / 2**20:.0f} MiB" for r in rows))
    for r in rows:
      size = r['float32_bytes']
      assert size > 240e6
      assert r['own_shard_bytes'] == pytest.approx(size / 8, rel=0.01)  # All sharded 8 ways.
      bound = r['own_shard_bytes'] + 2 * largest_chunk + 64 * 2**20
      assert r['peak_rss_growth'] <= min(bound, 0.5 * size), (
          fmt, r, r['peak_rss_growth'] / size)
