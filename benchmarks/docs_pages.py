"""The performance pages, docs/performance/{cpu,gpu,tpu}.md, written from benchmarks/results/*.json.

Run from the repository root:
  python -m benchmarks.docs_pages            # write the three pages
  python -m benchmarks.docs_pages --check    # exit 1, naming each page that differs

Every figure in a table is read from a results file (rounded for the table, or, for the GPU
file, whose figures were copied from what their sources state, printed with the digits written
there); each table states once where its figures come from: the file and the machine, commit,
date and versions it records (`provenance`; the GPU file's `sources`). The prose around the tables
(what was measured, how, the caveats) is fixed text here. The pre-flight table is
`preflight_table.markdown`, with each row's `memory.estimate` ratio as the row recorded it.
"""
from __future__ import annotations

import argparse
import decimal
import json
import math
import pathlib
import re
import sys
import textwrap
from typing import Iterable, Sequence

from benchmarks import encoder_bench
from benchmarks import preflight_table

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / 'benchmarks' / 'results'
PAGES = REPO / 'docs' / 'performance'
GiB = 2**30
GENERATED = ('<!-- Written by `python -m benchmarks.docs_pages` from benchmarks/results/*.json:\n'
             '     edit those or the script, not this page. -->')
LIST_START = re.compile(r'([-+*#]|\d+[.)])( |$)')  # What would start a list or heading.

# ------------------------------------------------------------------------------------ helpers


def load(name: str, results: pathlib.Path = RESULTS) -> dict:
  """benchmarks/results/NAME.json; the GPU file's numbers as decimals (their written digits)."""
  with open(results / f'{name}.json', encoding='utf-8') as f:
    return json.load(f, parse_float=decimal.Decimal if name == 'gpu_h200' else float)


def table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
  """A Markdown table ('|' inside a cell escaped)."""
  line = lambda cells: '| ' + ' | '.join(str(c).replace('|', '\\|') for c in cells) + ' |'
  return '\n'.join([line(head), '|' + '---|' * len(head)] + [line(r) for r in rows])


def provenance(file: str, p: dict, source: str | None = None) -> str:
  """One sentence: the results file, its command (or source), and the date, commit, machine and
  versions its provenance records ('not recorded' for what it lacks), and how it timed."""
  when = f'on {p["date"]}' if p.get('date') else 'on a date not recorded'
  commit = (f'at commit {p["commit"]}' if p.get('commit') else
            f'at a commit not recorded ({p["code"]})' if p.get('code') else
            'at a commit not recorded')
  machine = f'on {p["machine"]}' if p.get('machine') else 'on a machine not recorded'
  versions = p.get('versions')
  parts = [f'measured {when} {commit} {machine}',
           ', '.join(f'{k} {v}' for k, v in versions.items()) if versions else
           'versions not recorded'] + ([p['timing']] if p.get('timing') else [])
  what = (f' (source "{source}")' if source else
          f' (`{p["command"]}`)' if p.get('command') else '')
  return f'From `benchmarks/results/{file}`{what}, ' + '; '.join(parts) + '.'


def reflow(page: str, width: int = 100) -> str:
  """The page's paragraphs and list items filled to `width` (headings, tables and comments kept
  as they are), no line but a paragraph's first starting like a list item or a heading."""
  blocks = []
  for block in page.split('\n\n'):
    if block.startswith(('#', '|', '<!--')):
      blocks.append(block)
      continue
    items = re.split(r'\n(?=- )', block) if block.startswith('- ') else [block]
    filled = []
    for item in items:
      lead = '  ' if item.startswith('- ') else ''
      for w in range(width, width - 20, -1):
        text = textwrap.fill(' '.join(item.split()), w, subsequent_indent=lead,
                             break_long_words=False, break_on_hyphens=False)
        if not any(LIST_START.match(line.strip()) for line in text.split('\n')[1:]):
          break
      filled.append(text)
    blocks.append('\n'.join(filled))
  return '\n\n'.join(blocks)


def seconds(x: float) -> str:
  """Three significant figures, at least one decimal: 0.317, 1.24, 31.4, 117.6."""
  return f'{x:.{max(1, 2 - math.floor(math.log10(x)))}f}'


def gigabytes(n: float) -> str:
  """Bytes in GB, three significant figures, at most two decimals: 0.93, 1.00, 14.1."""
  x = n / 1e9
  return f'{x:.{max(0, min(2, 2 - math.floor(math.log10(x))))}f}'


def sci(x: float, digits: int = 2) -> str:
  """1.0e-6, 9.23e13: scientific notation without the exponent's '+' and leading zeros."""
  mantissa, exponent = f'{x:.{digits - 1}e}'.split('e')
  return f'{mantissa}e{int(exponent)}'


def kilo(length: int) -> str:
  return f'{length // 1024}k'


# ---------------------------------------------------------------------------------------- CPU


def cpu_cell(row: dict) -> str:
  """Seconds, TFLOP/s (fraction of the peak measured beside it), peak RSS; or why not run."""
  if 'skipped' in row:
    time = re.search(r'about (\S+ s) ', row['skipped'])
    memory = re.search(r'about (\S+ GB) ', row['skipped'])
    return (f'skipped: about {time[1]} and {memory[1]} extrapolated' if time and memory else
            'not run')
  cell = (f'{seconds(row["seconds"])} s, {row["tflops_per_s"]:.3f} '
          f'({row["fraction_of_peak"]:.2f}), {gigabytes(row["peak_bytes"])} GB')
  if row['impl'] == 'hf' and row['kind'] == 'calibration':
    cell += f' ({row["hf_attention"]}, {len(row["pmax"])} passes)'
  return cell


