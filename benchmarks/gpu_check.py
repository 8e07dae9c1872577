"""One command for a lent GPU: test subset, attention, encoders, sweep, decoding, HF; one table.

Run from the repository root (t5align on PYTHONPATH, not installed; jax with CUDA, flax,
gin-config, and torch + transformers for the HF rows):
  python -m benchmarks.gpu_check                    # one H100 / H200: about 8 minutes at most
  python -m benchmarks.gpu_check --smoke            # tiny shapes on the CPU, under a minute
  python -m benchmarks.gpu_check --groups hf decode --output_dir gpu_check_rest   # a subset

Where jax's default backend is not a GPU, the command runs the smoke mode whether or not
`--smoke` is given; `--smoke` runs it on the CPU (JAX_PLATFORMS=cpu) even beside a GPU. Smoke
mode runs the same kinds of rows through the same code at tiny shapes in float32, each code path
at least once (the Pallas kernels in interpret mode; jax.nn.dot_product_attention's 'xla'
implementation beside the cuDNN rows, which say 'cudnn: no GPU'; compiling is most of its time,
so its JAX groups share one process, XLA's CPU backend runs without LLVM optimizations and a
persistent compilation cache in a temporary folder compiles a repeated program once), so that CI
catches rot; its parity checks agree to float32 rounding (~1e-6).

Everything goes to `--output_dir` (default gpu_check_output/): results.json (every planned row,
rewritten atomically after each update, so a run cut short keeps what it finished and names what
it did not), table.md (the table printed at the end), log.txt (the workers' stderr), pytest.txt
and pytest.xml (the test subset). The JSON is also printed, then the table. The exit status is 1
when a row failed or was stopped, a parity check failed or a test failed (JSON: `failures`), else
0; a row that ran out of device memory says 'oom' and is no failure.

Rows, most important first. Each group runs in its own subprocess, one after another (JAX workers
with XLA_PYTHON_CLIENT_PREALLOCATE=false), under its own time limit and the global `--budget_s`
(default 450 s): a group that would start after it is recorded as skipped with the reason; one
that runs into it is stopped, and its unfinished rows say so. Every row names what produced it
(implementation, shapes, dtype, tau, repeats, device, jax / torch versions). Times are the median
of `repeats` calls after a warm-up call, each program compiled ahead of time first (`compile_s`)
so that XLA's memory figures (`jax.jit(f).lower(...).compile().memory_analysis()`: temporaries,
arguments, outputs) come with it; `peak_bytes` is the device's `peak_bytes_in_use` on a GPU
(torch: `max_memory_allocated`, reset per row), the process's max RSS on the CPU: a running
maximum over the rows of a group (`peak_set_by_this_row` says whether this row raised it).
1. tests: pytest on tests/pallas_mgpu_test.py, attention_test.py, network_impl_test.py,
   network_test.py (in that order, JAX_PLATFORMS=cuda, cut at 150 s, which on an H200 ends in
   network_impl_test; on a Hopper GPU the 'pallas_mgpu' kernel runs natively against
   'reference'; smoke: a `-k` selection on the CPU), before any other GPU work: passed / failed
   / skipped counts and the failures' names (junit XML).
2. attention: one layer, batch 1, Flan-T5-XL's 32 heads x 64, bf16, tau 0.8, T5's relative
   bias, row statistics on, at 4k / 16k / 32k tokens: 'reference' (4k), 'blockwise', 'pallas'
   (`dispatch.resolve`: 'pallas_mgpu' on Hopper), the platform's other fused kernels
   ('pallas_gpu', Triton), cuDNN flash attention without bias (the floor) and
   with T5's bias materialized `[1, h, L, L]` from the table in the timed call (4k, 16k). Parity
   on the same inputs against 'reference' where it runs, else 'blockwise': output relative L2
   error, largest P_max / entropy errors; the kernel also against 'reference' on a padded batch
   of 2 with two taus (`attention_bench.check_against_reference`). TFLOP/s = 4 L^2 H D / t.
3. encoder: Flan-T5-XL's encoder (random weights, bf16 weights and activations, batch 1) with
   'pallas' at 4k / 15k / 32k, 'pallas_gpu' at 4k / 15k and 'blockwise' at 4k. Parity:
   'pallas' against 'reference' with the same weights at 4k (`encoder_bench._check_worker`:
   batch 2, row 1 padded), 'blockwise'
   against 'pallas' on the same tokens; longer rows carry the 4k check and their own finiteness.
4. sweep: the 11-tau calibration sweep (`stats.encoder_attention_stats`, the compiled program
   `CalibrationJob.programs` sizes) of the XL encoder, 'blockwise' at 4k, 'pallas' and
   'pallas_gpu' at 4k and 15k; parity: the 11 mean P_max / entropy values against 'blockwise'.
5. xxl: Flan-T5-XXL's encoder (emb 4096, 64 heads x 64, mlp 10240) at 32k with 'pallas'; parity:
   the kernel at XXL's heads against 'reference' (padded batch of 2), and a finite output.
6. decode: greedy decoding of 16 tokens (EOS off) after a 15k-token input by Flan-T5-XL
   (`decoding.greedy`: encoder with 'pallas', then the decoder over its cache, cross-attention
   keys/values projected once), end to end; parity: the tokens teacher-forced through the
   decoder without its cache are each their position's argmax, or within the model tolerance of
   it (relative to the argmax's distance from the mean logit: bf16 near-ties with random weights).
7. hf: HuggingFace's T5EncoderModel (the same XL shapes, bf16, its own random weights: only
   times compare with t5align's) with 'eager' and 'sdpa' at 4k and 15k (parity: sdpa against
   eager, same weights), and T5ForConditionalGeneration.generate(max_new_tokens=16,
   min_new_tokens=16, do_sample=False) after 15k tokens ('eager'), in a torch process (no JAX)
   started after the tests: it imports torch and transformers while the JAX groups run and
   touches the GPU only once every JAX worker has exited.
The table's ratio is the named reference row's seconds over this row's: the cuDNN floor for
attention rows, HF eager for the encoder rows, HF generate for decoding, t5align for HF rows, 11
forward passes for a sweep; its H200 column holds that row's figure measured on an H200 on
2026-11-27 (for orientation; benchmarks/results/gpu_h200.json, its `orientation` figures).
"""
from __future__ import annotations

import argparse
import datetime
import decimal
import functools
import importlib.util
import json
import os
import pathlib
import platform
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable
from xml.etree import ElementTree

from benchmarks import attention_bench as common
from benchmarks import encoder_bench

REPO = pathlib.Path(__file__).resolve().parents[1]
GROUPS = ('tests', 'attention', 'encoder', 'sweep', 'xxl', 'decode', 'hf')
TEST_FILES = ('tests/pallas_mgpu_test.py', 'tests/attention_test.py', 'tests/network_impl_test.py',
              'tests/network_test.py')
MARK = 'GPU_CHECK_ROW '  # Prefix of a worker's stdout line carrying one row update (JSON).
MIN_GROUP_S = 30  # No group starts with less of the budget left (a worker takes ~10 s to start).

