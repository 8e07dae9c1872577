"""The loader: `load_params` (format detection, dtype policy, strict shape check, sharded reads
with a `mesh`), `read_params`, `infer_config`; the formats' readers are its sibling modules.

Paths inside the tree are '/'-joined (`encoder/layers_0/attention/query/kernel`).
"""
from __future__ import annotations

import ctypes
import functools
import math
import os
import posixpath
import re
from typing import Any, Callable, Mapping

import jax
import numpy as np

from t5align.checkpoints import hf
from t5align.checkpoints import mesh_tf
from t5align.checkpoints import store
from t5align.checkpoints import t5x
from t5align import network
from t5align.runtime import fileio
from t5align.runtime import validate


FORMATS = ('t5x', 't5x_orbax', 'hf', 'mesh_tf')
DEFAULT_SOURCE_DTYPES = ('float32', 'bfloat16', 'float16')  # Stored dtypes cast without asking.


# Detection and loading.


def detect_format(path: str) -> str:
  """One of `FORMATS` for a checkpoint path, from the files it holds."""
  path = os.fspath(path).rstrip('/')
  store.check_utf8_path(path, 'checkpoint path')
  if store.is_gcs(path):
    if posixpath.basename(path) == 'checkpoint' or store.exists(fileio.join(path, 'checkpoint')):
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
  if os.path.exists(os.path.join(t5x.orbax_state_dir(path), '_METADATA')):
    return 't5x_orbax'
  if os.path.exists(os.path.join(path, 'config.json')):
    return 'hf'
  raise ValueError(f'Cannot tell the checkpoint format of {path}: no T5X `checkpoint`, Orbax '
                   '`state/`, HF `config.json` or TF `.index` file.')


_READERS = {'t5x': t5x.read_t5x_checkpoint, 't5x_orbax': t5x.read_t5x_orbax_checkpoint,
            'hf': hf.read_hf_checkpoint, 'mesh_tf': mesh_tf.read_mesh_tf_checkpoint}


def read_params(path: str, *, format: str = 'auto') -> store.Params:  # pylint: disable=redefined-builtin
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
  for stack in ('encoder', 'decoder'):  # An encoder-only checkpoint has no decoder layers.
    if not count_layers(stack):
      raise ValueError(f'Cannot infer the T5 config: no {stack}/layers_N parameters (t5align '
                       'runs encoder-decoder T5).')
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
  got = {k: tuple(np.shape(v)) for k, v in store.flatten_params(params).items()}
  want = {k: tuple(v.shape) for k, v in store.flatten_params(expected).items()}
  mismatched = {k: (got[k], want[k]) for k in got.keys() & want.keys() if got[k] != want[k]}
  if mismatched or got.keys() != want.keys():
    raise store.CheckpointMismatchError(want.keys() - got.keys(), got.keys() - want.keys(),
                                        mismatched, source)


def _check_source_dtypes(dtypes: Mapping[str, Any], source_dtypes: tuple[str, ...],
                         source: str = '') -> None:
  """Raises one `CheckpointDtypeError` naming the checkpoint `source` (when given) and listing
  every `{path: stored dtype}` not allowed."""
  bad = {k: np.dtype(d).name for k, d in dtypes.items() if np.dtype(d).name not in source_dtypes}
  if bad:
    lines = '\n'.join(f'  {k}: {d}' for k, d in sorted(bad.items()))
    where = f'Checkpoint {source} stores' if source else 'Stored'
    raise store.CheckpointDtypeError(
        f'{where} parameters in dtypes other than {", ".join(source_dtypes)}:\n{lines}\n'
        'Convert it to one of those (an integer array holds quantized or corrupt weights); '
        'callers of checkpoints.load_params or cast_params may allow a cast with source_dtypes=.')


