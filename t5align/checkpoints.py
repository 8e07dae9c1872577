"""T5 checkpoint I/O: T5X (legacy and Orbax), HuggingFace and Mesh-TF readers, a T5X writer.

Every reader returns the T5X 'params' tree (t5x/examples/t5/network.py names, kernels `[in, out]`)
as a nested dict of numpy arrays in the stored dtype. `load_params` adds format detection, an
explicit dtype policy and a strict check against `network.param_shapes(config)` that raises one
`CheckpointMismatchError` naming every missing, unexpected and mis-shaped parameter. With a
`mesh`, `load_params` returns sharded `jax.Array`s and reads T5X checkpoints per device slice.

Paths inside the tree are '/'-joined (`encoder/layers_0/attention/query/kernel`).
"""
from __future__ import annotations

import copy
import ctypes
import json
import functools
import math
import os
import posixpath
import re
import shutil
import tempfile
from typing import Any, Callable, Mapping

from flax import serialization
import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts

from t5align import network
from t5align import outputs
from t5align import validate

Params = dict[str, Any]

FORMATS = ('t5x', 't5x_orbax', 'hf', 'mesh_tf')
DEFAULT_SOURCE_DTYPES = ('float32', 'bfloat16', 'float16')  # Stored dtypes cast without asking.
T5X_DUMMY_BUCKET = 't5x-dummy-bucket'  # In t5x gcs specs: "the checkpoint's own location".
UNMAPPED = 'unmapped'  # Top-level key for source names no mapping rule knows.
_CHUNK_BYTES = 64 * 2**20
_HF_WEIGHT_FILES = ('model.safetensors.index.json', 'model.safetensors',
                    'pytorch_model.bin.index.json', 'pytorch_model.bin', 'flax_model.msgpack')
# HF feed_forward_proj activation -> T5X name. NOTE: HF's 'gated-gelu' means gelu_new (tanh
# approximation) like flax's gelu; HF's plain 'gelu' is the exact erf form, which T5X lacks.
_HF_ACTIVATIONS = {'relu': 'relu', 'gelu_new': 'gelu', 'gelu_pytorch_tanh': 'gelu',
                   'silu': 'silu', 'swish': 'silu'}


class CheckpointReadError(ValueError):
  """A checkpoint file exists but cannot be read (truncated msgpack, corrupt chunk, bad spec)."""


class CheckpointDtypeError(ValueError):
  """The checkpoint holds arrays of a dtype the caller did not allow."""


class CheckpointMismatchError(ValueError):
  """The checkpoint's parameters differ from the expected tree.

  Attributes:
    missing: paths expected but absent.
    unexpected: paths present but not expected.
    mismatched: `{path: (checkpoint_shape, expected_shape)}`.
  """

  def __init__(self, missing=(), unexpected=(), mismatched=None, source: str = ''):
    self.missing = sorted(missing)
    self.unexpected = sorted(unexpected)
    self.mismatched = dict(sorted((mismatched or {}).items()))
    where = f'Checkpoint {source}' if source else 'Checkpoint'
    lines = [f'{where} does not match the expected parameters:']
    lines += [f'  missing:    {p}' for p in self.missing]
    lines += [f'  unexpected: {p}' for p in self.unexpected]
    lines += [f'  shape:      {p}: checkpoint {got} != expected {want}'
              for p, (got, want) in self.mismatched.items()]
    super().__init__('\n'.join(lines))


# ---------------------------------------------------------------- trees and locations


def flatten_params(tree: Mapping[str, Any], prefix: str = '',
                   is_leaf: Callable[[Any], bool] | None = None) -> dict[str, Any]:
  """Nested dict -> `{'a/b/c': leaf}`; a dict for which `is_leaf` is True stays a leaf."""
  flat = {}
  for key, value in tree.items():
    path = f'{prefix}{key}'
    if isinstance(value, Mapping) and not (is_leaf and is_leaf(value)):
      flat.update(flatten_params(value, path + '/', is_leaf))
    else:
      flat[path] = value
  return flat


def unflatten_params(flat: Mapping[str, Any]) -> Params:
  """`{'a/b/c': leaf}` -> nested dict."""
  tree: Params = {}
  for path, value in flat.items():
    *parents, leaf = path.split('/')
    node = tree
    for key in parents:
      node = node.setdefault(key, {})
    node[leaf] = value
  return tree


def _is_gcs(location: str) -> bool:
  return str(location).startswith('gs://')


def _join(base: str, *parts: str) -> str:
  base = str(base)
  return posixpath.join(base, *parts) if _is_gcs(base) else os.path.join(base, *parts)


def kvstore_spec(location: str) -> dict[str, str]:
  """A tensorstore kvstore spec for a local path or a `gs://bucket/path` URL."""
  location = str(location)
  if _is_gcs(location):
    bucket, _, path = location[len('gs://'):].partition('/')
    return {'driver': 'gcs', 'bucket': bucket, 'path': path}
  if location.startswith('file://'):
    location = location[len('file://'):]
  slash = '/' if location.endswith('/') else ''
  return {'driver': 'file', 'path': os.path.abspath(location) + slash}


def _read_bytes(location: str) -> bytes:
  """Reads a whole file through a tensorstore kvstore (local or gcs); names the file on failure."""
  store = ts.KvStore.open(kvstore_spec(posixpath.dirname(location) + '/')).result()
  try:
    result = store.read(posixpath.basename(location)).result()
  except ValueError as e:
    raise CheckpointReadError(f'Cannot read {location}: {e}') from e
  if result.state == 'missing':
    raise FileNotFoundError(f'No such checkpoint file: {location}')
  return result.value


def _exists(location: str) -> bool:
  if not _is_gcs(location):
    return os.path.exists(location)
  spec = kvstore_spec(location)
  key = spec.pop('path').encode()
  return bool(ts.KvStore.open(spec).result().list(ts.KvStore.KeyRange(key, key + b'\xff')).result())


