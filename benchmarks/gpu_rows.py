"""gpu_check's workers: the rows of its groups, measured and checked in a subprocess.

`python -m benchmarks.gpu_rows WORK` runs WORK (JSON: a list of `{group, plan, rows, wait}`, or
`{group: 'env'}` for the environment probe) and sends each row's updates as `harness.MARK` lines
(`harness.run_row`: status and measurements, then the parity check). A JAX row compiles its
program ahead of time (`jax.jit(f).lower(...).compile()`: XLA's memory figures) and times the
compiled call; the HF rows run in a torch process without JAX.
"""
from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import time
import traceback
from typing import Any, Callable

from benchmarks import attention_bench
from benchmarks import encoder_bench
from benchmarks import gpu_plan
from benchmarks import harness

ENCODER_PARTS = ('token_embedder', 'encoder')  # The weights an encoder pass reads.
JAX_DISTRIBUTIONS = ('jax', 'jaxlib', 'jax-cuda12-plugin', 'jax-cuda13-plugin', 'flax')


def _jax_info() -> dict:
  """What produced a JAX row: the device and the versions."""
  import jax  # pylint: disable=g-import-not-at-top
  return dict(device=str(jax.devices()[0].device_kind), backend=jax.default_backend(),
              versions=harness.versions(*JAX_DISTRIBUTIONS))


def _peak_fields(before: int, framework: str, on_device: bool) -> dict:
  """`peak_bytes` after a row whose process peak was `before` (`harness.peak_memory_bytes`)."""
  after = harness.peak_memory_bytes(framework)
  return dict(peak_bytes=after, peak_set_by_this_row=bool(after > before),
              peak_kind='device peak bytes in use' if on_device else 'process max RSS')


def _jax_on_device() -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.devices()[0].platform != 'cpu'


def _xla_memory(figures) -> dict:
  """`memory.Compiled` figures (XLA's memory_analysis) as the rows' `xla_memory`."""
  return dict(temp_bytes=figures.temporaries, argument_bytes=figures.arguments,
              output_bytes=figures.outputs, generated_code_bytes=figures.generated_code)


def _measure(fn: Callable, args: tuple, repeats: int) -> tuple[dict, Any]:
  """Compiles `fn(*args)` ahead of time (XLA's memory figures), then times the compiled call."""
  import jax  # pylint: disable=g-import-not-at-top
  from t5align import memory  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - start
  before = harness.peak_memory_bytes('jax')
  timing, out = harness.time_calls(lambda: compiled(*args), jax.block_until_ready, repeats)
  return dict(timing, compile_s=round(compile_s, 3),
              xla_memory=_xla_memory(memory.Compiled.of(compiled)),
              **_peak_fields(before, 'jax', _jax_on_device())), out


def _kernel_fields(impl: str, length: int, dtype: str, head_dim: int) -> dict:
  """The implementation `impl` resolves to for a `dtype` encoder with `head_dim`
  (`dispatch.resolve`) and its options (defaults)."""
  from t5align.attention import dispatch  # pylint: disable=g-import-not-at-top
  kernel = dispatch.resolve(impl, length, 0, input_dtype=dtype, dtype=dtype, head_dim=head_dim)
  options = dispatch.IMPLEMENTATIONS[kernel].options
  return dict(kernel=kernel, options=repr(options()) if options else None)


@functools.cache
def _jitted_checks() -> tuple[Callable, Callable]:
  """(errors, finite): jitted on the device, one compilation per shape (not one per op)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  def errors(got, want):
    diff = got.astype(jnp.float32) - want.astype(jnp.float32)
    return (jnp.linalg.norm(diff) / jnp.linalg.norm(want.astype(jnp.float32)),
            jnp.max(jnp.abs(diff)))

  return jax.jit(errors), jax.jit(lambda x: jnp.all(jnp.isfinite(x)))


def _errors(got, want) -> tuple[float, float]:
  """(relative L2 error, largest absolute error) of `got` against `want`, in float32."""
  relative, largest = _jitted_checks()[0](got, want)
  return float(relative), float(largest)


def _finite(*arrays) -> bool:
  return all(bool(_jitted_checks()[1](x)) for x in arrays)


def _carried(check: dict | None, where: str, **own) -> dict:
  """A row's parity where it has no base of its own: the check of the same implementation and
  weights at a shorter length (`where`), and the row's own `own` fields (finiteness)."""
  if check is None:
    return {'error': f'no check to carry: {where} did not finish', **own}
  if 'error' in check:
    return {'error': f'the check at {where} failed: {check["error"]}', **own}
  kept = {k: v for k, v in check.items() if k not in ('role', 'inputs', 'note')}
  ok = check.get('ok', True) and own.get('all_finite', True)
  return {**kept, **own, 'checked_at': check.get('length', where), 'ok': ok,
          'note': f'no parity base at this length: carries the check at {where}'}


