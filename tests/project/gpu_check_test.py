"""benchmarks/gpu_check.py with its plan, report and rows modules: its smoke mode end to end
(every row kind, parity to float32 rounding), and its GPU plan, budget, worker time limit
(harness.Worker), ratios (harness.add_ratios) and table without a GPU."""
from __future__ import annotations

import importlib.util
import json
import sys

import jax
import numpy as np
import pytest

from benchmarks import encoder_bench
from benchmarks import gpu_check
from benchmarks import gpu_plan
from benchmarks import gpu_report
from benchmarks import harness

pytestmark = pytest.mark.newest_jax

F32 = gpu_plan.TOLERANCE['float32']
# A Hopper GPU's: 'pallas' is 'pallas_mgpu', and the Triton kernel is timed beside it.
GPU_ENV = {'backend': 'gpu', 'fused': 'pallas_mgpu', 'kernels': ['pallas_gpu', 'pallas_mgpu']}


def _torch_missing():
  missing = [n for n in ('torch', 'transformers') if importlib.util.find_spec(n) is None]
  return f'{missing[0]} not installed' if missing else None


@pytest.mark.bench
def test_smoke_run_has_every_row_kind_checked_to_float32_rounding(tmp_path, capsys):
  """One `--smoke` run (CPU, tiny shapes, the Pallas kernels in interpret mode): exit status 0,
  at most 8 files, every group's rows run (cuDNN's skipped, saying why) and each timed row's
  parity check agrees to float32 rounding; the JSON and the table are printed."""
  status = gpu_check.main(['--smoke', '--output_dir', str(tmp_path)])
  printed = capsys.readouterr().out
  assert status == 0, printed[-3000:]
  files = sorted(p.name for p in tmp_path.iterdir())
  assert len(files) <= 8 and {'results.json', 'table.md', 'log.txt', 'pytest.txt'} <= set(files)
  document = json.loads((tmp_path / 'results.json').read_text())
  assert document['mode'] == 'smoke' and document['failures'] == [], document['failures']
  rows = {row['id']: row for row in document['rows']}

  tests = rows['tests']
  assert tests['status'] == 'ok' and tests['passed'] > 0, tests
  assert tests['failed'] == tests['errors'] == 0 and tests['jax_platforms'] == 'cpu', tests

  ran = lambda group: {r['impl'] for r in rows.values()
                       if r['group'] == group and r['status'] == 'ok'}
  assert ran('attention') == {'reference', 'blockwise', 'pallas_gpu', 'pallas', 'xla_nobias',
                              'xla_bias'}
  cudnn = [r for r in rows.values() if r.get('impl', '').startswith('cudnn')]
  assert cudnn and all(r['status'] == 'skipped' and r['reason'].startswith('cudnn: no GPU')
                       for r in cudnn)
  assert ran('encoder') == {'blockwise', 'pallas_gpu'} and ran('sweep') == {'blockwise',
                                                                              'reference'}
  assert ran('xxl') == ran('decode') == {'blockwise'}
  hf = [r for r in rows.values() if r['group'] == 'hf']
  assert {r['kind'] for r in hf} == {'hf_encoder', 'hf_generate'}
  if _torch_missing():
    assert all(r['status'] == 'skipped' and r['reason'] == _torch_missing() for r in hf), hf
  else:
    assert all(r['status'] == 'ok' for r in hf), hf

  timed = [r for r in rows.values() if r['status'] == 'ok' and r['kind'] != 'tests']
  for row in timed:
    assert row['seconds'] > 0 and row['first_call_s'] > 0 and row['device'], row
    if row['group'] != 'hf':  # XLA's figures, and which jax made them.
      assert row['xla_memory']['argument_bytes'] > 0 and row['versions']['jax'], row
    parity = row['parity']
    assert 'error' not in parity and parity.get('ok') is not False, (row['id'], parity)
    assert parity.get('all_finite', True), (row['id'], parity)
    assert parity.get('out_rel_err', 0) <= F32['out'], (row['id'], parity)
    assert parity.get('pmax_max_abs_err', 0) <= F32['pmax'], (row['id'], parity)
    assert parity.get('entropy_max_abs_err', 0) <= F32['entropy'], (row['id'], parity)
  # Checked against a base on the same inputs, not only finite: every attention row but the
  # base and the floor, and the model rows ('blockwise' against 'reference' with the same
  # weights, the GPU kernel against 'blockwise' on the same tokens).
  for row_id in ('attention/blockwise/128', 'attention/pallas_gpu/128', 'attention/pallas/128',
                 'attention/xla_bias/128', 'attention/xla_bias/256', 'encoder/smoke/blockwise/128',
                 'encoder/smoke/pallas_gpu/128', 'xxl/smoke/blockwise/128'):
    assert rows[row_id]['parity']['out_rel_err'] < 1e-5, rows[row_id]
  assert rows['encoder/smoke/blockwise/128']['parity']['vs'] == 'reference'
  padded = rows['attention/pallas_gpu/128']['parity']['padded_batch_vs_reference']
  assert padded['out_rel_err'] < 1e-5 and padded['pmax_max_abs_err'] < 1e-5, padded
  assert rows['encoder/smoke/blockwise/256']['parity']['checked_at'] == 128
  sweep = rows['sweep/smoke/reference/128']
  assert len(sweep['pmax']) == 11 and sweep['parity']['pmax_max_abs_err'] < 1e-5, sweep
  decode = rows['decode/smoke/blockwise/128']
  assert decode['parity']['argmax_tokens'] == len(decode['output_tokens']) == 16, decode
  assert decode['parity']['largest_relative_gap'] <= 1e-5, decode
  assert rows['attention/pallas_gpu/128']['ratio'] > 0  # xla_nobias / this.

  table = (tmp_path / 'table.md').read_text().strip()
  assert printed.rstrip().endswith(table) and table.count('\n') == len(rows) + 1
  assert all(f'| {row_id} |' in table for row_id in rows)
  printed_rows = json.loads(printed[:printed.index('\n| row |')])['rows']
  assert [r['id'] for r in printed_rows] == list(rows)