# ---------------------------------------------------------------- T5X legacy (msgpack + zarr)


def _is_ts_spec(value: Any) -> bool:
  return isinstance(value, Mapping) and 'driver' in value and ({'kvstore', 'path'} & set(value))


def t5x_checkpoint_paths(path: str) -> tuple[str, str]:
  """`(msgpack file, checkpoint_N directory)` for a path to either of them."""
  path = str(path).rstrip('/')
  path = path if _is_gcs(path) else os.path.abspath(path)
  is_file = posixpath.basename(path) == 'checkpoint' and (_is_gcs(path) or os.path.isfile(path))
  if is_file:
    return path, (posixpath.dirname(path) if _is_gcs(path) else os.path.dirname(path))
  return _join(path, 'checkpoint'), path


def resolve_ts_spec(spec: Mapping[str, Any], checkpoint_dir: str) -> dict[str, Any]:
  """Makes a T5X tensorstore spec absolute, ready for `ts.open`.

  Handles a relative path in `kvstore.path` or in a top-level `path` (tensorstore < 0.1.14),
  kvstore drivers 'file', 'gfile' and 'gcs' (bucket 't5x-dummy-bucket' means `checkpoint_dir`,
  local or `gs://`). Metadata is reduced to the shape, which tensorstore then verifies.

  Returns:
    A new spec dict whose kvstore is `kvstore_spec(<absolute array folder>)`.
  """
  spec = copy.deepcopy(dict(spec))
  kvstore = spec.pop('kvstore', {'driver': 'file'})
  if isinstance(kvstore, str):  # A URL such as 'gs://b/x/' or 'file:///x/'.
    kvstore = {'driver': 'gcs' if _is_gcs(kvstore) else 'file', 'path': kvstore}
  rel = posixpath.join(kvstore.get('path', ''), spec.pop('path', ''))
  driver = kvstore.get('driver')
  if driver == 'gcs' and _is_gcs(rel):
    location = rel
  elif driver == 'gcs' and kvstore.get('bucket', T5X_DUMMY_BUCKET) != T5X_DUMMY_BUCKET:
    location = f"gs://{kvstore['bucket']}/{rel}"
  elif driver in ('gcs', 'file', 'gfile'):
    is_absolute = _is_gcs(rel) or rel.startswith(('/', 'file://'))
    location = rel if is_absolute else _join(checkpoint_dir, rel)
  else:
    raise CheckpointReadError(f'Unsupported tensorstore kvstore driver {driver!r} in {spec}')
  spec['kvstore'] = kvstore_spec(location.rstrip('/') + '/')
  if spec.get('dtype') == 'uint16' or spec.get('metadata', {}).get('dtype') == '<u2':
    raise CheckpointReadError(f'uint16 array at {location} (old bfloat16 encoding); re-save as '
                              'bfloat16.')
  if 'metadata' in spec:
    spec['metadata'] = {'shape': list(spec['metadata']['shape'])}
  # NOTE: t5x and Orbax write every chunk, so a missing chunk file is corruption, not zeros.
  spec['fill_missing_data_reads'] = False
  return spec


def _restore_msgpack(location: str) -> dict[str, Any]:
  data = _read_bytes(location)
  try:
    # Decodes flax's ext types (ndarray, complex, numpy scalar) and reassembles
    # '__msgpack_chunked_array__' dicts (arrays over 1 GiB).
    contents = serialization.msgpack_restore(data)
  except Exception as e:  # msgpack raises several unrelated types on truncation.
    raise CheckpointReadError(f'Corrupt or truncated msgpack {location}: {e!r}') from e
  if not isinstance(contents, dict):
    raise CheckpointReadError(f'{location} is not a T5X checkpoint (top level {type(contents)})')
  return contents


def _t5x_target(contents: Mapping[str, Any], location: str) -> Mapping[str, Any]:
  """The params subtree: version >= 1 wraps it in 'optimizer'; version 0 has it at the top."""
  holder = contents['optimizer'] if 'optimizer' in contents else contents
  if 'target' not in holder:
    raise CheckpointReadError(f'{location} has no "target" (keys: {sorted(holder)})')
  return holder['target']


def _ts_result(name: str, spec: Mapping[str, Any], future: Any) -> Any:
  """`future.result()`; a failure names the parameter and its array folder."""
  try:
    return future.result()
  except ValueError as e:
    kv = spec['kvstore']
    where = f"gs://{kv['bucket']}/{kv['path']}" if kv['driver'] == 'gcs' else kv['path']
    if 'NOT_FOUND' in str(e):
      raise FileNotFoundError(f'Parameter {name}: array missing at {where}: {e}') from e
    raise CheckpointReadError(f'Parameter {name}: cannot read array at {where}: {e}') from e


def _read_ts_arrays(specs: Mapping[str, dict]) -> dict[str, np.ndarray]:
  """Opens, then reads, all arrays concurrently."""
  opened = {name: ts.open(spec, open=True, read=True) for name, spec in specs.items()}
  reads = {name: _ts_result(name, specs[name], f).read() for name, f in opened.items()}
  return {name: np.asarray(_ts_result(name, specs[name], f)) for name, f in reads.items()}


def read_t5x_checkpoint(path: str) -> Params:
  """Reads a T5X legacy checkpoint's 'target' params; optimizer arrays are never opened.

  `path` is a checkpoint_N directory or its `checkpoint` file, local or `gs://`.
  """
  msgpack_file, checkpoint_dir = t5x_checkpoint_paths(path)
  target = _t5x_target(_restore_msgpack(msgpack_file), msgpack_file)
  flat = flatten_params(target, is_leaf=_is_ts_spec)
  specs = {k: resolve_ts_spec(v, checkpoint_dir) for k, v in flat.items() if _is_ts_spec(v)}
  flat.update(_read_ts_arrays(specs))
  return unflatten_params({k: np.asarray(v) for k, v in flat.items()})