# What each group runs. `impls`: implementation -> the lengths it runs at (None: all of the
# group's), in the order they run at a length (a parity base first). Models are
# `encoder_bench.MODELS` entries. Attention `padded`: the kernels also checked on a padded batch
# of 2 at `check_length` tokens, with their row at the first length (on a GPU, every other fused
# kernel of the platform too).
GPU_PLAN = {
    'tests': dict(files=TEST_FILES, select=None, timeout_s=150),
    'attention': dict(lengths=(4096, 16384, 32768), heads=32, depth=64, dtype='bfloat16',
                      tau=0.8, repeats=5, check_length=1000, padded=('pallas',), timeout_s=150,
                      impls={'reference': (4096,), 'blockwise': None, 'pallas': None,
                             'cudnn_nobias': None, 'cudnn_bias': (4096, 16384)}),
    'encoder': dict(model='xl', lengths=(4096, 15000, 32768), dtype='bfloat16', repeats=2,
                    check='model', timeout_s=180,
                    # 'pallas_gpu': the Triton kernel, what 'pallas' was on Hopper before
                    # 'pallas_mgpu' (issue 32), for the before/after.
                    impls={'pallas': None, 'blockwise': (4096,), 'pallas_gpu': (4096, 15000)}),
    'sweep': dict(model='xl', lengths=(4096, 15000), dtype='bfloat16', repeats=1, timeout_s=150,
                  impls={'blockwise': (4096,), 'pallas': None, 'pallas_gpu': None}),
    'xxl': dict(model='xxl', lengths=(32768,), dtype='bfloat16', repeats=1, check='attention',
                check_length=1000, timeout_s=120, impls={'pallas': None}),
    'decode': dict(model='xl', lengths=(15000,), dtype='bfloat16', repeats=1, tokens=16,
                   timeout_s=150, impls={'pallas': None}),
    'hf': dict(model='xl', lengths=(4096, 15000), dtype='bfloat16', repeats=1, tokens=16,
               timeout_s=180, impls={'eager': None, 'sdpa': None}, generate={'eager': (15000,)}),
}
# The same kinds of rows at tiny shapes, float32, on the CPU: every code path of this module at
# least once, with as few distinct programs as that takes (compiling is most of the time here: a
# Pallas kernel in interpret mode takes ~4 s). The attention rows run the GPU run's kernel
# ('pallas_gpu', dispatch.FUSED['gpu']) and 'pallas' (on the CPU: the TPU kernel), both in
# interpret mode; the model rows (a one-layer 'tiny' T5) run 'blockwise' where the GPU run has
# 'pallas', and the GPU kernel once, in the encoder (checked against 'blockwise' on the same
# tokens). The JAX groups share one worker process.
SMOKE_PLAN = {
    'tests': dict(files=TEST_FILES, select='registry or dispatch_table', timeout_s=120),
    'attention': dict(lengths=(128, 256), heads=4, depth=16, dtype='float32', tau=0.8, repeats=1,
                      check_length=200, padded=('pallas_gpu',), timeout_s=120,
                      impls={'reference': (128,), 'blockwise': None, 'pallas_gpu': (128,),
                             'pallas': (128,), 'xla_nobias': (128,), 'xla_bias': None,
                             'cudnn_nobias': (128,), 'cudnn_bias': (128,)}),
    'encoder': dict(model='smoke', lengths=(128, 256), dtype='float32', repeats=1, check='model',
                    timeout_s=120, impls={'blockwise': None, 'pallas_gpu': (128,)}),
    'sweep': dict(model='smoke', lengths=(128,), dtype='float32', repeats=1, timeout_s=120,
                  impls={'blockwise': None, 'reference': None}),
    'xxl': dict(model='smoke', lengths=(128,), dtype='float32', repeats=1, check='attention',
                check_length=200, timeout_s=120, impls={'blockwise': None}),
    'decode': dict(model='smoke', lengths=(128,), dtype='float32', repeats=1, tokens=16,
                   timeout_s=120, impls={'blockwise': None}),
    'hf': dict(model='smoke', lengths=(128,), dtype='float32', repeats=1, tokens=16,
               timeout_s=120, impls={'eager': None, 'sdpa': None}, generate={'eager': (128,)}),
}
# Groups run together in one worker process (each other group alone, in its own).
SMOKE_BATCHES = (('attention', 'encoder', 'sweep', 'xxl', 'decode'),)
# Largest error a parity check passes with, by dtype: attention output (relative L2) and row
# statistics (absolute); whole models' outputs (relative L2: bf16 drifts over 24 layers, 2.5e-2
# for 'blockwise' and 'pallas' alike on the H200); the sweep's mean P_max / entropy (absolute).
TOLERANCE = {
    'float32': dict(out=1e-5, pmax=1e-5, entropy=1e-4, model=1e-5, sweep=1e-4),
    'bfloat16': dict(out=3e-2, pmax=1e-3, entropy=1e-3, model=5e-2, sweep=2e-2),
}
_MATERIALIZED = ('cudnn_bias', 'xla_bias')  # jax.nn.dot_product_attention, bias [1, h, L, L].
_JAX_NN = ('cudnn_nobias', 'cudnn_bias', 'xla_nobias', 'xla_bias')
ENCODER_PARTS = ('token_embedder', 'encoder')  # The weights an encoder pass reads.
_JAX_DISTRIBUTIONS = ('jax', 'jaxlib', 'jax-cuda12-plugin', 'jax-cuda13-plugin', 'flax')

# Seconds measured on one H200 on 2026-11-27, by row id: the figures of
# benchmarks/results/gpu_h200.json marked `orientation` (each names its source: GPU-H200.md,
# before issue 32, when 'pallas' was the Triton kernel, here under 'pallas_gpu'; or this
# command's own run of 'pallas_mgpu', what 'pallas' is on Hopper since issue 32; jax 0.11.2).
H200_RESULTS = REPO / 'benchmarks' / 'results' / 'gpu_h200.json'


def known_h200(path: pathlib.Path = H200_RESULTS) -> dict[str, float]:
  """{row id: seconds} of the H200 figures in `path` marked `orientation` (times in `ms` or
  `seconds`, read as decimals so that each is the float its digits name)."""
  with open(path, encoding='utf-8') as f:
    document = json.load(f, parse_float=decimal.Decimal)
  return {row['id']: float(row['ms'] / 1000 if 'ms' in row else row['seconds'])
          for rows in document.values() if isinstance(rows, list)
          for row in rows if row.get('orientation')}


KNOWN_H200 = known_h200()


# ----------------------------------------------------------------------------------- the plan


def plan_rows(plan: dict, env: dict, torch_missing: str | None = None,
              groups: tuple[str, ...] = GROUPS) -> list[dict]:
  """Every row of `plan` in run order, each `status` 'pending' or 'skipped' with its `reason`.

  Args:
    plan: GPU_PLAN or SMOKE_PLAN.
    env: the 'env' worker's answer (`backend`; `kernels`: this platform's fused kernels).
    torch_missing: why the HF rows cannot run (None: torch and transformers are importable).
    groups: the groups to run; the others' rows are skipped, saying so.
  """
  rows = [dict(id='tests', group='tests', kind='tests', files=list(plan['tests']['files']),
               select=plan['tests']['select'])]
  attention = plan['attention']
  impls, padded = dict(attention['impls']), set(attention['padded'])
  if env['backend'] == 'gpu':  # Any other kernel for this platform, beside 'pallas'.
    extra = [k for k in env.get('kernels', ()) if k != env.get('fused')]
    impls.update({k: None for k in extra})
    padded.update(extra)
  for length in attention['lengths']:
    here = [impl for impl, lengths in impls.items() if lengths is None or length in lengths]
    base = 'reference' if 'reference' in here else 'blockwise'
    here.sort(key=lambda impl: impl != base)  # The parity base runs first.
    for impl in here:
      row = dict(id=f'attention/{impl}/{length}', group='attention', kind='attention', impl=impl,
                 length=length, batch=1, heads=attention['heads'], depth=attention['depth'],
                 dtype=attention['dtype'], tau=attention['tau'], repeats=attention['repeats'],
                 with_stats=impl not in _JAX_NN, base=base,
                 check_padded=impl in padded and length == attention['lengths'][0],
                 bias=('materialized [1, h, L, L] from the table, in the timed call'
                       if impl in _MATERIALIZED else 'none' if impl in _JAX_NN
                       else "T5's relative bias from the [h, 32] table"))
      if impl.startswith('cudnn') and env['backend'] != 'gpu':
        row.update(status='skipped', reason=f"cudnn: no GPU (jax's backend is {env['backend']})")
      rows.append(row)
  for group in ('encoder', 'sweep', 'xxl', 'decode'):
    spec = plan[group]
    for length in spec['lengths']:
      here = [i for i, lengths in spec['impls'].items() if lengths is None or length in lengths]
      here.sort(key=lambda impl: impl != 'blockwise' or group != 'sweep')  # Its base first.
      for impl in here:
        row = dict(id=f'{group}/{spec["model"]}/{impl}/{length}', group=group, impl=impl,
                   kind='encoder' if group == 'xxl' else group, model=spec['model'],
                   sizes=encoder_bench.MODELS[spec['model']], length=length, batch=1,
                   dtype=spec['dtype'], repeats=spec['repeats'])
        if group == 'sweep':
          row.update(taus=encoder_bench.TAUS, base='blockwise' if 'blockwise' in here else None)
        if group == 'decode':
          row['tokens'] = spec['tokens']
        rows.append(row)
  hf = plan['hf']
  for length in hf['lengths']:
    for attention_impl in hf['impls']:
      rows.append(dict(id=f'hf/{hf["model"]}/{attention_impl}/{length}', group='hf',
                       kind='hf_encoder', impl=attention_impl, model=hf['model'],
                       sizes=encoder_bench.MODELS[hf['model']], length=length, batch=1,
                       dtype=hf['dtype'], repeats=hf['repeats']))
  for attention_impl, lengths in hf['generate'].items():
    for length in lengths:
      rows.append(dict(id=f'hf_generate/{hf["model"]}/{attention_impl}/{length}', group='hf',
                       kind='hf_generate', impl=attention_impl, model=hf['model'],
                       sizes=encoder_bench.MODELS[hf['model']], length=length, batch=1,
                       dtype=hf['dtype'], repeats=hf['repeats'], tokens=hf['tokens']))
  for row in rows:
    row.setdefault('status', 'pending')
    if row['group'] not in groups:
      row.update(status='skipped', reason=f"group {row['group']!r} not in --groups")
    elif row['group'] == 'hf' and torch_missing:
      row.update(status='skipped', reason=torch_missing)
    compare = _compare_to(row, plan)
    if compare:
      row['compare_to'] = compare
  return rows


