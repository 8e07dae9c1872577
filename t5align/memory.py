"""Memory a run needs: XLA's figure per device for a compiled step, which `t5align.eval` and
`t5align.calibrate` check before running it (`Compiled`, `check_compiled`); an analytic estimate
per device, for planning without a compile (`estimate`), both for one call of a program as its
`Workload` states it; and the host's room for a checkpoint's arrays (`check_host_fits`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, Mapping

import jax
import numpy as np

from t5align import network
from t5align.runtime import batching

GiB = 2**30


class DoesNotFitError(MemoryError):
  """The run's per-device memory (XLA's figure, or the estimate) exceeds the device's memory."""


@dataclasses.dataclass(frozen=True)
class Compiled:
  """Bytes per device of a compiled program: XLA's `memory_analysis()`, plus the parameters the
  run holds on the device that the program does not read (`unread_parameters`: XLA drops unread
  arguments, e.g. a calibration sweep never reads the decoder the run has loaded)."""

  arguments: int
  temporaries: int
  outputs: int
  aliased: int
  generated_code: int
  unread_parameters: int = 0

  @classmethod
  def of(cls, compiled: Any, *, parameter_bytes: int = 0, input_bytes: int = 0) -> Compiled:
    """XLA's figures of `compiled` (a `jax.stages.Compiled`); `parameter_bytes` and
    `input_bytes` (per device) are what the run holds: parameters missing from XLA's arguments
    count as unread."""
    stats = compiled.memory_analysis()
    arguments = int(stats.argument_size_in_bytes)
    return cls(arguments, int(stats.temp_size_in_bytes), int(stats.output_size_in_bytes),
               int(stats.alias_size_in_bytes), int(stats.generated_code_size_in_bytes),
               max(0, parameter_bytes - (arguments - input_bytes)))

  @property
  def total(self) -> int:
    return (self.arguments + self.temporaries + self.outputs - self.aliased + self.generated_code
            + self.unread_parameters)

  def describe(self) -> str:
    parts = [f'arguments {self.arguments / GiB:.2f}', f'temporaries {self.temporaries / GiB:.2f}',
             f'outputs {self.outputs / GiB:.3f}', f'code {self.generated_code / GiB:.3f}']
    if self.aliased:
      parts.append(f'minus aliased {self.aliased / GiB:.2f}')
    if self.unread_parameters:
      parts.append(f'parameters it does not read {self.unread_parameters / GiB:.2f}')
    return ' + '.join(parts) + f' = {self.total / GiB:.2f} GiB'


