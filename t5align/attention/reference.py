"""Attention math shared by every implementation: T5 relative buckets, temperature, row statistics.

Axis letters used across the project (shape comments and einsums):
  b batch, q query length, k key length, h heads, d head dim, e embed, f mlp, v vocab,
  n layers, t candidate temperatures.

Temperature semantics (the paper's, and the fixtures'):
  probs = softmax((q . k + relpos_bias + mask_bias) / tau), in float32.
NOTE: T5 has no 1/sqrt(d) at run time (it is folded into the query kernel's initializer), so tau
divides the raw sum, relative-position bias included. Masked keys carry -1e10 before the division,
so they keep ~0 probability at any tau > 0; fully masked (padding) query rows stay uniform, as in
t5x.

This module is the math only and imports nothing of t5align's: attention/blockwise.py and
attention/pallas_gpu.py build on it, and layers.py chooses among the three ('reference' here).

Precision: float32 computes in float32. Every dot of the project (the attention implementations,
the fused kernels, the dense layers) takes `precision=dot_precision(...)`: Precision.HIGHEST where
an operand is float32, so that XLA on a GPU does not round it to TF32 (10-bit mantissa, its default
for float32 dots since Ampere), Triton runs its IEEE float32 dot, and a TPU does not take a single
bfloat16 pass. The one opt-in is jax's own setting `jax_default_matmul_precision` (e.g.
`JAX_DEFAULT_MATMUL_PRECISION=tensorfloat32`, or `with jax.default_matmul_precision(...)`): once a
user sets it, every dot takes jax's default, i.e. that setting. bfloat16 dots are unchanged.

Row statistics from flash-attention accumulators: with s = logits / tau, m = max s,
l = sum exp(s - m), w = sum exp(s - m) * s over keys, each probability is p = exp(s - m) / l, so
  P_max = exp(m - m) / l = 1 / l,
  H = -sum p log p = -sum p (s - m - log l) = -w / l + m + log l    (sum p = 1).
"""
from __future__ import annotations

import dataclasses
import fractions
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

NUM_BUCKETS = 32
MAX_DISTANCE = 128
MASK_VALUE = -1e10  # t5x's additive mask value.


class RowStats(NamedTuple):
  """Per-row softmax statistics, float32, shape `[batch, heads, q_len]` each."""

  pmax: Array
  entropy: Array


def dot_precision(*operands: Array | jax.ShapeDtypeStruct) -> jax.lax.Precision | None:
  """`precision` of a dot over `operands` under the float32 contract (module docstring).

  Precision.HIGHEST where an operand is float32 and the user has not set jax's
  `jax_default_matmul_precision`; else None (jax's default: that setting, or the platform's).
  Read at trace time: the setting is part of jit's cache key, so changing it retraces.
  """
  if jax.config.jax_default_matmul_precision is not None:
    return None
  if any(jnp.dtype(x.dtype) == jnp.float32 for x in operands):
    return jax.lax.Precision.HIGHEST
  return None


def target_platform() -> str:
  """The platform the code being traced runs on: that of the mesh set with `jax.set_mesh` (as
  `partitioning.partition` does), else jax's default backend ('cpu', 'gpu', 'tpu').

  A deviceless compile for a TPU topology (`t5align.preflight`) runs on a CPU host under a mesh
  of TPU devices: tile sizes and kernels chosen here are then the TPU's.
  """
  device = jax.sharding.get_abstract_mesh().abstract_device
  platform = device.platform if device is not None else jax.default_backend()
  return {'cuda': 'gpu', 'rocm': 'gpu'}.get(platform, platform)


def target_device_kind() -> str:
  """The kind of device the code being traced runs on ('NVIDIA H100 80GB HBM3', 'TPU v5 lite',
  'cpu'): the abstract device of the mesh set with `jax.set_mesh`, else jax's first device."""
  device = jax.sharding.get_abstract_mesh().abstract_device
  return device.device_kind if device is not None else jax.devices()[0].device_kind