def cpu_label(row: dict) -> str:
  if row['kind'] == 'calibration':
    return f'calibration, {len(row["pmax"])} taus, {kilo(row["length"])}'
  return kilo(row['length'])


def cpu_forward_table(doc: dict) -> str:
  """encoder_bench's forward and calibration rows: one line per kind and length, one column per
  implementation, and HF's time over blockwise's."""
  rows = [r for r in doc['rows'] if r['kind'] in ('forward', 'calibration')]
  impls = list(dict.fromkeys(r['impl'] for r in rows))
  hf = next((r['hf_attention'] for r in rows if r['impl'] == 'hf' and r['kind'] == 'forward'),
            '')
  head = (['encoder forward'] + [f'HF {hf}' if i == 'hf' else f't5align {i}' for i in impls]
          + ['HF / blockwise'])
  lines = []
  for kind, length in dict.fromkeys((r['kind'], r['length']) for r in rows):
    by_impl = {r['impl']: r for r in rows if (r['kind'], r['length']) == (kind, length)}
    ratio = '-'
    mine, theirs = by_impl.get('blockwise', {}), by_impl.get('hf', {})
    if 'seconds' in mine and 'seconds' in theirs:
      ratio = f'{theirs["seconds"] / mine["seconds"]:.2f}x'
    lines.append([cpu_label(next(iter(by_impl.values())))]
                 + [cpu_cell(by_impl[i]) if i in by_impl else '-' for i in impls] + [ratio])
  return table(head, lines)


def cpu_skipped(doc: dict) -> str:
  """The skipped rows' reasons as the run wrote them, one item per implementation and reason."""
  reasons: dict[tuple[str, str], list[str]] = {}
  for row in doc['rows']:
    if 'skipped' in row:
      impl = f'HF {row["hf_attention"]}' if row['impl'] == 'hf' else f't5align {row["impl"]}'
      reasons.setdefault((impl, row['skipped']), []).append(cpu_label(row))
  return '\n'.join(f'- {impl} at {", ".join(labels)}: "{reason}"'
                   for (impl, reason), labels in reasons.items())


def cpu_check_table(doc: dict) -> str:
  """Each t5align row's check against 'reference' (`check_vs_reference`)."""
  lines = []
  for row in doc['rows']:
    check = row.get('check_vs_reference')
    if check:
      error = lambda key: sci(check[key]) if key in check else '-'
      lines.append([cpu_label(row), row['impl'], kilo(check['length']), error('out_rel_err'),
                    error('pmax_max_abs_err'), error('entropy_max_abs_err'),
                    'yes' if check['all_finite'] else 'no'])
  return table(['row', 't5align', 'checked at', 'output, relative error', 'P_max, largest error',
                'entropy, largest error', 'all finite'], lines)


def cpu_summary_tables(doc: dict) -> str:
  """The JSON's `summary`: forward throughput over its mean at the base lengths, and each
  sweep's over the forward at its length."""
  summary = doc['summary']
  base = ' and '.join(kilo(n) for n in encoder_bench.BASE_LENGTHS)
  forward = table(['forward, t5align', 'tokens', f'TFLOP/s over its mean at {base}',
                   'fraction of peak over its mean'],
                  [[r['impl'], kilo(r['length']), f'{r["tflops"]:.2f}',
                    f'{r["fraction_of_peak"]:.2f}'] for r in summary['forward_over_base']])
  sweep = table(['calibration sweep', 'tokens', 'TFLOP/s over the forward\'s',
                 'fraction of peak over the forward\'s'],
                [[f'HF ({_hf_attention(doc, "calibration")})' if r['impl'] == 'hf' else
                  f't5align {r["impl"]}', kilo(r['length']), f'{r["tflops"]:.2f}',
                  f'{r["fraction_of_peak"]:.2f}'] for r in summary['calibration_over_forward']])
  return forward + '\n\n' + sweep


def _hf_attention(doc: dict, kind: str) -> str:
  return next(r['hf_attention'] for r in doc['rows'] if r['impl'] == 'hf' and r['kind'] == kind)


def cpu_decode_table(doc: dict) -> str:
  """encoder_bench's decode rows: per further token, one token, all of them, peak RSS."""
  how = {'cached': 'projected once into the cache (`decoding.greedy`)',
         'per_step': "projected at every step (t5x's way)"}
  rows = [r for r in doc['rows'] if r['kind'] == 'decode']
  tokens = encoder_bench.DECODE_TOKENS
  return table(['input tokens', 'cross-attention keys / values', 's per further token',
                '1 token, s', f'{tokens} tokens, s', 'peak RSS'],
               [[kilo(r['length']), how.get(r['cross_kv'], r['cross_kv']),
                 seconds(r['seconds_per_token']), seconds(r['tokens_1']['seconds']),
                 seconds(r['tokens_16']['seconds']), f'{gigabytes(r["peak_bytes"])} GB']
                for r in rows])


LM_EVAL_KINDS = {'mc': '4-way multiple choice', 'gen': 'generation, at most 16 tokens'}


def lm_eval_table(doc: dict) -> str:
  """lm_eval_bench's rows: per task and length, each backend's requests per second (seconds
  inside its request methods), t5align's speedup, whether both answered alike, and the programs
  t5align compiled."""
  rows = doc['rows']
  out = []
  for ours in (r for r in rows if r['impl'] == 't5align'):
    hf = next(r for r in rows if r['impl'] == 'hf' and r['kind'] == ours['kind']
              and r['length'] == ours['length'])
    out.append([LM_EVAL_KINDS[ours['kind']], kilo(ours['length']), ours['requests'],
                f"{ours['requests_per_s']:.3g} ({seconds(ours['seconds'])} s; first call "
                f"{seconds(ours['first_s'])} s)",
                f"{hf['requests_per_s']:.3g} ({seconds(hf['seconds'])} s)",
                f"{ours['speedup']:.3g}x", 'yes' if ours['same_responses_as_hf'] else 'no',
                ours['programs']])
  return table(['task', 'context', 'requests', 't5align: requests/s (seconds)',
                'hf: requests/s (seconds)', 't5align / hf', 'same answers', 'programs'], out)