def test_gpu_plan_names_every_row_and_skips_with_reasons():
  """The GPU run's rows, planned without a GPU: lengths per implementation, parity bases, ratio
  partners, the H200 figures' rows, and the reasons of rows that will not run."""
  rows = {r['id']: r for r in gpu_plan.plan_rows(gpu_plan.GPU_PLAN, GPU_ENV)}
  assert all(r['status'] == 'pending' for r in rows.values())
  assert set(gpu_report.KNOWN_H200) <= set(rows)  # Every orientation figure names a row.
  attention = {i for i in rows if i.startswith('attention/')}
  assert attention == {f'attention/{impl}/{n}' for n in (4096, 16384, 32768)
                       for impl in ('blockwise', 'pallas', 'pallas_gpu', 'cudnn_nobias')} | {
                           'attention/reference/4096', 'attention/cudnn_bias/4096',
                           'attention/cudnn_bias/16384'}
  assert rows['attention/pallas/4096']['base'] == 'reference'
  assert [i for i, r in rows.items() if r.get('check_padded')] == [
      'attention/pallas/4096', 'attention/pallas_gpu/4096']
  assert rows['attention/pallas/32768']['base'] == 'blockwise'
  assert rows['attention/pallas/16384']['compare_to']['id'] == 'attention/cudnn_nobias/16384'
  assert (rows['attention/pallas/16384']['heads'], rows['attention/pallas/16384']['dtype']) == (
      32, 'bfloat16')
  assert {'encoder/xl/pallas/15000', 'encoder/xl/blockwise/4096', 'xxl/xxl/pallas/32768',
          'encoder/xl/pallas_gpu/15000', 'sweep/xl/pallas_gpu/15000',
          'sweep/xl/pallas/15000', 'decode/xl/pallas/15000', 'hf/xl/sdpa/15000',
          'hf_generate/xl/eager/15000'} <= set(rows)
  assert rows['encoder/xl/pallas/15000']['compare_to']['id'] == 'hf/xl/eager/15000'
  assert rows['decode/xl/pallas/15000']['compare_to']['id'] == 'hf_generate/xl/eager/15000'
  assert rows['sweep/xl/pallas/15000']['compare_to']['factor'] == 11
  # Without torch, or outside --groups: skipped, saying so.
  rows = gpu_plan.plan_rows(gpu_plan.GPU_PLAN, GPU_ENV, 'torch not installed',
                             groups=('tests', 'hf'))
  for row in rows:
    if row['group'] == 'hf':
      assert (row['status'], row['reason']) == ('skipped', 'torch not installed')
    elif row['group'] != 'tests':
      assert row['status'] == 'skipped' and '--groups' in row['reason'], row
  # A further fused kernel for the platform (e.g. a Mosaic GPU one) is timed beside 'pallas'
  # at every length, and checked on the padded batch too.
  more = gpu_plan.plan_rows(gpu_plan.GPU_PLAN, dict(GPU_ENV, kernels=['pallas_gpu', 'other']))
  assert [(r['id'], r['check_padded']) for r in more if r.get('impl') == 'other'] == [
      ('attention/other/4096', True), ('attention/other/16384', False),
      ('attention/other/32768', False)]
  assert gpu_plan.batches(()) == [(g,) for g in gpu_plan.GROUPS]
  assert gpu_plan.batches(gpu_plan.SMOKE_BATCHES) == [
      ('tests',), ('attention', 'encoder', 'sweep', 'xxl', 'decode'), ('hf',)]