def _compare_to(row: dict, plan: dict) -> dict | None:
  """The row a row's ratio is taken against: `{id, label, factor}` (ratio = factor x its
  seconds / this row's), or None."""
  length, group = row.get('length'), row['group']
  kernel = next(iter(plan['encoder']['impls']))  # The fused kernel of the model rows.
  model = plan['encoder']['model']
  if group == 'attention' and not row['impl'].endswith('nobias'):
    floor = 'xla_nobias' if 'xla_nobias' in plan['attention']['impls'] else 'cudnn_nobias'
    return dict(id=f'attention/{floor}/{length}', label=f'{floor} / this', factor=1)
  if group == 'encoder':
    return dict(id=f'hf/{model}/eager/{length}', label='HF eager / this', factor=1)
  if group == 'sweep':
    return dict(id=f'encoder/{model}/{kernel}/{length}', label='11 forwards / this',
                factor=len(encoder_bench.TAUS))
  if group == 'decode':
    return dict(id=f'hf_generate/{model}/eager/{length}', label='HF generate / this', factor=1)
  if row['kind'] == 'hf_encoder':
    return dict(id=f'encoder/{model}/{kernel}/{length}', label=f'{kernel} / this', factor=1)
  if row['kind'] == 'hf_generate':
    return dict(id=f'decode/{model}/{kernel}/{length}', label='t5align / this', factor=1)
  return None


# ---------------------------------------------------------------------------- results, table


class Results:
  """The rows and the run's description; `save` rewrites results.json and table.md atomically."""

  def __init__(self, out_dir: pathlib.Path, meta: dict, rows: list[dict], log, start: float):
    self.out_dir, self.meta, self.log, self.start = out_dir, meta, log, start
    self.rows = {row['id']: row for row in rows}

  def update(self, fields: dict) -> None:
    """Merges one worker update (`id` plus fields) into its row, then saves."""
    row = self.rows.get(fields.get('id'))
    if row is None:
      self.note(f'update for an unplanned row ignored: {json.dumps(fields)[:300]}')
      return
    row.update(fields)
    if 'status' in fields:
      self.note(f'{row["id"]}: {_status_text(row)}')
    elif 'parity' in fields:
      self.note(f'{row["id"]}: parity {_parity_text(row)}')
    self.save()

  def note(self, text: str) -> None:
    """A progress line on stderr and in log.txt."""
    line = f'[{time.monotonic() - self.start:6.1f} s] {text}'
    print(line, file=sys.stderr, flush=True)
    self.log.write(f'gpu_check {line}\n')
    self.log.flush()

  def document(self) -> dict:
    rows = list(self.rows.values())
    add_ratios(rows)
    return {**self.meta, 'elapsed_s': round(time.monotonic() - self.start, 1),
            'failures': failures(rows), 'rows': rows}

  def save(self) -> None:
    document = self.document()
    _write_atomically(self.out_dir / 'results.json', json.dumps(document, indent=1) + '\n')
    _write_atomically(self.out_dir / 'table.md', table(document['rows']) + '\n')


def _write_atomically(path: pathlib.Path, text: str) -> None:
  """Writes `text` to a temporary file beside `path`, then renames it over `path`."""
  temporary = path.with_name(f'.{path.name}.tmp')
  temporary.write_text(text)
  os.replace(temporary, path)


def add_ratios(rows: list[dict]) -> None:
  """Sets each row's `ratio` (its `compare_to` row's seconds x factor / its own) where both ran."""
  by_id = {row['id']: row for row in rows}
  for row in rows:
    compare = row.get('compare_to')
    other = by_id.get(compare['id']) if compare else None
    if other and row.get('seconds') and other.get('seconds') and other.get('status') == 'ok':
      row['ratio'] = round(compare['factor'] * other['seconds'] / row['seconds'], 3)
    else:
      row.pop('ratio', None)


def failures(rows: list[dict]) -> list[str]:
  """Why the run failed, one line per row: an error, a stop, a failed parity check, failed
  tests, or a row left pending."""
  out = []
  for row in rows:
    if row['status'] in ('error', 'timeout', 'pending'):
      out.append(f'{row["id"]}: {row["status"]}: {row.get("reason", "")}')
    elif row['kind'] == 'tests' and row['status'] == 'ok' and (
        row.get('failed') or row.get('errors') or not row.get('passed')):
      out.append(f'tests: {row.get("failed")} failed, {row.get("errors")} errors, '
                 f'{row.get("passed")} passed')
    parity = row.get('parity') or {}
    if row['status'] == 'ok' and ('error' in parity or parity.get('ok') is False):
      out.append(f'{row["id"]}: parity {_parity_text(row)}')
  return out


def _seconds_text(seconds: float | None) -> str:
  if seconds is None:
    return '-'
  return f'{seconds * 1e3:.3g} ms' if seconds < 1 else f'{seconds:.3g} s'


def _bytes_text(count: int | None) -> str:
  if count is None or count < 0:
    return '?'
  return f'{count / 2**30:.2f} GiB' if count >= 2**30 else f'{count / 2**20:.1f} MiB'


def _status_text(row: dict) -> str:
  if row['status'] != 'ok':
    return f'{row["status"]}: {row.get("reason", "")}'
  if row['kind'] == 'tests':
    return (f'{row.get("passed")} passed, {row.get("failed")} failed, {row.get("errors")} '
            f'errors, {row.get("skipped")} skipped in {row.get("seconds")} s'
            + (f' ({row["reason"]})' if row.get('reason') else ''))
  return f'ok, {_seconds_text(row.get("seconds"))}'


def _memory_text(row: dict) -> str:
  parts = []
  xla = row.get('xla_memory')
  if xla:
    parts.append(f'XLA temp {_bytes_text(xla["temp_bytes"])} + args '
                 f'{_bytes_text(xla["argument_bytes"])}')
  if row.get('peak_bytes') is not None:
    bound = '' if row.get('peak_set_by_this_row', True) else '<= '
    parts.append(f'peak {bound}{_bytes_text(row["peak_bytes"])}')
  return '; '.join(parts) or '-'


