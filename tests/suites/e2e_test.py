"""The long-context suites end to end on the shipped model (CPU), one test parametrized over the
suites, each layer checked against an independent reading.

ZeroSCROLLS: the user's files -> per-task calibration -> `t5align.eval` at tau = 1 and with the
per-task schedule (validation, scored) and on the test split -> `t5align.report`'s table ->
`t5align.leaderboard`'s CSV. The commands are docs/zeroscrolls.md's "From download to table: the
shipped model", run in process on a fixture of all 10 tasks in the upstream record format
(invented text, two ids per split, one validation id with two references), at 512 tokens (the
docs use 1,024) and with 4 decoded tokens (the runner's 1,024 would take minutes per example
here). Checked: every task's score against the suite metric recomputed from the folder's
predictions, every example's temperature against the schedule's own entry for its task, the
table's cells against metrics.json, the CSV as the suite's verifier reads it.

RULER: the offline tasks generated at 512 and 1,024 tokens -> per-task calibration ->
`t5align.eval` at tau = 1 and with the per-task schedule -> `t5align.report`'s RULER table. The
commands are docs/ruler.md's, run in process with 2 examples per task
(`seqio_tasks.options.ruler_examples = 2`) and 16 decoded tokens (the tasks' own 30 to 128 would
only take longer here), on the offline tasks that fit each length in the shipped model's
1,000-piece vocabulary (`RULER_FITS`; the others' smallest inputs are longer: the generator
refuses them, tests/suites/tasks_test.py). Checked: every task's score against upstream's metric
recomputed here from the folder's predictions (RULER's postprocessing, case-insensitive substring
match, `round(mean * 100, 2)`), every example's temperature against the schedule's entry for its
task, the table's cells against the means of the metrics.json scores.

SCROLLS: TFDS' `scrolls` mocked (`mock_scrolls`, as tasks_test.py reads it) with Qasper and
NarrativeQA validation rows, one id with two rows (two references) -> `t5align.eval` at tau = 1
and 0.8 on `t5align_scrolls_{qasper,narrative_qa}_512` -> `t5align.report`'s SCROLLS table.
Checked: each task's score against SQuAD's token F1 (the suite's metric for both: lower-cased,
punctuation and articles dropped), max over an id's references, recomputed here from the
predictions, one prediction per id, and the table's cells against metrics.json.
"""
from __future__ import annotations

import collections
import csv
import json
import pathlib
import re
import string

import numpy as np
import pytest

from seqio_tasks import suite_metrics
from seqio_tasks import zeroscrolls

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = REPO_ROOT / 't5align' / 'shipped' / 'retrieval_t5'
CHECKPOINT = SHIPPED / 'checkpoint_5000'
VOCABULARY = SHIPPED / 'sentencepiece.model'


