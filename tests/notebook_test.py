"""The Colab quickstart runs end to end on the shipped model (executed with nbclient)."""
from __future__ import annotations

import pathlib
import re

import pytest

nbclient = pytest.importorskip('nbclient')
nbformat = pytest.importorskip('nbformat')

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / 'notebooks' / 'quickstart.ipynb'


def _text(cell) -> str:
  return ''.join(o.get('text', '') for o in cell.get('outputs', []) if o.get('name') == 'stdout')


def test_quickstart_executes(tmp_path):
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(notebook, timeout=900, kernel_name='python3',
                                   resources={'metadata': {'path': str(tmp_path)}})
  client.execute()  # Raises CellExecutionError, with the cell's traceback, on any failure.
  printed = '\n'.join(_text(c) for c in notebook.cells if c.cell_type == 'code')
  # Every strategy printed a temperature in (0, 1], and every accuracy row was printed.
  taus = re.findall(r'tau = \[?([0-9.]+)', printed)
  assert len(taus) >= 4 and all(0 < float(t) <= 1 for t in taus), printed
  assert printed.count('passkey') >= 5, printed
  figures = tmp_path / 'quickstart_figures'
  assert (figures / 'statistic_curves.png').stat().st_size > 1000
  assert (figures / 'relpos_bias.png').stat().st_size > 1000
