"""Shared test fixtures (the t5x-written tiny checkpoints and their reference outputs, a clean gin
config, at the repository root too, a checkpoint reader that fails the test) and the lanes' hooks
(the fast lane's guard; `--dist loadgroup`'s groups kept).

The suite runs on the CPU: JAX_PLATFORMS defaults to 'cpu' here (and in every subprocess a test
starts, which inherit it), so an installed libtpu (the test extras install it, for deviceless
TPU compiles) is never probed for chips. To run the suite on a GPU, set JAX_PLATFORMS=cuda.

Lanes: a test that runs a command line, several processes, the docs, a TPU compile or a benchmark
carries that marker (setup.cfg lists them), and any other slow test carries `slow`; `make
test-fast` deselects them all. With `--unmarked-limit=SECONDS` (which `make test-fast` passes), a
test carrying none of them fails if its setup and call take longer than SECONDS together, so the
fast lane stays fast.
"""
from __future__ import annotations

import functools
import io
import os
import pathlib

os.environ.setdefault('JAX_PLATFORMS', 'cpu')  # Before any test module imports jax.

import jax
import numpy as np
import pytest

TESTDATA = pathlib.Path(__file__).parent / 'testdata'
T5X_FIXTURES = TESTDATA / 't5x'
# The markers that take a test out of the fast lane (`make test-fast`).
INTEGRATION_MARKERS = ('cli', 'multiprocess', 'docs', 'tpu_compile', 'bench', 'slow')
_SETUP_SECONDS = pytest.StashKey[float]()


def pytest_addoption(parser):
  parser.addoption(
      '--unmarked-limit', type=float, default=None, metavar='SECONDS',
      help='fail a test that carries none of the markers ' + ', '.join(INTEGRATION_MARKERS) +
      ' and whose setup and call take longer than SECONDS (the fast lane\'s guard)')


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
  """Under --unmarked-limit, fails an unmarked test whose setup + call exceeded the limit."""
  report = yield
  limit = item.config.getoption('unmarked_limit')
  if limit is None or any(item.get_closest_marker(m) for m in INTEGRATION_MARKERS):
    return report
  if call.when == 'setup':
    item.stash[_SETUP_SECONDS] = call.duration
  elif call.when == 'call' and report.passed:
    setup = item.stash.get(_SETUP_SECONDS, 0.0)
    if setup + call.duration > limit:
      report.outcome = 'failed'
      report.longrepr = (
          f'{item.nodeid} took {setup + call.duration:.2f} s (setup {setup:.2f} s, call '
          f'{call.duration:.2f} s), over --unmarked-limit={limit:g} s for a test carrying none of '
          f'the markers {", ".join(INTEGRATION_MARKERS)}: mark it with its kind (or slow), or '
          'make it faster.')
  return report


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
  """Keeps `--dist loadgroup`'s groups under pytest >= 9.2 (pytest-xdist issue 1386).

  pytest-xdist (3.8) names a test's `xdist_group` by appending '@GROUP' to the item's
  `_nodeid`, which pytest 9.2 no longer reads (its node ids are `NodeId` objects), so every
  group was silently split across workers. Where xdist set a `_nodeid` that the node id lacks,
  the node id takes it, as it did before pytest 9.2; elsewhere this does nothing.
  """
  for item in items:
    grouped = getattr(item, '_nodeid', None)
    if isinstance(grouped, str) and grouped != item.nodeid and hasattr(item, '_id'):
      from _pytest import nodeid  # pylint: disable=g-import-not-at-top
      item._id = nodeid.NodeId.parse(grouped)  # pylint: disable=protected-access


def run_eval(*args: str):
  """`python -m t5align.eval ARGS` in this process (its `main`), gin's configuration cleared
  before and after."""
  import gin  # pylint: disable=g-import-not-at-top
  from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  try:
    return t5align_eval.main(list(args))
  finally:
    gin.clear_config()


