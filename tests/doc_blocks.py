"""The docs' fenced code blocks (README.md, CHANGELOG.md, docs/) as tests: found by sybil, run
as written or checked.

A fenced ```python or ```sh block runs as written (Python in one namespace per document, shell
with bash from the repository root, `python` being this interpreter). A block preceded by the line
`<!-- ci: check-only (needs WHAT) -->` needs what CI lacks (t5x, gs://, a TPU, hours); it is
checked instead:
- Python: it parses; every module it imports exists (t5x's excepted); every `module.name` it uses
  exists, with every keyword it passes to a function of ours; every name it reads is defined in
  the block (imported, assigned, or a builtin).
- Shell: bash parses it; it then runs with `python`, `gcloud`, `make`, `jupyter` and `pip`
  replaced by functions that record their arguments instead of running, and each recorded
  command is checked: `python -m MODULE` exists; t5align's gin CLIs parse their flags, gin files,
  macros and bindings as the real run would (`gin_cli.configure`), and nothing else; the demo's
  argparse flags parse; t5x's have files that exist, macros their files (or t5x's run files)
  define and values gin can parse; `python -m t5align.lm_eval`'s arguments parse with lm-eval's
  own parser, its model arguments as the model checks them, its tasks are lm-eval's;
  other modules' `--flags` appear in their source; `python -c` code is checked as Python above;
  `gcloud ... --command=CMD` checks CMD the same way; `make` targets exist in the Makefile;
  `pip install -e '.[extra]'` extras exist in setup.cfg; `jupyter execute` notebooks exist.
"""
from __future__ import annotations

import ast
import builtins
import configparser
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
from typing import Any, Sequence

import sybil
from sybil.parsers.markdown import lexers

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# `<!-- ci: check-only (needs WHAT) -->`; WHAT may hold balanced parentheses.
CHECK_ONLY = re.compile(r'^<!-- ci: check-only \(needs (?P<needs>(?:[^()]|\([^()]*\))+)\) -->$')
RUN_LANGUAGES = ('python', 'sh')
# Fenced blocks that are not code (output, data) say so with one of these.
TEXT_LANGUAGES = ('text', 'json', 'gin')
# Modules CI does not install (t5x is not on the package index): imports are not resolved.
ABSENT_MODULES = ('t5x',)
# Macros defined by t5x's own run and model files (t5x/configs/runs/{eval,finetune,infer}.gin,
# t5x/examples/t5/t5_1_1/base.gin), which the gin/t5x files include.
T5X_MACROS = frozenset({
    'MIXTURE_OR_TASK_NAME', 'CHECKPOINT_PATH', 'EVAL_OUTPUT_DIR', 'TASK_FEATURE_LENGTHS',
    'DROPOUT_RATE', 'VOCABULARY', 'OPTIMIZER', 'MODEL', 'MODEL_DIR', 'TRAIN_STEPS',
    'INITIAL_CHECKPOINT_PATH', 'BATCH_SIZE', 'USE_CACHED_TASKS', 'SHUFFLE_TRAIN_EXAMPLES',
    'PACKING', 'LOSS_NORMALIZING_FACTOR', 'EVAL_PERIOD', 'RANDOM_SEED',
    'MIXTURE_OR_TASK_MODULE', 'INFER_OUTPUT_DIR'})
# Modules the t5x run files import for their bindings (utils.DatasetConfig.batch_size, ...).
T5X_GIN_MODULES = frozenset({'utils', 'partitioning', 'seqio', 'models', 'decoding', 'adafactor',
                             'trainer', 'eval_script', 'train_script'})
# t5align's entry points configured with gin_cli (their flags are parsed as the run would).
GIN_CLIS = ('t5align.calibrate', 't5align.eval', 't5align.train')
# Entry points with argparse flags: the module whose `flag_parser()` parses them.
ARGPARSE_CLIS = {'t5align.demo': 't5align.demo.command'}


@dataclasses.dataclass(frozen=True)
class Block:
  language: str
  source: str
  needs: str | None  # What a check-only block needs; None: it runs.


def _parse_blocks(document: sybil.Document):
  for region in lexers.FencedCodeBlockLexer(language=r'[^\n]*')(document):
    before = document.text[:region.start].rstrip('\n').rsplit('\n', 1)[-1].strip()
    match = CHECK_ONLY.match(before)
    region.parsed = Block(region.lexemes['language'].strip(), str(region.lexemes['source']),
                          match['needs'] if match else None)
    region.evaluator = evaluate
    yield region


