"""T5 encoder-decoder with an encoder softmax temperature (T5X parameter tree and signatures)."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Sequence

from flax import linen as nn
from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from t5align.attention import dispatch
from t5align.attention import reference
from t5align import fields
from t5align import layers
from t5align.runtime import validate

Array = jax.Array
ArrayLike = jax.typing.ArrayLike  # A temperature: Python float, numpy or jax array.


def _activations(names: Any) -> tuple[str, ...]:
  """`T5Config.mlp_activations` as a tuple, each a flax.linen function's name or 'linear'."""
  if isinstance(names, str) or not isinstance(names, (tuple, list)) or not names:
    raise fields.Refused()
  for name in names:
    if not isinstance(name, str) or (name != 'linear' and not callable(getattr(nn, name, None))):
      raise fields.Refused(f'{name!r} is not one')
  return tuple(names)


def _dropout_rate(value: Any) -> float:
  checked = fields.number(0)(value)
  if checked >= 1.0:
    raise fields.Refused()
  return checked


def _bias_rules(rules: Any) -> Any:
  """One `reference.BiasRule` (kept), or a tuple of them (a list becomes one)."""
  if isinstance(rules, reference.BiasRule):
    return rules
  if not isinstance(rules, (tuple, list)) or not all(
      isinstance(r, reference.BiasRule) for r in rules):
    raise fields.Refused()
  return tuple(rules)


def _attention_options(options: Any) -> tuple[Any, ...]:
  """`T5Config.attention_options` as a tuple: Options objects of distinct implementations, each
  field a positive int (or None where its default is None), a switch True or False."""
  if not isinstance(options, (tuple, list)):
    raise fields.Refused()
  classes = {spec.options: name for name, spec in dispatch.IMPLEMENTATIONS.items()
             if spec.options is not None}
  seen = set()
  for option in options:
    name = classes.get(type(option))
    if name is None:
      raise fields.Refused(f'{option!r} is not the Options of an attention implementation '
                           f'(those of {sorted(classes.values())})')
    if name in seen:
      raise fields.Refused(f'it gives {name!r} options twice')
    seen.add(name)
    for field in dataclasses.fields(option):
      value = getattr(option, field.name)
      if value is None and field.default is None:
        continue
      if isinstance(field.default, bool):  # A switch (pallas_mgpu's use_schedule_barrier).
        if not isinstance(value, bool):
          raise fields.Refused(f'{name} {field.name} must be True or False; got {value!r}')
        continue
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise fields.Refused(f'{name} {field.name} must be a positive int'
                             f'{" or None" if field.default is None else ""}; got {value!r}')
  return tuple(options)


