"""T5 encoder forward and an 11-tau calibration sweep, t5align beside HuggingFace; prints JSON.

Run from the repository root:
  python -m benchmarks.encoder_bench --preset cpu-small   # tiny model, float32, L 512..16k
  python -m benchmarks.encoder_bench --preset gpu         # Flan-T5-XL/XXL shapes, bf16
  python -m benchmarks.encoder_bench --preset cpu-small --lengths --calibration-lengths \
      --decode-lengths 4096 16384                         # only the decode rows


Random weights. 'forward' is one encoder pass (batch 1); 'calibration' is the encoder's mean
P_max/entropy at 11 temperatures (t5align: `jax.vmap` over tau; HF: 11 passes with tau applied by
setting T5Attention.scaling = 1/tau and dividing the shared position bias by tau, statistics taken
in forward hooks). 'decode' is greedy decoding of `DECODE_TOKENS` tokens (EOS disabled) by the
T5 1.1 small shapes (8+8 layers) over a random `[1, L, e]` encoder output, one row with the
cross-attention keys/values projected once into the decode cache ('cached', what
`decoding.greedy` does) and one projecting them at every token ('per_step', t5x's way);
`seconds` is the median wall time for DECODE_TOKENS tokens, `tokens_1` that of one token
(the one-time work: cache set-up, cached projections), `seconds_per_token` each further token,
(t(16) - t(1)) / 15. Each measurement runs in its own subprocess (see attention_bench.py for the
memory and TFLOP/s conventions; FLOPs here are the whole encoder's matmuls).
"""
from __future__ import annotations

import argparse
import json
import sys

from benchmarks import attention_bench as common

# Sizes: REFERENCE sec. 4 (emb, heads x head_dim, encoder layers, mlp); gated-gelu, vocab 32128.
MODELS = {
    # T5 1.1 small (decode rows).
    'small': dict(vocab_size=32128, emb_dim=512, num_heads=6, head_dim=64, num_encoder_layers=8,
                  num_decoder_layers=8, mlp_dim=1024),
    'tiny': dict(vocab_size=128, emb_dim=64, num_heads=4, head_dim=16, num_encoder_layers=2,
                 mlp_dim=128),
    'xl': dict(vocab_size=32128, emb_dim=2048, num_heads=32, head_dim=64, num_encoder_layers=24,
               num_decoder_layers=24, mlp_dim=5120),
    'xxl': dict(vocab_size=32128, emb_dim=4096, num_heads=64, head_dim=64, num_encoder_layers=24,
                num_decoder_layers=24, mlp_dim=10240),
}
PRESETS = {
    'cpu-small': dict(models=['tiny'], lengths=[512, 2048, 4096, 16384], dtype='float32',
                      impls=['reference', 'blockwise', 'pallas'], repeats=2,
                      calibration_lengths=[2048], decode_model='small',
                      decode_lengths=[4096, 16384],
                      max_length={'reference': 4096, 'pallas': 2048, 'hf': 4096}),
    'gpu': dict(models=['xl', 'xxl'], lengths=[512, 2048, 4096, 8192, 15000, 16384],
                dtype='bfloat16', impls=['reference', 'blockwise', 'pallas'], repeats=3,
                hf_repeats=1,  # HF's 11-tau loop at 15k is ~1 minute per sweep.
                calibration_lengths=[4096, 15000], decode_model='xl', decode_lengths=[16384],
                max_length={'reference': 8192, 'hf': 15000}),
}
TAUS = [1.0 - 0.05 * i for i in range(11)]
DECODE_TOKENS = 16


def encoder_flops(model: dict, length: int) -> float:
  """Matmul FLOPs of one encoder pass: projections, attention core, gated MLP."""
  e, hd, f = model['emb_dim'], model['num_heads'] * model['head_dim'], model['mlp_dim']
  per_layer = 8 * length * e * hd + 4 * length * length * hd + 6 * length * e * f
  return per_layer * model['num_encoder_layers']


