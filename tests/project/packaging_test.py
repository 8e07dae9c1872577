"""Package data ships: the gin files where `t5align.gin_dir()` finds them, the published results
the report prints."""
from __future__ import annotations

import os
import pathlib

import pytest

import t5align
from t5align.evaluation import suites

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
# Every gin file of the repository, as the includes name them ('gin/t5x/eval.gin', ...).
GIN_FILES = sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / 'gin').rglob('*.gin'))


def test_gin_dir_holds_the_repository_gin_files():
  root = pathlib.Path(t5align.gin_dir())
  found = sorted(p.relative_to(root).as_posix() for p in root.glob('gin/**/*.gin'))
  assert found == GIN_FILES
  assert 'gin/t5x/retrieval_t5.gin' in found


def _shipped(monkeypatch) -> set[str]:
  """The package data `pip wheel .` / `python -m build` copies, as repository paths."""
  dist_module = pytest.importorskip('setuptools.dist')
  monkeypatch.chdir(REPO_ROOT)
  dist = dist_module.Distribution()
  dist.parse_config_files(['setup.cfg'])
  build_py = dist.get_command_obj('build_py')
  build_py.ensure_finalized()
  # (package, src dir, build dir, file names relative to the package).
  return {f'{package}/{name}'.replace(os.sep, '/')
          for package, _, _, names in build_py.data_files for name in names}


def test_setuptools_copies_every_gin_file_into_the_wheel(monkeypatch):
  assert {f't5align/gin_search_path/{f}' for f in GIN_FILES} <= _shipped(monkeypatch)


def test_setuptools_ships_the_published_results(monkeypatch):
  shipped = _shipped(monkeypatch)
  for path in suites.PUBLISHED.values():
    assert pathlib.Path(path).relative_to(REPO_ROOT).as_posix() in shipped
