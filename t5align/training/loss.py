"""The training loss: cross entropy and token accuracy over non-pad targets."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

Array = jax.Array


def cross_entropy(logits: Array, targets: Array, per_example: bool = False
                  ) -> tuple[Array, Array]:
  """Cross entropy and token accuracy over non-pad targets.

  Args:
    logits: float32 `[b, l, vocab]`.
    targets: int `[b, l]`, 0 = padding.
    per_example: average each example's tokens first, then the examples (every example weighs
      the same, whatever its target length); else one mean over all tokens (t5x).

  Returns:
    (loss, token accuracy): float32 scalars.
  """
  mask = (targets > 0).astype(jnp.float32)
  if per_example:
    # [b, l] / [b, 1]: each example's tokens sum to 1.
    mask = mask / jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1.0)
  # [b, l, vocab] -> [b, l]
  nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  denom = jnp.maximum(jnp.sum(mask), 1e-9)
  correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
  return jnp.sum(nll * mask) / denom, jnp.sum(correct * mask) / denom
