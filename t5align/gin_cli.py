"""t5x-style command lines: --gin_file, --gin_search_paths, --gin_bindings and --gin.NAME=VALUE."""
from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
from typing import Sequence

import gin

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def binding(name: str, value: str) -> str:
  """`NAME = VALUE`, with VALUE quoted as a string unless it already is a gin literal.

  So `--gin.CHECKPOINT_PATH=/tmp/ckpt` needs no extra quotes, while `--gin.TEMPERATURE=0.8`,
  `--gin.X=(0.9, 0.8)` and `--gin.MODEL=@network.Transformer()` keep their gin meaning.
  """
  try:
    gin.config.parse_value(value)
  except Exception:  # pylint: disable=broad-except  (gin raises several types on bad literals)
    value = repr(value)
  return f'{name} = {value}'


def parse_flags(argv: Sequence[str], *, prog: str, description: str | None = None,
                example_file: str | None = None) -> tuple[list[str], list[str], list[str]]:
  """Parses t5x-style flags.

  Args:
    argv: the arguments (without the program name).
    prog: program name for usage and errors, e.g. 'python -m t5align.eval'.
    description: --help text.
    example_file: if given, at least one --gin_file is required and this is suggested.

  Returns:
    (gin files, bindings, search paths); the current directory and the repository root are always
    search paths (after the given ones), so gin/... includes resolve from anywhere in the checkout.
  """
  parser = argparse.ArgumentParser(prog=prog, description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--gin_file', action='append', default=[], help='gin file (repeatable)')
  parser.add_argument('--gin_bindings', action='append', default=[],
                      help='a gin binding, e.g. "TEMPERATURE = 0.8" (repeatable)')
  parser.add_argument('--gin_search_paths', action='append', default=[],
                      help='comma-separated folders to look for gin files in')
  args, rest = parser.parse_known_args(argv)
  bindings = list(args.gin_bindings)
  for arg in rest:
    if not arg.startswith('--gin.') or '=' not in arg:
      parser.error(f'unrecognized argument {arg!r} (macros are set with --gin.NAME=VALUE)')
    name, value = arg[len('--gin.'):].split('=', 1)
    bindings.append(binding(name, value))
  if example_file and not args.gin_file:
    parser.error(f'at least one --gin_file is needed (e.g. {example_file})')
  paths = [p for group in args.gin_search_paths for p in group.split(',') if p]
  return args.gin_file, bindings, paths + [os.getcwd(), REPO_ROOT]


_MACRO_BINDING = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=')


def defined_macros() -> set[str]:
  """Names of the macros gin's current configuration defines."""
  config = gin.config._CONFIG  # pylint: disable=protected-access  (gin has no public listing)
  return {scope for scope, selector in config if selector == 'gin.macro'}


def check_macros(bindings: Sequence[str], known: set[str], files: Sequence[str]) -> None:
  """Raises ValueError for a binding `NAME = ...` of a macro the config files never define.

  gin would otherwise define a new macro that nothing reads (a misspelt `--gin.SCHEDULE_PAHT`
  runs with the default). A macro referenced (`%NAME`) by another binding counts as known.
  """
  known = set(known) | {m for b in bindings for m in re.findall(r'%([A-Za-z_][A-Za-z0-9_]*)', b)}
  for line in bindings:
    match = _MACRO_BINDING.match(line)
    if match and match.group(1) not in known:
      name = match.group(1)
      close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
      hint = f' Did you mean {" or ".join(close)}?' if close else ''
      raise ValueError(
          f'--gin.{name}: no macro {name} in {", ".join(files) or "the gin files"}, so the value '
          f'would be ignored.{hint} Macros they define: {", ".join(sorted(known)) or "none"}.')


def required_macros() -> list[str]:
  """Names of the macros gin's current configuration sets to %gin.REQUIRED."""
  return sorted(name for name in defined_macros() if str(getattr(
      gin.query_parameter(f'{name}/macro.value'), 'scoped_selector', '')).startswith(
          'gin.REQUIRED'))


def configure(argv: Sequence[str], *, unset_required: bool = False, **kwargs) -> None:
  """Parses the flags (see `parse_flags`) and applies them to gin's global configuration.

  Every macro a flag sets must be one the gin files define (`check_macros`). With
  `unset_required`, macros the files mark %gin.REQUIRED and no flag sets are bound to None
  (for callers that read neither checkpoint nor data, e.g. `t5align.preflight`).
  """
  files, bindings, paths = parse_flags(argv, **kwargs)
  for path in paths:
    gin.add_config_file_search_path(path)
  gin.parse_config_files_and_bindings(files, None, finalize_config=False)
  check_macros(bindings, defined_macros(), files)
  if unset_required:
    bindings = [f'{name} = None' for name in required_macros()] + list(bindings)
  gin.parse_config_files_and_bindings([], bindings)


def require(function: str, **values) -> None:
  """Raises a ValueError naming every argument of `function` left unset (None or gin.REQUIRED)."""
  missing = [k for k, v in values.items() if v is None or v is gin.REQUIRED
             or type(v).__name__ == '_GinRequired']
  if missing:
    raise ValueError(f'{function}() needs {", ".join(missing)} (gin macros '
                     f'{", ".join(m.upper() for m in missing)}).')


def call_configured(qualified_name: str, **kwargs):
  """Calls the gin-configured function 'package.module.function' (with `kwargs`, if any).

  Dynamic registration leaves the module attribute undecorated, and under `python -m` the entry
  point's file is `__main__`, not its import name: so fetch the configurable gin holds for the
  function as imported by name.
  """
  module, name = qualified_name.rsplit('.', 1)
  return gin.get_configurable(getattr(importlib.import_module(module), name))(**kwargs)