def examples(path: pathlib.Path) -> list[sybil.Example]:
  """The fenced blocks of a Markdown file, in order, each evaluated by `evaluate`."""
  return list(sybil.Sybil(parsers=[_parse_blocks]).parse(path))


def evaluate(example: sybil.Example) -> None:
  block: Block = example.parsed
  where = f'{example.path}:{example.line}'
  if block.language in TEXT_LANGUAGES:
    return
  if block.language not in RUN_LANGUAGES:
    raise AssertionError(f'{where}: a ```{block.language or ""} block; code blocks are '
                         f'{RUN_LANGUAGES}, others one of {TEXT_LANGUAGES}.')
  if block.needs is None:
    run_python(block.source, example.namespace, where) if block.language == 'python' else \
        run_shell(block.source, where)
  elif block.language == 'python':
    check_python(block.source, where)
  else:
    check_shell(block.source, where)


# ------------------------------------------------------------------------------------- running


def run_python(source: str, namespace: dict[str, Any], where: str) -> None:
  exec(compile(source, where, 'exec'), namespace)  # pylint: disable=exec-used


def shell_env() -> dict[str, str]:
  """This interpreter first on PATH (as in an activated venv); this checkout's code."""
  path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get('PATH', '')])
  pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get('PYTHONPATH')]))
  return dict(os.environ, PATH=path, PYTHONPATH=pythonpath, JAX_PLATFORMS='cpu')


def run_shell(source: str, where: str, env: dict[str, str] | None = None) -> None:
  proc = subprocess.run(['bash', '-euo', 'pipefail', '-c', source], cwd=REPO_ROOT,
                        env=env or shell_env(), capture_output=True, text=True, timeout=600)
  if proc.returncode:
    raise AssertionError(f'{where}: exit status {proc.returncode}\n{proc.stdout[-3000:]}\n'
                         f'{proc.stderr[-5000:]}')


# ------------------------------------------------------------------------------------ checking


def _absent(module: str) -> bool:
  return module.split('.')[0] in ABSENT_MODULES


def _module(name: str, where: str) -> Any:
  if importlib.util.find_spec(name.split('.')[0]) is None:
    raise AssertionError(f'{where}: no module {name!r}.')
  try:
    return importlib.import_module(name)
  except ImportError as e:
    raise AssertionError(f'{where}: no module {name!r} ({e}).') from e


class _Names(ast.NodeVisitor):
  """Names a block binds (assignments, imports, defs, loop and with targets) and reads."""

  def __init__(self):
    self.bound, self.read = set(dir(builtins)), []

  def visit_Name(self, node):  # pylint: disable=invalid-name
    if isinstance(node.ctx, ast.Load):
      self.read.append((node.id, node.lineno))
    else:
      self.bound.add(node.id)

  def visit_alias(self, node):  # pylint: disable=invalid-name
    self.bound.add((node.asname or node.name).split('.')[0])

  def visit_FunctionDef(self, node):  # pylint: disable=invalid-name
    self.bound.add(node.name)
    self.bound.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))
    self.generic_visit(node)

  visit_ClassDef = visit_FunctionDef  # pylint: disable=invalid-name

  def visit_Lambda(self, node):  # pylint: disable=invalid-name
    self.bound.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))
    self.generic_visit(node)


