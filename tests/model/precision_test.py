"""The float32 contract: every dot with a float32 operand is traced at Precision.HIGHEST.

Read off the traced programs (jaxprs, Pallas kernel bodies included), so it holds on every
platform without running on one: on a GPU, XLA's and Triton's default for float32 dots is TF32;
on a TPU, one bfloat16 pass. bfloat16 dots keep jax's default, and a user who sets jax's
`jax_default_matmul_precision` (the one opt-in, e.g. 'tensorfloat32') gets it on every dot.
"""
from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import pytest

from t5align import checkpoints
from t5align import network
from t5align.attention import dispatch
from t5align.attention import reference

pytestmark = pytest.mark.newest_jax

FIXTURE = pathlib.Path(__file__).parents[1] / 'testdata' / 't5x' / 't5_1_1_tiny'
HIGHEST = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)


def _dots(jaxpr) -> list[tuple[tuple[jnp.dtype, ...], object]]:
  """(operand dtypes, precision) of every dot_general in `jaxpr` and its sub-jaxprs (jit, scan,
  while, cond, shard_map, custom_vjp and Pallas kernel bodies)."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      found.append((tuple(v.aval.dtype for v in eqn.invars), eqn.params['precision']))
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if isinstance(sub, jex.core.ClosedJaxpr):
          found += _dots(sub.jaxpr)
        elif isinstance(sub, jex.core.Jaxpr):
          found += _dots(sub)
  return found


def _attention_dots(impl: str, dtype) -> list:
  heads, depth, length = 2, 16, 256
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = (jax.random.normal(key, (1, length, heads, depth), dtype) for key in keys)
  options = dispatch.IMPLEMENTATIONS[impl].options
  options = options(block_q=128, block_k=128) if options else None
  fn = lambda q, k, v: dispatch.self_attention(
      q, k, v, rel_embedding=jnp.zeros((heads, 32)), segment_ids=jnp.ones((1, length), jnp.int32),
      temperature=0.8, impl=impl, options=options, dtype=dtype, with_stats=True)
  return _dots(jax.make_jaxpr(fn)(q, k, v).jaxpr)


IMPLS = ['reference', 'blockwise', 'pallas_gpu', 'pallas_tpu']


@pytest.mark.parametrize('impl', IMPLS)
def test_float32_attention_dots_are_highest(impl):
  dots = _attention_dots(impl, jnp.float32)
  assert dots and all(precision == HIGHEST for _, precision in dots), dots


@pytest.mark.parametrize('impl', IMPLS)
def test_bfloat16_attention_keeps_jax_default(impl):
  """q.k and p.v of bfloat16 operands take jax's default (None); only dots with a float32
  operand (the CPU kernels' statistics sums) are raised."""
  dots = _attention_dots(impl, jnp.bfloat16)
  assert any(dtypes == (jnp.bfloat16, jnp.bfloat16) for dtypes, _ in dots), dots
  for dtypes, precision in dots:
    assert precision == (HIGHEST if jnp.float32 in dtypes else None), (dtypes, precision)


@pytest.mark.parametrize('impl', IMPLS)
def test_user_setting_opts_into_jax_default(impl):
  with jax.default_matmul_precision('tensorfloat32'):
    dots = _attention_dots(impl, jnp.float32)
  # Canonicalized from the setting when the dot is traced: TF32 is Precision.HIGH.
  assert dots and all(precision != HIGHEST for _, precision in dots), dots


def _model_dots(config, params, tokens) -> list:
  model = network.Transformer(config)
  targets = np.ones((tokens.shape[0], 4), np.int32)
  fn = lambda p: model.apply({'params': p}, tokens, targets, targets, enable_dropout=False)
  return _dots(jax.make_jaxpr(fn)(params).jaxpr)


@pytest.mark.parametrize('impl', ['reference', 'blockwise'])
def test_float32_model_dots_are_highest(impl):
  """The whole float32 network (embedding attend, dense layers, encoder and decoder attention,
  logits): every dot at HIGHEST; with the user's setting, none."""
  params, config = checkpoints.load_params(str(FIXTURE / 'legacy' / 'checkpoint_0'))
  assert config.dtype == jnp.float32
  config = dataclasses.replace(config, attention_impl=impl)
  tokens = np.ones((2, 64), np.int32)
  dots = _model_dots(config, params, tokens)
  assert len(dots) > 10 and all(precision == HIGHEST for _, precision in dots), dots
  with jax.default_matmul_precision('tensorfloat32'):
    assert all(precision != HIGHEST for _, precision in _model_dots(config, params, tokens))


def test_dot_precision_reads_operands_and_setting():
  f32, bf16 = jnp.zeros((2,), jnp.float32), jnp.zeros((2,), jnp.bfloat16)
  assert reference.dot_precision(f32, f32) == jax.lax.Precision.HIGHEST
  assert reference.dot_precision(bf16, f32) == jax.lax.Precision.HIGHEST
  assert reference.dot_precision(bf16, bf16) is None
  with jax.default_matmul_precision('float32'):
    assert reference.dot_precision(f32, f32) is None  # The user's choice: jax applies it.


def test_run_identity_records_the_opt_in():
  """A run under the opt-in is another run: its identity records the setting (None when unset;
  a record of format 1, which left it out when unset, reads as None: `run_identity.upgrade`)."""
  from t5align import run_identity  # pylint: disable=g-import-not-at-top
  plain = run_identity.make(facts={'x': 1})
  assert plain['jax_default_matmul_precision'] is None
  old = {k: v for k, v in plain.items() if k not in ('format', 'jax_default_matmul_precision')}
  assert run_identity.upgrade(old, 'demo') == plain
  with jax.default_matmul_precision('tensorfloat32'):
    tf32 = run_identity.make(facts={'x': 1})
  assert tf32['jax_default_matmul_precision'] == 'tensorfloat32'
  assert set(run_identity.differences(plain, tf32)) == {'jax_default_matmul_precision'}
