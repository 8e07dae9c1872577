"""Scoring (teacher forcing) and greedy decoding of token batches, one device or on a mesh.

`t5align.eval` feeds it seqio examples (`batching` pads them, `predictions` keeps the records),
and the lm-eval model (`t5align.lm_eval`) scores several continuations against one encoding
(`partitioned_encode`, then `partitioned_score_encoded`); everything here works on token arrays,
so it is tested without seqio.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from t5align import decoding
from t5align import network
from t5align import partitioning


def encode(model: network.Transformer, params: Any, inputs: jax.Array,
           temperature: jax.Array | None = None) -> jax.Array:
  """The encoder's output (traceable): int `[b, k]` tokens (0 = padding) -> `[b, k, e]`, at
  `temperature` (see `network.layer_temperatures`; None: the config's)."""
  return model.apply({'params': params}, inputs, enable_dropout=False, temperature=temperature,
                     method=model.encode)


def score_encoded(model: network.Transformer, params: Any, encoded: jax.Array,
                  inputs: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Teacher-forced targets over an encoder output (traceable).

  Args:
    model: the Transformer.
    params: its 'params'.
    encoded: `[b, k, e]`, the encoder's output for `inputs`.
    inputs: int `[b, k]` encoder tokens (0 = padding), for the cross-attention mask.
    targets: int `[b, l]` target tokens (0 = padding, not scored).

  Returns:
    float32 `[b]`: the sum of the targets' log-likelihoods; bool `[b]`: whether every target
    token is the decoder's argmax at its position (greedy decoding would produce the targets).
  """
  # [b, l] -> [b, l]: decoder inputs are the targets shifted right, starting from 0.
  decoder_inputs = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  logits = model.apply({'params': params}, encoded, inputs, decoder_inputs, targets,
                       enable_dropout=False, method=model.decode)
  # [b, l, vocab] -> [b, l]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  token_ll = jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  scored = targets > 0
  greedy = jnp.all((jnp.argmax(logp, axis=-1) == targets) | ~scored, axis=-1)
  return jnp.sum(jnp.where(scored, token_ll, 0.0), axis=-1), greedy


def score(model: network.Transformer, params: Any, inputs: jax.Array, targets: jax.Array,
          temperature: jax.Array | None = None) -> jax.Array:
  """Sum of target-token log-likelihoods per example (traceable; `score_batch` is its jit).

  Args:
    model: the Transformer.
    params: its 'params'.
    inputs: int `[b, k]` encoder tokens (0 = padding).
    targets: int `[b, l]` target tokens (0 = padding, not scored).
    temperature: encoder temperature, see `network.layer_temperatures`.

  Returns:
    float32 `[b]`.
  """
  encoded = encode(model, params, inputs, temperature)
  return score_encoded(model, params, encoded, inputs, targets)[0]


score_batch = jax.jit(score, static_argnames=('model',))


def _batch_shardings(mesh: Mesh, *ndims: int) -> tuple:
  return tuple(partitioning.batch_sharding(mesh, n) for n in ndims)


def _on_mesh(fn: Callable, model: network.Transformer, mesh: Mesh, batch_ndims: tuple[int, ...],
             out_ndims: int | tuple[int, ...]) -> Callable:
  """`fn(params, *batch)` jitted on `mesh`: parameters sharded over 'model'
  (`partitioning.param_shardings`), the batch arguments (of `batch_ndims` dimensions) and the
  results over 'data'."""
  out = (_batch_shardings(mesh, *out_ndims) if isinstance(out_ndims, tuple)
         else partitioning.batch_sharding(mesh, out_ndims))
  return partitioning.partition(
      fn, mesh, in_shardings=(partitioning.param_shardings(model.config, mesh),
                              *_batch_shardings(mesh, *batch_ndims)), out_shardings=out)


@functools.lru_cache(maxsize=32)
def partitioned_score(model: network.Transformer, mesh: Mesh) -> Callable:
  """`(params, inputs [b, k], targets [b, l], taus [b, 1|n] or [b, n, h]) -> [b]` on `mesh`.

  Parameters sharded over 'model' (`partitioning.param_shardings`), every batch argument and
  the result over 'data'; traced under the logical axis rules, so activations follow them.
  """
  return _on_mesh(functools.partial(score, model), model, mesh, (2, 2, 2), 1)


@functools.lru_cache(maxsize=32)
def partitioned_encode(model: network.Transformer, mesh: Mesh) -> Callable:
  """`(params, inputs [b, k], taus [b, 1|n] or [b, n, h]) -> encoded [b, k, e]` on `mesh`
  (the shardings of `partitioned_score`; the output's rows over 'data')."""
  return _on_mesh(functools.partial(encode, model), model, mesh, (2, 2), 3)


@functools.lru_cache(maxsize=32)
def partitioned_score_encoded(model: network.Transformer, mesh: Mesh) -> Callable:
  """`(params, encoded [b, k, e], inputs [b, k], rows [n], targets [n, l]) -> (log-likelihoods
  [n], greedy [n])` on `mesh`: target `j` is scored against encoded row `rows[j]`, so several
  targets share one encoding (`score_encoded`)."""
  def fn(params, encoded, inputs, rows, targets):
    return score_encoded(model, params, encoded[rows], inputs[rows], targets)

  return _on_mesh(fn, model, mesh, (3, 2, 1, 2), (1, 1))


@functools.lru_cache(maxsize=32)
def partitioned_greedy_decode(model: network.Transformer, mesh: Mesh, max_decode_length: int,
                              eos_id: int) -> Callable:
  """`(params, inputs [b, k], taus [b, 1|n] or [b, n, h]) -> tokens [b, max_decode_length]`
  on `mesh`.

  `decoding.greedy` with the shardings of `partitioned_score`.
  """
  def fn(params, inputs, taus):
    return decoding.greedy(model, params, inputs, max_decode_length=max_decode_length,
                           eos_id=eos_id, temperature=taus)

  return _on_mesh(fn, model, mesh, (2, 2), 2)
