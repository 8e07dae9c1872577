"""t5align.report's SCROLLS table: evaluation folders laid out as SCROLLS' leaderboard (Avg first,
ROUGE-1/2/L for the summaries), the published rows beside them.

The folders are written here as `t5align.eval` leaves them (metrics.json and run.json per
`t5align_scrolls_{config}_{L}` folder); the expected tables are written out. The published rows
are ../shared/docs/YARDSTICKS.md section 3.4's (the SLED paper's reported_main_results_test),
copied here.
"""
from __future__ import annotations

import json
import types

import pytest

from seqio_tasks import catalog
from seqio_tasks import metrics
from seqio_tasks import scrolls
from seqio_tasks import suite_metrics
from t5align import report
from t5align.evaluation import tables
from t5align.runtime import fileio

# A validation run at 4,096 tokens with the 7 tasks (ROUGE-1/2/L, or the task's score), and one
# at 16,384 with 3.
SCORES_4096 = {'gov_report': (40.0, 10.0, 25.0), 'summ_screen_fd': (27.0, 8.0, 16.0),
               'qmsum': (32.0, 4.0, 20.0), 'qasper': 30.0, 'narrative_qa': 18.5, 'quality': 41.0,
               'contract_nli': 70.0}
SCORES_16384 = {'gov_report': (44.0, 12.5, 26.0), 'qasper': 35.0, 'quality': 45.5}
TITLE = ("### SCROLLS (ROUGE-1/2/L, F1 or exact match, as its leaderboard shows them; Avg: the "
         "mean over the 7 tasks' scores, ROUGE's geometric mean for the summaries)")
HEADER = ('| Model | Tokens | Temperature | Avg | GovRep | SumScr | QMSum | Qspr | Nrtv | QALT '
          '| CNLI |\n'
          '|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|')
# Avg at 4,096: the geometric means 21.544 (40*10*25), 15.119, 13.680 and 30, 18.5, 41, 70:
# 209.843 / 7 = 29.978.
EXPECTED = f"""{TITLE}

{HEADER}
| retrieval_t5 (validation) | 4096 | tau = 1 | 30.0 | 40.0/10.0/25.0 | 27.0/8.0/16.0 \
| 32.0/4.0/20.0 | 30.0 | 18.5 | 41.0 | 70.0 |
| retrieval_t5 (validation) | 16384 | tau = 1 | - | 44.0/12.5/26.0 | - | - | 35.0 | - | 45.5 \
| - |

Avg needs all 7 tasks scored:

- retrieval_t5 (validation), 16384 tokens, tau = 1: no result for SumScr, QMSum, Nrtv, CNLI.
"""
# ../shared/docs/YARDSTICKS.md section 3.4: model, tokens (the setting's b), Avg, GovRep,
# SumScr, QMSum, Qspr, Nrtv, QALT (EM-T/H), CNLI.
YARDSTICKS = """\
| LongT5-base | 16384 | 38.2 | 53.5/27.3/29.3 | 34.8/9.6/21.1 | 33.9/11.0/22.8 | 46.6 | 23.0 | 37.9/36.6 | 85.6 |
| LongT5-large | 16384 | 40.5 | 54.2/27.8/29.8 | 35.6/9.2/21.2 | 35.1/12.0/23.3 | 52.3 | 27.2 | 40.6/38.6 | 87.3 |
| LongT5-XL | 16384 | 41.9 | 54.7/28.2/30.2 | 35.8/9.6/21.1 | 34.9/11.8/23.5 | 53.1 | 29.3 | 46.0/42.1 | 88.2 |
| UL2 | 2048 | 37.9 | 53.6/26.1/28.8 | 32.9/7.8/19.4 | 31.1/8.5/20.4 | 37.6 | 24.2 | 45.8/40.7 | 88.7 |
| LED-base (SCROLLS) | 16384 | 29.2 | 56.2/26.6/28.8 | 24.2/4.5/15.4 | 25.1/6.7/18.8 | 26.6 | 18.5 | 25.8/25.4 | 71.5 |
"""  # noqa: E501


def _metrics(config: str, score) -> dict[str, float]:
  """metrics.json's metrics of a task: ROUGE-1/2/L with their geometric mean as the score, or
  the family's score."""
  family = scrolls.FAMILIES[config]
  if family == 'rouge_geo':
    rouge = dict(zip(suite_metrics.ROUGE_TYPES, score))
    mean = suite_metrics.geometric_mean(list(score))
    return {**rouge, 'rouge_geometric_mean_per_example': mean - 1,
            'rouge_geometric_mean': mean, 'score': mean}
  return {suite_metrics.SCORE_KEY[family]: score, 'score': score}