def per_device_bytes(tree: Any) -> int:
  """Bytes one device holds of a tree of arrays (or `jax.ShapeDtypeStruct`s with shardings):
  each leaf's shard under its sharding, the whole leaf without one."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    sharding = getattr(leaf, 'sharding', None)
    shape = sharding.shard_shape(tuple(leaf.shape)) if sharding is not None else leaf.shape
    total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
  return total


def check_compiled(memory: Compiled, *, hints: list[str], limit_bytes: int | None = None,
                   what: str = 'This run') -> Compiled:
  """Refuses a compiled program whose XLA memory exceeds the device's (before running it).

  Raises:
    DoesNotFitError: naming XLA's figures, the limit and the settings that lower them (`hints`,
      e.g. `settings_to_change(...)`).
  """
  limit, where = (limit_bytes, 'limit') if limit_bytes is not None else device_memory()
  if memory.total <= limit:
    return memory
  raise DoesNotFitError(
      f'{what} needs {memory.total / GiB:.2f} GiB per device as XLA compiled it '
      f'({memory.describe()}) but the device has {limit / GiB:.2f} GiB ({where}). Set '
      + '; or '.join(hints) + '.')


@dataclasses.dataclass(frozen=True)
class Estimate:
  """Bytes per device."""

  params: int
  attention: int
  hidden: int
  attention_impl: str
  cache: int = 0

  @property
  def total(self) -> int:
    return self.params + self.attention + self.hidden + self.cache


@functools.lru_cache(maxsize=8)
def _param_count(config: network.T5Config) -> int:
  return sum(math.prod(s.shape) for s in jax.tree.leaves(network.param_shapes(config)))


def estimate(config: network.T5Config, *, length: int, batch_size: int, params_dtype: Any,
             model_shards: int = 1, data_shards: int = 1, taus: int = 1,
             tau_shards: int = 1, decoding: bool = False,
             platform: str | None = None) -> Estimate:
  """The per-device estimate for inputs of `length` tokens (docs/performance/tpu.md compares
  it with XLA's).

  The parameters (split over 'model'), plus the live activations of one encoder layer for the
  rows on a device (examples over 'data' times candidate temperatures over 'tau'), plus greedy
  decoding's cross-attention cache:
    reference   float32 attention logits and probabilities `[b, h, L, L]` (2 arrays) and the
                relative-position bias `[h, L, L]`;
    blockwise   per row, the float32 output accumulators `[h, L, d]` and the stacked outputs of
                the query blocks (2 arrays), and 3 float32 `[h, block_q, block_k]` tiles;
    pallas      taken as blockwise's;
    hidden      per row, the residual stream and its norm, two of q/k/v/o and the MLP's hidden
                units, `L * (2 e + 2 h d / model + (n_act + 1) mlp / model)` in the activation
                dtype; and per example (shared by its taus) two float32 copies of the residual
                stream, `2 L e` (what XLA's TPU programs keep beside the per-row activations);
    cache       (decoding) every decoder layer's cross-attention keys and values,
                `2 n_dec b L h d`.
  Heads, MLP units and the vocabulary are split over 'model' (t5x's rules); 'auto' attention is
  resolved at the run's length as the network does.

  Args:
    config: the model (its dtype is the activation dtype).
    length: encoder input length (padded).
    batch_size: examples per call (all devices together).
    params_dtype: dtype the parameters are held in.
    model_shards, data_shards, tau_shards: mesh axis sizes.
    taus: candidate temperatures per call (calibration; 1 for eval).
    decoding: count greedy decoding's cross-attention cache (eval).
    platform: the platform the run compiles for ('cpu', 'gpu', 'tpu'; None: the target
      platform, `attention.target_platform`), which picks 'auto' and 'pallas' kernels.
  """
  impl = network.encoder_attention_impl(config, length, platform)
  examples = batching.ceil_div(batch_size, data_shards)
  b = examples * batching.ceil_div(taus, tau_shards)  # Rows on one device.
  h = batching.ceil_div(config.num_heads, model_shards)
  params = _param_count(config) * np.dtype(params_dtype).itemsize // model_shards
  if impl == 'reference':
    attention = 4 * (2 * b * h * length * length + h * length * length)
  else:
    from t5align.attention import blockwise  # pylint: disable=g-import-not-at-top
    # NOTE: the accelerators' default tiles (see blockwise.default_blocks).
    options = network.attention_options(config, 'blockwise')
    block_q, block_k = (min(length, given or default) for given, default in zip(
        (options.block_q, options.block_k), blockwise.default_blocks('tpu')))
    attention = 4 * b * h * (2 * length * config.head_dim + 3 * block_q * block_k)
  width = (2 * config.emb_dim + 2 * h * config.head_dim
           + (len(config.mlp_activations) + 1) * batching.ceil_div(config.mlp_dim, model_shards))
  itemsize = np.dtype(config.dtype).itemsize
  hidden = b * length * width * itemsize + examples * length * 2 * config.emb_dim * 4
  cache = (2 * config.num_decoder_layers * examples * length * h * config.head_dim * itemsize
           if decoding else 0)
  return Estimate(params, attention, hidden, impl, cache)


@dataclasses.dataclass(frozen=True)
class Workload:
  """One call of a compiled program, each figure stated once: the memory check's refusal
  (`settings_to_change`), the analytic `estimate` and the pre-flight's report (`settings`) all
  read it.

  Attributes:
    config: the model as the program computes it (its dtype is the activation dtype; its
      attention_impl, resolved at `width`, the encoder's attention).
    length: encoder input tokens per example as the job sets them (eval: the longest input or
      the pre-flight's --length, after TRUNCATE_INPUTS; calibration: a LENGTHS entry; training:
      INPUT_LENGTH).
    batch_size: examples per call as the job sets them (BATCH_SIZE; calibration: else
      NUM_SAMPLES); the program rounds it up to the 'data' axis.
    params_dtype: dtype the parameters are held in (PARAMS_DTYPE).
    pad_to: the inputs are padded to a multiple of this many tokens (eval: 128).
    model_shards, data_shards, tau_shards: the mesh's axis sizes.
    model_setting: the setting that sizes the 'model' axis, for a refusal (eval's
      NUM_PARTITIONS; calibration's third MESH_SHAPE entry).
    mesh_shape: calibration's MESH_SHAPE as set (None: unset), for its report.
    taus: candidate temperatures per call (calibration's tau batch); None: not a sweep.
    decoding: the program runs the decoder over the encoder's output (eval), whose
      cross-attention cache `estimate` counts.
    decode_steps: greedy decoding's steps (eval); None: it scores.
    target_length: decoder target tokens per example as compiled (eval's scoring, training);
      0: none.
    tasks: the tasks the program serves (eval), for its report.
    training: the program is a train step (its gradients and optimizer state are XLA's to
      count: `estimate` models inference only).
  """

  config: network.T5Config
  length: int
  batch_size: int
  params_dtype: str = 'float32'
  pad_to: int = 1
  model_shards: int = 1
  data_shards: int = 1
  tau_shards: int = 1
  model_setting: str = 'NUM_PARTITIONS'
  mesh_shape: Any = None
  taus: int | None = None
  decoding: bool = False
  decode_steps: int | None = None
  target_length: int = 0
  tasks: tuple[str, ...] = ()
  training: bool = False

  @property
  def width(self) -> int:
    """The encoder input width as compiled: `length` padded to a multiple of `pad_to`."""
    return batching.round_up(max(self.length, 1), self.pad_to)

  @property
  def rows(self) -> int:
    """Examples per call as compiled: `batch_size` rounded up to the 'data' axis."""
    return batching.round_up(self.batch_size, self.data_shards)

  def attention_impl(self, platform: str | None = None) -> str:
    """The encoder's attention at `width` on `platform` (None: the target platform)."""
    return network.encoder_attention_impl(self.config, self.width, platform)

  def estimate(self, platform: str | None = None) -> Estimate:
    """`estimate` for this call."""
    return estimate(self.config, length=self.width, batch_size=self.batch_size,
                    params_dtype=self.params_dtype, model_shards=self.model_shards,
                    data_shards=self.data_shards, taus=self.taus or 1,
                    tau_shards=self.tau_shards, decoding=self.decoding, platform=platform)

  def settings_to_change(self) -> list[str]:
    """`settings_to_change` for this call (its attention resolved on the target platform)."""
    return settings_to_change(model_shards=self.model_shards, batch_size=self.batch_size,
                              attention_impl=self.attention_impl(), length=self.width,
                              taus=self.taus or 1, model_setting=self.model_setting)

  def settings(self) -> dict[str, Any]:
    """What the program depends on, as the pre-flight reports it ('settings' of its JSON)."""
    out = {'length': self.length, 'batch_size': self.batch_size,
           'params_dtype': self.params_dtype}
    if self.decoding:
      out.update(num_partitions=self.model_shards, max_decode_length=self.decode_steps,
                 scored=self.decode_steps is None, target_length=self.target_length,
                 tasks=list(self.tasks))
    if self.taus is not None:
      out.update(mesh_shape=self.mesh_shape, tau_batch=self.taus)
    if self.training:
      out.update(target_length=self.target_length, training=True)
    return out


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


def settings_to_change(*, model_shards: int, batch_size: int, attention_impl: str, length: int,
                       taus: int = 1, attention_bytes: int | None = None,
                       model_setting: str = 'NUM_PARTITIONS') -> list[str]:
  """The settings that lower a run's memory per device, worded for a refusal.

  `model_setting` names the 'model' axis size (eval's NUM_PARTITIONS; calibration's third
  MESH_SHAPE entry); `attention_bytes` (optional) is what 'reference' attention takes.
  """
  hints = [f'{model_setting} (devices on the \'model\' axis, now {model_shards}) higher',
           f'BATCH_SIZE (now {batch_size}) lower']
  if attention_impl == 'reference':
    size = ('' if attention_bytes is None else
            f': {attention_bytes / GiB:.2f} GiB of attention logits and probabilities')
    hints.insert(1, f"ATTENTION_IMPL='blockwise' (now 'reference' at {length} tokens{size})")
  if taus > 1:
    hints.append(f'the tau batch (TAU_BATCH_SIZE, now {taus} candidates per call) lower')
  return hints