def relative_position_bucket(
    relative_position: Array | np.ndarray,
    bidirectional: bool = True,
    num_buckets: int = NUM_BUCKETS,
    max_distance: int = MAX_DISTANCE,
) -> Array | np.ndarray:
  """Maps `key_pos - query_pos` to T5's relative-position bucket (int32, same shape).

  Half the buckets (per side when bidirectional) are exact offsets; the rest are log-spaced up to
  `max_distance`, beyond which every offset shares the last bucket of its side.

  A `jax.Array` (or tracer) is bucketed with jnp; anything else (numpy arrays, Python ints) with
  numpy on the host, returning numpy: tables of static offsets are then built without running
  a device computation while tracing, which compiling for abstract devices (a TPU topology with
  no TPU, `t5align.preflight`) cannot do. Both give the same buckets
  (`attention_test.test_numpy_and_jax_buckets_agree`).
  """
  xp = jnp if isinstance(relative_position, jax.Array) else np
  n = -xp.asarray(relative_position, xp.int32)
  bucket = xp.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    bucket = bucket + (n < 0).astype(xp.int32) * num_buckets
    n = xp.abs(n)
  else:
    n = xp.maximum(n, 0)
  max_exact = num_buckets // 2
  # NOTE: float32 arithmetic, as t5x computes it, so boundary offsets fall in the same bucket
  # (numpy's float32 and XLA's agree on every offset: test_buckets_match_t5x_fixture).
  scale = np.float32((num_buckets - max_exact) / np.log(max_distance / max_exact))
  log_ratio = xp.log(n.astype(xp.float32) / max_exact + np.finfo(np.float32).eps)
  large = max_exact + (log_ratio * scale).astype(xp.int32)
  large = xp.minimum(large, num_buckets - 1)
  return bucket + xp.where(n < max_exact, n, large)


BIAS_RULES = ('none', 'interpolate', 'extend')


