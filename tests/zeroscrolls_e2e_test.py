"""ZeroSCROLLS end to end on the shipped model (CPU): the user's files -> per-task calibration ->
`t5align.eval` at tau = 1 and with the per-task schedule (validation, scored) and on the test
split -> `t5align.report`'s table -> `t5align.leaderboard`'s CSV.

The commands are docs/zeroscrolls.md's "From download to table: the shipped model", run in
process on a fixture of all 10 tasks in the upstream record format (invented text, two ids per
split, one validation id with two references), at 512 tokens (the docs use 1,024) and with 4
decoded tokens (the runner's 1,024 would take minutes per example here). Each layer is checked
against an independent reading: every task's score against the suite metric recomputed from the
folder's predictions, every example's temperature against the schedule's own entry for its task,
the table's cells against metrics.json, the CSV as the suite's verifier reads it.
"""
from __future__ import annotations

import csv
import json
import pathlib

import numpy as np
import pytest

from seqio_tasks import suite_metrics
from seqio_tasks import zeroscrolls

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHIPPED = REPO_ROOT / 't5align' / 'shipped' / 'retrieval_t5'
CHECKPOINT = SHIPPED / 'checkpoint_5000'
VOCABULARY = SHIPPED / 'sentencepiece.model'
LENGTH = 512
SEPARATOR = '... [The rest of the document is omitted]\n\n'
DOCUMENT = ' '.join(
    f'line {i}: the register content of room {i} is <{1000 + 37 * i}>, and the grass is green.'
    for i in range(40))
# A gold output of each task's form: summaries, short answers, a letter, a percentage, an order.
GOLD = {'gov_report': ['the register content of each room is listed'],
        'summ_screen_fd': ['rooms hold numbers'],
        'qmsum': ['the meeting listed the rooms'],
        'squality': ['a story about rooms', 'the rooms and their numbers'],
        'qasper': ['room 3'], 'narrative_qa': ['the grass'],
        'quality': ['(B) green'], 'musique': ['1111'],
        'space_digest': ['40%'], 'book_sum_sort': ['2, 1, 3']}


def _record(task: str, example_id: str, output: str | None, pid: int) -> dict:
  """A record as ZeroSCROLLS publishes it: the whole prompt in 'input', character indices."""
  head = f'You are given a {task} document. Answer the query after it.\n\nDocument:\n'
  before_query = f'{head}{DOCUMENT}\n\n'
  text = f'{before_query}Query:\nWhat is in room 3?\n\nAnswer:'
  return {'id': example_id, 'pid': f'{example_id}_{pid}', 'input': text, 'output': output,
          'document_start_index': len(head), 'document_end_index': len(head) + len(DOCUMENT),
          'query_start_index': len(before_query),
          'query_end_index': len(before_query) + len('Query:\nWhat is in room 3?'),
          'truncation_seperator': SEPARATOR}