def check_python(source: str, where: str) -> None:
  """Parses `source`; checks its imports, module attributes, keywords and free names."""
  try:
    tree = ast.parse(source)
  except SyntaxError as e:
    raise AssertionError(f'{where}: not valid Python: {e}') from e
  modules: dict[str, Any] = {}  # Local name -> module (or None where it is not installed).
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        value = None if _absent(alias.name) else _module(alias.name, where)
        if alias.asname:
          modules[alias.asname] = value
        else:
          modules[alias.name.split('.')[0]] = (None if value is None else
                                               _module(alias.name.split('.')[0], where))
    elif isinstance(node, ast.ImportFrom):
      if _absent(node.module):
        modules.update({a.asname or a.name: None for a in node.names})
        continue
      parent = _module(node.module, where)
      for alias in node.names:
        if not hasattr(parent, alias.name):
          _module(f'{node.module}.{alias.name}', where)
        value = getattr(importlib.import_module(node.module), alias.name, None)
        if value is None:
          value = importlib.import_module(f'{node.module}.{alias.name}')
        modules[alias.asname or alias.name] = value if inspect.ismodule(value) else None
  for node in ast.walk(tree):
    target = node.func if isinstance(node, ast.Call) else node
    if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
            and modules.get(target.value.id) is not None):
      continue
    module = modules[target.value.id]
    if not hasattr(module, target.attr):
      raise AssertionError(f'{where}: line {node.lineno}: {module.__name__} has no '
                           f'{target.attr!r}.')
    if isinstance(node, ast.Call):
      _check_keywords(getattr(module, target.attr), node, f'{module.__name__}.{target.attr}',
                      where)
  names = _Names()
  names.visit(tree)
  free = [(n, line) for n, line in names.read if n not in names.bound]
  if free:
    raise AssertionError(f'{where}: names used but never defined in the block: '
                         + ', '.join(f'{n} (line {line})' for n, line in free))


def _check_keywords(fn: Any, call: ast.Call, name: str, where: str) -> None:
  try:
    params = inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return
  if any(p.kind is p.VAR_KEYWORD for p in params.values()):
    return
  for kw in call.keywords:
    if kw.arg is not None and kw.arg not in params:
      raise AssertionError(f'{where}: line {call.lineno}: {name}() has no parameter {kw.arg!r} '
                           f'(it takes {", ".join(params)}).')


_SHIMS = r'''
__record() {
  "$T5ALIGN_DOC_PYTHON" -c \
    'import json, sys; open(sys.argv[1], "a").write(json.dumps(sys.argv[2:]) + "\n")' \
    "$T5ALIGN_DOC_RECORD" "$@"
}
python() { __record python "$@"; }
python3() { __record python "$@"; }
gcloud() { __record gcloud "$@"; }
make() { __record make "$@"; }
jupyter() { __record jupyter "$@"; }
pip() { __record pip "$@"; }
'''


def recorded_commands(source: str, where: str, prelude: str = '') -> list[list[str]]:
  """The commands (argv lists) the shimmed programs would have run, in order."""
  syntax = subprocess.run(['bash', '-n', '-c', source], capture_output=True, text=True)
  if syntax.returncode:
    raise AssertionError(f'{where}: bash cannot parse the block: {syntax.stderr}')
  with tempfile.TemporaryDirectory() as tmp:
    record = os.path.join(tmp, 'commands.jsonl')
    env = dict(shell_env(), T5ALIGN_DOC_PYTHON=sys.executable, T5ALIGN_DOC_RECORD=record)
    run_shell(_SHIMS + prelude + '\n' + source, where, env)
    if not os.path.exists(record):
      return []
    with open(record, encoding='utf-8') as f:
      return [json.loads(line) for line in f]


def check_shell(source: str, where: str, prelude: str = '') -> list[list[str]]:
  commands = recorded_commands(source, where, prelude)
  if not commands:
    raise AssertionError(f'{where}: the block runs no command that can be checked.')
  for argv in commands:
    check_command(argv, where)
  return commands


def check_command(argv: Sequence[str], where: str) -> None:
  """Checks one recorded command (see the module docstring)."""
  program, args = argv[0], list(argv[1:])
  where = f'{where}: `{shlex.join(argv)[:160]}`'
  if program == 'python':
    if args[:1] == ['-c']:
      check_python(args[1], where)
    elif args[:1] == ['-m']:
      _check_module_command(args[1], args[2:], where)
    else:
      raise AssertionError(f'{where}: expected `python -m MODULE` or `python -c CODE`.')
  elif program == 'gcloud':
    remote = [a.split('=', 1)[1] for a in args if a.startswith('--command=')]
    if not remote:
      raise AssertionError(f'{where}: a gcloud command without --command= to check.')
    # On the remote host: its checkout is the current folder.
    check_shell(remote[0], where, prelude='cd() { :; }')
  elif program == 'make':
    makefile = (REPO_ROOT / 'Makefile').read_text()
    for target in (a for a in args if not a.startswith('-')):
      if not re.search(rf'^{re.escape(target)}:', makefile, re.M):
        raise AssertionError(f'{where}: no target {target!r} in the Makefile.')
  elif program == 'pip':
    _check_pip(args, where)
  elif program == 'jupyter':
    if args[:1] != ['execute'] or importlib.util.find_spec('nbclient') is None:
      raise AssertionError(f'{where}: expected `jupyter execute` (nbclient, in the test extras).')
    for path in (a for a in args[1:] if not a.startswith('-')):
      if not (REPO_ROOT / path).is_file():
        raise AssertionError(f'{where}: no notebook {path}.')
  else:
    raise AssertionError(f'{where}: no check for {program!r}.')