@dataclasses.dataclass(frozen=True)
class OffsetMap:
  """How the encoder reads its trained bucket table at one input length: static and hashable,
  what every attention implementation takes (`offset_map=`); `BiasRule.at` makes it.

  Attributes:
    interpolation: s in (0, 1]; offset d is read as `round(d * s)` (half away from zero) before
      it is bucketed: position interpolation for an additive relative bias (ALiBi's,
      Al-Khateeb et al. 2023, arXiv:2310.13017), on T5's buckets.
    extension: e >= 1; T5's logarithmic buckets spread over `max_distance = round(128 * e)`
      instead of 128 (HF's `relative_attention_max_distance`), the far bucket starting later.

  `OffsetMap()` (1, 1) is T5 as trained. Beyond `far` every offset is in the last bucket of its
  side, so an implementation needs the table's lookup only in the band `|offset| < far`.
  """

  interpolation: float = 1.0
  extension: float = 1.0

  def __post_init__(self):
    for name, value, ok, wanted in (
        ('interpolation', self.interpolation, lambda v: 0.0 < v <= 1.0, 'in (0, 1]'),
        ('extension', self.extension, lambda v: v >= 1.0, '>= 1')):
      if (isinstance(value, bool) or not isinstance(value, (int, float))
          or not math.isfinite(value) or not ok(value)):
        raise ValueError(f'OffsetMap.{name}={value!r}: expected a finite number {wanted}.')
      object.__setattr__(self, name, float(value))

  @property
  def is_identity(self) -> bool:
    return self.interpolation == 1.0 and self.extension == 1.0

  @property
  def max_distance(self) -> int:
    """The bucketing's `max_distance`: 128 stretched by `extension`."""
    return max(MAX_DISTANCE, round(MAX_DISTANCE * self.extension))

  def scaled(self, offsets: np.ndarray) -> np.ndarray:
    """`round(d * s)` of int offsets, half away from zero, exactly: s is read as the fraction
    p / q nearest it with q <= 10^6 (L_tr / L itself for a rule resolved from the lengths; 3/10
    for 0.3), so that halves round the same on every platform."""
    d = np.asarray(offsets, np.int64)
    if self.interpolation == 1.0:
      return d
    s = fractions.Fraction(self.interpolation).limit_denominator(10 ** 6)
    p, q = s.numerator, s.denominator
    return np.sign(d) * ((2 * np.abs(d) * p + q) // (2 * q))

  @property
  def far(self) -> int:
    """F, the band's half-width: the least F with `round(F * s) >= max_distance`, so every
    offset `|d| >= F` is in the last bucket of its side (128 for T5 as trained)."""
    md = self.max_distance
    f = math.ceil(md / self.interpolation)
    while f > 1 and self.scaled(np.asarray([f - 1]))[0] >= md:
      f -= 1
    while self.scaled(np.asarray([f]))[0] < md:
      f += 1
    return f

  def buckets(self, offsets: np.ndarray, bidirectional: bool,
              num_buckets: int = NUM_BUCKETS) -> np.ndarray:
    """The bucket of each int offset `key - query` under this map (host numpy, int32)."""
    scaled = self.scaled(offsets).clip(-self.max_distance, self.max_distance).astype(np.int32)
    return relative_position_bucket(scaled, bidirectional, num_buckets, self.max_distance)


@dataclasses.dataclass(frozen=True)
class BiasRule:
  """A relative-bias rule of the encoder, resolved per input length (`at`): T5's trained table
  is read differently, its parameters unchanged. The decoder is never touched.

  Attributes:
    kind: 'none' (T5 as trained), 'interpolate' (`OffsetMap.interpolation`) or 'extend'
      (`OffsetMap.extension`).
    scale: the rule's s ('interpolate', in (0, 1]) or e ('extend', >= 1), used at every length;
      None: from the lengths, s = L_tr / L and e = L / L_tr for inputs longer than
      `reference_length` (T5 as trained at and below it).
    reference_length: L_tr, for `scale=None` (a model's fact: gin binds it for every kind; a
      given scale is used as it is).
  """

  kind: str = 'none'
  scale: float | None = None
  reference_length: int | None = None

  def __post_init__(self):
    if self.kind not in BIAS_RULES:
      raise ValueError(f'BiasRule.kind={self.kind!r}: expected one of {BIAS_RULES}.')
    value = self.reference_length
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 2):
      raise ValueError(f'BiasRule.reference_length={value!r}: expected L_tr, an int >= 2.')
    if self.kind == 'none':
      if self.scale is not None:
        raise ValueError(f"BiasRule(kind='none') takes no scale; got scale={self.scale!r}.")
      # T5's bias has no L_tr: one 'none' rule, whatever length gin binds (run records compare
      # it).
      object.__setattr__(self, 'reference_length', None)
      return
    if self.scale is not None:
      self.at(0)  # Checks the scale (OffsetMap's range for the kind).
      object.__setattr__(self, 'scale', float(self.scale))
    elif value is None:
      raise ValueError(f'BiasRule(kind={self.kind!r}) has scale=None and reference_length=None: '
                       'give L_tr (the scale then follows the lengths) or a scale.')

  def at(self, length: int) -> OffsetMap:
    """The rule's `OffsetMap` for inputs `length` tokens wide."""
    if self.kind == 'none':
      return OffsetMap()
    if self.scale is not None:
      factor = self.scale
    elif length <= self.reference_length:
      return OffsetMap()
    else:
      factor = (self.reference_length / length if self.kind == 'interpolate'
                else length / self.reference_length)
    try:
      return (OffsetMap(interpolation=factor) if self.kind == 'interpolate'
              else OffsetMap(extension=factor))
    except ValueError as e:
      raise ValueError(f'BiasRule(kind={self.kind!r}).scale={self.scale!r}: {e}') from None

  def fixed_at(self, length: int) -> BiasRule:
    """This rule as it is at inputs of `length` tokens, for every width: its scale at `length`
    given explicitly (T5's bias, kind 'none', where it is the identity there). A job that knows
    its inputs' length resolves there once, so that a batch's padding does not move L."""
    offset_map = self.at(length)
    if offset_map.is_identity:
      return BiasRule()
    scale = offset_map.interpolation if self.kind == 'interpolate' else offset_map.extension
    return BiasRule(self.kind, scale=scale)

  def describe(self) -> str:
    """'none', 'interpolate (s = L_tr / L, L_tr = 256)', 'extend (e = 4)'."""
    if self.kind == 'none':
      return 'none'
    letter = 's' if self.kind == 'interpolate' else 'e'
    if self.scale is not None:
      return f'{self.kind} ({letter} = {self.scale:g})'
    ratio = 'L_tr / L' if self.kind == 'interpolate' else 'L / L_tr'
    return f'{self.kind} ({letter} = {ratio}, L_tr = {self.reference_length})'


@functools.lru_cache(maxsize=None)
def offset_buckets(bidirectional: bool, num_buckets: int = NUM_BUCKETS,
                   offset_map: OffsetMap = OffsetMap()) -> np.ndarray:
  """Host-side bucket of every clipped offset: int32 `[2 * F + 1]` (F = `offset_map.far`),
  entry `o + F` for offset `o = key - query` in `[-F, F]`."""
  far = offset_map.far
  out = offset_map.buckets(np.arange(-far, far + 1), bidirectional, num_buckets)
  out.setflags(write=False)
  return out


