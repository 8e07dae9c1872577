"""Building blocks: dense, embedding, RMS norm, MLP, relative bias and attention (no T5 wiring).

Parameter names, shapes and logical axes follow t5x/examples/t5/layers.py so that T5X checkpoints
and t5x's PjitPartitioner work unchanged. Axis letters: see attention/reference.py.

The attention math and the choice of implementation live in attention/ (`dispatch.self_attention`
is what `MultiHeadDotProductAttention` calls); this module wires them into flax modules.
"""
from __future__ import annotations

import functools
import operator
from typing import Any, Callable, Sequence

from flax import linen as nn
from flax.linen import partitioning as nn_partitioning
import jax
import jax.numpy as jnp
import numpy as np

from t5align.attention import dispatch
from t5align.attention import reference

Array = jax.Array
Initializer = Callable[..., Array]
param_with_axes = nn_partitioning.param_with_axes
with_sharding_constraint = nn_partitioning.with_sharding_constraint


class DenseGeneral(nn.Module):
  """Bias-free linear map over `axis`; the kernel is stored 2-D `[in, out]` in float32."""

  features: int | Sequence[int]
  axis: int | Sequence[int] = -1
  dtype: Any = jnp.float32
  kernel_init: Initializer = nn.initializers.variance_scaling(1.0, 'fan_in', 'truncated_normal')
  kernel_axes: tuple[str, ...] = ()

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
    axis = (self.axis,) if isinstance(self.axis, int) else tuple(self.axis)
    inputs = jnp.asarray(inputs, self.dtype)
    axis = tuple(a % inputs.ndim for a in axis)
    in_shape = tuple(inputs.shape[a] for a in axis)
    kernel = param_with_axes(
        'kernel', self.kernel_init, (int(np.prod(in_shape)), int(np.prod(features))),
        jnp.float32, axes=self.kernel_axes)
    # [in, out] -> [*in_shape, *features]
    kernel = jnp.asarray(kernel, self.dtype).reshape(in_shape + features)
    contract = tuple(range(len(axis)))
    return jax.lax.dot_general(inputs, kernel, ((axis, contract), ((), ())),
                               precision=reference.dot_precision(inputs, kernel))


class Embed(nn.Module):
  """Token embedding `[vocab, embed]`, also used (transposed) for tied output logits."""

  num_embeddings: int
  features: int
  dtype: Any = jnp.float32
  attend_dtype: Any = None
  embedding_init: Initializer = nn.initializers.normal(stddev=1.0)

  def setup(self):
    self.embedding = param_with_axes(
        'embedding', self.embedding_init, (self.num_embeddings, self.features), jnp.float32,
        axes=('vocab', 'embed'), module=self)

  def __call__(self, inputs: Array) -> Array:
    if not jnp.issubdtype(inputs.dtype, jnp.integer):
      raise ValueError(f'Embed expects integer token ids, got {inputs.dtype}.')
    # NOTE: a gather rather than t5x's one-hot matmul: the one-hot is [b, l, vocab], which at
    # 32k tokens x 32k vocab would dwarf everything else. The result is identical.
    # [b, l] -> [b, l, e]
    output = jnp.take(jnp.asarray(self.embedding, self.dtype), inputs, axis=0)
    return with_sharding_constraint(output, ('batch', 'length', 'embed'))

  def attend(self, query: Array) -> Array:
    """`[..., e]` -> `[..., vocab]` inner products with every embedding."""
    dtype = self.attend_dtype or self.dtype
    embedding = jnp.asarray(self.embedding, dtype)  # [vocab, e]
    return jnp.dot(query, embedding.T, precision=reference.dot_precision(query, embedding))


class LayerNorm(nn.Module):
  """T5 RMS norm (no mean subtraction, no bias), statistics in float32."""

  epsilon: float = 1e-6
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = jnp.asarray(x, jnp.float32)
    mean2 = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    y = jnp.asarray(x * jax.lax.rsqrt(mean2 + self.epsilon), self.dtype)
    scale = param_with_axes(
        'scale', nn.initializers.ones, (x.shape[-1],), jnp.float32, axes=('embed',))
    return y * jnp.asarray(scale, self.dtype)


def _activation(name: str) -> Callable[[Array], Array]:
  if name == 'linear':
    return lambda x: x
  fn = getattr(nn, name, None)
  if not callable(fn):
    raise ValueError(f'mlp_activations: unknown activation {name!r} (a flax.linen function or '
                     "'linear').")
  return fn


