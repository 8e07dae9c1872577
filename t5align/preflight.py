r"""Pre-flight check: compile a run's real programs for a TPU slice without a TPU, and say whether
they fit and what they cost, before renting the pod (docs/pods.md).

    python -m t5align.preflight --gin_file=gin/runs/eval.gin \
      --gin_file=gin/models/flan_t5/xxl.gin --gin.PARAMS_DTYPE=bfloat16 \
      --gin.NUM_PARTITIONS=8 --gin.BATCH_SIZE=2 --topology=v5litepod-16 --length=32768

The gin files and flags are `t5align.eval`'s, `t5align.calibrate`'s or `t5align.train`'s (the
train step, as MaxText's train_compile compiles it), plus a gin/models file for the shapes
(nothing is read but the gin files). Exit status: 0 when the programs fit every chip's
HBM, 3 when they do not (the message names the settings to change), 2 for bad flags.
"""
from __future__ import annotations

import sys
from typing import Any, Sequence

from t5align.jobs import preflight as preflight_lib
from t5align.runtime import tpu_chips


def flag_parser() -> Any:
  """The CLI's own flags (an `argparse.ArgumentParser`); the others go to gin (`gin_cli`)."""
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(
      prog='python -m t5align.preflight', description=__doc__,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--topology', required=True,
                      help="TPU slice: 'v5e:4x4', 'v4:2x2x4', ... or 'v5litepod-16', 'v4-32', ...")
  parser.add_argument('--length', type=int, help='encoder input tokens (calibration: default '
                      'the longest of LENGTHS; training: L_TR)')
  parser.add_argument('--program', choices=preflight_lib.PROGRAMS,
                      help='default: the one the gin files configure')
  parser.add_argument('--json_output', help='also write the report as JSON there (atomically; '
                      'a mixture of several programs: {"programs": [one report each]})')
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """The CLI (module docstring); returns the exit status."""
  parser = flag_parser()
  args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
  try:
    target = tpu_chips.parse_target(args.topology)
  except ValueError as e:
    parser.error(str(e))
  preflight_lib.compile_only_environment(target)  # Before anything starts a JAX backend.
  if preflight_lib.libtpu_available():  # Without it, `check` says what to install.
    import jax  # pylint: disable=g-import-not-at-top
    try:
      preflight_lib.compile_only_devices(target)
    except jax.errors.JaxRuntimeError as e:  # A shape libtpu has no slice of.
      parser.error(f'--topology={args.topology}: libtpu has no such slice '
                   f'({str(e).splitlines()[0]}); {tpu_chips.slice_examples(target)}')
  from t5align import gin_cli  # pylint: disable=g-import-not-at-top
  from t5align.runtime import fileio  # pylint: disable=g-import-not-at-top
  gin_cli.configure(rest, prog='python -m t5align.preflight', unset_required=True,
                    example_file='gin/runs/eval.gin (or gin/calibrate.gin, or '
                    'gin/runs/train_retrieval.gin) plus a gin/models file')
  try:
    case = preflight_lib.case_from_gin(target, args.length, args.program)
    built = preflight_lib.programs(case)  # A task outside t5align's catalog is refused here.
  except ValueError as e:
    parser.error(str(e))
  reports = []
  for program, mesh in built:
    reports.append(preflight_lib.check_program(case, program, mesh))
    print(reports[-1].summary())
  if args.json_output:
    fileio.write_json_atomic(args.json_output, reports[0].to_json() if len(reports) == 1 else
                             {'programs': [r.to_json() for r in reports]})
  return 0 if all(r.fits for r in reports) else preflight_lib.DOES_NOT_FIT


if __name__ == '__main__':
  sys.exit(main())