@struct.dataclass
class T5Config:
  """Architecture and run-time knobs; t5x's fields plus the encoder temperature and impl."""

  vocab_size: int = fields.setting(check=fields.integer(1))
  # Activation dtype; parameters are always stored in float32.
  dtype: Any = fields.setting(jnp.float32, check=fields.by(
      "a floating dtype ('float32', 'bfloat16' or jnp's)",
      lambda v: (validate.float_dtype(v, 'dtype'), v)[1]))
  emb_dim: int = fields.setting(512, check=fields.integer(1))
  num_heads: int = fields.setting(8, check=fields.integer(1))
  num_encoder_layers: int = fields.setting(6, check=fields.integer(1))
  num_decoder_layers: int = fields.setting(6, check=fields.integer(1))
  head_dim: int = fields.setting(64, check=fields.integer(1))
  mlp_dim: int = fields.setting(2048, check=fields.integer(1))
  # One flax.linen activation (or 'linear') per MLP input projection: ('relu',) T5 1.0,
  # ('gelu', 'linear') T5 1.1 / Flan-T5 / T0, ('silu', 'linear') UL2 / Flan-UL2.
  mlp_activations: Sequence[str] = fields.setting(('relu',), check=fields.by(
      "a non-empty tuple of flax.linen activations' names or 'linear'", _activations))
  dropout_rate: float = fields.setting(0.1, check=fields.by(
      'a number in [0, 1)', _dropout_rate))
  # If True, the decoder's output logits use the transposed embedding (T5 1.0).
  logits_via_embedding: bool = fields.setting(False, check=fields.boolean())
  float32_attention_logits: bool = fields.setting(False, check=fields.boolean())
  # Encoder self-attention softmax temperature: one float, one per encoder layer, or one per
  # encoder layer and head (`[layers][heads]`, a tuple of tuples in gin). 1.0 is t5x. Its
  # shape against the layers and heads: `__post_init__`.
  encoder_attention_temperature: float | Sequence[float] | Sequence[Sequence[float]] = (
      fields.setting(1.0, check=fields.temperature()))
  # Encoder relative-bias rule (`reference.BiasRule`: 'none', 'interpolate', 'extend'), one for
  # every layer or a tuple with one per encoder layer; resolved at each call's (static, padded)
  # input width (`encoder_offset_map`), or once by a job at its inputs' length
  # (`bias_rules_at`). The decoder's bias is never changed. In gin (dynamic registration,
  # `from t5align.attention import reference`): `encoder_bias_rule = @reference.BiasRule()`.
  # Its count against the layers: `__post_init__`.
  encoder_bias_rule: reference.BiasRule | Sequence[reference.BiasRule] = fields.setting(
      reference.BiasRule(), check=fields.by(
          'a reference.BiasRule, or a tuple of them (one per encoder layer)', _bias_rules))
  # Encoder self-attention implementation (dispatch.NAMES): 'reference' (materialized), 'blockwise',
  # 'pallas' (the target platform's fused kernel, dispatch.resolve: Mosaic GPU on Hopper for
  # bfloat16 / float16, else Triton on GPU; Mosaic on TPU), 'pallas_gpu' / 'pallas_mgpu' /
  # 'pallas_tpu' (one of them by name), or 'auto': 'reference' for inputs of at most
  # `blockwise_threshold` tokens, above it 'pallas' on GPU / TPU and 'blockwise' on CPU.
  attention_impl: str = fields.setting('reference', check=fields.text(dispatch.NAMES))
  blockwise_threshold: int = fields.setting(2048, check=fields.integer(1))
  # Tiles and launch parameters, per implementation: a tuple of the implementations' frozen
  # Options objects (`dispatch.IMPLEMENTATIONS[name].options`: blockwise.Options,
  # pallas_gpu.Options, pallas_mgpu.Options, pallas_tpu.Options), at most one per implementation;
  # an implementation without one runs with its defaults (`attention_options`). In gin (dynamic
  # registration, `from t5align.attention import blockwise`):
  #   network.T5Config.attention_options = (@blockwise.Options(),)
  #   blockwise.Options.block_q = 1024
  attention_options: tuple[Any, ...] = fields.setting((), check=fields.by(
      "a tuple of attention implementations' Options, at most one each", _attention_options))

  GIN_NAME: ClassVar[str] = 'network.T5Config'

  def __post_init__(self):
    fields.check_fields(self)
    # What one field's check cannot see: the temperature's shape and the rules' count against
    # the layers and heads.
    tau = validate.constant_temperature(self.encoder_attention_temperature,
                                        'T5Config.encoder_attention_temperature')
    shape = np.shape(tau)
    if shape not in ((), (self.num_encoder_layers,),
                     (self.num_encoder_layers, self.num_heads)):
      raise ValueError(
          f'T5Config.encoder_attention_temperature has shape {shape}; expected one float, '
          f'num_encoder_layers={self.num_encoder_layers} values, or [num_encoder_layers='
          f'{self.num_encoder_layers}][num_heads={self.num_heads}] (a tuple of tuples).')
    object.__setattr__(self, 'encoder_attention_temperature', tau)
    rules = self.encoder_bias_rule
    if not isinstance(rules, reference.BiasRule) and len(rules) != self.num_encoder_layers:
      raise ValueError(
          f'T5Config.encoder_bias_rule={self.encoder_bias_rule!r}: expected one '
          f'reference.BiasRule or a tuple of num_encoder_layers={self.num_encoder_layers} '
          '(one per layer).')

  @property
  def encoder_bias_rules(self) -> tuple[reference.BiasRule, ...]:
    """`encoder_bias_rule` as one rule per encoder layer."""
    rule = self.encoder_bias_rule
    return (rule,) * self.num_encoder_layers if isinstance(rule, reference.BiasRule) else rule

  @property
  def has_bias_rule(self) -> bool:
    """Whether some encoder layer reads its bias table by a rule (not as trained)."""
    return any(r.kind != 'none' for r in self.encoder_bias_rules)


