"""T5 encoder forward and an 11-tau calibration sweep, t5align beside HuggingFace; prints JSON.

Run from the repository root:
  python -m benchmarks.encoder_bench --preset cpu         # T5 1.1 small, float32, L 1k..32k
  python -m benchmarks.encoder_bench --preset cpu --lengths 1024 2048 --calibration-lengths \
      --decode-lengths                                    # a quick subset
  python -m benchmarks.encoder_bench --preset cpu-small   # tiny model, float32, L 512..16k
  python -m benchmarks.encoder_bench --preset gpu         # Flan-T5-XL/XXL shapes, bf16
  python -m benchmarks.encoder_bench --preset cpu-small --lengths --calibration-lengths \
      --decode-lengths 4096 16384                         # only the decode rows


Random weights. 'forward' is one encoder pass (batch 1); 'calibration' is the encoder's mean
P_max/entropy at 11 temperatures (t5align: `stats.encoder_attention_stats`, the
compiled sweep calibration runs, taus vmapped `default_tau_chunk()` at a time; HF: 11 passes with
tau applied by setting T5Attention.scaling = 1/tau and dividing the shared position bias by tau,
statistics taken in forward hooks; HF draws its own random weights, so its statistics are of
another model and differ in value). 'decode' is greedy decoding of `DECODE_TOKENS` tokens (EOS
disabled) by the T5 1.1 small shapes (8+8 layers) over a random `[1, L, e]` encoder output, one
row with the cross-attention keys/values projected once into the decode cache ('cached', what
`decoding.greedy` does) and one projecting them at every token as written ('per_step', t5x's
way; XLA's loop-invariant code motion lifts that projection out of the decoding loop on CPU, so
the two rows time alike there);
`seconds` is the median wall time for DECODE_TOKENS tokens, `tokens_1` that of one token
(the one-time work: cache set-up, cached projections), `seconds_per_token` each further token,
(t(16) - t(1)) / 15. Each measurement runs in its own subprocess (`harness.run_worker`; see
attention_bench.py for the memory and TFLOP/s conventions; FLOPs here are the whole encoder's
matmuls).

The machine's own peak is measured in the same run: a large matmul in the preset's dtype
through XLA (`peak_size` square; `harness.matmul_peak`), as 'peak' rows at the start and
the end, and inside every forward / calibration row's process once before each of its timed
calls (CPU; HF rows on a GPU use the 'peak' rows), so that the row and the peak share the load
of the moment. Every such row gives `peak_tflops_per_s` and `fraction_of_peak` (its TFLOP/s over
that peak), and the JSON's `summary` the issue-24 ratios (`summary`): forward TFLOP/s at each
length over the mean at `BASE_LENGTHS`, and the calibration sweep's over the forward's at the
same length, in TFLOP/s and in fraction of peak. A skipped row says why (`skipped`).

Before a t5align forward or calibration row is timed, a separate subprocess checks that
implementation against 'reference' with the same weights on a batch of 2 (row 1 padded), at the
row's length where 'reference' fits (`check_max_length`), else at that length, saying so
(`check_vs_reference`: length checked, output relative error, largest P_max / entropy error).
HF rows use the preset's `hf_attention` ('sdpa': PyTorch's fused attention) for 'forward';
calibration needs the probabilities (forward hooks), so HF calibration is 'eager'. An HF row
whose time or peak memory, extrapolated quadratically from the previous length, would exceed
`hf_max_s` or the machine's memory is skipped with the reason in its row. Weights are random
(numpy, scaled like t5x's initializers); `weights_bytes` is their size and `baseline_rss_bytes`
the process's RSS before they exist.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from benchmarks import attention_bench
from benchmarks import harness

# Sizes: the released T5 1.1 / Flan-T5 checkpoints' (emb, heads x head_dim, encoder layers, mlp);
# gated-gelu, vocab 32128.
MODELS = {
    # T5 1.1 small (decode rows).
    'small': dict(vocab_size=32128, emb_dim=512, num_heads=6, head_dim=64, num_encoder_layers=8,
                  num_decoder_layers=8, mlp_dim=1024),
    'tiny': dict(vocab_size=128, emb_dim=64, num_heads=4, head_dim=16, num_encoder_layers=2,
                 num_decoder_layers=2, mlp_dim=128),
    # 'tiny' with one layer each side: benchmarks/gpu_check.py's smoke mode (shorter compiles).
    'smoke': dict(vocab_size=128, emb_dim=64, num_heads=4, head_dim=16, num_encoder_layers=1,
                  num_decoder_layers=1, mlp_dim=128),
    'xl': dict(vocab_size=32128, emb_dim=2048, num_heads=32, head_dim=64, num_encoder_layers=24,
               num_decoder_layers=24, mlp_dim=5120),
    'xxl': dict(vocab_size=32128, emb_dim=4096, num_heads=64, head_dim=64, num_encoder_layers=24,
                num_decoder_layers=24, mlp_dim=10240),
}
PRESETS = {
    'cpu': dict(models=['small'], lengths=[1024, 2048, 4096, 8192, 16384, 32768],
                dtype='float32', impls=['blockwise', 'reference'], repeats=2, hf_repeats=1,
                hf_attention='sdpa', hf_max_s=180, calibration_lengths=[2048],
                decode_model='small', decode_lengths=[4096, 16384], check_max_length=4096,
                max_length={'reference': 4096, 'pallas': 0}, peak_size=4096),
    'smoke': dict(models=['tiny'], lengths=[160], dtype='float32', impls=['blockwise'],
                  repeats=0, hf_attention='sdpa', calibration_lengths=[128], decode_model='tiny',
                  decode_lengths=[128], check_max_length=4096, max_length={}, peak_size=256),
    'cpu-small': dict(models=['tiny'], lengths=[512, 2048, 4096, 16384], dtype='float32',
                      impls=['reference', 'blockwise', 'pallas'], repeats=2,
                      calibration_lengths=[2048], decode_model='small',
                      decode_lengths=[4096, 16384],
                      max_length={'reference': 4096, 'pallas': 2048, 'hf': 4096},
                      peak_size=4096),
    'gpu': dict(models=['xl', 'xxl'], lengths=[512, 2048, 4096, 8192, 15000, 16384],
                dtype='bfloat16', impls=['reference', 'blockwise', 'pallas'], repeats=3,
                hf_repeats=1,  # HF's 11-tau loop at 15k is ~1 minute per sweep.
                calibration_lengths=[4096, 15000], decode_model='xl', decode_lengths=[16384],
                max_length={'reference': 8192, 'hf': 15000}, peak_size=16384),
}
# The lengths whose mean forward throughput longer inputs are compared with (`summary`).
BASE_LENGTHS = (4096, 8192)
TAUS = [1.0 - 0.05 * i for i in range(11)]
DECODE_TOKENS = 16


def encoder_flops(model: dict, length: int) -> float:
  """Matmul FLOPs of one encoder pass: projections, attention core, gated MLP."""
  e, hd, f = model['emb_dim'], model['num_heads'] * model['head_dim'], model['mlp_dim']
  per_layer = 8 * length * e * hd + 4 * length * length * hd + 6 * length * e * f
  return per_layer * model['num_encoder_layers']


def random_params(config, dtype, parts=('token_embedder', 'encoder'), on_device=False):
  """Random params (the top-level `parts`) in `dtype`, scaled like t5x's initializers.

  Drawn with numpy in float32, one array at a time, so that making them costs no more memory
  than holding them (jax.random's counters would take several times the embedding's size).
  `on_device`: drawn by jax.random on the default device instead, also one array at a time (on a
  GPU, seconds where numpy takes about a minute for Flan-T5-XXL's 4.7e9 values; the counters'
  transient memory is then the device's: a few times the largest array).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  shapes = network.param_shapes(config)
  shapes = {k: shapes[k] for k in parts}
  rng = np.random.default_rng(0)
  # (key, std, shape) -> one array; compiled once per shape.
  normal = jax.jit(lambda key, std, shape: (jax.random.normal(key, shape, jnp.float32) * std
                                            ).astype(dtype), static_argnums=2)
  drawn = []  # Arrays drawn on the device so far: each takes its own key.

  def make(path, leaf):
    name = jax.tree_util.keystr(path)
    if 'scale' in name:
      return jnp.ones(leaf.shape, dtype)
    std = 1.0 if 'embedding' in name else leaf.shape[0] ** -0.5
    if 'query' in name:
      std /= config.head_dim ** 0.5  # T5 folds 1/sqrt(d) into the query kernel.
    if on_device:
      drawn.append(normal(jax.random.fold_in(jax.random.PRNGKey(0), len(drawn)), std,
                          tuple(leaf.shape)))
      return drawn[-1]
    values = rng.standard_normal(leaf.shape, dtype=np.float32)
    values *= np.float32(std)
    return jnp.asarray(values, dtype)

  return jax.tree_util.tree_map_with_path(make, shapes)


def model_config(spec: dict, **overrides):
  """The `T5Config` of a row: `MODELS[spec['model']]` in `spec['dtype']`, gated-gelu, no
  dropout, attention `spec['impl']` with `spec['pallas']`'s kernel options; `overrides`: further
  fields."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  sizes = MODELS[spec['model']]
  fields = dict(sizes, dtype=jnp.dtype(spec['dtype']), dropout_rate=0.0,
                mlp_activations=('gelu', 'linear'), attention_impl=spec['impl'],
                **attention_bench.config_options({**spec, 'depth': sizes['head_dim']}))
  return network.T5Config(**{**fields, **overrides})


def _rss_bytes() -> int:
  """The process's resident set now (Linux)."""
  import os  # pylint: disable=g-import-not-at-top
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def check_model(spec: dict, params=None) -> dict:
  """`spec['impl']` vs 'reference', same weights, batch 2 (row 1 padded to 70%) at `length`.

  'forward': relative L2 error of the encoder output over real rows; 'calibration': the mean
  P_max / entropy at 3 of the taus (1.0, 0.75, 0.5), largest absolute differences. `params`:
  the weights to check with (those of a row timed in the same process); None: `random_params`.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from t5align.calibration import stats  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  length = spec['length']
  config = model_config(spec)
  if params is None:
    params = random_params(config, config.dtype)
  tokens = np.array(jax.random.randint(jax.random.PRNGKey(3), (2, length), 2,
                                         config.vocab_size))
  tokens[1, int(length * 0.7):] = 0
  real = tokens > 0
  result = {'length': length}
  for_impl = {}
  for impl in (spec['impl'], 'reference'):
    model = network.Transformer(model_config(spec, attention_impl=impl))
    if spec['kind'] == 'forward':
      out = jax.jit(lambda p, t, model=model: model.apply(
          {'params': p}, t, method=model.encode, enable_dropout=False))(params, tokens)
      for_impl[impl] = np.asarray(out, np.float64)[real]
    else:
      out = stats.encoder_attention_stats(params, model.config, tokens,
                                                      [1.0, 0.75, 0.5])
      for_impl[impl] = {'pmax': out.pmax, 'entropy': out.entropy}
  got, ref = for_impl[spec['impl']], for_impl['reference']
  if spec['kind'] == 'forward':
    result['out_rel_err'] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    result['all_finite'] = bool(np.isfinite(got).all())
  else:
    result['pmax_max_abs_err'] = float(np.abs(got['pmax'] - ref['pmax']).max())
    result['entropy_max_abs_err'] = float(np.abs(got['entropy'] - ref['entropy']).max())
    result['all_finite'] = bool(all(np.isfinite(v).all() for v in got.values()))
  return result


def _decode_worker(spec: dict) -> dict:
  """Greedy decoding over a random encoder output, cross K/V cached or projected per step."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from t5align import decoding  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  dtype = jnp.dtype(spec['dtype'])
  config = model_config(spec)
  params = random_params(config, dtype, ('token_embedder', 'decoder'))
  model = network.Transformer(config)
  key_e, key_t = jax.random.split(jax.random.PRNGKey(1))
  # [1, L, e]: the decoder's cost does not depend on what the encoder wrote.
  encoded = jax.random.normal(key_e, (1, spec['length'], config.emb_dim), dtype)
  tokens = jax.random.randint(key_t, (1, spec['length']), 2, config.vocab_size)
  result = {}
  for steps in (1, DECODE_TOKENS):
    fn = jax.jit(lambda p, e, t, steps=steps: decoding.greedy_from_encoded(
        model, p, e, t, max_decode_length=steps, eos_id=-1,  # -1: never stops early.
        cache_cross_kv=spec['cross_kv'] == 'cached'))
    timing, out = harness.time_calls(lambda: fn(params, encoded, tokens), jax.block_until_ready,
                                    spec['repeats'])
    result[f'tokens_{steps}'] = timing
  result['seconds'] = result[f'tokens_{DECODE_TOKENS}']['seconds']
  # Each token after the first: (t(16 tokens) - t(1 token)) / 15.
  result['seconds_per_token'] = round(
      (result['seconds'] - result['tokens_1']['seconds']) / (DECODE_TOKENS - 1), 5)
  result['tokens'] = [int(x) for x in out[0]]
  return {**result, 'device': str(jax.devices()[0].device_kind)}


def _jax_worker(spec: dict) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from t5align.calibration import stats  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  from t5align import partitioning  # pylint: disable=g-import-not-at-top
  dtype = jnp.dtype(spec['dtype'])
  config = model_config(spec)
  baseline = _rss_bytes()
  # Parameters sharded over 'model' across every device (one device: as plain jit), traced
  # under the logical axis rules, as calibration runs it (taus over 'tau', here of size 1).
  mesh = partitioning.calibration_mesh(1, 1, jax.device_count())
  params = partitioning.place_params(random_params(config, dtype), config, mesh)
  model = network.Transformer(config)
  tokens = partitioning.global_array(
      jax.random.randint(jax.random.PRNGKey(1), (1, spec['length']), 2, config.vocab_size),
      partitioning.replicated(mesh))

  if spec['kind'] == 'forward':
    fn = partitioning.partition(lambda p, t: model.apply({'params': p}, t, method=model.encode,
                                                         enable_dropout=False), mesh)
    call = lambda: fn(params, tokens)
  else:  # What calibration runs: the library's compiled sweep (taus over 'tau', chunked).
    host_tokens = np.asarray(tokens)
    call = lambda: stats.encoder_attention_stats(params, config, host_tokens, TAUS,
                                                             mesh=mesh)
  result, out = harness.time_calls(call, jax.block_until_ready, spec['repeats'], _peak(spec))
  if spec['kind'] == 'calibration':
    result['pmax'] = [round(float(x), 5) for x in out.pmax]
    result['entropy'] = [round(float(x), 4) for x in out.entropy]
    result['tau_chunk'] = stats.default_tau_chunk()
  weights = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(params))
  return {**result, 'device': str(jax.devices()[0].device_kind), 'mesh': dict(mesh.shape),
          'weights_bytes': int(weights), 'baseline_rss_bytes': baseline}


