"""t5align.report's tables of the long-context suites, each laid out by its layout
(`t5align.evaluation.suites`): ZeroSCROLLS' as its paper's, SCROLLS' as its leaderboard's (Avg
first, ROUGE-1/2/L for the summaries), RULER's as its README's (a row per model and temperature, a
column per input length, a cell the mean over the tasks; per task on request); the published rows
beside them; what t5align.eval writes into metrics.json and the report reads.

The folders are written here as `t5align.eval` leaves them (metrics.json and run.json per
`t5align_{suite}_{task}_{L}` folder); the expected tables are written out, each mean worked out in
the comments. The published rows are ../shared/docs/YARDSTICKS.md's, copied here: section 2.4
(ZeroSCROLLS paper, Tables 3 and 4) and section 3.4 (the SLED paper's reported_main_results_test).
"""
from __future__ import annotations

import dataclasses
import json
import types

import pytest

from seqio_tasks import catalog
from seqio_tasks import metrics
from seqio_tasks import ruler
from seqio_tasks import scrolls
from seqio_tasks import suite_metrics
from seqio_tasks import zeroscrolls
from t5align import report
from t5align.evaluation import markdown
from t5align.evaluation import suites
from t5align.evaluation import tables
from t5align.runtime import fileio

# ---------------------------------------------------------------------------------------------
# ZeroSCROLLS.

# One validation run at 1,024 tokens with all 10 tasks, and one at 2,048 with 3.
ZS_SCORES_1024 = {'gov_report': 12.34, 'summ_screen_fd': 8.0, 'qmsum': 10.26, 'squality': 6.0,
               'qasper': 30.0, 'narrative_qa': 18.0, 'quality': 55.0, 'musique': 31.0,
               'space_digest': 40.0, 'book_sum_sort': 9.5}