def encoder_attention_impl(config: T5Config, length: int, platform: str | None = None) -> str:
  """The implementation (a key of `dispatch.IMPLEMENTATIONS`) the encoder uses for inputs of
  `length` (static) tokens on `platform` ('cpu', 'gpu', 'tpu'; None: the target platform at
  trace time, `reference.target_platform`)."""
  return dispatch.resolve(config.attention_impl, length, config.blockwise_threshold, platform,
                          input_dtype=config.dtype, dtype=config.dtype,
                          head_dim=config.head_dim)


def encoder_offset_map(config: T5Config, layer: int, length: int) -> reference.OffsetMap:
  """How encoder layer `layer` reads its bias table for inputs of `length` (static) tokens: the
  config's bias rule (`T5Config.encoder_bias_rule`) resolved at that length."""
  return config.encoder_bias_rules[layer].at(length)


def bias_rules_at(config: T5Config, length: int) -> T5Config:
  """`config` with its encoder bias rules resolved at inputs of `length` tokens
  (`reference.BiasRule.fixed_at`): every batch then reads the table alike whatever its padded
  width (an eval's task: its longest input)."""
  rule = config.encoder_bias_rule
  fixed = (rule.fixed_at(length) if isinstance(rule, reference.BiasRule)
           else tuple(r.fixed_at(length) for r in rule))
  return config if fixed == rule else dataclasses.replace(config, encoder_bias_rule=fixed)


def attention_options(config: T5Config, impl: str) -> Any:
  """The options object of implementation `impl` (`dispatch.IMPLEMENTATIONS[impl].options`):
  the config's (`T5Config.attention_options`), else the defaults; None for an implementation
  without options."""
  options = dispatch.IMPLEMENTATIONS[impl].options
  if options is None:
    return None
  return next((o for o in config.attention_options if type(o) is options), options())


