"""Cloud TPU chips and slice names: per-chip HBM, peak bf16 FLOP/s and HBM bandwidth, and the
topology of a TPU type name, for `t5align.preflight`.

Per-chip figures, from Google's Cloud TPU system-architecture pages (the key-specifications
table of each; read 2026-11-25):
  v4   cloud.google.com/tpu/docs/v4    275 TFLOP/s bf16, HBM2 32 GiB, 1200 GB/s
  v5e  cloud.google.com/tpu/docs/v5e   197 TFLOP/s bf16, HBM2 16 GB, 819 GB/s
  v5p  cloud.google.com/tpu/docs/v5p   459 TFLOP/s bf16, HBM2e 95 GB, 2765 GB/s
  v6e  cloud.google.com/tpu/docs/v6e   918 TFLOP/s bf16, HBM 32 GB, 1638 GB/s
HBM capacities are taken as GiB (the v4 page says GiB; the stacks are binary-sized; the others'
"GB" is read the same way), bandwidths as decimal GB/s. What a program may use is a little less:
XLA's TPU compiler refused programs above 30.75 GiB (v4), 15.75 GiB (v5e), 95.74 GiB (v5p) and
31.25 GiB (v6e) per chip, the "available HBM" its out-of-memory error named when a 512 GiB
program was compiled for each (libtpu 0.0.42.1 with jax 0.10.2); `t5align.preflight` checks
against these.

TPU type names (`--topology=v4-32`) map to the default slice shape of that size:
  v4-N, v5p-N    N TensorCores, 2 per chip (one JAX device per chip: megacore), 3-D shapes
                 4 chips 2x2x1, 8 2x2x2, 16 2x2x4, 32 2x4x4, 64 4x4x4, 128 4x4x8, 256 4x8x8,
                 512 8x8x8, 1024 8x8x16, 2048 8x16x16, 4096 16x16x16
  v5litepod-N, v5e-N, v6e-N
                 N chips, 2-D shapes 1 1x1, 4 2x2, 8 2x4, 16 4x4, 32 4x8, 64 8x8, 128 8x16,
                 256 16x16
so v4-32 is 'v4:2x2x4' (16 chips), v5litepod-16 'v5e:4x4', v5p-8 'v5p:2x2x1' (4 chips) and
v6e-16 'v6e:4x4'. A topology name ('v5e:4x4', 'v4:2x2x4') is taken as it is.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU chip generation (per-chip figures; see the module docstring for their sources)."""

  generation: str  # 'v4', 'v5e', 'v5p', 'v6e': the prefix of its topology names.
  hbm_bytes: int
  peak_bf16_flops: float  # FLOP/s
  hbm_bytes_per_s: float
  megacore: bool  # Two TensorCores per chip driven as one device.
  usable_hbm_bytes: int  # what XLA's TPU compiler lets a program use (module docstring)
  source: str


CHIPS = {
    'v4': Chip('v4', 32 * GiB, 275e12, 1200e9, True, int(30.75 * GiB),
               'cloud.google.com/tpu/docs/v4'),
    'v5e': Chip('v5e', 16 * GiB, 197e12, 819e9, False, int(15.75 * GiB),
                'cloud.google.com/tpu/docs/v5e'),
    'v5p': Chip('v5p', 95 * GiB, 459e12, 2765e9, True, int(95.74 * GiB),
                'cloud.google.com/tpu/docs/v5p'),
    'v6e': Chip('v6e', 32 * GiB, 918e12, 1638e9, False, int(31.25 * GiB),
                'cloud.google.com/tpu/docs/v6e'),
}
# Type-name prefixes (before '-N') and their generation.
TYPE_PREFIXES = {'v4': 'v4', 'v5p': 'v5p', 'v5litepod': 'v5e', 'v5e': 'v5e', 'v6e': 'v6e'}
SHAPES_3D = {4: '2x2x1', 8: '2x2x2', 16: '2x2x4', 32: '2x4x4', 64: '4x4x4', 128: '4x4x8',
             256: '4x8x8', 512: '8x8x8', 1024: '8x8x16', 2048: '8x16x16', 4096: '16x16x16'}
SHAPES_2D = {1: '1x1', 4: '2x2', 8: '2x4', 16: '4x4', 32: '4x8', 64: '8x8', 128: '8x16',
             256: '16x16'}
# 2-D slices served by one host (one VM with 1 or 8 chips); larger ones have 4 chips per host.
_SINGLE_HOST_2D = {'1x1': (1, 1, 1), '2x4': (2, 4, 1)}

