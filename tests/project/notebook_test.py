"""The Colab quickstart: its install cell's logic, and an end-to-end run on the shipped model.

The run executes every cell with nbclient under small settings (T5ALIGN_QUICKSTART_*: 2 x L_tr,
2 examples per task), so it checks the same steps as the notebook's defaults at a fraction of
their cost.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import types

import pytest

from t5align import labels

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = REPO_ROOT / 'notebooks' / 'quickstart.ipynb'


def _install_cell() -> str:
  cells = [c for c in json.loads(NOTEBOOK.read_text(encoding='utf-8'))['cells']
           if c['cell_type'] == 'code']
  return ''.join(cells[0]['source'])


@pytest.fixture
def pip_calls(monkeypatch):
  calls = []
  monkeypatch.setattr(subprocess, 'check_call', lambda cmd, **kw: calls.append(list(cmd)) or 0)
  monkeypatch.delenv('T5ALIGN_REPOSITORY_URL', raising=False)
  return calls


def _on_colab(monkeypatch, installed: bool) -> None:
  monkeypatch.setitem(sys.modules, 'google.colab', types.ModuleType('google.colab'))
  if not installed:  # `import t5align` then raises ImportError, as on a fresh Colab kernel.
    monkeypatch.setitem(sys.modules, 't5align', None)


def test_install_cell_on_fresh_colab_installs_from_the_repository_url(monkeypatch, pip_calls):
  _on_colab(monkeypatch, installed=False)
  monkeypatch.setenv('T5ALIGN_REPOSITORY_URL', 'https://git.example/owner/t5align')
  exec(_install_cell(), {})  # pylint: disable=exec-used
  assert pip_calls == [[sys.executable, '-m', 'pip', 'install', '-q',
                        't5align @ git+https://git.example/owner/t5align']]


def test_install_cell_takes_the_url_from_its_first_assignment(monkeypatch, pip_calls):
  _on_colab(monkeypatch, installed=False)
  source = _install_cell()
  first = next(l for l in source.splitlines() if not l.startswith('#'))
  assert first == "REPOSITORY_URL = ''", first  # What a Colab user edits.
  edited = source.replace(first, "REPOSITORY_URL = 'https://git.example/me/t5align'", 1)
  exec(edited, {})  # pylint: disable=exec-used
  assert pip_calls[0][-1] == 't5align @ git+https://git.example/me/t5align'


def test_install_cell_on_colab_with_t5align_installed_does_nothing(monkeypatch, pip_calls):
  _on_colab(monkeypatch, installed=True)
  exec(_install_cell(), {})  # pylint: disable=exec-used
  assert not pip_calls


def test_install_cell_on_colab_without_a_url_says_what_to_set(monkeypatch, pip_calls):
  _on_colab(monkeypatch, installed=False)
  with pytest.raises(SystemExit, match='Set REPOSITORY_URL at the top of this cell'):
    exec(_install_cell(), {})  # pylint: disable=exec-used
  assert not pip_calls


def test_install_cell_off_colab_does_nothing(monkeypatch, pip_calls):
  monkeypatch.delitem(sys.modules, 'google.colab', raising=False)
  monkeypatch.setitem(sys.modules, 't5align', None)
  exec(_install_cell(), {})  # pylint: disable=exec-used
  assert not pip_calls


def _text(cell) -> str:
  return ''.join(o.get('text', '') for o in cell.get('outputs', []) if o.get('name') == 'stdout')


@pytest.mark.docs
def test_quickstart_executes(tmp_path, monkeypatch):
  nbclient = pytest.importorskip('nbclient')
  nbformat = pytest.importorskip('nbformat')
  # The kernel inherits this environment: this checkout's code, small settings.
  monkeypatch.setenv('PYTHONPATH', os.pathsep.join(
      [str(REPO_ROOT), *filter(None, [os.environ.get('PYTHONPATH')])]))
  monkeypatch.setenv('T5ALIGN_QUICKSTART_MULTIPLE', '2')
  monkeypatch.setenv('T5ALIGN_QUICKSTART_EXAMPLES', '2')
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  monkeypatch.setenv('TMPDIR', str(tmp_path))  # The kernel's temporary folders go here.
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  # In the notebook's folder, as `jupyter execute notebooks/quickstart.ipynb` runs it: it must
  # leave nothing there (its figures go to a temporary folder).
  before = sorted(p.name for p in NOTEBOOK.parent.iterdir())
  client = nbclient.NotebookClient(notebook, timeout=300, kernel_name='python3',
                                   resources={'metadata': {'path': str(NOTEBOOK.parent)}})
  client.execute()  # Raises CellExecutionError, with the cell's traceback, on any failure.
  assert sorted(p.name for p in NOTEBOOK.parent.iterdir()) == before
  printed = '\n'.join(_text(c) for c in notebook.cells if c.cell_type == 'code')
  assert 'L_tr = 256, L_ex = 512' in printed, printed
  # Every strategy printed a temperature in (0, 1], and every accuracy row was printed.
  taus = re.findall(r'^ *[a-z_]+: tau = \[?([0-9.]+)', printed, flags=re.M)
  assert len(taus) == 4 and all(0 < float(t) <= 1 for t in taus), printed
  for strategy in ('pmax', 'entropy', 'log_length', 'pmax_per_layer'):
    row = re.search(rf'{re.escape(labels.strategy_label(strategy))} @ 512: passkey \d+%', printed)
    assert row, (strategy, printed)
  assert re.search(r'tau = 1 @ 512: passkey \d+%', printed), printed
  figures = pathlib.Path(re.search(r'^figures in (.+)$', printed, flags=re.M)[1])
  assert figures.parent == tmp_path
  assert (figures / 'statistic_curves.png').stat().st_size > 1000
  assert (figures / 'relpos_bias.png').stat().st_size > 1000