def cpu_page(doc: dict, lm_eval: dict) -> str:
  peaks = [r for r in doc['rows'] if r['kind'] == 'peak']
  size = peaks[0]['peak_size']
  timed = next(r for r in doc['rows'] if 'baseline_rss_bytes' in r)
  about = provenance('encoder_cpu.json', doc['provenance'])
  tokens = encoder_bench.DECODE_TOKENS
  return f"""# Performance on a CPU

{GENERATED}

What t5align's encoder costs on a CPU, beside HuggingFace's PyTorch T5 doing the same work in the
same run, and what its lm-eval model answers per second beside lm-eval's own hf backend. The
tables are read from `benchmarks/results/encoder_cpu.json` and `lm_eval_cpu.json`; the
[GPU](gpu.md) and [TPU](tpu.md) pages are written the same way.

## How it was measured

`python -m benchmarks.encoder_bench --preset cpu` runs T5 1.1 small shapes (8 layers, 6 heads x 64,
d_model 512, d_ff 1024, float32, batch 1, random weights): the encoder forward at 1k..32k tokens,
an 11-tau calibration sweep at 2k, and greedy decoding of 16 tokens after 4k and 16k inputs. It
prints one JSON, with HuggingFace PyTorch T5 (sdpa attention; eager for calibration, which needs
the probabilities) doing the same work in the same run, each row in its own process, adjacent in
time. Each row also states its fraction of the machine's own float32 peak: a matmul through XLA
timed in the same process just before it (`fraction_of_peak`). Before a t5align row is timed,
another process checks it against `reference` with the same weights (`check_vs_reference`: above
4k tokens, at 4k). An HF row whose time or memory, extrapolated quadratically from the last one
timed, would pass the preset's limits is skipped and says why. `--lengths 1024 2048
--calibration-lengths --decode-lengths` runs a subset; `python -m benchmarks.attention_bench
--preset cpu-small` times attention alone.

## Encoder forward and the calibration sweep

{about} Each cell: seconds, TFLOP/s (fraction of the peak), peak RSS.

{cpu_forward_table(doc)}

The machine's float32 peak, a {size} x {size} x {size} matmul through XLA, in the run's first and
last `peak` rows: {peaks[0]["tflops_per_s"]:.3f} and {peaks[-1]["tflops_per_s"]:.3f} TFLOP/s.
Rows not run, with the reasons the run gave:

{cpu_skipped(doc)}

HF's calibration row draws its own random weights, so its statistics differ in value from
t5align's (only its time compares). Peak RSS includes the process's
{gigabytes(timed["baseline_rss_bytes"])} GB before the weights ({gigabytes(timed["weights_bytes"])}
GB) exist and the memory of the JAX runtime and compiler.

## Agreement with `reference`

{about}

{cpu_check_table(doc)}

## Throughput over length

{about} The run's `summary`: each forward's TFLOP/s, and its fraction of the peak, over their
mean at the base lengths; and each calibration sweep's over the forward at the same length.
These are one run's ratios; on this machine they move by a few hundredths between runs of the
same preset.

{cpu_summary_tables(doc)}

## Decoding

{about} Greedy decoding of {tokens} tokens by the T5 1.1 small decoder over a random encoder
output of the input's length. The time per further token is the time for {tokens} tokens less
the time for one, over {tokens - 1}; the time for one holds the one-time work (cache set-up, the
cached projections).

{cpu_decode_table(doc)}

The blockwise tile is 256 queries x 512 keys on a CPU and 512 x 512 elsewhere
(`blockwise.default_blocks`; `T5Config.attention_options=(blockwise.Options(block_q=...,
block_k=...),)` overrides it).

## The lm-eval model

{provenance('lm_eval_cpu.json', lm_eval['provenance'])} `python -m benchmarks.lm_eval_bench` runs
lm-eval tasks through `lm_eval.simple_evaluate` with t5align's model and with lm-eval's own hf
backend (seq2seq) on the same checkpoint: the shipped retrieval T5 exported to a HuggingFace
folder, float32, batch size 1, its passkey prompts filled to each length. A multiple-choice
question is 4 loglikelihood requests. Seconds are those spent inside the backends' request
methods; t5align's are its second run's (its first compiles). The hf rows disable the model's
`tie_weights` (in transformers 5 it would tie the shipped model's own output head to its
embedding; see [lm-evaluation-harness](../lm_eval.md)) and bound generation to 16 new tokens
(lm-eval's seq2seq path would let the decoder run to the context's length plus 16). "Same
answers": the responses' hashes are equal (log-likelihoods rounded to 3 decimals).

{lm_eval_table(lm_eval)}
"""


# ---------------------------------------------------------------------------------------- GPU

IMPLS = {
    'pallas_mgpu': '`pallas_mgpu` (`pallas` on Hopper)',
    'pallas_gpu': '`pallas_gpu` (Triton)',
    'blockwise': '`blockwise` (XLA)',
    'reference': '`reference`',
    'cudnn_bias': 'cuDNN reading a materialized `[1, h, L, L]` bias',
    'cudnn_nobias': 'cuDNN flash, no bias (the floor)',
    'torch_sdpa_nobias': 'torch sdpa flash, no bias',
    'torch_sdpa_bias': 'torch sdpa, materialized bias',
    'torch_flex': 'torch FlexAttention, T5 bias as score_mod',
    'hf_eager': 'HF eager',
    'hf_sdpa': 'HF sdpa',
    'hf_flex_attention': 'HF flex_attention',
}
SOURCE_NAMES = {
    'gpu_h200_md': 'GPU-H200.md',
    'gpu_check_1c24469': 'gpu_check, before the dispatch change',
    'gpu_check_dispatch': 'gpu_check, after the dispatch change',
    'attention_bench_tiles': 'attention_bench, tiles',
}