ZS_SCORES_2048 = {'gov_report': 14.0, 'qasper': 35.5, 'quality': 60.0}
ZS_HEADER = ('| Model | Tokens | Temperature | GvRp | SSFD | QMsm | SQAL | Qspr | Nrtv | QALT '
             '| MuSQ | SpDg | BkSS | Avg |\n'
             '|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
ZS_TITLE = "### ZeroSCROLLS (each task's score; Avg: their mean over the 10 tasks)"
ZS_EXPECTED = f"""{ZS_TITLE}

{ZS_HEADER}
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
ZS_YARDSTICKS = """\
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


def _zs_metrics(task: str, score: float) -> dict[str, float]:
  """metrics.json's metrics of a task whose suite score is `score` (the family's other keys)."""
  family = zeroscrolls.FAMILIES[task]
  if family == 'rouge_geo':
    return {'rouge1': score + 10, 'rouge2': score / 2, 'rougeL': score + 5,
            'rouge_geometric_mean_per_example': score - 1, 'rouge_geometric_mean': score,
            'score': score}
  return {suite_metrics.SCORE_KEY[family]: score, 'score': score}


# ---------------------------------------------------------------------------------------------
# SCROLLS.

# A validation run at 4,096 tokens with the 7 tasks (ROUGE-1/2/L, or the task's score), and one
# at 16,384 with 3.
SC_SCORES_4096 = {'gov_report': (40.0, 10.0, 25.0), 'summ_screen_fd': (27.0, 8.0, 16.0),
               'qmsum': (32.0, 4.0, 20.0), 'qasper': 30.0, 'narrative_qa': 18.5, 'quality': 41.0,
               'contract_nli': 70.0}
SC_SCORES_16384 = {'gov_report': (44.0, 12.5, 26.0), 'qasper': 35.0, 'quality': 45.5}
SC_TITLE = ("### SCROLLS (ROUGE-1/2/L, F1 or exact match, as its leaderboard shows them; Avg: the "
         "mean over the 7 tasks' scores, ROUGE's geometric mean for the summaries)")
SC_HEADER = ('| Model | Tokens | Temperature | Avg | GovRep | SumScr | QMSum | Qspr | Nrtv | QALT '
          '| CNLI |\n'
          '|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|')
# Avg at 4,096: the geometric means 21.544 (40*10*25), 15.119, 13.680 and 30, 18.5, 41, 70:
# 209.843 / 7 = 29.978.
SC_EXPECTED = f"""{SC_TITLE}

{SC_HEADER}
| retrieval_t5 (validation) | 4096 | tau = 1 | 30.0 | 40.0/10.0/25.0 | 27.0/8.0/16.0 \
| 32.0/4.0/20.0 | 30.0 | 18.5 | 41.0 | 70.0 |
| retrieval_t5 (validation) | 16384 | tau = 1 | - | 44.0/12.5/26.0 | - | - | 35.0 | - | 45.5 \
| - |

Avg needs all 7 tasks scored:

- retrieval_t5 (validation), 16384 tokens, tau = 1: no result for SumScr, QMSum, Nrtv, CNLI.
"""
# ../shared/docs/YARDSTICKS.md section 3.4: model, tokens (the setting's b), Avg, GovRep,
# SumScr, QMSum, Qspr, Nrtv, QALT (EM-T/H), CNLI.
SC_YARDSTICKS = """\
| LongT5-base | 16384 | 38.2 | 53.5/27.3/29.3 | 34.8/9.6/21.1 | 33.9/11.0/22.8 | 46.6 | 23.0 | 37.9/36.6 | 85.6 |
| LongT5-large | 16384 | 40.5 | 54.2/27.8/29.8 | 35.6/9.2/21.2 | 35.1/12.0/23.3 | 52.3 | 27.2 | 40.6/38.6 | 87.3 |
| LongT5-XL | 16384 | 41.9 | 54.7/28.2/30.2 | 35.8/9.6/21.1 | 34.9/11.8/23.5 | 53.1 | 29.3 | 46.0/42.1 | 88.2 |
| UL2 | 2048 | 37.9 | 53.6/26.1/28.8 | 32.9/7.8/19.4 | 31.1/8.5/20.4 | 37.6 | 24.2 | 45.8/40.7 | 88.7 |
| LED-base (SCROLLS) | 16384 | 29.2 | 56.2/26.6/28.8 | 24.2/4.5/15.4 | 25.1/6.7/18.8 | 26.6 | 18.5 | 25.8/25.4 | 71.5 |
"""  # noqa: E501


def _sc_metrics(config: str, score) -> dict[str, float]:
  """metrics.json's metrics of a task: ROUGE-1/2/L with their geometric mean as the score, or
  the family's score."""
  family = scrolls.FAMILIES[config]
  if family == 'rouge_geo':
    rouge = dict(zip(suite_metrics.ROUGE_TYPES, score))
    mean = suite_metrics.geometric_mean(list(score))
    return {**rouge, 'rouge_geometric_mean_per_example': mean - 1,
            'rouge_geometric_mean': mean, 'score': mean}
  return {suite_metrics.SCORE_KEY[family]: score, 'score': score}


# ---------------------------------------------------------------------------------------------
# RULER.

RU_OFFLINE = ('niah_single_1', 'niah_multikey_2', 'niah_multikey_3', 'vt', 'cwe', 'fwe')
# (label, length) -> the offline tasks' scores, in RU_OFFLINE's order.
RU_SCORES = {
    ('tau = 1', 512): (100.0, 50.0, 0.0, 20.0, 10.0, 60.0),     # mean 240 / 6 = 40.0
    ('tau = 1', 1024): (80.0, 25.0, 0.0, 10.0, 5.0, 40.0),      # mean 160 / 6 = 26.67
    ('w/ P_max', 512): (100.0, 60.0, 10.0, 20.0, 10.0, 60.0),   # mean 260 / 6 = 43.33
}
RU_TITLE = "### RULER (the mean of the tasks' scores at each input length; Avg.: over the lengths)"
RU_OFFLINE_NOTE = ('6 of the 13 tasks (niah_single_1, niah_multikey_2, niah_multikey_3, vt, cwe, '
                'fwe); no score for niah_single_2, niah_single_3, niah_multikey_1, '
                'niah_multivalue, niah_multiquery, qa_1, qa_2')
# tau = 1: Avg. (40.0 + 26.67) / 2 = 33.33. w/ P_max has no 1024 result: '-' and no Avg.
RU_EXPECTED = f"""{RU_TITLE}

| Model | Temperature | 512 | 1024 | Avg. |
|---|---|---:|---:|---:|
| retrieval_t5 | tau = 1 | 40.0 | 26.7 | 33.3 |
| retrieval_t5 | w/ P_max | 43.3 | - | - |

Cells average:

- {RU_OFFLINE_NOTE}: retrieval_t5 tau = 1 at 512; retrieval_t5 tau = 1 at 1024; retrieval_t5 \
w/ P_max at 512.
- no task: retrieval_t5 w/ P_max at 1024.
"""
# Per task: Avg. over 512 and 1024, e.g. niah_single_1 (100 + 80) / 2 = 90.
RU_EXPECTED_TASKS = """### RULER per task (upstream's score; Avg.: over the lengths)

| Model | Temperature | Task | 512 | 1024 | Avg. |
|---|---|---|---:|---:|---:|
| retrieval_t5 | tau = 1 | niah_single_1 | 100.0 | 80.0 | 90.0 |
| retrieval_t5 | tau = 1 | niah_multikey_2 | 50.0 | 25.0 | 37.5 |
| retrieval_t5 | tau = 1 | niah_multikey_3 | 0.0 | 0.0 | 0.0 |
| retrieval_t5 | tau = 1 | vt | 20.0 | 10.0 | 15.0 |
| retrieval_t5 | tau = 1 | cwe | 10.0 | 5.0 | 7.5 |
| retrieval_t5 | tau = 1 | fwe | 60.0 | 40.0 | 50.0 |
| retrieval_t5 | w/ P_max | niah_single_1 | 100.0 | - | - |
| retrieval_t5 | w/ P_max | niah_multikey_2 | 60.0 | - | - |
| retrieval_t5 | w/ P_max | niah_multikey_3 | 10.0 | - | - |
| retrieval_t5 | w/ P_max | vt | 20.0 | - | - |
| retrieval_t5 | w/ P_max | cwe | 10.0 | - | - |
| retrieval_t5 | w/ P_max | fwe | 60.0 | - | - |
"""


# ---------------------------------------------------------------------------------------------
# The folders, as t5align.eval writes them.


def _write(folder, task, metrics_, *, split, label='tau = 1', model='retrieval_t5',
           primary='score', examples=20):
  """A task folder as t5align.eval leaves it (the fields the report reads)."""
  spec = catalog.SPECS[task]
  where = folder / spec.task_name
  fileio.write_json_atomic(where / 'run.json', {
      'task': spec.task_name, 'split': split, 'checkpoint': {'sha256': 'a' * 64},
      'num_examples': examples, 'examples_sha256': 'b' * 64, 'mode': 'greedy',
      'max_decode_length': spec.max_decode_length, 'temperature': 1.0, 'label': label})
  fileio.write_json_atomic(where / 'metrics.json', {
      'task': spec.task_name, 'model': model, 'label': label, 'num_examples': examples,
      'metrics': metrics_, 'family': spec.family, 'table': spec.table, 'group': spec.group,
      'column': spec.column, 'primary_metric': primary, 'temperature': 1.0})


def _zs_write(folder, task, length, metrics_, *, split='validation', label='tau = 1',
              model='retrieval_t5', primary='score'):
  _write(folder, f't5align_zeroscrolls_{task}_{length}', metrics_, split=split, label=label,
         model=model, primary=primary)


def _sc_write(folder, config, length, metrics_, *, split='validation', label='tau = 1'):
  task = f't5align_scrolls_{config}_{length}'
  _write(folder, task, metrics_, split=split, label=label,
         primary=metrics.primary_metric(catalog.SPECS[task].family), examples=30)


def _ru_write(folder, task, length, score, *, label='tau = 1', model='retrieval_t5',
              primary='score'):
  task = f't5align_ruler_{task}_{length}'
  _write(folder, task, {'score': score, catalog.SPECS[task].family: score, 'nulls': 0.0},
         split='test', label=label, model=model, primary=primary, examples=4)


# ---------------------------------------------------------------------------------------------
# Every suite.

SUITES = {one.name: one for one in catalog.SUITES}


def _zs_runs(tmp_path):
  for scores, length in ((ZS_SCORES_1024, 1024), (ZS_SCORES_2048, 2048)):
    for task, score in scores.items():
      _zs_write(tmp_path / f'val_{length}', task, length, _zs_metrics(task, score))
  return tmp_path


def _sc_runs(tmp_path):
  for scores, length in ((SC_SCORES_4096, 4096), (SC_SCORES_16384, 16384)):
    for config, score in scores.items():
      _sc_write(tmp_path / f'val_{length}', config, length, _sc_metrics(config, score))
  return tmp_path


def _ru_runs(tmp_path):
  for (label, length), scores in RU_SCORES.items():
    for task, score in zip(RU_OFFLINE, scores):
      _ru_write(tmp_path / label.replace(' ', '_').replace('/', ''), task, length, score,
                label=label)
  return tmp_path


# suite -> (its results written as t5align.eval leaves them, their table).
RUNS = {'zeroscrolls': (_zs_runs, ZS_EXPECTED), 'scrolls': (_sc_runs, SC_EXPECTED),
        'ruler': (_ru_runs, RU_EXPECTED)}
# suite -> its layout's columns: the tasks' in the suite's order, as its paper (ZeroSCROLLS),
# leaderboard (SCROLLS) or README (RULER) names them; and the table's score columns.
COLUMNS = {
    'zeroscrolls': (('GvRp', 'SSFD', 'QMsm', 'SQAL', 'Qspr', 'Nrtv', 'QALT', 'MuSQ', 'SpDg',
                     'BkSS'),
                    ['GvRp', 'SSFD', 'QMsm', 'SQAL', 'Qspr', 'Nrtv', 'QALT', 'MuSQ', 'SpDg',
                     'BkSS', 'Avg']),
    'scrolls': (('GovRep', 'SumScr', 'QMSum', 'Qspr', 'Nrtv', 'QALT', 'CNLI'),
                ['Avg', 'GovRep', 'SumScr', 'QMSum', 'Qspr', 'Nrtv', 'QALT', 'CNLI']),
    'ruler': (ruler.TASKS, None),
}


@pytest.mark.parametrize('name', list(COLUMNS))
def test_the_layouts_columns_are_the_suites(name):
  """The columns a layout orders and checks are its suite's (`Suite.columns`, which the catalog
  writes into each task's metrics.json), in the suite's order."""
  layout, one = suites.LAYOUTS[name], SUITES[name]
  columns, scores = COLUMNS[name]
  ours = layout.tasks if name == 'ruler' else layout.columns
  assert ours == tuple(one.columns[t] for t in one.tasks) == columns
  assert layout.table == name
  if scores is not None:
    assert layout.scores == scores


def test_the_suites_are_the_layouts():
  assert list(suites.LAYOUTS) == list(SUITES)
  assert sorted(suites.PUBLISHED) == ['scrolls', 'zeroscrolls']
  assert RU_OFFLINE == ruler.OFFLINE_TASKS


@pytest.mark.parametrize('name', list(RUNS))
def test_the_suites_table(name, tmp_path):
  """ZeroSCROLLS: 10 tasks at one length and 3 at another; SCROLLS: 7 and 3; RULER: the offline
  tasks at two lengths for one label and at one for another."""
  write, expected = RUNS[name]
  runs = write(tmp_path / 'runs')
  assert tables.render(tables.load_results([runs])) == expected
  out = tmp_path / 'report.md'
  assert report.main([str(runs), '--output', str(out)]) == 0
  assert out.read_text() == expected


# suite -> (a task, length and metrics to write, the column to write instead, the message).
BAD_COLUMNS = {
    'zeroscrolls': (lambda f: _zs_write(f, 'qasper', 1024, _zs_metrics('qasper', 30.0)),
                    't5align_zeroscrolls_qasper_1024', 'Qasper',
                    "'column' is 'Qasper', not a ZeroSCROLLS column"),
    'scrolls': (lambda f: _sc_write(f, 'qasper', 1024, _sc_metrics('qasper', 30.0)),
                't5align_scrolls_qasper_1024', 'Qasper',
                "'column' is 'Qasper', not a SCROLLS column"),
    'ruler': (lambda f: _ru_write(f, 'vt', 512, 1.0), 't5align_ruler_vt_512', 'VT',
              "'column' is 'VT', not a RULER task"),
}


@pytest.mark.parametrize('name', list(BAD_COLUMNS))
def test_a_column_not_the_suites_names_the_file(name, tmp_path):
  write, task, column, message = BAD_COLUMNS[name]
  write(tmp_path)
  path = tmp_path / task / 'metrics.json'
  fileio.write_json_atomic(path, {**json.loads(path.read_text()), 'column': column})
  with pytest.raises(ValueError, match=message) as e:
    tables.render(tables.load_results([tmp_path]))
  assert str(path) in str(e.value)


def _flat_govrep(good):
  row = good['rows'][0]
  return {**row, 'scores': [38.2, 53.5, *row['scores'][2:]]}  # GovRep as one number.


# suite -> (the change to its published file, the message), each naming the file and field.
PUBLISHED_ERRORS = {
    'zeroscrolls': [
        (lambda good: {'columns': ['GvRp']}, r"'columns' is \['GvRp'\]"),
        (lambda good: {'source': None}, "'source' is None"),
        (lambda good: {'rows': [{'model': 'x', 'tokens': '512', 'scores': []}]},
         r'rows\[0\].tokens is .512.; expected an integer'),
        (lambda good: {'rows': [{'model': 'x', 'tokens': 512, 'scores': [1.0]}]},
         r'rows\[0\].scores is \[1.0\]; expected 11 numbers')],
    'scrolls': [
        (lambda good: {'columns': [*suites.LAYOUTS['scrolls'].columns, 'Avg']},
         r"'columns' is \['GovRep'"),
        (lambda good: {'rows': [_flat_govrep(good)]},
         r'rows\[0\].scores is .*; expected 8 entries \(Avg: a number, GovRep: a list of 3 '
         r'numbers, .*QALT: a list of 2 numbers, CNLI: a number\)'),
        (lambda good: {'rows': [{**good['rows'][0], 'tokens': 16384.0}]},
         r'rows\[0\].tokens is 16384.0; expected an integer')],
}


@pytest.mark.parametrize('name, case', [(n, i) for n, cases in PUBLISHED_ERRORS.items()
                                        for i in range(len(cases))])
def test_published_data_errors_name_the_file_and_field(name, case, tmp_path, monkeypatch):
  path = tmp_path / 'published.json'
  good = json.loads(open(suites.PUBLISHED[name], encoding='utf-8').read())
  monkeypatch.setitem(suites.LAYOUTS, name, dataclasses.replace(suites.LAYOUTS[name],
                                                                published=str(path)))
  change, message = PUBLISHED_ERRORS[name][case]
  path.write_text(json.dumps({**good, **change(good)}))
  with pytest.raises(ValueError, match=message) as e:
    suites.published_results(suites.LAYOUTS[name])
  assert str(path) in str(e.value)


def test_published_rows_of_a_suite_without_them_are_refused():
  with pytest.raises(ValueError, match='no published results of longbench'):
    tables.render([], published=['longbench'])


# ---------------------------------------------------------------------------------------------
# ZeroSCROLLS.


def test_published_rows_only_with_the_flag_and_as_yardsticks_gives_them(tmp_path):
  runs = _zs_runs(tmp_path / 'runs')
  out = tmp_path / 'report.md'
  assert report.main([str(runs), '--published', 'zeroscrolls', '--output', str(out)]) == 0
  text = out.read_text()
  rows = [f'| {m} (published, test) | {t} | tau = 1 | {rest}'
          for m, t, rest in (line[2:].split(' | ', 2) for line in ZS_YARDSTICKS.splitlines())]
  # Ours, then the published rows in the paper's order, then the notes and the data's source.
  ours, notes = ZS_EXPECTED.split('\n\nAvg needs')
  assert text.startswith(ours + '\n' + '\n'.join(rows) + '\n\nAvg needs' + notes.rstrip('\n'))
  source = suites.published_results(suites.LAYOUTS['zeroscrolls'])['source']
  assert text.endswith(f'\n\nPublished rows: {source}\n')
  assert 'arXiv:2305.14196' in source and 'Tables 3 and 4' in source
  assert 'published' not in tables.render(tables.load_results([runs]))
  # The published rows alone, without folders.
  alone = tmp_path / 'published.md'
  assert report.main(['--published', 'zeroscrolls', '--output', str(alone)]) == 0
  assert alone.read_text() == (f'{ZS_TITLE}\n\n{ZS_HEADER}\n' + '\n'.join(rows)
                               + f'\n\nPublished rows: {source}\n')


def test_published_averages_are_the_means_of_their_rows():
  data = suites.published_results(suites.LAYOUTS['zeroscrolls'])
  assert data['split'] == 'test' and len(data['rows']) == 11
  for row in data['rows']:
    *scores, average = row['scores']
    assert sum(scores) / 10 == pytest.approx(average, abs=0.05 + 1e-9), row['model']


def test_splits_labels_and_test_rows(tmp_path):
  """A test-split run (no gold: empty metrics) and a validation run of the same tasks are rows
  of their own, named by split, not runs told apart by their settings; labels in paper order."""
  for task in zeroscrolls.TASKS:
    _zs_write(tmp_path / 'test', task, 8192, {}, split='test')
    _zs_write(tmp_path / 'val', task, 8192, _zs_metrics(task, 20.0))
    _zs_write(tmp_path / 'val_pmax', task, 8192, _zs_metrics(task, 25.0), label='w/ P_max')
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
  _zs_write(tmp_path, 'qasper', 1024, _zs_metrics('qasper', 30.0), primary='accuracy')
  with pytest.raises(ValueError, match=r"primary_metric 'accuracy' is not among its metrics "
                                       r'\(f1, score\).*Rerun the same t5align.eval') as e:
    tables.render(tables.load_results([tmp_path]))
  assert str(tmp_path / 't5align_zeroscrolls_qasper_1024' / 'metrics.json') in str(e.value)


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
  assert markdown.primary_value(loaded) == pytest.approx(primary)


def test_bad_group_or_primary_metric_names_the_file_and_field(tmp_path):
  _zs_write(tmp_path, 'qasper', 1024, _zs_metrics('qasper', 30.0))
  path = tmp_path / 't5align_zeroscrolls_qasper_1024' / 'metrics.json'
  result = json.loads(path.read_text())
  for field, value, message in (('group', 'long', "'group' is 'long'; a ZeroSCROLLS task's"),
                                ('primary_metric', ['score'],
                                 r"'primary_metric' is \['score'\]; expected a string")):
    fileio.write_json_atomic(path, {**result, field: value})
    with pytest.raises(ValueError, match=message) as e:
      tables.render(tables.load_results([tmp_path]))
    assert str(path) in str(e.value)


# ---------------------------------------------------------------------------------------------
# SCROLLS.


def _sc_published_lines() -> list[str]:
  return [f'| {m} (published, test) | {t} | tau = 1 | {rest}'
          for m, t, rest in (line[2:].split(' | ', 2) for line in SC_YARDSTICKS.splitlines())]


def test_published_rows_with_the_flag_and_alone(tmp_path):
  runs = _sc_runs(tmp_path / 'runs')
  out = tmp_path / 'report.md'
  assert report.main([str(runs), '--published', 'scrolls', '--output', str(out)]) == 0
  source = suites.published_results(suites.LAYOUTS['scrolls'])['source']
  assert 'arXiv:2208.00748' in source and 'YARDSTICKS.md section 3.4' in source
  ours, notes = SC_EXPECTED.split('\n\nAvg needs')
  assert out.read_text() == (ours + '\n' + '\n'.join(_sc_published_lines()) + '\n\nAvg needs'
                             + notes.rstrip('\n') + f'\n\nPublished rows: {source}\n')
  assert 'published' not in tables.render(tables.load_results([runs]))
  alone = tmp_path / 'published.md'
  assert report.main(['--published', 'scrolls', '--output', str(alone)]) == 0
  assert alone.read_text() == (f'{SC_TITLE}\n\n{SC_HEADER}\n' + '\n'.join(_sc_published_lines())
                               + f'\n\nPublished rows: {source}\n')


def test_published_averages_are_the_scrolls_score_of_their_rows():
  """Avg = the mean of the 7 task scores: ROUGE's geometric mean for the summaries, QuALITY's
  exact match on the whole test set. The parts are published to 0.1, so a recomputed Avg may
  differ from the published one by a few hundredths (LED-base: 29.144 for 29.2)."""
  data = suites.published_results(suites.LAYOUTS['scrolls'])
  assert data['split'] == 'test' and len(data['rows']) == 5
  for row in data['rows']:
    average, *cells = row['scores']
    scores = [suite_metrics.geometric_mean(c) for c in cells[:3]] + [
        c[0] if isinstance(c, list) else c for c in cells[3:]]
    assert sum(scores) / 7 == pytest.approx(average, abs=0.06), row['model']


def test_test_split_rows_and_labels(tmp_path):
  """A test-split run (no gold: empty metrics) is a row of its own with its note; a second
  label follows tau = 1."""
  for config in scrolls.TASKS:
    _sc_write(tmp_path / 'test', config, 1024, {}, split='test')
    _sc_write(tmp_path / 'val', config, 1024, _sc_metrics(config, (20.0, 20.0, 20.0)
                                                    if scrolls.FAMILIES[config] == 'rouge_geo'
                                                    else 20.0))
    _sc_write(tmp_path / 'val_pmax', config, 1024,
           _sc_metrics(config, (8.0, 1.0, 27.0) if scrolls.FAMILIES[config] == 'rouge_geo'
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


# ---------------------------------------------------------------------------------------------
# RULER.


def test_per_task_table_on_request(tmp_path):
  runs = _ru_runs(tmp_path / 'runs')
  out = tmp_path / 'report.md'
  assert report.main([str(runs), '--ruler-tasks', '--output', str(out)]) == 0
  assert out.read_text() == RU_EXPECTED + '\n' + RU_EXPECTED_TASKS


def test_all_thirteen_tasks_in_every_cell(tmp_path):
  # Task i (0-based) scores 10 * i at 512: mean (0 + ... + 120) / 13 = 60.0; at 2048 twice that.
  for i, task in enumerate(ruler.TASKS):
    _ru_write(tmp_path / 'run', task, 512, 10.0 * i, model='m')
    _ru_write(tmp_path / 'run', task, 2048, 20.0 * i, model='m')
  assert tables.render(tables.load_results([tmp_path])) == f"""{RU_TITLE}

| Model | Temperature | 512 | 2048 | Avg. |
|---|---|---:|---:|---:|
| m | tau = 1 | 60.0 | 120.0 | 90.0 |

Cells average:

- all 13 tasks: every cell.
"""


def test_bad_fields_and_missing_primary_metric_name_the_file(tmp_path):
  _ru_write(tmp_path / 'run', 'vt', 512, 1.0, primary='accuracy')
  with pytest.raises(ValueError, match=r"metrics\.json: its primary_metric 'accuracy'"):
    tables.render(tables.load_results([tmp_path]))
  _ru_write(tmp_path / 'run', 'vt', 512, 1.0)
  (result,) = tables.load_results([tmp_path])
  with pytest.raises(ValueError, match=r"'column' is 'VT', not a RULER task"):
    suites.LAYOUTS['ruler'].table_text([{**result, 'column': 'VT'}])
  with pytest.raises(ValueError, match=r"'group' is '4k'; a RULER task's group is its input"):
    suites.LAYOUTS['ruler'].table_text([{**result, 'group': '4k'}])


def test_eval_writes_the_ruler_fields_the_report_reads(tmp_path):
  """`t5align.eval`'s metrics.json of a RULER task: its family's score, table, group, column."""
  from t5align.evaluation import temperature  # pylint: disable=g-import-not-at-top
  from t5align.evaluation import metrics as eval_metrics  # pylint: disable=g-import-not-at-top
  task = 't5align_ruler_niah_multikey_2_1024'
  spec = catalog.SPECS[task]
  targets = [{'target': '1234567', 'meta': {'outputs': ['1234567']}, 'length': 900,
              'num_tokens': 8},
             {'target': '7654321', 'meta': {'outputs': ['7654321']}, 'length': 900,
              'num_tokens': 8}]
  log = types.SimpleNamespace(records={
      i: {'tau': [1.0], 'postprocessed_target': t, 'prediction': p}
      for i, (t, p) in enumerate(zip(targets, [' 1234567.', 'none']))})
  fake = types.SimpleNamespace(name=task,
                               predict_metric_fns=[metrics.make_metric_fn(spec.family)])
  result = eval_metrics.write_metrics(
      fake, spec, 2, log, str(tmp_path / task), False, model_name='m',
      temp=temperature.Temperature(constant=1.0), checkpoint_path='/c')
  assert result['metrics'] == {'score': 50.0, 'string_match_all': 50.0, 'nulls': 0.0}
  assert (result['primary_metric'], result['table'], result['group'], result['column']) == (
      'score', 'ruler', '1024', 'niah_multikey_2')
  fileio.write_json_atomic(tmp_path / task / 'run.json', {'task': task, 'split': 'test'})
  text = tables.render(tables.load_results([tmp_path]))
  assert '| m | tau = 1 | 50.0 | 50.0 |' in text