class MlpBlock(nn.Module):
  """Feed-forward block: ('relu',) is T5 1.0's, ('gelu', 'linear') is gated-gelu (T5 1.1),
  ('silu', 'linear') gated-SiLU (UL2; HF's feed_forward_proj 'gated-silu').

  Each activation applies to its own `wi_i` projection, in `dtype`; the gated forms multiply them.
  """

  intermediate_dim: int = 2048
  activations: Sequence[str] = ('relu',)
  intermediate_dropout_rate: float = 0.1
  dtype: Any = jnp.float32
  kernel_init: Initializer = nn.initializers.variance_scaling(1.0, 'fan_in', 'truncated_normal')

  @nn.compact
  def __call__(self, inputs: Array, deterministic: bool = False) -> Array:
    hidden = []
    for i, name in enumerate(self.activations):
      dense_name = 'wi' if len(self.activations) == 1 else f'wi_{i}'
      # [b, l, e] -> [b, l, f]
      x = DenseGeneral(self.intermediate_dim, dtype=self.dtype, kernel_init=self.kernel_init,
                       kernel_axes=('embed', 'mlp'), name=dense_name)(inputs)
      hidden.append(_activation(name)(x))
    x = functools.reduce(operator.mul, hidden)
    x = nn.Dropout(rate=self.intermediate_dropout_rate, broadcast_dims=(-2,))(
        x, deterministic=deterministic)
    x = with_sharding_constraint(x, ('batch', 'length', 'mlp'))
    # [b, l, f] -> [b, l, e]
    return DenseGeneral(inputs.shape[-1], dtype=self.dtype, kernel_init=self.kernel_init,
                        kernel_axes=('mlp', 'embed'), name='wo')(x)


class RelativePositionBiases(nn.Module):
  """The `[heads, num_buckets]` relative-position table, shared by all layers of a stack."""

  num_buckets: int
  max_distance: int
  num_heads: int
  dtype: Any
  embedding_init: Initializer = nn.initializers.variance_scaling(1.0, 'fan_avg', 'uniform')

  def setup(self):
    self.rel_embedding = param_with_axes(
        'rel_embedding', self.embedding_init, (self.num_heads, self.num_buckets), jnp.float32,
        axes=('heads', 'relpos_buckets'), module=self)

  def table(self) -> Array:
    """`[heads, num_buckets]` float32 table (kept in float32: it feeds the float32 softmax)."""
    return jnp.asarray(self.rel_embedding, jnp.float32)

  def __call__(self, q_len: int, k_len: int, bidirectional: bool = True) -> Array:
    """Materialized bias `[1, heads, q_len, k_len]` in `dtype`."""
    bias = reference.relative_position_bias(self.table(), q_len, k_len, bidirectional)
    return bias.astype(self.dtype)


