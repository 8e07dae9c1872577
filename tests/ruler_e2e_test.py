"""RULER end to end on the shipped model (CPU): the offline tasks generated at 512 and 1,024
tokens -> per-task calibration -> `t5align.eval` at tau = 1 and with the per-task schedule ->
`t5align.report`'s RULER table.

The commands are docs/ruler.md's, run in process with 2 examples per task
(`seqio_tasks.options.ruler_examples = 2`) and 16 decoded tokens (the tasks' own 30 to 128 would
only take longer here), on the offline tasks that fit each length in the shipped model's
1,000-piece vocabulary (`FITS`; the others' smallest inputs are longer: the generator refuses
them, tests/ruler_tasks_test.py). Each layer is checked against an independent reading: every
task's score against upstream's metric recomputed here from the folder's predictions (RULER's
postprocessing, case-insensitive substring match, `round(mean * 100, 2)`), every example's
temperature against the schedule's entry for its task, the table's cells against the means of the
metrics.json scores.
"""
from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHIPPED = REPO_ROOT / 't5align' / 'shipped' / 'retrieval_t5'
CHECKPOINT = SHIPPED / 'checkpoint_5000'
VOCABULARY = SHIPPED / 'sentencepiece.model'
LENGTHS = (512, 1024)
FITS = {512: ('niah_single_1', 'niah_multikey_2', 'fwe'),
        1024: ('niah_single_1', 'niah_multikey_2', 'niah_multikey_3', 'vt', 'fwe')}
EXAMPLES = 'seqio_tasks.options.ruler_examples = 2'


def _common() -> list[str]:
  return ['--gin_file=gin/models/retrieval_small.gin', f'--gin.CHECKPOINT_PATH={CHECKPOINT}',
          f'--gin.seqio_tasks.vocabulary_path.path={VOCABULARY}', f'--gin_bindings={EXAMPLES}']


def _tasks() -> str:
  return ','.join(f't5align_ruler_{t}_{n}' for n in LENGTHS for t in FITS[n])


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


@pytest.mark.cli
@pytest.mark.slow
@pytest.mark.tensorflow
@pytest.mark.usefixtures('clean_gin')
def test_offline_tasks_calibrated_evaluated_and_tabled(tmp_path, monkeypatch):
  pytest.importorskip('seqio')
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  monkeypatch.chdir(REPO_ROOT)
  import gin  # pylint: disable=g-import-not-at-top
  from t5align import calibrate  # pylint: disable=g-import-not-at-top
  from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top

  tasks = sorted(_tasks().split(','))
  schedule_path = tmp_path / 'schedule.json'
  calibrate.main(['--gin_file=gin/calibrate.gin', *_common(),
                  '--gin_bindings=jobs.CalibrationJob.config = @network.T5Config()',
                  f'--gin.SEQIO_TASK={_tasks()}',
                  "--gin_bindings=jobs.CalibrationJob.seqio_split = 'test'",
                  '--gin.REFERENCE_LENGTH=256', f'--gin.LENGTHS={LENGTHS}', '--gin.NUM_SAMPLES=2',
                  "--gin.STRATEGIES=('pmax', 'log_length')", f'--gin.OUTPUT_PATH={schedule_path}'])
  per_task = json.loads(schedule_path.read_text())['tasks']
  assert sorted(per_task) == tasks  # Each task calibrated on its own inputs.

  runs = {}
  for name, extra in (('tau1', ['--gin.TEMPERATURE=1.0']),
                      ('pmax', [f'--gin.SCHEDULE_PATH={schedule_path}'])):
    gin.clear_config()
    runs[name] = tmp_path / name
    results = t5align_eval.main(['--gin_file=gin/runs/eval.gin', *_common(),
                                 f'--gin.MIXTURE_OR_TASK_NAME={_tasks()}',
                                 '--gin.MAX_DECODE_LENGTH=16', '--gin.BATCH_SIZE=2',
                                 f'--gin.EVAL_OUTPUT_DIR={runs[name]}', *extra])
    assert sorted(results) == tasks

  _check(runs, json.loads(schedule_path.read_text()), tmp_path / 'ruler.md')


def _check(runs: dict[str, pathlib.Path], schedule: dict, out: pathlib.Path) -> None:
  """The records, metrics and table of the two runs against their independent readings."""
  from t5align import report  # pylint: disable=g-import-not-at-top
  scores: dict[tuple[str, int], list[float]] = {}
  for name in ('tau1', 'pmax'):
    for n in LENGTHS:
      for task in FITS[n]:
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
    means = [float(np.mean(scores[(name, n)])) for n in LENGTHS]
    assert rows[label] == [f'{m:.1f}' for m in means] + [f'{np.mean(means):.1f}']
  notes = out.read_text().split('Cells average:')[1]
  assert '- 3 of the 13 tasks (niah_single_1, niah_multikey_2, fwe); no score for ' in notes
  assert 'retrieval_t5 tau = 1 at 512; retrieval_t5 w/ P_max at 512.' in notes
  assert '- 5 of the 13 tasks (niah_single_1, niah_multikey_2, niah_multikey_3, vt, fwe)' in notes
