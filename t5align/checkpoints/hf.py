"""HuggingFace T5 checkpoints (safetensors, PyTorch or Flax weights plus `config.json`).

HF stores linear weights `[out, in]` (transposed here to T5X's `[in, out]`) and the relative
bias `[32, H]` (T5X: `[H, 32]`); block names follow Mesh-TF's numbering (`block_path`).
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from t5align.checkpoints import mesh_tf
from t5align.checkpoints import store
from t5align.runtime import fileio
from t5align.runtime import outputs

_HF_WEIGHT_FILES = ('model.safetensors.index.json', 'model.safetensors',
                    'pytorch_model.bin.index.json', 'pytorch_model.bin', 'flax_model.msgpack')
# HF feed_forward_proj activation -> T5X name. NOTE: HF's 'gated-gelu' means gelu_new (tanh
# approximation) like flax's gelu; HF's plain 'gelu' is the exact erf form, which T5X lacks.
_HF_ACTIVATIONS = {'relu': 'relu', 'gelu_new': 'gelu', 'gelu_pytorch_tanh': 'gelu',
                   'silu': 'silu', 'swish': 'silu'}

_HF_BLOCK = re.compile(r'(encoder|decoder)\.block\.(\d+)\.layer\.(\d+)\.(.+)\.weight')
_HF_TOP = {'shared.weight': 'token_embedder/embedding',
           'encoder.final_layer_norm.weight': 'encoder/encoder_norm/scale',
           'decoder.final_layer_norm.weight': 'decoder/decoder_norm/scale'}
_HF_EMBED_ALIASES = ('encoder.embed_tokens.weight', 'decoder.embed_tokens.weight')
# HF never uses this table (cross-attention has no position bias) and skips it on load too.
_HF_IGNORED = ('decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight',)


def _hf_head(state: dict[str, np.ndarray], hf_config: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """Maps HF's output head to T5X; pops 'lm_head.weight' from `state`.

  NOTE: HF scales the decoder output by d_model**-0.5 iff `scale_decoder_outputs` (transformers
  >= 5) or, in older configs, `tie_word_embeddings` (default True). A scaled head on the shared
  embedding is exactly T5X's `logits_via_embedding` (logits / sqrt(emb_dim)): no logits_dense.
  An lm_head that differs from `shared` is untied: logits_dense = lm_head.T, unscaled.
  """
  for key in ('tie_word_embeddings', 'scale_decoder_outputs'):
    if key in hf_config and not isinstance(hf_config[key], bool):
      raise store.CheckpointReadError(
          f'HF config has "{key}": {json.dumps(hf_config[key])}, a '
          f'{type(hf_config[key]).__name__}; expected JSON true or false (no quotes).')
  key = 'scale_decoder_outputs' if 'scale_decoder_outputs' in hf_config else 'tie_word_embeddings'
  scale = hf_config.get(key, True)
  lm_head = state.pop('lm_head.weight', None)
  shared = state.get('shared.weight')
  untied = lm_head is not None and (shared is None or not np.array_equal(lm_head, shared))
  if untied and scale:
    said = f'"{key}": true' if key in hf_config else f'no "{key}" (HF\'s default: true)'
    raise store.CheckpointReadError(
        f'HF config has {said}, a head tied to shared.weight and scaled by d_model**-0.5, but '
        'the weights hold their own lm_head.weight, unlike shared.weight; T5X has no scaled '
        'untied head. For an untied head (T5 1.1, mT5) set "tie_word_embeddings": false.')
  if untied:
    return {'decoder/logits_dense/kernel': lm_head.T}
  if not scale and shared is not None:
    # transformers >= 5 builds unscaled tied models: an untied T5X head holding a copy.
    return {'decoder/logits_dense/kernel': shared.T}
  return {}


def params_from_hf_state_dict(state_dict: Mapping[str, np.ndarray],
                              hf_config: Mapping[str, Any]) -> store.Params:
  """Maps a HuggingFace T5 state dict (torch layout, `[out, in]`) to the T5X tree.

  Linear weights are transposed; the relative bias `[32, H]` becomes `[H, 32]`. HF applies no
  1/sqrt(d) either, so queries map unchanged. Names no rule knows go under `UNMAPPED` so the strict
  check lists them. `hf_config` is the parsed `config.json`.
  """
  state = dict(state_dict)
  for name in _HF_IGNORED:
    state.pop(name, None)
  for alias in _HF_EMBED_ALIASES:
    if alias in state and 'shared.weight' not in state:
      state['shared.weight'] = state[alias]
    if alias in state and np.array_equal(state[alias], state['shared.weight']):
      del state[alias]
  flat = _hf_head(state, hf_config)
  for name, array in state.items():
    path = _HF_TOP.get(name)
    match = _HF_BLOCK.fullmatch(name)
    if match:
      stack, block, sublayer, module = match.groups()
      path = mesh_tf.block_path(stack, int(block), int(sublayer), module.split('.'))
      array = array.T if path and array.ndim == 2 else array
    flat[path or f'{mesh_tf.UNMAPPED}/{name}'] = array
  return store.unflatten_params(flat)


def hf_flax_to_state_dict(flax_params: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """Renames HF's Flax T5 params (`flax_model.msgpack`) to torch names and layout.

  Flax kernels `[in, out]` become `.weight` `[out, in]`; `embedding`s (shared `[V, E]`, relative
  bias `[32, H]`) already have torch's layout; layer norms are `.weight` in both.
  """
  if set(flax_params) == {'params'}:
    flax_params = flax_params['params']
  state = {}
  for path, array in store.flatten_params(flax_params).items():
    *module, leaf = path.split('/')
    if leaf == 'kernel':
      array = np.asarray(array).T
    state['.'.join(module + ['weight'])] = np.asarray(array)
  return state


# T5X activations -> HF feed_forward_proj (T5 1.0's ReLU; T5 1.1 / UL2's gated forms).
_FEED_FORWARD_PROJ = {('relu',): 'relu', ('gelu', 'linear'): 'gated-gelu',
                      ('silu', 'linear'): 'gated-silu'}


def save_hf_checkpoint(path: str, params: Mapping[str, Any], config: Any) -> None:
  """Writes a T5X params tree as a HuggingFace T5 folder (`config.json` and `model.safetensors`,
  float32), which `transformers.T5ForConditionalGeneration.from_pretrained` and `load_params`
  read: the inverse of `params_from_hf_state_dict`. `config` is the `network.T5Config`.

  A head on the embedding (`logits_via_embedding`, T5 1.0) is written tied and scaled, an own
  head (`decoder/logits_dense`) as an untied `lm_head`. The folder holds no tokenizer.

  Raises:
    ValueError: for MLP activations HF's T5 has no `feed_forward_proj` for.
  """
  from safetensors.numpy import save  # pylint: disable=g-import-not-at-top
  proj = _FEED_FORWARD_PROJ.get(tuple(config.mlp_activations))
  if proj is None:
    raise ValueError(f'mlp_activations={tuple(config.mlp_activations)}: HF T5 has a '
                     f'feed_forward_proj for {sorted(_FEED_FORWARD_PROJ)} only.')
  flat = {k: np.asarray(v, np.float32) for k, v in store.flatten_params(params).items()}
  names = {p: name for name, p in _HF_TOP.items()}
  names['decoder/logits_dense/kernel'] = 'lm_head.weight'
  for stack, count in (('encoder', config.num_encoder_layers),
                       ('decoder', config.num_decoder_layers)):
    for block in range(count):
      for sublayer, module in mesh_tf.block_modules(stack):
        names[mesh_tf.block_path(stack, block, sublayer, module)] = (
            f'{stack}.block.{block}.layer.{sublayer}.{".".join(module)}.weight')
  if set(flat) - set(names):
    raise ValueError(f'parameters with no HF name: {sorted(set(flat) - set(names))}.')
  # HF's layout: linear weights [out, in], relative biases [32, heads].
  state = {names[p]: np.ascontiguousarray(a.T if a.ndim == 2 and p != 'token_embedder/embedding'
                                          else a) for p, a in flat.items()}
  tied = 'lm_head.weight' not in state
  hf_config = {
      'architectures': ['T5ForConditionalGeneration'], 'model_type': 't5',
      'is_encoder_decoder': True, 'vocab_size': int(config.vocab_size),
      'd_model': int(config.emb_dim), 'd_kv': int(config.head_dim), 'd_ff': int(config.mlp_dim),
      'num_layers': int(config.num_encoder_layers),
      'num_decoder_layers': int(config.num_decoder_layers), 'num_heads': int(config.num_heads),
      'feed_forward_proj': proj, 'relative_attention_num_buckets': 32,
      'relative_attention_max_distance': 128, 'dropout_rate': 0.0, 'layer_norm_epsilon': 1e-6,
      'tie_word_embeddings': tied, 'scale_decoder_outputs': tied, 'decoder_start_token_id': 0,
      'pad_token_id': 0, 'eos_token_id': 1}
  os.makedirs(path, exist_ok=True)
  fileio.write_atomic(os.path.join(path, 'model.safetensors'),
                      save(state, metadata={'format': 'pt'}))
  fileio.write_json_atomic(os.path.join(path, 'config.json'), hf_config)


def _load_torch(location: str) -> dict[str, np.ndarray]:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f'Reading {location} needs torch; install it or use safetensors.') from e
  state = torch.load(location, map_location='cpu', weights_only=True)
  # numpy has no bfloat16 of its own: reinterpret the bits as ml_dtypes' bfloat16.
  return {k: v.view(torch.int16).numpy().view(jnp.bfloat16) if v.dtype == torch.bfloat16
          else v.numpy() for k, v in state.items()}


def _load_weight_file(location: str) -> dict[str, np.ndarray]:
  """One safetensors or torch file as `{name: array}`; errors name the file."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  if not os.path.exists(location):
    raise FileNotFoundError(f'No such checkpoint file: {location}')
  try:
    return load_file(location) if location.endswith('.safetensors') else _load_torch(location)
  except ImportError:
    raise
  except Exception as e:  # safetensors, pickle and zip raise many types.
    raise store.CheckpointReadError(f'Cannot read weight file {location}: {e}') from e