def _check_pip(args: list[str], where: str) -> None:
  setup = configparser.ConfigParser()
  setup.read(REPO_ROOT / 'setup.cfg')
  extras = set(setup['options.extras_require'])
  for arg in args:
    match = re.fullmatch(r'(?:-e)?\.(?:\[(?P<extras>[^\]]*)\])?', arg)
    if match and match['extras']:
      unknown = set(match['extras'].split(',')) - extras
      if unknown:
        raise AssertionError(f'{where}: setup.cfg has no extras {sorted(unknown)} '
                             f'(it has {sorted(extras)}).')


def _check_module_command(name: str, args: list[str], where: str) -> None:
  if _absent(name):
    if name in ('t5x.eval', 't5x.train', 't5x.infer'):
      check_t5x_flags(args, where)
      return
    raise AssertionError(f'{where}: no check for {name}.')
  module = _module(name, where)
  if name in GIN_CLIS:
    check_gin_cli(name, args, where)
    return
  if name == 't5align.lm_eval':
    check_lm_eval(args, where)
    return
  if name in ARGPARSE_CLIS:
    try:
      importlib.import_module(ARGPARSE_CLIS[name]).flag_parser().parse_args(args)
    except SystemExit as e:
      raise AssertionError(f'{where}: {name} refuses these flags (exit {e.code}).') from e
    return
  if name == 't5align.preflight':  # Its own flags, then those of the run it compiles.
    from t5align.runtime import tpu_chips  # pylint: disable=g-import-not-at-top
    try:
      known, rest = module.flag_parser().parse_known_args(args)
      tpu_chips.parse_target(known.topology)
    except (Exception, SystemExit) as e:  # pylint: disable=broad-except
      raise AssertionError(f'{where}: {type(e).__name__}: {e}') from e
    # Required macros, such as CHECKPOINT_PATH, may be left out: it reads no checkpoint.
    check_gin_cli(name, rest, where, modules=('t5align.eval', 't5align.calibrate'),
                  unset_required=True)
    return
  source = inspect.getsource(module)
  for arg in args:
    flag = arg.split('=', 1)[0]
    if flag.startswith('--') and f"'{flag}'" not in source:
      raise AssertionError(f'{where}: {name} defines no flag {flag}.')


@functools.cache
def _lm_eval_task_names() -> frozenset[str]:
  from lm_eval import tasks  # pylint: disable=g-import-not-at-top
  return frozenset(tasks.TaskManager().all_tasks)


def check_lm_eval(args: list[str], where: str) -> None:
  """`python -m t5align.lm_eval ARGS`: lm-eval's own parser takes ARGS; with `--model t5align`
  its model arguments are `ModelArgs`' (checked as the model checks them before loading); the
  tasks are lm-eval's own, unless a folder of other tasks is included (`--include_path`)."""
  from lm_eval._cli.harness import HarnessCLI  # pylint: disable=g-import-not-at-top
  from t5align.lm_eval import settings  # pylint: disable=g-import-not-at-top
  try:
    parsed = HarnessCLI()._parser.parse_args(['run', *args])  # pylint: disable=protected-access
  except SystemExit as e:
    raise AssertionError(f'{where}: lm-eval refuses these arguments (exit {e.code}).') from e
  if parsed.model == 't5align':
    try:
      settings.ModelArgs.from_kwargs(parsed.model_args or {})
    except ValueError as e:
      raise AssertionError(f'{where}: --model_args: {e}') from e
  if parsed.include_path is None:
    unknown = sorted(set(parsed.tasks or ()) - _lm_eval_task_names())
    if unknown:
      raise AssertionError(f'{where}: lm-eval {__import__("lm_eval").__version__} has no tasks '
                           f'{unknown}.')


