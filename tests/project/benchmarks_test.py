"""The benchmark scripts run end to end (tiny sizes) and check themselves against 'reference'."""
from __future__ import annotations

import argparse
import importlib.util
import json

import pytest

from benchmarks import attention_bench
from benchmarks import calibration_stability
from benchmarks import encoder_bench
from benchmarks import harness
from benchmarks import preflight_table
from benchmarks import tpu_kernel_bench
from t5align.calibration import stats


def _args(argv):
  return harness.parse_common_flags(argparse.ArgumentParser(), argv, timeout=60)


@pytest.mark.bench
def test_attention_bench_row_checks_itself_against_reference(capsys):
  attention_bench.main(['--lengths', '192', '--heads', '2', '--depth', '16', '--impls',
                        'blockwise', '--no-hf', '--repeats', '0'])
  (row,) = json.loads(capsys.readouterr().out)['rows']
  assert 'error' not in row, row
  assert (row['impl'], row['length'], row['heads'], row['repeats']) == ('blockwise', 192, 2, 0)
  # repeats=0: the first call is the time.
  assert row['seconds'] == pytest.approx(row['first_call_s'], abs=1e-4) and row['seconds'] > 0
  check = row['check_vs_reference']  # float32 on CPU: agreement to rounding.
  assert check['all_finite'] and check['out_rel_err'] < 1e-5, check
  assert check['pmax_max_abs_err'] < 1e-5 and check['entropy_max_abs_err'] < 1e-4, check


@pytest.mark.bench
@pytest.mark.tpu_compile
@pytest.mark.skipif(
    importlib.util.find_spec('libtpu') is None,
    reason='libtpu is not installed (pip install "jax[tpu]"): no deviceless TPU compile')
def test_tpu_kernel_bench_row_carries_the_kernel_cost(capsys):
  """A deviceless compile for one v5e chip: the attention is the program's one Mosaic call, and
  XLA's cost analysis carries the kernel's own estimate (at 256 tokens one 256 x 256 tile per
  head, never skipped: per (query, key) pair 4 d FLOPs of q.k and p.v plus 8 of the softmax
  and its statistics, one exp), which Mosaic alone would not report."""
  tpu_kernel_bench.main(['--topology', 'v5e:2x2', '--lengths', '256', '--impls', 'pallas_tpu'])
  (row,) = json.loads(capsys.readouterr().out)['rows']
  assert 'error' not in row, row
  assert (row['tpu_custom_calls'], row['device']) == (1, 'TPU v5 lite')
  assert 0 < row['kernel_scoped_vmem_bytes'] < 16 * 2**20  # Within v5e's scoped default.
  heads, depth, length = tpu_kernel_bench.HEADS, tpu_kernel_bench.DEPTH, 256
  assert row['xla_cost']['transcendentals'] == heads * length * length
  kernel_flops = (4 * depth + 8) * length * length * heads
  assert kernel_flops <= row['xla_cost']['flops'] < 1.01 * kernel_flops


def test_pallas_variants_and_repeats():
  args = _args(['--pallas-configs', '', '128,64,8,3', '--repeats', '0'])
  assert harness.variants(args, 'pallas') == [{}, {'pallas': [128, 64, 8, 3]}]
  assert harness.variants(args, 'blockwise') == [{}]
  preset = {'repeats': 5, 'hf_repeats': 1}
  assert harness.repeats_for(args, preset, 'blockwise') == 0  # 0 is not "unset".
  assert harness.repeats_for(args, preset, 'hf') == 1
  assert harness.repeats_for(_args(['--hf-repeats', '3']), preset, 'hf') == 3
  assert harness.repeats_for(_args([]), {'repeats': 5}, 'hf') == 5


@pytest.mark.bench
def test_encoder_bench_smoke_preset_checks_rows_against_reference(capsys):
  """The 'smoke' preset (tiny model, the 'cpu' preset's structure): rows checked, then timed."""
  # Forward only (2 subprocesses: the check, then the timed row), to stay cheap.
  encoder_bench.main(['--preset', 'smoke', '--no-hf', '--decode-lengths',
                      '--calibration-lengths'])
  first, forward, last = json.loads(capsys.readouterr().out)['rows']
  assert (forward['kind'], forward['impl'], forward['length']) == ('forward', 'blockwise', 160)
  assert 'error' not in forward and forward['seconds'] > 0, forward
  # The machine's peak: 'peak' rows before and after, and one beside the row in its process.
  assert first['kind'] == last['kind'] == 'peak' and first['tflops_per_s'] > 0, first
  assert forward['peak_tflops_per_s'] > 0 and forward['fraction_of_peak'] == round(
      forward['tflops_per_s'] / forward['peak_tflops_per_s'], 3)
  check = forward['check_vs_reference']
  assert check['all_finite'] and check['out_rel_err'] < 1e-5 and check['length'] == 160, check
  assert forward['weights_bytes'] == 4 * sum(  # tiny: embedding + 2 encoder layers + norms.
      [128 * 64, 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64), 4 * 32, 64])