def _parity_text(row: dict) -> str:
  parity = row.get('parity')
  if row['kind'] == 'tests':
    names = row.get('failures') or []
    return ('failed: ' + ', '.join(names[:3]) + (' ...' if len(names) > 3 else '')
            if names else '-')
  if not parity:
    return '-'
  if 'error' in parity:
    return f'error: {parity["error"]}'
  parts = []
  for key, short in (('out_rel_err', 'rel'), ('pmax_max_abs_err', 'pmax'),
                     ('entropy_max_abs_err', 'ent')):
    if parity.get(key) is not None:
      parts.append(f'{short} {parity[key]:.1e}')
  if 'argmax_tokens' in parity:
    parts.append(f'{parity["argmax_tokens"]}/{parity["tokens"]} tokens the argmax, gap '
                 f'{parity["largest_relative_gap"]:.1e}')
  if 'generated_tokens' in parity:
    parts.append(f'{parity["generated_tokens"]} tokens generated')
  if parity.get('vs'):
    parts.append(f'vs {parity["vs"]}' + (f' @{parity["checked_at"]}'
                                         if 'checked_at' in parity else ''))
  elif not parts:
    parts.append(parity.get('role', 'finite only'))
  if parity.get('all_finite') is False:
    parts.append('NOT FINITE')
  if parity.get('ok') is False:
    parts.append('FAILED')
  return ', '.join(parts)


def table(rows: list[dict]) -> str:
  """The Markdown table: one line per row."""
  lines = ['| row | status | time | TFLOP/s | memory | parity | ratio | H200 |',
           '|---|---|---|---|---|---|---|---|']
  for row in rows:
    if row['status'] == 'ok':
      status = 'ok' if row['kind'] != 'tests' else _status_text(row)
    else:
      status = f'{row["status"]}: {row.get("reason", "")}'.replace('|', '/')[:160]
    ratio = (f'{row["ratio"]:.3g} ({row["compare_to"]["label"]})' if 'ratio' in row else '-')
    tflops = row.get('tflops_per_s')
    known = KNOWN_H200.get(row['id'])
    lines.append(f'| {row["id"]} | {status} | {_seconds_text(row.get("seconds"))} | '
                 f'{"-" if tflops is None else f"{tflops:.4g}"} | {_memory_text(row)} | '
                 f'{_parity_text(row).replace("|", "/")} | {ratio} | '
                 f'{"-" if known is None else _seconds_text(known)} |')
  return '\n'.join(lines)


# ------------------------------------------------------------------------------ orchestration


def _child_env(jax_platforms: str | None, cache_dir: str | None = None) -> dict:
  """The workers' environment: the checkout first on PYTHONPATH, JAX without preallocation.

  `cache_dir` (smoke mode, where compiling is most of the time): XLA's CPU backend without its
  LLVM optimizations, and a persistent compilation cache there, so that a program compiled twice
  (the XXL stand-in is the smoke encoder again) is compiled once.
  """
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE='false')
  env['PYTHONPATH'] = os.pathsep.join(p for p in (str(REPO), env.get('PYTHONPATH')) if p)
  if jax_platforms:
    env['JAX_PLATFORMS'] = jax_platforms
  if cache_dir:
    env['XLA_FLAGS'] = (env.get('XLA_FLAGS', '') + ' --xla_backend_optimization_level=0').strip()
    env.update(JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')
  return env


def _kill(proc: subprocess.Popen) -> None:
  """Ends `proc` and whatever it started (its own session's process group)."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  proc.wait()


def _tail(path: pathlib.Path, offset: int, lines: int = 3) -> str:
  """The last non-empty `lines` lines `path` got after `offset` (a worker's stderr)."""
  with open(path, 'rb') as f:
    f.seek(offset)
    text = f.read().decode('utf-8', 'replace')
  kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
  return ' / '.join(kept)[-600:]


class Worker:
  """A subprocess whose stdout lines are read as they come (stderr goes to `log`).

  `waits`: it gets a pipe on stdin, and a worker told to wait (`_worker`) reads one line from
  it before its rows: started early, it imports its libraries while other workers run.
  """

  def __init__(self, cmd: list[str], env: dict, log, waits: bool = False):
    self.log = log
    log.flush()
    self.proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdin=subprocess.PIPE if waits else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    self.lines: queue.Queue = queue.Queue()
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self) -> None:
    for line in self.proc.stdout:
      self.lines.put(line)
    self.lines.put(None)

  def go(self) -> None:
    """Lets a waiting worker start its rows (if it died meanwhile, `follow` says how)."""
    try:
      self.proc.stdin.write('go\n')
      self.proc.stdin.close()
    except OSError:
      pass

  def kill(self) -> None:
    _kill(self.proc)

  def follow(self, timeout_s: float, on_update: Callable[[dict], None]) -> str:
    """Passes each `MARK` line's JSON to `on_update` until the worker ends or `timeout_s` pass.

    Returns:
      '' when it exited with status 0, else why not (its time limit, or its exit status).
    """
    deadline = time.monotonic() + timeout_s
    try:
      while True:
        try:
          line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
          self.kill()
          return f'stopped at its time limit of {timeout_s:.0f} s'
        if line is None:
          break
        if line.startswith(MARK):
          on_update(json.loads(line[len(MARK):]))
        elif line.strip():
          self.log.write(f'stdout: {line}')
          self.log.flush()
    except BaseException:  # Ctrl-C included: no worker outlives this process.
      self.kill()
      raise
    status = self.proc.wait()
    return f'worker exited with status {status}' if status else ''


def stream(cmd: list[str], env: dict, timeout_s: float, log,
           on_update: Callable[[dict], None]) -> str:
  """Runs `cmd` as a `Worker` and follows it (`Worker.follow`)."""
  return Worker(cmd, env, log).follow(timeout_s, on_update)


def _probe(env: dict, log, timeout_s: float) -> dict:
  """jax's backend, device and versions, from a worker (so that this process holds no GPU)."""
  answer = {}
  why = stream([sys.executable, '-m', 'benchmarks.gpu_check', '--worker',
                json.dumps([{'group': 'env'}])], env, timeout_s, log, answer.update)
  if why or 'backend' not in answer:
    raise RuntimeError(f'the environment probe failed ({why or "no answer"}): see log.txt')
  return answer


def _torch_missing() -> str | None:
  for name in ('torch', 'transformers'):
    if importlib.util.find_spec(name) is None:
      return f'{name} not installed'
  return None


def _git_commit() -> str | None:
  try:
    out = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=REPO, capture_output=True, text=True,
                         timeout=10, check=True).stdout.strip()
    dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=REPO,
                           capture_output=True, text=True, timeout=10, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return out + (' (with uncommitted changes)' if dirty else '')


def _junit_counts(path: pathlib.Path) -> dict:
  """passed / failed / errors / skipped and the failures' names from pytest's junit XML."""
  counts = dict(passed=0, failed=0, errors=0, skipped=0, failures=[])
  for case in ElementTree.parse(path).getroot().iter('testcase'):
    name = f'{case.get("classname", "")}::{case.get("name", "")}'
    tags = {child.tag for child in case}
    if 'failure' in tags:
      counts['failed'] += 1
      counts['failures'].append(name)
    elif 'error' in tags:
      counts['errors'] += 1
      counts['failures'].append(f'{name} (error)')
    elif 'skipped' in tags:
      counts['skipped'] += 1
    else:
      counts['passed'] += 1
  return counts


def run_tests(spec: dict, out_dir: pathlib.Path, env: dict, timeout_s: float) -> dict:
  """The test subset in its own process (pytest.txt, pytest.xml): the 'tests' row's fields.

  At the time limit pytest gets SIGINT, which makes it stop after the running test and still
  write its summary and XML (then SIGKILL, 20 s later, if it has not ended).
  """
  xml = out_dir / 'pytest.xml'
  cmd = [sys.executable, '-m', 'pytest', *spec['files'], '-p', 'no:cacheprovider', '-rfE',
         f'--junitxml={xml}']
  if spec['select']:
    cmd += ['-k', spec['select']]
  start = time.monotonic()
  interrupted = False
  with open(out_dir / 'pytest.txt', 'w') as out:
    out.write(f'$ {" ".join(cmd)}\n')
    out.flush()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
      proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      interrupted = True
      os.killpg(proc.pid, signal.SIGINT)
      try:
        proc.wait(timeout=20)
      except subprocess.TimeoutExpired:
        _kill(proc)
    except BaseException:
      _kill(proc)
      raise
  fields = dict(command=' '.join(cmd[1:]), seconds=round(time.monotonic() - start, 1),
                exit_status=proc.returncode, jax_platforms=env.get('JAX_PLATFORMS'))
  if not xml.exists():
    return dict(fields, status='error', reason=f'pytest wrote no {xml.name} (exit status '
                f'{proc.returncode}{", stopped at the time limit" if interrupted else ""}): '
                'see pytest.txt')
  fields.update(_junit_counts(xml), status='ok')
  if interrupted:
    fields['reason'] = (f'interrupted at its time limit of {timeout_s:.0f} s: the tests after '
                        'the last one counted did not run')
  return fields