def hf_config(sizes: dict, attention: str, **overrides):
  """HuggingFace's `T5Config` of `sizes` (a `MODELS` entry): gated-gelu, no dropout, attention
  `attention` ('eager', 'sdpa', ...); `overrides`: further T5Config fields."""
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.T5Config(
      vocab_size=sizes['vocab_size'], d_model=sizes['emb_dim'], d_kv=sizes['head_dim'],
      d_ff=sizes['mlp_dim'], num_layers=sizes['num_encoder_layers'],
      num_decoder_layers=sizes['num_decoder_layers'], num_heads=sizes['num_heads'],
      feed_forward_proj='gated-gelu', dropout_rate=0.0, attn_implementation=attention,
      **overrides)


def _torch_worker(spec: dict) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from transformers.models.t5 import modeling_t5  # pylint: disable=g-import-not-at-top
  sizes = MODELS[spec['model']]
  device, dtype = harness.torch_device_and_dtype(spec['dtype'])
  config = hf_config(sizes, spec.get('hf_attention', 'eager'))
  torch.set_default_dtype(dtype)
  with torch.device(device):
    model = transformers.T5EncoderModel(config).eval()
  tokens = torch.randint(2, sizes['vocab_size'], (1, spec['length']), device=device)
  attentions = [m for m in model.modules() if isinstance(m, modeling_t5.T5Attention)]
  block = harness.torch_block(device)
  # NOTE: on a GPU, JAX would claim the device's memory; HF rows there use the run's 'peak' rows.
  peak = _peak(spec) if device == 'cpu' else None
  if spec['kind'] == 'forward':
    with torch.no_grad():
      result, _ = harness.time_calls(lambda: model(input_ids=tokens), block, spec['repeats'], peak)
    return {**result, 'device': torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}

  rows = []  # (pmax, entropy) per layer of the current pass.

  def hook(module, inputs, output):
    pmax = entropy = 0.0
    for probs in output[2].unbind(1):  # [b, h, q, k] -> h x [b, q, k]; one f32 copy at a time.
      probs = probs.float()
      pmax += probs.amax(-1).mean().item()
      entropy += -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1).mean().item()
    heads = output[2].shape[1]
    rows.append((pmax / heads, entropy / heads))

  for m in attentions:
    m.register_forward_hook(hook)
  first = attentions[0]
  compute_bias = first.compute_bias

  def sweep():
    pmax, entropy = [], []
    for tau in TAUS:
      rows.clear()
      for m in attentions:
        m.scaling = 1.0 / tau
      first.compute_bias = lambda *a, tau=tau, **k: compute_bias(*a, **k) / tau
      model(input_ids=tokens)
      pmax.append(sum(r[0] for r in rows) / len(rows))
      entropy.append(sum(r[1] for r in rows) / len(rows))
    return pmax, entropy

  with torch.no_grad():
    result, (pmax, entropy) = harness.time_calls(sweep, block, spec['repeats'], peak)
  return {**result, 'pmax': [round(x, 5) for x in pmax], 'entropy': [round(x, 4) for x in entropy],
          'device': torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}