def _attention_fn(row: dict) -> Callable:
  """`(q, k, v, table, ids) -> out or (out, RowStats)`: one attention row's computation."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from t5align.attention import reference  # pylint: disable=g-import-not-at-top
  impl, tau, length, dtype = row['impl'], row['tau'], row['length'], jnp.dtype(row['dtype'])
  if impl in gpu_plan.JAX_NN:
    implementation, bias = impl.split('_')

    def call(q, k, v, table, ids):
      del ids  # One segment, no padding: no mask.
      # NOTE: jax's scale multiplies q.k only; T5 has no 1/sqrt(d), and tau divides q.k + bias.
      # [h, 32] -> [1, h, L, L]
      full = ((reference.relative_position_bias(table, length, length, True) / tau).astype(dtype)
              if bias == 'bias' else None)
      return jax.nn.dot_product_attention(q, k, v, bias=full, scale=1.0 / tau,
                                          implementation=implementation)
    return call
  return attention_bench.attention_call(impl, dtype, tau)


def _attention_worker(plan: dict, rows: list[dict]) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from t5align.attention import dispatch  # pylint: disable=g-import-not-at-top
  from t5align.attention import reference  # pylint: disable=g-import-not-at-top
  info = _jax_info()
  tol = gpu_plan.tolerance(plan['dtype'])
  for length in plan['lengths']:
    todo = [r for r in rows if r['length'] == length]
    if not todo:
      continue
    base = {}  # The parity base's output at this length: (out, RowStats).
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    # [b, l, h, d]
    q, k, v = (jax.random.normal(key, (1, length, plan['heads'], plan['depth']),
                                 jnp.dtype(plan['dtype'])) for key in keys[:3])
    table = jax.random.normal(keys[3], (plan['heads'], reference.NUM_BUCKETS), jnp.float32)
    ids = jnp.ones((1, length), jnp.int32)
    for row in todo:
      got = {}

      def measure(row=row, got=got):
        result, got['out'] = _measure(_attention_fn(row), (q, k, v, table, ids), row['repeats'])
        flops = attention_bench.attention_flops(length, plan['heads'], plan['depth'])
        fields = dict(result, tflops_per_s=round(flops / result['seconds'] / 1e12, 4), **info)
        if row['impl'] in dispatch.NAMES:
          fields.update(_kernel_fields(row['impl'], length, row['dtype'], plan['depth']))
        return fields

      def parity(row=row, got=got):
        out, stats = got.pop('out') if row['with_stats'] else (got.pop('out'), None)
        finite = _finite(out, *(stats or ()))
        if row['impl'] == row['base']:
          base['out'] = (out, stats)
          return dict(role='the parity base at this length', all_finite=finite)
        if row['impl'].endswith('nobias'):
          return dict(role='finite only: no bias, another function (the floor)',
                      all_finite=finite)
        if 'out' not in base:
          return {'error': f"no parity base: {row['base']} did not finish at this length"}
        (want, want_stats), check = base['out'], dict(vs=row['base'], all_finite=finite)
        check['out_rel_err'] = _errors(out, want)[0]
        ok = finite and check['out_rel_err'] <= tol['out']
        if stats is not None:
          check['pmax_max_abs_err'] = _errors(stats.pmax, want_stats.pmax)[1]
          check['entropy_max_abs_err'] = _errors(stats.entropy, want_stats.entropy)[1]
          ok = (ok and check['pmax_max_abs_err'] <= tol['pmax']
                and check['entropy_max_abs_err'] <= tol['entropy'])
        check['inputs'] = 'the same q, k, v and table'
        if row['check_padded']:
          padded = attention_bench.check_against_reference(
              row['impl'], plan['heads'], plan['depth'], jnp.dtype(plan['dtype']),
              length=plan['check_length'])
          padded['length'] = plan['check_length']
          check['padded_batch_vs_reference'] = padded
          ok = (ok and padded['all_finite'] and padded['out_rel_err'] <= tol['out']
                and padded['pmax_max_abs_err'] <= tol['pmax']
                and padded['entropy_max_abs_err'] <= tol['entropy'])
        return dict(check, ok=bool(ok))

      if row['status'] == 'pending':
        harness.run_row(row, measure, parity)


def _model_inputs(row: dict, cache: dict, parts=ENCODER_PARTS):
  """A row's config, the group's random weights (made once: `cache`) and its tokens `[1, L]`.

  The weights are drawn on the device off the CPU (numpy would take about a minute for XXL's),
  with numpy on the CPU (jax.random would compile once per shape: longer, for tiny models).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  config = encoder_bench.model_config(row)
  if 'params' not in cache:
    cache['params'] = encoder_bench.random_params(
        config, config.dtype, parts, on_device=jax.default_backend() != 'cpu')
  tokens = np.random.default_rng(1).integers(2, config.vocab_size, (1, row['length']), np.int32)
  return config, cache['params'], tokens


def _tree_bytes(tree) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree)))


