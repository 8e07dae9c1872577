"""Per-device memory estimate of an eval or calibration run, and a refusal before compiling.

The estimate is analytic and a lower bound of what XLA will allocate: the parameters (sharded
over 'model'), plus the largest live activations of one encoder layer for the per-device batch
(examples over 'data', candidate temperatures over 'tau'):
  reference   float32 attention logits and probabilities `[b, h, L, L]` (2 arrays) and the
              relative-position bias `[h, L, L]`;
  blockwise   the same for one key block: `[b, h, L, block_k]` (O(L));
  pallas      one `[block_q, block_k]` tile per (b, h) in flight, taken as blockwise's bound;
  hidden      the residual stream, q/k/v/out projections and the MLP's hidden units,
              `b * L * (4 e + 4 h d / model + (n_act + 1) mlp / model)` in the activation dtype.
Heads, MLP units and the vocabulary are split over 'model' (t5x's rules); 'auto' attention is
resolved at the run's length as the network does.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, Mapping

import jax
import numpy as np

from t5align import batching
from t5align import network

GiB = 2**30


class DoesNotFitError(MemoryError):
  """The run's per-device memory estimate exceeds the device's memory."""


@dataclasses.dataclass(frozen=True)
class Estimate:
  """Bytes per device."""

  params: int
  attention: int
  hidden: int
  attention_impl: str

  @property
  def total(self) -> int:
    return self.params + self.attention + self.hidden


@functools.lru_cache(maxsize=8)
def _param_count(config: network.T5Config) -> int:
  return sum(math.prod(s.shape) for s in jax.tree.leaves(network.param_shapes(config)))


def estimate(config: network.T5Config, *, length: int, batch_size: int, params_dtype: Any,
             model_shards: int = 1, data_shards: int = 1, taus: int = 1,
             tau_shards: int = 1) -> Estimate:
  """The per-device estimate (see the module docstring) for inputs of `length` tokens.

  Args:
    config: the model (its dtype is the activation dtype).
    length: encoder input length (padded).
    batch_size: examples per call (all devices together).
    params_dtype: dtype the parameters are held in.
    model_shards, data_shards, tau_shards: mesh axis sizes.
    taus: candidate temperatures per call (calibration; 1 for eval).
  """
  impl = network.encoder_attention_impl(config, length)
  b = batching.ceil_div(batch_size, data_shards) * batching.ceil_div(taus, tau_shards)  # Rows on one device.
  h = batching.ceil_div(config.num_heads, model_shards)
  params = _param_count(config) * np.dtype(params_dtype).itemsize // model_shards
  if impl == 'reference':
    attention = 4 * (2 * b * h * length * length + h * length * length)
  else:
    from t5align import blockwise  # pylint: disable=g-import-not-at-top
    # NOTE: the accelerators' default key block (also the CPU's, see blockwise.default_blocks).
    block = min(length, config.attention_block_k or blockwise.default_blocks('tpu')[1])
    attention = 4 * (2 * b * h * length * block + h * length * block)
  width = (4 * config.emb_dim + 4 * h * config.head_dim
           + (len(config.mlp_activations) + 1) * -(-config.mlp_dim // model_shards))
  hidden = b * length * width * np.dtype(config.dtype).itemsize
  return Estimate(params, attention, hidden, impl)


def device_memory(device: Any = None) -> tuple[int, str]:
  """`(bytes, where)`: the device's `bytes_limit`, or on CPU the host's physical memory shared by
  its local devices."""
  device = device or jax.local_devices()[0]
  stats = device.memory_stats() if hasattr(device, 'memory_stats') else None
  if stats and stats.get('bytes_limit'):
    return int(stats['bytes_limit']), f'{device.device_kind} bytes_limit'
  host = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  count = max(1, jax.local_device_count())
  return host // count, f'host memory / {count} local devices'


def check_fits(config: network.T5Config, *, length: int, batch_size: int, params_dtype: Any,
               mesh: jax.sharding.Mesh | None = None, taus: int = 1,
               limit_bytes: int | None = None) -> Estimate:
  """Refuses (before compiling) a run whose estimate exceeds the device memory.

  `mesh` axes 'model', 'data' and 'tau' are read by name (absent: 1); `limit_bytes` defaults to
  `device_memory()`. Returns the estimate when it fits.

  Raises:
    DoesNotFitError: naming the estimate, the limit and the settings that lower it.
  """
  axes = dict(mesh.shape) if mesh is not None else {}
  model, data, tau = (axes.get(a, 1) for a in ('model', 'data', 'tau'))
  est = estimate(config, length=length, batch_size=batch_size, params_dtype=params_dtype,
                 model_shards=model, data_shards=data, taus=taus, tau_shards=tau)
  limit, where = (limit_bytes, 'limit') if limit_bytes is not None else device_memory()
  if est.total <= limit:
    return est
  hints = [f'NUM_PARTITIONS (devices on the \'model\' axis, now {model}) higher',
           f'BATCH_SIZE (now {batch_size}) lower']
  if est.attention_impl == 'reference':
    hints.insert(1, f"ATTENTION_IMPL='blockwise' (now 'reference' at {length} tokens: "
                    f'{est.attention / GiB:.2f} GiB of attention logits and probabilities)')
  if taus > 1:
    hints.append(f'the tau batch (TAU_BATCH_SIZE, now {taus} candidates per call) lower')
  raise DoesNotFitError(
      f'This run needs about {est.total / GiB:.2f} GiB per device (parameters '
      f'{est.params / GiB:.2f} GiB in {np.dtype(params_dtype).name}, attention '
      f'{est.attention / GiB:.2f} GiB ({est.attention_impl}), activations '
      f'{est.hidden / GiB:.2f} GiB at {length} tokens) but the device has '
      f'{limit / GiB:.2f} GiB ({where}). Set ' + '; or '.join(hints) + '.')


def host_available_bytes() -> int:
  """Memory this host can still give a process: MemAvailable plus free swap (/proc/meminfo);
  elsewhere its physical memory."""
  try:
    with open('/proc/meminfo', encoding='ascii') as f:
      fields = {line.split(':')[0]: int(line.split()[1]) * 1024 for line in f if ':' in line}
    return fields['MemAvailable'] + fields.get('SwapFree', 0)
  except (OSError, KeyError, ValueError, IndexError):
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def check_host_fits(arrays: Mapping[str, tuple[int, tuple[int, ...]]], what: str, dtype: Any,
                    available: int | None = None) -> None:
  """Refuses, before anything is allocated, arrays that cannot fit in this host's memory.

  Args:
    arrays: {name: (bytes this process would hold, declared shape)}.
    what: their source, e.g. 'checkpoint PATH'.
    dtype: the dtype they would be held in (for the message).
    available: bytes available (default `host_available_bytes()`).

  Raises:
    DoesNotFitError: naming `what`, the total and the largest arrays with their shapes.
  """
  total = sum(size for size, _ in arrays.values())
  available = host_available_bytes() if available is None else available
  if total <= available:
    return
  largest = [item for item in sorted(arrays.items(), key=lambda item: -item[1][0])[:3]
             if item[1][0] >= total / 100]  # Those that matter.
  listed = ', '.join(f'{name} {tuple(shape)} ({size / GiB:.3g} GiB)'
                     for name, (size, shape) in largest)
  raise DoesNotFitError(
      f'{what} declares arrays of {total / GiB:.3g} GiB in {np.dtype(dtype).name} for this '
      f'process, more than the {available / GiB:.3g} GiB this host has available; the largest: '
      f'{listed}. If these shapes are not the model\'s, the checkpoint metadata is corrupt; '
      'otherwise load it in bfloat16 (PARAMS_DTYPE) or sharded over more processes.')