def check_gin_cli(name: str, args: list[str], where: str, modules: Sequence[str] = (),
                  unset_required: bool = False) -> None:
  """Parses the flags, gin files, macros and bindings as `python -m NAME` would, and stops
  (`modules`: those whose configurables the command registers besides NAME's own)."""
  import gin  # pylint: disable=g-import-not-at-top
  # seqio_tasks registers its configurables.
  import seqio_tasks  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  from t5align import gin_cli  # pylint: disable=g-import-not-at-top
  for module in (name, *modules):
    importlib.import_module(module)
  cwd = os.getcwd()
  gin.clear_config()
  try:
    os.chdir(REPO_ROOT)
    gin_cli.configure(args, prog=f'python -m {name}', unset_required=unset_required)
  except (Exception, SystemExit) as e:  # pylint: disable=broad-except
    raise AssertionError(f'{where}: {type(e).__name__}: {e}') from e
  finally:
    os.chdir(cwd)
    gin.clear_config()


def _gin_file(name: str, search: Sequence[str]) -> pathlib.Path | None:
  import t5align  # pylint: disable=g-import-not-at-top
  for folder in (*search, t5align.gin_dir(), str(REPO_ROOT)):
    if folder and (pathlib.Path(folder) / name).is_file():
      return pathlib.Path(folder) / name
  return None


def gin_file_macros(name: str, search: Sequence[str], where: str) -> tuple[set[str], set[str]]:
  """(macros, imported module names) a gin file and its includes define, read as text."""
  if name.startswith('t5x/'):  # t5x's own files.
    return set(T5X_MACROS), set(T5X_GIN_MODULES)
  path = _gin_file(name, search)
  if path is None:
    raise AssertionError(f'{where}: no gin file {name} (search paths: the package gin dir).')
  text = path.read_text()
  macros = set(re.findall(r'^([A-Z_][A-Z0-9_]*)\s*=', text, re.M))
  imported = {m.split('.')[-1] for m in re.findall(r'^(?:from \S+ )?import (\S+)', text, re.M)}
  imported |= set(re.findall(r'^import \S+ as (\S+)', text, re.M))
  for include in re.findall(r"^include '([^']+)'", text, re.M):
    more, mods = gin_file_macros(include, search, where)
    macros, imported = macros | more, imported | mods
  return macros, imported


def check_t5x_flags(args: list[str], where: str) -> None:
  """t5x.eval / t5x.train flags: gin files exist, every --gin.NAME is defined by them (or by
  t5x's run files) and its VALUE parses as gin (t5x adds `NAME = VALUE` as written)."""
  import gin  # pylint: disable=g-import-not-at-top
  files, search, values = [], [], {}
  for arg in args:
    flag, _, value = arg.partition('=')
    if flag == '--gin_file':
      files.append(value)
    elif flag == '--gin_search_paths':
      search += [p for p in value.split(',') if p]
    elif flag.startswith('--gin.'):
      values[flag[len('--gin.'):]] = value
    elif flag != '--gin_bindings':
      raise AssertionError(f'{where}: not a t5x gin flag: {flag}.')
  if not files:
    raise AssertionError(f'{where}: no --gin_file.')
  macros, modules = set(), set()
  for name in files:
    more, mods = gin_file_macros(name, search, where)
    macros, modules = macros | more, modules | mods
  for name, value in values.items():
    if '.' in name:
      if name.split('.')[0] not in modules:
        raise AssertionError(f'{where}: --gin.{name}: no module {name.split(".")[0]!r} is '
                             f'imported by {", ".join(files)}.')
    elif name not in macros:
      raise AssertionError(f'{where}: --gin.{name}: no macro {name} in {", ".join(files)}.')
    try:
      gin.config.parse_value(value)
    except Exception as e:  # pylint: disable=broad-except
      raise AssertionError(
          f'{where}: --gin.{name}={value}: t5x binds `{name} = {value}`, which gin cannot '
          f'parse ({type(e).__name__}: {e}); quote strings as --gin.{name}=\\"...\\".') from e
  if 'gin/t5x/schedule.gin' in files and 'TEMPERATURE' in values:
    raise AssertionError(f'{where}: TEMPERATURE together with gin/t5x/schedule.gin is refused '
                         '(t5x_gin.check_no_temperature).')