def _zarr_spec(name: str, array: np.ndarray) -> dict[str, Any]:
  """The spec t5x writes into the msgpack for a locally saved array (relative path)."""
  chunks = list(array.shape)
  while math.prod(chunks) * array.dtype.itemsize > _CHUNK_BYTES:  # Chunks of at most 64 MiB.
    i = int(np.argmax(chunks))
    chunks[i] = -(-chunks[i] // 2)
  return {
      'driver': 'zarr',
      'dtype': array.dtype.name,
      'kvstore': {'driver': 'file', 'path': f'{name}/'},
      'metadata': {'chunks': chunks,
                   'compressor': {'id': 'gzip', 'level': 1},
                   'shape': list(array.shape)},
  }


# t5x adafactor.Adafactor's defaults (t5x/examples/t5/t5_1_1/*.gin keep them): factored second
# moments for parameters whose two largest dims are >= 128, no momentum (beta1 None).
ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR = 128
OPTIMIZER_STATES = ('adafactor', None)


def adafactor_param_state(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
  """t5x's `Adafactor.init_param_state` for one parameter: its zero state, as t5x builds it.

  Keys m, v, v_col, v_row, float32; the unused ones are `(1,)` placeholders. Parameters of rank
  <= 2 use t5x's heuristic (logical factor rules fall back to it there): factored when the
  second-largest dim is >= ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR, reducing over the two largest dims
  d1 (second) and d0 (largest): v_row = shape without d0, v_col = shape without d1; otherwise
  v has the parameter's shape. m stays a placeholder (beta1 None).

  Raises:
    ValueError: for a parameter of rank > 2 (t5x needs an explicit factor rule there).
  """
  shape = tuple(int(n) for n in shape)
  if len(shape) > 2:
    raise ValueError(f'Adafactor state for a parameter of rank {len(shape)} {shape} needs an '
                     'explicit factor rule; t5align parameters are at most 2-D.')
  state = {k: np.zeros((1,), np.float32) for k in ('m', 'v', 'v_col', 'v_row')}
  order = np.argsort(shape)  # As t5x: the two largest dims, ties in argsort's order.
  if len(shape) == 2 and shape[order[-2]] >= ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR:
    d1, d0 = int(order[-2]), int(order[-1])
    state['v_row'] = np.zeros(np.delete(shape, d0), np.float32)
    state['v_col'] = np.zeros(np.delete(shape, d1), np.float32)
  else:
    state['v'] = np.zeros(shape, np.float32)
  return state


def save_t5x_checkpoint(params: Mapping[str, Any], directory: str, step: int, *,
                        inline_max_bytes: int = 0,
                        optimizer_state: str | None = 'adafactor') -> str:
  """Writes `params` (dtypes kept) as the T5X legacy checkpoint `directory/checkpoint_{step}`.

  The layout is t5x's train state: a msgpack `{'version': 3, 'optimizer': {'target': params,
  'state': {'step': int32, 'param_states': ...}}}` whose parameter leaves are zarr specs (gzip,
  relative `target.<dotted.path>/` folders) or inline arrays of at most `inline_max_bytes`.
  With `optimizer_state='adafactor'`, `param_states` is t5x's freshly initialized Adafactor state
  (`adafactor_param_state` per parameter; full-shape `v` in `state.param_states.<path>.v/`
  folders, factored `v_row`/`v_col` and placeholders inline, as t5x writes them), so `t5x.train`
  can restore the checkpoint and start training from it; with None, no `param_states` (enough for
  t5x.eval and every reader here). Written to a temporary sibling directory, then renamed.

  Returns:
    The path of the new checkpoint_N directory (local only).

  Raises:
    FileExistsError: if checkpoint_{step} already exists.
  """
  if optimizer_state not in OPTIMIZER_STATES:
    raise ValueError(f'optimizer_state={optimizer_state!r}; expected one of {OPTIMIZER_STATES}.')
  if _is_gcs(directory):
    raise NotImplementedError('save_t5x_checkpoint writes local directories only.')
  final_dir = os.path.join(directory, f'checkpoint_{step}')
  if os.path.exists(final_dir):
    raise FileExistsError(f'Checkpoint already exists: {final_dir}')
  flat = {path: np.asarray(value) for path, value in flatten_params(params).items()}
  for path, array in flat.items():
    if array.dtype.kind not in 'fiub' and array.dtype != jnp.bfloat16:
      raise TypeError(f'Parameter {path}: cannot save dtype {array.dtype}')
  states = {}
  if optimizer_state == 'adafactor':
    states = {path: adafactor_param_state(array.shape) for path, array in flat.items()}
  os.makedirs(directory, exist_ok=True)
  tmp_dir = tempfile.mkdtemp(prefix=f'checkpoint_{step}.tmp-', dir=directory)
  try:
    to_write = {f'target/{path}': array for path, array in flat.items()}
    # t5x writes a full-shape v through tensorstore, the rest of the state inline.
    to_write.update({f'state/param_states/{path}/v': state['v']
                     for path, state in states.items() if state['v'].shape != (1,)})
    written = _write_arrays(to_write, tmp_dir, inline_max_bytes)
    state = {'step': np.asarray(step, np.int32)}
    if optimizer_state is not None:
      state['param_states'] = unflatten_params({
          f'{path}/{k}': written.get(f'state/param_states/{path}/{k}', value)
          for path, param_state in states.items() for k, value in param_state.items()})
    target = unflatten_params({path: written[f'target/{path}'] for path in flat})
    contents = {'version': 3, 'optimizer': {'state': state, 'target': target}}
    with open(os.path.join(tmp_dir, 'checkpoint'), 'wb') as f:
      f.write(serialization.msgpack_serialize(contents))
    os.rename(tmp_dir, final_dir)
  except BaseException:
    shutil.rmtree(tmp_dir, ignore_errors=True)
    raise
  return final_dir


def _write_arrays(flat: Mapping[str, np.ndarray], tmp_dir: str,
                  inline_max_bytes: int) -> dict[str, Any]:
  """Writes the zarr folders; returns the msgpack leaves (specs or inline arrays) by path.

  Paths are the msgpack's below 'optimizer' ('target/...', 'state/param_states/...'); an array
  goes to the folder named by its dotted path.
  """
  leaves, writes = {}, []
  try:
    for path, array in flat.items():
      if array.nbytes <= inline_max_bytes:
        leaves[path] = array
        continue
      spec = _zarr_spec(path.replace('/', '.'), array)
      # resolve_ts_spec keeps only the shape (for reading); writing needs chunks and compressor.
      write_spec = {**resolve_ts_spec(spec, tmp_dir), 'metadata': spec['metadata']}
      writes.append(ts.open(write_spec, create=True).result().write(array))
      leaves[path] = spec
  finally:
    errors = [w.exception() for w in writes]  # Waits for every write, also on failure.
  if any(errors):
    raise next(e for e in errors if e)
  return leaves


# ---------------------------------------------------------------- T5X Orbax


def _orbax_state_dir(path: str) -> str:
  path = str(path).rstrip('/')
  path = path if _is_gcs(path) else os.path.abspath(path)  # Orbax needs absolute paths.
  return path if posixpath.basename(path) == 'state' else _join(path, 'state')


def _orbax_params_metadata(path: str) -> tuple[str, str, Any]:
  """`(state_dir, key, metadata subtree)` of a T5X Orbax checkpoint's params; reads no arrays."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  state_dir = _orbax_state_dir(path)
  if not _exists(_join(state_dir, '_METADATA')):
    raise FileNotFoundError(f'No Orbax checkpoint metadata at {_join(state_dir, "_METADATA")}')
  try:
    metadata = ocp.PyTreeCheckpointer().metadata(state_dir)
  except Exception as e:  # Orbax/tensorstore errors of many types.
    raise CheckpointReadError(f'Cannot read Orbax checkpoint {state_dir}: {e}') from e
  tree = getattr(metadata, 'item_metadata', metadata)
  tree = getattr(tree, 'tree', tree)
  if not isinstance(tree, Mapping):
    raise CheckpointReadError(
        f'Cannot read Orbax checkpoint {state_dir}: its metadata lists no arrays (got '
        f'{type(tree).__name__}); is manifest.ocdbt or _METADATA missing or truncated?')
  key = next((k for k in ('target', 'params') if k in tree), None)
  if key is None:
    raise CheckpointReadError(f'{state_dir} holds no "target" or "params" (keys: {list(tree)})')
  return state_dir, key, tree[key]


def _restore_orbax(state_dir: str, key: str, item: Any, restore_args: Any) -> Params:
  """Restores `{key: item}` with `restore_args`; errors name the checkpoint."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  checkpointer = ocp.PyTreeCheckpointer()
  try:
    restored = checkpointer.restore(state_dir, args=ocp.args.PyTreeRestore(
        item={key: item}, restore_args={key: restore_args}, partial_restore=True))
  except Exception as e:  # Orbax/tensorstore errors of many types.
    if isinstance(e, (FileNotFoundError, CheckpointReadError)):
      raise
    raise CheckpointReadError(f'Cannot read Orbax checkpoint {state_dir}: {e}') from e
  return restored[key]


def read_t5x_orbax_checkpoint(path: str) -> Params:
  """Restores only the params ('target', else 'params') of a T5X Orbax checkpoint as numpy.

  `path` is a checkpoint_N directory or its `state/` directory.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  state_dir, key, item = _orbax_params_metadata(path)
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
  restored = _restore_orbax(state_dir, key, item, restore_args)
  return unflatten_params({k: np.asarray(v) for k, v in flatten_params(restored).items()})


# ---------------------------------------------------------------- HF and Mesh-TF name mapping

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


def _block_path(stack: str, block: int, sublayer: int, module: list[str]) -> str | None:
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
  scale = hf_config.get('scale_decoder_outputs', hf_config.get('tie_word_embeddings', True))
  lm_head = state.pop('lm_head.weight', None)
  shared = state.get('shared.weight')
  untied = lm_head is not None and (shared is None or not np.array_equal(lm_head, shared))
  if untied and scale:
    raise CheckpointReadError('HF checkpoint has its own lm_head.weight but a scaled (tied) '
                              'config; T5X has no such head.')
  if untied:
    return {'decoder/logits_dense/kernel': lm_head.T}
  if not scale and shared is not None:
    # transformers >= 5 builds unscaled tied models: an untied T5X head holding a copy.
    return {'decoder/logits_dense/kernel': shared.T}
  return {}


def params_from_hf_state_dict(state_dict: Mapping[str, np.ndarray],
                              hf_config: Mapping[str, Any]) -> Params:
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
      path = _block_path(stack, int(block), int(sublayer), module.split('.'))
      array = array.T if path and array.ndim == 2 else array
    flat[path or f'{UNMAPPED}/{name}'] = array
  return unflatten_params(flat)


def hf_flax_to_state_dict(flax_params: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """Renames HF's Flax T5 params (`flax_model.msgpack`) to torch names and layout.

  Flax kernels `[in, out]` become `.weight` `[out, in]`; `embedding`s (shared `[V, E]`, relative
  bias `[32, H]`) already have torch's layout; layer norms are `.weight` in both.
  """
  if set(flax_params) == {'params'}:
    flax_params = flax_params['params']
  state = {}
  for path, array in flatten_params(flax_params).items():
    *module, leaf = path.split('/')
    if leaf == 'kernel':
      array = np.asarray(array).T
    state['.'.join(module + ['weight'])] = np.asarray(array)
  return state


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


def params_from_mesh_tf(variables: Mapping[str, np.ndarray]) -> Params:
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
      path = _block_path(stack, int(block), int(sublayer), module)
    flat[path or f'{UNMAPPED}/{name}'] = np.asarray(array)
  return unflatten_params(flat)


# ---------------------------------------------------------------- HF and Mesh-TF files


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
    raise CheckpointReadError(f'Cannot read weight file {location}: {e}') from e


def _load_hf_state_dict(path: str) -> dict[str, np.ndarray]:
  """Reads the first HF weight file found (sharded safetensors, safetensors, torch, Flax)."""
  for filename in _HF_WEIGHT_FILES:
    location = os.path.join(path, filename)
    if not os.path.exists(location):
      continue
    if filename.endswith('.msgpack'):
      return hf_flax_to_state_dict(_restore_msgpack(location))
    if not filename.endswith('.index.json'):
      return _load_weight_file(location)
    index = outputs.read_json(location, 'HF weight index', CheckpointReadError)
    if not isinstance(index, dict) or not isinstance(index.get('weight_map'), dict):
      raise CheckpointReadError(f'{location}: no "weight_map" object.')
    shards = sorted(set(index['weight_map'].values()))
    return {k: v for s in shards for k, v in _load_weight_file(os.path.join(path, s)).items()}
  raise FileNotFoundError(f'No HF weight file ({", ".join(_HF_WEIGHT_FILES)}) in {path}')


def _hf_config(path: str) -> dict[str, Any]:
  location = os.path.join(path, 'config.json')
  config = outputs.read_json(location, 'HF config', CheckpointReadError)
  if not isinstance(config, dict):
    raise CheckpointReadError(f'{location}: expected a JSON object; got {type(config).__name__}.')
  return config


def hf_config_hints(hf_config: Mapping[str, Any]) -> dict[str, Any]:
  """T5Config fields an HF `config.json` fixes beyond shapes: the MLP activations.

  Raises:
    ValueError: for activations or relative-attention settings T5X cannot express.
  """
  buckets = (hf_config.get('relative_attention_num_buckets', 32),
             hf_config.get('relative_attention_max_distance', 128))
  proj = hf_config.get('feed_forward_proj', 'relu')
  act = 'gelu' if proj == 'gated-gelu' else _HF_ACTIVATIONS.get(proj.removeprefix('gated-'))
  if buckets != (32, 128) or act is None:
    raise ValueError(f'HF config has feed_forward_proj={proj!r}, relative attention (buckets, '
                     f'max distance)={buckets}; T5X supports {sorted(_HF_ACTIVATIONS)}, (32, 128)')
  epsilon = hf_config.get('layer_norm_epsilon', 1e-6)
  if epsilon != 1e-6:
    raise ValueError(f'HF config has layer_norm_epsilon={epsilon!r}; T5X (and t5align) layer '
                     'norms use 1e-6, so this model would run with other numbers than it was '
                     'trained with.')
  return {'mlp_activations': (act, 'linear') if proj.startswith('gated-') else (act,)}


def read_hf_checkpoint(path: str) -> Params:
  """Reads a HuggingFace T5 directory (`config.json` plus weights) into the T5X tree."""
  return params_from_hf_state_dict(_load_hf_state_dict(str(path)), _hf_config(str(path)))


def read_mesh_tf_checkpoint(path: str) -> Params:
  """Reads a Mesh-TF T5 checkpoint (`.../model.ckpt-N` or its directory); needs tensorflow."""
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError('Reading Mesh-TF checkpoints needs tensorflow (pip install tensorflow); '
                      'other formats do not.') from e
  try:
    reader = tf.train.load_checkpoint(str(path))
    names = [n for n in reader.get_variable_to_shape_map()
             if not _is_mesh_tf_optimizer_variable(n)]
    arrays = {n: reader.get_tensor(n) for n in names}
  except Exception as e:  # tensorflow raises DataLossError, NotFoundError, ... on bad files.
    raise CheckpointReadError(f'Cannot read Mesh-TF checkpoint {path} (its .index or .data '
                              f'files): {type(e).__name__}: {str(e).strip()[:300]}') from e
  return params_from_mesh_tf(arrays)


# ---------------------------------------------------------------- detection and loading


def detect_format(path: str) -> str:
  """One of `FORMATS` for a checkpoint path, from the files it holds."""
  path = str(path).rstrip('/')
  if _is_gcs(path):
    if posixpath.basename(path) == 'checkpoint' or _exists(_join(path, 'checkpoint')):
      return 't5x'
    return 't5x_orbax'
  if not os.path.exists(path) and not os.path.exists(path + '.index'):
    raise FileNotFoundError(f'No such checkpoint: {path}')
  listing = os.listdir(path) if os.path.isdir(path) else []
  if os.path.exists(path + '.index') or any(name.endswith('.index') for name in listing):
    return 'mesh_tf'
  if os.path.isfile(path) and os.path.basename(path) != 'checkpoint':
    raise ValueError(f'{path} is a file, not a checkpoint: give a T5X checkpoint_N folder (or '
                     'its `checkpoint` file), an Orbax checkpoint folder, a HuggingFace folder '
                     'or a Mesh-TF checkpoint prefix.')
  if os.path.isfile(path) or os.path.isfile(os.path.join(path, 'checkpoint')):
    return 't5x'
  if os.path.exists(os.path.join(_orbax_state_dir(path), '_METADATA')):
    return 't5x_orbax'
  if os.path.exists(os.path.join(path, 'config.json')):
    return 'hf'
  raise ValueError(f'Cannot tell the checkpoint format of {path}: no T5X `checkpoint`, Orbax '
                   '`state/`, HF `config.json` or TF `.index` file.')


_READERS = {'t5x': read_t5x_checkpoint, 't5x_orbax': read_t5x_orbax_checkpoint,
            'hf': read_hf_checkpoint, 'mesh_tf': read_mesh_tf_checkpoint}


def read_params(path: str, *, format: str = 'auto') -> Params:  # pylint: disable=redefined-builtin
  """Reads any supported checkpoint into the T5X tree, unchecked and in its stored dtypes."""
  format = detect_format(path) if format == 'auto' else format
  if format not in _READERS:
    raise ValueError(f'format={format!r}; expected "auto" or one of {FORMATS}')
  return _READERS[format](str(path))


def infer_config(params: Mapping[str, Any]) -> dict[str, Any]:
  """The shape-determined `network.T5Config` keyword arguments of a T5X params tree.

  A gated MLP (`wi_0`/`wi_1`) is taken as T5 1.1's ('gelu', 'linear'), `wi` as ('relu',).
  dtype and dropout are not recorded in checkpoints and are left out.

  Raises:
    ValueError: if a parameter the inference needs is absent.
  """
  def get(path):
    node = params
    for key in path.split('/'):
      if not isinstance(node, Mapping) or key not in node:
        raise ValueError(f'Cannot infer the T5 config: parameter {path} is missing.')
      node = node[key]
    return np.shape(node)

  def count_layers(stack):
    return sum(1 for k in params.get(stack, {}) if re.fullmatch(r'layers_\d+', k))

  vocab_size, emb_dim = get('token_embedder/embedding')
  num_heads = get('encoder/relpos_bias/rel_embedding')[0]
  joined = get('encoder/layers_0/attention/query/kernel')[1]
  gated = 'wi_0' in params.get('encoder', {}).get('layers_0', {}).get('mlp', {})
  mlp_dim = get(f"encoder/layers_0/mlp/{'wi_0' if gated else 'wi'}/kernel")[1]
  if joined % num_heads:
    raise ValueError(f'Query width {joined} is not a multiple of {num_heads} heads.')
  return {
      'vocab_size': vocab_size, 'emb_dim': emb_dim, 'num_heads': num_heads,
      'num_encoder_layers': count_layers('encoder'),
      'num_decoder_layers': count_layers('decoder'),
      'head_dim': joined // num_heads, 'mlp_dim': mlp_dim,
      'mlp_activations': ('gelu', 'linear') if gated else ('relu',),
      'logits_via_embedding': 'logits_dense' not in params.get('decoder', {}),
  }


def check_params(params: Mapping[str, Any], expected: Mapping[str, Any], source: str = '') -> None:
  """Raises one `CheckpointMismatchError` unless `params` has `expected`'s paths and shapes.

  `expected` leaves are anything with a `.shape`, e.g. `jax.ShapeDtypeStruct`.
  """
  got = {k: tuple(np.shape(v)) for k, v in flatten_params(params).items()}
  want = {k: tuple(v.shape) for k, v in flatten_params(expected).items()}
  mismatched = {k: (got[k], want[k]) for k in got.keys() & want.keys() if got[k] != want[k]}
  if mismatched or got.keys() != want.keys():
    raise CheckpointMismatchError(want.keys() - got.keys(), got.keys() - want.keys(), mismatched,
                                  source)


def _check_source_dtypes(dtypes: Mapping[str, Any], source_dtypes: tuple[str, ...]) -> None:
  """Raises one `CheckpointDtypeError` listing every `{path: stored dtype}` not allowed."""
  bad = {k: np.dtype(d).name for k, d in dtypes.items() if np.dtype(d).name not in source_dtypes}
  if bad:
    lines = '\n'.join(f'  {k}: {d}' for k, d in sorted(bad.items()))
    raise CheckpointDtypeError(f'Stored dtypes not in source_dtypes={source_dtypes} (pass them '
                               f'to allow a cast):\n{lines}')


def cast_params(params: Mapping[str, Any], dtype: Any = np.float32, *,
                source_dtypes: tuple[str, ...] = DEFAULT_SOURCE_DTYPES) -> Params:
  """Casts every array to `dtype`, refusing stored dtypes not named in `source_dtypes`.

  Raises:
    CheckpointDtypeError: listing every parameter whose stored dtype is not allowed.
  """
  flat = flatten_params(params)
  _check_source_dtypes({k: np.asarray(v).dtype for k, v in flat.items()}, source_dtypes)
  dtype = np.dtype(dtype)
  return unflatten_params({k: np.ascontiguousarray(np.asarray(v).astype(dtype, copy=False))
                           for k, v in flat.items()})


@functools.lru_cache(maxsize=16)
def _param_shapes(config: network.T5Config) -> Params:
  return network.param_shapes(config)  # Memoized: tracing the model takes about a second.


def _checked_config(params: Mapping[str, Any], config: network.T5Config | None, path: str,
                    hints: Mapping[str, Any]) -> network.T5Config:
  """The config (inferred from shapes when None), checked strictly against `params`' shapes.

  `params` leaves need only a `.shape` (arrays, or metadata of arrays not read yet).
  """
  if config is None:
    try:
      config = network.T5Config(**{**infer_config(params), **hints})
    except ValueError as e:
      raise ValueError(f'{e} (checkpoint {path}; pass config= to see every mismatch)') from e
  for field, value in hints.items():
    if tuple(getattr(config, field)) != value:
      raise ValueError(f'config.{field}={getattr(config, field)} but {path} needs {value}')
  check_params(params, _param_shapes(config), source=str(path))
  return config


def load_params(path: str, config: network.T5Config | None = None, *, dtype: Any = np.float32,
                format: str = 'auto',  # pylint: disable=redefined-builtin
                source_dtypes: tuple[str, ...] = DEFAULT_SOURCE_DTYPES,
                mesh: jax.sharding.Mesh | None = None,
                rules: Any = None,
                check_finite: bool = True,
                ) -> tuple[Params, network.T5Config]:
  """Reads a checkpoint of any supported format, checks it strictly and casts it.

  With `mesh`, the parameters come back as `jax.Array`s placed with
  `partitioning.param_shardings(config, mesh, rules)`, and T5X checkpoints are read sharded: each
  process reads only the slices its own devices hold (legacy and Orbax zarr arrays through
  tensorstore slices, one array at a time; inline msgpack arrays sliced in host memory), each
  slice cast to `dtype` as it is read, so no process ever holds a whole float32 copy of the
  model, only its shards plus one stored chunk. HuggingFace and Mesh-TF checkpoints are read whole on every host, cast, then
  placed. The strict checks run on the stored shapes and dtypes before any array is read.

  Args:
    path: a T5X checkpoint_N directory (legacy or Orbax) or its `checkpoint` file, a HuggingFace
      directory, or a Mesh-TF checkpoint prefix/directory; `gs://` for T5X.
    config: the architecture to check against; inferred from shapes (and HF's config.json) when
      None.
    dtype: the dtype of every returned array (e.g. `jnp.bfloat16` for big models).
    format: 'auto' or one of `FORMATS`.
    source_dtypes: stored dtypes accepted for the cast; others raise (e.g. add 'float64').
    mesh: place (and for T5X read) the parameters sharded over this mesh; None: numpy on host.
    rules: logical axis rules for the shardings; None: `partitioning.standard_logical_axis_rules()`.
    check_finite: refuse parameters holding NaN or inf (after the cast), naming each one
      (`validate.finite_params`); a corrupt chunk would otherwise give silently empty outputs.

  Returns:
    `(params, config)`: the T5X params tree in `dtype` (numpy arrays, or `jax.Array`s with
    `mesh`), and the config used.

  Raises:
    FileNotFoundError: naming the missing checkpoint, file or array folder.
    CheckpointReadError: naming a corrupt file.
    CheckpointMismatchError: listing every missing, unexpected and mis-shaped parameter.
    CheckpointDtypeError: listing parameters stored in a dtype outside `source_dtypes`.
  """
  validate.float_dtype(dtype, 'dtype (PARAMS_DTYPE)')
  format = detect_format(path) if format == 'auto' else format
  if mesh is not None and format in ('t5x', 't5x_orbax'):
    params, config, nonfinite = _load_sharded(str(path), format, config, dtype, source_dtypes,
                                              mesh, rules)
    if check_finite:  # Counted slice by slice as read: no second pass over the arrays.
      validate.finite_params(params, str(path), counts=nonfinite)
      check_finite = False
  else:
    params = read_params(path, format=format)
    try:
      hints = hf_config_hints(_hf_config(str(path))) if format == 'hf' else {}
    except CheckpointReadError:
      raise
    except ValueError as e:
      raise ValueError(f'{os.path.join(str(path), "config.json")}: {e}') from e
    config = _checked_config(params, config, str(path), hints)
    params = cast_params(params, dtype, source_dtypes=source_dtypes)
    if check_finite:
      validate.finite_params(params, str(path))
      check_finite = False
    if mesh is not None:
      from t5align import partitioning  # pylint: disable=g-import-not-at-top
      params = jax.device_put(params, partitioning.param_shardings(config, mesh, rules))
  if check_finite:
    validate.finite_params(params, str(path))
  return params, config


# ---------------------------------------------------------------- sharded T5X loading


class _LazyArray:
  """A stored array not read yet: shape, stored dtype, a reader of `[index]` slices, and the
  bytes one read may decode beyond the slice (its largest stored chunk; 0 when in memory)."""

  def __init__(self, shape: tuple[int, ...], dtype: Any, read: Callable[[tuple], np.ndarray],
               chunk_bytes: int = 0):
    self.shape, self.dtype, self.read = tuple(shape), np.dtype(dtype), read
    self.chunk_bytes = chunk_bytes


def _lazy_ts_arrays(specs: Mapping[str, dict], where: Mapping[str, dict],
                    context: ts.Context | None = None) -> dict[str, _LazyArray]:
  """Opens (metadata only) the tensorstore arrays `specs`; errors name `where[name]`'s kvstore."""
  context = context or ts.Context()
  opened = {name: ts.open(spec, open=True, read=True, context=context)
            for name, spec in specs.items()}
  lazy = {}
  for name, future in opened.items():
    store = _ts_result(name, where[name], future)

    def read(index, name=name, store=store):
      return np.asarray(_ts_result(name, where[name], store[index].read()))

    chunk = math.prod(store.chunk_layout.read_chunk.shape) * store.dtype.numpy_dtype.itemsize
    lazy[name] = _LazyArray(store.shape, store.dtype.numpy_dtype, read, chunk)
  return lazy


def _lazy_t5x_arrays(path: str) -> dict[str, _LazyArray]:
  """The legacy checkpoint's params by '/'-path, opened (metadata only) but not read."""
  msgpack_file, checkpoint_dir = t5x_checkpoint_paths(path)
  target = _t5x_target(_restore_msgpack(msgpack_file), msgpack_file)
  flat = flatten_params(target, is_leaf=_is_ts_spec)
  specs = {k: resolve_ts_spec(v, checkpoint_dir) for k, v in flat.items() if _is_ts_spec(v)}
  lazy = _lazy_ts_arrays(specs, specs)
  for name, value in flat.items():
    if name not in lazy:  # Inline in the msgpack: already in host memory.
      array = np.asarray(value)
      lazy[name] = _LazyArray(array.shape, array.dtype, array.__getitem__)
  return lazy


def _lazy_orbax_arrays(state_dir: str, item: Any) -> dict[str, _LazyArray]:
  """The Orbax checkpoint's params (`item`: their metadata) by '/'-path, opened but not read.

  Each array is opened as the zarr (or zarr3) array Orbax wrote, inside the checkpoint's OCDBT
  key-value store (or its own folder without OCDBT), with Orbax's tensorstore context.
  """
  from orbax.checkpoint.serialization import ts_utils  # pylint: disable=g-import-not-at-top
  flags = json.loads(_read_bytes(_join(state_dir, '_METADATA')))
  use_ocdbt = flags.get('use_ocdbt', _exists(_join(state_dir, 'manifest.ocdbt')))
  driver = 'zarr3' if flags.get('use_zarr3', False) else 'zarr'
  # NOTE: as Orbax reads: older Orbax skipped chunks equal to the fill value (absent = zeros);
  # newer Orbax writes every chunk, so an absent one is corruption.
  fill_missing = not flags.get('store_array_data_equal_to_fill_value', False)
  specs, where = {}, {}
  for path, metadata in flatten_params(item).items():
    if use_ocdbt:
      kvstore = {'driver': 'ocdbt', 'base': kvstore_spec(state_dir + '/'), 'path': metadata.name}
    else:
      kvstore = kvstore_spec(_join(state_dir, metadata.name) + '/')
    specs[path] = {'driver': driver, 'kvstore': kvstore, 'recheck_cached_data': False,
                   'recheck_cached_metadata': False, 'fill_missing_data_reads': fill_missing}
    where[path] = {'kvstore': kvstore_spec(_join(state_dir, metadata.name))}
  context = ts_utils.get_ts_context(use_ocdbt=use_ocdbt)
  return _lazy_ts_arrays(specs, where, context)


def _sharded_array(lazy: _LazyArray, sharding: jax.sharding.Sharding,
                   dtype: Any) -> tuple[jax.Array, int]:
  """A global array holding `lazy`; this process reads only the slices its devices hold.

  The devices' slices are read as their bounding box, once (a stored chunk is decoded once
  however many local devices share it), unless the box is over twice the slices' total; then
  slice by slice. Either way each read is cast to `dtype` on its own.

  Returns:
    The array, and the number of NaN / inf values in the slices this process read (after the
    cast), counted on the host as they are read.
  """
  indices = [tuple(s.indices(n)[:2] for s, n in zip(index, lazy.shape))
             for index in sharding.addressable_devices_indices_map(lazy.shape).values()]
  distinct = set(indices)
  box = tuple((min(i[d][0] for i in distinct), max(i[d][1] for i in distinct))
              for d in range(len(lazy.shape)))
  union = sum(math.prod(b - a for a, b in i) for i in distinct)
  slices = {}
  if math.prod(b - a for a, b in box) <= 2 * union:
    data = np.ascontiguousarray(
        lazy.read(tuple(slice(a, b) for a, b in box)).astype(dtype, copy=False))
    for i in distinct:
      slices[i] = data[tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(i, box))]
  else:
    for i in distinct:
      slices[i] = np.ascontiguousarray(
          lazy.read(tuple(slice(a, b) for a, b in i)).astype(dtype, copy=False))

  def read(index: tuple[slice, ...]) -> np.ndarray:
    return slices[tuple(s.indices(n)[:2] for s, n in zip(index, lazy.shape))]

  nonfinite = sum(validate.nonfinite_count(x) for x in slices.values())
  return jax.make_array_from_callback(lazy.shape, sharding, read), nonfinite


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
  try:
    return ctypes.CDLL(None).malloc_trim  # glibc only.
  except (OSError, AttributeError):
    return None


def _release_free_heap() -> None:
  """Hands freed heap memory back to the OS where the C library allows (glibc `malloc_trim`).

  NOTE: glibc raises its mmap threshold to the size of a freed large buffer, so after the first
  decoded chunk later ones come from the heap and, freed, stay resident (up to two chunks,
  compressed and decoded) for the rest of the load, while this process's shards pile up.
  """
  trim = _malloc_trim()
  if trim is not None:
    trim(0)


def _load_sharded(path: str, format: str,  # pylint: disable=redefined-builtin
                  config: network.T5Config | None, dtype: Any,
                  source_dtypes: tuple[str, ...], mesh: jax.sharding.Mesh,
                  rules: Any) -> tuple[Params, network.T5Config]:
  """`load_params` with a mesh for T5X legacy and Orbax checkpoints.

  Arrays are read one at a time, those with the largest stored chunks first, and the freed read
  buffers handed back to the OS after each: at any moment a process holds the shards it has
  read so far plus one array's read (a decoded chunk and its compressed bytes), and the biggest
  reads happen while it holds the fewest shards.
  """
  from t5align import partitioning  # pylint: disable=g-import-not-at-top
  if format == 't5x':
    stored = _lazy_t5x_arrays(path)
  else:
    state_dir, _, item = _orbax_params_metadata(path)
    stored = _lazy_orbax_arrays(state_dir, item)
  config = _checked_config(unflatten_params(stored), config, path, {})
  _check_source_dtypes({k: v.dtype for k, v in stored.items()}, source_dtypes)
  shardings = flatten_params(partitioning.param_shardings(config, mesh, rules))
  dtype = np.dtype(dtype)
  arrays, nonfinite = {}, {}
  for name in sorted(stored, key=lambda k: -stored[k].chunk_bytes):
    arrays[name], nonfinite[name] = _sharded_array(stored[name], shardings[name], dtype)
    _release_free_heap()
  if jax.process_count() > 1:  # Each process counted its own slices: any count is an error.
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    names = sorted(nonfinite)
    everyone = multihost_utils.process_allgather(np.array([nonfinite[k] for k in names]))
    nonfinite = dict(zip(names, np.asarray(everyone).reshape(-1, len(names)).max(0).tolist()))
  return unflatten_params({k: arrays[k] for k in stored}), config, nonfinite