def gpu_cell(row: dict) -> str:
  """A GPU figure as its source wrote it: time (TFLOP/s), XLA's memory, peak, notes."""
  parts = []
  if 'ms' in row or 'seconds' in row:
    parts.append(f'{row["ms"]} ms' if 'ms' in row else f'{row["seconds"]} s')
    if 'tflops_per_s' in row:
      parts[-1] += f' ({row["tflops_per_s"]} TFLOP/s)'
  for key, text in (('xla_temporaries_mib', 'XLA temporaries {} MiB'),
                    ('xla_temporaries_gib', 'XLA temporaries {} GiB'),
                    ('xla_arguments_gib', 'arguments {} GiB'), ('peak_gib', 'peak {} GiB'),
                    ('first_call_s', 'first call {} s'), ('compile_s', 'compile {} s'),
                    ('note', '{}'), ('outcome', '{}')):
    if key in row:
      parts.append(text.format(row[key]))
  return ', '.join(parts)


def gpu_source(doc: dict, source: str) -> str:
  return provenance('gpu_h200.json', doc['sources'][source], SOURCE_NAMES[source])


def gpu_table(doc: dict, section: str, source: str) -> str:
  """One source's rows of a section: a line per length, a column per implementation (and
  variant), each cell as the source wrote it ('-': not measured)."""
  rows = [r for r in doc[section] if r['source'] == source]
  column = lambda r: (r['impl'], r.get('variant'))
  columns = list(dict.fromkeys(column(r) for r in rows))
  head = ['tokens'] + [IMPLS[i] + (f', {v}' if v else '') for i, v in columns]
  lines = []
  for length in dict.fromkeys(r['length'] for r in rows):
    cells = {column(r): gpu_cell(r) for r in rows if r['length'] == length}
    lines.append([f'{length:,}'] + [cells.get(c, '-') for c in columns])
  return gpu_source(doc, source) + '\n\n' + table(head, lines)


def gpu_tiles_table(doc: dict) -> str:
  rows = doc['attention_tiles']
  source = rows[0]['source']
  return gpu_source(doc, source) + '\n\n' + table(
      ['tokens', 'tiles', '`--pallas-configs` entry', 'time'],
      [[f'{r["length"]:,}', r['variant'], f'`{r["pallas_config"]}`' if r['pallas_config'] else
        "`''` (the defaults)", gpu_cell(r)] for r in rows])


def _error(row: dict, key: str) -> str:
  if f'{key}_min' in row:
    return f'{row[f"{key}_min"]:e} .. {row[f"{key}_max"]:e}'
  value = row.get(key)
  if value is None or isinstance(value, str):
    return value or '-'
  return f'{value:e}' if key == 'out_rel_l2' else f'<= {value:e}'  # Statistics: the largest.


def gpu_parity_table(doc: dict, source: str) -> str:
  rows = [r for r in doc['parity'] if r['source'] == source]
  return gpu_source(doc, source) + '\n\n' + table(
      ['kernel', 'against', 'inputs', 'output, relative L2', 'P_max, max abs',
       'entropy, max abs'],
      [[f'`{r["impl"]}`', r['against'], r['inputs'], _error(r, 'out_rel_l2'),
        _error(r, 'pmax_max_abs'), _error(r, 'entropy_max_abs')] for r in rows])


def gpu_tests_table(doc: dict, source: str) -> str:
  rows = [r for r in doc['tests'] if r['source'] == source]
  count = lambda r, k: str(r.get(k, '-'))
  return gpu_source(doc, source) + '\n\n' + table(
      ['tests (`JAX_PLATFORMS=cuda`)', 'passed', 'failed', 'skipped', 'seconds', 'note'],
      [[f'`{r["file"]}`', count(r, 'passed'), count(r, 'failed'), count(r, 'skipped'),
        count(r, 'seconds'), r.get('note', '')] for r in rows])


def gpu_list_table(doc: dict, section: str, source: str, head: Sequence[str],
                   keys: Sequence[str], note: bool = True) -> str:
  """One source's rows of a section, a line each: `keys`' values ('impl' named, 'figures' the
  cell of `gpu_cell`, with the row's note unless `note` is false)."""
  rows = [r for r in doc[section] if r['source'] == source]
  cell = lambda r: gpu_cell(r if note else {k: v for k, v in r.items() if k != 'note'})
  value = lambda r, k: (IMPLS[r['impl']] if k == 'impl' else cell(r) if k == 'figures' else
                        f'{r[k]:,}' if k == 'length' else str(r.get(k, '-')))
  return gpu_source(doc, source) + '\n\n' + table(head, [[value(r, k) for k in keys]
                                                         for r in rows])


def gpu_sources_table(doc: dict) -> str:
  return table(['source', 'what', 'date', 'commit', 'machine', 'versions'],
               [[SOURCE_NAMES[key], s['what'], s['date'], s.get('commit') or 'not recorded',
                 s['machine'], ', '.join(f'{k} {v}' for k, v in s['versions'].items())]
                for key, s in doc['sources'].items()])


def _figure(doc: dict, section: str, source: str, impl: str, length: int) -> decimal.Decimal:
  """The one time of `impl` at `length` in `source`'s rows of `section`."""
  row, = [r for r in doc[section] if (r['source'], r['impl'], r['length']) == (
      source, impl, length)]
  return row['ms'] if 'ms' in row else row['seconds']


