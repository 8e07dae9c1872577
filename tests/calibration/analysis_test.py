"""Analysis tests: numbers behind the paper's Table 1 and Figures 1, 3-5, and the written files
(none when a head asked for is past the model)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from t5align import calibration
from t5align.calibration import analysis

L_TR, LENGTHS = 16, (32, 81)


# ~13 s on the 2-core machine: its tests are slow and share one xdist worker (computed once).
@pytest.fixture(scope='module')
def collected(load_t5x_fixture):
  config, params, ref = load_t5x_fixture('t5_1_1_tiny')
  tokens = calibration.cut_to_length(ref['encoder_input_tokens'], 81, 1)
  numbers = analysis.collect(params, config, tokens, LENGTHS, reference_length=L_TR, qq_size=50)
  return config, params, tokens, numbers


@pytest.mark.slow
@pytest.mark.xdist_group('analysis_collected')
def test_dispersion_grows_with_length(collected):
  _, _, _, numbers = collected
  assert numbers['lengths'] == [L_TR, *LENGTHS]
  one = numbers['grid'].index(1.0)
  pmax = [numbers['statistics'][str(L)]['pmax'][one] for L in numbers['lengths']]
  entropy = [numbers['statistics'][str(L)]['entropy'][one] for L in numbers['lengths']]
  # Paper Table 1: longer inputs, flatter attention.
  assert np.all(np.diff(pmax) < 0) and np.all(np.diff(entropy) > 0), (pmax, entropy)
  table = analysis.dispersion_table(numbers)
  assert 'P_max' in table and f'{pmax[-1]:.4f}' in table and '81' in table.splitlines()[0]
  layer = numbers['statistics']['81']['layer_pmax_tau1']
  np.testing.assert_allclose(np.mean(layer), pmax[-1], rtol=1e-12)


@pytest.mark.slow
@pytest.mark.xdist_group('analysis_collected')
def test_algorithm1_and_closed_forms_agree_with_calibration(collected):
  config, params, tokens, numbers = collected
  chosen = analysis.algorithm1_taus(numbers, 'pmax')
  cut = calibration.cut_to_length(tokens, 32, 1)
  assert chosen[32] == calibration.calibrate(params, config, cut, 'pmax',
                                             reference_length=L_TR).tau
  curves = analysis.closed_form_curves(numbers)
  layer0 = numbers['layer0']
  for L in LENGTHS:
    i = curves['length'].index(float(L))
    np.testing.assert_allclose(
        curves['prop2'][i], calibration.prop2_tau(L_TR, L, layer0[str(L_TR)]['sigma'],
                                                  layer0[str(L)]['sigma']))
    np.testing.assert_allclose(curves['log_length'][i], np.log(L_TR) / np.log(L))
  assert curves['prop2'][0] == pytest.approx(1.0) and curves['log_length'][0] == pytest.approx(1)


def test_qq_points_are_linear_for_gaussian_data():
  rng = np.random.default_rng(0)
  qq = analysis.qq_points(rng.normal(3.0, 2.0, 4000), points=100)
  assert len(qq['theoretical']) == 100
  slope, intercept = np.polyfit(qq['theoretical'], qq['sample'], 1)
  assert abs(slope - 1) < 0.03 and abs(intercept) < 0.03
  skewed = analysis.qq_points(rng.exponential(1.0, 4000), points=100)
  assert np.max(np.abs(np.subtract(skewed['sample'], skewed['theoretical']))) > 1.0


def test_relpos_bias_matches_t5x_buckets(load_t5x_fixture):
  _, params, ref = load_t5x_fixture('t5_1_1_tiny')
  table = np.asarray(params['encoder']['relpos_bias']['rel_embedding'])
  m, length = 150, 300
  values = analysis.relpos_bias_row(table, length, m)
  offsets = list(ref['relpos_offsets'])  # key - query, -300..300
  buckets = ref['relpos_bucket_bidirectional'][0][[offsets.index(n - m) for n in range(length)]]
  np.testing.assert_allclose(values, table[:, buckets], rtol=1e-6)


@pytest.mark.slow
@pytest.mark.xdist_group('analysis_collected')
def test_write_analysis_files(collected, tmp_path):
  _, _, _, numbers = collected
  paths = analysis.write_analysis(numbers, str(tmp_path))
  for name, path in paths.items():
    data = open(path, 'rb').read()
    assert data, name
    if name.endswith('.png'):
      assert data[:8] == b'\x89PNG\r\n\x1a\n'
  record = json.loads(open(paths['analysis.json']).read())
  assert record['lengths'] == [L_TR, *LENGTHS]
  assert set(record['algorithm1']) == {'pmax', 'entropy'}
  assert len(record['layer0']['81']['qq']['sample']) == 50
  assert open(paths['dispersion.txt']).read().rstrip('\n') == '\n\n'.join(
      [analysis.dispersion_table(numbers), analysis.lmax_table(numbers),
       analysis.head_dispersion_table(numbers)])
  assert 'head_dispersion.png' in paths
  assert np.shape(record['statistics']['81']['head_entropy_tau1']) == (2, 4)


@pytest.mark.slow
@pytest.mark.xdist_group('analysis_collected')
def test_per_head_dispersion_matches_numpy_float64(collected, numpy_head_stats):
  """Per-head P_max and entropy by length (tau = 1) against the float64 re-derivation; the
  table lists every head of every layer with its change from L_tr to the longest length."""
  config, params, tokens, numbers = collected
  pmax, entropy = numpy_head_stats(config, params, tokens, 1.0)  # L = 81
  np.testing.assert_allclose(numbers['statistics']['81']['head_pmax_tau1'], pmax, rtol=5e-7)
  np.testing.assert_allclose(numbers['statistics']['81']['head_entropy_tau1'], entropy,
                             rtol=5e-7)
  values = analysis.head_dispersion(numbers, 'pmax')  # [lengths, n, h]
  assert values.shape == (3, config.num_encoder_layers, config.num_heads)
  np.testing.assert_allclose(values.mean(-1)[-1], numbers['statistics']['81']['layer_pmax_tau1'],
                             rtol=1e-12)
  lines = analysis.head_dispersion_table(numbers).splitlines()
  row = next(line for line in lines if line.startswith('L1 h2 '))  # First: the P_max block.
  assert row.split()[2:] == [f'{v:.4f}' for v in values[:, 1, 2]] + [
      f'{values[-1, 1, 2] - values[0, 1, 2]:+.4f}']
  assert sum(line.startswith('L') for line in lines) == 2 * values[0].size


@pytest.mark.slow
@pytest.mark.xdist_group('analysis_collected')
def test_lmax_and_per_task_tables(collected, tmp_path, numpy_layer0_sorted):
  from t5align import network  # pylint: disable=g-import-not-at-top
  config, params, tokens, numbers = collected
  # Table 7 from a float64 numpy re-derivation: layer 0's logits in full, each row sorted, the
  # rows averaged; l_max = its largest entry minus its mean.
  vector = numpy_layer0_sorted(config, params, tokens)
  lmax_81 = vector.max() - vector.mean()
  np.testing.assert_allclose(numbers['layer0']['81']['lmax'], lmax_81, rtol=1e-5)
  table = analysis.lmax_table(numbers)
  assert table.splitlines()[1].startswith('l_max') and f'{lmax_81:.4f}' in table
  # Per task: two "tasks" (the two fixture rows), each with a reference cut to L_tr.
  model = network.Transformer(config)
  pairs = {f'row{i}': (tokens[i:i + 1], calibration.cut_to_length(tokens[i:i + 1], L_TR, 1))
           for i in range(2)}
  tasks = analysis.task_statistics(params, config, pairs)
  for i in range(2):
    long = tasks[f'row{i}']['long']
    _, state = model.apply({'params': params}, tokens[i:i + 1], method='encode',
                           enable_dropout=False, mutable=['intermediates'])
    expected = network.mean_row_stats(
        network.encoder_row_stats(state['intermediates'], config.num_encoder_layers))
    np.testing.assert_allclose([long['pmax'], long['entropy']],
                               [expected['pmax'], expected['entropy']], rtol=1e-5)
    assert long['length'] == 81 and tasks[f'row{i}']['reference']['length'] == L_TR
  text = analysis.task_tables(tasks)
  assert 'row0' in text and 'row1' in text and 'l_max' in text
  assert f'{tasks["row1"]["long"]["pmax"]:.4f}' in text
  paths = analysis.write_analysis(numbers, str(tmp_path), tasks=tasks, heads=[3, 1])
  assert analysis.task_tables(tasks) in open(paths['dispersion.txt']).read()
  drawn = analysis.plot_relpos_bias(numbers['rel_embedding'], 40, paths['relpos_bias.png'],
                                    heads=[3, 1])
  np.testing.assert_allclose(drawn, analysis.relpos_bias_row(numbers['rel_embedding'], 40, 20)[
      [3, 1]])
  with pytest.raises(ValueError, match='heads'):
    analysis.plot_relpos_bias(numbers['rel_embedding'], 40, paths['relpos_bias.png'], heads=[9])


@pytest.mark.slow
@pytest.mark.xdist_group('analysis_collected')
def test_collect_rejects_short_lengths(collected):
  config, params, tokens, _ = collected
  with pytest.raises(ValueError, match='shorter than L_tr'):
    analysis.collect(params, config, tokens, (8,), reference_length=L_TR)


@pytest.mark.slow
@pytest.mark.xdist_group('analysis_collected')
def test_grouped_samples_pool_to_the_concatenation(collected):
  """Groups measured apart (e.g. per task) pool to the statistics of all their rows at once, and
  the concatenation's result is remembered, so calibrating on it computes nothing new."""
  config, params, tokens, numbers = collected
  groups = {L: [calibration.cut_to_length(tokens[:1], L, 1),
                calibration.cut_to_length(tokens[1:], L, 1)] for L in (L_TR, *LENGTHS)}
  memo = calibration.Memo()
  pooled = analysis.collect(params, config, groups, LENGTHS, reference_length=L_TR, qq_size=50,
                            memo=memo)
  for L in map(str, (L_TR, *LENGTHS)):
    for key in ('pmax', 'entropy', 'layer_pmax_tau1', 'layer_entropy_tau1'):
      np.testing.assert_allclose(pooled['statistics'][L][key], numbers['statistics'][L][key],
                                 rtol=2e-6)
    np.testing.assert_allclose(pooled['layer0'][L]['sigma'], numbers['layer0'][L]['sigma'],
                               rtol=1e-6)
  hits = memo.hits
  cut = calibration.cut_to_length(tokens, 32, 1)
  memo.attention_stats(params, config, cut, pooled['grid'])
  assert memo.hits == hits + 1
  with pytest.raises(ValueError, match=r'tokens has no samples for lengths \[81\]'):
    analysis.collect(params, config, {L_TR: groups[L_TR], 32: groups[32]}, LENGTHS,
                     reference_length=L_TR)