def cast_params(params: Mapping[str, Any], dtype: Any = np.float32, *,
                source_dtypes: tuple[str, ...] = DEFAULT_SOURCE_DTYPES,
                source: str = '') -> store.Params:
  """Casts every array to `dtype`, refusing stored dtypes not named in `source_dtypes`
  (`source`: the checkpoint, for the message).

  Raises:
    CheckpointDtypeError: listing every parameter whose stored dtype is not allowed.
  """
  flat = store.flatten_params(params)
  _check_source_dtypes({k: np.asarray(v).dtype for k, v in flat.items()}, source_dtypes,
                       source)
  dtype = np.dtype(dtype)
  return store.unflatten_params({k: np.ascontiguousarray(np.asarray(v).astype(dtype, copy=False))
                           for k, v in flat.items()})


@functools.lru_cache(maxsize=16)
def _param_shapes(config: network.T5Config) -> store.Params:
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
                ) -> tuple[store.Params, network.T5Config]:
  """Reads a checkpoint of any supported format, checks it strictly and casts it.

  With `mesh`, the parameters come back as `jax.Array`s placed with
  `partitioning.param_shardings(config, mesh, rules)`, and T5X checkpoints are read sharded: each
  process reads only the slices its own devices hold (legacy and Orbax zarr arrays through
  tensorstore slices, one array at a time; inline msgpack arrays sliced in host memory), each
  slice cast to `dtype` as it is read, so no process ever holds a whole float32 copy of the
  model, only its shards plus one stored chunk. Without `mesh`, T5X arrays are read whole, one
  at a time. HuggingFace and Mesh-TF checkpoints are read whole on every host, cast, then placed.
  For T5X, the strict checks run on the stored shapes and dtypes before any array is read, and
  a checkpoint whose declared arrays exceed the host's available memory is refused then
  (`memory.check_host_fits`), naming it and its largest arrays.

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
  store.check_utf8_path(os.fspath(path), 'checkpoint path')
  format = detect_format(path) if format == 'auto' else format
  if format in ('t5x', 't5x_orbax'):
    params, config, nonfinite = _load_sharded(str(path), format, config, dtype, source_dtypes,
                                              mesh, rules)
    if check_finite:  # Counted slice by slice as read: no second pass over the arrays.
      validate.finite_params(params, str(path), counts=nonfinite)
      check_finite = False
  else:
    params = read_params(path, format=format)
    try:
      hints = hf.hf_config_hints(hf.read_hf_config(str(path))) if format == 'hf' else {}
    except store.CheckpointReadError:
      raise
    except ValueError as e:
      raise ValueError(f'{os.path.join(str(path), "config.json")}: {e}') from e
    config = _checked_config(params, config, str(path), hints)
    params = cast_params(params, dtype, source_dtypes=source_dtypes, source=str(path))
    if check_finite:
      validate.finite_params(params, str(path))
      check_finite = False
    if mesh is not None:
      from t5align import partitioning  # pylint: disable=g-import-not-at-top
      params = jax.device_put(params, partitioning.param_shardings(config, mesh, rules))
  if check_finite:
    validate.finite_params(params, str(path))
  return params, config


# Sharded T5X loading.


def _whole_array(lazy: t5x.LazyArray, dtype: Any) -> tuple[np.ndarray, int]:
  """`lazy` read whole and cast, and its number of NaN / inf values."""
  data = np.ascontiguousarray(
      lazy.read(tuple(slice(0, n) for n in lazy.shape)).astype(dtype, copy=False))
  return data, validate.nonfinite_count(data)


def _local_bytes(lazy: t5x.LazyArray, sharding: jax.sharding.Sharding | None, dtype: Any) -> int:
  """Bytes this process holds of `lazy` cast to `dtype`: its distinct local shards (all of it
  without a sharding)."""
  if sharding is None:
    return math.prod(lazy.shape) * np.dtype(dtype).itemsize
  slices = {tuple(s.indices(n)[:2] for s, n in zip(index, lazy.shape))
            for index in sharding.addressable_devices_indices_map(lazy.shape).values()}
  return sum(math.prod(b - a for a, b in box) for box in slices) * np.dtype(dtype).itemsize


def _sharded_array(lazy: t5x.LazyArray, sharding: jax.sharding.Sharding,
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
                  source_dtypes: tuple[str, ...], mesh: jax.sharding.Mesh | None,
                  rules: Any) -> tuple[store.Params, network.T5Config, dict[str, int]]:
  """`load_params` for T5X legacy and Orbax checkpoints: sharded over `mesh`, or whole (numpy)
  without one.

  Arrays are read one at a time, those with the largest stored chunks first, and the freed read
  buffers handed back to the OS after each: at any moment a process holds the shards it has
  read so far plus one array's read (a decoded chunk and its compressed bytes), and the biggest
  reads happen while it holds the fewest shards.
  """
  from t5align import memory  # pylint: disable=g-import-not-at-top
  from t5align import partitioning  # pylint: disable=g-import-not-at-top
  if format == 't5x':
    stored = t5x.lazy_t5x_arrays(path)
  else:
    state_dir, _, item = t5x.orbax_params_metadata(path)
    stored = t5x.lazy_orbax_arrays(state_dir, item)
  dtype = np.dtype(dtype)
  # At least this process's share (all of it without a mesh, else as if spread evenly over the
  # devices): checked first, as a corrupt shape can be too large even to infer a config from.
  share = 1.0 if mesh is None else jax.local_device_count() / jax.device_count()
  memory.check_host_fits({k: (int(math.prod(v.shape) * dtype.itemsize * share), v.shape)
                          for k, v in stored.items()}, f'checkpoint {path}', dtype)
  config = _checked_config(store.unflatten_params(stored), config, path, {})
  _check_source_dtypes({k: v.dtype for k, v in stored.items()}, source_dtypes, path)
  shardings = (store.flatten_params(partitioning.param_shardings(config, mesh, rules))
               if mesh is not None else dict.fromkeys(stored))
  memory.check_host_fits({k: (_local_bytes(v, shardings[k], dtype), v.shape)
                          for k, v in stored.items()}, f'checkpoint {path}', dtype)
  arrays, nonfinite = {}, {}
  for name in sorted(stored, key=lambda k: -stored[k].chunk_bytes):
    if mesh is None:
      arrays[name], nonfinite[name] = _whole_array(stored[name], dtype)
    else:
      arrays[name], nonfinite[name] = _sharded_array(stored[name], shardings[name], dtype)
    _release_free_heap()
  if mesh is not None and jax.process_count() > 1:  # Each process counted its own slices.
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    names = sorted(nonfinite)
    everyone = multihost_utils.process_allgather(np.array([nonfinite[k] for k in names]))
    nonfinite = dict(zip(names, np.asarray(everyone).reshape(-1, len(names)).max(0).tolist()))
  return store.unflatten_params({k: arrays[k] for k in stored}), config, nonfinite


def embedding_rows(path: str, format: str = 'auto') -> int:  # pylint: disable=redefined-builtin
  """The rows of a checkpoint's token embedding (the ids its model embeds), from stored
  metadata where the format has it (T5X, Orbax: array metadata; HuggingFace: config.json's
  vocab_size); Mesh-TF checkpoints are read."""
  store.check_utf8_path(os.fspath(path), 'checkpoint path')
  format = detect_format(path) if format == 'auto' else format
  if format == 't5x':
    return int(t5x.lazy_t5x_arrays(str(path))['token_embedder/embedding'].shape[0])
  if format == 't5x_orbax':
    _, _, item = t5x.orbax_params_metadata(str(path))
    return int(store.flatten_params(item)['token_embedder/embedding'].shape[0])
  if format == 'hf':
    rows = hf.read_hf_config(str(path)).get('vocab_size')
    if isinstance(rows, int) and not isinstance(rows, bool) and rows > 0:
      return rows
  return int(np.shape(read_params(path, format=format)['token_embedder']['embedding'])[0])
