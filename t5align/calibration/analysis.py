"""Diagnostics of dispersed attention and of the calibration (paper Table 1, Figures 1, 3-5).

`collect` runs the model once per length and returns plain numbers (JSON-able); the plotting
functions only read those numbers, so a saved analysis.json can be re-plotted without a model.
Figures are written with matplotlib's Agg backend (no display needed).
"""
from __future__ import annotations

import json
import statistics as pystats
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from t5align.attention import reference
from t5align.calibration import closed_form
from t5align.calibration import search
from t5align.calibration import stats as stats_lib
from t5align import network
from t5align import partitioning
from t5align.runtime import batching
from t5align.runtime import fileio
from t5align.runtime import outputs
from t5align.runtime import validate


def pyplot():
  """matplotlib.pyplot on the file-only Agg backend (no display needed)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def qq_points(vector: Any, points: int = 256) -> dict[str, list[float]]:
  """Normal QQ data of a vector: standard-normal quantiles vs its standardized sorted entries.

  Args:
    vector: `[L]` values (e.g. layer 0's average sorted logit vector).
    points: at most this many evenly spaced quantiles are kept.

  Returns:
    {'theoretical': `[p]`, 'sample': `[p]`}; on the line y = x when the entries are Gaussian.
  """
  v = np.sort(np.asarray(vector, np.float64))
  std = v.std()
  z = (v - v.mean()) / (std if std > 0 else 1.0)
  idx = np.unique(np.linspace(0, len(v) - 1, min(points, len(v))).round().astype(int))
  normal = pystats.NormalDist()
  theory = [normal.inv_cdf((i + 0.5) / len(v)) for i in idx]
  return {'theoretical': theory, 'sample': z[idx].tolist()}


def relpos_bias_row(rel_embedding: Any, length: int, query_position: int) -> np.ndarray:
  """b(m, n) for query m = `query_position` and keys n = 0..length-1: float32 `[heads, length]`."""
  table = np.asarray(rel_embedding, np.float32)
  bias = reference.relative_position_bias(table, 1, length, True, q_offset=query_position)
  return np.asarray(bias)[0, :, 0, :]  # [1, h, 1, l] -> [h, l]


def collect(params: Any, config: network.T5Config, tokens: Any, lengths: Sequence[int], *,
            reference_length: int = 512, grid: Sequence[float] = search.PAPER_GRID,
            eos_id: int | None = 1, qq_size: int = 256, chunk: int = 128,
            memo: stats_lib.Memo | None = None,
            layer0_tokens: Mapping[int, Any] | None = None, **stats_kwargs) -> dict[str, Any]:
  """Statistics for the analysis: curves over `grid` and layer-0 logit summaries per length.

  Args:
    params: the T5X 'params' tree.
    config: the model config.
    tokens: int `[b, >= max(lengths)]` samples, every length (and L_tr) using them cut to it;
      or {length: [int `[b_g, length]` arrays]} for L_tr and every length, groups (e.g. each
      task's prompts at that length) whose statistics are pooled over their rows
      (`Memo.pooled_stats`: a calibration's per-group sweeps are reused, not recomputed).
    lengths: extrapolation lengths L_ex.
    reference_length: L_tr.
    grid: candidate taus (1.0 is always added).
    eos_id: end id of rows cut short.
    qq_size: quantiles kept for the QQ plots.
    chunk: query chunk of the layer-0 sorted-logit computation.
    memo: results already computed for this model (e.g. by `calibration.build_schedule`).
    layer0_tokens: {length: int `[b, length]`} the samples of layer 0's sorted logits (the
      costliest part at long lengths: each row's logits sorted); None: every sample.
    **stats_kwargs: passed to `calibration.encoder_attention_stats` (mesh, batch_size, ...).

  Returns:
    JSON-able dict: 'reference_length', 'lengths' (L_tr first), 'grid', per-length 'statistics'
    (pooled 'pmax'/'entropy' over the grid, per-layer values at tau = 1 and per-head ones,
    'head_pmax_tau1' / 'head_entropy_tau1' `[layers][heads]`) and 'layer0' (sigma,
    P_max and centred max of the average sorted logit vector, QQ data), and the encoder's
    relative-position table 'rel_embedding' `[heads, buckets]`.
  """
  grid = sorted(set(float(t) for t in validate.temperature_array(grid, 'grid')) | {1.0},
                reverse=True)
  all_lengths = [reference_length] + sorted(int(L) for L in set(lengths) if L != reference_length)
  for L in all_lengths[1:]:
    stats_lib.check_lengths(L, reference_length)
  if isinstance(tokens, Mapping):
    missing = [L for L in all_lengths if not tokens.get(L)]
    if missing:
      raise ValueError(f'tokens has no samples for lengths {missing}; it needs L_tr '
                       f'({reference_length}) and every length.')
    groups = {L: [stats_lib.check_tokens(g, f'tokens[{L}]') for g in tokens[L]]
              for L in all_lengths}
  else:
    tokens = stats_lib.check_tokens(tokens)
    groups = {L: [stats_lib.cut_to_length(tokens, L, eos_id)] for L in all_lengths}
  params = partitioning.place_params(params, config, stats_kwargs.get('mesh'))
  memo = memo if memo is not None else stats_lib.Memo()
  numbers = {'reference_length': reference_length, 'lengths': all_lengths, 'grid': grid,
             'statistics': {}, 'layer0': {}}
  one = grid.index(1.0)
  for L in all_lengths:
    stats = memo.pooled_stats(params, config, groups[L], grid, **stats_kwargs)
    numbers['statistics'][str(L)] = {
        'pmax': stats.pmax.tolist(), 'entropy': stats.entropy.tolist(),
        'layer_pmax_tau1': stats.layer_pmax[one].tolist(),
        'layer_entropy_tau1': stats.layer_entropy[one].tolist(),
        'head_pmax_tau1': stats.head_pmax[one].tolist(),
        'head_entropy_tau1': stats.head_entropy[one].tolist()}
    if layer0_tokens is not None and L in layer0_tokens:
      samples = stats_lib.check_tokens(layer0_tokens[L], f'layer0_tokens[{L}]')
    else:
      width = max(g.shape[1] for g in groups[L])
      # [b_g, w_g] -> [sum b_g, width], 0-padded
      samples = np.concatenate([np.pad(g, ((0, 0), (0, width - g.shape[1]))) for g in groups[L]])
    vector = memo.sorted_logits(params, config, samples, chunk)
    summary = closed_form.summarize_logit_vector(vector)
    numbers['layer0'][str(L)] = {**summary._asdict(), 'qq': qq_points(vector, qq_size)}
  numbers['rel_embedding'] = np.asarray(
      jax.device_get(params['encoder']['relpos_bias']['rel_embedding']), np.float64).tolist()
  return numbers


def algorithm1_taus(numbers: Mapping[str, Any], statistic: str) -> dict[int, float]:
  """Algorithm 1 on the collected curves: per L_ex, the grid tau closest to the L_tr value."""
  grid = np.asarray(numbers['grid'])
  stats = numbers['statistics']
  ref = stats[str(numbers['reference_length'])][statistic][list(grid).index(1.0)]
  return {L: float(grid[np.argmin(np.abs(np.asarray(stats[str(L)][statistic]) - ref))])
          for L in numbers['lengths'][1:]}


def closed_form_curves(numbers: Mapping[str, Any], points: int = 64) -> dict[str, list[float]]:
  """Propositions 1-2 and log-length over a dense length grid (sigma_ex interpolated in log L).

  Returns:
    {'length': `[p]`, 'prop1': `[p]` (NaN where Prop. 1 has no real root), 'prop2': `[p]`,
    'log_length': `[p]`}.
  """
  measured = np.asarray(numbers['lengths'], np.float64)
  sigma = np.asarray([numbers['layer0'][str(int(L))]['sigma'] for L in measured])
  ref = numbers['layer0'][str(numbers['reference_length'])]
  dense = np.unique(np.concatenate([np.geomspace(measured[0], measured[-1], points), measured]))
  sigma_ex = np.interp(np.log(dense), np.log(measured), sigma)
  L_tr = numbers['reference_length']
  # P_tr as `calibration.reference_pmax`: layer 0's mean row P_max at L_tr, tau = 1.
  p_tr = numbers['statistics'][str(L_tr)]['layer_pmax_tau1'][0]
  return {'length': dense.tolist(),
          'prop1': closed_form.prop1_tau(L_tr, dense, ref['sigma'], sigma_ex, p_tr).tolist(),
          'prop2': closed_form.prop2_tau(L_tr, dense, ref['sigma'], sigma_ex).tolist(),
          'log_length': np.atleast_1d(closed_form.log_length_tau(dense, L_tr)).tolist()}


def dispersion_table(numbers: Mapping[str, Any]) -> str:
  """Paper Table 1: mean P_max and entropy (nats) at tau = 1 for L_tr and every L_ex."""
  one = list(numbers['grid']).index(1.0)
  head = f'{"length":<10}' + ''.join(f'{L:>10}' for L in numbers['lengths'])
  rows = [head]
  for key, label in (('pmax', 'P_max'), ('entropy', 'H')):
    values = [numbers['statistics'][str(L)][key][one] for L in numbers['lengths']]
    rows.append(f'{label:<10}' + ''.join(f'{v:>10.4f}' for v in values))
  return '\n'.join(rows)


def head_dispersion(numbers: Mapping[str, Any], key: str) -> np.ndarray:
  """`[lengths, layers, heads]` per-head mean row statistic at tau = 1 ('pmax' or 'entropy'),
  lengths in `numbers['lengths']` order (L_tr first)."""
  return np.asarray([numbers['statistics'][str(L)][f'head_{key}_tau1']
                     for L in numbers['lengths']], np.float64)


def head_dispersion_table(numbers: Mapping[str, Any]) -> str:
  """Per-head dispersion at tau = 1: mean P_max and entropy of every head of every layer, one
  column per length, and the change from L_tr to the longest length (a local head keeps its
  P_max; a dispersing one loses it)."""
  lengths = numbers['lengths']
  head = f'{"layer head":<12}' + ''.join(f'{L:>9}' for L in lengths) + f'{"change":>9}'
  lines = ['Per-head dispersion (tau = 1)']
  for key, label in (('pmax', 'P_max'), ('entropy', 'H (nats)')):
    values = head_dispersion(numbers, key)  # [lengths, n, h]
    lines += ['', label, head, '-' * len(head)]
    for layer in range(values.shape[1]):
      for h in range(values.shape[2]):
        row = values[:, layer, h]
        lines.append(f'{f"L{layer} h{h}":<12}' + ''.join(f'{v:>9.4f}' for v in row)
                     + f'{row[-1] - row[0]:>+9.4f}')
  return '\n'.join(lines)


def lmax_table(numbers: Mapping[str, Any]) -> str:
  """Paper Table 7: l_max, the largest entry of layer 0's average sorted logit vector (centred:
  the derivation of Prop. 1 makes the vector zero-mean), at L_tr and every L_ex (Assumption 2
  says it stays the same)."""
  head = f'{"length":<10}' + ''.join(f'{L:>10}' for L in numbers['lengths'])
  values = [numbers['layer0'][str(L)]['lmax'] for L in numbers['lengths']]
  return '\n'.join([head, f'{"l_max":<10}' + ''.join(f'{v:>10.4f}' for v in values)])


def task_statistics(params: Any, config: network.T5Config,
                    task_inputs: Mapping[str, tuple[Any, Any]], *,
                    chunk: int = 128, memo: stats_lib.Memo | None = None,
                    **stats_kwargs) -> dict[str, dict[str, dict[str, float]]]:
  """Tables 1 and 7 per task: at tau = 1, mean P_max, mean entropy and layer 0's l_max of each
  task's L_tr reference and of its long inputs.

  Args:
    task_inputs: {task: (tokens `[b, L_ex]`, reference `[b', <= L_tr]`)}, as for
      `calibration.calibrate_tasks` (whose Memo can be passed to reuse its sweeps).

  Returns:
    {task: {'reference' | 'long': {'length', 'pmax', 'entropy', 'lmax'}}}.
  """
  memo = memo if memo is not None else stats_lib.Memo()
  params = partitioning.place_params(params, config, stats_kwargs.get('mesh'))
  out = {}
  for task, pair in task_inputs.items():
    out[task] = {}
    for key, tokens in zip(('long', 'reference'), pair):
      tokens = stats_lib.check_tokens(tokens)
      stats = memo.attention_stats(params, config, tokens, [1.0], **stats_kwargs)
      vector = memo.sorted_logits(params, config, tokens, chunk)
      out[task][key] = {'length': int(tokens.shape[1]), 'pmax': float(stats.pmax[0]),
                        'entropy': float(stats.entropy[0]),
                        'lmax': closed_form.summarize_logit_vector(vector).lmax}
  return out


def task_tables(tasks: Mapping[str, Mapping[str, Mapping[str, float]]]) -> str:
  """Tables 1 and 7 in the paper's layout: per task, the L_tr and L_ex columns; rows P_max, H
  (Table 1) and l_max (Table 7)."""
  head1 = f'{"Criteria":<10}' + ''.join(f'{t[:20]:>20}' for t in tasks)
  head2 = f'{"":<10}' + ''.join(f'{v["reference"]["length"]:>10}{v["long"]["length"]:>10}'
                                for v in tasks.values())
  lines = ['Dispersion per task (paper Tables 1 and 7; tau = 1; columns: L_tr reference, L_ex)',
           head1, head2, '-' * len(head1)]
  for key, label, fmt in (('pmax', 'P_max', '.4f'), ('entropy', 'H', '.3f'),
                          ('lmax', 'l_max', '.3f')):
    lines.append(f'{label:<10}' + ''.join(
        f'{v["reference"][key]:>10{fmt}}{v["long"][key]:>10{fmt}}' for v in tasks.values()))
  return '\n'.join(lines)


def plot_statistic_curves(numbers: Mapping[str, Any], path: str) -> None:
  """Figures 3-4 (left): statistic vs tau per length, L_tr target dashed, Algorithm 1 tau marked."""
  plt = pyplot()
  grid = np.asarray(numbers['grid'])
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for ax, key, label in zip(axes, ('pmax', 'entropy'), ('mean P_max', 'mean entropy (nats)')):
    chosen = algorithm1_taus(numbers, key)
    target = numbers['statistics'][str(numbers['reference_length'])][key][list(grid).index(1.0)]
    ax.axhline(target, color='k', ls='--', lw=1, label=f'L_tr={numbers["reference_length"]}')
    for L in numbers['lengths'][1:]:
      values = np.asarray(numbers['statistics'][str(L)][key])
      line, = ax.plot(grid, values, marker='.', label=f'L_ex={L}')
      ax.plot([chosen[L]], [values[list(grid).index(chosen[L])]], marker='o', ms=9,
              mfc='none', color=line.get_color())
    ax.set_xlabel('tau')
    ax.set_ylabel(label)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fileio.save_figure(fig, path, dpi=120)
  plt.close(fig)


def plot_temperature_curves(numbers: Mapping[str, Any], path: str,
                            schedule: Any = None) -> None:
  """Figures 3-4: tau vs L_ex from Props. 1-2 (curves), Algorithm 1 (dots, crosses), log-length.

  Scalar strategies of `schedule` (a TemperatureSchedule), if given, are overlaid as markers.
  """
  plt = pyplot()
  curves = closed_form_curves(numbers)
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(curves['length'], curves['prop1'], label='Prop. 1 (P_max)')
  ax.plot(curves['length'], curves['prop2'], label='Prop. 2 (H)')
  ax.plot(curves['length'], curves['log_length'], 'k:', label='log_L L_tr')
  for key, marker in (('pmax', 'o'), ('entropy', 'x')):
    taus = algorithm1_taus(numbers, key)
    ax.plot(list(taus), list(taus.values()), marker, ls='none', label=f'Alg. 1 {key}')
  if schedule is not None:
    for name in schedule.strategies:
      lengths, taus = schedule.points(name)
      if taus.ndim == 1 and name not in ('pmax', 'entropy', 'log_length'):
        ax.plot(lengths[1:], taus[1:], marker='+', ls='none', label=f'schedule {name}')
  ax.axvline(numbers['reference_length'], color='0.5', ls='--', lw=1)
  # Base-2 log axis labelled at the measured lengths only (no minor labels to collide).
  ax.set_xscale('log', base=2)
  ax.set_xticks(numbers['lengths'], [str(L) for L in numbers['lengths']])
  ax.minorticks_off()
  ax.set_xlabel(f'L_ex (tokens; dashed: L_tr = {numbers["reference_length"]})')
  ax.set_ylabel('tau')
  ax.legend(fontsize=7)
  fig.tight_layout()
  fileio.save_figure(fig, path, dpi=120)
  plt.close(fig)


def plot_head_dispersion(numbers: Mapping[str, Any], path: str, max_columns: int = 6) -> None:
  """Per-head dispersion: mean P_max (upper panels) and entropy (lower panels) at tau = 1
  against length, one panel per layer (`max_columns` layers a row), one line per head (T5's
  local heads keep their P_max as inputs grow)."""
  plt = pyplot()
  lengths = np.asarray(numbers['lengths'])
  keys = (('pmax', 'mean P_max'), ('entropy', 'mean entropy (nats)'))
  values = {key: head_dispersion(numbers, key) for key, _ in keys}  # [lengths, n, h] each
  layers, heads = values['pmax'].shape[1:]
  cols = min(max_columns, layers)
  rows = batching.ceil_div(layers, cols)  # per statistic
  fig, axes = plt.subplots(2 * rows, cols, figsize=(3 * cols, 2.6 * 2 * rows), squeeze=False)
  for k, (key, label) in enumerate(keys):
    for layer in range(rows * cols):
      ax = axes[k * rows + layer // cols, layer % cols]
      if layer >= layers:
        ax.axis('off')
        continue
      for h in range(heads):
        ax.plot(lengths, values[key][:, layer, h], marker='.', lw=1, label=f'head {h}')
      ax.axvline(numbers['reference_length'], color='k', ls='--', lw=0.8)
      ax.set_xscale('log')
      ax.minorticks_off()
      ax.set_xticks(lengths, [str(L) for L in lengths])
      ax.tick_params(labelsize=6)
      ax.set_title(f'layer {layer}', fontsize=8)
      ax.set_xlabel('length', fontsize=7)
      if layer % cols == 0:
        ax.set_ylabel(label, fontsize=8)
  # One legend for every panel, below them (inside a panel it would hide lines).
  fig.legend(*axes[0, 0].get_legend_handles_labels(), loc='lower center', fontsize=6,
             ncol=min(heads, 8))
  fig.suptitle('per-head dispersion at tau = 1 (dashed: L_tr)', fontsize=9)
  fig.tight_layout(rect=(0, 0.03 * batching.ceil_div(heads, 8), 1, 1))
  fileio.save_figure(fig, path, dpi=120)
  plt.close(fig)


def check_heads(heads: Any, num_heads: int | None = None, name: str = 'heads') -> list[int]:
  """`heads` (Figure 1's, 0-based) as a list of ints; raises ValueError naming `name`
  ('RELPOS_HEADS') and its value unless they are a non-empty sequence of ints >= 0, each below
  `num_heads` (the model's head count; None: the range is not checked).
  """
  shown = f'{name}={heads!r}'
  if isinstance(heads, np.ndarray):
    heads = heads.tolist()
  if (isinstance(heads, (str, bytes)) or not isinstance(heads, Sequence) or not heads
      or any(isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 0 for h in heads)):
    raise ValueError(f'{shown}: expected a non-empty tuple of 0-based head indices, e.g. (0, 2).')
  heads = [int(h) for h in heads]
  if num_heads is not None:
    bad = [h for h in heads if h >= num_heads]
    if bad:
      raise ValueError(f'{shown}: head {bad[0]} is past the model, which has {num_heads} heads, '
                       f'0..{num_heads - 1}; give heads (0-based) in that range.')
  return heads


def plot_relpos_bias(rel_embedding: Any, length: int, path: str,
                     query_position: int | None = None, max_heads: int = 16,
                     heads: Sequence[int] | None = None) -> np.ndarray:
  """Figure 1: b(m, n) against key position n for a fixed query m, one panel per head.

  Args:
    heads: 0-based heads to draw (the paper's Figure 1 shows chosen heads); default the first
      `max_heads`.

  Returns:
    The plotted `[len(heads), length]` values.
  """
  plt = pyplot()
  m = length // 2 if query_position is None else query_position
  all_values = relpos_bias_row(rel_embedding, length, m)
  if heads is None:
    heads = list(range(min(max_heads, len(all_values))))
  heads = check_heads(heads, len(all_values))
  values = all_values[heads]
  cols = min(4, len(values))
  rows = batching.ceil_div(len(values), cols)
  fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 2.2 * rows), squeeze=False)
  for h, ax in enumerate(axes.flat):
    if h >= len(values):
      ax.axis('off')
      continue
    ax.plot(np.arange(length), values[h], lw=1)
    ax.axvline(m, color='0.6', ls=':', lw=1)
    ax.set_title(f'head {heads[h]}', fontsize=8)
    ax.tick_params(labelsize=6)
    if h // cols == rows - 1 or h + cols >= len(values):  # Bottom panel of its column.
      ax.set_xlabel('key position n', fontsize=7)
    if h % cols == 0:
      ax.set_ylabel(f'b(m={m}, n)', fontsize=7)
  fig.suptitle(f'relative position bias b(m, n) for query m = {m} (dotted), keys n = '
               f'0..{length - 1}', fontsize=9)
  fig.tight_layout()
  fileio.save_figure(fig, path, dpi=120)
  plt.close(fig)
  return values


def plot_qq(numbers: Mapping[str, Any], path: str) -> None:
  """Figure 5: QQ plots of layer 0's average sorted logit vector, shortest and longest length."""
  plt = pyplot()
  shown = [numbers['lengths'][0], numbers['lengths'][-1]]
  fig, axes = plt.subplots(1, len(shown), figsize=(4 * len(shown), 4), squeeze=False)
  for ax, L in zip(axes.flat, shown):
    qq = numbers['layer0'][str(L)]['qq']
    ax.scatter(qq['theoretical'], qq['sample'], s=4)
    lim = max(np.abs(qq['theoretical']).max(), np.abs(qq['sample']).max())
    ax.plot([-lim, lim], [-lim, lim], 'r-', lw=1)
    ax.set_title(f'L = {L}', fontsize=9)
    ax.set_xlabel('standard normal quantiles')
    ax.set_ylabel('standardized logits')
  fig.tight_layout()
  fileio.save_figure(fig, path, dpi=120)
  plt.close(fig)


def write_analysis(numbers: Mapping[str, Any], out_dir: str, schedule: Any = None, *,
                   tasks: Mapping[str, Any] | None = None,
                   heads: Sequence[int] | None = None) -> dict:
  """Writes analysis.json (the numbers), dispersion.txt and five PNG figures into `out_dir`.

  dispersion.txt holds Table 1 (`dispersion_table`), Table 7 (`lmax_table`), with `tasks`
  (`task_statistics`) both per task (`task_tables`), and the per-head dispersion
  (`head_dispersion_table`; figure head_dispersion.png). `heads`: Figure 1's heads (0-based).

  Returns:
    {name: path} of the written files.

  Raises:
    ValueError: `heads` outside the model's, before any file is written (`check_heads`).
  """
  if heads is not None:
    check_heads(heads, int(np.shape(numbers['rel_embedding'])[0]))
  fileio.makedirs(out_dir)
  paths = {name: fileio.join(out_dir, name) for name in (
      'analysis.json', 'dispersion.txt', 'statistic_curves.png', 'temperature_curves.png',
      'relpos_bias.png', 'qq_layer0.png', 'head_dispersion.png')}
  tables = [dispersion_table(numbers), lmax_table(numbers)]
  if tasks:
    tables.append(task_tables(tasks))
  tables.append(head_dispersion_table(numbers))
  record = {**numbers, 'dispersion_table': dispersion_table(numbers),
            'lmax_table': lmax_table(numbers), 'tasks': dict(tasks or {}),
            'algorithm1': {k: algorithm1_taus(numbers, k) for k in ('pmax', 'entropy')},
            'closed_form_curves': closed_form_curves(numbers)}
  # NaN (Prop. 1 without a real root) is written as null.
  fileio.write_atomic(paths['analysis.json'],
                      json.dumps(outputs.jsonable(record, non_finite='null'), indent=1))
  fileio.write_atomic(paths['dispersion.txt'], '\n\n'.join(tables) + '\n')
  plot_statistic_curves(numbers, paths['statistic_curves.png'])
  plot_temperature_curves(numbers, paths['temperature_curves.png'], schedule)
  plot_relpos_bias(numbers['rel_embedding'], numbers['lengths'][-1], paths['relpos_bias.png'],
                   heads=heads)
  plot_qq(numbers, paths['qq_layer0.png'])
  plot_head_dispersion(numbers, paths['head_dispersion.png'])
  return paths