@pytest.mark.slow
@pytest.mark.xdist_group('analysis_collected')
def test_figure_axes_are_labelled_without_collisions(collected, saved_figure, tmp_path):
  _, _, _, numbers = collected
  fig = saved_figure(lambda: analysis.plot_temperature_curves(
      numbers, str(tmp_path / 't.png')))
  [ax] = fig.axes
  # Labels at the measured lengths only: no minor-tick labels to collide on the log axis.
  fig.canvas.draw()
  assert [t.get_text() for t in ax.get_xticklabels()] == ['16', '32', '81']
  assert not [t for t in ax.get_xticklabels(minor=True) if t.get_text()]
  boxes = [t.get_window_extent() for t in ax.get_xticklabels()]
  assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:]))
  fig = saved_figure(lambda: analysis.plot_relpos_bias(
      numbers['rel_embedding'], 40, str(tmp_path / 'r.png'), heads=[0, 1, 2, 3, 0, 1]))
  drawn = [ax for ax in fig.axes if ax.lines]  # 2 rows of 4 panels, the last 2 empty
  assert len(drawn) == 6
  # x labelled at the bottom panel of each column, y at the start of each row.
  assert [ax.get_xlabel() for ax in drawn] == ['', ''] + ['key position n'] * 4
  assert [ax.get_ylabel() for ax in drawn] == ['b(m=20, n)', '', '', '', 'b(m=20, n)', '']


def test_write_analysis_refuses_bad_heads_before_writing_any_file(tmp_path):
  from t5align.calibration import analysis  # pylint: disable=g-import-not-at-top
  numbers = {'rel_embedding': np.zeros((4, 32), np.float32), 'lengths': [64]}
  with pytest.raises(ValueError, match=r'heads=\(99,\): .*4 heads, 0\.\.3'):
    analysis.write_analysis(numbers, str(tmp_path / 'analysis'), heads=(99,))
  assert not (tmp_path / 'analysis').exists()