def _random_params(config, dtype, parts=('token_embedder', 'encoder')):
  """Random params (the top-level `parts`) in `dtype`, scaled like t5x's initializers."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  shapes = network.param_shapes(config)
  shapes = {k: shapes[k] for k in parts}
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)

  @jax.jit
  def make(key):
    out = []
    for (path, leaf), k in zip(leaves, jax.random.split(key, len(leaves))):
      name = jax.tree_util.keystr(path)
      if 'scale' in name:
        out.append(jnp.ones(leaf.shape, dtype))
        continue
      std = 1.0 if 'embedding' in name else leaf.shape[0] ** -0.5
      if 'query' in name:
        std /= config.head_dim ** 0.5  # T5 folds 1/sqrt(d) into the query kernel.
      out.append((std * jax.random.normal(k, leaf.shape, jnp.float32)).astype(dtype))
    return jax.tree_util.tree_unflatten(treedef, out)

  return make(jax.random.PRNGKey(0))


def _decode_worker(spec: dict) -> dict:
  """Greedy decoding over a random encoder output, cross K/V cached or projected per step."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from t5align import decoding  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  dtype = jnp.dtype(spec['dtype'])
  config = network.T5Config(**MODELS[spec['model']], dtype=dtype, dropout_rate=0.0,
                            mlp_activations=('gelu', 'linear'), attention_impl=spec['impl'])
  params = _random_params(config, dtype, ('token_embedder', 'decoder'))
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
    timing, out = common.time_calls(lambda: fn(params, encoded, tokens), jax.block_until_ready,
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
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  from t5align import partitioning  # pylint: disable=g-import-not-at-top
  common.configure_pallas(spec)
  dtype = jnp.dtype(spec['dtype'])
  config = network.T5Config(**MODELS[spec['model']], dtype=dtype, dropout_rate=0.0,
                            mlp_activations=('gelu', 'linear'), attention_impl=spec['impl'])
  # Parameters sharded over 'model' across every device (one device: as plain jit), traced
  # under the logical axis rules, as calibration runs it (taus over 'tau', here of size 1).
  mesh = partitioning.calibration_mesh(1, 1, jax.device_count())
  params = partitioning.place_params(_random_params(config, dtype), config, mesh)
  model = network.Transformer(config)
  tokens = partitioning.global_array(
      jax.random.randint(jax.random.PRNGKey(1), (1, spec['length']), 2, config.vocab_size),
      partitioning.replicated(mesh))

  def stats(params, tokens, tau):
    _, state = model.apply({'params': params}, tokens, method=model.encode, enable_dropout=False,
                           temperature=tau, mutable=['intermediates'])
    return network.mean_row_stats(
        network.encoder_row_stats(state['intermediates'], config.num_encoder_layers))

  if spec['kind'] == 'forward':
    fn = partitioning.partition(lambda p, t: model.apply({'params': p}, t, method=model.encode,
                                                         enable_dropout=False), mesh)
    call = lambda: fn(params, tokens)
  else:
    fn = partitioning.partition(
        jax.vmap(stats, in_axes=(None, None, 0), spmd_axis_name='tau'), mesh)
    taus = partitioning.global_array(np.asarray(TAUS, np.float32), NamedSharding(mesh, P('tau')))
    call = lambda: fn(params, tokens, taus)
  result, out = common.time_calls(call, jax.block_until_ready, spec['repeats'])
  if spec['kind'] == 'calibration':
    result['pmax'] = [round(float(x), 5) for x in out['pmax']]
    result['entropy'] = [round(float(x), 4) for x in out['entropy']]
  return {**result, 'device': str(jax.devices()[0].device_kind), 'mesh': dict(mesh.shape)}


def _torch_worker(spec: dict) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from transformers.models.t5 import modeling_t5  # pylint: disable=g-import-not-at-top
  sizes = MODELS[spec['model']]
  device, dtype = common.torch_device_and_dtype(spec['dtype'])
  config = transformers.T5Config(
      vocab_size=sizes['vocab_size'], d_model=sizes['emb_dim'], d_kv=sizes['head_dim'],
      d_ff=sizes['mlp_dim'], num_layers=sizes['num_encoder_layers'],
      num_heads=sizes['num_heads'], feed_forward_proj='gated-gelu', dropout_rate=0.0,
      attn_implementation='eager')
  torch.set_default_dtype(dtype)
  with torch.device(device):
    model = transformers.T5EncoderModel(config).eval()
  tokens = torch.randint(2, sizes['vocab_size'], (1, spec['length']), device=device)
  attentions = [m for m in model.modules() if isinstance(m, modeling_t5.T5Attention)]
  block = common.torch_block(device)
  if spec['kind'] == 'forward':
    with torch.no_grad():
      result, _ = common.time_calls(lambda: model(input_ids=tokens), block, spec['repeats'])
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
    result, (pmax, entropy) = common.time_calls(sweep, block, spec['repeats'])
  return {**result, 'pmax': [round(x, 5) for x in pmax], 'entropy': [round(x, 4) for x in entropy],
          'device': torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}


def worker(spec: dict) -> dict:
  if spec['kind'] == 'decode':
    result = _decode_worker(spec)
    result['peak_bytes'] = common.peak_memory_bytes('jax')
    return {**spec, **result}
  framework = 'torch' if spec['impl'] == 'hf' else 'jax'
  result = (_torch_worker if framework == 'torch' else _jax_worker)(spec)
  model = MODELS[spec['model']]
  flops = encoder_flops(model, spec['length']) * (len(TAUS) if spec['kind'] == 'calibration'
                                                  else 1)
  result['tflops_per_s'] = round(flops / result['seconds'] / 1e12, 4)
  result['peak_bytes'] = common.peak_memory_bytes(framework)
  # One layer's [h, L, L] float32 scores; blockwise/pallas should stay far below it.
  lxl = spec['length'] ** 2 * model['num_heads'] * 4
  result['peak_over_hLL_f32'] = round(result['peak_bytes'] / lxl, 4)
  return {**spec, **result}


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
  args = common.parse_common_flags(parser, argv, timeout=3600)
  if args.worker:
    print(json.dumps(worker(json.loads(args.worker))))
    return
  preset = PRESETS[args.preset]
  impls = common.implementations(args, preset)
  calibration = (preset['calibration_lengths'] if args.calibration_lengths is None
                 else args.calibration_lengths)
  rows = []
  decode = (preset['decode_lengths'] if args.decode_lengths is None else args.decode_lengths)
  for length in decode:
    for variant in args.decode_variants:
      spec = dict(kind='decode', model=preset['decode_model'], impl='blockwise', length=length,
                  dtype=preset['dtype'], cross_kv=variant,
                  repeats=common.repeats_for(args, preset, 'blockwise'))
      rows.append(common.run_worker('benchmarks.encoder_bench', spec, args.timeout))
      print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  for model in args.models or preset['models']:
    plan = [('forward', n) for n in (preset['lengths'] if args.lengths is None else args.lengths)]
    plan += [('calibration', n) for n in calibration]
    for kind, length in plan:
      for impl in impls:
        if length > preset['max_length'].get(impl, length):
          continue
        for extra in common.variants(args, impl):
          spec = dict(kind=kind, model=model, impl=impl, length=length, dtype=preset['dtype'],
                      repeats=common.repeats_for(args, preset, impl), **extra)
          rows.append(common.run_worker('benchmarks.encoder_bench', spec, args.timeout))
          print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  common.add_ratios(rows, ('kind', 'model', 'length'))
  print(json.dumps({'benchmark': 'encoder', 'preset': args.preset, 'rows': rows}, indent=1))


if __name__ == '__main__':
  main()