def _load_hf_state_dict(path: str) -> dict[str, np.ndarray]:
  """Reads the first HF weight file found (sharded safetensors, safetensors, torch, Flax)."""
  for filename in _HF_WEIGHT_FILES:
    location = os.path.join(path, filename)
    if not os.path.exists(location):
      continue
    if filename.endswith('.msgpack'):
      return hf_flax_to_state_dict(store.restore_msgpack(location))
    if not filename.endswith('.index.json'):
      return _load_weight_file(location)
    index = outputs.read_json(location, 'HF weight index', store.CheckpointReadError)
    if not isinstance(index, dict) or not isinstance(index.get('weight_map'), dict):
      raise store.CheckpointReadError(f'{location}: no "weight_map" object.')
    shards = sorted(set(index['weight_map'].values()))
    return {k: v for s in shards for k, v in _load_weight_file(os.path.join(path, s)).items()}
  raise FileNotFoundError(f'No HF weight file ({", ".join(_HF_WEIGHT_FILES)}) in {path}')


def read_hf_config(path: str) -> dict[str, Any]:
  location = os.path.join(path, 'config.json')
  config = outputs.read_json(location, 'HF config', store.CheckpointReadError)
  if not isinstance(config, dict):
    raise store.CheckpointReadError(
        f'{location}: expected a JSON object; got {type(config).__name__}.')
  return config