def _write_suite(folder: pathlib.Path) -> dict[str, list[str]]:
  """Every task's validation and test files, extracted; returns the test ids per task."""
  test_ids = {}
  for task in zeroscrolls.TASKS:
    (folder / task).mkdir(parents=True)
    validation = [_record(task, f'{task}-v0', gold, pid)
                  for pid, gold in enumerate(GOLD[task])]
    validation.append(_record(task, f'{task}-v1', GOLD[task][0], 0))
    test = [_record(task, f'{task}-t{i}', None, 0) for i in range(2)]
    for split, records in (('validation', validation), ('test', test)):
      (folder / task / f'{split}.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
    test_ids[task] = [r['id'] for r in test]
  return test_ids


def _common() -> list[str]:
  return ['--gin_file=gin/models/retrieval_small.gin', f'--gin.CHECKPOINT_PATH={CHECKPOINT}',
          f'--gin.seqio_tasks.vocabulary_path.path={VOCABULARY}']


def _eval_args(out: pathlib.Path, split: str, *extra: str) -> list[str]:
  return ['--gin_file=gin/runs/eval.gin', *_common(),
          f'--gin.MIXTURE_OR_TASK_NAME=t5align_zeroscrolls_{LENGTH}',
          f"--gin_bindings=jobs.EvalJob.split = '{split}'",
          '--gin.MAX_DECODE_LENGTH=4', '--gin.BATCH_SIZE=2', f'--gin.EVAL_OUTPUT_DIR={out}', *extra]


def _records(folder: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in (folder / 'predictions.jsonl').read_text().splitlines()]


def _task_score(task: str, records: list[dict], references: dict[str, list[str]]) -> float:
  """The suite's score of a task from its predictions, computed here: ROUGE with `rouge_score`
  directly (each type's max over references, its mean over examples, the geometric mean of the
  three means); otherwise the family's per-example metric, max over references, averaged."""
  family = zeroscrolls.FAMILIES[task]
  if family == 'rouge_geo':
    from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top
    scorer = rouge_scorer.RougeScorer(['rouge1', 'rouge2', 'rougeL'])
    per_type = np.asarray([[max(100 * scorer.score(ref, r['prediction'])[k].fmeasure
                                for ref in references[r['id']])
                            for k in ('rouge1', 'rouge2', 'rougeL')] for r in records])
    means = per_type.mean(axis=0)  # [3]
    return 0.0 if (means <= 0).any() else float(np.exp(np.log(means).mean()))
  fn = {'f1_unidecode': lambda p, g: suite_metrics.token_f1(p, g, transliterate=True),
        'letter_acc': suite_metrics.letter_accuracy, 'exp_sim': suite_metrics.exp_similarity,
        'c_index': suite_metrics.concordance_index}[family]
  return float(np.mean([max(fn(r['prediction'], g) for g in references[r['id']])
                        for r in records]))


@pytest.mark.cli
@pytest.mark.slow
@pytest.mark.tensorflow
@pytest.mark.usefixtures('clean_gin')
def test_download_to_table_and_csv_on_the_shipped_model(tmp_path, monkeypatch):
  pytest.importorskip('seqio')
  data_dir = tmp_path / 'zero_scrolls'
  test_ids = _write_suite(data_dir)
  monkeypatch.setenv(zeroscrolls.ENV_DIR, str(data_dir))
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  monkeypatch.chdir(REPO_ROOT)
  from t5align import calibrate  # pylint: disable=g-import-not-at-top
  from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top
  from t5align import leaderboard  # pylint: disable=g-import-not-at-top
  from t5align.evaluation import tables  # pylint: disable=g-import-not-at-top

  schedule_path = tmp_path / 'schedule.json'
  calibrate.main(['--gin_file=gin/calibrate.gin', *_common(),
                  '--gin_bindings=jobs.CalibrationJob.config = @network.T5Config()',
                  f'--gin.SEQIO_TASK=t5align_zeroscrolls_{LENGTH}', '--gin.REFERENCE_LENGTH=256',
                  f"--gin.LENGTHS=({LENGTH},)", '--gin.NUM_SAMPLES=2', "--gin.STRATEGIES=('pmax',)",
                  f'--gin.OUTPUT_PATH={schedule_path}'])
  schedule = json.loads(schedule_path.read_text())
  tasks = [f't5align_zeroscrolls_{t}_{LENGTH}' for t in zeroscrolls.TASKS]
  assert sorted(schedule['tasks']) == sorted(tasks)  # Each task calibrated on its own inputs.
  # The fixture's tasks share their document, so their temperatures are equal: for the test
  # split, a copy with a different temperature per task shows each task reading its own entry.
  edited = tmp_path / 'schedule_per_task.json'
  for i, task in enumerate(tasks):
    schedule['tasks'][task]['pmax'][0]['tau'] = 0.9 - 0.02 * i
  edited.write_text(json.dumps(schedule))
  schedule = json.loads(schedule_path.read_text())

  import gin  # pylint: disable=g-import-not-at-top
  runs = {}
  for name, split, extra in (('tau1', 'validation', ['--gin.TEMPERATURE=1.0']),
                             ('pmax', 'validation', [f'--gin.SCHEDULE_PATH={schedule_path}']),
                             ('test', 'test', [f'--gin.SCHEDULE_PATH={edited}'])):
    gin.clear_config()
    runs[name] = tmp_path / name
    results = t5align_eval.main(_eval_args(runs[name], split, *extra))
    assert sorted(results) == sorted(tasks)

  references = {t: {f'{t}-v0': GOLD[t], f'{t}-v1': GOLD[t][:1]} for t in zeroscrolls.TASKS}
  for name in ('tau1', 'pmax'):
    for task in zeroscrolls.TASKS:
      folder = runs[name] / f't5align_zeroscrolls_{task}_{LENGTH}'
      records = _records(folder)
      assert sorted(r['id'] for r in records) == sorted(references[task])  # One per id.
      metrics = json.loads((folder / 'metrics.json').read_text())
      assert metrics['primary_metric'] == 'score' and metrics['num_examples'] == 2
      want = _task_score(task, records, references[task])
      assert metrics['metrics']['score'] == pytest.approx(want, abs=1e-4), task
      if name == 'tau1':
        assert all(r['tau'] == [1.0] for r in records)
      else:  # The task's own calibrated temperature.
        tau = schedule['tasks'][folder.name]['pmax'][0]['tau']
        assert all(r['tau'] == pytest.approx([tau]) for r in records), task

  table = tables.render(tables.load_results([runs['tau1'], runs['pmax']]))
  rows = {line.split('|')[3].strip(): line for line in table.splitlines()
          if line.startswith('| shipped') or line.startswith('| retrieval')}
  assert sorted(rows) == ['tau = 1', 'w/ P_max'], table
  for label, name in (('tau = 1', 'tau1'), ('w/ P_max', 'pmax')):
    cells = [c.strip() for c in rows[label].split('|')[4:-1]]
    scores = [json.loads((runs[name] / f't5align_zeroscrolls_{t}_{LENGTH}' / 'metrics.json')
                         .read_text())['metrics']['score'] for t in zeroscrolls.TASKS]
    assert cells == [f'{s:.1f}' for s in scores] + [f'{np.mean(scores):.1f}'], table

  output = tmp_path / 'zero_scrolls_predictions.csv'
  leaderboard.export([str(runs['test'])], str(output))
  with open(output, newline='', encoding='utf-8') as f:
    rows = list(csv.reader(f))
  assert rows[0] == ['Task', 'ID', 'Prediction']
  got: dict[str, dict[str, str]] = {}
  for task, example_id, prediction in rows[1:]:
    assert example_id not in got.setdefault(task, {})
    got[task][example_id] = prediction
  assert {t: list(p) for t, p in got.items()} == test_ids
  for task in zeroscrolls.TASKS:
    records = _records(runs['test'] / f't5align_zeroscrolls_{task}_{LENGTH}')
    assert got[task] == {r['id']: r['prediction'] for r in records}
    i = tasks.index(f't5align_zeroscrolls_{task}_{LENGTH}')
    assert all(r['tau'] == pytest.approx([0.9 - 0.02 * i]) for r in records), task