def gpu_floor_sentence(doc: dict) -> str:
  """The Hopper kernel's share of cuDNN's no-bias floor, per length, in the same run."""
  source = 'gpu_check_1c24469'
  lengths = [r['length'] for r in doc['attention']
             if (r['source'], r['impl']) == (source, 'pallas_mgpu')]
  shares = [_figure(doc, 'attention', source, 'cudnn_nobias', n)
            / _figure(doc, 'attention', source, 'pallas_mgpu', n) for n in lengths]
  return (f'In that run `pallas_mgpu` runs at {" / ".join(f"{s:.0%}" for s in shares)} of the '
          "speed of cuDNN's flash attention without bias at "
          f'{" / ".join(kilo(n) for n in lengths)} tokens (the floor\'s time over the kernel\'s).')


def gpu_hf_sentence(doc: dict) -> str:
  """The Hopper kernel's XL encoder against HF's, across the two sources (same card, same day)."""
  length = 15000
  mine = _figure(doc, 'encoder', 'gpu_check_1c24469', 'pallas_mgpu', length)
  eager = _figure(doc, 'encoder', 'gpu_h200_md', 'hf_eager', length)
  sdpa = _figure(doc, 'encoder', 'gpu_h200_md', 'hf_sdpa', length)
  return (f'At {length:,} tokens the `pallas_mgpu` encoder took {mine} s against HF eager\'s '
          f'{eager} s ({eager / mine:.0f}x) and HF sdpa\'s {sdpa} s ({sdpa / mine:.0f}x): two runs '
          'on the same kind of card on the same day (HF was not rerun beside the Hopper kernel).')


def gpu_demo_table(doc: dict) -> str:
  rows = doc['demo']
  return gpu_source(doc, rows[0]['source']) + '\n\n' + table(
      ['command', 'wall s', 'setup s', 'calibration s', 'analysis s', 'evaluation s', 'CPU s',
       'cells equal to the CPU run\'s'],
      [[f'`{r["command"]}`', str(r['seconds']), str(r['setup_s']), str(r['calibration_s']),
        str(r['analysis_s']), str(r['evaluation_s']), str(r['cpu_seconds']),
        f'{r["cells_equal"]} of {r["cells"]}'] for r in rows]) + '\n\n' + '\n'.join(
            r['note'] for r in rows)


def gpu_page(doc: dict) -> str:
  setups = doc['setups']
  dates = ', '.join(sorted({s['date'] for s in doc['sources'].values()}))
  jax = ', '.join(sorted({s['versions']['jax'].split()[0] for s in doc['sources'].values()}))
  return f"""# Performance on a GPU

{GENERATED}

t5align on one NVIDIA H200, measured on {dates} with jax {jax}. No run wrote a results file
then: `benchmarks/results/gpu_h200.json` holds the figures as their sources state them, each
naming its source, and the tables below are read from it. Times are as the source wrote them,
TFLOP/s in parentheses. The [CPU](cpu.md) page has the same encoder on a CPU; the [TPU](tpu.md)
page what XLA's TPU compiler says without a TPU.

## Sources

{gpu_sources_table(doc)}

GPU-H200.md's `pallas` was the Triton kernel (`pallas_gpu` here); since the dispatch change,
`pallas` on a Hopper GPU is `pallas_mgpu` for bfloat16 / float16 encoders with head dims a
multiple of 64, else `pallas_gpu`.

## Attention alone

Setup: {setups['attention']}.

{gpu_table(doc, 'attention', 'gpu_check_1c24469')}

{gpu_floor_sentence(doc)}

{gpu_table(doc, 'attention', 'gpu_h200_md')}

With row statistics off, the Triton kernel runs at the same speed (it computes them either way).
Tiles of the Hopper kernel at 16k:

{gpu_tiles_table(doc)}

## Flan-T5-XL encoder

Setup: {setups['encoder']}.

{gpu_table(doc, 'encoder', 'gpu_check_1c24469')}

{gpu_table(doc, 'encoder', 'gpu_h200_md')}

{gpu_hf_sentence(doc)}

## Calibration sweep

Setup: {setups['sweep']}.

{gpu_table(doc, 'sweep', 'gpu_check_1c24469')}

{gpu_table(doc, 'sweep', 'gpu_h200_md')}

## Flan-T5-XXL encoder at 32k

Setup: {setups['xxl']}.

{gpu_table(doc, 'xxl', 'gpu_check_dispatch')}

{gpu_table(doc, 'xxl', 'gpu_h200_md')}

## Decoding

Setup: {setups['decode']}.

{gpu_list_table(doc, 'decode', 'gpu_check_dispatch', ['encoder', 'input tokens', 'time'],
                ['impl', 'length', 'figures'], note=False)}

{' '.join(r['note'] for r in doc['decode'])}

## Parity

Output errors are relative L2 over the whole output; P_max and entropy errors the largest
absolute difference of a row's statistic.

{gpu_parity_table(doc, 'gpu_check_1c24469')}

{gpu_parity_table(doc, 'gpu_h200_md')}

The whole encoder's error is alike for the Triton kernel and `blockwise`: the bfloat16 path's
drift over 24 random layers, not the kernel's; no float32 reference was run.

## Tests on the GPU

{gpu_tests_table(doc, 'gpu_check_dispatch')}

{gpu_tests_table(doc, 'gpu_h200_md')}

The rest of the suite has not run on a GPU.

## The demo on the GPU

{gpu_demo_table(doc)}

## Measuring it again

`python -m benchmarks.gpu_check` measures the attention, encoder, XXL, calibration-sweep and
decoding rows above beside cuDNN and HuggingFace (torch runs after JAX has released the GPU
memory), each with its parity check and XLA's memory, and the GPU test subset, in one command of
at most 8 minutes on an H100 / H200, into one folder of at most 8 files. Its table's H200 column
shows the figures of `benchmarks/results/gpu_h200.json` marked `orientation`. On a CPU it runs a
smoke mode (tiny shapes, kernels in interpret mode) that the test suite runs. It needs only
gin-config added to a stock jax / torch / transformers image, the checkout on `PYTHONPATH`.
"""