@pytest.mark.bench
def test_spent_budget_skips_the_groups_with_the_reason(tmp_path, capsys):
  status = gpu_check.main(['--smoke', '--budget_s', '1', '--output_dir', str(tmp_path)])
  capsys.readouterr()
  document = json.loads((tmp_path / 'results.json').read_text())
  assert status == 0 and document['rows'], document
  for row in document['rows']:
    assert row['status'] == 'skipped', row
    if not row.get('impl', '').startswith('cudnn') and (row['group'] != 'hf'
                                                        or not _torch_missing()):
      assert row['reason'].startswith('the budget (--budget_s 1) was spent'), row


@pytest.mark.slow
def test_a_worker_past_its_time_limit_keeps_what_it_sent(tmp_path):
  updates = []
  worker = (f'import json, time; print({harness.MARK!r} + json.dumps({{"id": "a", "x": 1}}), '
            'flush=True); time.sleep(60)')
  with open(tmp_path / 'log.txt', 'a') as log:
    why = harness.stream([sys.executable, '-c', worker], {}, 3, log, updates.append)
  assert why == 'stopped at its time limit of 3 s' and updates == [{'id': 'a', 'x': 1}]
  with open(tmp_path / 'log.txt', 'a') as log:
    why = harness.stream([sys.executable, '-c', 'import sys; sys.exit(3)'], {}, 30, log,
                           updates.append)
  assert why == 'worker exited with status 3'


def test_failures_ratios_and_table():
  """A failed parity check, an error and failed tests are failures; ratios take the named row's
  seconds; skipped rows show their reason."""
  rows = [
      dict(id='tests', group='tests', kind='tests', status='ok', passed=3, failed=1, errors=0,
           skipped=0, seconds=2.0, failures=['tests/x_test.py::test_y']),
      dict(id='attention/pallas/4096', group='attention', kind='attention', impl='pallas',
           status='ok', seconds=0.002, tflops_per_s=69.0,
           xla_memory=dict(temp_bytes=2**20, argument_bytes=3 * 2**30, output_bytes=0),
           peak_bytes=2**31, peak_set_by_this_row=False,
           parity=dict(vs='reference', out_rel_err=0.5, ok=False),
           compare_to=dict(id='attention/cudnn_nobias/4096', label='cudnn_nobias / this',
                           factor=1)),
      dict(id='attention/cudnn_nobias/4096', group='attention', kind='attention',
           impl='cudnn_nobias', status='ok', seconds=0.0005, parity=dict(all_finite=True)),
      dict(id='encoder/xl/pallas/4096', group='encoder', kind='encoder', impl='pallas',
           status='error', reason='XlaRuntimeError: RESOURCE_EXHAUSTED'),
      dict(id='hf/xl/eager/4096', group='hf', kind='hf_encoder', impl='eager',
           status='skipped', reason='torch not installed'),
  ]
  harness.add_ratios(rows, harness.named_base(rows))
  assert rows[1]['ratio'] == 0.25 and 'ratio' not in rows[2]
  failures = gpu_report.failures(rows)
  assert len(failures) == 3 and failures[0].startswith('tests: 1 failed')
  assert failures[1].startswith('attention/pallas/4096: parity rel 5.0e-01, vs reference')
  assert failures[2] == ('encoder/xl/pallas/4096: error: XlaRuntimeError: RESOURCE_EXHAUSTED')
  lines = gpu_report.table(rows).splitlines()
  assert len(lines) == 2 + len(rows) and all(line.count('|') == 9 for line in lines)
  assert lines[3] == ('| attention/pallas/4096 | ok | 2 ms | 69 | XLA temp 1.0 MiB + args 3.00 '
                      'GiB; peak <= 2.00 GiB | rel 5.0e-01, vs reference, FAILED | 0.25 '
                      '(cudnn_nobias / this) | 0.98 ms |')
  assert '| skipped: torch not installed |' in lines[6]


@pytest.mark.slow
def test_random_params_drawn_on_the_device_match_numpys_tree_and_scale():
  """The GPU run draws the weights with jax.random (`on_device`): the same tree, dtypes and
  scales as the numpy draw the CPU rows use."""
  config = encoder_bench.model_config({'model': 'smoke', 'dtype': 'float32', 'impl': 'blockwise'})
  draw = lambda **kw: encoder_bench.random_params(config, config.dtype, ('encoder',), **kw)
  on_device, on_host = draw(on_device=True), draw()
  leaves = jax.tree_util.tree_leaves_with_path(on_device)
  assert jax.tree.structure(on_device) == jax.tree.structure(on_host)
  for (path, a), b in zip(leaves, jax.tree.leaves(on_host)):
    assert (a.shape, a.dtype) == (b.shape, b.dtype), path
    if a.size >= 4096:  # The standard deviation of a large draw, within 10%.
      np.testing.assert_allclose(np.std(a), np.std(b), rtol=0.1, err_msg=str(path))