def _peak(spec: dict):
  """`harness.matmul_peak` for the row's dtype and the preset's `peak_size`; None without one."""
  if not spec.get('peak_size'):
    return None
  return harness.matmul_peak(spec['dtype'], spec['peak_size'])


def _peak_worker(spec: dict) -> dict:
  """The machine's XLA matmul peak alone: median of `repeats` + 1 timed products."""
  import jax  # pylint: disable=g-import-not-at-top
  measure = _peak(spec)
  values = [measure() for _ in range(spec['repeats'] + 1)]
  return {**spec, 'tflops_per_s': round(statistics.median(values), 4),
          'all_tflops_per_s': [round(v, 4) for v in values],
          'device': str(jax.devices()[0].device_kind)}


def worker(spec: dict) -> dict:
  if spec['kind'] == 'peak':
    return _peak_worker(spec)
  if spec['kind'].startswith('check_'):
    return check_model({**spec, 'kind': spec['kind'][len('check_'):]})
  if spec['kind'] == 'decode':
    result = _decode_worker(spec)
    result['peak_bytes'] = harness.peak_memory_bytes('jax')
    return {**spec, **result}
  framework = 'torch' if spec['impl'] == 'hf' else 'jax'
  result = (_torch_worker if framework == 'torch' else _jax_worker)(spec)
  model = MODELS[spec['model']]
  flops = encoder_flops(model, spec['length']) * (len(TAUS) if spec['kind'] == 'calibration'
                                                  else 1)
  result['tflops_per_s'] = round(flops / result['seconds'] / 1e12, 4)
  if 'peak_tflops_per_s' in result:
    result['fraction_of_peak'] = round(result['tflops_per_s'] / result['peak_tflops_per_s'], 3)
  result['peak_bytes'] = harness.peak_memory_bytes(framework)
  # One layer's [h, L, L] float32 scores; blockwise/pallas should stay far below it.
  lxl = spec['length'] ** 2 * model['num_heads'] * 4
  result['peak_over_hLL_f32'] = round(result['peak_bytes'] / lxl, 4)
  return {**spec, **result}


