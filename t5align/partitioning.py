"""Device meshes, t5x's logical axis rules and jit partitioning: the one place for sharding.

Meshes (Auto axis types, laid out by `jax.make_mesh` for the platform's topology):
  evaluation   ('data', 'model')         batch over 'data', parameters over 'model'
  calibration  ('tau', 'data', 'model')  candidate temperatures over 'tau' as well

Logical axis names come from the model's `params_axes` collection and the activation constraints
in layers.py; `standard_logical_axis_rules` maps them to mesh axes exactly as t5x's PjitPartitioner
does (1-D or 2-D parameter / activation partitioning). `partition(fn, mesh)` jits `fn` and runs
it under `jax.set_mesh(mesh)` and flax's `axis_rules`, so those constraints take effect.

Meshes are built over `all_devices()`: jax's, or inside `target_devices(...)` another set, e.g. the
compile-only devices of a TPU topology (`t5align.preflight` compiles the real programs for a pod
from a machine without one, through the same mesh builders).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import numpy as np
from flax.linen import partitioning as nn_partitioning
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from t5align.attention import dispatch
from t5align import network

EVAL_AXES = ('data', 'model')
CALIBRATION_AXES = ('tau', 'data', 'model')
LogicalRules = dispatch.LogicalRules

_TARGET_DEVICES: contextvars.ContextVar[tuple[Any, ...] | None] = contextvars.ContextVar(
    't5align_target_devices', default=None)


@contextlib.contextmanager
def target_devices(target: Sequence[Any]) -> Iterator[None]:
  """Within the block, `all_devices()` and `process_count()` describe `target` instead of jax's
  devices, so `eval_mesh`, `calibration_mesh` and `make_mesh` lay meshes out over it exactly as
  they would over a real run's devices (`jax.make_mesh` orders a TPU topology's devices for
  its interconnect)."""
  token = _TARGET_DEVICES.set(tuple(target))
  try:
    yield
  finally:
    _TARGET_DEVICES.reset(token)


def all_devices() -> list[Any]:
  """The devices meshes are built over: `jax.devices()`, or those of `target_devices`."""
  target = _TARGET_DEVICES.get()
  return list(jax.devices()) if target is None else list(target)


def process_count() -> int:
  """`jax.process_count()`, or the number of hosts holding the `target_devices`."""
  target = _TARGET_DEVICES.get()
  return jax.process_count() if target is None else len({d.process_index for d in target})


def standard_logical_axis_rules(activation_partitioning_dims: int = 1,
                                parameter_partitioning_dims: int = 1) -> tuple:
  """t5x's standard rules (t5x/partitioning.py) for a ('data', 'model') mesh.

  Args:
    activation_partitioning_dims: 1 shards activations' 'batch' over 'data'; 2 also shards their
      'embed' over 'model'.
    parameter_partitioning_dims: 1 shards parameters over 'model' only; 2 also shards their
      'embed' axis over 'data' (2-D, fully sharded parameters).

  Returns:
    ((logical name, mesh axis or None), ...) in priority order.
  """
  if (activation_partitioning_dims, parameter_partitioning_dims) not in (
      (1, 1), (1, 2), (2, 1), (2, 2)):
    raise ValueError(f'activation_partitioning_dims={activation_partitioning_dims} and '
                     f'parameter_partitioning_dims={parameter_partitioning_dims}: each must be '
                     '1 or 2.')
  rules = [('batch', 'data'), ('vocab', 'model'), ('mlp', 'model'), ('heads', 'model'),
           ('kv', None), ('joined_kv', 'model')]
  if activation_partitioning_dims == 2:
    rules.append(('embed', 'model'))
  if parameter_partitioning_dims == 2:
    rules.append(('embed', 'data'))
  if (activation_partitioning_dims, parameter_partitioning_dims) == (1, 1):
    rules.append(('embed', None))
  rules += [('relpos_buckets', None), ('abspos_buckets', None), ('length', None),
            ('layers', None), ('stack', None), ('mlp_activations', None)]
  return tuple(rules)


def make_mesh(shape: Mapping[str, int], devices: Sequence[Any] | None = None) -> Mesh:
  """A mesh with the given named axis sizes over `devices` (`all_devices()` by default).

  The product of the sizes must equal the number of devices. `jax.make_mesh` orders all the
  devices for the platform's interconnect (TPU topologies); a given device list is used in its
  order. An axis no product of the slice's physical axes makes (e.g. 'model' = 8 on a 4x4 v6e
  slice, which `jax.make_mesh` refuses outside v5e) is laid out with physical axes split
  (`mesh_utils.create_device_mesh(allow_split_physical_axes=True)`).
  """
  names, sizes = tuple(shape), tuple(int(s) for s in shape.values())
  if any(s < 1 for s in sizes):
    raise ValueError(f'mesh axis sizes must be >= 1: {dict(shape)}.')
  count = len(all_devices()) if devices is None else len(devices)
  if int(np.prod(sizes)) != count:
    raise ValueError(f'mesh {dict(shape)} needs {int(np.prod(sizes))} devices; there are '
                     f'{count}. Change NUM_PARTITIONS (the \'model\' axis) or the mesh shape.')
  types = (AxisType.Auto,) * len(names)
  if devices is None:
    try:
      return jax.make_mesh(sizes, names, axis_types=types, devices=all_devices())
    except NotImplementedError:  # No assignment without splitting a physical axis.
      return Mesh(mesh_utils.create_device_mesh(sizes, all_devices(),
                                                allow_split_physical_axes=True),
                  names, axis_types=types)
  return Mesh(np.asarray(devices).reshape(sizes), names, axis_types=types)


def eval_mesh(num_partitions: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
  """('data', 'model') over all devices, `num_partitions` of them along 'model'."""
  count = len(all_devices()) if devices is None else len(devices)
  if num_partitions < 1 or count % num_partitions:
    raise ValueError(f'num_partitions={num_partitions} must divide the {count} devices.')
  return make_mesh({'data': count // num_partitions, 'model': num_partitions}, devices)


def calibration_mesh(tau: int = 1, data: int = 1, model: int = 1,
                     devices: Sequence[Any] | None = None) -> Mesh:
  """('tau', 'data', 'model'); `devices` default to the first tau * data * model devices."""
  need = tau * data * model
  every = all_devices()
  if devices is None and process_count() > 1 and need != len(every):
    raise ValueError(f'mesh tau={tau} x data={data} x model={model} uses {need} devices; with '
                     f'{process_count()} processes it must use all {len(every)}.')
  if devices is None and need != len(every):
    devices = every
    if need > len(devices):
      raise ValueError(f'mesh tau={tau} x data={data} x model={model} needs {need} devices; '
                       f'{len(devices)} available.')
    devices = devices[:need]
  return make_mesh({'tau': tau, 'data': data, 'model': model}, devices)


def logical_param_axes(config: network.T5Config) -> Any:
  """The `params` tree's logical axis names (tuples of str), from `params_axes`, no allocation."""
  variables = jax.eval_shape(lambda: network.init_variables(config, jax.random.PRNGKey(0)))

  def names(node):
    return {k[:-len('_axes')] if k.endswith('_axes') else k:
            (v.names if hasattr(v, 'names') else names(v)) for k, v in node.items()}

  return names(variables['params_axes'])