def _start_batch(groups: tuple[str, ...], plan: dict, results: Results, env: dict,
                 waits: bool = False) -> Worker:
  """A worker for the groups' pending rows (`waits`: it imports, then waits for `go`)."""
  work = [{'group': g, 'plan': plan[g], 'wait': waits,
           'rows': [r for r in results.rows.values()
                    if r['group'] == g and r['status'] == 'pending']} for g in groups]
  return Worker([sys.executable, '-m', 'benchmarks.gpu_check', '--worker', json.dumps(work)], env,
                results.log, waits)


def _run_batch(groups: tuple[str, ...], plan: dict, results: Results, env: dict,
               timeout_s: float, log_path: pathlib.Path, worker: Worker | None = None) -> None:
  """Runs the groups' pending rows in a worker (`worker`: one started waiting, told to go now);
  marks the rows it did not finish, and why."""
  rows = [r for r in results.rows.values() if r['group'] in groups and r['status'] == 'pending']
  offset = log_path.stat().st_size
  if worker is None:
    worker = _start_batch(groups, plan, results, env)
  else:
    worker.go()
  why = worker.follow(timeout_s, results.update)
  tail = _tail(log_path, offset) if why else ''
  reason = f'{why}; its stderr ends: {tail}' if tail else why or 'the worker ended without it'
  for row in rows:
    if row['status'] == 'pending':
      row.update(status='timeout' if why.startswith('stopped') else 'error', reason=reason)
      results.note(f'{row["id"]}: {_status_text(row)}')
    elif row['status'] == 'ok' and 'parity' not in row:
      row['parity'] = {'error': f'not finished: {reason}'}
  results.save()