@pytest.mark.cli
@pytest.mark.slow
@pytest.mark.tensorflow
@pytest.mark.usefixtures('clean_gin')
@pytest.mark.parametrize('suite', ['zeroscrolls', 'scrolls', 'ruler'])
def test_end_to_end_on_the_shipped_model(suite, tmp_path, monkeypatch, request):
  pytest.importorskip('seqio')
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  monkeypatch.chdir(REPO_ROOT)
  if suite == 'scrolls':
    _scrolls(tmp_path, request.getfixturevalue('mock_scrolls'))
  else:
    {'zeroscrolls': _zeroscrolls, 'ruler': _ruler}[suite](tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------
# ZeroSCROLLS.

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


def _zs_common() -> list[str]:
  return ['--gin_file=gin/models/retrieval_small.gin', f'--gin.CHECKPOINT_PATH={CHECKPOINT}',
          f'--gin.seqio_tasks.vocabulary_path.path={VOCABULARY}']


def _eval_args(out: pathlib.Path, split: str, *extra: str) -> list[str]:
  return ['--gin_file=gin/runs/eval.gin', *_zs_common(),
          f'--gin.MIXTURE_OR_TASK_NAME=t5align_zeroscrolls_{LENGTH}',
          f"--gin_bindings=jobs.EvalJob.split = '{split}'",
          '--gin.MAX_DECODE_LENGTH=4', '--gin.BATCH_SIZE=2', f'--gin.EVAL_OUTPUT_DIR={out}', *extra]


def _zs_records(folder: pathlib.Path) -> list[dict]:
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


def _zeroscrolls(tmp_path: pathlib.Path, monkeypatch) -> None:
  """The user's files -> calibration -> eval (tau = 1, schedule, test split) -> table, CSV."""
  data_dir = tmp_path / 'zero_scrolls'
  test_ids = _write_suite(data_dir)
  monkeypatch.setenv(zeroscrolls.ENV_DIR, str(data_dir))
  from t5align import calibrate  # pylint: disable=g-import-not-at-top
  from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top
  from t5align import leaderboard  # pylint: disable=g-import-not-at-top
  from t5align.evaluation import tables  # pylint: disable=g-import-not-at-top

  schedule_path = tmp_path / 'schedule.json'
  calibrate.main(['--gin_file=gin/calibrate.gin', *_zs_common(),
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
      records = _zs_records(folder)
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
    records = _zs_records(runs['test'] / f't5align_zeroscrolls_{task}_{LENGTH}')
    assert got[task] == {r['id']: r['prediction'] for r in records}
    i = tasks.index(f't5align_zeroscrolls_{task}_{LENGTH}')
    assert all(r['tau'] == pytest.approx([0.9 - 0.02 * i]) for r in records), task


# ---------------------------------------------------------------------------------------------
# SCROLLS.

# Records of the kind the shipped model retrieves from (its 'lines' task), so that its answers
# share tokens with the references.
SCROLLS_LINES = ''.join(f'line w{i}-x{i}: REGISTER_CONTENT is <{100 + i}>\n' for i in range(20))
SCROLLS_ROWS = {  # config -> validation rows {id, pid, input, output}; q1 has two references.
    config: [{'id': f'{config}-q1', 'pid': f'{config}-q1_0',
              'input': f'{SCROLLS_LINES}Tell me what is the number in line w7-x7?',
              'output': 'line w7-x7: REGISTER_CONTENT is <107>'},
             {'id': f'{config}-q2', 'pid': f'{config}-q2_0',
              'input': f'{SCROLLS_LINES}Tell me what is the number in line w3-x3?',
              'output': 'The number is 103.'},
             {'id': f'{config}-q1', 'pid': f'{config}-q1_1',
              'input': f'{SCROLLS_LINES}Tell me what is the number in line w7-x7?',
              'output': '107'}]
    for config in ('qasper', 'narrative_qa')}


def _squad_f1(prediction: str, reference: str) -> float:
  """SQuAD's token F1 x 100, written out: lower-case, drop punctuation and the articles a, an
  and the, split on whitespace; 2PR / (P + R) over the tokens both hold (with repeats)."""
  def tokens(text):
    text = ''.join(c for c in text.lower() if c not in string.punctuation)
    return re.sub(r'\b(a|an|the)\b', ' ', text).split()
  ours, theirs = tokens(prediction), tokens(reference)
  common = sum((collections.Counter(ours) & collections.Counter(theirs)).values())
  if not common:
    return 0.0
  precision, recall = common / len(ours), common / len(theirs)
  return 100 * 2 * precision * recall / (precision + recall)


def _scrolls(tmp_path: pathlib.Path, mock_scrolls) -> None:
  """Mocked TFDS rows -> eval (tau = 1, 0.8) -> table."""
  import gin  # pylint: disable=g-import-not-at-top
  from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top
  from t5align import report  # pylint: disable=g-import-not-at-top
  tasks = [f't5align_scrolls_{c}_{LENGTH}' for c in SCROLLS_ROWS]
  runs = {}
  with mock_scrolls({(c, 'validation'): rows for c, rows in SCROLLS_ROWS.items()}):
    for name, tau in (('tau1', '1.0'), ('tau08', '0.8')):
      gin.clear_config()
      runs[name] = tmp_path / name
      results = t5align_eval.main([
          '--gin_file=gin/runs/eval.gin', *_zs_common(),
          f'--gin.MIXTURE_OR_TASK_NAME={",".join(tasks)}',
          "--gin_bindings=jobs.EvalJob.split = 'validation'", '--gin.MAX_DECODE_LENGTH=24',
          '--gin.BATCH_SIZE=2', f'--gin.TEMPERATURE={tau}', f'--gin.EVAL_OUTPUT_DIR={runs[name]}'])
      assert sorted(results) == sorted(tasks)
  scores = {}
  for name in runs:
    for config, rows in SCROLLS_ROWS.items():
      folder = runs[name] / f't5align_scrolls_{config}_{LENGTH}'
      records = _zs_records(folder)
      assert sorted(r['id'] for r in records) == [f'{config}-q1', f'{config}-q2']  # One per id.
      references = {}
      for row in rows:
        references.setdefault(row['id'], []).append(row['output'])
      want = np.mean([max(_squad_f1(r['prediction'], g) for g in references[r['id']])
                      for r in records])
      metrics = json.loads((folder / 'metrics.json').read_text())
      assert (metrics['table'], metrics['num_examples']) == ('scrolls', 2)
      assert metrics['metrics'][metrics['primary_metric']] == pytest.approx(want, abs=1e-4)
      tau = {'tau1': 1.0, 'tau08': 0.8}[name]
      assert all(r['tau'] == [pytest.approx(tau)] for r in records)
      scores[(name, metrics['column'])] = metrics['metrics'][metrics['primary_metric']]
  out = tmp_path / 'scrolls.md'
  assert report.main([str(runs['tau1']), str(runs['tau08']), '--output', str(out)]) == 0
  text = out.read_text()
  header = next(line for line in text.splitlines() if '| Qspr |' in line)
  columns = [c.strip() for c in header.split('|')[1:-1]]
  assert any(scores.values())  # Some prediction overlaps a reference: the F1s are not all 0.
  for label, name in (('tau = 1', 'tau1'), ('tau = 0.8', 'tau08')):
    row = next(line for line in text.splitlines()
               if line.startswith('| retrieval_t5') and f'| {label} |' in line)
    cells = dict(zip(columns, (c.strip() for c in row.split('|')[1:-1])))
    for column in ('Qspr', 'Nrtv'):
      assert cells[column] == f'{scores[(name, column)]:.1f}', text


# ---------------------------------------------------------------------------------------------
# RULER.

RULER_LENGTHS = (512, 1024)
RULER_FITS = {512: ('niah_single_1', 'niah_multikey_2', 'fwe'),
        1024: ('niah_single_1', 'niah_multikey_2', 'niah_multikey_3', 'vt', 'fwe')}
RULER_EXAMPLES = 'seqio_tasks.options.ruler_examples = 2'


def _ruler_common() -> list[str]:
  return ['--gin_file=gin/models/retrieval_small.gin', f'--gin.CHECKPOINT_PATH={CHECKPOINT}',
          f'--gin.seqio_tasks.vocabulary_path.path={VOCABULARY}',
          f'--gin_bindings={RULER_EXAMPLES}']


def _ruler_tasks() -> str:
  return ','.join(f't5align_ruler_{t}_{n}' for n in RULER_LENGTHS for t in RULER_FITS[n])


def _upstream_score(task: str, records: list[dict]) -> float:
  """RULER's task score from the records: each prediction stripped, its U+0000..U+001F
  characters turned into newlines, stripped; per example the fraction (string_match_all) of the
  references found in it, lower-cased; the mean x 100, rounded to 2 places."""
  values = []
  for r in records:
    prediction = re.sub(r'[\x00-\x1f]', '\n', r['prediction'].strip()).strip().lower()
    references = r['postprocessed_target']['meta']['outputs']
    values.append(sum(ref.lower() in prediction for ref in references) / len(references))
  assert task not in ('qa_1', 'qa_2')  # string_match_part: not among the offline tasks.
  return round(sum(values) / len(values) * 100, 2)


def _ruler(tmp_path: pathlib.Path, monkeypatch) -> None:
  """The offline tasks generated -> calibration -> eval (tau = 1, schedule) -> table."""
  del monkeypatch  # Generated: no files to point at.
  import gin  # pylint: disable=g-import-not-at-top
  from t5align import calibrate  # pylint: disable=g-import-not-at-top
  from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top

  tasks = sorted(_ruler_tasks().split(','))
  schedule_path = tmp_path / 'schedule.json'
  calibrate.main(['--gin_file=gin/calibrate.gin', *_ruler_common(),
                  '--gin_bindings=jobs.CalibrationJob.config = @network.T5Config()',
                  f'--gin.SEQIO_TASK={_ruler_tasks()}',
                  "--gin_bindings=jobs.CalibrationJob.seqio_split = 'test'",
                  '--gin.REFERENCE_LENGTH=256', f'--gin.LENGTHS={RULER_LENGTHS}',
                  '--gin.NUM_SAMPLES=2',
                  "--gin.STRATEGIES=('pmax', 'log_length')", f'--gin.OUTPUT_PATH={schedule_path}'])
  per_task = json.loads(schedule_path.read_text())['tasks']
  assert sorted(per_task) == tasks  # Each task calibrated on its own inputs.

  runs = {}
  for name, extra in (('tau1', ['--gin.TEMPERATURE=1.0']),
                      ('pmax', [f'--gin.SCHEDULE_PATH={schedule_path}'])):
    gin.clear_config()
    runs[name] = tmp_path / name
    results = t5align_eval.main(['--gin_file=gin/runs/eval.gin', *_ruler_common(),
                                 f'--gin.MIXTURE_OR_TASK_NAME={_ruler_tasks()}',
                                 '--gin.MAX_DECODE_LENGTH=16', '--gin.BATCH_SIZE=2',
                                 f'--gin.EVAL_OUTPUT_DIR={runs[name]}', *extra])
    assert sorted(results) == tasks

  _ruler_check(runs, json.loads(schedule_path.read_text()), tmp_path / 'ruler.md')


def _ruler_check(runs: dict[str, pathlib.Path], schedule: dict, out: pathlib.Path) -> None:
  """The records, metrics and table of the two runs against their independent readings."""
  from t5align import report  # pylint: disable=g-import-not-at-top
  scores: dict[tuple[str, int], list[float]] = {}
  for name in ('tau1', 'pmax'):
    for n in RULER_LENGTHS:
      for task in RULER_FITS[n]:
        folder = runs[name] / f't5align_ruler_{task}_{n}'
        records = [json.loads(line)
                   for line in (folder / 'predictions.jsonl').read_text().splitlines()]
        metrics = json.loads((folder / 'metrics.json').read_text())
        assert metrics['num_examples'] == 2 and metrics['primary_metric'] == 'score'
        assert (metrics['table'], metrics['group'], metrics['column']) == ('ruler', str(n), task)
        assert metrics['metrics']['score'] == _upstream_score(task, records), (name, folder)
        assert all(r['input_length'] <= n for r in records)  # The generator's budget.
        scores.setdefault((name, n), []).append(metrics['metrics']['score'])
        if name == 'tau1':
          assert all(r['tau'] == [1.0] for r in records)
          continue
        # The task's own calibration (one, at its longest input), interpolated in log length
        # from tau = 1 at L_tr: the schedule's rule, computed here in float64.
        (calibration,) = schedule['tasks'][folder.name]['pmax']
        for r in records:
          want = np.interp(np.log(r['input_length']),
                           np.log([schedule['reference_length'], calibration['length']]),
                           [1.0, calibration['tau']])
          assert r['tau'] == [pytest.approx(want, rel=1e-5)], (folder.name, r['index'])

  assert report.main([str(runs['tau1']), str(runs['pmax']), '--output', str(out)]) == 0
  rows = {line.split('|')[2].strip(): [c.strip() for c in line.split('|')[3:-1]]
          for line in out.read_text().splitlines() if line.startswith('| retrieval_t5 |')}
  assert sorted(rows) == ['tau = 1', 'w/ P_max']
  for label, name in (('tau = 1', 'tau1'), ('w/ P_max', 'pmax')):
    means = [float(np.mean(scores[(name, n)])) for n in RULER_LENGTHS]
    assert rows[label] == [f'{m:.1f}' for m in means] + [f'{np.mean(means):.1f}']
  notes = out.read_text().split('Cells average:')[1]
  assert '- 3 of the 13 tasks (niah_single_1, niah_multikey_2, fwe); no score for ' in notes
  assert 'retrieval_t5 tau = 1 at 512; retrieval_t5 w/ P_max at 512.' in notes
  assert '- 5 of the 13 tasks (niah_single_1, niah_multikey_2, niah_multikey_3, vt, fwe)' in notes
