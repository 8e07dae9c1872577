"""t5x-style command lines: --gin_file, --gin_search_paths, --gin_bindings and --gin.NAME=VALUE."""
from __future__ import annotations

import argparse
import difflib
import importlib
import logging as std_logging
import os
import sys
import re
import signal
import threading
import warnings
from typing import Any, Sequence

from absl import flags
from absl import logging
import gin

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log_plainly() -> None:
  """For a command line: t5align's and seqio_tasks' own log records (absl, as t5x) at INFO and
  above, other libraries' at WARNING and above, on stderr as bare messages, the form they had
  when the library printed them."""
  flags.FLAGS.mark_as_parsed()  # No absl flags here; absl would warn that none were parsed.
  logging.use_absl_handler()
  handler = logging.get_absl_handler()
  # The stderr of now: absl's handler keeps the stream it was made with (at import), which a
  # caller that redirected sys.stderr since (a test capturing it, a notebook) would not see.
  handler.python_handler.setStream(sys.stderr)
  handler.setFormatter(std_logging.Formatter('%(message)s'))
  ours = tuple(os.path.join(REPO_ROOT, p) + os.sep for p in ('t5align', 'seqio_tasks'))
  handler.addFilter(lambda record: record.levelno >= std_logging.WARNING
                    or record.pathname.startswith(ours))
  logging.set_verbosity(logging.INFO)


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
    The bindings are the --gin_bindings, then the --gin.NAME=VALUE flags as `NAME = VALUE`.
  """
  files, raw, flags, paths = _parse(argv, prog=prog, description=description,
                                    example_file=example_file)
  return files, raw + [b for _, b in flags], paths


def _parse(argv: Sequence[str], *, prog: str, description: str | None = None,
           example_file: str | None = None
           ) -> tuple[list[str], list[str], list[tuple[str, str]], list[str]]:
  """`parse_flags`, the --gin_bindings and the (flag as given, binding) of each --gin.NAME flag
  kept apart."""
  parser = argparse.ArgumentParser(prog=prog, description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--gin_file', action='append', default=[], help='gin file (repeatable)')
  parser.add_argument('--gin_bindings', action='append', default=[],
                      help='a gin binding, e.g. "TEMPERATURE = 0.8" (repeatable)')
  parser.add_argument('--gin_search_paths', action='append', default=[],
                      help='comma-separated folders to look for gin files in')
  args, rest = parser.parse_known_args(argv)
  flags = []
  for arg in rest:
    if not arg.startswith('--gin.') or '=' not in arg:
      parser.error(f'unrecognized argument {arg!r} (macros are set with --gin.NAME=VALUE)')
    name, value = arg[len('--gin.'):].split('=', 1)
    flags.append((arg, binding(name, value)))
  if example_file and not args.gin_file:
    parser.error(f'at least one --gin_file is needed (e.g. {example_file})')
  paths = [p for group in args.gin_search_paths for p in group.split(',') if p]
  return args.gin_file, list(args.gin_bindings), flags, paths + [os.getcwd(), REPO_ROOT]


_MACRO_BINDING = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=')


def defined_macros() -> set[str]:
  """Names of the macros gin's current configuration defines."""
  return {scope for (scope, selector), _ in _config_values() if selector == 'gin.macro'}


def _referenced(bindings: Sequence[str]) -> set[str]:
  """The macros the binding lines reference (`%NAME`)."""
  return {m for b in bindings for m in re.findall(r'%([A-Za-z_][A-Za-z0-9_]*)', b)}


def check_macros(bindings: Sequence[str], known: set[str], files: Sequence[str]) -> None:
  """Raises ValueError for a binding `NAME = ...` of a macro the config files never define.

  gin would otherwise define a new macro that nothing reads (a misspelt `--gin.SCHEDULE_PAHT`
  runs with the default). A macro referenced (`%NAME`) by another binding counts as known.
  """
  known = set(known) | _referenced(bindings)
  for line in bindings:
    match = _MACRO_BINDING.match(line)
    if match and match.group(1) not in known:
      name = match.group(1)
      close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
      hint = f' Did you mean {" or ".join(close)}?' if close else ''
      raise ValueError(
          f'--gin.{name}: no macro {name} in {", ".join(files) or "the gin files"}, so the value '
          f'would be ignored.{hint} Macros they define: {", ".join(sorted(known)) or "none"}.')


def _macros_in(value: object) -> set[str]:
  """The macros `value` references (`%NAME`, also inside tuples, lists and dicts)."""
  name = _macro_name(value)
  if name:
    return {name}
  if isinstance(value, (tuple, list)):
    return set().union(*map(_macros_in, value))
  if isinstance(value, dict):
    return set().union(*map(_macros_in, value.values()))
  return set()