def hf_config_hints(hf_config: Mapping[str, Any]) -> dict[str, Any]:
  """T5Config fields an HF `config.json` fixes beyond shapes: the MLP activations.

  Raises:
    ValueError: for activations or relative-attention settings T5X cannot express.
  """
  buckets = (hf_config.get('relative_attention_num_buckets', 32),
             hf_config.get('relative_attention_max_distance', 128))
  proj = hf_config.get('feed_forward_proj', 'relu')
  supported = sorted({*_HF_ACTIVATIONS, 'gated-gelu', *(f'gated-{a}' for a in _HF_ACTIVATIONS)})
  if not isinstance(proj, str):
    raise ValueError(f'HF config has "feed_forward_proj": {json.dumps(proj)}; expected a string, '
                     f'one of {", ".join(supported)} (T5 1.0: "relu", T5 1.1: "gated-gelu").')
  act = 'gelu' if proj == 'gated-gelu' else _HF_ACTIVATIONS.get(proj.removeprefix('gated-'))
  if buckets != (32, 128) or act is None:
    raise ValueError(f'HF config has feed_forward_proj={proj!r}, relative attention (buckets, '
                     f'max distance)={buckets}; T5X supports {sorted(_HF_ACTIVATIONS)}, (32, 128)')
  epsilon = hf_config.get('layer_norm_epsilon', 1e-6)
  if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
    raise ValueError(f'HF config has "layer_norm_epsilon": {json.dumps(epsilon)}, a '
                     f'{type(epsilon).__name__}; expected a JSON number: 1e-06 (no quotes).')
  if epsilon != 1e-6:
    raise ValueError(f'HF config has layer_norm_epsilon={epsilon!r}; T5X (and t5align) layer '
                     'norms use 1e-6, so this model would run with other numbers than it was '
                     'trained with.')
  return {'mlp_activations': (act, 'linear') if proj.startswith('gated-') else (act,)}


def read_hf_checkpoint(path: str) -> store.Params:
  """Reads a HuggingFace T5 directory (`config.json` plus weights) into the T5X tree; a weight
  the config cannot map is refused naming the config file."""
  state, config = _load_hf_state_dict(str(path)), read_hf_config(str(path))
  try:
    return params_from_hf_state_dict(state, config)
  except store.CheckpointReadError as e:
    raise store.CheckpointReadError(f'{os.path.join(str(path), "config.json")}: {e}') from e