def machine_memory_bytes() -> int:
  """This machine's physical memory."""
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def hf_skip_reason(previous: dict | None, length: int, limit_s: float | None,
                   memory_bytes: int | None = None) -> str | None:
  """Why an HF row at `length` is not run, or None to run it: extrapolated quadratically from
  `previous` (the last timed HF row of the same kind), its time exceeds `limit_s` or its peak
  memory exceeds `memory_bytes` (the machine's)."""
  if previous is None:
    return None
  scale = (length / previous['length']) ** 2
  reasons = []
  if limit_s and previous['seconds'] * scale > limit_s:
    reasons.append(f'would take about {previous["seconds"] * scale:.0f} s per call (quadratic '
                   f'from {previous["seconds"]:.1f} s at {previous["length"]}), over '
                   f'hf_max_s={limit_s}')
  if memory_bytes and previous.get('peak_bytes', 0) * scale > memory_bytes:
    reasons.append(f'would need about {previous["peak_bytes"] * scale / 1e9:.0f} GB (quadratic '
                   f'from {previous["peak_bytes"] / 1e9:.1f} GB peak at {previous["length"]}), '
                   f"over this machine's {memory_bytes / 1e9:.1f} GB of memory")
  return f'HF at {length} tokens ' + ' and '.join(reasons) if reasons else None