def bucket_steps(bidirectional: bool, num_buckets: int = NUM_BUCKETS,
                 offset_map: OffsetMap = OffsetMap()) -> tuple[tuple[int, int], ...]:
  """`((offset, bucket), ...)`: the bucket as a step function of the offset (host numpy), for
  kernels without a gather: the first entry's bucket holds from the most negative offset on,
  each later one from its offset on (ascending). Offsets beyond `offset_map.far` keep the last
  entry of their side."""
  far = offset_map.far
  buckets = offset_buckets(bidirectional, num_buckets, offset_map)  # [2 * far + 1]
  steps = [(-(2 ** 31) + 1, int(buckets[0]))]
  for i in range(1, len(buckets)):
    if buckets[i] != buckets[i - 1]:
      steps.append((i - far, int(buckets[i])))
  return tuple(steps)


def bias_by_offset(rel_embedding: Array, bidirectional: bool,
                   offset_map: OffsetMap = OffsetMap()) -> Array:
  """The bias of every clipped offset: `[heads, 2 * F + 1]` (F = `offset_map.far`), column
  `o + F` holding offset `o = key - query` in `[-F, F]`.

  Every offset with `|o| >= F` falls in the last bucket of its side
  (`relative_position_bucket`, `OffsetMap.far`; `test_bias_by_offset_covers_every_offset` checks
  it), so `bias(o) = bias_by_offset[:, clip(o, -F, F) + F]` exactly.
  """
  # [h, num_buckets] -> [h, 2 * F + 1]
  return jnp.take(rel_embedding, offset_buckets(bidirectional, rel_embedding.shape[-1],
                                                offset_map), axis=1)


def offset_index(q_pos: Array, k_pos: Array, far: int = MAX_DISTANCE) -> Array:
  """Column of `bias_by_offset` (half-width `far`) for each (query, key): int32 `[q, k]` from
  `[q]`, `[k]`."""
  offsets = k_pos[None, :] - q_pos[:, None]
  return jnp.clip(offsets, -far, far) + far


def relative_position_bias(
    rel_embedding: Array, q_len: int, k_len: int, bidirectional: bool, q_offset: int = 0,
    offset_map: OffsetMap = OffsetMap(),
) -> Array:
  """Materialized relative-position bias.

  Args:
    rel_embedding: `[heads, num_buckets]` table.
    q_len: number of query positions, starting at position `q_offset`.
    k_len: number of key positions, starting at 0.
    bidirectional: encoder (True) or causal decoder (False) bucketing.
    q_offset: position of the first query.
    offset_map: how offsets are read (`OffsetMap`; the default: T5 as trained).

  Returns:
    `[1, heads, q_len, k_len]` bias in the table's dtype.
  """
  # NOTE: positions pass through an optimization barrier so that XLA cannot constant-fold the
  # [q, k] offsets (and what follows) at compile time: at 4k tokens that folding took minutes.
  q_pos, k_pos = jax.lax.optimization_barrier(
      (jnp.arange(q_len, dtype=jnp.int32) + q_offset, jnp.arange(k_len, dtype=jnp.int32)))
  # [h, 2 * F + 1] -> [h, q, k]
  bias = jnp.take(bias_by_offset(rel_embedding, bidirectional, offset_map),
                  offset_index(q_pos, k_pos, offset_map.far), axis=1)
  return bias[None]


def mask_from_ids(q_ids: Array, k_ids: Array) -> Array:
  """Attention mask from segment ids (0 = padding): `[b, q]`, `[b, k]` -> bool `[b, 1, q, k]`."""
  allowed = (q_ids[:, :, None] == k_ids[:, None, :]) & (q_ids[:, :, None] > 0)
  return (allowed & (k_ids[:, None, :] > 0))[:, None]


