"""T5X checkpoints: the legacy format (msgpack + zarr arrays) read and written, and Orbax read.

Readers return the 'params' tree (`target`) as numpy arrays in the stored dtype, or, for
sharded loading, `LazyArray`s opened through tensorstore but not read. The writer produces
t5x's own train-state layout (with a fresh Adafactor state) that `t5x.train` restores.
"""
from __future__ import annotations

import copy
import json
import math
import os
import posixpath
import shutil
import tempfile
from typing import Any, Callable, Mapping

from flax import serialization
import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts

from t5align.checkpoints import store
from t5align.runtime import batching
from t5align.runtime import fileio

T5X_DUMMY_BUCKET = 't5x-dummy-bucket'  # In t5x gcs specs: "the checkpoint's own location".
_CHUNK_BYTES = 64 * 2**20


# Legacy: reading.


def _is_ts_spec(value: Any) -> bool:
  return isinstance(value, Mapping) and 'driver' in value and ({'kvstore', 'path'} & set(value))


def t5x_checkpoint_paths(path: str) -> tuple[str, str]:
  """`(msgpack file, checkpoint_N directory)` for a path to either of them."""
  path = str(path).rstrip('/')
  path = path if store.is_gcs(path) else os.path.abspath(path)
  is_file = (posixpath.basename(path) == 'checkpoint'
             and (store.is_gcs(path) or os.path.isfile(path)))
  if is_file:
    return path, (posixpath.dirname(path) if store.is_gcs(path) else os.path.dirname(path))
  return fileio.join(path, 'checkpoint'), path


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
    kvstore = {'driver': 'gcs' if store.is_gcs(kvstore) else 'file', 'path': kvstore}
  rel = posixpath.join(kvstore.get('path', ''), spec.pop('path', ''))
  driver = kvstore.get('driver')
  if driver == 'gcs' and store.is_gcs(rel):
    location = rel
  elif driver == 'gcs' and kvstore.get('bucket', T5X_DUMMY_BUCKET) != T5X_DUMMY_BUCKET:
    location = f"gs://{kvstore['bucket']}/{rel}"
  elif driver in ('gcs', 'file', 'gfile'):
    is_absolute = store.is_gcs(rel) or rel.startswith(('/', 'file://'))
    location = rel if is_absolute else fileio.join(checkpoint_dir, rel)
  else:
    raise store.CheckpointReadError(f'Unsupported tensorstore kvstore driver {driver!r} in {spec}')
  spec['kvstore'] = store.kvstore_spec(location.rstrip('/') + '/')
  if spec.get('dtype') == 'uint16' or spec.get('metadata', {}).get('dtype') == '<u2':
    raise store.CheckpointReadError(
        f'uint16 array at {location} (old bfloat16 encoding); re-save as bfloat16.')
  if 'metadata' in spec:
    spec['metadata'] = {'shape': list(spec['metadata']['shape'])}
  # NOTE: t5x and Orbax write every chunk, so a missing chunk file is corruption, not zeros.
  spec['fill_missing_data_reads'] = False
  return spec


def _t5x_target(contents: Mapping[str, Any], location: str) -> Mapping[str, Any]:
  """The params subtree: version >= 1 wraps it in 'optimizer'; version 0 has it at the top."""
  holder = contents['optimizer'] if 'optimizer' in contents else contents
  if 'target' not in holder:
    raise store.CheckpointReadError(f'{location} has no "target" (keys: {sorted(holder)})')
  return holder['target']


def _read_ts_arrays(specs: Mapping[str, dict]) -> dict[str, np.ndarray]:
  """Opens, then reads, all arrays concurrently."""
  opened = {name: ts.open(spec, open=True, read=True) for name, spec in specs.items()}
  store.wait_all(opened, specs, 'Opening the arrays of')
  reads = {name: store.ts_result(name, specs[name], f).read() for name, f in opened.items()}
  store.wait_all(reads, specs, 'Reading the arrays of')
  return {name: np.asarray(store.ts_result(name, specs[name], f)) for name, f in reads.items()}


def read_t5x_checkpoint(path: str) -> store.Params:
  """Reads a T5X legacy checkpoint's 'target' params; optimizer arrays are never opened.

  `path` is a checkpoint_N directory or its `checkpoint` file, local or `gs://`.
  """
  msgpack_file, checkpoint_dir = t5x_checkpoint_paths(path)
  target = _t5x_target(store.restore_msgpack(msgpack_file), msgpack_file)
  flat = store.flatten_params(target, is_leaf=_is_ts_spec)
  specs = {k: resolve_ts_spec(v, checkpoint_dir) for k, v in flat.items() if _is_ts_spec(v)}
  flat.update(_read_ts_arrays(specs))
  return store.unflatten_params({k: np.asarray(v) for k, v in flat.items()})