def check_macros_reach(bindings: Sequence[str], files: Sequence[str]) -> None:
  """Raises ValueError for a binding `NAME = ...` of a macro that the gin files define but
  neither they nor another binding reads (every parameter the files bound to %NAME rebound, in
  one file or an include): the value would be ignored. Run before the command line's bindings
  apply: one that rebinds such a parameter is `check_overrides`' (the same value twice is no
  conflict)."""
  read = set().union(*map(_macros_in, _config_values().values())) | _referenced(bindings)
  for line in bindings:
    match = _MACRO_BINDING.match(line)
    if match and match.group(1) not in read:
      name = match.group(1)
      raise ValueError(
          f'--gin.{name}: {", ".join(files) or "the gin files"} define {name}, but no binding '
          f'reads %{name}, so the value would be ignored. Bind the setting itself instead.')


def _config_values() -> dict[tuple[tuple[str, str], str], object]:
  """{((scope, selector), parameter): value} of gin's current configuration.

  The one read of gin's private `_CONFIG`: gin-config 0.5.0 has no public listing of what is bound.
  `gin.query_parameter` and `gin.get_bindings` need the names first, and `gin.config_str()` is
  a formatted dump whose layout is no documented contract.
  """
  config = gin.config._CONFIG  # pylint: disable=protected-access  (gin has no public listing)
  return {(key, name): value for key, params in config.items() for name, value in params.items()}


def _macro_name(value: object) -> str | None:
  """NAME if `value` is a reference `%NAME` to a macro, else None."""
  if isinstance(value, gin.config.ConfigurableReference) and value.configurable.name == 'macro':
    return value.scoped_selector.rsplit('/', 1)[0]
  return None


def _label(key: tuple[tuple[str, str], str]) -> str:
  (scope, selector), name = key
  return scope if selector == 'gin.macro' else f'{scope + "/" if scope else ""}{selector}.{name}'


def check_overrides(overrides: Sequence[tuple[str, str]]) -> None:
  """Applies the command line's bindings one by one (gin's files already parsed) and raises
  ValueError if two of them set the same value differently.

  The same value: one macro, one parameter, or a parameter and the macro the gin files bind it
  to (`--gin.TEMPERATURE=0.5` with `--gin_bindings='evaluate.temperature = 0.7'` would run at
  0.7, the flag silently ignored).

  Args:
    overrides: (the flag as given, its gin binding) in the order gin applies them.
  """
  from_files = _config_values()
  # target -> (the flag that set it, its value, the parameter it was set through, if any)
  set_by: dict[tuple[tuple[str, str], str], tuple[str, object, str | None]] = {}
  for flag, line in overrides:
    before = _config_values()
    gin.parse_config(line)
    for key, value in _config_values().items():
      if key in before and before[key] is value:
        continue
      # What this binding sets: the key itself and, for a parameter the files bind to %NAME,
      # the macro NAME too (the parameter no longer reads it).
      macro = _macro_name(from_files.get(key))
      targets = [(key, None)] + ([(((macro, 'gin.macro'), 'value'), _label(key))] if macro else [])
      for target, via in targets:
        if target in set_by and set_by[target][0] != flag:
          other, old, old_via = set_by[target]
          if _format(old) != _format(value):
            note = via or old_via
            raise ValueError(
                f'{other} and {flag} set {_label(target)} differently'
                + (f' ({note} is bound to %{target[0][0]} in the gin files)' if note else '')
                + '; gin would apply only one of them. Give the value once.')
        set_by.setdefault(target, (flag, value, via))


def _format(value: object) -> str:
  return gin.config._format_value(value)  # pylint: disable=protected-access


