"""What gpu_check runs: its groups, the GPU and smoke plans, every row planned, parity tolerances.

A plan says, per group, the shapes, dtype, repeats, time limit and the implementations with the
lengths each runs at; `plan_rows` turns a plan and the environment probe's answer into the run's
rows (`id`, what runs, `status` 'pending' or 'skipped' with its `reason`, and `compare_to`: the
row whose seconds its ratio is taken against). benchmarks/gpu_check.py's docstring says what each
group measures and checks.
"""
from __future__ import annotations

from benchmarks import encoder_bench

GROUPS = ('tests', 'attention', 'encoder', 'sweep', 'xxl', 'decode', 'hf')
TEST_FILES = ('tests/attention/pallas_mgpu_test.py', 'tests/attention/attention_test.py',
              'tests/model/network_impl_test.py', 'tests/model/network_test.py')


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
# The same kinds of rows at tiny shapes, float32, on the CPU: every code path of gpu_rows at
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
MATERIALIZED = ('cudnn_bias', 'xla_bias')  # jax.nn.dot_product_attention, bias [1, h, L, L].
JAX_NN = ('cudnn_nobias', 'cudnn_bias', 'xla_nobias', 'xla_bias')


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
                 with_stats=impl not in JAX_NN, base=base,
                 check_padded=impl in padded and length == attention['lengths'][0],
                 bias=('materialized [1, h, L, L] from the table, in the timed call'
                       if impl in MATERIALIZED else 'none' if impl in JAX_NN
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
    compare = compare_to(row, plan)
    if compare:
      row['compare_to'] = compare
  return rows


def compare_to(row: dict, plan: dict) -> dict | None:
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


def batches(together: tuple[tuple[str, ...], ...]) -> list[tuple[str, ...]]:
  """`GROUPS` in order as the worker batches they run in: the groups of one `together` entry
  share a process (where the first of them comes), every other group runs alone."""
  out = []
  for group in GROUPS:
    shared = next((b for b in together if group in b), (group,))
    if shared not in out:
      out.append(shared)
  return out


def tolerance(dtype: str) -> dict:
  """The parity tolerances (`TOLERANCE`) of a run in `dtype`."""
  return TOLERANCE['float32' if dtype == 'float32' else 'bfloat16']