# ---------------------------------------------------------------------------------------- TPU


def tpu_attention_table(doc: dict) -> str:
  """tpu_kernel_bench's attention rows: per length, the kernel and blockwise side by side."""
  rows = [r for r in doc['rows'] if r['kind'] == 'attention']

  def cell(r: dict) -> str:
    text = (f'{r["compile_s"]:.1f} s, {r["memory_bytes"]["temporaries"] / 1e6:.0f} MB, '
            f'{r["xla_cost"]["bytes accessed"] / 1e9:.2f} GB')
    if 'loops' in r:
      text += (f' (one loop body of {r["loops"]["query_blocks"]} x {r["loops"]["key_blocks"]})')
    return text
  lines = []
  for length in dict.fromkeys(r['length'] for r in rows):
    kernel = next(r for r in rows if r['length'] == length and r['impl'] == 'pallas_tpu')
    blockwise = next(r for r in rows if r['length'] == length and r['impl'] == 'blockwise')
    lines.append([f'{length:,}', cell(kernel),
                  f'{kernel["kernel_scoped_vmem_bytes"] / 1e6:.1f} MB', cell(blockwise)])
  first = rows[0]
  return (provenance('tpu_kernel_v5e.json', doc['provenance'])
          + f' One chip of {first["topology"]} ({first["device"]}).\n\n'
          + table(['tokens', 'TPU kernel: compile, temporaries, HBM bytes',
                   'its scoped VMEM', 'blockwise: compile, temporaries, HBM bytes'], lines))


def tpu_encoder_table(doc: dict) -> str:
  rows = [r for r in doc['rows'] if r['kind'] == 'encoder']
  gib = lambda n: f'{n / GiB:.2f}'
  first = rows[0]
  mesh = ' x '.join(f'{k} {v}' for k, v in first['mesh'].items())
  return (provenance('tpu_kernel_v5e.json', doc['provenance'])
          + f' `{first["gin_file"]}` at {first["length"]:,} tokens, batch {first["batch"]}, '
          f'{first["params_dtype"]} parameters, on {first["topology"]} as {mesh}.\n\n'
          + table(['`ATTENTION_IMPL`', 'attention', 'compile', 'GiB per chip', 'arguments',
                   'temporaries', 'outputs', f'fits {first["hbm_gib"]:g} GiB', 'Mosaic calls'],
                  [[r['impl'], f'`{r["attention_impl"]}`', f'{r["compile_s"]:.0f} s',
                    f'{r["per_chip_gib"]:.2f}', gib(r['memory_bytes']['arguments']),
                    gib(r['memory_bytes']['temporaries']), gib(r['memory_bytes']['outputs']),
                    'yes' if r['fits'] else 'no', str(r['tpu_custom_calls'])] for r in rows]))


def tpu_llo_table(doc: dict) -> str:
  row = next(r for r in doc['rows'] if r['kind'] == 'llo')
  blocks = ' x '.join(str(b) for b in row['blocks'])
  return (provenance('tpu_kernel_v5e.json', doc['provenance'])
          + f' The kernel for one chip of {row["topology"]} at {row["length"]:,} tokens, '
          f'{blocks} tiles ({row["total_bundles"]:,} bundles in all).\n\n'
          + table(['tile branch', 'bundles'], [[k, f'{v:,}'] for k, v in
                                               row['tile_branch_bundles'].items()]))


def _bound(report: dict) -> str:
  chip, per = report['target']['chip'], report['per_chip_per_call']
  hbm = per['bytes_accessed'] / chip['hbm_bytes_per_s'] > per['flops'] / chip['peak_bf16_flops']
  return 'HBM-bound' if hbm else 'FLOP-bound'


def preflight_encoder_table(rows: dict) -> str:
  """The 'issue' rows of preflight_table.json: one column per implementation."""
  pair = {k: v for k, v in rows.items() if '-encoder-' in k}
  reports = [r['report'] for r in pair.values()]
  gib = lambda n: f'{n / GiB:.2f}'
  tb = lambda n: f'{n / 1e12:#.3g} TB'

  def memory(r: dict) -> str:
    m = r['memory_per_chip']
    return (' + '.join(gib(m[k]) for k in ('arguments', 'outputs', 'temporaries',
                                           'generated_code', 'unread_parameters'))
            + f' = {gib(m["total"])}')
  usable = gib(reports[0]['memory_per_chip']['usable_hbm'])
  chip = reports[0]['target']['chip']['generation']
  lines = [
      ['XLA memory: arguments + outputs + temporaries + code + parameters held, not read (GiB)']
      + [memory(r) for r in reports],
      [f"fits {chip}'s {usable} GiB usable"] + ['yes' if r['fits'] else 'no' for r in reports],
      ['FLOPs per call, loop trip counts applied']
      + [sci(r['per_chip_per_call']['flops'], 3) for r in reports],
      ['HBM bytes per call, loop trip counts applied']
      + [tb(r['per_chip_per_call']['bytes_accessed']) for r in reports],
      ["XLA's `cost_analysis` (loops once): FLOPs, bytes"]
      + [f'{sci(c["flops"], 3)}, {tb(c["bytes accessed"])}'
         for c in (r['xla_cost_analysis_loops_once'] for r in reports)],
      [f'roofline per {reports[0]["unit"]}'.replace(')', f'; {reports[0]["units_per_call"]} '
                                                     'per call)')]
      + [f'{r["per_unit"]["roofline_seconds"]:#.3g} s ({_bound(r)})' for r in reports],
      ['compile'] + [f'{r["compile_seconds"]:.0f} s' for r in reports],
  ]
  first_row, first = next(iter(pair.values())), reports[0]
  settings = first['settings']
  mesh = ' x '.join(f'{k} {v}' for k, v in first['mesh'].items() if v > 1)
  head = [''] + [f'`{r["settings"]["attention_impl"]}`' for r in reports]
  ratio = (reports[1]['per_chip_per_call']['bytes_accessed']
           / reports[0]['per_chip_per_call']['bytes_accessed'])
  return (provenance('preflight_table.json', {**first_row['provenance'],
                                              'commit': first_row['code']})
          + f' Flan-T5-XXL\'s encoder at {settings["length"]:,} tokens on '
          f'{first["target"]["topology"]}, {mesh}, batch {settings["batch_size"]}, '
          f'{settings["params_dtype"]}, per chip; 1-minute load at the rows\' starts: '
          + ' and '.join(f'{r["loadavg_1min_at_start"]:.1f} ({h})' for r, h in
                         zip(pair.values(), head[1:]))
          + '.\n\n' + table(head, lines)
          + f'\n\nWith the fused kernel XLA\'s HBM bytes per chip are {ratio:.2g} of '
          f'blockwise\'s (1/{1 / ratio:.0f}).')