_TYPE = re.compile(r'^(v4|v5p|v5litepod|v5e|v6e)-(\d+)$')
_TOPOLOGY = re.compile(r'^(v4|v5p|v5e|v6e):(\d+(?:x\d+){1,2})$')


@dataclasses.dataclass(frozen=True)
class Target:
  """A TPU slice to compile for: its topology name, chip and chip count."""

  topology: str  # e.g. 'v5e:4x4'
  chip: Chip
  num_chips: int
  type_name: str | None = None  # e.g. 'v5litepod-16', when given as one

  def topology_kwargs(self) -> dict[str, Any]:
    """Keyword arguments of `jax.experimental.topologies.get_topology_desc` for this slice."""
    kwargs: dict[str, Any] = {'topology_name': self.topology, 'platform': 'tpu'}
    if self.chip.megacore:
      kwargs['chip_config_name'] = 'megacore'
    bounds = _SINGLE_HOST_2D.get(self.topology.split(':')[1])
    if bounds is not None:
      kwargs['chips_per_host_bounds'] = bounds
    return kwargs


def parse_target(name: str) -> Target:
  """A `Target` from a topology name ('v5e:4x4') or a TPU type name ('v5litepod-16', 'v4-32').

  Raises:
    ValueError: naming the value and the accepted forms.
  """
  text = str(name).strip()
  match = _TOPOLOGY.match(text)
  if match:
    generation, shape = match.groups()
    dims = shape.split('x')
    if len(dims) != (3 if generation in ('v4', 'v5p') else 2):
      raise ValueError(f'--topology={name}: {generation} slices are '
                       f'{"3-D (AxBxC)" if generation in ("v4", "v5p") else "2-D (AxB)"}.')
    return Target(text, CHIPS[generation], math.prod(int(d) for d in dims))
  match = _TYPE.match(text)
  if match:
    prefix, count = match.group(1), int(match.group(2))
    generation = TYPE_PREFIXES[prefix]
    chip = CHIPS[generation]
    chips = count // 2 if chip.megacore else count
    shapes = SHAPES_3D if generation in ('v4', 'v5p') else SHAPES_2D
    if (chip.megacore and count % 2) or chips not in shapes:
      sizes = sorted(c * 2 for c in shapes) if chip.megacore else sorted(shapes)
      raise ValueError(f'--topology={name}: no default {generation} slice of that size; '
                       f'{prefix}-N takes N in {sizes}, or give a topology such as '
                       f'{generation}:{shapes[sizes[1] // (2 if chip.megacore else 1)]}.')
    return Target(f'{generation}:{shapes[chips]}', chip, chips, type_name=text)
  raise ValueError(
      f'--topology={name!r}: expected a topology such as v5e:4x4, v4:2x2x4, v5p:2x2x1, v6e:4x4 '
      f'or a TPU type name such as v5litepod-16, v4-32, v5p-8, v6e-16.')


def slice_examples(target: Target) -> str:
  """The default slice shapes of `target`'s TPU generation, in words (for an error message)."""
  generation = target.chip.generation
  shapes = SHAPES_3D if generation in ('v4', 'v5p') else SHAPES_2D
  return (f'{generation} slices include ' + ', '.join(f'{generation}:{s}'
                                                     for s in list(shapes.values())[:6]) + ', ...')


def libtpu_without_tpus(accelerator_type: str | None = None) -> None:
  """Environment for an installed libtpu on a machine without TPU chips (a no-op with chips).

  Sets, where unset:
    TPU_WORKER_HOSTNAMES=localhost and TPU_ACCELERATOR_TYPE (`accelerator_type`, default
      'v5litepod-4'): without a TPU VM's metadata libtpu otherwise logs, on every process that
      loads it (jax probes the TPU backend when JAX_PLATFORMS is unset; compiling for a
      topology loads it), that it cannot find them; jax then falls back to the CPU quietly.
    ALLOW_MULTIPLE_LIBTPU_LOAD=1: libtpu otherwise lets one process at a time load it (a lock
      file guards the chips), so a second compile-only process, e.g. a test's subprocess,
      would fail.
  Compiles for a topology do not depend on these values (the same memory and cost figures with
  either accelerator type). Call before jax starts a backend.
  """
  try:
    from jax._src import hardware_utils  # pylint: disable=g-import-not-at-top
    chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
  except (ImportError, AttributeError, OSError):
    return
  if chips:
    return
  os.environ.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')
  os.environ.setdefault('TPU_ACCELERATOR_TYPE', accelerator_type or 'v5litepod-4')
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
