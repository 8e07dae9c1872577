"""What the demo's report says: report.md (`write_report`) with its headline, per-task accuracy,
temperature and spread tables, the observations read off the numbers (better or worse than
tau = 1 only where the 95% intervals do not overlap), and the accuracy figure.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from t5align import calibration
from t5align import labels
from t5align.evaluation import markdown
from t5align.evaluation import tables
from t5align.demo import planning
from t5align.runtime import fileio
from t5align.shipped import train_data


def _cell(results: Mapping[str, Any], row: str, task: str, length: int) -> float | None:
  return results['accuracy'].get(row, {}).get(task, {}).get(str(length))


def accuracy_table(results: Mapping[str, Any], rows: Sequence[str], task: str,
                   lengths: Sequence[int]) -> str:
  """Markdown: one row per strategy evaluated on `task`, one column per length, accuracy in
  percent with its 95% Wilson interval over the run's `num_examples` examples ('90 [79-96]')."""
  trials = results['settings']['num_examples']
  table = []
  for row in rows:
    cells = [_cell(results, row, task, L) for L in lengths]
    if all(c is None for c in cells):
      continue
    table.append([labels.row_label(row),
                  *('' if c is None else tables.accuracy_cell(c, trials) for c in cells)])
  return markdown.markdown_table(['', *map(str, lengths)], table)


def headline_table(results: Mapping[str, Any], plan: planning.Plan) -> str:
  """Markdown: strategy x length, each cell the tuned tasks' accuracies (%) in `TASKS` order;
  with --controls one more row gives the control tasks at tau = 1."""
  tuned = [t for t in plan.tasks if t in plan.tuned_tasks]
  controls = list(plan.control_tasks)
  header = [f'accuracy % ({" / ".join(tuned)})',
            *(f'{L} (L_tr)' if L == plan.reference_length else str(L)
              for L in plan.eval_lengths)]
  fmt = lambda row, tasks, L: '/'.join(
      '-' if _cell(results, row, t, L) is None else f'{_cell(results, row, t, L):.0f}'
      for t in tasks)
  table = [[labels.row_label(row), *(fmt(row, tuned, L) for L in plan.eval_lengths)]
           for row in plan.rows]
  if controls:
    table.append([f'{labels.TAU_ONE}: {" / ".join(controls)} (control)',
                  *(fmt('tau=1', controls, L) for L in plan.eval_lengths)])
  return markdown.markdown_table(header, table)


def observations(results: Mapping[str, Any], plan: planning.Plan) -> list[str]:
  """Plain statements read off the numbers, whatever they show (no tuning, no selection):
  'better' / 'worse' than tau = 1 only where the 95% intervals do not overlap."""
  trials = results['settings']['num_examples']
  lengths = plan.eval_lengths
  out = []
  for task in plan.tasks:
    base = [_cell(results, 'tau=1', task, L) for L in lengths]
    drop = base[0] - min(base[1:]) if len(base) > 1 else 0.0
    control = '' if task in plan.tuned_tasks else ' (control: evaluated at tau = 1 only)'
    out.append(f'{task}{control}: tau = 1 scores {base[0]:.0f}% at L_tr = {lengths[0]} and '
               f'{", ".join(f"{b:.0f}% at {L}" for b, L in zip(base[1:], lengths[1:]))} '
               f'(largest drop {drop:.0f} points).')
    if task not in plan.tuned_tasks:
      continue
    for L in lengths[1:]:
      cell = {r: _cell(results, r, task, L) for r in plan.rows}
      base = cell['tau=1']
      verdict = {r: tables.compare_accuracies(cell[r], base, trials) for r in plan.rows[1:]}
      listed = lambda word: ', '.join(f'{labels.row_label(r)} {cell[r]:.0f}%'
                                      for r in plan.rows[1:] if verdict[r] == word)
      parts = [f'{word} than tau = 1 ({base:.0f}%): {listed(word)}' for word in ('better', 'worse')
               if listed(word)]
      if listed('within noise'):
        parts.append(f'within noise of tau = 1 ({base:.0f}%; 95% intervals overlap): '
                     f'{listed("within noise")}')
      out.append(f'  at {L}: ' + '; '.join(parts) + '.')
  return out