def _write(folder, config, length, metrics_, *, split='validation', label='tau = 1'):
  """A task folder as t5align.eval leaves it (the fields the report reads)."""
  spec = catalog.SPECS[f't5align_scrolls_{config}_{length}']
  where = folder / spec.task_name
  fileio.write_json_atomic(where / 'run.json', {
      'task': spec.task_name, 'split': split, 'checkpoint': {'sha256': 'a' * 64},
      'num_examples': 30, 'examples_sha256': 'b' * 64, 'mode': 'greedy',
      'max_decode_length': 1024, 'temperature': 1.0, 'label': label})
  fileio.write_json_atomic(where / 'metrics.json', {
      'task': spec.task_name, 'model': 'retrieval_t5', 'label': label, 'num_examples': 30,
      'metrics': metrics_, 'family': spec.family, 'table': spec.table, 'group': spec.group,
      'column': spec.column, 'primary_metric': metrics.primary_metric(spec.family),
      'temperature': 1.0})


@pytest.fixture
def runs(tmp_path):
  for scores, length in ((SCORES_4096, 4096), (SCORES_16384, 16384)):
    for config, score in scores.items():
      _write(tmp_path / f'val_{length}', config, length, _metrics(config, score))
  return tmp_path


def _published_lines() -> list[str]:
  return [f'| {m} (published, test) | {t} | tau = 1 | {rest}'
          for m, t, rest in (line[2:].split(' | ', 2) for line in YARDSTICKS.splitlines())]


def test_the_columns_are_the_leaderboards():
  assert tables.SCROLLS_COLUMNS == tuple(scrolls.COLUMNS[c] for c in scrolls.TASKS)
  assert tables.SUITES['scrolls'].scores == ['Avg', 'GovRep', 'SumScr', 'QMSum', 'Qspr', 'Nrtv',
                                             'QALT', 'CNLI']


def test_seven_tasks_at_one_length_and_three_at_another(runs, tmp_path):
  assert tables.render(tables.load_results([runs])) == EXPECTED
  out = tmp_path / 'report.md'
  assert report.main([str(runs), '--output', str(out)]) == 0
  assert out.read_text() == EXPECTED


def test_published_rows_with_the_flag_and_alone(runs, tmp_path):
  out = tmp_path / 'report.md'
  assert report.main([str(runs), '--published', 'scrolls', '--output', str(out)]) == 0
  source = tables.published_results('scrolls')['source']
  assert 'arXiv:2208.00748' in source and 'YARDSTICKS.md section 3.4' in source
  ours, notes = EXPECTED.split('\n\nAvg needs')
  assert out.read_text() == (ours + '\n' + '\n'.join(_published_lines()) + '\n\nAvg needs'
                             + notes.rstrip('\n') + f'\n\nPublished rows: {source}\n')
  assert 'published' not in tables.render(tables.load_results([runs]))
  alone = tmp_path / 'published.md'
  assert report.main(['--published', 'scrolls', '--output', str(alone)]) == 0
  assert alone.read_text() == (f'{TITLE}\n\n{HEADER}\n' + '\n'.join(_published_lines())
                               + f'\n\nPublished rows: {source}\n')


def test_published_averages_are_the_scrolls_score_of_their_rows():
  """Avg = the mean of the 7 task scores: ROUGE's geometric mean for the summaries, QuALITY's
  exact match on the whole test set. The parts are published to 0.1, so a recomputed Avg may
  differ from the published one by a few hundredths (LED-base: 29.144 for 29.2)."""
  data = tables.published_results('scrolls')
  assert data['split'] == 'test' and len(data['rows']) == 5
  for row in data['rows']:
    average, *cells = row['scores']
    scores = [suite_metrics.geometric_mean(c) for c in cells[:3]] + [
        c[0] if isinstance(c, list) else c for c in cells[3:]]
    assert sum(scores) / 7 == pytest.approx(average, abs=0.06), row['model']


def test_published_data_errors_name_the_file_and_field(tmp_path, monkeypatch):
  path = tmp_path / 'published.json'
  good = json.loads(open(tables.PUBLISHED['scrolls'], encoding='utf-8').read())
  monkeypatch.setitem(tables.PUBLISHED, 'scrolls', str(path))
  row = good['rows'][0]
  flat = {**row, 'scores': [38.2, 53.5, *row['scores'][2:]]}  # GovRep as one number.
  for change, message in (
      ({'columns': [*tables.SCROLLS_COLUMNS, 'Avg']}, r"'columns' is \['GovRep'"),
      ({'rows': [flat]}, r'rows\[0\].scores is .*; expected 8 entries \(Avg: a number, GovRep: '
                         r'a list of 3 numbers, .*QALT: a list of 2 numbers, CNLI: a number\)'),
      ({'rows': [{**row, 'tokens': 16384.0}]}, r'rows\[0\].tokens is 16384.0; expected an '
                                               'integer')):
    path.write_text(json.dumps({**good, **change}))
    with pytest.raises(ValueError, match=message) as e:
      tables.published_results('scrolls')
    assert str(path) in str(e.value)


