"""What importing a module loads: the light modules stay light, and the package edges hold.

Each import runs in a fresh interpreter; the modules of this repository it loaded are compared
with the written-out expected set, so a new import edge shows up here as a named difference.
"""
import ast
import pathlib
import subprocess
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNTIME = {'t5align.runtime', 't5align.runtime.fileio', 't5align.runtime.outputs',
           't5align.runtime.validate'}
ATTENTION = {'t5align.attention', 't5align.attention.blockwise', 't5align.attention.dispatch',
             't5align.attention.pallas_gpu', 't5align.attention.pallas_mgpu',
             't5align.attention.pallas_tpu', 't5align.attention.reference'}
# A schedule names bias rules: the attention math's names (jax and numpy only), not its kernels.
SCHEDULE = {'t5align', 't5align.labels', 't5align.schedule', 't5align.attention',
            't5align.attention.reference'} | RUNTIME


def _loaded(module: str) -> tuple[set[str], set[str]]:
  """(this repository's modules, heavy third-party packages) that `import module` loads."""
  code = (f'import sys, {module}\n'
          'print(sorted(k for k in sys.modules if k.split(".")[0] in ("t5align", "seqio_tasks")))\n'
          'print(sorted(k for k in ("jax", "flax", "seqio", "tensorflow", "torch") '
          'if k in sys.modules))\n')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                       cwd=REPO_ROOT, check=True).stdout.splitlines()
  return set(ast.literal_eval(out[-2])), set(ast.literal_eval(out[-1]))


@pytest.mark.parametrize('module, expected, heavy', [
    # Schedules are data: reading one needs no model and no calibration engine.
    ('t5align.schedule', SCHEDULE, {'jax'}),
    # The network t5x.eval loads: the schedule's data and the network, nothing of calibration,
    # checkpoints, evaluation or the shipped model. T5Config's fields carry their checks
    # (t5align.fields), whose refusals name the gin macro that set a field (gin_cli: gin and
    # absl, which t5x loads anyway) and mark fields outside a run's identity (run_identity).
    # (A fresh interpreter importing jax and flax: 4.5 s under load, so slow.)
    pytest.param('t5align.scheduled',
                 SCHEDULE | ATTENTION | {'t5align.scheduled', 't5align.network',
                                         't5align.layers', 't5align.fields', 't5align.gin_cli',
                                         't5align.run_identity'},
                 {'jax', 'flax'}, marks=pytest.mark.slow),
    # Tables from finished runs (and their run identities, to keep runs apart), with the
    # suites' layouts: no JAX, no seqio at all.
    ('t5align.report', {'t5align', 't5align.labels', 't5align.report', 't5align.evaluation',
                        't5align.evaluation.tables', 't5align.evaluation.markdown',
                        't5align.evaluation.suites', 't5align.evaluation.suites.layout',
                        't5align.evaluation.suites.zeroscrolls',
                        't5align.evaluation.suites.scrolls', 't5align.evaluation.suites.ruler',
                        't5align.run_identity', 't5align.runtime', 't5align.runtime.fileio',
                        't5align.runtime.outputs'},
     set()),
    # Paired tests of rows on the same examples, with the report's Wilson interval: no JAX.
    ('t5align.evaluation.paired', {'t5align', 't5align.labels', 't5align.evaluation',
                                   't5align.evaluation.paired', 't5align.evaluation.tables',
                                   't5align.evaluation.markdown', 't5align.evaluation.suites',
                                   't5align.evaluation.suites.layout',
                                   't5align.evaluation.suites.zeroscrolls',
                                   't5align.evaluation.suites.scrolls',
                                   't5align.evaluation.suites.ruler', 't5align.run_identity',
                                   't5align.runtime', 't5align.runtime.fileio',
                                   't5align.runtime.outputs'},
     set()),
    # The suites' layouts, which seqio_tasks reads their columns from: light for both.
    ('t5align.evaluation.suites', {'t5align', 't5align.labels', 't5align.evaluation',
                                   't5align.evaluation.markdown', 't5align.evaluation.suites',
                                   't5align.evaluation.suites.layout',
                                   't5align.evaluation.suites.zeroscrolls',
                                   't5align.evaluation.suites.scrolls',
                                   't5align.evaluation.suites.ruler', 't5align.runtime',
                                   't5align.runtime.fileio', 't5align.runtime.outputs'},
     set()),
])
def test_import_loads_only_what_it_uses(module, expected, heavy):
  ours, third_party = _loaded(module)
  assert ours == expected, (f'import {module}: loads also {sorted(ours - expected)}, '
                            f'no longer {sorted(expected - ours)}')
  assert third_party == heavy


