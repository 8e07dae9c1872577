"""Scoring (teacher forcing) and greedy decoding of token batches, one device or on a mesh.

`t5align.eval` feeds it seqio examples (`batching` pads them, `predictions` keeps the records);
everything here works on token arrays, so it is tested without seqio.
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
  # [b, l] -> [b, l]: decoder inputs are the targets shifted right, starting from 0.
  decoder_inputs = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  logits = model.apply({'params': params}, inputs, decoder_inputs, targets,
                       enable_dropout=False, temperature=temperature)
  # [b, l, vocab] -> [b, l]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  token_ll = jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return jnp.sum(jnp.where(targets > 0, token_ll, 0.0), axis=-1)


score_batch = jax.jit(score, static_argnames=('model',))


def _batch_shardings(mesh: Mesh, *ndims: int) -> tuple:
  return tuple(partitioning.batch_sharding(mesh, n) for n in ndims)


@functools.lru_cache(maxsize=32)
def partitioned_score(model: network.Transformer, mesh: Mesh) -> Callable:
  """`(params, inputs [b, k], targets [b, l], taus [b, 1|n] or [b, n, h]) -> [b]` on `mesh`.

  Parameters sharded over 'model' (`partitioning.param_shardings`), every batch argument and
  the result over 'data'; traced under the logical axis rules, so activations follow them.
  """
  return partitioning.partition(
      functools.partial(score, model), mesh,
      in_shardings=(partitioning.param_shardings(model.config, mesh),
                    *_batch_shardings(mesh, 2, 2, 2)),
      out_shardings=partitioning.batch_sharding(mesh, 1))


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

  return partitioning.partition(
      fn, mesh, in_shardings=(partitioning.param_shardings(model.config, mesh),
                              *_batch_shardings(mesh, 2, 2)),
      out_shardings=partitioning.batch_sharding(mesh, 2))
