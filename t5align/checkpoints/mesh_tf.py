"""Mesh-TF T5 checkpoints, and the block-variable names HF's T5 shares with them.

Mesh-TF names a block variable `encoder/block_{i}/layer_{j}/<module>`; HF's PyTorch T5 keeps that
numbering (`encoder.block.{i}.layer.{j}.<module>`), so `block_path` maps both to T5X paths.
"""
from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from t5align.checkpoints import store
from t5align.runtime import fileio

UNMAPPED = 'unmapped'  # Top-level key for source names no mapping rule knows.

# (stack, sublayer index) -> (source module, T5X module, T5X pre-norm); shared by HF and Mesh-TF.
_SUBLAYERS = {
    ('encoder', 0): ('SelfAttention', 'attention', 'pre_attention_layer_norm'),
    ('encoder', 1): ('DenseReluDense', 'mlp', 'pre_mlp_layer_norm'),
    ('decoder', 0): ('SelfAttention', 'self_attention', 'pre_self_attention_layer_norm'),
    ('decoder', 1): ('EncDecAttention', 'encoder_decoder_attention',
                     'pre_cross_attention_layer_norm'),
    ('decoder', 2): ('DenseReluDense', 'mlp', 'pre_mlp_layer_norm'),
}
_ATTENTION_PROJ = {'q': 'query', 'k': 'key', 'v': 'value', 'o': 'out'}
_MLP_PROJ = ('wi', 'wi_0', 'wi_1', 'wo')


def block_path(stack: str, block: int, sublayer: int, module: list[str]) -> str | None:
  """T5X path of one block variable, e.g. ['SelfAttention', 'q'] -> .../attention/query/kernel."""
  source, target, norm = _SUBLAYERS.get((stack, sublayer), (None, None, None))
  prefix = f'{stack}/layers_{block}'
  if module == ['layer_norm'] and norm:
    return f'{prefix}/{norm}/scale'
  if len(module) != 2 or module[0] != source:
    return None
  if module[1] == 'relative_attention_bias' and block == 0 and sublayer == 0:
    return f'{stack}/relpos_bias/rel_embedding'  # NOTE: one table per stack, on block 0.
  if module[1] in _ATTENTION_PROJ and source != 'DenseReluDense':
    return f'{prefix}/{target}/{_ATTENTION_PROJ[module[1]]}/kernel'
  if module[1] in _MLP_PROJ and source == 'DenseReluDense':
    return f'{prefix}/{target}/{module[1]}/kernel'
  return None


def block_modules(stack: str) -> list[tuple[int, list[str]]]:
  """Every (sublayer, module) `block_path` maps in one block of `stack`, e.g. (0, ['SelfAttention',
  'q']): what a writer in this numbering (`hf.save_hf_checkpoint`) looks up for each block."""
  out = []
  for (name, sublayer), (source, _, _) in _SUBLAYERS.items():
    if name != stack:
      continue
    projections = _MLP_PROJ if source == 'DenseReluDense' else (*_ATTENTION_PROJ,
                                                                'relative_attention_bias')
    out += [(sublayer, ['layer_norm'])] + [(sublayer, [source, p]) for p in projections]
  return out


def _is_mesh_tf_optimizer_variable(name: str) -> bool:
  return name == 'global_step' or name.endswith(_MESH_TF_OPTIMIZER_SUFFIXES)


_MESH_TF_OPTIMIZER_SUFFIXES = ('_slot_vc', '_slot_vr', '_slot_v')  # Adafactor slots.
_MESH_TF_BLOCK = re.compile(r'(encoder|decoder)/block_(\d+)/layer_(\d+)/(.+)')
_MESH_TF_TOP = {'shared/embedding': 'token_embedder/embedding',
                'encoder/final_layer_norm/scale': 'encoder/encoder_norm/scale',
                'encoder/rms_norm/scale': 'encoder/encoder_norm/scale',
                'decoder/final_layer_norm/scale': 'decoder/decoder_norm/scale',
                'decoder/rms_norm/scale': 'decoder/decoder_norm/scale',
                'decoder/logits/kernel': 'decoder/logits_dense/kernel'}


def params_from_mesh_tf(variables: Mapping[str, np.ndarray]) -> store.Params:
  """Maps Mesh-TF T5 variables to the T5X tree; no transposes (kernels `[in, out]`, bias `[H, 32]`).

  Adafactor slots (`*_slot_vc`, `*_slot_vr`, `*_slot_v`) and `global_step` are dropped; T5 1.1's
  `rms_norm` is read like T5 1.0's `layer_norm`. Unknown names go under `UNMAPPED`.
  """
  flat = {}
  for name, array in variables.items():
    if _is_mesh_tf_optimizer_variable(name):
      continue
    path = _MESH_TF_TOP.get(name)
    match = _MESH_TF_BLOCK.fullmatch(name)
    if match:
      stack, block, sublayer, module = match.groups()
      module = re.sub(r'^rms_norm/scale$|^layer_norm/scale$', 'layer_norm', module)
      module = re.sub(r'/kernel$', '', module).split('/')
      path = block_path(stack, int(block), int(sublayer), module)
    flat[path or f'{UNMAPPED}/{name}'] = np.asarray(array)
  return store.unflatten_params(flat)


def read_mesh_tf_checkpoint(path: str) -> store.Params:
  """Reads a Mesh-TF T5 checkpoint (`.../model.ckpt-N` or its directory); needs tensorflow."""
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError('Reading Mesh-TF checkpoints needs tensorflow (pip install tensorflow); '
                      'other formats do not.') from e
  path = str(path)
  try:  # A gs:// prefix (tf.io.gfile): each read within the remote timeout.
    reader = store.call(lambda: tf.train.load_checkpoint(path), 'Opening the Mesh-TF checkpoint',
                        path)
    names = [n for n in reader.get_variable_to_shape_map()
             if not _is_mesh_tf_optimizer_variable(n)]
    arrays = {n: store.call(lambda n=n: reader.get_tensor(n), f'Reading {n} of', path)
              for n in names}
  except fileio.RemoteTimeoutError:
    raise
  except Exception as e:  # tensorflow raises DataLossError, NotFoundError, ... on bad files.
    raise store.CheckpointReadError(f'Cannot read Mesh-TF checkpoint {path} (its .index or .data '
                                    f'files): {type(e).__name__}: {str(e).strip()[:300]}') from e
  return params_from_mesh_tf(arrays)