@pytest.fixture
def processes(tmp_path):
  """`processes(args, logs, **kwargs) -> processes.Processes`: two local processes of `python -m
  ARGS` (tests/processes.py), started now and all killed after the test."""
  from processes import Processes  # pylint: disable=g-import-not-at-top
  started = []

  def start(args, logs, **kwargs):
    started.append(Processes(args, logs, tmp_path / 'jax_cache', **kwargs))
    return started[-1]

  yield start
  for p in started:  # Whatever happened, nothing outlives the test.
    p.kill()


@pytest.fixture
def clean_gin():
  """gin's config cleared before the test and after it; yields the gin module. Not autouse: a
  test that binds or parses gin asks for it (a parameter, or
  `@pytest.mark.usefixtures('clean_gin')`)."""
  import gin  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  yield gin
  gin.clear_config()


@pytest.fixture
def repo_gin(clean_gin, monkeypatch):
  """`clean_gin`, with the repository root as the working directory (the gin files' paths are
  relative to it); yields the gin module."""
  monkeypatch.chdir(pathlib.Path(__file__).resolve().parents[1])
  return clean_gin


@pytest.fixture
def no_load(monkeypatch):
  """Makes reading any weights fail the test: what must be refused before that."""
  from t5align import checkpoints  # pylint: disable=g-import-not-at-top

  def fail(*unused_args, **unused_kwargs):
    raise AssertionError('the checkpoint was read before the error')
  monkeypatch.setattr(checkpoints, 'load_params', fail)


@functools.cache
def _load(name: str):
  from t5align import checkpoints  # pylint: disable=g-import-not-at-top
  params, config = checkpoints.load_params(T5X_FIXTURES / name / 'legacy' / 'checkpoint_0')
  return config, params, dict(np.load(T5X_FIXTURES / name / 'reference.npz'))


@pytest.fixture(scope='session')
def load_t5x_fixture():
  """`load_t5x_fixture(name) -> (T5Config, params, reference arrays)` for a t5x fixture."""
  return _load


def _numpy_layer0_sorted(config, params, tokens):
  """Layer 0's logits materialized in full (float64 numpy), each row sorted, the rows averaged."""
  import jax  # pylint: disable=g-import-not-at-top
  from t5align.attention import reference  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  model = network.Transformer(config)
  _, state = jax.jit(lambda x: model.apply({'params': params}, x, method='encode',
                                           enable_dropout=False, mutable=['attention_inputs']))(
                                               tokens)
  inputs = state['attention_inputs']['encoder']['layers_0']['attention']
  q, k = (np.asarray(inputs[f'projected_{n}'][0], np.float64) for n in ('query', 'key'))
  table = params['encoder']['relpos_bias']['rel_embedding']
  bias = np.asarray(reference.relative_position_bias(table, tokens.shape[1], tokens.shape[1],
                                                     True), np.float64)
  # [b, q, h, d] x [b, k, h, d] -> [b, h, q, k] -> sorted rows averaged: [k]
  logits = np.einsum('bqhd,bkhd->bhqk', q, k) + bias
  return -np.sort(-logits, axis=-1).mean(axis=(0, 1, 2))


@pytest.fixture(scope='session')
def numpy_layer0_sorted():
  """`numpy_layer0_sorted(config, params, tokens) -> [k]`: layer 0's average sorted logit vector."""
  return _numpy_layer0_sorted


@functools.partial(jax.jit, static_argnums=0)
def _attention_inputs(config, params, tokens, temperature):
  """The 'attention_inputs' collection (every layer's projected queries and keys)."""
  from t5align import network  # pylint: disable=g-import-not-at-top
  model = network.Transformer(config)
  return model.apply({'params': params}, tokens, method='encode', enable_dropout=False,
                     temperature=temperature, mutable=['attention_inputs'])[1]