def summary(rows: list[dict]) -> dict:
  """The issue-24 ratios: each t5align forward row against the same implementation's mean at
  `BASE_LENGTHS` (TFLOP/s, and fraction of the peak each row measured beside it), and each
  calibration row against the forward row of its implementation and length."""
  timed = [r for r in rows if 'tflops_per_s' in r and r['kind'] in ('forward', 'calibration')]
  out = {'forward_over_base': [], 'calibration_over_forward': []}
  ratio = lambda a, b, key: (round(a[key] / b, 3) if key in a and b else None)
  for row in timed:
    same = [r for r in timed if (r['model'], r['impl']) == (row['model'], row['impl'])]
    if row['kind'] == 'forward' and row['impl'] != 'hf':
      base = [r for r in same if r['kind'] == 'forward' and r['length'] in BASE_LENGTHS]
      if len(base) == len(BASE_LENGTHS):
        mean = lambda key: (statistics.mean(r[key] for r in base)
                            if all(key in r for r in base) else None)
        out['forward_over_base'].append(dict(
            model=row['model'], impl=row['impl'], length=row['length'],
            tflops=ratio(row, mean('tflops_per_s'), 'tflops_per_s'),
            fraction_of_peak=ratio(row, mean('fraction_of_peak'), 'fraction_of_peak')))
    elif row['kind'] == 'calibration':
      forward = [r for r in same if r['kind'] == 'forward' and r['length'] == row['length']]
      if forward:
        out['calibration_over_forward'].append(dict(
            model=row['model'], impl=row['impl'], length=row['length'],
            tflops=ratio(row, forward[0]['tflops_per_s'], 'tflops_per_s'),
            fraction_of_peak=ratio(row, forward[0].get('fraction_of_peak'),
                                   'fraction_of_peak')))
  return out