def check_required(example_file: str | None = None) -> None:
  """Raises ValueError when a gin binding calls a configurable (`@X()`) whose required
  parameters nothing binds, naming them (instead of a TypeError from inside gin's call)."""
  import inspect  # pylint: disable=g-import-not-at-top
  values = _config_values()
  for key, value in values.items():
    if not isinstance(value, gin.config.ConfigurableReference) or not value.evaluate:
      continue
    if value.configurable.name == 'macro':
      continue
    try:
      signature = inspect.signature(value.configurable.wrapped)
    except (TypeError, ValueError):
      continue
    required = [n for n, p in signature.parameters.items()
                if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    bound = {n for (_, selector), n in values if selector == value.configurable.selector}
    missing = [n for n in required if n not in bound]
    if missing:
      hint = f': {example_file}' if example_file else ''
      raise ValueError(
          f'{_format(value)} (called by {_label(key)}) needs '
          f'{", ".join(value.configurable.selector + "." + n for n in missing)}, which no gin '
          f'file or flag binds. Give the gin files the run needs{hint}.')


def _macro_values() -> dict[str, str]:
  """{macro: repr of its value} in gin's current configuration."""
  return {scope: repr(value) for ((scope, selector), name), value in _config_values().items()
          if selector == 'gin.macro' and name == 'value'}


def parse_files(files: Sequence[str], bindings: Sequence[str] = ()) -> None:
  """Parses `files` in order, warning when one changes a macro an earlier file set.

  Run files (gin/calibrate.gin, gin/runs/*) and model files (gin/models/*) may define the same
  macro (e.g. ACTIVATION_DTYPE, ATTENTION_IMPL); the later file's value wins, so the order of
  --gin_file flags would otherwise change a run setting the user never touched. A macro that
  `bindings` set is the user's choice and is not warned about.
  """
  chosen = {m.group(1) for b in bindings if (m := _MACRO_BINDING.match(b))}
  set_by: dict[str, tuple[str, str]] = {}
  bound_by: dict[tuple[tuple[str, str], str], str] = {}  # parameter -> the file that bound it
  for name in files:
    before = _macro_values()
    parameters = _config_values()
    gin.parse_config_files_and_bindings([name], None, finalize_config=False)
    for key, value in _config_values().items():
      if key in parameters and parameters[key] is value:
        continue
      # A later file that rebinds a parameter an earlier one bound to %MACRO cuts it from the
      # macro: a flag setting that macro would not reach it (`--gin.CHECKPOINT_PATH=A` with a
      # file binding `jobs.Checkpoint.path = 'B'` would read B).
      macro = _macro_name(parameters.get(key))
      if macro in chosen and _macro_name(value) != macro:
        raise ValueError(
            f'--gin.{macro} does not reach {_label(key)}: {name} binds it to {_format(value)}, '
            f'replacing %{macro} from {bound_by.get(key, "an earlier gin file")}, so gin would '
            f'apply {_format(value)} and ignore the flag. Give the value once: the flag, or '
            'the binding.')
      bound_by[key] = name
    for macro, value in _macro_values().items():
      if macro in before and before[macro] != value and macro in set_by and macro not in chosen:
        earlier, old = set_by[macro]
        warnings.warn(
            f'{name} sets {macro} = {value}, replacing {old} from {earlier} (the later '
            f'--gin_file wins). Pass --gin.{macro}=... to choose it.', stacklevel=3)
      if macro not in before or before[macro] != value:
        set_by[macro] = (name, value)


def required_macros() -> list[str]:
  """Names of the macros gin's current configuration sets to %gin.REQUIRED."""
  return sorted(name for name in defined_macros() if str(getattr(
      gin.query_parameter(f'{name}/macro.value'), 'scoped_selector', '')).startswith(
          'gin.REQUIRED'))


def required_message(macro: str, fields: Sequence[str] = ()) -> str:
  """The one message for a required setting left unset: 'MACRO (what it sets) is required:
  pass --gin.MACRO=VALUE'."""
  where = f' ({", ".join(fields)})' if fields else ''
  return f'{macro}{where} is required: pass --gin.{macro}=VALUE'


def check_required_macros() -> None:
  """Raises ValueError naming each macro the gin files mark %gin.REQUIRED that no flag set, and
  the settings it sets (gin itself would refuse it later, from inside its parser)."""
  missing = required_macros()
  if not missing:
    return
  values = _config_values()
  problems = []
  for macro in missing:
    fields = sorted(_label(key).removeprefix('t5align.') for key, value in values.items()
                    if _macro_name(value) == macro)
    problems.append(required_message(macro, fields))
  raise ValueError('; '.join(problems) + '.')


def configure(argv: Sequence[str], *, unset_required: bool = False, **kwargs) -> None:
  """Parses the flags (see `parse_flags`) and applies them to gin's global configuration.

  Every macro a flag sets must be one the gin files define (`check_macros`) and some binding
  reads (`check_macros_reach`); a file that changes a macro an earlier file set warns, and one
  that rebinds a parameter bound to a macro a flag sets is refused (`parse_files`); two
  bindings that set one value differently are refused (`check_overrides`), as is a call of a
  configurable whose required parameters nothing binds (`check_required`), and a macro the
  files mark %gin.REQUIRED that no flag sets (`check_required_macros`); with
  `unset_required`, such macros are bound to None instead (for callers that read neither
  checkpoint nor data, e.g. `t5align.preflight`).
  """
  files, raw, flags, paths = _parse(argv, **kwargs)
  bindings = raw + [b for _, b in flags]
  for path in paths:
    gin.add_config_file_search_path(path)
  parse_files(files, bindings)
  check_macros(bindings, defined_macros(), files)
  check_macros_reach(bindings, files)
  check_overrides([(f'--gin_bindings={b!r}', b) for b in raw] + flags)
  check_required(kwargs.get('example_file'))
  if unset_required:
    bindings = [f'{name} = None' for name in required_macros()] + list(bindings)
  else:
    check_required_macros()
  gin.parse_config_files_and_bindings([], bindings)


def register_job(cls: type) -> type:
  """Registers a job class with gin under its own name, `t5align.jobs.<Name>` (bound as
  `jobs.EvalJob.batch_size = 4`), without changing the class: built in Python it takes only
  the arguments given. At import, config locked or not, so every name gin reaches the class by
  finds this registration."""
  with gin.unlock_config():
    gin.external_configurable(cls, module='t5align.jobs')
  return cls


def macro_bound_to(name: str, parameter: str) -> str | None:
  """The macro gin's current configuration binds `name.parameter` to (`name` as the gin files
  spell it, e.g. 'training.OptimizerConfig'), e.g. 'LEARNING_RATE'; None if it binds none."""
  for ((_, selector), bound), value in _config_values().items():
    if bound == parameter and (selector == name or selector.endswith('.' + name)):
      macro = _macro_name(value)
      if macro:
        return macro
  return None


def is_unset(value: object) -> bool:
  """Whether a setting is unset: None, or %gin.REQUIRED that no flag replaced."""
  return value is None or value is gin.REQUIRED or type(value).__name__ == '_GinRequired'


def require(job: object) -> None:
  """Raises a ValueError naming, by its gin macro, every required setting of `job` left unset.

  The one way to declare "required": a job lists its required settings as `REQUIRED = {field:
  macro}` (a field of a settings object it holds as 'checkpoint.path'), and its run files bind
  the field to %MACRO and set `MACRO = %gin.REQUIRED` (a run file may require more:
  `check_required_macros` names those). A macro None is a field the run
  file binds to a configurable (the model), set by giving a gin/models file.
  """
  name = type(job).__name__
  problems = []
  for field, macro in type(job).REQUIRED.items():
    value = job
    for part in field.split('.'):  # 'checkpoint.path': a settings object's field.
      value = getattr(value, part, None)
    if not is_unset(value):
      continue
    if macro is None:
      problems.append(f'jobs.{name}.{field} is required: the run file binds it to '
                      f'@network.Transformer(), configured by a gin/models file '
                      f'(--gin_file=gin/models/...)')
    else:
      problems.append(required_message(macro, [f'jobs.{name}.{field}']))
  if problems:
    raise ValueError('; '.join(problems) + '.')


def call_configured(qualified_name: str, **kwargs):
  """Calls the gin-configured function 'package.module.function' (with `kwargs`, if any).

  Dynamic registration leaves the module attribute undecorated, and under `python -m` the entry
  point's file is `__main__`, not its import name: so fetch the configurable gin holds for the
  function as imported by name.
  """
  module, name = qualified_name.rsplit('.', 1)
  return gin.get_configurable(getattr(importlib.import_module(module), name))(**kwargs)


class Stopped(BaseException):
  """SIGTERM, raised in the main thread (as KeyboardInterrupt is for SIGINT), so the run's
  `finally` blocks and context managers close what it holds (locks, record logs)."""


def run_job(job: Any, prog: str) -> Any:
  """`job.run()` for a command line: stopped by SIGTERM (a scheduler's preemption, `kill`) or
  SIGINT (Ctrl-C), the run closes what it holds and the command ends with one line that says
  what is kept and how to resume (`job.resume_note()`), exit 128 + the signal's number (143,
  130), no traceback. In a thread other than the main one (signals reach only it): `job.run()`
  as it is."""
  if threading.current_thread() is not threading.main_thread():
    return job.run()

  def stop(signum, unused_frame):
    raise Stopped(signum)

  previous = signal.signal(signal.SIGTERM, stop)
  try:
    return job.run()
  except (Stopped, KeyboardInterrupt) as e:
    number = signal.SIGTERM if isinstance(e, Stopped) else signal.SIGINT
    name = 'SIGTERM' if isinstance(e, Stopped) else 'SIGINT (Ctrl-C)'
    print(f'{prog}: stopped by {name}. {job.resume_note()}', file=sys.stderr, flush=True)
    raise SystemExit(128 + number) from None
  finally:
    signal.signal(signal.SIGTERM, previous)
