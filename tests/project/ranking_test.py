"""benchmarks/ranking.py on a small demo output written by the demo's own store functions, with
known per-example outcomes: its numbers against values worked out by hand, its sentences, and
its refusals."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from benchmarks import ranking
from t5align import labels
from t5align import schedule as schedule_lib
from t5align.demo import command
from t5align.demo import planning
from t5align.demo import store

N = 20  # Examples per cell.
REFERENCE = 256
LENGTHS = (512, 1024)
# 'shiny_rule': a rule the demo does not know yet (no label): named by itself.
ROWS = ('tau=1', 'pmax', 'entropy', 'shiny_rule')
# Calibrated taus per (strategy, length), the same for both tasks: at 512, entropy's equals
# P_max's, so the demo evaluates it once (P_max's file) and copies the accuracy.
TAUS = {'pmax': {512: 0.9, 1024: 0.8}, 'entropy': {512: 0.9, 1024: 0.7},
        'shiny_rule': {512: 0.8, 1024: 0.75}}


def _right(*ranges: range) -> list[bool]:
  out = [False] * N
  for r in ranges:
    for i in r:
      out[i] = True
  return out


# Which of the 20 examples each row gets right (COPIED: the demo copied the cell's file).
OUTCOMES = {
    ('lines', 256): {'tau=1': _right(range(18))},
    ('lines', 512): {'tau=1': _right(range(10)), 'pmax': _right(range(1, 19)),
                     'shiny_rule': _right(range(5))},
    ('lines', 1024): {'tau=1': _right(range(2)), 'pmax': _right(range(8)),
                      'entropy': _right(range(6)), 'shiny_rule': _right()},
    ('kv', 256): {'tau=1': _right(range(20))},
    ('kv', 512): {'tau=1': _right(range(16)), 'pmax': _right(range(16)),
                  'shiny_rule': _right(range(10))},
    ('kv', 1024): {'tau=1': _right(range(5)), 'pmax': _right(range(5), range(10, 15)),
                   'entropy': _right(range(2, 11)), 'shiny_rule': _right(range(5))},
    ('passkey', 256): {'tau=1': _right(range(20))},
    ('passkey', 512): {'tau=1': _right(range(20))},
    ('passkey', 1024): {'tau=1': _right(range(19))},
}
COPIED = {  # (task, length): {row: the row whose file it shares}
    ('lines', 256): {r: 'tau=1' for r in ROWS[1:]}, ('kv', 256): {r: 'tau=1' for r in ROWS[1:]},
    ('lines', 512): {'entropy': 'pmax'}, ('kv', 512): {'entropy': 'pmax'}}


def _records(task: str, length: int, right: list[bool], shift: int = 0) -> list[dict]:
  """Records as `heldout.retrieval_predictions` writes them."""
  return [{'index': i + shift, 'task': task, 'family': task, 'length': length,
           'input_tokens': length - 7, 'target': f'answer {i + shift}',
           'answer': f'{i + shift}', 'meta': {'depth': 0.5}, 'prediction':
           f'answer {i + shift}' if ok else 'no idea', 'accuracy': 1.0 if ok else 0.0}
          for i, ok in enumerate(right)]


def _settings() -> dict:
  return {'model_dir': '/somewhere/t5align/shipped/retrieval_t5', 'mode': 'default',
          'attention_impl': 'blockwise', 'dtype': 'float32', 'lengths': list(LENGTHS),
          'num_references': 8, 'prompts_per_length': {'512': 2, '1024': 1},
          'reference_length': REFERENCE, 'seeds': [7], 'strategies': list(ROWS[1:]),
          'tasks': ['lines', 'kv'], 'rows': list(ROWS), 'control_tasks': ['passkey'],
          'num_examples': N, 'calibration_seed': 7, 'eval_seed': 2000,
          'calibration': 'per task'}


def _schedule() -> schedule_lib.TemperatureSchedule:
  cals = {s: tuple(schedule_lib.Calibration(s, L, REFERENCE, tau) for L, tau in by_L.items())
          for s, by_L in TAUS.items()}
  return schedule_lib.TemperatureSchedule(REFERENCE, cals, 'pmax', {}, tasks={
      'lines': cals, 'kv': cals})


def _demo_output(folder: str, outcomes=OUTCOMES) -> str:
  """A finished demo output folder (results.json, schedule.json, predictions/) in the demo's
  format, written with its store functions."""
  os.makedirs(folder)
  results = store.Results(os.path.join(folder, 'results.json'), _settings())
  cells = []
  for (task, length), rows in outcomes.items():
    for row, right in rows.items():
      store.write_predictions(folder, row, length, {task: _records(task, length, right)})
      cells.append((row, task, length, 100.0 * sum(right) / N))
    for row, source in COPIED.get((task, length), {}).items():
      store.copy_predictions(folder, source, row, length, task)
      cells.append((row, task, length, 100.0 * sum(rows[source]) / N))
  results.put_cells(cells)
  results.put_section('timing', {'total_s': 5400.0})
  _schedule().save(os.path.join(folder, 'schedule.json'))
  return folder


def _run(tmp_path, *extra):
  folder = _demo_output(str(tmp_path / 'demo'))
  out, record = tmp_path / 'ranking.md', tmp_path / 'ranking.json'
  argv = ['--demo_output', folder, '--out', str(out), '--json', str(record),
          '--machine', 'a test machine', *extra]
  returned = ranking.main(argv)
  saved = json.loads(record.read_text(encoding='utf-8'))
  assert saved == json.loads(json.dumps(returned))
  return folder, saved, out.read_text(encoding='utf-8')


def _cell(record: dict, task: str, length: int) -> dict:
  (cell,) = [c for c in record['cells'] if (c['task'], c['length']) == (task, length)]
  return cell


def test_record_numbers_are_the_hand_worked_ones(tmp_path):
  folder, record, _ = _run(tmp_path)
  assert record['format'] == 't5align.ranking.v1'
  assert (record['baseline'], record['alpha']) == ('tau=1', 0.05)
  assert (record['tasks'], record['controls']) == (['lines', 'kv'], ['passkey'])
  assert record['rows'] == list(ROWS)
  assert record['labels'] == {'tau=1': 'tau = 1', 'pmax': 'w/ P_max', 'entropy': 'w/ H',
                              'shiny_rule': 'shiny_rule'}
  assert {r: labels.row_label(r) for r in ROWS[:3]} == {r: record['labels'][r]
                                                         for r in ROWS[:3]}
  assert [(c['task'], c['length'], c['n']) for c in record['cells']] == [
      ('lines', 256, N), ('lines', 512, N), ('lines', 1024, N), ('kv', 256, N), ('kv', 512, N),
      ('kv', 1024, N)]
  # (accuracy %, wins and losses vs tau = 1, p vs tau = 1, verdict, p vs the best)
  expected = {
      ('lines', 256): {r: (90.0, 0, 0, 1.0, 'no difference', 1.0) for r in ROWS},
      ('lines', 512): {
          'tau=1': (50.0, 0, 0, 1.0, 'no difference', 22 / 1024),  # 2 (1 + 10) / 2^10
          'pmax': (90.0, 9, 1, 22 / 1024, 'better', 1.0),
          'entropy': (90.0, 9, 1, 22 / 1024, 'better', 1.0),  # P_max's predictions.
          'shiny_rule': (25.0, 0, 5, 1 / 16, 'no difference', 32 / 2**15)},  # 2 (1 + 15) / 2^15
      ('lines', 1024): {
          'tau=1': (10.0, 0, 0, 1.0, 'no difference', 1 / 32),
          'pmax': (40.0, 6, 0, 1 / 32, 'better', 1.0),
          'entropy': (30.0, 4, 0, 1 / 8, 'no difference', 1 / 2),
          'shiny_rule': (0.0, 0, 2, 1 / 2, 'no difference', 1 / 128)},
      ('kv', 256): {r: (100.0, 0, 0, 1.0, 'no difference', 1.0) for r in ROWS},
      ('kv', 512): {
          'tau=1': (80.0, 0, 0, 1.0, 'no difference', 1.0),
          'pmax': (80.0, 0, 0, 1.0, 'no difference', 1.0),
          'entropy': (80.0, 0, 0, 1.0, 'no difference', 1.0),
          'shiny_rule': (50.0, 0, 6, 1 / 32, 'worse', 1 / 32)},
      ('kv', 1024): {
          'tau=1': (25.0, 0, 0, 1.0, 'no difference', 1 / 16),
          'pmax': (50.0, 5, 0, 1 / 16, 'no difference', 1.0),
          # 6 to 2: 2 (1 + 8 + 28) / 2^8.
          'entropy': (45.0, 6, 2, 74 / 256, 'no difference', 1.0),  # 5 to 6 vs the best: 1.
          'shiny_rule': (25.0, 0, 0, 1.0, 'no difference', 1 / 16)}}
  for (task, length), rows in expected.items():
    cell = _cell(record, task, length)
    got = {r: (v['accuracy'], v['vs_baseline']['wins'], v['vs_baseline']['losses'],
               v['vs_baseline']['p'], v['verdict'], v['vs_best']['p'])
           for r, v in cell['rows'].items()}
    assert got == rows, (task, length)
  assert [_cell(record, t, L)['best'] for t in ('lines', 'kv') for L in (256, 512, 1024)] == [
      'tau=1', 'pmax', 'pmax', 'tau=1', 'tau=1', 'pmax']
  np.testing.assert_allclose(_cell(record, 'lines', 512)['rows']['tau=1']['interval'],
                             [29.93, 70.07], atol=0.005)  # Wilson, 10 of 20.
  # A copied cell (the demo's `store.copy_predictions`) is read from its own file.
  assert _cell(record, 'kv', 512)['rows']['entropy']['predictions'] == os.path.join(
      'predictions', 'entropy_512_kv.jsonl')
  assert [(r['row'], r['better'], r['worse'], r['tied_with_best'], r['mean_accuracy'])
          for r in record['ranking']] == [
              ('pmax', 2, 0, 6, pytest.approx(450 / 6)),
              ('entropy', 1, 0, 6, pytest.approx(435 / 6)),
              ('tau=1', 0, 0, 4, pytest.approx(355 / 6)),
              ('shiny_rule', 0, 1, 3, pytest.approx(290 / 6))]
  p = record['provenance']
  assert p['machine'] == 'a test machine' and p['date'] and p['demo_seconds'] == 5400.0
  assert p['command'].startswith('python -m benchmarks.ranking --demo_output ')
  assert p['demo_command'] == (
      'python -m t5align.demo --controls --lengths 512 1024 --strategies pmax entropy shiny_rule '
      f'--num_examples 20 --num_references 8 --output_dir {folder}')
  assert record['demo_settings']['num_examples'] == N


def test_page_states_the_verdicts(tmp_path):
  folder, record, text = _run(tmp_path)
  assert text.startswith('# Ranking the encoder-temperature rules\n\n<!-- Written by')
  for sentence in [
      '- w/ P_max helps: significantly better than tau = 1 (exact McNemar, p < 0.05) in 2 of '
      'its 6 cells: lines at 512 (90% vs 50%, p = 0.021) and 1024 (40% vs 10%, p = 0.031).',
      '- w/ H helps: significantly better than tau = 1 (exact McNemar, p < 0.05) in 1 of its 6 '
      'cells: lines at 512 (90% vs 50%, p = 0.021).',
      '- shiny_rule hurts: significantly worse than tau = 1 (exact McNemar, p < 0.05) in 1 of '
      'its 6 cells: kv at 512 (50% vs 80%, p = 0.031).',
      '- Where, lines: significantly better than tau = 1 at 512 (w/ P_max, w/ H) and 1024 '
      '(w/ P_max); no rule differs significantly from tau = 1 at 256.',
      '- Where, kv: no rule is significantly better than tau = 1 at any length; significantly '
      'worse at 512 (shiny_rule); no rule differs significantly from tau = 1 at 256 and 1024.',
      '- Best for lines at 1024: w/ P_max (40%, n = 20); not significantly below it (p >= '
      '0.05): w/ H 30%; significantly below it: tau = 1 10% (p = 0.031), shiny_rule 0% '
      '(p = 0.0078).',
      'passkey: evaluated at tau = 1 only (controls), not ranked.',
      f'`{record["provenance"]["demo_command"]}`',
      'a test machine', '1.5 hours of demo wall time']:
    assert sentence in ' '.join(text.split()), sentence  # The page's paragraphs are wrapped.
  for line in [
      '| w/ P_max | 90 [70-97] | **90 [70-97] (+)** | **40 [22-61] (+)** |',
      '| shiny_rule | 100 [84-100] | 50 [30-70] (-) | 25 [11-47] |',
      '| shiny_rule | 1 | 0.031 | 1 |']:
    assert f'\n{line}\n' in text, line
  assert '## passkey' not in text
  assert max(len(line) for line in text.splitlines() if not line.startswith('|')) <= 100


def test_check_compares_the_page_with_its_record(tmp_path, capsys):
  _run(tmp_path)
  paths = ['--json', str(tmp_path / 'ranking.json'), '--out', str(tmp_path / 'ranking.md')]
  ranking.main(['--check', *paths])
  (tmp_path / 'ranking.md').write_text('edited by hand\n', encoding='utf-8')
  with pytest.raises(SystemExit) as e:
    ranking.main(['--check', *paths])
  assert e.value.code == 1
  assert 'is not the page' in capsys.readouterr().err


def test_rows_on_different_examples_are_refused_naming_both_files(tmp_path):
  folder = _demo_output(str(tmp_path / 'demo'))
  right = OUTCOMES[('lines', 1024)]['pmax']
  store.write_predictions(folder, 'pmax', 1024, {'lines': _records('lines', 1024, right,
                                                                   shift=3)})
  ours = store.predictions_path(folder, 'tau=1', 1024, 'lines')
  theirs = store.predictions_path(folder, 'pmax', 1024, 'lines')
  assert ranking.predictions_path(folder, 'pmax', 1024, 'lines') == theirs
  with pytest.raises(ValueError, match=(
      f'demo predictions {re.escape(ours)} and {re.escape(theirs)} are not of the same examples '
      r"\(record 1 is example 0 \(answer 'answer 0'\) in the first and example 3 \(answer "
      r"'answer 3'\) in the second\)")):
    ranking.rank(folder)


def test_a_file_that_disagrees_with_results_json_is_refused(tmp_path):
  folder = _demo_output(str(tmp_path / 'demo'))
  store.write_predictions(folder, 'pmax', 1024, {'kv': _records('kv', 1024, _right(range(4)))})
  with pytest.raises(ValueError, match=r'gives pmax 50.0% for kv at 1024 tokens, but .* scores '
                                       r'20.0%; the folder mixes runs'):
    ranking.rank(folder)


@pytest.mark.parametrize('row, task, length', [
    ('shiny_rule', 'kv', 1024),  # An evaluated cell.
    ('entropy', 'lines', 512)])  # A copied one (`store.copy_predictions`).
def test_a_missing_file_is_refused_naming_the_command_that_writes_it(tmp_path, row, task,
                                                                     length):
  folder = _demo_output(str(tmp_path / 'demo'))
  path = store.predictions_path(folder, row, length, task)
  os.remove(path)
  with pytest.raises(ValueError, match=f'{row} for {task} at {length} tokens but there is no '
                                       f'{re.escape(path)}; run the demo command again'):
    ranking.rank(folder)


def test_demo_command_of_the_documented_run_parses_back_to_its_settings():
  """The settings `python -m t5align.demo --full --num_examples 200 --output_dir demo_ranking`
  records give that command back, and it parses to them."""
  settings = {'mode': 'full', 'model_dir': '/x/t5align/shipped/retrieval_t5',
              'strategies': list(planning.STRATEGIES), 'lengths': [512, 1024, 2048, 4096],
              'reference_length': 256, 'num_examples': 200, 'num_references': 64,
              'seeds': [7, 8, 9, 10, 11], 'control_tasks': [], 'attention_impl': 'blockwise',
              'prompts_per_length': {'512': 8, '1024': 4, '2048': 2, '4096': 1}}
  text = ranking.demo_command(settings, 'demo_ranking')
  assert text == 'python -m t5align.demo --full --num_examples 200 --output_dir demo_ranking'
  args = command.flag_parser().parse_args(text.split()[3:])
  assert (args.full, args.num_examples, args.output_dir) == (True, 200, 'demo_ranking')


def test_the_committed_ranking_page_is_what_its_record_gives():
  """docs/ranking.md is rendered from benchmarks/results/ranking.json alone: editing either
  without the other fails here."""
  record = ranking.main(['--check'])
  assert record['format'] == ranking.FORMAT and record['cells']


def test_p_values_read_as_words_in_sentences():
  assert [ranking.p_clause(p) for p in (0.031, 0.0000123, 0.04999)] == [
      'p = 0.031', 'p < 0.0001', 'p = 0.04999']
