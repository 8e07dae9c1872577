"""HuggingFace's PyTorch T5 with its encoder self-attention tempered: the reference the
temperature is tested against (hf_parity_test, lm_eval_test), written here independently of
t5align's code."""
from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def tempered_encoder(tau: float) -> Iterator[None]:
  """Within the block, HF T5's eager attention computes its encoder self-attention as
  softmax((q.k + bias + mask) / tau); the decoder's attention is untouched. Models must run
  with `attn_implementation='eager'`."""
  from transformers.models.t5 import modeling_t5  # pylint: disable=g-import-not-at-top
  original = modeling_t5.eager_attention_forward

  def tempered(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
               position_bias=None, **kwargs):
    if not module.is_decoder:
      scaling = scaling / tau
      position_bias = position_bias / tau
      attention_mask = None if attention_mask is None else attention_mask / tau
    return original(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                    position_bias=position_bias, **kwargs)

  modeling_t5.eager_attention_forward = tempered
  try:
    yield
  finally:
    modeling_t5.eager_attention_forward = original
