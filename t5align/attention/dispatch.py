"""Which encoder self-attention implementation runs, and how it is called on a mesh.

`self_attention` is the one entry every layer calls: `IMPLEMENTATIONS` maps a name to its
function and frozen options class; `resolve` turns 'pallas' (the target platform's fused kernel,
`FUSED`) and 'auto' into one of them. The Pallas kernels run per device under a mesh
(`_per_device`: XLA cannot partition a custom call). Imports nothing of t5align outside
attention/.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

from flax.linen import partitioning as nn_partitioning
import jax
from jax.sharding import Mesh, PartitionSpec as P
import jax.numpy as jnp
import numpy as np

from t5align.attention import blockwise
from t5align.attention import pallas_gpu
from t5align.attention import pallas_mgpu
from t5align.attention import pallas_tpu
from t5align.attention import reference

Array = jax.Array
LogicalRules = Sequence[tuple[str, str | None]]  # flax's logical axis rules


class Kernel(Protocol):
  """The call every attention implementation answers, named once: `reference_self_attention`,
  `blockwise_attention` and the Pallas kernels (`pallas_attention`, `pallas_mgpu_attention`,
  `pallas_tpu_attention`) take these arguments (`self_attention` documents them), plus their own
  tile and launch keywords (their `Options` fields) and, where they have it, dropout."""

  def __call__(self, query: Array, key: Array, value: Array, *, rel_embedding: Array,
               segment_ids: Array, temperature: Array | None, bidirectional: bool, dtype: Any,
               float32_logits: bool, with_stats: bool, offset_map: reference.OffsetMap
               ) -> tuple[Array, reference.RowStats | None]:
    ...


def _interpret(impl: str, platform: str) -> bool:
  """Whether Pallas kernel `impl` runs in interpret mode (CPU); refuses a foreign platform."""
  if platform == 'cpu' and impl == 'pallas_mgpu':
    # NOTE: Mosaic GPU's interpret mode runs the kernel's three warpgroups as XLA computations
    # that block on each other; with one XLA thread per core it hangs on a 2-core machine.
    raise ValueError(
        "attention_impl='pallas_mgpu' is the Hopper (sm_90) GPU kernel and does not run on the "
        "CPU; use 'pallas' (here the TPU kernel in interpret mode), 'blockwise' or 'reference'. "
        'Its interpret mode is for tests: pallas_mgpu.pallas_mgpu_attention(..., '
        'interpret=True) in a process started with NPROC>=8 (tests/attention/pallas_mgpu_test.py).')
  if platform == 'cpu':
    return True
  if platform not in IMPLEMENTATIONS[impl].platforms:
    raise ValueError(
        f'attention_impl={impl!r} is the {"/".join(IMPLEMENTATIONS[impl].platforms)} kernel and '
        f"cannot compile for {platform}; use 'pallas' (the platform's fused kernel: "
        f"{FUSED.get(platform, 'none')}), 'blockwise' or 'reference'.")
  return False


def _refuse_dropout(impl: str, dropout_rng: Array | None, dropout_rate: float) -> None:
  # NOTE: the fused kernels have no attention dropout; dropout on is refused rather than run
  # without it.
  if dropout_rng is not None and dropout_rate > 0.0:
    raise ValueError(
        f'attention_impl={impl!r} does not implement attention dropout, but dropout is on '
        f'(T5Config.dropout_rate={dropout_rate}, enable_dropout=True / deterministic=False). '
        "Train with attention_impl='reference' or 'blockwise' (same parameters, t5x's dropout), "
        'or set dropout_rate=0.0 or enable_dropout=False.')


def _reference(query, key, value, *, options, **kwargs):
  del options  # Materialized: no blocks.
  return reference.reference_self_attention(query, key, value, **kwargs)


def _blockwise(query, key, value, *, options, **kwargs):
  return blockwise.blockwise_attention(query, key, value, backend=reference.target_platform(),
                                       **dataclasses.asdict(options), **kwargs)


def _per_device(kernel: Kernel, query: Array, key: Array, value: Array, *,
                rel_embedding: Array, segment_ids: Array, temperature: Array | None,
                with_stats: bool, **kwargs):
  """`kernel(query, key, value, ...)` on each device's shard of the mesh in effect.

  XLA cannot partition a Pallas custom call (Mosaic or Triton), so under a mesh of several
  devices the kernel runs in a `shard_map` whose specs are the arrays' logical axes under flax's
  rules in effect (`partitioning.standard_logical_axis_rules`: examples over 'data', heads over
  'model'; `spec_for` replicates an axis its mesh axis does not divide); each device
  attends its own examples and heads. Without a mesh the kernel is called as it is.
  """
  mesh = jax.sharding.get_abstract_mesh()
  call = lambda q, k, v, table, ids, tau: kernel(
      q, k, v, rel_embedding=table, segment_ids=ids, temperature=tau, with_stats=with_stats,
      **kwargs)
  if mesh.empty or mesh.size == 1:
    return call(query, key, value, rel_embedding, segment_ids, temperature)
  rules = nn_partitioning.get_axis_rules()
  spec = lambda names, shape: spec_for(names, shape, mesh, rules)
  batch, length, heads, _ = query.shape
  tau = reference.head_temperature(temperature, batch, heads)  # [1 or b, 1 or h]
  qkv = spec(('batch', 'length', 'heads', 'kv'), query.shape)
  rows = spec(('batch', 'heads', 'length'), (batch, heads, length))
  return jax.shard_map(
      call, in_specs=(qkv, qkv, qkv, spec(('heads', 'relpos_buckets'), rel_embedding.shape),
                      spec(('batch', 'length'), segment_ids.shape),
                      spec(('batch', 'heads'), tau.shape)),
      out_specs=(qkv, reference.RowStats(rows, rows) if with_stats else None),
      check_vma=False)(query, key, value, rel_embedding, segment_ids, tau)


def _pallas_gpu(query, key, value, *, options, dropout_rng, dropout_rate, **kwargs):
  _refuse_dropout('pallas_gpu', dropout_rng, dropout_rate)
  return _per_device(pallas_gpu.pallas_attention, query, key, value,
                     interpret=_interpret('pallas_gpu', reference.target_platform()),
                     **dataclasses.asdict(options), **kwargs)


def _pallas_mgpu(query, key, value, *, options, dropout_rng, dropout_rate, **kwargs):
  _refuse_dropout('pallas_mgpu', dropout_rng, dropout_rate)
  return _per_device(pallas_mgpu.pallas_mgpu_attention, query, key, value,
                     interpret=_interpret('pallas_mgpu', reference.target_platform()),
                     **dataclasses.asdict(options), **kwargs)


def _pallas_tpu(query, key, value, *, options, dropout_rng, dropout_rate, **kwargs):
  _refuse_dropout('pallas_tpu', dropout_rng, dropout_rate)
  return _per_device(pallas_tpu.pallas_tpu_attention, query, key, value,
                     interpret=_interpret('pallas_tpu', reference.target_platform()),
                     **dataclasses.asdict(options), **kwargs)


@dataclasses.dataclass(frozen=True)
class Implementation:
  """One encoder self-attention implementation.

  Attributes:
    fn: a `Kernel` that also takes `options` (an instance of the class below, or None),
      `dropout_rng` and `dropout_rate`.
    options: its frozen options class (tile sizes, launch parameters; the fields are the
      kernel's keyword arguments), or None.
    platforms: where it compiles; a Pallas kernel also runs on CPU, in interpret mode.
  """

  fn: Callable[..., tuple[Array, reference.RowStats | None]]
  options: type | None = None
  platforms: tuple[str, ...] = ('cpu', 'gpu', 'tpu')


# Encoder self-attention implementations by name (T5Config.attention_impl, besides 'pallas' and
# 'auto', which `resolve` maps to one of these).
IMPLEMENTATIONS: dict[str, Implementation] = {
    'reference': Implementation(_reference),
    'blockwise': Implementation(_blockwise, blockwise.Options),
    'pallas_gpu': Implementation(_pallas_gpu, pallas_gpu.Options, ('gpu',)),
    # Hopper only, bfloat16 / float16, encoder: what 'pallas' is there (`resolve`).
    'pallas_mgpu': Implementation(_pallas_mgpu, pallas_mgpu.Options, ('gpu',)),
    'pallas_tpu': Implementation(_pallas_tpu, pallas_tpu.Options, ('tpu',)),
}
# The fused kernel of each platform ('pallas'): Triton on GPU (on Hopper, Mosaic GPU where it
# applies: `resolve`), Mosaic on TPU; on CPU (tests) the TPU kernel in Pallas interpret mode.
FUSED = {'gpu': 'pallas_gpu', 'tpu': 'pallas_tpu', 'cpu': 'pallas_tpu'}
NAMES = (*IMPLEMENTATIONS, 'pallas', 'auto')  # What T5Config.attention_impl accepts.


def resolve(impl: str, length: int, threshold: int, platform: str | None = None, *,
            input_dtype: Any = None, dtype: Any = None, head_dim: int = 0,
            bidirectional: bool = True) -> str:
  """The implementation (a key of `IMPLEMENTATIONS`) that `impl` stands for.

  'auto' is 'reference' for inputs of at most `threshold` tokens and, above, 'pallas' on GPU and
  TPU, 'blockwise' on CPU. 'pallas' is the platform's fused kernel (`FUSED`); on a Hopper GPU it
  is 'pallas_mgpu' where that kernel applies to the call (`pallas_mgpu.applies`: bfloat16 /
  float16, head dim a multiple of 64, the encoder), which needs the call's facts below (without
  them: `FUSED`).

  Args:
    impl: one of `NAMES`.
    length: the (static) input length.
    threshold: T5Config.blockwise_threshold.
    platform: 'cpu', 'gpu' or 'tpu'; None: `reference.target_platform()` (at trace time: the
      mesh's).
    input_dtype, dtype: the query's dtype and the computation dtype (None: unknown).
    head_dim: the attention head dim (0: unknown).
    bidirectional: the encoder (True) or a causal decoder.
  """
  if impl not in NAMES:
    raise ValueError(f'attention_impl={impl!r}; expected one of {sorted(NAMES)}.')
  platform = platform or reference.target_platform()
  if impl == 'auto':
    impl = 'reference' if length <= threshold else 'blockwise' if platform == 'cpu' else 'pallas'
  if impl == 'pallas':
    if platform not in FUSED:
      raise ValueError(f"attention_impl='pallas': no fused kernel for platform {platform!r} "
                       f'(kernels: {FUSED}); use \'blockwise\'.')
    impl = FUSED[platform]
    if (platform == 'gpu' and input_dtype is not None and dtype is not None and
        pallas_mgpu.applies(reference.target_device_kind(), input_dtype, dtype, head_dim,
                            bidirectional)):
      impl = 'pallas_mgpu'
  return impl


def self_attention(
    query: Array,
    key: Array,
    value: Array,
    *,
    rel_embedding: Array,
    segment_ids: Array,
    temperature: Array | None = None,
    bidirectional: bool = True,
    impl: str = 'reference',
    options: Any = None,
    dtype: Any = jnp.float32,
    float32_logits: bool = False,
    with_stats: bool = False,
    dropout_rng: Array | None = None,
    dropout_rate: float = 0.0,
    offset_map: reference.OffsetMap = reference.OffsetMap(),
) -> tuple[Array, reference.RowStats | None]:
  """Self-attention with T5 relative bias and padding/segment mask by implementation `impl`.

  Every implementation takes the parts (table and ids), never a materialized `[h, L, L]` bias,
  so that long-input implementations can build the bias block by block; all compute
  `softmax((q.k + relpos_bias + mask_bias) / tau)` in float32 (see attention/reference.py).

  Args:
    query, key, value: `[b, l, h, d]`.
    rel_embedding: `[h, num_buckets]` relative-position table.
    segment_ids: int `[b, l]`; 0 marks padding, positions attend within equal ids.
    temperature: softmax temperature, float32 `[1 or b, 1 or h]`: an encoder layer's, taken as it
      is; a direct caller may give None (1), a scalar or `[b]` (`reference.head_temperature`).
    bidirectional: relative buckets for an encoder (True) or a causal decoder (False).
    impl: a key of `IMPLEMENTATIONS` ('reference': materialized, reference.py; 'blockwise':
      blockwise.py; 'pallas_gpu': Triton, pallas_gpu.py; 'pallas_mgpu': Mosaic GPU for Hopper,
      pallas_mgpu.py; 'pallas_tpu': Mosaic, attention/pallas_tpu.py), or 'pallas': the target
      platform's fused kernel (`resolve`).
    options: `IMPLEMENTATIONS[impl].options` instance (tiles, launch parameters); None: its
      defaults.
    dtype: computation dtype.
    float32_logits: compute q.k in float32.
    with_stats: also return per-row P_max and entropy.
    dropout_rng: PRNG key, enables attention dropout (t5x's mask, after the softmax; row
      statistics are the softmax's). The fused kernels refuse it.
    dropout_rate: attention dropout rate.
    offset_map: how offsets are read in the bias table (`reference.OffsetMap`, static: a bias
      rule resolved at this length, `reference.BiasRule.at`); the default is T5 as trained.

  Returns:
    `[b, l, h, d]` output and optional RowStats `[b, h, l]`.
  """
  if impl == 'pallas':
    impl = resolve(impl, query.shape[1], threshold=0, input_dtype=query.dtype, dtype=dtype,
                  head_dim=query.shape[-1], bidirectional=bidirectional)
  if impl not in IMPLEMENTATIONS:
    raise ValueError(f'attention_impl={impl!r}; expected \'pallas\' or one of '
                     f'{sorted(IMPLEMENTATIONS)} (\'auto\': see network.encoder_attention_impl).')
  spec = IMPLEMENTATIONS[impl]
  if options is None:
    options = spec.options() if spec.options else None
  elif not (spec.options and isinstance(options, spec.options)):
    raise ValueError(f'options {options!r} are not those of attention_impl={impl!r} '
                     f'({spec.options.__module__}.Options).' if spec.options else
                     f'options {options!r} given, but attention_impl={impl!r} takes none.')
  return spec.fn(
      query, key, value, options=options, rel_embedding=rel_embedding, segment_ids=segment_ids,
      temperature=temperature, bidirectional=bidirectional, dtype=dtype,
      float32_logits=float32_logits, with_stats=with_stats, dropout_rng=dropout_rng,
      dropout_rate=dropout_rate, offset_map=offset_map)


def spec_for(names: Sequence[str], shape: Sequence[int], mesh: Mesh,
             rules: LogicalRules) -> P:
  """Mesh PartitionSpec for one array; a dimension its mesh axis does not divide is replicated."""
  axes = nn_partitioning.logical_to_mesh_axes(tuple(names), rules)
  dims = []
  for axis, size in zip(axes, shape):
    parts = axis if isinstance(axis, tuple) else (axis,) if axis else ()
    parts = tuple(a for a in parts if a in mesh.shape)
    count = int(np.prod([mesh.shape[a] for a in parts])) if parts else 1
    dims.append(None if count == 1 or size % count else
                (parts[0] if len(parts) == 1 else parts))
  return P(*dims)
