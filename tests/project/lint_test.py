"""The linter: `ruff check` with the repository's ruff.toml reports nothing (part of `make test`).

ruff is pinned in setup.cfg's test extras: its rules (some of them preview rules) and messages
change between versions, so another version fails here rather than linting differently.
"""
from __future__ import annotations

import configparser
import pathlib
import re
import subprocess
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = REPO_ROOT / 'ruff.toml'


def _ruff(*args: str, cwd: pathlib.Path = REPO_ROOT) -> subprocess.CompletedProcess:
  # --no-cache: the test writes nothing into the checkout.
  return subprocess.run([sys.executable, '-m', 'ruff', *args], cwd=cwd, capture_output=True,
                        text=True, check=False)


def _pinned_version() -> str:
  parser = configparser.ConfigParser()
  parser.read(REPO_ROOT / 'setup.cfg')
  pins = re.findall(r'^ruff==(\S+)$', parser['options.extras_require']['test'], re.M)
  assert len(pins) == 1, f"setup.cfg's test extras pin ruff once (ruff==X.Y.Z); found {pins}"
  return pins[0]


def test_ruff_is_the_pinned_version():
  version = _ruff('--version')
  assert version.returncode == 0, version.stderr
  assert version.stdout.split() == ['ruff', _pinned_version()], (
      f'{version.stdout.strip()} is installed; setup.cfg pins ruff=={_pinned_version()} '
      "(pip install -e '.[test]')")


def test_ruff_check_is_clean():
  result = _ruff('check', '--no-cache', '--config', str(CONFIG), '--output-format', 'concise',
                 '.')
  assert result.returncode == 0, (
      'ruff check (ruff.toml) reports, from the repository root:\n' + result.stdout + result.stderr)


def test_ruff_config_reports_what_it_selects(tmp_path):
  """The configuration is live: a file with one fault of each kind gets exactly those codes."""
  source = '\n'.join([
      'import os',  # F401, unused
      'import sys',
      '',
      '',
      'def f(x):',
      '  square = lambda y: y * y',  # E731, ignored: small lambdas bound to names are allowed
      '  l = x',  # E741, ignored: `l` is the softmax row sum
      "  return sys.argv, square(l), '" + 'x' * 80 + "'",  # E501, 101 columns
      '',
      '',
      '',
      'def g(x):',  # E303, three blank lines
      '  return x',
      '',
      '',  # W391, blank lines at the end
  ])
  (tmp_path / 'faults.py').write_text(source)
  result = _ruff('check', '--no-cache', '--config', str(CONFIG), '--output-format', 'concise',
                 'faults.py', cwd=tmp_path)
  codes = sorted(re.findall(r'^faults\.py:\d+:\d+: (\S+):', result.stdout, re.M))
  assert result.returncode == 1, result.stdout + result.stderr
  assert codes == sorted(['unused-import', 'line-too-long', 'too-many-blank-lines',
                          'too-many-newlines-at-end-of-file']), result.stdout
