"""Partitioned eval and calibration on 8 simulated CPU devices equal one device's.

One subprocess (XLA_FLAGS must be set before JAX starts) runs the t5x tiny fixture on every
mesh and prints JSON; the tests here check it. References: the same functions on one device
(plain jit), and the t5x-written fixture's greedy tokens.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from t5align import calibration
from t5align import partitioning

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
EVAL_MESHES = [(8, 1), (4, 2), (2, 4), (1, 8)]  # (data, model)
CALIBRATION_MESHES = [(2, 2, 2), (1, 1, 8), (8, 1, 1)]  # (tau, data, model)

_SCRIPT = textwrap.dedent('''
    import json, sys, time
    start = time.time()
    import numpy as np
    import jax
    sys.path.insert(0, 'tests')
    from conftest import _load
    from t5align import calibration
    from t5align.calibration import stats
    from t5align import decoding
    from t5align.evaluation import scoring
    from t5align import network
    from t5align import partitioning
    from t5align.runtime import batching
    from t5align.runtime import multihost

    config, params, ref = _load('t5_1_1_tiny')
    model = network.Transformer(config)
    out = {'devices': jax.device_count(), 'eval': {}, 'calibration': {}}

    # Eval: 8 rows (the fixture's two, cut to several lengths), one tau per row, layer and head
    # ([8, layers, heads], sharded over 'data' as the rows).
    rows = [calibration.cut_to_length(ref['encoder_input_tokens'], n, 1)[i]
            for n in (160, 120, 81, 40) for i in (0, 1)]
    inputs = batching.pad_tokens(rows, multiple=8)
    targets = np.tile(ref['decoder_target_tokens'], (4, 1))
    taus = (np.linspace(0.6, 1.0, 8)[:, None, None] * np.random.default_rng(0).uniform(
        0.8, 1.2, (8, config.num_encoder_layers, config.num_heads))).astype(np.float32)
    ll_one = np.asarray(scoring.score_batch(model, params, inputs, targets, taus))
    greedy_one = np.asarray(decoding.greedy_decode(model, params, inputs, max_decode_length=6,
                                                   eos_id=1, temperature=taus))
    fixture_tokens = np.asarray(decoding.greedy_decode(
        model, params, ref['encoder_input_tokens'], max_decode_length=6, eos_id=1,
        temperature=1.0))
    out['greedy_vs_fixture'] = bool(np.array_equal(fixture_tokens, ref['greedy_tokens_tau1.00']))
    for data, model_size in %(eval_meshes)r:
      mesh = partitioning.eval_mesh(model_size)
      assert dict(mesh.shape) == {'data': data, 'model': model_size}
      placed = partitioning.place_params(params, config, mesh)
      place = lambda x: multihost.global_batch(x, partitioning.batch_sharding(mesh, 2), len(x))
      ll = multihost.gather(scoring.partitioned_score(model, mesh)(
          placed, place(inputs), place(targets), place(taus)))
      greedy = multihost.gather(scoring.partitioned_greedy_decode(model, mesh, 6, 1)(
          placed, place(inputs), place(taus)))
      out['eval'][f'{data}x{model_size}'] = {
          'll_rel': float(np.max(np.abs(ll - ll_one) / np.abs(ll_one))),
          'greedy_equal': bool(np.array_equal(greedy, greedy_one))}
    out['ll_one'] = ll_one.tolist()

    out['eval_s'] = time.time() - start
    # Calibration statistics: three rows of 81 tokens (one compiled width).
    tokens = calibration.cut_to_length(np.concatenate(
        [ref['encoder_input_tokens'], ref['encoder_input_tokens'][:1]]), 81, 1)
    cal_taus = [1.0, 0.9, 0.8, 0.7, 0.6]  # Padded to the 'tau' axis.
    one = calibration.encoder_attention_stats(params, config, tokens, cal_taus)
    for shape in %(calibration_meshes)r:
      mesh = partitioning.calibration_mesh(*shape)
      got = calibration.encoder_attention_stats(params, config, tokens, cal_taus, mesh=mesh)
      rel = max(float(np.max(np.abs(getattr(got, k) - getattr(one, k)) / np.abs(getattr(one, k))))
                for k in ('layer_pmax', 'layer_entropy', 'pmax', 'entropy'))
      out['calibration'][''.join(map(str, shape))] = {'rel': rel, 'rows': [one.rows, got.rows]}
      if shape != (1, 1, 8):
        continue
      # The compiled statistics call: its parameter shardings and per-device argument bytes.
      placed = partitioning.place_params(params, config, mesh)
      compiled = stats.sweep_fn(
          config, mesh, stats.default_tau_chunk()).lower(
          placed, partitioning.global_array(tokens, partitioning.batch_sharding(mesh, 2)),
          partitioning.global_array(np.ones((len(cal_taus), 2), np.float32),
                                    stats.tau_sharding(mesh))).compile()
      specs = jax.tree.map(lambda s: [a for a in s.spec], compiled.input_shardings[0][0],
                           is_leaf=lambda s: hasattr(s, 'spec'))
      out['calibration'][''.join(map(str, shape))].update({
          'wi_spec': specs['encoder']['layers_0']['mlp']['wi_0']['kernel'],
          'query_spec': specs['encoder']['layers_0']['attention']['query']['kernel'],
          'embedding_spec': specs['token_embedder']['embedding'],
          'argument_bytes': int(compiled.memory_analysis().argument_size_in_bytes),
          'hlo_all_reduce': 'all-reduce' in compiled.as_text()})
    # Mesh-wide searches (8 taus per round) and the layer-0 logit vector on sharded params.
    mesh = partitioning.calibration_mesh(8, 1, 1)
    out['bisect_mesh'] = calibration.calibrate(
        params, config, tokens, 'pmax_bisect',
        reference_length=32, settings=calibration.SearchSettings(mesh=mesh)).tau
    placed = partitioning.place_params(params, config, partitioning.calibration_mesh(1, 1, 8))
    layer0 = [calibration.layer0_sorted_logits(p, config, tokens[1:], chunk=32)
              for p in (params, placed)]
    out['layer0_abs'] = float(np.max(np.abs(layer0[0] - layer0[1])))
    out['encoder_bytes'] = int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(
        [params['encoder'], params['token_embedder']])))
    out['total_s'] = time.time() - start
    print(json.dumps(out))
''') % {'eval_meshes': EVAL_MESHES, 'calibration_meshes': CALIBRATION_MESHES}


# ~60 s on the 2-core machine: its tests are slow and share one xdist worker (computed once).
@pytest.fixture(scope='module')
def result():
  # LLVM optimization level 0 compiles in about 2/3 of the CPU time; every compared pair of
  # numbers comes from the same process, so both sides share the code generator's settings.
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8 '
                                   '--xla_backend_optimization_level=0',
             JAX_PLATFORMS='cpu', PYTHONPATH=str(REPO_ROOT))
  out = subprocess.run([sys.executable, '-c', _SCRIPT], cwd=REPO_ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.xdist_group('partitioning_result')
def test_eval_scores_and_greedy_tokens_equal_one_device(result):
  assert result['devices'] == 8
  assert result['greedy_vs_fixture']  # The one-device reference itself matches t5x.
  assert np.all(np.isfinite(result['ll_one'])) and len(set(result['ll_one'])) == 8
  for mesh in EVAL_MESHES:
    got = result['eval'][f'{mesh[0]}x{mesh[1]}']
    assert got['ll_rel'] <= 1e-6, (mesh, got)
    assert got['greedy_equal'], mesh


@pytest.mark.slow
@pytest.mark.xdist_group('partitioning_result')
def test_calibration_statistics_equal_one_device(result, load_t5x_fixture):
  for shape in CALIBRATION_MESHES:
    got = result['calibration'][''.join(map(str, shape))]
    assert got['rel'] <= 1e-6, (shape, got)
    assert got['rows'][0] == got['rows'][1]
  np.testing.assert_allclose(result['layer0_abs'], 0.0, atol=1e-5)
  # The 8-wide mesh search lands where the one-device search (2 taus per round) does, to tol.
  config, params, ref = load_t5x_fixture('t5_1_1_tiny')
  tokens = calibration.cut_to_length(np.concatenate(
      [ref['encoder_input_tokens'], ref['encoder_input_tokens'][:1]]), 81, 1)
  single = calibration.calibrate(params, config, tokens, 'pmax_bisect', reference_length=32)
  assert abs(result['bisect_mesh'] - single.tau) <= 2e-3


@pytest.mark.slow
@pytest.mark.xdist_group('partitioning_result')
def test_compiled_calibration_shards_parameters_on_model(result):
  got = result['calibration']['118']
  assert got['wi_spec'] == [None, 'model'], got
  assert got['query_spec'] == [None, 'model'], got
  assert got['embedding_spec'] == ['model', None], got
  assert got['hlo_all_reduce']  # Partial sums over 'model' are combined.
  # Per-device argument bytes at model = 8: about an eighth of the encoder and embedding
  # parameters (norm scales and the relative-position table stay replicated), plus the inputs.
  assert got['argument_bytes'] <= 0.2 * result['encoder_bytes'], got


def test_param_shardings_and_meshes(load_t5x_fixture):
  config, params, _ = load_t5x_fixture('t5_1_1_tiny')
  mesh = partitioning.eval_mesh(1)
  shardings = partitioning.param_shardings(config, mesh)
  assert jax.tree.structure(shardings) == jax.tree.structure(params)
  placed = partitioning.place_params({'encoder': params['encoder']}, config, mesh)
  assert set(placed) == {'encoder'}
  np.testing.assert_array_equal(
      placed['encoder']['encoder_norm']['scale'], params['encoder']['encoder_norm']['scale'])
  with pytest.raises(ValueError, match='must divide the 1 devices'):
    partitioning.eval_mesh(2)
