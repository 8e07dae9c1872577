"""Shared test fixtures: the t5x-written tiny checkpoints and their reference outputs."""
from __future__ import annotations

import functools
import pathlib

import numpy as np
import pytest

TESTDATA = pathlib.Path(__file__).parent / 'testdata'
T5X_FIXTURES = TESTDATA / 't5x'


@functools.cache
def _load(name: str):
  from t5align import checkpoints  # pylint: disable=g-import-not-at-top
  params, config = checkpoints.load_params(T5X_FIXTURES / name / 'legacy' / 'checkpoint_0')
  return config, params, dict(np.load(T5X_FIXTURES / name / 'reference.npz'))


@pytest.fixture(scope='session')
def load_t5x_fixture():
  """`load_t5x_fixture(name) -> (T5Config, params, reference arrays)` for a t5x fixture."""
  return _load