class MultiHeadDotProductAttention(nn.Module):
  """Multi-head attention with t5x's parameters and decode cache.

  Two call forms:
  - t5x form (decoder self-attention, cross-attention): `mask` and `bias` as arrays, optional
    autoregressive cache with `decode=True` (self-attention), or `cache_kv=True`
    (cross-attention: the projected keys/values of `inputs_kv` kept in the 'cache' collection).
  - structured self-attention (encoder): `rel_embedding` + `segment_ids` (+ `temperature`, float32
    `[1 or b, 1 or h]`: the layer's slice of `network.layer_temperatures`, passed on as it is);
    the bias is built by the chosen `attention_impl`, and per-row statistics are sown into the
    'intermediates' collection when it is mutable.
  """

  num_heads: int
  head_dim: int
  dtype: Any = jnp.float32
  dropout_rate: float = 0.0
  kernel_init: Initializer = nn.initializers.variance_scaling(1.0, 'fan_in', 'normal')
  float32_logits: bool = False
  attention_impl: str = 'reference'
  # The options object of `attention_impl` (`dispatch.IMPLEMENTATIONS[...].options`: tiles, launch
  # parameters); None: its defaults.
  options: Any = None
  # How the encoder's self-attention reads the bias table (`reference.OffsetMap`, static).
  offset_map: reference.OffsetMap = reference.OffsetMap()

  @nn.compact
  def __call__(
      self,
      inputs_q: Array,
      inputs_kv: Array,
      mask: Array | None = None,
      bias: Array | None = None,
      *,
      decode: bool = False,
      deterministic: bool = False,
      rel_embedding: Array | None = None,
      segment_ids: Array | None = None,
      temperature: Array | None = None,
      cache_kv: bool = False,
  ) -> Array:
    """`[b, q, e]` queries and `[b, k, e]` keys/values -> `[b, q, e]`.

    `cache_kv=True` (cross-attention while decoding) reads the keys/values from 'cache'
    ('cached_cross_key' / 'cached_cross_value', `[b, h, d, k]`: the layout the per-step dots
    read, so no step transposes them) when they are there and then
    ignores `inputs_kv`; otherwise it projects `inputs_kv` and, if 'cache' is mutable, stores
    them, so they are projected once per input rather than once per generated token.
    """
    projection = functools.partial(
        DenseGeneral, axis=-1, features=(self.num_heads, self.head_dim),
        kernel_axes=('embed', 'joined_kv'), dtype=self.dtype)
    # NOTE: T5 folds 1/sqrt(head_dim) into the query initializer; nothing rescales at run time.
    depth_scaling = jnp.sqrt(self.head_dim).astype(self.dtype)
    query_init = lambda *args: self.kernel_init(*args) / depth_scaling
    # [b, l, e] -> [b, l, h, d]
    query = projection(kernel_init=query_init, name='query')(inputs_q)
    query = with_sharding_constraint(query, ('batch', 'length', 'heads', 'kv'))
    if cache_kv and self.has_variable('cache', 'cached_cross_key'):
      # [b, h, d, k], projected once after encoding.
      key = self.get_variable('cache', 'cached_cross_key')
      value = self.get_variable('cache', 'cached_cross_value')
      kv_layout = 'bhdk'
    else:
      kv_layout = 'bkhd'
      key = projection(kernel_init=self.kernel_init, name='key')(inputs_kv)
      value = projection(kernel_init=self.kernel_init, name='value')(inputs_kv)
      key = with_sharding_constraint(key, ('batch', 'length', 'heads', 'kv'))
      value = with_sharding_constraint(value, ('batch', 'length', 'heads', 'kv'))
      if cache_kv and self.is_mutable_collection('cache') and not self.is_initializing():
        # [b, k, h, d] -> [b, h, d, k]
        self.put_variable('cache', 'cached_cross_key', jnp.moveaxis(key, -3, -1))
        self.put_variable('cache', 'cached_cross_value', jnp.moveaxis(value, -3, -1))

    # As t5x: one 'dropout' rng per call of this module, only when dropout is on.
    dropout_rng = None
    if not deterministic and self.dropout_rate > 0.0:
      dropout_rng = self.make_rng('dropout')
    if rel_embedding is not None:
      x = self._structured(query, key, value, rel_embedding, segment_ids, temperature,
                           dropout_rng)
    else:
      if decode:
        key, value, mask, bias = self._update_cache(query, key, value, mask, bias)
      attention_bias = None
      if mask is not None:
        attention_bias = jnp.where(mask > 0, 0.0, reference.MASK_VALUE).astype(self.dtype)
      if bias is not None:
        attention_bias = bias if attention_bias is None else attention_bias + bias
      x, _ = reference.dot_product_attention(
          query, key, value, attention_bias, dtype=self.dtype, float32_logits=self.float32_logits,
          dropout_rng=dropout_rng, dropout_rate=self.dropout_rate, kv_layout=kv_layout)

    # [b, q, h, d] -> [b, q, e]
    return DenseGeneral(
        features=inputs_q.shape[-1], axis=(-2, -1), kernel_init=self.kernel_init,
        kernel_axes=('joined_kv', 'embed'), dtype=self.dtype, name='out')(x)

  def _structured(self, query, key, value, rel_embedding, segment_ids, temperature, dropout_rng):
    """Encoder self-attention through `self_attention`; sows row statistics.

    Attention dropout (when `dropout_rng` is given) is t5x's, in every implementation that
    supports it ('pallas' refuses it); the sown statistics are the softmax's, before dropout.
    """
    # NOTE: nothing is sown while initializing, so `init` returns only params (and params_axes),
    # which t5x's train state expects.
    with_stats = self.is_mutable_collection('intermediates') and not self.is_initializing()
    if self.is_mutable_collection('attention_inputs') and not self.is_initializing():
      self.sow('attention_inputs', 'projected_query', query)
      self.sow('attention_inputs', 'projected_key', key)
    x, stats = dispatch.self_attention(
        query, key, value, rel_embedding=rel_embedding, segment_ids=segment_ids,
        temperature=temperature, impl=self.attention_impl, dtype=self.dtype,
        float32_logits=self.float32_logits, with_stats=with_stats, dropout_rng=dropout_rng,
        dropout_rate=self.dropout_rate, options=self.options, offset_map=self.offset_map)
    if with_stats:
      # [b, 1, l] valid query rows. Padding rows (uniform by construction) are excluded with a
      # select, not a product, so whatever they hold cannot leak into the sums.
      valid = (segment_ids > 0)[:, None, :]
      masked_sum = lambda x: jnp.sum(jnp.where(valid, x, 0.0), axis=-1)  # [b, h, l] -> [b, h]
      self.sow('intermediates', 'row_stats', {
          'pmax_sum': masked_sum(stats.pmax),
          'entropy_sum': masked_sum(stats.entropy),
          'rows': jnp.sum(valid[:, 0], axis=-1, dtype=jnp.float32),  # [b]
      })
    return x

  def _update_cache(self, query, key, value, mask, bias):
    """t5x's autoregressive cache: keys/values stored `[b, h, d, max_len]`, one step at a time."""
    is_initialized = self.has_variable('cache', 'cached_key')
    swap = lambda s: s[:-3] + (s[-2], s[-1], s[-3])
    cached_key = self.variable('cache', 'cached_key', jnp.zeros, swap(key.shape), key.dtype)
    cached_value = self.variable('cache', 'cached_value', jnp.zeros, swap(value.shape),
                                 value.dtype)
    cache_index = self.variable('cache', 'cache_index', lambda: jnp.array(0, jnp.int32))
    if not is_initialized:
      return key, value, mask, bias
    batch, heads, depth, length = cached_key.value.shape
    if query.shape != (batch, 1, heads, depth):
      raise ValueError(f'Autoregressive cache expects query shape {(batch, 1, heads, depth)}, '
                       f'got {query.shape}.')
    cur = cache_index.value
    one_hot = jax.nn.one_hot(cur, length, dtype=key.dtype)
    # [b, 1, h, d] -> [b, h, d, 1] * [max_len] scatters the step into the cache.
    key = cached_key.value + jnp.moveaxis(key, -3, -1) * one_hot
    value = cached_value.value + jnp.moveaxis(value, -3, -1) * one_hot
    cached_key.value, cached_value.value = key, value
    cache_index.value = cur + 1
    # [b, h, d, max_len] -> [b, max_len, h, d]
    key, value = jnp.moveaxis(key, -1, -3), jnp.moveaxis(value, -1, -3)
    step_mask = jnp.broadcast_to(jnp.arange(length) <= cur, (batch, 1, 1, length))
    mask = step_mask if mask is None else jnp.logical_and(mask, step_mask)
    if bias is not None:
      # [1, h, max_len, max_len] -> [1, h, 1, max_len]: the row of the current position.
      bias = jax.lax.dynamic_slice_in_dim(bias, cur, 1, axis=-2)
    return key, value, mask, bias