def layer_temperatures(temperature: Any, num_layers: int, batch: int, num_heads: int, *,
                       constant: bool = False, name: str = 'temperature') -> Array:
  """The encoder temperature in its one form: float32 `[1 or batch, num_layers, 1 or num_heads]`.

  Every temperature enters the encoder here, once (`Transformer.encode`: its `temperature=`, else
  the config's); its values are checked here (`validate.temperatures`; not when traced). Layer i
  takes `tau[:, i]`, `[1 or b, 1 or h]`, which the attention implementations take as it is
  (`reference.head_temperature`).

  Accepted, with `constant=True` (one value for the whole batch: the config's
  `encoder_attention_temperature`): a scalar, `[1 or num_layers]` (per layer) or
  `[1 or num_layers, 1 or num_heads]` (per layer and head). Otherwise (`encode`'s `temperature=`):
  a scalar or a `[num_layers]` vector (one for the whole batch); a `[batch]` vector (per
  example); a 2-D `[1 or batch, 1 or num_layers]` array (per example and layer); a 3-D
  `[1 or batch, 1 or num_layers, 1 or num_heads]` array (per example, layer and head). A 1-D
  vector whose length equals both `batch` and `num_layers` is ambiguous and rejected: pass
  `[batch, 1]` or `[1, num_layers]` instead.
  """
  validate.temperatures(temperature, name)
  tau = jnp.asarray(temperature, jnp.float32)
  shape = tuple(np.shape(temperature))
  if constant:
    accepted = (f'a scalar, [num_encoder_layers={num_layers}] or [num_encoder_layers='
                f'{num_layers}][num_heads={num_heads}]')
    target = f'[num_encoder_layers={num_layers}, num_heads={num_heads}]'
  else:
    accepted = (f'a scalar, [num_encoder_layers={num_layers}], [batch={batch}], [1 or batch, 1 '
                f'or num_encoder_layers] or [1 or batch, 1 or num_encoder_layers, 1 or '
                f'num_heads={num_heads}]')
    target = f'[batch={batch}, num_encoder_layers={num_layers}, num_heads={num_heads}]'
  whole_batch = constant  # One value (per layer, per head) for every example.
  if not constant and tau.ndim == 1:
    n = tau.shape[0]
    if n == num_layers == batch and n > 1:
      raise ValueError(
          f'{name} of shape ({n},) is ambiguous: batch and num_encoder_layers are both {n}. '
          f'Pass shape ({n}, 1) for one value per example or (1, {n}) for one per layer.')
    if n not in (num_layers, batch, 1):
      raise ValueError(f'{name} of shape ({n},) matches neither batch={batch} nor '
                       f'num_encoder_layers={num_layers}; accepted: {accepted}.')
    whole_batch = n == num_layers
  if whole_batch and tau.ndim <= 2:
    # One for the whole batch: [] -> [1, 1, 1], [n] -> [1, n, 1], [n, h] -> [1, n, h].
    tau = tau.reshape((1,) + tau.shape + (1,) * (2 - tau.ndim))
  elif not whole_batch and tau.ndim <= 3:
    # Per example: [] -> [1, 1, 1], [b] -> [b, 1, 1], [b, n] -> [b, n, 1], [b, n, h] as it is.
    tau = tau.reshape(tau.shape + (1,) * (3 - tau.ndim))
  if (len(shape) > (2 if whole_batch else 3) or tau.shape[0] not in (1, batch)
      or tau.shape[1] not in (1, num_layers) or tau.shape[2] not in (1, num_heads)):
    raise ValueError(f'{name} of shape {shape} does not broadcast to {target}; accepted: '
                     f'{accepted}.')
  # [1 or b, 1 or n, 1 or h] -> [1 or b, n, 1 or h]
  return jnp.broadcast_to(tau, (tau.shape[0], num_layers, tau.shape[2]))


def _relpos(cfg: T5Config) -> layers.RelativePositionBiases:
  return layers.RelativePositionBiases(
      num_buckets=reference.NUM_BUCKETS, max_distance=reference.MAX_DISTANCE,
      num_heads=cfg.num_heads, dtype=cfg.dtype, name='relpos_bias')


def _attention(cfg: T5Config, name: str, impl: str = 'reference',
               offset_map: reference.OffsetMap = reference.OffsetMap()):
  return layers.MultiHeadDotProductAttention(
      num_heads=cfg.num_heads, head_dim=cfg.head_dim, dtype=cfg.dtype,
      dropout_rate=cfg.dropout_rate, float32_logits=cfg.float32_attention_logits,
      attention_impl=impl, options=attention_options(cfg, impl), offset_map=offset_map,
      name=name)


def _mlp(cfg: T5Config):
  return layers.MlpBlock(intermediate_dim=cfg.mlp_dim, activations=cfg.mlp_activations,
                         intermediate_dropout_rate=cfg.dropout_rate, dtype=cfg.dtype, name='mlp')


def _dropout(cfg: T5Config, x: Array, deterministic: bool) -> Array:
  return nn.Dropout(rate=cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)