def plot_accuracy(results: Mapping[str, Any], plan: planning.Plan, path: str) -> None:
  """Accuracy vs length, one panel per task, one line per row with its 95% Wilson interval,
  L_tr marked; the legend below the panels."""
  from t5align.calibration import analysis  # pylint: disable=g-import-not-at-top
  plt = analysis.pyplot()
  trials = results['settings']['num_examples']
  lengths = np.asarray(plan.eval_lengths, np.float64)
  tasks = plan.tasks
  fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.9), sharey=True,
                           squeeze=False)
  for ax, task in zip(axes.flat, tasks):
    rows = [r for r in plan.rows if task in plan.row_tasks(r)]
    for i, row in enumerate(rows):
      ys = np.array([_cell(results, row, task, L) for L in plan.eval_lengths], np.float64)
      bounds = np.array([tables.accuracy_interval(y, trials) for y in ys])  # [l, 2]
      # Rows spread a little sideways (x 2^(+-0.06)) so that their intervals stay readable.
      xs = lengths * 2.0 ** (0.06 * (i - (len(rows) - 1) / 2))
      errors = np.maximum(np.stack([ys - bounds[:, 0], bounds[:, 1] - ys]), 0.0)  # [2, l]
      ax.errorbar(xs, ys, yerr=errors, marker='o', ms=4, capsize=2, lw=1.2,
                  label=labels.row_label(row), color=f'C{plan.rows.index(row)}')
    ax.axvline(plan.reference_length, color='0.5', ls='--', lw=1)
    ax.text(plan.reference_length * 1.06, 3, 'L_tr', color='0.4', fontsize=8)
    ax.set_xscale('log', base=2)
    ax.set_xticks(lengths, [str(L) for L in plan.eval_lengths])
    ax.minorticks_off()
    ax.set_title(task if task in plan.tuned_tasks else f'{task} (control, tau = 1)', fontsize=10)
    ax.set_xlabel('input length (tokens)')
    ax.set_ylim(-3, 103)
  axes.flat[0].set_ylabel(f'accuracy (%), {trials} examples, 95% interval')
  # The legend of the panel with every row, below the panels (never over a panel's lines).
  handles, names = max((ax.get_legend_handles_labels() for ax in axes.flat),
                       key=lambda h: len(h[1]))
  fig.legend(handles, names, loc='lower center', ncol=len(names), fontsize=9, frameon=False)
  fig.tight_layout(rect=(0, 0.08, 1, 1))
  fileio.save_figure(fig, path, dpi=110)
  plt.close(fig)


def _layer_taus(tau: Any) -> np.ndarray:
  """A tau's values per layer: a per-head `[layers, heads]` tau's mean over heads `[layers]`."""
  tau = np.asarray(tau, np.float64)
  return tau.mean(-1) if tau.ndim == 2 else tau.ravel()


def temperature_table(tasks: Mapping[str, Mapping[str, Sequence[calibration.Calibration]]],
                      strategies: Sequence[str], lengths: Sequence[int]) -> str:
  """Plain text: per task and strategy, the calibrated tau at each length (per-layer taus
  joined by '/'; per-head ones as each layer's mean over its heads, joined by '/'), a joint
  calibration's chosen bias rule after it ('0.500 i': interpolate, 'e': extend)."""
  head = f'{"task":<16}{"strategy":<24}' + ''.join(f'{L:>18}' for L in lengths)
  lines = [head, '-' * len(head)]
  for task, cals in tasks.items():
    for s in strategies:
      by_length = {c.length: c for c in cals.get(s, ())}
      mark = lambda c: (('*' if c.clamped else '')
                        + ('' if c.bias_rule == 'none' or not s.endswith(':bias=joint')
                           else ' ' + c.bias_rule[0]))
      cells = ['-' if L not in by_length else '/'.join(
          f'{t:.3f}' for t in _layer_taus(by_length[L].tau)) + mark(by_length[L])
               for L in lengths]
      lines.append(f'{task:<16}{labels.strategy_label(s):<24}' + ''.join(f'{c:>18}'
                                                                          for c in cells))
  return '\n'.join(lines)


def spread_table(spread: Mapping[str, Any], seeds: Sequence[int], lengths: Sequence[int]) -> str:
  """Plain text: per task and strategy, the first seed's tau [the range over every seed] at each
  length (per-layer and per-head strategies: their largest spread over layers and heads)."""
  head = f'{"task":<16}{"strategy":<24}' + ''.join(f'{L:>20}' for L in lengths)
  lines = [f'Calibrated tau [range over seeds {", ".join(map(str, seeds))}]; per layer (head): '
           'the largest range over seeds of one layer\'s (head\'s) tau', head, '-' * len(head)]
  for task, by_strategy in spread.items():
    for s, by_length in by_strategy.items():
      cells = []
      for L in lengths:
        item = by_length.get(str(L))
        if item is None:
          cells.append('-')
          continue
        values = np.asarray(item['taus'], np.float64).reshape(len(item['taus']), -1)
        if values.shape[1] == 1:
          cells.append(f'{values[0, 0]:.3f} [{values.min():.3f}-{values.max():.3f}]')
        else:
          cells.append(f'range {item["spread"]:.3f}')
      lines.append(f'{task:<16}{labels.strategy_label(s):<24}' + ''.join(f'{c:>20}'
                                                                          for c in cells))
  return '\n'.join(lines)