def make_attention_mask(query_input: Array, key_input: Array,
                        pairwise_fn: Callable = jnp.multiply, dtype: Any = jnp.float32) -> Array:
  """`[b, q]`, `[b, k]` -> `[b, 1, q, k]` mask from a pairwise function."""
  mask = pairwise_fn(query_input[..., :, None], key_input[..., None, :])
  return mask[..., None, :, :].astype(dtype)


def combine_masks(*masks: Array | None, dtype: Any = jnp.float32) -> Array | None:
  """Logical AND of the given masks (None entries skipped)."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  return functools.reduce(jnp.logical_and, masks).astype(dtype)


def make_decoder_mask(decoder_target_tokens: Array, dtype: Any,
                      decoder_segment_ids: Array | None = None) -> Array:
  """Causal + padding (+ packing) mask `[b, 1, l, l]` for decoder self-attention."""
  positions = jnp.broadcast_to(jnp.arange(decoder_target_tokens.shape[-1]),
                               decoder_target_tokens.shape)
  masks = [make_attention_mask(positions, positions, jnp.greater_equal, dtype),
           make_attention_mask(decoder_target_tokens > 0, decoder_target_tokens > 0, dtype=dtype)]
  if decoder_segment_ids is not None:
    masks.append(make_attention_mask(decoder_segment_ids, decoder_segment_ids, jnp.equal, dtype))
  return combine_masks(*masks, dtype=dtype)