def _numpy_head_stats(config, params, tokens, temperature, buckets=None):
  """Per-head mean row P_max and entropy (float64 numpy) of every encoder layer at
  `temperature` (any `network.layer_temperatures` form, one value per example at most).

  Each layer's projected queries and keys come from the model run at `temperature` (so layer i
  sees the output of layers < i at their taus); its logits (q.k plus the relative bias, keys of
  other segments / padding masked) are then materialized in float64, divided by that layer's
  and head's tau, and the row statistics are averaged over every non-pad query row. `buckets`:
  int `[l, l]` bucket of every (query, key), for a bias rule written out by the caller (None:
  t5align's T5 bucketing, itself checked against t5x's fixture).

  Returns:
    (pmax `[n, h]`, entropy `[n, h]`).
  """
  from t5align.attention import reference  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  state = _attention_inputs(config, params, tokens, temperature)
  n, h, (b, l) = config.num_encoder_layers, config.num_heads, tokens.shape
  taus = np.broadcast_to(np.asarray(network.layer_temperatures(temperature, n, b, h),
                                    np.float64), (b, n, h))
  table = params['encoder']['relpos_bias']['rel_embedding']
  if buckets is None:
    bias = np.asarray(reference.relative_position_bias(table, l, l, True), np.float64)
  else:
    bias = np.asarray(table, np.float64)[:, buckets][None]  # [1, h, l, l]
  valid = tokens > 0  # [b, l]
  pmax, entropy = np.zeros((n, h)), np.zeros((n, h))
  for i in range(n):  # NOTE: padding query rows are all -inf (NaN rows), excluded below.
    inputs = state['attention_inputs']['encoder'][f'layers_{i}']['attention']
    q, k = (np.asarray(inputs[f'projected_{x}'][0], np.float64) for x in ('query', 'key'))
    # [b, q, h, d] x [b, k, h, d] -> [b, h, q, k]
    logits = np.einsum('bqhd,bkhd->bhqk', q, k) + bias
    logits = np.where(valid[:, None, None, :], logits, -np.inf) / taus[:, i, :, None, None]
    with np.errstate(invalid='ignore'):
      p = np.exp(logits - logits.max(-1, keepdims=True))
      p /= p.sum(-1, keepdims=True)
      plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    rows = valid[:, None, :]  # [b, 1, q]
    pmax[i] = np.sum(np.where(rows, p.max(-1), 0.0), axis=(0, 2)) / valid.sum()
    entropy[i] = np.sum(np.where(rows, -plogp.sum(-1), 0.0), axis=(0, 2)) / valid.sum()
  return pmax, entropy


@pytest.fixture(scope='session')
def numpy_head_stats():
  """`numpy_head_stats(config, params, tokens, temperature, buckets=None) -> (pmax [n, h],
  entropy [n, h])`."""
  return _numpy_head_stats


@functools.cache
def _toy_sentencepiece(texts: tuple[str, ...]) -> bytes:
  sentencepiece = pytest.importorskip('sentencepiece')
  buf = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(texts * 10), model_writer=buf, vocab_size=100, model_type='unigram',
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, hard_vocab_limit=False,
      minloglevel=2)
  return buf.getvalue()


@pytest.fixture(scope='session')
def toy_sentencepiece():
  """`toy_sentencepiece(texts) -> bytes`: a unigram SentencePiece model of about 100 pieces
  trained on `texts` (pad 0, EOS 1, unk 2, as T5's), serialized."""
  return lambda texts: _toy_sentencepiece(tuple(texts))


@pytest.fixture
def saved_figure(monkeypatch):
  """`saved_figure(draw)`: the matplotlib figure `draw()` saves (its closing made a no-op)."""
  from t5align.calibration import analysis  # pylint: disable=g-import-not-at-top
  from t5align.runtime import fileio  # pylint: disable=g-import-not-at-top

  def capture(draw):
    saved = []
    monkeypatch.setattr(fileio, 'save_figure', lambda fig, path, **kw: saved.append(fig))
    monkeypatch.setattr(analysis.pyplot(), 'close', lambda fig: None)
    draw()
    [fig] = saved
    return fig

  return capture