@pytest.mark.bench
def test_encoder_bench_calibration_row_is_the_library_sweep(capsys):
  """The calibration row times `stats.encoder_attention_stats` (checked first against
  'reference'); its statistics are the same sweep's, in the paper grid's order."""
  encoder_bench.main(['--preset', 'smoke', '--no-hf', '--decode-lengths', '--lengths'])
  (row,) = [r for r in json.loads(capsys.readouterr().out)['rows'] if r['kind'] != 'peak']
  assert (row['kind'], row['impl'], row['length']) == ('calibration', 'blockwise', 128)
  assert 'error' not in row and row['seconds'] > 0, row
  check = row['check_vs_reference']
  assert check['all_finite'] and check['pmax_max_abs_err'] < 1e-5, check
  assert row['tau_chunk'] == stats.default_tau_chunk() == 1  # CPU.
  # Sharper with lower tau: P_max rises and entropy falls along 1.0, 0.95, ..., 0.5.
  assert len(row['pmax']) == len(encoder_bench.TAUS) == 11
  assert all(a < b for a, b in zip(row['pmax'], row['pmax'][1:]))
  assert all(a > b for a, b in zip(row['entropy'], row['entropy'][1:]))


def test_encoder_bench_skips_hf_past_its_time_limit():
  rows = [{'kind': 'forward', 'impl': 'hf', 'length': 8192, 'seconds': 60.0}]
  assert encoder_bench.hf_skip_reason(rows[0], 16384, 180).startswith('HF at 16384 tokens')
  assert encoder_bench.hf_skip_reason(rows[0], 8192, 180) is None
  assert encoder_bench.hf_skip_reason(None, 16384, 180) is None


def test_encoder_bench_skips_hf_past_the_machines_memory():
  """HF sdpa took 13.9 GB at 16k: at 32k (quadratic) it would not fit 24 GB; the row says so."""
  previous = {'kind': 'forward', 'impl': 'hf', 'length': 16384, 'seconds': 61.3,
              'peak_bytes': 13.9e9}
  memory_only = encoder_bench.hf_skip_reason(previous, 32768, None, 24e9)
  assert memory_only == ('HF at 32768 tokens would need about 56 GB (quadratic from 13.9 GB '
                         "peak at 16384), over this machine's 24.0 GB of memory")
  both = encoder_bench.hf_skip_reason(previous, 32768, 180, 24e9)
  assert 'would take about 245 s' in both and 'would need about 56 GB' in both
  assert encoder_bench.hf_skip_reason(previous, 16384, 180, 24e9) is None
  assert encoder_bench.machine_memory_bytes() > 0


def test_encoder_bench_summary_ratios():
  """Forward rows over the same implementation's mean at 4k-8k; calibration over forward."""
  row = lambda kind, impl, length, tflops, fraction: dict(
      kind=kind, model='small', impl=impl, length=length, tflops_per_s=tflops,
      fraction_of_peak=fraction)
  rows = [row('forward', 'blockwise', 4096, 0.30, 0.60), row('forward', 'blockwise', 8192, 0.20,
                                                              0.40),
          row('forward', 'blockwise', 32768, 0.225, 0.55), row('forward', 'reference', 4096, 0.1,
                                                               0.2),
          row('calibration', 'blockwise', 4096, 0.24, 0.45),
          {'kind': 'forward', 'model': 'small', 'impl': 'hf', 'length': 32768, 'skipped': 'x'}]
  out = encoder_bench.summary(rows)
  by_length = {r['length']: r for r in out['forward_over_base']}
  assert sorted(by_length) == [4096, 8192, 32768]  # 'reference' has no 8k row: no base.
  assert by_length[32768]['tflops'] == 0.9 and by_length[32768]['fraction_of_peak'] == 1.1
  (calibration,) = out['calibration_over_forward']
  assert calibration['tflops'] == 0.8 and calibration['fraction_of_peak'] == 0.75
  text = encoder_bench.table(rows)
  assert 'skipped: x' in text and '0.2250' in text


def test_time_calls_measures_the_peak_beside_each_call():
  peaks = iter([1.0, 3.0, 2.0])
  result, out = harness.time_calls(lambda: 7, lambda x: x, 3, lambda: next(peaks))
  assert out == 7 and result['peak_tflops_per_s'] == 2.0  # the median of the three
  assert harness.matmul_peak('float32', 64)() > 0