class EncoderLayer(nn.Module):
  """Pre-norm self-attention + MLP block."""

  config: T5Config
  relative_embedding: nn.Module
  layer: int = 0  # Its index in the stack (which of `T5Config.encoder_bias_rule` applies).

  @nn.compact
  def __call__(self, inputs: Array, segment_ids: Array, temperature: Array,
               deterministic: bool = False) -> Array:
    """`[b, l, e]` -> `[b, l, e]`; `segment_ids` `[b, l]` (0 = pad), `temperature` float32
    `[1 or b, 1 or h]` (this layer's slice of `layer_temperatures`' form, passed on as it is)."""
    cfg = self.config
    x = layers.LayerNorm(dtype=cfg.dtype, name='pre_attention_layer_norm')(inputs)
    # [b, l, e] -> [b, l, e]
    length = inputs.shape[-2]
    x = _attention(cfg, 'attention', encoder_attention_impl(cfg, length),
                   encoder_offset_map(cfg, self.layer, length))(
        x, x, deterministic=deterministic, rel_embedding=self.relative_embedding.table(),
        segment_ids=segment_ids, temperature=temperature)
    x = _dropout(cfg, x, deterministic) + inputs
    y = layers.LayerNorm(dtype=cfg.dtype, name='pre_mlp_layer_norm')(x)
    # [b, l, e] -> [b, l, e]
    y = _mlp(cfg)(y, deterministic=deterministic)
    return _dropout(cfg, y, deterministic) + x


class DecoderLayer(nn.Module):
  """Pre-norm causal self-attention, cross-attention and MLP block."""

  config: T5Config
  relative_embedding: nn.Module

  @nn.compact
  def __call__(self, inputs: Array, encoded: Array, decoder_mask: Array | None = None,
               encoder_decoder_mask: Array | None = None, deterministic: bool = False,
               decode: bool = False, max_decode_length: int | None = None,
               cache_cross_kv: bool = False) -> Array:
    """`[b, l, e]` decoder stream and `[b, k, e]` encoder output -> `[b, l, e]`."""
    cfg = self.config
    length = max_decode_length if decode and max_decode_length else inputs.shape[-2]
    # [1, h, l, l]
    decoder_bias = self.relative_embedding(length, length, False)
    x = layers.LayerNorm(dtype=cfg.dtype, name='pre_self_attention_layer_norm')(inputs)
    x = _attention(cfg, 'self_attention')(
        x, x, decoder_mask, decoder_bias, deterministic=deterministic, decode=decode)
    x = _dropout(cfg, x, deterministic) + inputs
    y = layers.LayerNorm(dtype=cfg.dtype, name='pre_cross_attention_layer_norm')(x)
    y = _attention(cfg, 'encoder_decoder_attention')(
        y, encoded, encoder_decoder_mask, deterministic=deterministic,
        cache_kv=decode and cache_cross_kv)
    y = _dropout(cfg, y, deterministic) + x
    z = layers.LayerNorm(dtype=cfg.dtype, name='pre_mlp_layer_norm')(y)
    z = _mlp(cfg)(z, deterministic=deterministic)
    return _dropout(cfg, z, deterministic) + y


class Encoder(nn.Module):
  """Embedding, encoder layers and final norm."""

  config: T5Config
  shared_embedding: nn.Module

  @nn.compact
  def __call__(self, encoder_input_tokens: Array, segment_ids: Array, temperature: Array,
               deterministic: bool = False) -> Array:
    """`[b, l]` tokens -> `[b, l, e]`; `temperature` float32 `[1 or b, num_encoder_layers,
    1 or h]`, as `layer_temperatures` gives it (not checked again here)."""
    cfg = self.config
    rel_emb = _relpos(cfg)
    # [b, l] -> [b, l, e]
    x = self.shared_embedding(encoder_input_tokens.astype(jnp.int32))
    x = _dropout(cfg, x, deterministic).astype(cfg.dtype)
    for i in range(cfg.num_encoder_layers):
      # [1 or b, n, 1 or h] -> [1 or b, 1 or h]: layer i's taus per example and head.
      x = EncoderLayer(config=cfg, relative_embedding=rel_emb, layer=i, name=f'layers_{i}')(
          x, segment_ids, temperature[:, i], deterministic)
    x = layers.LayerNorm(dtype=cfg.dtype, name='encoder_norm')(x)
    return nn.Dropout(rate=cfg.dropout_rate)(x, deterministic=deterministic)