def _zarr_spec(name: str, array: np.ndarray) -> dict[str, Any]:
  """The spec t5x writes into the msgpack for a locally saved array (relative path)."""
  chunks = list(array.shape)
  while math.prod(chunks) * array.dtype.itemsize > _CHUNK_BYTES:  # Chunks of at most 64 MiB.
    i = int(np.argmax(chunks))
    chunks[i] = batching.ceil_div(chunks[i], 2)
  return {
      'driver': 'zarr',
      'dtype': array.dtype.name,
      'kvstore': {'driver': 'file', 'path': f'{name}/'},
      'metadata': {'chunks': chunks,
                   'compressor': {'id': 'gzip', 'level': 1},
                   'shape': list(array.shape)},
  }


# Legacy: writing.


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
  if store.is_gcs(directory):
    raise NotImplementedError('save_t5x_checkpoint writes local directories only.')
  final_dir = os.path.join(directory, f'checkpoint_{step}')
  if os.path.exists(final_dir):
    raise FileExistsError(f'Checkpoint already exists: {final_dir}')
  flat = {path: np.asarray(value) for path, value in store.flatten_params(params).items()}
  for path, array in flat.items():
    if array.dtype.kind not in 'fiub' and array.dtype != jnp.bfloat16:
      raise TypeError(f'Parameter {path}: cannot save dtype {array.dtype}')
  states = {}
  if optimizer_state == 'adafactor':
    states = {path: adafactor_param_state(array.shape) for path, array in flat.items()}
  os.makedirs(directory, exist_ok=True)
  tmp_dir = tempfile.mkdtemp(prefix=f'checkpoint_{step}.tmp-', dir=directory)
  try:
    os.chmod(tmp_dir, fileio.folder_mode())  # mkdtemp's 0700 would outlive the rename.
    to_write = {f'target/{path}': array for path, array in flat.items()}
    # t5x writes a full-shape v through tensorstore, the rest of the state inline.
    to_write.update({f'state/param_states/{path}/v': state['v']
                     for path, state in states.items() if state['v'].shape != (1,)})
    written = _write_arrays(to_write, tmp_dir, inline_max_bytes)
    state = {'step': np.asarray(step, np.int32)}
    if optimizer_state is not None:
      state['param_states'] = store.unflatten_params({
          f'{path}/{k}': written.get(f'state/param_states/{path}/{k}', value)
          for path, param_state in states.items() for k, value in param_state.items()})
    target = store.unflatten_params({path: written[f'target/{path}'] for path in flat})
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


# T5X Orbax.


def orbax_state_dir(path: str) -> str:
  path = str(path).rstrip('/')
  path = path if store.is_gcs(path) else os.path.abspath(path)  # Orbax needs absolute paths.
  return path if posixpath.basename(path) == 'state' else fileio.join(path, 'state')


def orbax_params_metadata(path: str) -> tuple[str, str, Any]:
  """`(state_dir, key, metadata subtree)` of a T5X Orbax checkpoint's params; reads no arrays."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  state_dir = orbax_state_dir(path)
  metadata_file = fileio.join(state_dir, '_METADATA')
  if not store.exists(metadata_file):
    raise FileNotFoundError(f'No Orbax checkpoint metadata at {metadata_file}')
  try:
    metadata = store.call(lambda: ocp.PyTreeCheckpointer().metadata(state_dir),
                          'Reading the Orbax metadata of', state_dir)
  except fileio.RemoteTimeoutError:
    raise
  except Exception as e:  # Orbax/tensorstore errors of many types.
    raise store.CheckpointReadError(f'Cannot read Orbax checkpoint {state_dir}: {e}') from e
  tree = getattr(metadata, 'item_metadata', metadata)
  tree = getattr(tree, 'tree', tree)
  if not isinstance(tree, Mapping):
    raise store.CheckpointReadError(
        f'Cannot read Orbax checkpoint {state_dir}: its metadata lists no arrays (got '
        f'{type(tree).__name__}); is manifest.ocdbt or _METADATA missing or truncated?')
  key = next((k for k in ('target', 'params') if k in tree), None)
  if key is None:
    raise store.CheckpointReadError(
        f'{state_dir} holds no "target" or "params" (keys: {list(tree)})')
  return state_dir, key, tree[key]


def _restore_orbax(state_dir: str, key: str, item: Any, restore_args: Any) -> store.Params:
  """Restores `{key: item}` with `restore_args`; errors name the checkpoint.

  NOTE: no overall deadline: an unsharded restore may read many GB. The remote metadata reads
  just before it are timed, so a bucket without network fails there, with the message.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  checkpointer = ocp.PyTreeCheckpointer()
  try:
    restored = checkpointer.restore(state_dir, args=ocp.args.PyTreeRestore(
        item={key: item}, restore_args={key: restore_args}, partial_restore=True))
  except Exception as e:  # Orbax/tensorstore errors of many types.
    if isinstance(e, (FileNotFoundError, store.CheckpointReadError)):
      raise
    raise store.CheckpointReadError(f'Cannot read Orbax checkpoint {state_dir}: {e}') from e
  return restored[key]