def table(rows: list[dict]) -> str:
  """One line per row: what ran, seconds, TFLOP/s, fraction of the peak; or why it was skipped."""
  lines = [f'{"kind":<12}{"impl":<11}{"length":>7}{"seconds":>10}{"TFLOP/s":>9}{"of peak":>9}']
  for r in rows:
    head = f'{r["kind"]:<12}{r["impl"]:<11}{r["length"]:>7}'
    if 'skipped' in r or 'error' in r:
      lines.append(f'{head}  {"skipped: " + r["skipped"] if "skipped" in r else r["error"]}')
    elif 'tflops_per_s' in r:
      seconds, fraction = r.get('seconds'), r.get('fraction_of_peak')
      lines.append(f'{head}{"-" if seconds is None else f"{seconds:.3f}":>10}'
                   f'{r["tflops_per_s"]:>9.4f}{"" if fraction is None else f"{fraction:>9.3f}"}')
  return '\n'.join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--preset', choices=sorted(PRESETS), default='cpu-small')
  parser.add_argument('--models', nargs='+', choices=sorted(MODELS))
  parser.add_argument('--lengths', type=int, nargs='*', help='forward lengths')
  parser.add_argument('--calibration-lengths', type=int, nargs='*')
  parser.add_argument('--decode-lengths', type=int, nargs='*',
                      help='encoder output lengths to decode over')
  parser.add_argument('--decode-variants', nargs='+', default=['cached', 'per_step'],
                      choices=['cached', 'per_step'], help='cross-attention K/V handling')
  args = harness.parse_common_flags(parser, argv, timeout=3600)
  if harness.answer_worker(args.worker, worker):
    return
  preset = PRESETS[args.preset]
  impls = harness.implementations(args, preset)
  calibration = (preset['calibration_lengths'] if args.calibration_lengths is None
                 else args.calibration_lengths)
  peak_spec = dict(kind='peak', model=None, impl='xla_matmul', length=preset['peak_size'],
                   dtype=preset['dtype'], peak_size=preset['peak_size'],
                   repeats=harness.repeats_for(args, preset, 'xla_matmul'))
  rows = [harness.run_worker('benchmarks.encoder_bench', peak_spec, args.timeout)]
  print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  decode = (preset['decode_lengths'] if args.decode_lengths is None else args.decode_lengths)
  for length in decode:
    for variant in args.decode_variants:
      spec = dict(kind='decode', model=preset['decode_model'], impl='blockwise', length=length,
                  dtype=preset['dtype'], cross_kv=variant,
                  repeats=harness.repeats_for(args, preset, 'blockwise'))
      rows.append(harness.run_worker('benchmarks.encoder_bench', spec, args.timeout))
      print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  for model in args.models or preset['models']:
    plan = [('forward', n) for n in (preset['lengths'] if args.lengths is None else args.lengths)]
    plan += [('calibration', n) for n in calibration]
    hf_last = {}  # kind -> the last timed HF row, to extrapolate from.
    for kind, length in plan:
      for impl in impls:
        for extra in harness.variants(args, impl):
          spec = dict(kind=kind, model=model, impl=impl, length=length, dtype=preset['dtype'],
                      repeats=harness.repeats_for(args, preset, impl),
                      peak_size=preset['peak_size'], **extra)
          limit = preset['max_length'].get(impl, length)
          if length > limit:
            if limit:  # 0: the implementation is not measured by this preset at all.
              rows.append({**spec, 'skipped': f'{impl} is not run above max_length={limit} '
                                               'on this preset'})
            continue
          if impl == 'hf':
            spec['hf_attention'] = (preset.get('hf_attention', 'eager') if kind == 'forward'
                                    else 'eager')
            reason = hf_skip_reason(hf_last.get(kind), length, preset.get('hf_max_s'),
                                    machine_memory_bytes())
            if reason:
              rows.append({**spec, 'skipped': reason})
              continue
          check = None
          if impl not in ('hf', 'reference'):
            checked = min(length, preset.get('check_max_length', length))
            check = harness.run_worker('benchmarks.encoder_bench',
                                      {**spec, 'kind': f'check_{kind}', 'length': checked},
                                      args.timeout)
            if checked != length:
              check['note'] = (f"'reference' is not run above check_max_length={checked} (its "
                               f'[b, h, L, L] arrays): checked at {checked} tokens with the same '
                               'weights and settings')
          row = harness.run_worker('benchmarks.encoder_bench', spec, args.timeout)
          if check is not None:
            row['check_vs_reference'] = check
          if impl == 'hf' and 'seconds' in row:
            hf_last[kind] = row
          rows.append(row)
          print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  rows.append(harness.run_worker('benchmarks.encoder_bench', peak_spec, args.timeout))
  # Rows without a peak of their own (HF on a GPU) take the run's best 'peak' row.
  peaks = [r['tflops_per_s'] for r in rows if r['kind'] == 'peak' and 'tflops_per_s' in r]
  for row in rows:
    if row['kind'] != 'peak' and 'tflops_per_s' in row and 'fraction_of_peak' not in row and peaks:
      row['fraction_of_peak'] = round(row['tflops_per_s'] / max(peaks), 3)
  harness.add_ratios(rows, harness.hf_base(rows, ('kind', 'model', 'length')), 'hf_over_this')
  print(table(rows), file=sys.stderr, flush=True)
  print(json.dumps({'benchmark': 'encoder', 'preset': args.preset, 'rows': rows,
                    'summary': summary(rows)}, indent=1))


if __name__ == '__main__':
  main()