class Decoder(nn.Module):
  """Embedding, decoder layers, final norm and output logits (float32)."""

  config: T5Config
  shared_embedding: nn.Module

  @nn.compact
  def __call__(self, encoded: Array, decoder_input_tokens: Array,
               decoder_positions: Array | None = None, decoder_mask: Array | None = None,
               encoder_decoder_mask: Array | None = None, deterministic: bool = False,
               decode: bool = False, max_decode_length: int | None = None,
               cache_cross_kv: bool = False) -> Array:
    """`[b, l]` tokens and `[b, k, e]` encoded -> `[b, l, vocab]` float32 logits."""
    del decoder_positions  # Relative positions only; kept for t5x's signature.
    cfg = self.config
    rel_emb = _relpos(cfg)
    # [b, l] -> [b, l, e]
    y = self.shared_embedding(decoder_input_tokens.astype(jnp.int32))
    y = _dropout(cfg, y, deterministic).astype(cfg.dtype)
    for i in range(cfg.num_decoder_layers):
      y = DecoderLayer(config=cfg, relative_embedding=rel_emb, name=f'layers_{i}')(
          y, encoded, decoder_mask=decoder_mask, encoder_decoder_mask=encoder_decoder_mask,
          deterministic=deterministic, decode=decode, max_decode_length=max_decode_length,
          cache_cross_kv=cache_cross_kv)
    y = layers.LayerNorm(dtype=cfg.dtype, name='decoder_norm')(y)
    y = _dropout(cfg, y, deterministic)
    # [b, l, e] -> [b, l, vocab]
    if cfg.logits_via_embedding:
      # NOTE: tied logits are rescaled by 1/sqrt(emb_dim), as t5x (and HF's tied T5) do.
      return self.shared_embedding.attend(y) / math.sqrt(y.shape[-1])
    return layers.DenseGeneral(cfg.vocab_size, dtype=jnp.float32, kernel_axes=('embed', 'vocab'),
                               name='logits_dense')(y)


def segment_ids_for(encoder_input_tokens: Array,
                        encoder_segment_ids: Array | None = None) -> Array:
  """int32 `[b, l]` ids: 0 on padding; attention is allowed between equal non-zero ids."""
  valid = encoder_input_tokens > 0
  if encoder_segment_ids is None:
    return valid.astype(jnp.int32)
  # +1 keeps a real token with segment id 0 distinct from padding, as t5x's masks do.
  return jnp.where(valid, encoder_segment_ids.astype(jnp.int32) + 1, 0)