def test_ratios_against_the_hf_row_and_a_failed_workers_error_line():
  """`hf_over_this` is HF's seconds over the row's at the same settings (none without an HF row
  there, none on the HF row itself); a failed worker's error is its exception's line."""
  rows = [dict(impl='hf', length=4096, heads=4, seconds=3.0),
          dict(impl='blockwise', length=4096, heads=4, seconds=1.2),
          dict(impl='blockwise', length=8192, heads=4, seconds=4.0),
          dict(impl='reference', length=4096, heads=4, error='timeout after 60 s')]
  harness.add_ratios(rows, harness.hf_base(rows, ('length', 'heads')), 'hf_over_this')
  assert [r.get('hf_over_this') for r in rows] == [None, 2.5, None, None]
  stderr = ('Traceback (most recent call last):\n  File "x.py", line 1\n'
            'jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: 2.0G\n'
            '--------------------\nFor simplicity, JAX has removed its internal frames.\n')
  assert harness.error_line(stderr) == 'jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: 2.0G'
  assert harness.error_line('killed\n') == 'killed' and harness.error_line('') == '?'


@pytest.mark.bench
def test_calibration_stability_runs_the_demos_calibration(capsys):
  """Two sampling seeds of the demo's per-task calibration at one length, through the demo's
  library (`t5align.demo`'s planning, inputs and temperatures), as the benchmark reports them."""
  calibration_stability.main(['--num_samples', '1', '--seeds', '2', '--strategies', 'pmax',
                              '--lengths', '512', '--num_references', '2'])
  [row] = json.loads(capsys.readouterr().out)['rows']
  assert row['seeds'] == [7, 8] and row['prompts_per_length'] == {'512': 1}
  assert row['num_references'] == 2
  assert set(row['tasks']) == {'lines', 'kv'}
  for task in ('lines', 'kv'):
    cell = row['tasks'][task]['pmax']['512']
    assert len(cell['taus']) == 2 and cell['stable'] == (cell['spread'] == 0.0), cell


def test_preflight_table_markdown_sets_implementations_side_by_side():
  """Two written-out rows of one slice: blockwise (older, no `code`) and the fused kernel; a
  slice with neither is left out, a missing twin reads 'not run', every line has the header's
  cells."""
  def row(gib, tflops, gb, seconds, code=None):
    report = {'memory_per_chip': {'total': gib * 2**30},
              'target': {'chip': {'generation': 'v5e'}},
              'per_unit': {'flops': tflops * 1e12, 'bytes_accessed': gb * 1e9,
                           'roofline_seconds': seconds}}
    return {'report': report, **({'code': code} if code else {})}
  results = {'xxl-32768-v5litepod-16-eval-blockwise': row(6.34, 811.2, 64950, 4.96),
             'xxl-32768-v5litepod-16-eval-pallas': row(6.31, 793.6, 5611, 0.428, 'abc1234'),
             'xxl-32768-v4-32-calibration-blockwise': row(20.0, 1.0, 2.0, 3.0, 'abc1234')}
  lines = preflight_table.markdown(results, with_estimate=False).splitlines()
  table = [line for line in lines if line.startswith('|')]
  assert len(table) == 4 and all(line.count('|') == table[0].count('|') for line in table)
  assert table[2] == ('| XXL | 32k | v4-32 | calibration | 20.00 (no) | 1 | 2 | 3 | '
                      'not run |  |  |  |')
  assert table[3] == ('| XXL | 32k | v5litepod-16 | eval | 6.34 ° | 811.2 | 6.495e+04 | 4.96 | '
                      '6.31 | 793.6 | 5611 | 0.428 |')
  assert any(line.startswith('°: measured with older code') for line in lines)


@pytest.mark.bench
@pytest.mark.torch
def test_lm_eval_bench_smoke_rows_answer_as_hf_does(capsys):
  """The smoke run (384 tokens, 4 prompts): every t5align row gave the hf row's answers, on
  the same exported checkpoint, with its speedup and its program count."""
  pytest.importorskip('lm_eval')
  pytest.importorskip('torch')
  from benchmarks import lm_eval_bench  # pylint: disable=g-import-not-at-top
  document = lm_eval_bench.main(['--smoke'])
  rows = document['rows']
  assert [(r['impl'], r['kind']) for r in rows] == [
      ('t5align', 'mc'), ('hf', 'mc'), ('t5align', 'gen'), ('hf', 'gen')]
  assert all('error' not in r for r in rows), rows
  for row in rows:
    assert row['requests'] == (16 if row['kind'] == 'mc' else 4)
    if row['impl'] == 't5align':
      assert row['same_responses_as_hf'] and row['speedup'] > 0 and row['programs'] >= 1, row
  assert json.loads(capsys.readouterr().out)['benchmark'] == 'lm_eval'
