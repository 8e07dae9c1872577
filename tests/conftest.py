"""Shared test fixtures: the t5x-written tiny checkpoints and their reference outputs.

The suite runs on the CPU: JAX_PLATFORMS defaults to 'cpu' here (and in every subprocess a test
starts, which inherit it), so an installed libtpu (the test extras install it, for deviceless
TPU compiles) is never probed for chips. To run the suite on a GPU, set JAX_PLATFORMS=cuda.
"""
from __future__ import annotations

import functools
import os
import pathlib

os.environ.setdefault('JAX_PLATFORMS', 'cpu')  # Before any test module imports jax.

import numpy as np
import pytest

TESTDATA = pathlib.Path(__file__).parent / 'testdata'
T5X_FIXTURES = TESTDATA / 't5x'


@functools.cache
def _load(name: str):
  from t5align import checkpoints  # pylint: disable=g-import-not-at-top
  params, config = checkpoints.load_params(T5X_FIXTURES / name / 'legacy' / 'checkpoint_0')
  return config, params, dict(np.load(T5X_FIXTURES / name / 'reference.npz'))


@pytest.fixture(scope='session')
def load_t5x_fixture():
  """`load_t5x_fixture(name) -> (T5Config, params, reference arrays)` for a t5x fixture."""
  return _load


def _numpy_layer0_sorted(config, params, tokens):
  """Layer 0's logits materialized in full (float64 numpy), each row sorted, the rows averaged."""
  import jax  # pylint: disable=g-import-not-at-top
  from t5align import attention  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  model = network.Transformer(config)
  _, state = jax.jit(lambda x: model.apply({'params': params}, x, method='encode',
                                           enable_dropout=False, mutable=['attention_inputs']))(
                                               tokens)
  inputs = state['attention_inputs']['encoder']['layers_0']['attention']
  q, k = (np.asarray(inputs[f'projected_{n}'][0], np.float64) for n in ('query', 'key'))
  table = params['encoder']['relpos_bias']['rel_embedding']
  bias = np.asarray(attention.relative_position_bias(table, tokens.shape[1], tokens.shape[1],
                                                     True), np.float64)
  # [b, q, h, d] x [b, k, h, d] -> [b, h, q, k] -> sorted rows averaged: [k]
  logits = np.einsum('bqhd,bkhd->bhqk', q, k) + bias
  return -np.sort(-logits, axis=-1).mean(axis=(0, 1, 2))


@pytest.fixture(scope='session')
def numpy_layer0_sorted():
  """`numpy_layer0_sorted(config, params, tokens) -> [k]`: layer 0's average sorted logit vector."""
  return _numpy_layer0_sorted