class Transformer(nn.Module):
  """T5 encoder-decoder; `encode`/`decode`/`__call__` match t5x's EncoderDecoderModel calls.

  Every entry point that runs the encoder takes an optional `temperature` (scalar, per layer,
  per example, `[batch, layers]` or `[batch, layers, heads]`; see `layer_temperatures`) that
  overrides the config's `encoder_attention_temperature` and may be traced (e.g. under
  `jax.vmap`). `encode` turns either into `[1 or batch, layers, 1 or heads]` once; the encoder's
  layers and the attention take that form (a layer's slice) as it is.
  """

  config: T5Config

  def setup(self):
    cfg = self.config
    self.shared_embedding = layers.Embed(
        num_embeddings=cfg.vocab_size, features=cfg.emb_dim, dtype=cfg.dtype,
        attend_dtype=jnp.float32, name='token_embedder')
    self.encoder = Encoder(config=cfg, shared_embedding=self.shared_embedding)
    self.decoder = Decoder(config=cfg, shared_embedding=self.shared_embedding)

  def encode(self, encoder_input_tokens: Array, encoder_segment_ids: Array | None = None,
             enable_dropout: bool = True, temperature: ArrayLike | None = None) -> Array:
    """`[b, l]` tokens -> `[b, l, e]` encoded."""
    cfg = self.config
    if encoder_input_tokens.ndim != 2:
      raise ValueError(f'encoder_input_tokens must be [batch, length]; got shape '
                       f'{encoder_input_tokens.shape}.')
    n, b, h = cfg.num_encoder_layers, encoder_input_tokens.shape[0], cfg.num_heads
    # [1 or b, n, 1 or h]: the temperature's one form from here to the attention's division.
    if temperature is None:
      tau = layer_temperatures(cfg.encoder_attention_temperature, n, b, h, constant=True,
                               name='T5Config.encoder_attention_temperature')
    else:
      tau = layer_temperatures(temperature, n, b, h)
    ids = segment_ids_for(encoder_input_tokens, encoder_segment_ids)
    return self.encoder(encoder_input_tokens, ids, tau, deterministic=not enable_dropout)

  def decode(self, encoded: Array, encoder_input_tokens: Array, decoder_input_tokens: Array,
             decoder_target_tokens: Array, encoder_segment_ids: Array | None = None,
             decoder_segment_ids: Array | None = None, decoder_positions: Array | None = None,
             enable_dropout: bool = True, decode: bool = False,
             max_decode_length: int | None = None, cache_cross_kv: bool = False) -> Array:
    """Decoder over `[b, k, e]` encoded -> `[b, l, vocab]` logits (t5x's signature).

    `cache_cross_kv` (with `decode=True`; t5x's own decoder leaves it False): each layer's
    cross-attention keys/values of `encoded` go into the 'cache' collection on the call that
    creates the cache, and later steps read them there instead of projecting `encoded` again
    (`decoding.greedy`). Without it every step projects the whole encoder output, as t5x does.
    """
    cfg = self.config
    if decode:
      # Autoregressive steps: no target padding mask; the cache supplies causality.
      decoder_mask = None
      encoder_decoder_mask = layers.make_attention_mask(
          jnp.ones_like(decoder_target_tokens), encoder_input_tokens > 0, dtype=cfg.dtype)
    else:
      decoder_mask = layers.make_decoder_mask(decoder_target_tokens, cfg.dtype,
                                              decoder_segment_ids=decoder_segment_ids)
      encoder_decoder_mask = layers.make_attention_mask(
          decoder_target_tokens > 0, encoder_input_tokens > 0, dtype=cfg.dtype)
    if encoder_segment_ids is not None:
      if decode:
        raise ValueError('encoder_segment_ids (packing) cannot be used while decoding.')
      encoder_decoder_mask = layers.combine_masks(
          encoder_decoder_mask,
          layers.make_attention_mask(decoder_segment_ids, encoder_segment_ids, jnp.equal,
                                     dtype=cfg.dtype),
          dtype=cfg.dtype)
    return self.decoder(
        encoded, decoder_input_tokens=decoder_input_tokens, decoder_positions=decoder_positions,
        decoder_mask=decoder_mask, encoder_decoder_mask=encoder_decoder_mask,
        deterministic=not enable_dropout, decode=decode, max_decode_length=max_decode_length,
        cache_cross_kv=cache_cross_kv)

  def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
               decoder_target_tokens: Array, encoder_segment_ids: Array | None = None,
               decoder_segment_ids: Array | None = None, encoder_positions: Array | None = None,
               decoder_positions: Array | None = None, *, enable_dropout: bool = True,
               decode: bool = False, temperature: ArrayLike | None = None) -> Array:
    """Encoder then decoder: `[b, k]`, `[b, l]`, `[b, l]` tokens -> `[b, l, vocab]` logits."""
    del encoder_positions  # Relative positions only; kept for t5x's signature.
    encoded = self.encode(encoder_input_tokens, encoder_segment_ids=encoder_segment_ids,
                          enable_dropout=enable_dropout, temperature=temperature)
    return self.decode(
        encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
        encoder_segment_ids=encoder_segment_ids, decoder_segment_ids=decoder_segment_ids,
        decoder_positions=decoder_positions, enable_dropout=enable_dropout, decode=decode)


