"""t5align.report's RULER table: evaluation folders laid out as RULER's README lays out its
results (a row per model and temperature, a column per input length, a cell the mean over the
tasks), and the per-task table on request.

The folders are written here as `t5align.eval` leaves them (metrics.json and run.json per
`t5align_ruler_{task}_{L}` folder); the expected tables are written out, each mean worked out in
the comments.
"""
from __future__ import annotations

import types

import pytest

from seqio_tasks import catalog
from seqio_tasks import metrics
from seqio_tasks import ruler
from t5align import report
from t5align.evaluation import tables
from t5align.runtime import fileio

OFFLINE = ('niah_single_1', 'niah_multikey_2', 'niah_multikey_3', 'vt', 'cwe', 'fwe')
# (label, length) -> the offline tasks' scores, in OFFLINE's order.
SCORES = {
    ('tau = 1', 512): (100.0, 50.0, 0.0, 20.0, 10.0, 60.0),     # mean 240 / 6 = 40.0
    ('tau = 1', 1024): (80.0, 25.0, 0.0, 10.0, 5.0, 40.0),      # mean 160 / 6 = 26.67
    ('w/ P_max', 512): (100.0, 60.0, 10.0, 20.0, 10.0, 60.0),   # mean 260 / 6 = 43.33
}
TITLE = "### RULER (the mean of the tasks' scores at each input length; Avg.: over the lengths)"
OFFLINE_NOTE = ('6 of the 13 tasks (niah_single_1, niah_multikey_2, niah_multikey_3, vt, cwe, '
                'fwe); no score for niah_single_2, niah_single_3, niah_multikey_1, '
                'niah_multivalue, niah_multiquery, qa_1, qa_2')
# tau = 1: Avg. (40.0 + 26.67) / 2 = 33.33. w/ P_max has no 1024 result: '-' and no Avg.
EXPECTED = f"""{TITLE}

| Model | Temperature | 512 | 1024 | Avg. |
|---|---|---:|---:|---:|
| retrieval_t5 | tau = 1 | 40.0 | 26.7 | 33.3 |
| retrieval_t5 | w/ P_max | 43.3 | - | - |

Cells average:

- {OFFLINE_NOTE}: retrieval_t5 tau = 1 at 512; retrieval_t5 tau = 1 at 1024; retrieval_t5 \
w/ P_max at 512.
- no task: retrieval_t5 w/ P_max at 1024.
"""
# Per task: Avg. over 512 and 1024, e.g. niah_single_1 (100 + 80) / 2 = 90.
EXPECTED_TASKS = """### RULER per task (upstream's score; Avg.: over the lengths)

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


def _write(folder, task, length, score, *, label='tau = 1', model='retrieval_t5',
           primary='score'):
  """A task folder as t5align.eval leaves it (the fields the report reads)."""
  spec = catalog.SPECS[f't5align_ruler_{task}_{length}']
  where = folder / spec.task_name
  fileio.write_json_atomic(where / 'run.json', {
      'task': spec.task_name, 'split': 'test', 'checkpoint': {'sha256': 'a' * 64},
      'num_examples': 4, 'examples_sha256': 'b' * 64, 'mode': 'greedy',
      'max_decode_length': spec.max_decode_length, 'label': label})
  fileio.write_json_atomic(where / 'metrics.json', {
      'task': spec.task_name, 'model': model, 'label': label, 'num_examples': 4,
      'metrics': {'score': score, spec.family: score, 'nulls': 0.0}, 'family': spec.family,
      'table': spec.table, 'group': spec.group, 'column': spec.column, 'primary_metric': primary})


@pytest.fixture
def runs(tmp_path):
  for (label, length), scores in SCORES.items():
    for task, score in zip(OFFLINE, scores):
      _write(tmp_path / label.replace(' ', '_').replace('/', ''), task, length, score,
             label=label)
  return tmp_path


def test_the_tasks_are_rulers():
  assert tables.RULER_TASKS == ruler.TASKS
  assert OFFLINE == ruler.OFFLINE_TASKS
  spec = catalog.SPECS['t5align_ruler_qa_2_16384']
  assert (spec.table, spec.group, spec.column, spec.family, spec.max_decode_length) == (
      'ruler', '16384', 'qa_2', 'string_match_part', 32)


def test_lengths_as_columns_the_mean_over_tasks_per_cell(runs, tmp_path):
  assert tables.render(tables.load_results([runs])) == EXPECTED
  out = tmp_path / 'report.md'
  assert report.main([str(runs), '--output', str(out)]) == 0
  assert out.read_text() == EXPECTED


def test_per_task_table_on_request(runs, tmp_path):
  out = tmp_path / 'report.md'
  assert report.main([str(runs), '--ruler-tasks', '--output', str(out)]) == 0
  assert out.read_text() == EXPECTED + '\n' + EXPECTED_TASKS


def test_all_thirteen_tasks_in_every_cell(tmp_path):
  # Task i (0-based) scores 10 * i at 512: mean (0 + ... + 120) / 13 = 60.0; at 2048 twice that.
  for i, task in enumerate(ruler.TASKS):
    _write(tmp_path / 'run', task, 512, 10.0 * i, model='m')
    _write(tmp_path / 'run', task, 2048, 20.0 * i, model='m')
  assert tables.render(tables.load_results([tmp_path])) == f"""{TITLE}

| Model | Temperature | 512 | 2048 | Avg. |
|---|---|---:|---:|---:|
| m | tau = 1 | 60.0 | 120.0 | 90.0 |

Cells average:

- all 13 tasks: every cell.
"""


def test_bad_fields_and_missing_primary_metric_name_the_file(tmp_path):
  _write(tmp_path / 'run', 'vt', 512, 1.0, primary='accuracy')
  with pytest.raises(ValueError, match=r"metrics\.json: its primary_metric 'accuracy'"):
    tables.render(tables.load_results([tmp_path]))
  _write(tmp_path / 'run', 'vt', 512, 1.0)
  (result,) = tables.load_results([tmp_path])
  with pytest.raises(ValueError, match=r"'column' is 'VT', not a RULER task"):
    tables.ruler_table([{**result, 'column': 'VT'}])
  with pytest.raises(ValueError, match=r"'group' is '4k'; a RULER task's group is its input"):
    tables.ruler_table([{**result, 'group': '4k'}])


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