def test_test_split_rows_and_labels(tmp_path):
  """A test-split run (no gold: empty metrics) is a row of its own with its note; a second
  label follows tau = 1."""
  for config in scrolls.TASKS:
    _write(tmp_path / 'test', config, 1024, {}, split='test')
    _write(tmp_path / 'val', config, 1024, _metrics(config, (20.0, 20.0, 20.0)
                                                    if scrolls.FAMILIES[config] == 'rouge_geo'
                                                    else 20.0))
    _write(tmp_path / 'val_pmax', config, 1024,
           _metrics(config, (8.0, 1.0, 27.0) if scrolls.FAMILIES[config] == 'rouge_geo'
                    else 6.0), label='w/ P_max')
  text = tables.render(tables.load_results([tmp_path]))
  body = [line for line in text.splitlines() if line.startswith('| retrieval_t5')]
  assert body == [
      '| retrieval_t5 (validation) | 1024 | tau = 1 | 20.0 |' + ' 20.0/20.0/20.0 |' * 3
      + ' 20.0 |' * 4,
      '| retrieval_t5 (validation) | 1024 | w/ P_max | 6.0 |' + ' 8.0/1.0/27.0 |' * 3
      + ' 6.0 |' * 4,
      '| retrieval_t5 (test) | 1024 | tau = 1 |' + ' - |' * 8]
  assert ("- retrieval_t5 (test), 1024 tokens, tau = 1: no score for GovRep, SumScr, QMSum, Qspr, "
          "Nrtv, QALT, CNLI (the test split's gold is private: SCROLLS' leaderboard scores its "
          'predictions).' in text)


def test_bad_column_names_the_file(tmp_path):
  _write(tmp_path, 'qasper', 1024, _metrics('qasper', 30.0))
  path = tmp_path / 't5align_scrolls_qasper_1024' / 'metrics.json'
  fileio.write_json_atomic(path, {**json.loads(path.read_text()), 'column': 'Qasper'})
  with pytest.raises(ValueError, match="'column' is 'Qasper', not a SCROLLS column") as e:
    tables.render(tables.load_results([tmp_path]))
  assert str(path) in str(e.value)


def test_eval_writes_what_the_table_shows(tmp_path):
  """`t5align.eval`'s metrics.json for a SCROLLS summary task, from the task's metric function:
  the report shows its ROUGE-1/2/L and averages its geometric mean."""
  from t5align.evaluation import temperature  # pylint: disable=g-import-not-at-top
  from t5align.evaluation import metrics as eval_metrics  # pylint: disable=g-import-not-at-top
  spec = catalog.SPECS['t5align_scrolls_gov_report_2048']
  target = {'target': 'the budget was approved', 'length': 5, 'num_tokens': 2,
            'meta': {'outputs': ['the budget was approved', 'costs rose']}}
  log = types.SimpleNamespace(records={0: {'tau': [1.0], 'postprocessed_target': target,
                                           'prediction': 'the budget rose'}})
  fake = types.SimpleNamespace(name=spec.task_name,
                               predict_metric_fns=[metrics.make_metric_fn(spec.family)])
  result = eval_metrics.write_metrics(
      fake, spec, 1, log, str(tmp_path / spec.task_name), False, model_name='m',
      temp=temperature.Temperature(constant=1.0), checkpoint_path='/c')
  assert result['primary_metric'] == 'score'
  fileio.write_json_atomic(tmp_path / spec.task_name / 'run.json',
                           {'task': spec.task_name, 'split': 'validation'})
  # 'the budget rose' against 'the budget was approved': R1 = 2 * (2/3 * 2/4) / (2/3 + 2/4)
  # = 57.1, R2 ('the budget') = 2 * (1/2 * 1/3) / (1/2 + 1/3) = 40.0, RL = R1; against 'costs
  # rose' R1 = 2 * (1/3 * 1/2) / (1/3 + 1/2) = 40.0, R2 = 0: the max per type.
  assert [r['metrics'] for r in tables.load_results([tmp_path])][0]['rouge2'] == pytest.approx(
      40.0)
  row = [line for line in tables.render(tables.load_results([tmp_path])).splitlines()
         if line.startswith('| m (validation)')]
  assert row == ['| m (validation) | 2048 | tau = 1 | - | 57.1/40.0/57.1 | - | - | - | - | - '
                 '| - |']