def preflight_summary_table(rows: dict) -> str:
  """Over the table's rows, per program and length: est./XLA per implementation, and the fused
  kernel against blockwise (GiB per chip, the difference; GB per example, the ratio)."""
  span = lambda xs, f: f'{f(min(xs))} .. {f(max(xs))}'
  lines = []
  for program in preflight_table.PROGRAMS:
    for length in preflight_table.LENGTHS:
      pairs = []
      for key, row in rows.items():
        if key.endswith(f'-{program}-blockwise') and f'-{length}-' in key:
          fused = rows.get(key[:-len('blockwise')] + 'pallas')
          if fused:
            pairs.append((row['report'], fused['report']))
      if not pairs:
        continue
      gib = [(f['memory_per_chip']['total'] - b['memory_per_chip']['total']) / GiB
             for b, f in pairs]
      hbm = [f['per_unit']['bytes_accessed'] / b['per_unit']['bytes_accessed'] for b, f in pairs]
      ratio = lambda i: [p[i]['memory_estimate']['ratio_to_xla'] for p in pairs]
      lines.append([program, kilo(length), str(len(pairs)), span(ratio(0), '{:.2f}'.format),
                    span(ratio(1), '{:.2f}'.format), span(gib, '{:+.2f}'.format),
                    span(hbm, '{:.2g}'.format)])
  return table(['program', 'tokens', 'slices x models', 'blockwise est./XLA', 'fused est./XLA',
                'fused - blockwise, GiB per chip', 'fused / blockwise, GB per example'], lines)


def preflight_commits_table(rows: dict) -> str:
  """The rows by the commit that measured them: date, wall time, machine load at their starts."""
  by_code: dict[str, list[dict]] = {}
  for row in rows.values():
    by_code.setdefault(row.get('code') or '-', []).append(row)
  span = lambda xs, f: f(min(xs)) if f(min(xs)) == f(max(xs)) else f'{f(min(xs))} .. {f(max(xs))}'
  lines = []
  for code, group in sorted(by_code.items(), key=lambda item: -len(item[1])):
    dates = sorted({r.get('provenance', {}).get('date') or 'not recorded' for r in group})
    lines.append([code, str(len(group)), ', '.join(dates),
                  span([r['wall_s'] for r in group], '{:.0f}'.format),
                  span([r['loadavg_1min_at_start'] for r in group], '{:.1f}'.format)])
  return table(['commit', 'rows', 'measured on', 'wall s a row', '1-minute load at its start'],
               lines)


def preflight_chips_table(rows: dict) -> str:
  """Each slice's chip figures, as the reports carry them (the roofline's peaks)."""
  slices: dict[str, dict] = {}
  for row in rows.values():
    target = row['report']['target']
    if target['type_name'] or target['topology'] not in slices:
      slices[target['topology']] = target
  return table(['slice', 'topology', 'chips', 'peak bf16 TFLOP/s per chip', 'HBM GB/s per chip',
                'HBM GiB per chip', 'usable GiB', 'figures from'],
               [[t['type_name'] or '-', t['topology'], str(t['chips']),
                 f'{t["chip"]["peak_bf16_flops"] / 1e12:g}',
                 f'{t["chip"]["hbm_bytes_per_s"] / 1e9:g}', f'{t["chip"]["hbm_bytes"] / GiB:g}',
                 f'{t["chip"]["usable_hbm_bytes"] / GiB:.2f}', t['chip']['source']]
                for t in slices.values()])


