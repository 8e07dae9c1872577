"""`python -m t5align.eval --gin.BIAS_RULE=interpolate` against t5x.infer's golden predictions.

tests/testdata/t5x_infer_bias/{task}/ holds what `python -m t5x.infer` (gin/t5x/infer.gin, the
shipped model, tau = 1, the encoder's relative bias read by the interpolation rule, L_tr = 256)
wrote on each ZeroSCROLLS task at 1024 tokens alone, over the invented test records of
tests/testdata/t5x_infer/zero_scrolls/ (README.md there says how). t5x's network resolves the
rule at its input's padded width, which t5x.infer sets to the run's longest input; `t5align.eval`
resolves it once per task at the task's longest input (`network.bias_rules_at`), so one task per
t5x.infer run reads the table as `t5align.eval` does, whatever BATCH_SIZE pads its batches to.
"""
from __future__ import annotations

import json
import pathlib

import pytest

import conftest
from seqio_tasks import zeroscrolls

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / 'tests' / 'testdata' / 't5x_infer_bias'
RECORDS = REPO_ROOT / 'tests' / 'testdata' / 't5x_infer' / 'zero_scrolls'
SHIPPED = REPO_ROOT / 't5align' / 'shipped' / 'retrieval_t5'
AT_1024 = ('gov_report', 'qasper')  # Tasks holding an input cut to 1024 tokens (4 L_tr).


def _name(task: str) -> str:
  return f't5align_zeroscrolls_{task}_1024'


def _t5x_file(task: str) -> pathlib.Path:
  return FIXTURES / task / f'{_name(task)}-predict.jsonl-00000-of-00001'


def _t5x_predictions(task: str) -> list[tuple[str, str]]:
  """[(id, prediction)] of t5x.infer's golden file for `task`, in file (split) order."""
  records = [json.loads(line) for line in _t5x_file(task).read_text().splitlines()]
  return [(r['inputs']['id'], r['prediction']) for r in records]


def _eval_args(out: pathlib.Path, tasks: tuple[str, ...], batch_size: int,
               *extra: str) -> list[str]:
  """`python -m t5align.eval`'s flags for the golden run's tasks on the shipped model."""
  return ['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/retrieval_small.gin',
          f'--gin.CHECKPOINT_PATH={SHIPPED / "checkpoint_5000"}',
          f'--gin.seqio_tasks.vocabulary_path.path={SHIPPED / "sentencepiece.model"}',
          f'--gin.MIXTURE_OR_TASK_NAME={",".join(_name(t) for t in tasks)}',
          f'--gin.EVAL_OUTPUT_DIR={out}', '--gin.TEMPERATURE=1.0',
          f'--gin.BATCH_SIZE={batch_size}', *extra]


def _eval_records(out: pathlib.Path, task: str) -> list[dict]:
  path = out / _name(task) / 'predictions.jsonl'
  return sorted((json.loads(line) for line in path.read_text().splitlines()),
                key=lambda r: r['index'])


# Its tests share one xdist worker: the evals run once (~2 min together), each test reads them.
@pytest.fixture(scope='module')
def evals(tmp_path_factory):
  """{run: output folder}: `t5align.eval` with BIAS_RULE='interpolate' on the 10 tasks with one
  batch per task (BATCH_SIZE 8) and with one example per batch (each padded to its own width),
  and with the default rule on the two tasks at 1024."""
  pytest.importorskip('seqio')
  root = tmp_path_factory.mktemp('bias_rule')
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv(zeroscrolls.ENV_DIR, str(RECORDS))
    mp.chdir(REPO_ROOT)
    for batch_size in (8, 1):
      conftest.run_eval(*_eval_args(root / f'interpolate_{batch_size}', zeroscrolls.TASKS,
                                    batch_size, '--gin.BIAS_RULE=interpolate'))
    conftest.run_eval(*_eval_args(root / 'none', AT_1024, 8))
  return {name: root / name for name in ('interpolate_8', 'interpolate_1', 'none')}


def test_golden_files_are_t5x_infers_output(monkeypatch):
  """One run per task: its file as t5x.infer names it, the id as the only input feature, and in
  its config.gin the interpolation rule at L_tr = 256, the test split and the task's longest input
  as the input length."""
  monkeypatch.setenv(zeroscrolls.ENV_DIR, str(RECORDS))
  assert sorted(p.name for p in FIXTURES.iterdir()) == sorted(['README.md', *zeroscrolls.TASKS])
  for task in zeroscrolls.TASKS:
    assert sorted(p.name for p in (FIXTURES / task).iterdir()) == sorted(
        ['config.gin', _t5x_file(task).name])
    text = (FIXTURES / task / 'config.gin').read_text().splitlines()
    for line in ("BIAS_RULE = 'interpolate'", 'TRAINING_LENGTH = 256', 'BIAS_SCALE = None',
                 "utils.DatasetConfig.split = 'test'", 'TEMPERATURE = 1.0',
                 f'MIXTURE_OR_TASK_NAME = {_name(task)!r}',
                 't5x_gin.task_feature_lengths.inputs = @t5x_gin.longest_inputs()'):
      assert line in text, (task, line)
    records = [json.loads(line) for line in _t5x_file(task).read_text().splitlines()]
    assert [sorted(r) for r in records] == [['inputs', 'prediction']] * len(records)
    assert [r['inputs']['id'] for r in records] == zeroscrolls.record_ids(task, 'test')
  assert sum(len(_t5x_predictions(t)) for t in zeroscrolls.TASKS) == 12


@pytest.mark.cli
@pytest.mark.tensorflow
@pytest.mark.xdist_group('t5x_bias_rule_evals')
def test_interpolate_predictions_are_t5x_infers(evals):
  """Each of the 12 predictions of `t5align.eval --gin.BIAS_RULE=interpolate` is t5x.infer's, at
  BATCH_SIZE 8 (one batch per task) and 1 (each example padded to its own width): the rule is
  resolved at the task's longest input, not at a batch's width."""
  for run in ('interpolate_8', 'interpolate_1'):
    for task in zeroscrolls.TASKS:
      got = [(r['id'], r['prediction']) for r in _eval_records(evals[run], task)]
      assert got == _t5x_predictions(task), (run, task)


@pytest.mark.cli
@pytest.mark.tensorflow
@pytest.mark.xdist_group('t5x_bias_rule_evals')
def test_the_default_rule_predicts_otherwise_at_1024(evals):
  """The rule matters at 1024 = 4 L_tr: with T5's bias as trained, every one of the 4
  predictions differs from t5x.infer's with the interpolation rule."""
  for task in AT_1024:
    golden = _t5x_predictions(task)
    records = _eval_records(evals['none'], task)
    assert [r['id'] for r in records] == [i for i, _ in golden]
    assert all(r['prediction'] != p for r, (_, p) in zip(records, golden)), task
