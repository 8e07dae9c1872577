"""t5align.report's ZeroSCROLLS table: evaluation folders as the suite's paper lays them out, the
published rows beside them, and each task family's primary metric from metrics.json.

The folders are written here as `t5align.eval` leaves them (metrics.json and run.json per
`t5align_zeroscrolls_{task}_{L}` folder); the expected tables are written out. The published rows
are ../shared/docs/YARDSTICKS.md section 2.4's (ZeroSCROLLS paper, Tables 3 and 4), copied here.
"""
from __future__ import annotations

import json
import types

import pytest

from seqio_tasks import catalog
from seqio_tasks import metrics
from seqio_tasks import suite_metrics
from seqio_tasks import zeroscrolls
from t5align import report
from t5align.evaluation import tables
from t5align.runtime import fileio

# One validation run at 1,024 tokens with all 10 tasks, and one at 2,048 with 3.
SCORES_1024 = {'gov_report': 12.34, 'summ_screen_fd': 8.0, 'qmsum': 10.26, 'squality': 6.0,
               'qasper': 30.0, 'narrative_qa': 18.0, 'quality': 55.0, 'musique': 31.0,
               'space_digest': 40.0, 'book_sum_sort': 9.5}
SCORES_2048 = {'gov_report': 14.0, 'qasper': 35.5, 'quality': 60.0}
HEADER = ('| Model | Tokens | Temperature | GvRp | SSFD | QMsm | SQAL | Qspr | Nrtv | QALT | MuSQ '
          '| SpDg | BkSS | Avg |\n'
          '|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
TITLE = "### ZeroSCROLLS (each task's score; Avg: their mean over the 10 tasks)"
EXPECTED = f"""{TITLE}

{HEADER}
| retrieval_t5 (validation) | 1024 | tau = 1 | 12.3 | 8.0 | 10.3 | 6.0 | 30.0 | 18.0 | 55.0 \
| 31.0 | 40.0 | 9.5 | 22.0 |
| retrieval_t5 (validation) | 2048 | tau = 1 | 14.0 | - | - | - | 35.5 | - | 60.0 | - | - | - \
| - |

Avg needs all 10 tasks scored:

- retrieval_t5 (validation), 2048 tokens, tau = 1: no result for SSFD, QMsm, SQAL, Nrtv, MuSQ, \
SpDg, BkSS.
"""
# ../shared/docs/YARDSTICKS.md section 2.4, the T5-family rows (the Naive and CoLT5 rows aside):
# model, tokens, the 10 tasks, Avg.
YARDSTICKS = """\
| T0pp | 8192 | 7.1 | 9.6 | 7.2 | 3.9 | 25.0 | 18.7 | 21.4 | 35.3 | 15.2 | 0.0 | 14.3 |
| Flan-UL2 | 8192 | 16.1 | 11.5 | 13.6 | 5.7 | 56.9 | 25.5 | 75.6 | 51.3 | 36.0 | 14.0 | 30.6 |
| Flan-T5-s | 8192 | 7.6 | 4.2 | 8.3 | 3.8 | 18.5 | 11.6 | 34.6 | 21.0 | 0.0 | 0.0 | 11.0 |
| Flan-T5-b | 8192 | 5.4 | 5.1 | 9.7 | 5.6 | 14.2 | 16.5 | 48.4 | 26.9 | 0.0 | 0.3 | 13.2 |
| Flan-T5-l | 8192 | 6.9 | 6.8 | 9.7 | 5.7 | 33.6 | 20.1 | 62.4 | 33.1 | 48.0 | 0.3 | 22.7 |
| Flan-T5-xl | 8192 | 15.2 | 7.2 | 10.2 | 6.6 | 46.6 | 21.6 | 69.6 | 42.8 | 32.8 | 2.2 | 25.5 |
| Flan-T5-xxl | 512 | 10.0 | 7.9 | 10.4 | 6.1 | 15.3 | 17.6 | 48.2 | 26.0 | 20.8 | 9.0 | 17.1 |
| Flan-T5-xxl | 1024 | 12.1 | 9.4 | 10.1 | 6.3 | 25.5 | 18.9 | 53.2 | 30.3 | 28.7 | 13.4 | 20.8 |
| Flan-T5-xxl | 2048 | 14.0 | 10.0 | 11.0 | 6.8 | 35.7 | 20.9 | 59.8 | 40.6 | 35.0 | 14.7 | 24.9 |
| Flan-T5-xxl | 4096 | 17.3 | 9.1 | 11.8 | 7.4 | 46.5 | 22.2 | 70.8 | 46.8 | 44.1 | 15.1 | 29.1 |
| Flan-T5-xxl | 8192 | 17.6 | 7.8 | 11.0 | 8.0 | 48.3 | 19.3 | 75.2 | 46.8 | 48.7 | 16.4 | 29.9 |
"""


def _write(folder, task, length, metrics_, *, split='validation', label='tau = 1',
           model='retrieval_t5', primary='score'):
  """A task folder as t5align.eval leaves it (the fields the report reads)."""
  spec = catalog.SPECS[f't5align_zeroscrolls_{task}_{length}']
  where = folder / spec.task_name
  fileio.write_json_atomic(where / 'run.json', {
      'task': spec.task_name, 'split': split, 'checkpoint': {'sha256': 'a' * 64},
      'num_examples': 20, 'examples_sha256': 'b' * 64, 'mode': 'greedy',
      'max_decode_length': 1024, 'temperature': 1.0, 'label': label})
  fileio.write_json_atomic(where / 'metrics.json', {
      'task': spec.task_name, 'model': model, 'label': label, 'num_examples': 20,
      'metrics': metrics_, 'family': spec.family, 'table': spec.table, 'group': spec.group,
      'column': spec.column, 'primary_metric': primary, 'temperature': 1.0})


def _suite_metrics(task: str, score: float) -> dict[str, float]:
  """metrics.json's metrics of a task whose suite score is `score` (the family's other keys)."""
  family = zeroscrolls.FAMILIES[task]
  if family == 'rouge_geo':
    return {'rouge1': score + 10, 'rouge2': score / 2, 'rougeL': score + 5,
            'rouge_geometric_mean_per_example': score - 1, 'rouge_geometric_mean': score,
            'score': score}
  return {suite_metrics.SCORE_KEY[family]: score, 'score': score}


@pytest.fixture
def runs(tmp_path):
  for scores, length in ((SCORES_1024, 1024), (SCORES_2048, 2048)):
    for task, score in scores.items():
      _write(tmp_path / f'val_{length}', task, length, _suite_metrics(task, score))
  return tmp_path


def test_the_columns_are_the_tasks_in_the_papers_order():
  assert tables.ZEROSCROLLS_COLUMNS == tuple(zeroscrolls.COLUMNS[t] for t in zeroscrolls.TASKS)
  assert tables.ZEROSCROLLS_COLUMNS == ('GvRp', 'SSFD', 'QMsm', 'SQAL', 'Qspr', 'Nrtv', 'QALT',
                                        'MuSQ', 'SpDg', 'BkSS')


def test_ten_tasks_at_one_length_and_three_at_another(runs, tmp_path):
  assert tables.render(tables.load_results([runs])) == EXPECTED
  out = tmp_path / 'report.md'
  assert report.main([str(runs), '--output', str(out)]) == 0
  assert out.read_text() == EXPECTED


def test_published_rows_only_with_the_flag_and_as_yardsticks_gives_them(runs, tmp_path):
  out = tmp_path / 'report.md'
  assert report.main([str(runs), '--published', 'zeroscrolls', '--output', str(out)]) == 0
  text = out.read_text()
  rows = [f'| {m} (published, test) | {t} | tau = 1 | {rest}'
          for m, t, rest in (line[2:].split(' | ', 2) for line in YARDSTICKS.splitlines())]
  # Ours, then the published rows in the paper's order, then the notes and the data's source.
  ours, notes = EXPECTED.split('\n\nAvg needs')
  assert text.startswith(ours + '\n' + '\n'.join(rows) + '\n\nAvg needs' + notes.rstrip('\n'))
  source = tables.published_results('zeroscrolls')['source']
  assert text.endswith(f'\n\nPublished rows: {source}\n')
  assert 'arXiv:2305.14196' in source and 'Tables 3 and 4' in source
  assert 'published' not in tables.render(tables.load_results([runs]))
  # The published rows alone, without folders.
  alone = tmp_path / 'published.md'
  assert report.main(['--published', 'zeroscrolls', '--output', str(alone)]) == 0
  assert alone.read_text() == (f'{TITLE}\n\n{HEADER}\n' + '\n'.join(rows)
                               + f'\n\nPublished rows: {source}\n')


def test_published_averages_are_the_means_of_their_rows():
  data = tables.published_results('zeroscrolls')
  assert data['split'] == 'test' and len(data['rows']) == 11
  for row in data['rows']:
    *scores, average = row['scores']
    assert sum(scores) / 10 == pytest.approx(average, abs=0.05 + 1e-9), row['model']


def test_published_data_errors_name_the_file_and_field(tmp_path, monkeypatch):
  path = tmp_path / 'published.json'
  good = json.loads(open(tables.PUBLISHED['zeroscrolls'], encoding='utf-8').read())
  monkeypatch.setitem(tables.PUBLISHED, 'zeroscrolls', str(path))
  for change, message in (({'columns': ['GvRp']}, r"'columns' is \['GvRp'\]"),
                          ({'source': None}, "'source' is None"),
                          ({'rows': [{'model': 'x', 'tokens': '512', 'scores': []}]},
                           r'rows\[0\].tokens is .512.; expected an integer'),
                          ({'rows': [{'model': 'x', 'tokens': 512, 'scores': [1.0]}]},
                           r'rows\[0\].scores is \[1.0\]; expected 11 numbers')):
    path.write_text(json.dumps({**good, **change}))
    with pytest.raises(ValueError, match=message) as e:
      tables.published_results('zeroscrolls')
    assert str(path) in str(e.value)
  with pytest.raises(ValueError, match='no published results of longbench'):
    tables.render([], published=['longbench'])


def test_splits_labels_and_test_rows(tmp_path):
  """A test-split run (no gold: empty metrics) and a validation run of the same tasks are rows
  of their own, named by split, not runs told apart by their settings; labels in paper order."""
  for task in zeroscrolls.TASKS:
    _write(tmp_path / 'test', task, 8192, {}, split='test')
    _write(tmp_path / 'val', task, 8192, _suite_metrics(task, 20.0))
    _write(tmp_path / 'val_pmax', task, 8192, _suite_metrics(task, 25.0), label='w/ P_max')
  text = tables.render(tables.load_results([tmp_path]))
  body = [line for line in text.splitlines() if line.startswith('| retrieval_t5')]
  assert body == [
      '| retrieval_t5 (validation) | 8192 | tau = 1 |' + ' 20.0 |' * 11,
      '| retrieval_t5 (validation) | 8192 | w/ P_max |' + ' 25.0 |' * 11,
      '| retrieval_t5 (test) | 8192 | tau = 1 |' + ' - |' * 11]
  assert ("- retrieval_t5 (test), 8192 tokens, tau = 1: no score for GvRp, SSFD, QMsm, SQAL, "
          "Qspr, Nrtv, QALT, MuSQ, SpDg, BkSS (the test split's gold is private: the "
          'leaderboard scores its predictions, python -m t5align.leaderboard writes the CSV).'
          in text)


def test_a_metrics_file_naming_a_metric_it_lacks_is_refused(tmp_path):
  """A ZeroSCROLLS metrics.json written before t5align.eval wrote the family's primary metric
  ('accuracy' for every greedy task) names itself and the remedy."""
  _write(tmp_path, 'qasper', 1024, _suite_metrics('qasper', 30.0), primary='accuracy')
  with pytest.raises(ValueError, match=r"primary_metric 'accuracy' is not among its metrics "
                                       r'\(f1, score\).*Rerun the same t5align.eval') as e:
    tables.render(tables.load_results([tmp_path]))
  assert str(tmp_path / 't5align_zeroscrolls_qasper_1024' / 'metrics.json') in str(e.value)


def test_bad_group_or_column_names_the_file_and_field(tmp_path):
  _write(tmp_path, 'qasper', 1024, _suite_metrics('qasper', 30.0))
  path = tmp_path / 't5align_zeroscrolls_qasper_1024' / 'metrics.json'
  result = json.loads(path.read_text())
  for field, value, message in (('column', 'Qasper', "'column' is 'Qasper', not a ZeroSCROLLS"),
                                ('group', 'long', "'group' is 'long'; a ZeroSCROLLS task's"),
                                ('primary_metric', ['score'],
                                 r"'primary_metric' is \['score'\]; expected a string")):
    fileio.write_json_atomic(path, {**result, field: value})
    with pytest.raises(ValueError, match=message) as e:
      tables.render(tables.load_results([tmp_path]))
    assert str(path) in str(e.value)


def test_every_family_has_a_primary_metric_its_aggregate_gives():
  assert set(metrics.PRIMARY_METRICS) == set(metrics.FAMILIES)
  for family in suite_metrics.FAMILIES:
    assert metrics.primary_metric(family) == 'score'
  assert metrics.primary_metric('passkey') == 'accuracy'
  assert metrics.primary_metric('lm') == 'perplexity'
  assert 'perplexity' in metrics.aggregate_perplexity(
      [metrics.perplexity_scores(-2.0, 4)])
  assert 'em' in metrics.aggregate('code_completion', [{'length': 10}], [{'em': 1.0, 'es': 9.0}])
  assert 'accuracy' in metrics.aggregate('passkey', [{}], [{'accuracy': 1.0}])
  with pytest.raises(ValueError, match="no primary metric for family 'bleu'"):
    metrics.primary_metric('bleu')


@pytest.mark.parametrize('task, family, prediction, reference, primary', [
    ('t5align_zeroscrolls_qasper_1024', 'f1_unidecode', 'German', 'English and German', 50.0),
    ('t5align_passkey_2k', 'passkey', '12345', '12345', 100.0),
])
def test_eval_writes_the_familys_primary_metric(tmp_path, task, family, prediction, reference,
                                                primary):
  """`t5align.eval`'s metrics.json names its family's primary metric, which the report shows."""
  from t5align.evaluation import temperature  # pylint: disable=g-import-not-at-top
  from t5align.evaluation import metrics as eval_metrics  # pylint: disable=g-import-not-at-top
  spec = catalog.SPECS[task]
  target = {'target': reference, 'meta': {'outputs': [reference]}, 'length': 5, 'num_tokens': 2}
  log = types.SimpleNamespace(records={0: {'tau': [1.0], 'postprocessed_target': target,
                                           'prediction': prediction}})
  fake = types.SimpleNamespace(name=task, predict_metric_fns=[metrics.make_metric_fn(family)])
  result = eval_metrics.write_metrics(
      fake, spec, 1, log, str(tmp_path / task), False, model_name='m',
      temp=temperature.Temperature(constant=1.0), checkpoint_path='/c')
  assert result['primary_metric'] == metrics.primary_metric(family)
  (loaded,) = tables.load_results([tmp_path])
  assert tables.primary_value(loaded) == pytest.approx(primary)