def batches(together: tuple[tuple[str, ...], ...]) -> list[tuple[str, ...]]:
  """`GROUPS` in order as the worker batches they run in: the groups of one `together` entry
  share a process (where the first of them comes), every other group runs alone."""
  out = []
  for group in GROUPS:
    shared = next((b for b in together if group in b), (group,))
    if shared not in out:
      out.append(shared)
  return out


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--smoke', action='store_true',
                      help='tiny shapes on the CPU (also what runs where jax has no GPU)')
  parser.add_argument('--output_dir', default='gpu_check_output',
                      help='folder for results.json, table.md, log.txt, pytest.txt, pytest.xml')
  parser.add_argument('--budget_s', type=float, default=450,
                      help='no group starts after this many seconds; a running one is stopped')
  parser.add_argument('--groups', nargs='+', choices=GROUPS, default=list(GROUPS),
                      help='the groups to run (the others are recorded as skipped)')
  parser.add_argument('--worker', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    _worker(json.loads(args.worker))
    return 0
  start = time.monotonic()
  out_dir = pathlib.Path(args.output_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  for name in ('results.json', 'table.md', 'log.txt', 'pytest.txt', 'pytest.xml'):
    (out_dir / name).unlink(missing_ok=True)  # Nothing of an earlier run is read as this one's.
  log_path = out_dir / 'log.txt'
  with open(log_path, 'a') as log, tempfile.TemporaryDirectory(prefix='gpu_check_') as cache:
    env = _child_env('cpu', cache) if args.smoke else _child_env(None)
    try:
      probe = _probe(env, log, timeout_s=180)
    except RuntimeError as e:
      _write_atomically(out_dir / 'results.json', json.dumps(
          {'benchmark': 'gpu_check', 'failures': [str(e)], 'rows': []}, indent=1) + '\n')
      print(f'gpu_check: {e}', file=sys.stderr)
      return 1
    smoke = args.smoke or probe['backend'] != 'gpu'
    if smoke and not args.smoke:
      env = _child_env('cpu', cache)
    plan = SMOKE_PLAN if smoke else GPU_PLAN
    rows = plan_rows(plan, probe, _torch_missing(), tuple(args.groups))
    meta = dict(benchmark='gpu_check', mode='smoke' if smoke else 'gpu',
                started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
                command=['python', '-m', 'benchmarks.gpu_check', *(argv or sys.argv[1:])],
                budget_s=args.budget_s, commit=_git_commit(), python=platform.python_version(),
                environment=probe)
    results = Results(out_dir, meta, rows, log, start)
    results.note(f'{meta["mode"]} mode (jax found {probe["device"]}, backend '
                 f'{probe["backend"]}); {len(rows)} rows planned; writing to {out_dir}')
    if smoke and not args.smoke:
      results.note('NOTE: jax sees no GPU, so this is the smoke run on the CPU; on a GPU machine '
                   "that means jax's CUDA plugin did not load (the probe's stderr is in log.txt)")
    results.save()
    early = None  # The HF worker, started once the tests are done: it imports torch meanwhile.
    try:
      for batch in batches(SMOKE_BATCHES if smoke else ()):
        pending = [r for r in rows if r['group'] in batch and r['status'] == 'pending']
        left = args.budget_s - (time.monotonic() - start)
        if batch != ('tests',) and early is None and left >= MIN_GROUP_S and any(
            r['group'] == 'hf' and r['status'] == 'pending' for r in rows):
          early = _start_batch(('hf',), plan, results, env, waits=True)
        if not pending:
          continue
        if left < MIN_GROUP_S:
          for row in pending:
            row.update(status='skipped', reason=f'the budget (--budget_s {args.budget_s:g}) '
                       f'was spent ({time.monotonic() - start:.0f} s) before this group started')
          results.note(f'{"+".join(batch)}: skipped, budget spent')
          results.save()
          continue
        timeout_s = min(sum(plan[g]['timeout_s'] for g in batch), left)
        results.note(f'{"+".join(batch)}: starting (time limit {timeout_s:.0f} s)')
        if batch == ('tests',):
          tests_env = dict(env, JAX_PLATFORMS='cpu' if smoke else 'cuda')
          results.update({'id': 'tests', **run_tests(plan['tests'], out_dir, tests_env,
                                                     timeout_s)})
        else:
          _run_batch(batch, plan, results, env, timeout_s, log_path,
                     early if batch == ('hf',) else None)
    finally:
      if early is not None:
        early.kill()  # Ended already, unless the HF rows were skipped.
    document = results.document()
    results.save()
    print(json.dumps(document, indent=1))
    print(table(document['rows']))
    results.note(f'done in {document["elapsed_s"]} s: {len(document["failures"])} failures'
                 + ''.join(f'\n  {line}' for line in document['failures']))
  return 1 if document['failures'] else 0


# ------------------------------------------------------------------------------------ workers


def _reason(error: BaseException) -> str:
  return ' '.join(f'{type(error).__name__}: {error}'.split())[:600]


def _run_row(emit: Callable[..., None], row: dict, measure: Callable[[], dict],
             parity: Callable[[], dict] | None = None) -> bool:
  """One row: `measure()`'s fields are sent with status 'ok', then `parity()`'s check.

  An exception is the row's error (its traceback goes to stderr) and the next row still runs.
  """
  try:
    fields = measure()
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    reason = _reason(e)
    # Out of memory is a finding about the device (HF sdpa at 15k needs 77 GiB), not a bug.
    oom = 'out of memory' in reason.lower() or 'RESOURCE_EXHAUSTED' in reason
    emit(row['id'], status='oom' if oom else 'error', reason=reason)
    return False
  emit(row['id'], status='ok', **fields)
  if parity is not None:
    try:
      emit(row['id'], parity=parity())
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      emit(row['id'], parity={'error': _reason(e)})
  return True


def _emit(row_id: str, **fields) -> None:
  print(MARK + json.dumps({'id': row_id, **fields}), flush=True)


def _versions(*names: str) -> dict:
  """The installed versions of the distributions `names` (those not installed are left out)."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  out = {}
  for name in names:
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  return out


def _jax_info() -> dict:
  """What produced a JAX row: the device and the versions."""
  import jax  # pylint: disable=g-import-not-at-top
  return dict(device=str(jax.devices()[0].device_kind), backend=jax.default_backend(),
              versions=_versions(*_JAX_DISTRIBUTIONS))


def _peak_fields(before: int, framework: str, on_device: bool) -> dict:
  """`peak_bytes` after a row whose process peak was `before` (`attention_bench`'s measure)."""
  after = common.peak_memory_bytes(framework)
  return dict(peak_bytes=after, peak_set_by_this_row=bool(after > before),
              peak_kind='device peak bytes in use' if on_device else 'process max RSS')


def _jax_on_device() -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.devices()[0].platform != 'cpu'


def _xla_memory(figures) -> dict:
  """`memory.Compiled` figures (XLA's memory_analysis) as the rows' `xla_memory`."""
  return dict(temp_bytes=figures.temporaries, argument_bytes=figures.arguments,
              output_bytes=figures.outputs, generated_code_bytes=figures.generated_code)


def _measure(fn: Callable, args: tuple, repeats: int) -> tuple[dict, Any]:
  """Compiles `fn(*args)` ahead of time (XLA's memory figures), then times the compiled call."""
  import jax  # pylint: disable=g-import-not-at-top
  from t5align import memory  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - start
  before = common.peak_memory_bytes('jax')
  timing, out = common.time_calls(lambda: compiled(*args), jax.block_until_ready, repeats)
  return dict(timing, compile_s=round(compile_s, 3),
              xla_memory=_xla_memory(memory.Compiled.of(compiled)),
              **_peak_fields(before, 'jax', _jax_on_device())), out


def _kernel_fields(impl: str, length: int, dtype: str, head_dim: int) -> dict:
  """The implementation `impl` resolves to for a `dtype` encoder with `head_dim`
  (`dispatch.resolve`) and its options (defaults)."""
  from t5align.attention import dispatch  # pylint: disable=g-import-not-at-top
  kernel = dispatch.resolve(impl, length, 0, input_dtype=dtype, dtype=dtype, head_dim=head_dim)
  options = dispatch.IMPLEMENTATIONS[kernel].options
  return dict(kernel=kernel, options=repr(options()) if options else None)


@functools.cache
def _jitted_checks() -> tuple[Callable, Callable]:
  """(errors, finite): jitted on the device, one compilation per shape (not one per op)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  def errors(got, want):
    diff = got.astype(jnp.float32) - want.astype(jnp.float32)
    return (jnp.linalg.norm(diff) / jnp.linalg.norm(want.astype(jnp.float32)),
            jnp.max(jnp.abs(diff)))

  return jax.jit(errors), jax.jit(lambda x: jnp.all(jnp.isfinite(x)))


def _errors(got, want) -> tuple[float, float]:
  """(relative L2 error, largest absolute error) of `got` against `want`, in float32."""
  relative, largest = _jitted_checks()[0](got, want)
  return float(relative), float(largest)


def _finite(*arrays) -> bool:
  return all(bool(_jitted_checks()[1](x)) for x in arrays)


def _tolerance(dtype: str) -> dict:
  return TOLERANCE['float32' if dtype == 'float32' else 'bfloat16']


def _carried(check: dict | None, where: str, **own) -> dict:
  """A row's parity where it has no base of its own: the check of the same implementation and
  weights at a shorter length (`where`), and the row's own `own` fields (finiteness)."""
  if check is None:
    return {'error': f'no check to carry: {where} did not finish', **own}
  if 'error' in check:
    return {'error': f'the check at {where} failed: {check["error"]}', **own}
  kept = {k: v for k, v in check.items() if k not in ('role', 'inputs', 'note')}
  ok = check.get('ok', True) and own.get('all_finite', True)
  return {**kept, **own, 'checked_at': check.get('length', where), 'ok': ok,
          'note': f'no parity base at this length: carries the check at {where}'}


def _attention_fn(row: dict) -> Callable:
  """`(q, k, v, table, ids) -> out or (out, RowStats)`: one attention row's computation."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from t5align.attention import dispatch  # pylint: disable=g-import-not-at-top
  from t5align.attention import reference  # pylint: disable=g-import-not-at-top
  impl, tau, length, dtype = row['impl'], row['tau'], row['length'], jnp.dtype(row['dtype'])
  if impl in _JAX_NN:
    implementation, bias = impl.split('_')

    def call(q, k, v, table, ids):
      del ids  # One segment, no padding: no mask.
      # NOTE: jax's scale multiplies q.k only; T5 has no 1/sqrt(d), and tau divides q.k + bias.
      # [h, 32] -> [1, h, L, L]
      full = ((reference.relative_position_bias(table, length, length, True) / tau).astype(dtype)
              if bias == 'bias' else None)
      return jax.nn.dot_product_attention(q, k, v, bias=full, scale=1.0 / tau,
                                          implementation=implementation)
    return call
  return lambda q, k, v, table, ids: dispatch.self_attention(
      q, k, v, rel_embedding=table, segment_ids=ids, temperature=tau, impl=impl, dtype=dtype,
      with_stats=True)


def _attention_worker(plan: dict, rows: list[dict]) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from t5align.attention import dispatch  # pylint: disable=g-import-not-at-top
  from t5align.attention import reference  # pylint: disable=g-import-not-at-top
  info = _jax_info()
  tol = _tolerance(plan['dtype'])
  for length in plan['lengths']:
    todo = [r for r in rows if r['length'] == length]
    if not todo:
      continue
    base = {}  # The parity base's output at this length: (out, RowStats).
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    # [b, l, h, d]
    q, k, v = (jax.random.normal(key, (1, length, plan['heads'], plan['depth']),
                                 jnp.dtype(plan['dtype'])) for key in keys[:3])
    table = jax.random.normal(keys[3], (plan['heads'], reference.NUM_BUCKETS), jnp.float32)
    ids = jnp.ones((1, length), jnp.int32)
    for row in todo:
      got = {}

      def measure(row=row, got=got):
        result, got['out'] = _measure(_attention_fn(row), (q, k, v, table, ids), row['repeats'])
        flops = common.attention_flops(length, plan['heads'], plan['depth'])
        fields = dict(result, tflops_per_s=round(flops / result['seconds'] / 1e12, 4), **info)
        if row['impl'] in dispatch.NAMES:
          fields.update(_kernel_fields(row['impl'], length, row['dtype'], plan['depth']))
        return fields

      def parity(row=row, got=got):
        out, stats = got.pop('out') if row['with_stats'] else (got.pop('out'), None)
        finite = _finite(out, *(stats or ()))
        if row['impl'] == row['base']:
          base['out'] = (out, stats)
          return dict(role='the parity base at this length', all_finite=finite)
        if row['impl'].endswith('nobias'):
          return dict(role='finite only: no bias, another function (the floor)',
                      all_finite=finite)
        if 'out' not in base:
          return {'error': f"no parity base: {row['base']} did not finish at this length"}
        (want, want_stats), check = base['out'], dict(vs=row['base'], all_finite=finite)
        check['out_rel_err'] = _errors(out, want)[0]
        ok = finite and check['out_rel_err'] <= tol['out']
        if stats is not None:
          check['pmax_max_abs_err'] = _errors(stats.pmax, want_stats.pmax)[1]
          check['entropy_max_abs_err'] = _errors(stats.entropy, want_stats.entropy)[1]
          ok = (ok and check['pmax_max_abs_err'] <= tol['pmax']
                and check['entropy_max_abs_err'] <= tol['entropy'])
        check['inputs'] = 'the same q, k, v and table'
        if row['check_padded']:
          padded = common.check_against_reference(row['impl'], plan['heads'], plan['depth'],
                                                  jnp.dtype(plan['dtype']),
                                                  length=plan['check_length'])
          padded['length'] = plan['check_length']
          check['padded_batch_vs_reference'] = padded
          ok = (ok and padded['all_finite'] and padded['out_rel_err'] <= tol['out']
                and padded['pmax_max_abs_err'] <= tol['pmax']
                and padded['entropy_max_abs_err'] <= tol['entropy'])
        return dict(check, ok=bool(ok))

      if row['status'] == 'pending':
        _run_row(_emit, row, measure, parity)


def _model_inputs(row: dict, cache: dict, parts=ENCODER_PARTS):
  """A row's config, the group's random weights (made once: `cache`) and its tokens `[1, L]`.

  The weights are drawn on the device off the CPU (numpy would take about a minute for XXL's),
  with numpy on the CPU (jax.random would compile once per shape: longer, for tiny models).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  config = encoder_bench._config(row)  # pylint: disable=protected-access
  if 'params' not in cache:
    cache['params'] = encoder_bench._random_params(  # pylint: disable=protected-access
        config, config.dtype, parts, on_device=jax.default_backend() != 'cpu')
  tokens = np.random.default_rng(1).integers(2, config.vocab_size, (1, row['length']), np.int32)
  return config, cache['params'], tokens


def _tree_bytes(tree) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree)))


def _encoder_worker(plan: dict, rows: list[dict]) -> None:
  """The 'encoder' and 'xxl' groups: encoder forward passes, checked as `plan['check']` says."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  info = _jax_info()
  tol = _tolerance(plan['dtype'])
  sizes = encoder_bench.MODELS[plan['model']]
  kernel, check_length = next(iter(plan['impls'])), plan['lengths'][0]
  checks, kernel_out = {}, {}  # impl -> its check at check_length; the kernel's output there.
  cache = {}
  for row in rows:
    config, params, tokens = _model_inputs(row, cache)
    model = network.Transformer(config)
    got = {}

    def measure(row=row, model=model, params=params, tokens=tokens, got=got):
      result, got['out'] = _measure(lambda p, t: model.apply(
          {'params': p}, t, method=model.encode, enable_dropout=False), (params, tokens),
          row['repeats'])
      flops = encoder_bench.encoder_flops(sizes, row['length'])
      return dict(result, tflops_per_s=round(flops / result['seconds'] / 1e12, 4),
                  **_kernel_fields(row['impl'], row['length'], row['dtype'],
                                   row['sizes']['head_dim']),
                  weights_bytes=_tree_bytes(params), **info)

    def parity(row=row, params=params, got=got):
      out = got.pop('out')
      finite = _finite(out)
      if plan['check'] == 'attention':  # The kernel at this model's heads, vs 'reference'.
        check = common.check_against_reference(row['impl'], sizes['num_heads'],
                                               sizes['head_dim'], jnp.dtype(plan['dtype']),
                                               length=plan['check_length'])
        ok = (check['all_finite'] and finite and check['out_rel_err'] <= tol['out']
              and check['pmax_max_abs_err'] <= tol['pmax']
              and check['entropy_max_abs_err'] <= tol['entropy'])
        return dict(check, vs='reference', length=plan['check_length'], output_all_finite=finite,
                    inputs=f"attention alone at this model's {sizes['num_heads']} heads x "
                           f"{sizes['head_dim']}, batch 2 (row 1 padded), taus 0.8 / 0.6",
                    ok=bool(ok))
      if row['length'] != check_length:
        return _carried(checks.get(row['impl']), f'{check_length} tokens', all_finite=finite)
      if row['impl'] == kernel:
        kernel_out[check_length] = out
        check = encoder_bench._check_worker(  # pylint: disable=protected-access
            {**row, 'kind': 'forward'}, params=params)
        check.update(vs='reference', inputs='the same weights; batch 2, row 1 padded at 70%',
                     ok=bool(check['all_finite'] and check['out_rel_err'] <= tol['model']))
      elif check_length in kernel_out:
        check = dict(vs=kernel, length=check_length, inputs='the same weights and tokens',
                     out_rel_err=_errors(out, kernel_out[check_length])[0], all_finite=finite)
        check['ok'] = bool(finite and check['out_rel_err'] <= tol['model'])
      else:
        check = {'error': f'no parity base: {kernel} did not finish at {check_length}'}
      checks[row['impl']] = check
      return check

    if row['status'] == 'pending':
      _run_row(_emit, row, measure, parity)


def _sweep_worker(plan: dict, rows: list[dict]) -> None:
  import numpy as np  # pylint: disable=g-import-not-at-top
  from t5align.calibration import stats  # pylint: disable=g-import-not-at-top
  from t5align import jobs  # pylint: disable=g-import-not-at-top
  info = _jax_info()
  tol = _tolerance(plan['dtype'])['sweep']
  sizes = encoder_bench.MODELS[plan['model']]
  taus = encoder_bench.TAUS
  base, checks = {}, {}  # length -> the base's (pmax, entropy); impl -> its first check.
  cache = {}
  for row in rows:
    config, params, tokens = _model_inputs(row, cache)
    tokens = np.asarray(tokens)
    got = {}

    def measure(row=row, config=config, params=params, tokens=tokens, got=got):
      start = time.perf_counter()
      # The program encoder_attention_stats runs, compiled (and kept) for XLA's figures.
      (sweep,) = jobs.CalibrationJob(batch_size=1, tau_batch_size=len(taus)).programs(
          config, None, params, length=row['length'])
      figures = sweep.check_memory('This calibration sweep')
      compile_s = time.perf_counter() - start
      before = common.peak_memory_bytes('jax')
      timing, got['out'] = common.time_calls(
          lambda: stats.encoder_attention_stats(params, config, tokens, taus), lambda x: x,
          row['repeats'])
      flops = len(taus) * encoder_bench.encoder_flops(sizes, row['length'])
      return dict(timing, compile_s=round(compile_s, 3), xla_memory=_xla_memory(figures),
                  **_peak_fields(before, 'jax', _jax_on_device()),
                  tflops_per_s=round(flops / timing['seconds'] / 1e12, 4),
                  pmax=[round(float(x), 6) for x in got['out'].pmax],
                  entropy=[round(float(x), 5) for x in got['out'].entropy],
                  tau_chunk=stats.default_tau_chunk(), weights_bytes=_tree_bytes(params),
                  **_kernel_fields(row['impl'], row['length'], row['dtype'],
                                   row['sizes']['head_dim']), **info)

    def parity(row=row, got=got):
      out = got.pop('out')
      pmax, entropy = np.asarray(out.pmax, np.float64), np.asarray(out.entropy, np.float64)
      finite = bool(np.isfinite(pmax).all() and np.isfinite(entropy).all())
      if row['impl'] == row['base']:
        base[row['length']] = (pmax, entropy)
        return dict(role='the parity base at this length', all_finite=finite)
      if row['length'] not in base:
        first = min(base) if base else None
        return _carried(checks.get(row['impl']), f'{first} tokens', all_finite=finite)
      want_pmax, want_entropy = base[row['length']]
      check = dict(vs=row['base'], length=row['length'], all_finite=finite,
                   inputs='the same weights, tokens and 11 taus',
                   pmax_max_abs_err=float(np.abs(pmax - want_pmax).max()),
                   entropy_max_abs_err=float(np.abs(entropy - want_entropy).max()))
      check['ok'] = bool(finite and check['pmax_max_abs_err'] <= tol
                         and check['entropy_max_abs_err'] <= tol)
      checks.setdefault(row['impl'], check)
      return check

    if row['status'] == 'pending':
      _run_row(_emit, row, measure, parity)


def _decode_worker(plan: dict, rows: list[dict]) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from t5align import decoding  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  info = _jax_info()
  steps = plan['tokens']
  tol = _tolerance(plan['dtype'])['model']
  cache = {}
  for row in rows:
    config, params, tokens = _model_inputs(row, cache, (*ENCODER_PARTS, 'decoder'))
    model = network.Transformer(config)
    got = {}

    def measure(row=row, model=model, params=params, tokens=tokens, got=got):
      # eos_id -1: never stops early, so that every row decodes `steps` tokens.
      result, out = _measure(lambda p, t: decoding.greedy(
          model, p, t, max_decode_length=steps, eos_id=-1), (params, tokens), row['repeats'])
      got['tokens'] = np.asarray(out[0])
      return dict(result, **_kernel_fields(row['impl'], row['length'], row['dtype'],
                                           row['sizes']['head_dim']),
                  output_tokens=[int(x) for x in got['tokens']],
                  weights_bytes=_tree_bytes(params), **info)

    def parity(model=model, params=params, tokens=tokens, got=got):
      # The greedy tokens teacher-forced through the parallel decoder (no cache; the scoring
      # path) over the same input: each must be its position's argmax, up to rounding. The gap
      # is the argmax's logit minus the token's, over the argmax's distance from the mean logit;
      # bfloat16 leaves near-ties (random weights, two programs rounding differently), so the
      # tokens themselves may differ where the gap is within the dtype's tolerance.
      out = got.pop('tokens')  # [t]
      previous = np.concatenate([[0], out[:-1]])[None].astype(np.int32)  # [1, t], start 0

      def forced(p, t, previous):
        encoded = model.apply({'params': p}, t, method=model.encode, enable_dropout=False)
        # [1, t, vocab]
        return model.apply({'params': p}, encoded, t, previous, jnp.ones_like(previous),
                           enable_dropout=False, method=model.decode)

      logits = np.asarray(jax.jit(forced)(params, tokens, previous)[0], np.float32)  # [t, vocab]
      top = logits.max(-1)
      gap = (top - logits[np.arange(len(out)), out]) / (top - logits.mean(-1))
      largest = float(gap.max())
      return dict(vs='teacher_forced', inputs='the same weights and input; the greedy tokens '
                  'fed to the decoder without its cache',
                  argmax_tokens=int((logits.argmax(-1) == out).sum()), tokens=steps,
                  largest_relative_gap=largest, all_finite=bool(np.isfinite(logits).all()),
                  ok=bool(np.isfinite(logits).all() and largest <= tol))

    if row['status'] == 'pending':
      _run_row(_emit, row, measure, parity)


def _hf_worker(plan: dict, rows: list[dict]) -> None:
  """HuggingFace rows, in a torch process (no JAX here)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  device, dtype = common.torch_device_and_dtype(plan['dtype'])
  info = dict(device=torch.cuda.get_device_name() if device == 'cuda' else 'cpu',
              versions=_versions('torch', 'transformers'))
  block = common.torch_block(device)
  sizes = encoder_bench.MODELS[plan['model']]
  tol = _tolerance(plan['dtype'])['model']
  eager = {}  # length -> (eager row id, its output): sdpa's parity base.
  weights_note = ("HF's own random init (torch.manual_seed(0)), not t5align's weights: only "
                  'times compare across frameworks')

  def build(cls, config):
    torch.manual_seed(0)  # The same weights for every attention implementation.
    torch.set_default_dtype(dtype)
    try:
      with torch.device(device):
        return cls(config).eval()
    finally:
      torch.set_default_dtype(torch.float32)

  for row in rows:
    if row['status'] != 'pending':
      continue
    tokens = torch.randint(2, sizes['vocab_size'], (1, row['length']),
                           generator=torch.Generator().manual_seed(1)).to(device)
    got = {}

    def measure(row=row, tokens=tokens, got=got):
      if device == 'cuda':
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
      before = common.peak_memory_bytes('torch')
      held = {}  # The model, dropped once timed.
      if row['kind'] == 'hf_encoder':
        held['model'] = build(transformers.T5EncoderModel,
                              encoder_bench.hf_config(sizes, row['impl']))
        call = lambda: held['model'](input_ids=tokens).last_hidden_state
      else:
        held['model'] = build(transformers.T5ForConditionalGeneration, encoder_bench.hf_config(
            sizes, row['impl'], decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
        call = lambda: held['model'].generate(input_ids=tokens, max_new_tokens=row['tokens'],
                                              min_new_tokens=row['tokens'], do_sample=False)
      with torch.no_grad():
        timing, got['out'] = common.time_calls(call, block, row['repeats'])
      held.clear()
      fields = dict(timing, **_peak_fields(before, 'torch', device == 'cuda'),
                    weights=weights_note, **info)
      if row['kind'] == 'hf_encoder':
        flops = encoder_bench.encoder_flops(sizes, row['length'])
        fields['tflops_per_s'] = round(flops / timing['seconds'] / 1e12, 4)
      return fields

    def parity(row=row, got=got):
      out = got.pop('out')
      finite = bool(torch.isfinite(out.float()).all()) if out.is_floating_point() else True
      if row['kind'] == 'hf_generate':
        new = int(out.shape[1]) - 1  # After the decoder start token.
        return dict(role='generated the asked number of tokens (its weights are not '
                    "t5align's: no token comparison)", generated_tokens=new,
                    ok=new == row['tokens'])
      if row['impl'] == 'eager':
        eager[row['length']] = (row['id'], out)
        return dict(role="HF's eager attention: the base of sdpa's check", all_finite=finite)
      if row['length'] not in eager:
        return {'error': f'no parity base: HF eager did not finish at {row["length"]}'}
      base_id, want = eager.pop(row['length'])
      want, out = want.float(), out.float()
      error = float((out - want).norm() / want.norm())
      return dict(vs=base_id, inputs='the same weights and tokens', out_rel_err=error,
                  all_finite=finite, ok=bool(finite and error <= tol))

    _run_row(_emit, row, measure, parity)
    if device == 'cuda':
      torch.cuda.empty_cache()


def _env_worker() -> None:
  import jax  # pylint: disable=g-import-not-at-top
  from t5align.attention import dispatch  # pylint: disable=g-import-not-at-top
  backend = jax.default_backend()
  device = jax.devices()[0]
  # This platform's fused kernels: those that compile for it and not for the CPU; 'pallas' is
  # the one of them picked for the GPU run's attention rows.
  kernels = [name for name, impl in dispatch.IMPLEMENTATIONS.items()
             if backend in impl.platforms and 'cpu' not in impl.platforms]
  rows = GPU_PLAN['attention']
  fused = (dispatch.resolve('pallas', 1, 0, input_dtype=rows['dtype'], dtype=rows['dtype'],
                            head_dim=rows['depth']) if backend in dispatch.FUSED else None)
  _emit('env', backend=backend, device=str(device.device_kind), device_count=jax.device_count(),
        memory_bytes=(device.memory_stats() or {}).get('bytes_limit'),
        fused=fused, kernels=kernels,
        jax_platforms=os.environ.get('JAX_PLATFORMS'),
        versions=_versions(*_JAX_DISTRIBUTIONS, 'numpy'))


# What a waiting worker imports before it waits (`_worker`).
IMPORTS = {'hf': ('torch', 'transformers.models.t5.modeling_t5', 'transformers.generation')}
WORKERS = {'attention': _attention_worker, 'encoder': _encoder_worker, 'xxl': _encoder_worker,
           'sweep': _sweep_worker, 'decode': _decode_worker, 'hf': _hf_worker}


def _worker(work: list[dict]) -> None:
  """A subprocess's work: groups' rows (`{group, plan, rows, wait}` each, in order), one `MARK`
  line per update on stdout. `wait`: the group's libraries are imported first, then its rows wait
  for a line on stdin (the HF worker imports torch while the JAX workers run, and touches the GPU
  only after they have ended)."""
  for spec in work:
    if spec['group'] == 'env':
      _env_worker()
      continue
    if spec.get('wait'):
      for module in IMPORTS.get(spec['group'], ()):
        try:
          importlib.import_module(module)
        except ImportError:  # The group's own imports will say so, in its rows.
          traceback.print_exc()
      sys.stdin.readline()
    if spec['rows']:
      WORKERS[spec['group']](spec['plan'], spec['rows'])


if __name__ == '__main__':
  sys.exit(main())