def _imports(path: pathlib.Path) -> set[str]:
  """Modules (absolute names) that `path` imports anywhere in its code."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module:
      found |= {f'{node.module}.{a.name}' for a in node.names}
    elif isinstance(node, ast.Import):
      found |= {a.name for a in node.names}
  return found


def test_seqio_tasks_import_nothing_of_t5align_but_vocabularies_and_the_layouts():
  """seqio_tasks stands on `t5align.vocabularies` and the suites' report layouts
  (`t5align.evaluation.suites`, where a suite's columns are written; what they load is
  `test_import_loads_only_what_it_uses`'), nothing else of t5align."""
  for path in sorted((REPO_ROOT / 'seqio_tasks').rglob('*.py')):  # Subfolders too (ruler/).
    ours = {m for m in _imports(path) if m.split('.')[0] == 't5align'}
    others = {m for m in ours if m != 't5align.vocabularies'
              and not m.startswith('t5align.evaluation.suites')}
    assert not others, f'{path.name} imports {sorted(others)}'


@pytest.mark.parametrize('package, allowed', [
    ('runtime', set()),  # Knows no model: only its own modules.
    ('attention', set()),
])
def test_package_imports_only_itself(package, allowed):
  for path in sorted((REPO_ROOT / 't5align' / package).glob('*.py')):
    ours = {m for m in _imports(path) if m.split('.')[0] == 't5align'}
    outside = {m for m in ours if not m.startswith(f't5align.{package}.')} - allowed
    assert not outside, f't5align/{package}/{path.name} imports {sorted(outside)}'


def test_attention_modules_depend_one_way():
  """reference imports none of its siblings, blockwise builds on it, the kernels on both,
  dispatch on all (never the reverse)."""
  root = REPO_ROOT / 't5align' / 'attention'
  ours = lambda name: {m for m in _imports(root / f'{name}.py') if m.split('.')[0] == 't5align'}
  pkg = 't5align.attention.'
  assert ours('reference') == set()
  assert ours('blockwise') == {pkg + 'reference'}
  assert ours('pallas_gpu') == {pkg + 'reference', pkg + 'blockwise'}
  assert ours('pallas_mgpu') == {pkg + 'reference', pkg + 'blockwise'}
  assert ours('pallas_tpu') == {pkg + 'reference', pkg + 'blockwise'}
  assert ours('dispatch') == {pkg + m for m in ('reference', 'blockwise', 'pallas_gpu',
                                                'pallas_mgpu', 'pallas_tpu')}
  assert ours('__init__') == set()


COMMANDS = {'t5align.eval', 't5align.calibrate', 't5align.train', 't5align.preflight',
            't5align.report', 't5align.demo.command', 't5align.demo.__main__',
            't5align.lm_eval.__main__'}


def _module(path: pathlib.Path) -> str:
  return '.'.join(path.relative_to(REPO_ROOT).with_suffix('').parts)


def _imported_commands(path: pathlib.Path) -> set[str]:
  """The command modules `path` imports (`from t5align import eval` names t5align.eval)."""
  return {m for m in _imports(path) for c in COMMANDS if m == c or m.startswith(c + '.')}


def test_commands_stand_on_the_library_and_nothing_imports_a_command():
  """A command is flags/gin -> job -> `job.run()`: no module of the library or the benchmarks,
  and no other command, imports one (the pre-flight compiles the jobs' own programs, the
  benchmarks use the library); `t5align/demo/__main__.py` alone imports the demo's command."""
  paths = sorted([*(REPO_ROOT / 't5align').rglob('*.py'), *(REPO_ROOT / 'benchmarks').glob('*.py'),
                  *(REPO_ROOT / 'seqio_tasks').glob('*.py')])
  found = {_module(p): _imported_commands(p) - {_module(p)} for p in paths}
  found['t5align.demo.__main__'] -= {'t5align.demo.command'}
  assert {m: c for m, c in found.items() if c} == {}


def test_lm_eval_stays_an_extra():
  """lm-evaluation-harness (the `lm_eval` extra) is imported by t5align/lm_eval's model, facade
  and command only, and nothing else of t5align imports that package: the core install runs
  without lm-eval."""
  root = REPO_ROOT / 't5align'
  importers = {_module(p) for p in sorted(root.rglob('*.py'))
               if any(m == 'lm_eval' or m.startswith('lm_eval.') for m in _imports(p))}
  assert importers == {'t5align.lm_eval.__init__', 't5align.lm_eval.model',
                       't5align.lm_eval.__main__'}
  users = {_module(p) for p in sorted(root.rglob('*.py'))
           if not _module(p).startswith('t5align.lm_eval')
           and any(m.startswith('t5align.lm_eval') for m in _imports(p))}
  assert users == set()


@pytest.mark.parametrize('command', ['eval', 'calibrate', 'train'])
def test_run_commands_are_thin(command):
  """The run commands hold flags/gin -> job -> run only: no definition but `main` (the job
  lives in `t5align.jobs`)."""
  tree = ast.parse((REPO_ROOT / 't5align' / f'{command}.py').read_text())
  defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
  assert defined == {'main'}
  assert len((REPO_ROOT / 't5align' / f'{command}.py').read_text().splitlines()) <= 100
