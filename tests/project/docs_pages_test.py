"""benchmarks/docs_pages.py: the committed performance pages are what it writes from
benchmarks/results/*.json, and its tables render a results file's rows as written out here."""
from __future__ import annotations

import collections
import decimal
import json

from benchmarks import docs_pages


def test_committed_pages_are_the_generators_output():
  written = docs_pages.pages()
  assert sorted(written) == ['cpu.md', 'gpu.md', 'tpu.md']
  for name, text in written.items():
    committed = (docs_pages.PAGES / name).read_text(encoding='utf-8')
    assert committed == text, (f'docs/performance/{name} differs from its results: run '
                               '`python -m benchmarks.docs_pages`')


def test_check_names_the_page_that_differs(tmp_path):
  written = {'cpu.md': 'a\n', 'gpu.md': 'b\n', 'tpu.md': 'c\n'}
  for name, text in written.items():
    (tmp_path / name).write_text(text, encoding='utf-8')
  assert docs_pages.stale(written, tmp_path) == []
  (tmp_path / 'gpu.md').write_text('b, edited by hand\n', encoding='utf-8')
  (tmp_path / 'tpu.md').unlink()
  assert docs_pages.stale(written, tmp_path) == ['gpu.md', 'tpu.md']


def _row(impl: str, length: int, seconds: float, tflops: float, fraction: float,
         peak_bytes: int, **extra) -> dict:
  return dict(kind='forward', impl=impl, length=length, seconds=seconds, tflops_per_s=tflops,
              fraction_of_peak=fraction, peak_bytes=peak_bytes, **extra)


def test_cpu_forward_table_from_a_small_results_file(tmp_path):
  rows = [
      _row('blockwise', 1024, 0.31713, 0.1625, 0.978, 998801408),
      _row('hf', 1024, 0.40684, 0.1267, 0.732, 1253068800, hf_attention='sdpa'),
      _row('blockwise', 16384, 117.61403, 0.1227, 0.721, 2113003520),
      {'kind': 'forward', 'impl': 'hf', 'length': 16384, 'hf_attention': 'sdpa',
       'skipped': 'HF at 16384 tokens would take about 358 s per call (quadratic), and would '
                  'need about 56 GB (quadratic)'},
      dict(_row('blockwise', 2048, 10.25437, 0.1382, 0.838, 1040437248), kind='calibration',
           pmax=[0.1] * 11),
      dict(_row('hf', 2048, 39.91311, 0.0355, 0.219, 1208885248), kind='calibration',
           hf_attention='eager', pmax=[0.1] * 11),
  ]
  (tmp_path / 'encoder_cpu.json').write_text(json.dumps({'rows': rows}), encoding='utf-8')
  doc = docs_pages.load('encoder_cpu', tmp_path)
  assert docs_pages.cpu_forward_table(doc) == '\n'.join([
      '| encoder forward | t5align blockwise | HF sdpa | HF / blockwise |',
      '|---|---|---|---|',
      '| 1k | 0.317 s, 0.163 (0.98), 1.00 GB | 0.407 s, 0.127 (0.73), 1.25 GB | 1.28x |',
      '| 16k | 117.6 s, 0.123 (0.72), 2.11 GB | skipped: about 358 s and 56 GB extrapolated '
      '| - |',
      '| calibration, 11 taus, 2k | 10.3 s, 0.138 (0.84), 1.04 GB | 39.9 s, 0.035 (0.22), '
      '1.21 GB (eager, 11 passes) | 3.89x |',
  ])


def test_gpu_table_keeps_the_digits_its_source_wrote(tmp_path):
  document = '''{"sources": {"gpu_check_1c24469": {"what": "gpu_check", "date": "2026-11-27",
    "commit": "1c24469", "machine": "one NVIDIA H200", "versions": {"jax": "0.11.2"}}},
   "attention": [
    {"source": "gpu_check_1c24469", "impl": "pallas_mgpu", "length": 4096, "ms": 0.98,
     "tflops_per_s": 140},
    {"source": "gpu_check_1c24469", "impl": "cudnn_bias", "length": 16384, "ms": 20.0,
     "note": "16 GiB bias"},
    {"source": "elsewhere", "impl": "blockwise", "length": 4096, "ms": 5.54}]}'''
  (tmp_path / 'gpu_h200.json').write_text(document, encoding='utf-8')
  doc = docs_pages.load('gpu_h200', tmp_path)
  assert docs_pages.gpu_table(doc, 'attention', 'gpu_check_1c24469') == '\n'.join([
      'From `benchmarks/results/gpu_h200.json` (source "gpu_check, before the dispatch '
      'change"), measured on 2026-11-27 at commit 1c24469 on one NVIDIA H200; jax 0.11.2.',
      '',
      '| tokens | `pallas_mgpu` (`pallas` on Hopper) | cuDNN reading a materialized '
      '`[1, h, L, L]` bias |',
      '|---|---|---|',
      '| 4,096 | 0.98 ms (140 TFLOP/s) | - |',
      '| 16,384 | - | 20.0 ms, 16 GiB bias |',
  ])


def test_each_h200_orientation_figure_names_one_row():
  """gpu_report.KNOWN_H200 takes the figures marked `orientation`: one per gpu_check row id."""
  with open(docs_pages.RESULTS / 'gpu_h200.json', encoding='utf-8') as f:
    document = json.load(f, parse_float=decimal.Decimal)
  ids = collections.Counter(row['id'] for rows in document.values() if isinstance(rows, list)
                            for row in rows if row.get('orientation'))
  assert ids and max(ids.values()) == 1, ids
  sources = {row['source'] for rows in document.values() if isinstance(rows, list)
             for row in rows}
  assert sources <= set(document['sources']) == set(docs_pages.SOURCE_NAMES)


def test_lm_eval_table_from_a_small_results_file():
  """lm_eval_bench's rows become one line per task and length: each backend's requests per
  second with its seconds, t5align's speedup, whether they answered alike, its programs."""
  rows = [dict(impl='t5align', kind='mc', length=8192, requests=16, seconds=11.287,
               first_s=13.368, requests_per_s=1.418, speedup=15.709, same_responses_as_hf=True,
               programs=2),
          dict(impl='hf', kind='mc', length=8192, requests=16, seconds=177.31, first_s=177.31,
               requests_per_s=0.09)]
  assert docs_pages.lm_eval_table({'rows': rows}).splitlines()[2] == (
      '| 4-way multiple choice | 8k | 16 | 1.42 (11.3 s; first call 13.4 s) | 0.09 (177.3 s) | '
      '15.7x | yes | 2 |')
