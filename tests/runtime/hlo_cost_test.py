"""t5align/runtime/hlo_cost.py: costs of compiled programs with loop trip counts applied.

References: written-out loop costs (matmul FLOPs times trip counts), the same program compiled
with its loop unrolled, and a Pallas kernel's declared cost estimate. The TPU compiles are
deviceless and need libtpu (the test extras install it: `jax[tpu]`); without it those tests skip.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from t5align.jobs import preflight
from t5align.runtime import hlo_cost
from t5align.runtime import tpu_chips

needs_libtpu = pytest.mark.skipif(not preflight.libtpu_available(),
                                  reason='libtpu is not installed (pip install "jax[tpu]")')
V5E_2X2 = tpu_chips.parse_target('v5e:2x2')


@pytest.mark.tpu_compile
@needs_libtpu
def test_loop_costs_apply_trip_counts():
  """A scan of 10 x (scan of 3 matmuls): FLOPs = 30 x 2 n^3 (+ tanh), as when the outer loop is
  unrolled; XLA's own `cost_analysis` counts each body once."""
  devices = preflight.compile_only_devices(V5E_2X2)
  sharding = jax.sharding.SingleDeviceSharding(devices[0])
  n = 256
  arg = jax.ShapeDtypeStruct((n, n), jnp.float32, sharding=sharding)

  def program(unroll):
    def f(x, w):
      def outer(c, _):
        c, _ = jax.lax.scan(lambda c2, _: (jnp.tanh(c2 @ w), None), c, None, length=3)
        return c, None
      return jax.lax.scan(outer, x, None, length=10, unroll=unroll)[0]
    compiled = jax.jit(f).lower(arg, arg).compile()
    return compiled, hlo_cost.HloProgram(compiled.as_text())

  rolled, hlo = program(1)
  cost = hlo.cost()
  assert [(loop.trips, loop.exact) for loop in hlo.loops] == [(10, True), (3, True)]
  matmuls = 30 * 2 * n**3
  assert matmuls <= cost.flops <= matmuls * 1.01
  assert cost.transcendentals == 30 * n * n  # tanh
  assert rolled.cost_analysis()['flops'] < 0.04 * matmuls  # one inner body: 1/30
  unrolled, hlo_unrolled = program(10)
  assert not any(loop.trips == 10 for loop in hlo_unrolled.loops)
  assert hlo_unrolled.cost().flops == pytest.approx(cost.flops, rel=1e-6)
  assert hlo_unrolled.cost().bytes_accessed == pytest.approx(cost.bytes_accessed, rel=0.05)


def test_conditional_counts_its_costliest_branch_with_trip_counts():
  """A `lax.switch` whose branches hold loops (XLA's CPU compiler; the counting is the same HLO
  analysis): the costliest branch after trip counts, 5 loop matmuls, not the costliest before
  them (4 unrolled matmuls, XLA's own count) nor every branch's loops together (4 + 4 + 2)."""
  n = 128
  arg = jax.ShapeDtypeStruct((n, n), jnp.float32)

  def f(x, w, i):
    loop = lambda trips: lambda x: jax.lax.fori_loop(0, trips, lambda _, c: c @ w, x)
    return jax.lax.switch(i, [lambda x: x, loop(5), lambda x: jnp.tanh(loop(3)(x)),
                              lambda x: jnp.tanh(x @ w @ w @ w @ w)], x)

  compiled = jax.jit(f).lower(arg, arg, jax.ShapeDtypeStruct((), jnp.int32)).compile()
  hlo = hlo_cost.HloProgram(compiled.as_text())
  cost = hlo.cost()
  matmul = 2 * n**3
  assert sorted(loop.trips for loop in hlo.loops) == [3, 5]
  assert compiled.cost_analysis()['flops'] == pytest.approx(4 * matmul, rel=1e-3)
  assert cost.flops == pytest.approx(5 * matmul, rel=1e-3)
  assert cost.transcendentals == n * n  # the tanh of either branch that has one


@pytest.mark.tpu_compile
@needs_libtpu
def test_pallas_kernels_count_by_their_cost_estimate():
  """jax's own Pallas TPU flash attention (Mosaic), 3 calls in a loop: XLA's generic analysis
  knows nothing of a kernel, so the kernel's declared estimate counts, times the trip count."""
  from jax.experimental.pallas.ops.tpu import flash_attention  # pylint: disable=g-import-not-at-top
  devices = preflight.compile_only_devices(V5E_2X2)
  arg = jax.ShapeDtypeStruct((1, 8, 2048, 64), jnp.bfloat16,
                             sharding=jax.sharding.SingleDeviceSharding(devices[0]))

  def f(q, k, v):
    return jax.lax.fori_loop(0, 3, lambda i, x: flash_attention.flash_attention(x, k, v), q)

  compiled = jax.jit(f).lower(arg, arg, arg).compile()
  hlo = hlo_cost.HloProgram(compiled.as_text())
  cost = hlo.cost()
  assert hlo.custom_calls_without_estimate == [] and [loop.trips for loop in hlo.loops] == [3]
  # The kernel's own estimate (q.k and p.v of 8 heads x 2048 x 2048 x 64, exp per logit).
  kernel = compiled.cost_analysis()
  assert kernel['flops'] == pytest.approx(4 * 8 * 2048 * 2048 * 64, rel=0.01)
  assert cost.flops == pytest.approx(3 * kernel['flops'], rel=0.01)
  assert cost.transcendentals == pytest.approx(3 * 8 * 2048 * 2048, rel=0.01)
  assert cost.bytes_accessed >= 3 * 4 * 8 * 2048 * 64 * 2  # q, k, v, out per call