def _encoder_worker(plan: dict, rows: list[dict]) -> None:
  """The 'encoder' and 'xxl' groups: encoder forward passes, checked as `plan['check']` says."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  info = _jax_info()
  tol = gpu_plan.tolerance(plan['dtype'])
  sizes = encoder_bench.MODELS[plan['model']]
  kernel, check_length = next(iter(plan['impls'])), plan['lengths'][0]
  checks, kernel_out = {}, {}  # impl -> its check at check_length; the kernel's output there.
  cache = {}
  for row in rows:
    config, params, tokens = _model_inputs(row, cache)
    model = network.Transformer(config)
    got = {}

    def measure(row=row, model=model, params=params, tokens=tokens, got=got):
      result, got['out'] = _measure(lambda p, t: model.apply(
          {'params': p}, t, method=model.encode, enable_dropout=False), (params, tokens),
          row['repeats'])
      flops = encoder_bench.encoder_flops(sizes, row['length'])
      return dict(result, tflops_per_s=round(flops / result['seconds'] / 1e12, 4),
                  **_kernel_fields(row['impl'], row['length'], row['dtype'],
                                   row['sizes']['head_dim']),
                  weights_bytes=_tree_bytes(params), **info)

    def parity(row=row, params=params, got=got):
      out = got.pop('out')
      finite = _finite(out)
      if plan['check'] == 'attention':  # The kernel at this model's heads, vs 'reference'.
        check = attention_bench.check_against_reference(row['impl'], sizes['num_heads'],
                                               sizes['head_dim'], jnp.dtype(plan['dtype']),
                                               length=plan['check_length'])
        ok = (check['all_finite'] and finite and check['out_rel_err'] <= tol['out']
              and check['pmax_max_abs_err'] <= tol['pmax']
              and check['entropy_max_abs_err'] <= tol['entropy'])
        return dict(check, vs='reference', length=plan['check_length'], output_all_finite=finite,
                    inputs=f"attention alone at this model's {sizes['num_heads']} heads x "
                           f"{sizes['head_dim']}, batch 2 (row 1 padded), taus 0.8 / 0.6",
                    ok=bool(ok))
      if row['length'] != check_length:
        return _carried(checks.get(row['impl']), f'{check_length} tokens', all_finite=finite)
      if row['impl'] == kernel:
        kernel_out[check_length] = out
        check = encoder_bench.check_model(
            {**row, 'kind': 'forward'}, params=params)
        check.update(vs='reference', inputs='the same weights; batch 2, row 1 padded at 70%',
                     ok=bool(check['all_finite'] and check['out_rel_err'] <= tol['model']))
      elif check_length in kernel_out:
        check = dict(vs=kernel, length=check_length, inputs='the same weights and tokens',
                     out_rel_err=_errors(out, kernel_out[check_length])[0], all_finite=finite)
        check['ok'] = bool(finite and check['out_rel_err'] <= tol['model'])
      else:
        check = {'error': f'no parity base: {kernel} did not finish at {check_length}'}
      checks[row['impl']] = check
      return check

    if row['status'] == 'pending':
      harness.run_row(row, measure, parity)


def _sweep_worker(plan: dict, rows: list[dict]) -> None:
  import numpy as np  # pylint: disable=g-import-not-at-top
  from t5align import calibration  # pylint: disable=g-import-not-at-top
  from t5align.calibration import stats  # pylint: disable=g-import-not-at-top
  from t5align import jobs  # pylint: disable=g-import-not-at-top
  info = _jax_info()
  tol = gpu_plan.tolerance(plan['dtype'])['sweep']
  sizes = encoder_bench.MODELS[plan['model']]
  taus = encoder_bench.TAUS
  base, checks = {}, {}  # length -> the base's (pmax, entropy); impl -> its first check.
  cache = {}
  for row in rows:
    config, params, tokens = _model_inputs(row, cache)
    tokens = np.asarray(tokens)
    got = {}

    def measure(row=row, config=config, params=params, tokens=tokens, got=got):
      start = time.perf_counter()
      # The program encoder_attention_stats runs, compiled (and kept) for XLA's figures.
      search = calibration.SearchSettings(batch_size=1, tau_batch_size=len(taus))
      (sweep,) = jobs.CalibrationJob(search=search).programs(config, None, params,
                                                             length=row['length'])
      figures = sweep.check_memory('This calibration sweep')
      compile_s = time.perf_counter() - start
      before = harness.peak_memory_bytes('jax')
      timing, got['out'] = harness.time_calls(
          lambda: stats.encoder_attention_stats(params, config, tokens, taus), lambda x: x,
          row['repeats'])
      flops = len(taus) * encoder_bench.encoder_flops(sizes, row['length'])
      return dict(timing, compile_s=round(compile_s, 3), xla_memory=_xla_memory(figures),
                  **_peak_fields(before, 'jax', _jax_on_device()),
                  tflops_per_s=round(flops / timing['seconds'] / 1e12, 4),
                  pmax=[round(float(x), 6) for x in got['out'].pmax],
                  entropy=[round(float(x), 5) for x in got['out'].entropy],
                  tau_chunk=stats.default_tau_chunk(), weights_bytes=_tree_bytes(params),
                  **_kernel_fields(row['impl'], row['length'], row['dtype'],
                                   row['sizes']['head_dim']), **info)

    def parity(row=row, got=got):
      out = got.pop('out')
      pmax, entropy = np.asarray(out.pmax, np.float64), np.asarray(out.entropy, np.float64)
      finite = bool(np.isfinite(pmax).all() and np.isfinite(entropy).all())
      if row['impl'] == row['base']:
        base[row['length']] = (pmax, entropy)
        return dict(role='the parity base at this length', all_finite=finite)
      if row['length'] not in base:
        first = min(base) if base else None
        return _carried(checks.get(row['impl']), f'{first} tokens', all_finite=finite)
      want_pmax, want_entropy = base[row['length']]
      check = dict(vs=row['base'], length=row['length'], all_finite=finite,
                   inputs='the same weights, tokens and 11 taus',
                   pmax_max_abs_err=float(np.abs(pmax - want_pmax).max()),
                   entropy_max_abs_err=float(np.abs(entropy - want_entropy).max()))
      check['ok'] = bool(finite and check['pmax_max_abs_err'] <= tol
                         and check['entropy_max_abs_err'] <= tol)
      checks.setdefault(row['impl'], check)
      return check

    if row['status'] == 'pending':
      harness.run_row(row, measure, parity)


def _decode_worker(plan: dict, rows: list[dict]) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from t5align import decoding  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  info = _jax_info()
  steps = plan['tokens']
  tol = gpu_plan.tolerance(plan['dtype'])['model']
  cache = {}
  for row in rows:
    config, params, tokens = _model_inputs(row, cache, (*ENCODER_PARTS, 'decoder'))
    model = network.Transformer(config)
    got = {}

    def measure(row=row, model=model, params=params, tokens=tokens, got=got):
      # eos_id -1: never stops early, so that every row decodes `steps` tokens.
      result, out = _measure(lambda p, t: decoding.greedy(
          model, p, t, max_decode_length=steps, eos_id=-1), (params, tokens), row['repeats'])
      got['tokens'] = np.asarray(out[0])
      return dict(result, **_kernel_fields(row['impl'], row['length'], row['dtype'],
                                           row['sizes']['head_dim']),
                  output_tokens=[int(x) for x in got['tokens']],
                  weights_bytes=_tree_bytes(params), **info)

    def parity(model=model, params=params, tokens=tokens, got=got):
      # The greedy tokens teacher-forced through the parallel decoder (no cache; the scoring
      # path) over the same input: each must be its position's argmax, up to rounding. The gap
      # is the argmax's logit minus the token's, over the argmax's distance from the mean logit;
      # bfloat16 leaves near-ties (random weights, two programs rounding differently), so the
      # tokens themselves may differ where the gap is within the dtype's tolerance.
      out = got.pop('tokens')  # [t]
      previous = np.concatenate([[0], out[:-1]])[None].astype(np.int32)  # [1, t], start 0

      def forced(p, t, previous):
        encoded = model.apply({'params': p}, t, method=model.encode, enable_dropout=False)
        # [1, t, vocab]
        return model.apply({'params': p}, encoded, t, previous, jnp.ones_like(previous),
                           enable_dropout=False, method=model.decode)

      logits = np.asarray(jax.jit(forced)(params, tokens, previous)[0], np.float32)  # [t, vocab]
      top = logits.max(-1)
      gap = (top - logits[np.arange(len(out)), out]) / (top - logits.mean(-1))
      largest = float(gap.max())
      return dict(vs='teacher_forced', inputs='the same weights and input; the greedy tokens '
                  'fed to the decoder without its cache',
                  argmax_tokens=int((logits.argmax(-1) == out).sum()), tokens=steps,
                  largest_relative_gap=largest, all_finite=bool(np.isfinite(logits).all()),
                  ok=bool(np.isfinite(logits).all() and largest <= tol))

    if row['status'] == 'pending':
      harness.run_row(row, measure, parity)


def _hf_worker(plan: dict, rows: list[dict]) -> None:
  """HuggingFace rows, in a torch process (no JAX here)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  device, dtype = harness.torch_device_and_dtype(plan['dtype'])
  info = dict(device=torch.cuda.get_device_name() if device == 'cuda' else 'cpu',
              versions=harness.versions('torch', 'transformers'))
  block = harness.torch_block(device)
  sizes = encoder_bench.MODELS[plan['model']]
  tol = gpu_plan.tolerance(plan['dtype'])['model']
  eager = {}  # length -> (eager row id, its output): sdpa's parity base.
  weights_note = ("HF's own random init (torch.manual_seed(0)), not t5align's weights: only "
                  'times compare across frameworks')

  def build(cls, config):
    torch.manual_seed(0)  # The same weights for every attention implementation.
    torch.set_default_dtype(dtype)
    try:
      with torch.device(device):
        return cls(config).eval()
    finally:
      torch.set_default_dtype(torch.float32)

  for row in rows:
    if row['status'] != 'pending':
      continue
    tokens = torch.randint(2, sizes['vocab_size'], (1, row['length']),
                           generator=torch.Generator().manual_seed(1)).to(device)
    got = {}

    def measure(row=row, tokens=tokens, got=got):
      if device == 'cuda':
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
      before = harness.peak_memory_bytes('torch')
      held = {}  # The model, dropped once timed.
      if row['kind'] == 'hf_encoder':
        held['model'] = build(transformers.T5EncoderModel,
                              encoder_bench.hf_config(sizes, row['impl']))
        call = lambda: held['model'](input_ids=tokens).last_hidden_state
      else:
        held['model'] = build(transformers.T5ForConditionalGeneration, encoder_bench.hf_config(
            sizes, row['impl'], decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
        call = lambda: held['model'].generate(input_ids=tokens, max_new_tokens=row['tokens'],
                                              min_new_tokens=row['tokens'], do_sample=False)
      with torch.no_grad():
        timing, got['out'] = harness.time_calls(call, block, row['repeats'])
      held.clear()
      fields = dict(timing, **_peak_fields(before, 'torch', device == 'cuda'),
                    weights=weights_note, **info)
      if row['kind'] == 'hf_encoder':
        flops = encoder_bench.encoder_flops(sizes, row['length'])
        fields['tflops_per_s'] = round(flops / timing['seconds'] / 1e12, 4)
      return fields

    def parity(row=row, got=got):
      out = got.pop('out')
      finite = bool(torch.isfinite(out.float()).all()) if out.is_floating_point() else True
      if row['kind'] == 'hf_generate':
        new = int(out.shape[1]) - 1  # After the decoder start token.
        return dict(role='generated the asked number of tokens (its weights are not '
                    "t5align's: no token comparison)", generated_tokens=new,
                    ok=new == row['tokens'])
      if row['impl'] == 'eager':
        eager[row['length']] = (row['id'], out)
        return dict(role="HF's eager attention: the base of sdpa's check", all_finite=finite)
      if row['length'] not in eager:
        return {'error': f'no parity base: HF eager did not finish at {row["length"]}'}
      base_id, want = eager.pop(row['length'])
      want, out = want.float(), out.float()
      error = float((out - want).norm() / want.norm())
      return dict(vs=base_id, inputs='the same weights and tokens', out_rel_err=error,
                  all_finite=finite, ok=bool(finite and error <= tol))

    harness.run_row(row, measure, parity)
    if device == 'cuda':
      torch.cuda.empty_cache()


def _env_worker() -> None:
  import jax  # pylint: disable=g-import-not-at-top
  from t5align.attention import dispatch  # pylint: disable=g-import-not-at-top
  backend = jax.default_backend()
  device = jax.devices()[0]
  # This platform's fused kernels: those that compile for it and not for the CPU; 'pallas' is
  # the one of them picked for the GPU run's attention rows.
  kernels = [name for name, impl in dispatch.IMPLEMENTATIONS.items()
             if backend in impl.platforms and 'cpu' not in impl.platforms]
  plan = gpu_plan.GPU_PLAN['attention']
  fused = (dispatch.resolve('pallas', 1, 0, input_dtype=plan['dtype'], dtype=plan['dtype'],
                            head_dim=plan['depth']) if backend in dispatch.FUSED else None)
  harness.emit('env', backend=backend, device=str(device.device_kind),
               device_count=jax.device_count(),
               memory_bytes=(device.memory_stats() or {}).get('bytes_limit'), fused=fused,
               kernels=kernels, jax_platforms=os.environ.get('JAX_PLATFORMS'),
               versions=harness.versions(*JAX_DISTRIBUTIONS, 'numpy'))


# What a waiting worker imports before it waits (`_worker`).
IMPORTS = {'hf': ('torch', 'transformers.models.t5.modeling_t5', 'transformers.generation')}
WORKERS = {'attention': _attention_worker, 'encoder': _encoder_worker, 'xxl': _encoder_worker,
           'sweep': _sweep_worker, 'decode': _decode_worker, 'hf': _hf_worker}


def run(work: list[dict]) -> None:
  """A subprocess's work: groups' rows (`{group, plan, rows, wait}` each, in order), one
  `harness.MARK` line per update on stdout. `wait`: the group's libraries are imported first,
  then its rows wait for a line on stdin (the HF worker imports torch while the JAX workers run,
  and touches the GPU only after they have ended)."""
  for spec in work:
    if spec['group'] == 'env':
      _env_worker()
      continue
    if spec.get('wait'):
      for module in IMPORTS.get(spec['group'], ()):
        try:
          importlib.import_module(module)
        except ImportError:  # The group's own imports will say so, in its rows.
          traceback.print_exc()
      sys.stdin.readline()
    if spec['rows']:
      WORKERS[spec['group']](spec['plan'], spec['rows'])


if __name__ == '__main__':
  run(json.loads(sys.argv[1]))