def tpu_page(kernel: dict, preflight: dict) -> str:
  rows = preflight['rows']
  table_rows = {k: v for k, v in rows.items() if '-encoder-' not in k}
  versions = sorted({f'{k} {v}' for r in table_rows.values()
                     for k, v in r.get('provenance', {}).get('versions', {}).items()})
  machines = sorted({r.get('provenance', {}).get('machine', 'not recorded')
                     for r in table_rows.values()})
  return f"""# Performance on a TPU

{GENERATED}

No TPU has run t5align. What is known comes from XLA's TPU compiler run without a TPU (libtpu's
compile-only client on a CPU host): memory as XLA lays a program out, FLOPs and bytes as XLA's
HLO cost analysis counts them, and a roofline lower bound from each chip's published peaks. The
[pre-flight check](../pods.md#pre-flight-check) does this for a run before renting a pod. The
[CPU](cpu.md) and [GPU](gpu.md) pages have measured times.

## The fused kernel against blockwise: attention alone

The TPU kernel (`t5align/attention/pallas_tpu.py`: `pallas` on TPU, and `auto` there above the
threshold) is a Pallas Mosaic kernel over (example x head, query block, key block) in 512 x 512
tiles, with the online-softmax accumulators of `blockwise` in VMEM. It computes T5's relative bias
from the `[heads, 32]` table inside the kernel, skips tiles whose segment ids cannot meet without
fetching their keys, runs a tile without padding or a causal cut without any mask, and takes P_max
and entropy from the same pass. Its numerics equal `reference` in Pallas interpret mode on a CPU
(`tests/attention/attention_test.py`, `tests/model/network_impl_test.py`,
`tests/attention/pallas_tpu_test.py`), and Mosaic compiles it for TPU topologies on a CPU host.
`python -m benchmarks.tpu_kernel_bench` compiles attention alone at Flan-T5-XXL's per-chip share
(8 heads x 64, batch 1, bfloat16, statistics on), as XLA reports it:

{tpu_attention_table(kernel)}

The two byte columns are not counted alike: XLA's cost analysis counts a while loop's body once,
so blockwise's figure holds one of its query x key blocks, while the kernel's is its own
`pl.CostEstimate` for every tile (Mosaic reports no cost of its own; without the estimate XLA
counts the kernel's operands and results once and no FLOPs). The kernel's scoped VMEM is within
v5e's 16 MiB default.

## Flan-T5-XXL's encoder, compiled

{tpu_encoder_table(kernel)}

With the kernel, XLA's program holds one Mosaic call per layer.

## The kernel's static schedule

{tpu_llo_table(kernel)}

libtpu's static LLO schedule of one tile per branch (bias: the band near the diagonal or beyond
it; mask: none, or segment ids / causal): a schedule length, not a timing (stalls and DMA waits
are not in it).

## Pre-flight: Flan-T5-XXL's encoder at 32k on v5e:4x4

`python -m benchmarks.preflight_table --rows issue` compiles the calibration sweep with one tau
(the encoder and its statistics, less the last layer's value, output projection and MLP, which
the statistics do not need and XLA drops) with each implementation:

{preflight_encoder_table(rows)}

Counted alike: the compiled per-chip program costed by XLA's HLO cost analysis with loop trip
counts (`t5align/runtime/hlo_cost.py`), the kernel, whose work XLA cannot see, by the
`pl.CostEstimate` it declares (`pallas_tpu._cost`). `blockwise` counts every tile at its
costliest kind (a `lax.switch` counts as its costliest branch: a near, masked tile), an upper
bound, since nearly all its tiles at 32k are far ones.

## Pre-flight: Flan-T5-XL and XXL on four slices

`python -m benchmarks.preflight_table` runs `python -m t5align.preflight` once per row, each in
its own process; `--markdown` prints this table. Settings as the Pods commands: bfloat16
parameters and activations, the 'model' axis min(8, chips); eval with one example per 'data'
shard and 64 decoding steps, calibration with MESH_SHAPE (chips / model, 1, model), one sample
and the 11 candidate taus. Per implementation: XLA's GiB per chip, then per example
(calibration: per encoder pass, one sample at one tau), all chips together, TFLOPs and GB
accessed with loop trip counts, the roofline's lower bound in seconds, and `memory.estimate` over
XLA's figure as the row recorded it. Bytes are logical (TPU tile padding not counted); a
conditional counts at its costliest branch. From `benchmarks/results/preflight_table.json`
(each row's command, commit, machine load and wall time are in it): {', '.join(versions)}; on
{' / '.join(machines)}; the dates and commits below.

{preflight_table.markdown(table_rows, estimate=preflight_table.recorded_estimate_ratio)}

Over the table, per program and length (the fused kernel against blockwise on the same slice):

{preflight_summary_table(table_rows)}

The rows by the code that measured them (every row of the file, the two above included):

{preflight_commits_table(rows)}

The chips, as the reports carry them (`t5align/runtime/tpu_chips.py` has their sources):

{preflight_chips_table(rows)}

## Not verified

No TPU ran any of it: real speed (the roofline is a lower bound from published peaks, not a
timing), the kernel on real hardware (its numerics are checked in Pallas interpret mode on a CPU,
its compile by Mosaic for each slice), memory as the TPU runtime allocates it, ICI collectives,
and multi-host runs on a real pod.
"""


# --------------------------------------------------------------------------------- the pages


def pages(results: pathlib.Path = RESULTS) -> dict[str, str]:
  """{file name under docs/performance: its text}, from the results files in `results`."""
  return {'cpu.md': reflow(cpu_page(load('encoder_cpu', results), load('lm_eval_cpu', results))),
          'gpu.md': reflow(gpu_page(load('gpu_h200', results))),
          'tpu.md': reflow(tpu_page(load('tpu_kernel_v5e', results),
                                    load('preflight_table', results)))}


def stale(written: dict[str, str], pages_dir: pathlib.Path = PAGES) -> list[str]:
  """The pages whose committed text differs from `written` (or that are missing)."""
  return [name for name, text in written.items()
          if not (pages_dir / name).exists()
          or (pages_dir / name).read_text(encoding='utf-8') != text]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--check', action='store_true',
                      help='write nothing; exit 1 naming each page that differs')
  args = parser.parse_args(argv)
  written = pages()
  if args.check:
    differ = stale(written)
    for name in differ:
      print(f'docs/performance/{name} differs from what `python -m benchmarks.docs_pages` '
            'writes', file=sys.stderr)
    return 1 if differ else 0
  PAGES.mkdir(parents=True, exist_ok=True)
  for name, text in written.items():
    (PAGES / name).write_text(text, encoding='utf-8')
    print(f'wrote docs/performance/{name}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