def head_temperature(temperature: Array | float | None, batch: int, heads: int) -> Array:
  """The temperature of one attention layer as every implementation takes it: float32
  `[1 or batch, 1 or heads]`.

  The encoder's layers pass that form already (their slice of `network.layer_temperatures`'
  `[1 or b, layers, 1 or h]`, checked there), so a 2-D value is returned as it is, not checked
  again (a direct caller's must be `[1 or batch, 1 or heads]`). Direct callers may also pass None
  (1.0), a scalar or a `[batch]` vector (one per example): `[1 or batch, 1]`.
  """
  if temperature is None:
    return jnp.ones((1, 1), jnp.float32)
  tau = jnp.asarray(temperature, jnp.float32)
  if tau.ndim == 2:
    return tau
  if tau.ndim > 2 or tau.size not in (1, batch):
    raise ValueError(f'temperature of shape {tau.shape}: expected [1 or batch={batch}, 1 or '
                     f'heads={heads}], a scalar or a [batch] vector.')
  return tau.reshape(-1, 1)  # [] or [b] -> [1 or b, 1]


def softmax_with_stats(
    logits: Array, temperature: Array, with_stats: bool
) -> tuple[Array, RowStats | None]:
  """Tempered float32 softmax over the last axis.

  Args:
    logits: `[b, h, q, k]` raw logits (q.k + bias + mask bias).
    temperature: float32 `[1 or b, 1 or h]` (see `head_temperature`).
    with_stats: also return per-row P_max and entropy.

  Returns:
    float32 probabilities `[b, h, q, k]` and optional RowStats of `[b, h, q]`.
  """
  logits = logits.astype(jnp.float32)
  # NOTE: the row max is subtracted before dividing by tau (max commutes with a positive scale),
  # so every value below is <= 0 and small. Dividing first leaves ~-1e10 / tau on masked keys,
  # and XLA's fused exp/sum of fully masked (padding) rows then produced NaN at some taus.
  # [b, h, q, k], shifted so each row's max is 0.
  s = (logits - jnp.max(logits, axis=-1, keepdims=True)) / temperature[:, :, None, None]
  e = jnp.exp(s)
  l = jnp.sum(e, axis=-1, keepdims=True)
  probs = e / l
  if not with_stats:
    return probs, None
  # With m = 0: P_max = 1 / l and H = log l - w / l, w = sum e * s (masked keys: e = 0 exactly).
  w = jnp.sum(e * s, axis=-1, keepdims=True)
  stats = RowStats(pmax=(1.0 / l)[..., 0], entropy=(jnp.log(l) - w / l)[..., 0])
  return probs, stats


def dropout_multiplier(
    dropout_rng: Array, dropout_rate: float, probs_shape: tuple[int, ...], dtype: jnp.dtype
) -> Array:
  """t5x's attention-dropout multiplier `keep / keep_prob`, `[b, h, 1, k]` in `dtype`.

  Exactly t5x/examples/t5/layers.py's draw: one `jax.random.bernoulli(dropout_rng, 1 - rate,
  [b, h, 1, k])`, broadcast over the query axis (T5's "broadcast_dropout"), so every
  implementation that takes the same rng drops the same keys; being `O(b h k)`, long-input
  implementations slice it per key block instead of drawing per block.

  Args:
    dropout_rng: PRNG key (the attention module's `make_rng('dropout')`).
    dropout_rate: probability of dropping an attention weight, in (0, 1).
    probs_shape: `[b, h, q, k]` shape of the attention probabilities.
    dtype: dtype of the probabilities the multiplier scales.
  """
  keep_prob = 1.0 - dropout_rate
  keep_shape = tuple(probs_shape[:-2]) + (1,) + tuple(probs_shape[-1:])
  keep = jax.random.bernoulli(dropout_rng, keep_prob, keep_shape)
  return keep.astype(dtype) / jnp.asarray(keep_prob, dtype)


def dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    bias: Array | None = None,
    *,
    temperature: Array | None = None,
    dtype: jnp.dtype = jnp.float32,
    float32_logits: bool = False,
    dropout_rng: Array | None = None,
    dropout_rate: float = 0.0,
    with_stats: bool = False,
    kv_layout: str = 'bkhd',
) -> tuple[Array, RowStats | None]:
  """Materialized ('reference') attention.

  Args:
    query: `[b, q, h, d]`.
    key: `[b, k, h, d]`, or `[b, h, d, k]` with `kv_layout='bhdk'`.
    value: as `key`.
    bias: additive bias broadcastable to `[b, h, q, k]` (relative position + mask).
    temperature: per example and head, broadcastable to `[b, h]` (see `head_temperature`);
      None for 1.
    dtype: dtype of the probabilities used against `value`.
    float32_logits: compute q.k in float32 (t5x's `float32_attention_logits`).
    dropout_rng: PRNG key, enables attention dropout (training only).
    dropout_rate: dropout rate.
    with_stats: also return per-row statistics.
    kv_layout: 'bkhd' or 'bhdk', the axes of `key` and `value` ('bhdk': a decoder's cached
      cross-attention keys/values, laid out as the dots read them).

  Returns:
    `[b, q, h, d]` output and optional RowStats.
  """
  if kv_layout not in ('bkhd', 'bhdk'):
    raise ValueError(f"kv_layout={kv_layout!r}: expected 'bkhd' or 'bhdk'.")
  if float32_logits:
    query, key = query.astype(jnp.float32), key.astype(jnp.float32)
  # [b, q, h, d] x [b, k, h, d] (or [b, h, d, k]) -> [b, h, q, k]
  logits = jnp.einsum(f'bqhd,{kv_layout}->bhqk', query, key,
                      precision=dot_precision(query, key)).astype(jnp.float32)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  tau = head_temperature(temperature, query.shape[0], query.shape[2])
  probs, stats = softmax_with_stats(logits, tau, with_stats)
  probs = probs.astype(dtype)
  if dropout_rng is not None and dropout_rate > 0.0:
    # [b, h, 1, k] -> [b, h, q, k]
    probs = probs * dropout_multiplier(dropout_rng, dropout_rate, probs.shape, dtype)
  # [b, h, q, k] x [b, k, h, d] (or [b, h, d, k]) -> [b, q, h, d]
  return jnp.einsum(f'bhqk,{kv_layout}->bqhd', probs, value,
                    precision=dot_precision(probs, value)), stats


def reference_self_attention(
    query: Array,
    key: Array,
    value: Array,
    *,
    rel_embedding: Array,
    segment_ids: Array,
    temperature: Array | None = None,
    bidirectional: bool = True,
    dtype: jnp.dtype = jnp.float32,
    float32_logits: bool = False,
    with_stats: bool = False,
    dropout_rng: Array | None = None,
    dropout_rate: float = 0.0,
    offset_map: OffsetMap = OffsetMap(),
) -> tuple[Array, RowStats | None]:
  """Self-attention with T5 relative bias and padding/segment mask, `[L, L]` materialized.

  The 'reference' implementation (see `dispatch.self_attention` for the others, which take the
  same parts: table and ids, never a materialized bias).

  Args:
    query: `[b, l, h, d]`.
    key: `[b, l, h, d]`.
    value: `[b, l, h, d]`.
    rel_embedding: `[h, num_buckets]` relative-position table.
    segment_ids: int `[b, l]`; 0 marks padding, positions attend within equal ids.
    temperature: softmax temperature per example and head, broadcastable to `[b, h]`
      (`head_temperature`); None for 1.
    bidirectional: relative buckets for an encoder (True) or a causal decoder (False).
    dtype: computation dtype.
    float32_logits: compute q.k in float32.
    with_stats: also return per-row P_max and entropy.
    dropout_rng: PRNG key, enables attention dropout (training): the probabilities are multiplied
      by `dropout_multiplier(dropout_rng, dropout_rate, ...)`, t5x's mask, after the softmax;
      row statistics are those of the softmax, before dropout.
    dropout_rate: attention dropout rate.
    offset_map: how offsets are read in the bias table (`OffsetMap`; the default: as trained).

  Returns:
    `[b, l, h, d]` output and optional RowStats `[b, h, l]`.
  """
  length = query.shape[1]
  # [1, h, l, l]
  bias = relative_position_bias(rel_embedding.astype(jnp.float32), length, length, bidirectional,
                                offset_map=offset_map)
  if not bidirectional:
    positions = jax.lax.optimization_barrier(jnp.arange(length, dtype=jnp.int32))
    causal = positions[None, :] <= positions[:, None]  # [l, l]
    mask = mask_from_ids(segment_ids, segment_ids) & causal
  else:
    mask = mask_from_ids(segment_ids, segment_ids)
  # [b, 1, l, l] + [1, h, l, l] -> [b, h, l, l]
  bias = jnp.where(mask, 0.0, MASK_VALUE) + bias
  return dot_product_attention(
      query, key, value, bias, temperature=temperature, dtype=dtype,
      float32_logits=float32_logits, with_stats=with_stats, dropout_rng=dropout_rng,
      dropout_rate=dropout_rate)
