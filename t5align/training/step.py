"""One optimizer step: the loss's gradient and the optimizer's update, jitted."""
from __future__ import annotations

import functools
from typing import Any, Mapping

import jax
import optax

from t5align import network
from t5align.training import loss as loss_lib
from t5align.training import optim

Array = jax.Array


@functools.partial(jax.jit, static_argnames=('model', 'optimizer', 'total_steps',
                                             'per_example_loss'))
def train_step(params: Any, opt_state: Any, batch: Mapping[str, Array], rng: Array, *,
               model: network.Transformer, optimizer: optim.OptimizerConfig, total_steps: int,
               per_example_loss: bool = False) -> tuple[Any, Any, dict[str, Array]]:
  """One optimizer step on the cross entropy of `batch` (t5x's feature dict; see
  `loss.cross_entropy`), `optimizer`'s schedule over a run of `total_steps`.

  Returns:
    (params, opt_state, {'loss', 'token_accuracy', 'grad_norm'}).
  """

  def loss_fn(p):
    logits = model.apply(
        {'params': p}, batch['encoder_input_tokens'], batch['decoder_input_tokens'],
        batch['decoder_target_tokens'], enable_dropout=model.config.dropout_rate > 0,
        rngs={'dropout': rng})
    return loss_lib.cross_entropy(logits, batch['decoder_target_tokens'], per_example_loss)

  (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  updates, opt_state = optimizer.make(total_steps).update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  return params, opt_state, {'loss': loss, 'token_accuracy': acc,
                             'grad_norm': optax.tree.norm(grads)}