def read_t5x_orbax_checkpoint(path: str) -> store.Params:
  """Restores only the params ('target', else 'params') of a T5X Orbax checkpoint as numpy.

  `path` is a checkpoint_N directory or its `state/` directory.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  state_dir, key, item = orbax_params_metadata(path)
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
  restored = _restore_orbax(state_dir, key, item, restore_args)
  flat = store.flatten_params(restored)
  return store.unflatten_params({k: np.asarray(v) for k, v in flat.items()})


# Sharded reading: opened, not read.


class LazyArray:
  """A stored array not read yet: shape, stored dtype, a reader of `[index]` slices, and the
  bytes one read may decode beyond the slice (its largest stored chunk; 0 when in memory)."""

  def __init__(self, shape: tuple[int, ...], dtype: Any, read: Callable[[tuple], np.ndarray],
               chunk_bytes: int = 0):
    self.shape, self.dtype, self.read = tuple(shape), np.dtype(dtype), read
    self.chunk_bytes = chunk_bytes


def _lazy_ts_arrays(specs: Mapping[str, dict], where: Mapping[str, dict],
                    context: ts.Context | None = None) -> dict[str, LazyArray]:
  """Opens (metadata only) the tensorstore arrays `specs`; errors name `where[name]`'s kvstore."""
  context = context or ts.Context()
  opened = {name: ts.open(spec, open=True, read=True, context=context)
            for name, spec in specs.items()}
  store.wait_all(opened, where, 'Opening the arrays of')
  lazy = {}
  for name, future in opened.items():
    array = store.ts_result(name, where[name], future)

    def read(index, name=name, array=array):
      return np.asarray(store.ts_result(name, where[name], array[index].read()))

    chunk = math.prod(array.chunk_layout.read_chunk.shape) * array.dtype.numpy_dtype.itemsize
    lazy[name] = LazyArray(array.shape, array.dtype.numpy_dtype, read, chunk)
  return lazy


def lazy_t5x_arrays(path: str) -> dict[str, LazyArray]:
  """The legacy checkpoint's params by '/'-path, opened (metadata only) but not read."""
  msgpack_file, checkpoint_dir = t5x_checkpoint_paths(path)
  target = _t5x_target(store.restore_msgpack(msgpack_file), msgpack_file)
  flat = store.flatten_params(target, is_leaf=_is_ts_spec)
  specs = {k: resolve_ts_spec(v, checkpoint_dir) for k, v in flat.items() if _is_ts_spec(v)}
  lazy = _lazy_ts_arrays(specs, specs)
  for name, value in flat.items():
    if name not in lazy:  # Inline in the msgpack: already in host memory.
      array = np.asarray(value)
      lazy[name] = LazyArray(array.shape, array.dtype, array.__getitem__)
  return lazy


def lazy_orbax_arrays(state_dir: str, item: Any) -> dict[str, LazyArray]:
  """The Orbax checkpoint's params (`item`: their metadata) by '/'-path, opened but not read.

  Each array is opened as the zarr (or zarr3) array Orbax wrote, inside the checkpoint's OCDBT
  key-value store (or its own folder without OCDBT), with Orbax's tensorstore context.
  """
  from orbax.checkpoint.serialization import ts_utils  # pylint: disable=g-import-not-at-top
  flags = json.loads(store.read_bytes(fileio.join(state_dir, '_METADATA')))
  use_ocdbt = flags.get('use_ocdbt', store.exists(fileio.join(state_dir, 'manifest.ocdbt')))
  driver = 'zarr3' if flags.get('use_zarr3', False) else 'zarr'
  # NOTE: as Orbax reads: older Orbax skipped chunks equal to the fill value (absent = zeros);
  # newer Orbax writes every chunk, so an absent one is corruption.
  fill_missing = not flags.get('store_array_data_equal_to_fill_value', False)
  specs, where = {}, {}
  for path, metadata in store.flatten_params(item).items():
    if use_ocdbt:
      kvstore = {'driver': 'ocdbt', 'base': store.kvstore_spec(state_dir + '/'),
                 'path': metadata.name}
    else:
      kvstore = store.kvstore_spec(fileio.join(state_dir, metadata.name) + '/')
    specs[path] = {'driver': driver, 'kvstore': kvstore, 'recheck_cached_data': False,
                   'recheck_cached_metadata': False, 'fill_missing_data_reads': fill_missing}
    where[path] = {'kvstore': store.kvstore_spec(fileio.join(state_dir, metadata.name))}
  context = ts_utils.get_ts_context(use_ocdbt=use_ocdbt)
  return _lazy_ts_arrays(specs, where, context)