def param_shapes(config: T5Config) -> dict[str, Any]:
  """The T5X 'params' tree of `jax.ShapeDtypeStruct`s for `config`, without allocating."""
  return jax.eval_shape(lambda: init_variables(config, jax.random.PRNGKey(0)))['params']


def init_variables(config: T5Config, rng: Array, encoder_len: int = 8,
                   decoder_len: int = 4) -> dict[str, Any]:
  """Initializes 'params' (and 'params_axes') for `config` with tiny dummy inputs."""
  model = Transformer(config)
  enc = jnp.ones((1, encoder_len), jnp.int32)
  dec = jnp.ones((1, decoder_len), jnp.int32)
  return model.init({'params': rng, 'dropout': rng}, enc, dec, dec, enable_dropout=False)


def encoder_row_stats(intermediates: dict[str, Any], num_layers: int) -> dict[str, Array]:
  """Collects the sown encoder row statistics.

  Args:
    intermediates: the 'intermediates' collection from `apply(..., mutable=['intermediates'])`.
    num_layers: number of encoder layers.

  Returns:
    {'pmax_sum': `[n, b, h]`, 'entropy_sum': `[n, b, h]`, 'rows': `[b]`}: sums over each
    example's non-pad query rows, per layer and head, and the number of such rows.
  """
  enc = intermediates['encoder']
  per_layer = [enc[f'layers_{i}']['attention']['row_stats'][0] for i in range(num_layers)]
  return {
      'pmax_sum': jnp.stack([s['pmax_sum'] for s in per_layer]),
      'entropy_sum': jnp.stack([s['entropy_sum'] for s in per_layer]),
      'rows': per_layer[0]['rows'],
  }


def mean_row_stats(stats: dict[str, Array]) -> dict[str, Array]:
  """Means over heads and every non-pad query row of the batch (each row weighs the same).

  The one average of the row statistics: of one `encoder_row_stats` (jax arrays, traceable), and
  of a calibration sweep's float64 sums accumulated across calls (numpy in, numpy out, with
  leading `[t]` candidate axes: `calibration.stats.encoder_attention_stats`).
  A batch without any non-pad row has nothing to average: concrete stats raise ValueError; traced
  ones (inside jit, where nothing can be raised) give 0 rather than NaN (0/0).

  Args:
    stats: {'pmax_sum': `[..., n, b, h]`, 'entropy_sum': `[..., n, b, h]`, 'rows': `[..., b]`}
      (`encoder_row_stats`' sums over each example's non-pad query rows, and their counts).

  Returns:
    {'layer_pmax': `[..., n]`, 'layer_entropy': `[..., n]`, 'pmax': `[...]`, 'entropy': `[...]`,
    'head_pmax': `[..., n, h]`, 'head_entropy': `[..., n, h]`} (per head: means over the same
    rows).
  """
  xp = np if isinstance(stats['pmax_sum'], np.ndarray) else jnp
  heads = stats['pmax_sum'].shape[-1]
  rows = xp.sum(stats['rows'], axis=-1)  # [..., b] -> [...]
  if not isinstance(rows, jax.core.Tracer) and np.any(np.asarray(rows) == 0):
    raise ValueError('mean_row_stats: the batch has no non-pad query row (every input token is '
                     'padding); there is no attention row to average.')
  rows = xp.maximum(rows, 1)[..., None]  # [..., 1]
  means = {}
  for name in ('pmax', 'entropy'):
    sums = stats[f'{name}_sum']
    means[f'layer_{name}'] = xp.sum(sums, axis=(-2, -1)) / (rows * heads)  # -> [..., n]
    means[name] = xp.mean(means[f'layer_{name}'], axis=-1)  # -> [...]
    means[f'head_{name}'] = xp.sum(sums, axis=-2) / rows[..., None]  # -> [..., n, h]
  return {k: means[k] for k in ('layer_pmax', 'layer_entropy', 'pmax', 'entropy', 'head_pmax',
                                'head_entropy')}