@functools.lru_cache(maxsize=64)
def param_shardings(config: network.T5Config, mesh: Mesh,
                    rules: LogicalRules | None = None) -> Any:
  """NamedShardings for the model's `params` tree (the T5X layout) on `mesh` (cached)."""
  rules = standard_logical_axis_rules() if rules is None else tuple(rules)
  names = logical_param_axes(config)
  shapes = network.param_shapes(config)
  return jax.tree.map(lambda n, s: NamedSharding(mesh, dispatch.spec_for(n, s.shape, mesh, rules)),
                      names, shapes, is_leaf=lambda x: isinstance(x, tuple))


def place_params(params: Any, config: network.T5Config, mesh: Mesh | None,
                 rules: LogicalRules | None = None) -> Any:
  """Puts a `params` tree (or a subtree of the T5X layout, e.g. encoder only) on `mesh`.

  Each array is sharded by its logical axes (`param_shardings`). Host arrays become global
  `jax.Array`s through `global_array`, so every process may hold the same numpy tree; arrays
  already placed with that sharding are not copied. `mesh=None`: the default device.
  """
  if mesh is None:
    return jax.device_put(params)
  full = param_shardings(config, mesh, rules)

  def place(path, x):
    node = full
    for key in path:
      node = node[key.key]
    return global_array(x, node)

  return jax.tree_util.tree_map_with_path(place, params)


def global_array(x: Any, sharding: NamedSharding) -> jax.Array:
  """A global `jax.Array` of `x` (the whole value, the same on every process) with `sharding`.

  Each process copies only the slices its own devices hold, so this works with several
  processes, where `jax.device_put` of host data to non-addressable devices does not.
  """
  if isinstance(x, jax.Array) and (x.sharding == sharding or not x.is_fully_addressable or
                                   jax.process_count() == 1):
    return jax.device_put(x, sharding)  # No copy when the sharding is already `sharding`.
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Axis 0 over 'data' (if the mesh has it), the rest replicated."""
  return NamedSharding(mesh, P('data' if 'data' in mesh.shape else None, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def partition(fn: Callable, mesh: Mesh, rules: LogicalRules | None = None,
              **jit_kwargs: Any) -> Callable:
  """`jax.jit(fn, **jit_kwargs)` run under `mesh` and the logical axis `rules`.

  Tracing happens inside the contexts, so flax's `with_sharding_constraint` calls in layers.py
  resolve their logical names to `mesh` axes. The returned function also has `.lower(...)`.
  """
  rules = standard_logical_axis_rules() if rules is None else tuple(rules)
  jitted = jax.jit(fn, **jit_kwargs)

  @functools.wraps(fn)
  def call(*args, **kwargs):
    with jax.set_mesh(mesh), nn_partitioning.axis_rules(rules):
      return jitted(*args, **kwargs)

  def lower(*args, **kwargs):
    with jax.set_mesh(mesh), nn_partitioning.axis_rules(rules):
      return jitted.lower(*args, **kwargs)

  call.lower = lower
  return call
