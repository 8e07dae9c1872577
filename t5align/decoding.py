"""Greedy decoding over t5x's cache, cross-attention K/V projected once (`greedy`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from t5align import network
from t5align.runtime import validate

Array = jax.Array


def greedy(
    model: network.Transformer,
    params: dict,
    encoder_input_tokens: Array,
    *,
    max_decode_length: int,
    eos_id: int = 1,
    temperature: Array | float | None = None,
) -> Array:
  """Greedy (argmax) decoding; traceable (`greedy_decode` is its jit, for one device).

  Callers that shard it jit it themselves, e.g. `evaluation.partitioned_greedy_decode` under a
  mesh and the logical axis rules (`partitioning.partition`).

  The encoder runs once (with `temperature`, see `network.layer_temperatures`), each decoder
  layer's cross-attention keys/values are projected once from its output, and the decoder then
  runs one position at a time over t5x's 'cache' collection (`greedy_from_encoded`). Decoding
  starts from token 0 and a row stops at its first `eos_id`, which is kept; later positions are
  0 (padding), as in t5x. The loop ends early once every row has stopped.

  Args:
    model: the Transformer module (static).
    params: its 'params' tree.
    encoder_input_tokens: int `[b, k]`, 0 = padding.
    max_decode_length: number of output positions (static).
    eos_id: end-of-sequence id (static).
    temperature: encoder temperature override; None uses the config's.

  Returns:
    int32 `[b, max_decode_length]` tokens.
  """
  validate.positive_int(max_decode_length, 'max_decode_length')  # Static: checked at trace time.
  # [b, k] -> [b, k, e]
  encoded = model.apply({'params': params}, encoder_input_tokens, enable_dropout=False,
                        temperature=temperature, method=model.encode)
  return greedy_from_encoded(model, params, encoded, encoder_input_tokens,
                             max_decode_length=max_decode_length, eos_id=eos_id)


def greedy_from_encoded(
    model: network.Transformer,
    params: dict,
    encoded: Array,
    encoder_input_tokens: Array,
    *,
    max_decode_length: int,
    eos_id: int = 1,
    cache_cross_kv: bool = True,
) -> Array:
  """The decoding loop of `greedy` over an encoder output `[b, k, e]`; traceable.

  With `cache_cross_kv` (the default) each decoder layer's cross-attention keys/values are
  projected once, into the 'cache' collection beside t5x's self-attention cache
  (`network.Transformer.decode`); False projects the whole encoder output at every generated
  token, as t5x's decoder does (same tokens; kept to compare and benchmark).
  """
  batch = encoder_input_tokens.shape[0]
  variables = {'params': params}
  full = jnp.zeros((batch, max_decode_length), jnp.int32)
  # A decode=True call over the full length creates the cache: zeros for self-attention (its
  # decoder outputs are unused, so XLA drops them) and, with cache_cross_kv, the projected
  # cross-attention keys/values.
  init_cache = lambda: model.apply(
      variables, encoded, encoder_input_tokens, full, full, enable_dropout=False, decode=True,
      max_decode_length=max_decode_length, cache_cross_kv=cache_cross_kv, method=model.decode,
      mutable=['cache'])[1]['cache']
  if cache_cross_kv:
    cache = init_cache()
  else:  # Only shapes are needed: no compute.
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(init_cache))

  def decode_step(cache, token):
    # [b, 1] -> [b, 1, vocab]
    logits, new_vars = model.apply(
        {**variables, 'cache': cache}, encoded, encoder_input_tokens, token, token,
        enable_dropout=False, decode=True, max_decode_length=max_decode_length,
        cache_cross_kv=cache_cross_kv, method=model.decode, mutable=['cache'])
    return logits[:, -1], new_vars['cache']

  def cond(state):
    i, _, _, _, done = state
    return (i < max_decode_length) & ~jnp.all(done)

  def body(state):
    i, cache, token, out, done = state
    logits, cache = decode_step(cache, token)
    # [b, vocab] -> [b]
    next_token = jnp.where(done, 0, jnp.argmax(logits, axis=-1).astype(jnp.int32))
    out = out.at[:, i].set(next_token)
    done = done | (next_token == eos_id)
    return i + 1, cache, next_token[:, None], out, done

  state = (jnp.array(0), cache, jnp.zeros((batch, 1), jnp.int32), full,
           jnp.zeros((batch,), bool))
  return jax.lax.while_loop(cond, body, state)[3]


greedy_decode = jax.jit(greedy, static_argnames=('model', 'max_decode_length', 'eos_id'))