def timing_summary(timing: Mapping[str, Any]) -> str:
  """'301 s (setup 9 s, calibration 80 s, ...; 530 CPU s)' from a `Phases` record."""
  parts = [f'{name} {timing[f"{name}_s"]:.0f} s' for name in
           ('setup', 'calibration', 'analysis', 'evaluation') if f'{name}_s' in timing]
  if 'calibration_s' not in timing:
    parts.insert(1, 'calibration reused')
  return (f'{timing.get("total_s", 0):.0f} s ({", ".join(parts)}; '
          f'{timing.get("total_cpu_s", 0):.0f} CPU s)')


def _count(n: int, noun: str) -> str:
  return f'{n} {noun}' + ('' if n == 1 else 's')


def calibration_sample(plan: planning.Plan) -> str:
  """What the temperatures were calibrated on, e.g. 'Temperatures calibrated per task (lines,
  kv) on 1 prompt of the task at 4096 tokens, 2 prompts at 2048, ... against 64 of its prompts
  at L_tr = 256 (sampling seed 7).'"""
  counts = [f'{_count(n, "prompt")} at {L}' for L, n in sorted(plan.samples.items(),
                                                                 reverse=True)]
  counts[0] = counts[0].replace(' at ', ' of the task at ', 1) + ' tokens'
  seeds = plan.seeds
  seed = (f'sampling seed {seeds[0]}' if len(seeds) == 1 else
          f'sampling seed {seeds[0]}; the calibration repeated with seeds '
          f'{", ".join(map(str, seeds[1:]))} for the spread below')
  return (f'Temperatures calibrated per task ({", ".join(plan.tuned_tasks)}) on '
          f'{", ".join(counts)} against {plan.num_references} of its prompts at L_tr = '
          f'{plan.reference_length} ({seed}).')


def write_report(output_dir: str, results: Mapping[str, Any], plan: planning.Plan,
                 temperatures: str, spread: Mapping[str, Any] | None, dispersion: str,
                 notes: Sequence[str], timing: Mapping[str, Any]) -> None:
  """report.md: what was run, the numbers, and what they show."""
  s = results['settings']
  controls = plan.control_tasks
  parts = [
      '# t5align demo: attention alignment on the shipped retrieval T5', '',
      f'Model: `{s["model_dir"]}` (trained by the project at L_tr = {s["reference_length"]}). '
      f'Accuracy (%) on {s["num_examples"]} held-out examples per task and length (seed '
      f'{s["eval_seed"]}). {calibration_sample(plan)} '
      + (f'{" and ".join(controls)}: evaluated at tau = 1 only, as controls. ' if controls else
         '`--controls` adds passkey (plain and with decoys) at tau = 1 only, as controls. '
         if plan.tuned_tasks != train_data.TASKS else '')
      + f'Encoder attention: {s["attention_impl"]}. Mode: {s["mode"]}. Wall time of this run: '
      f'{timing_summary(timing)}.', '',
      '## Headline', '', headline_table(results, plan), '',
      '## What the numbers show', '',
      'Better or worse than tau = 1 only where the two 95% Wilson intervals do not overlap.', '',
      *[f'- {n}' if not n.startswith('  ') else f'  - {n[2:]}' for n in notes], '',
      '## Temperatures', '', '```', temperatures, '```', '',
      '## Calibration sample', '',
  ]
  if spread:
    parts += [f'The per-task calibration repeated on the prompts of {len(spread["seeds"])} '
              'sampling seeds (the same counts each); the first seed\'s temperatures are the ones '
              'evaluated.', '', '```', spread_table(spread['tasks'], spread['seeds'],
                                                    plan.lengths), '```', '']
  else:
    parts += [f'One sampling seed ({plan.seeds[0]}). `--calibration_seeds 5` (or `--full`) '
              'repeats the calibration on 4 more seeds and reports the temperatures\' spread.',
              '']
  parts += ['## Dispersion (tau = 1; pooled over the calibrated tasks\' prompts)', '', '```',
            dispersion, '```', '']
  for task in plan.tasks:
    parts += [f'## Accuracy: {task}', '',
              'Accuracy (%) [95% Wilson interval] over the examples of each cell.', '',
              accuracy_table(results, plan.rows, task, plan.eval_lengths), '']
  parts += ['## Figures', '', '![accuracy](accuracy.png)', '',
            'Also: the statistic-vs-tau curves, temperature curves, relative-position bias and '
            'QQ plot PNGs beside this file (see analysis.json for their numbers).', '']
  fileio.write_atomic(os.path.join(output_dir, 'report.md'), '\n'.join(parts))
