"""`python -m t5align.leaderboard` on t5x.infer's output: the golden files of a real run.

tests/testdata/t5x_infer/infer_output/ is what `python -m t5x.infer` with gin/t5x/infer.gin wrote
for the shipped model at tau = 1 on the mixture t5align_zeroscrolls_512 (one file per task, its
`.COMPLETED` marker, t5x's config.gin), over invented ZeroSCROLLS test records
(tests/testdata/t5x_infer/zero_scrolls/; README.md there says how both were made). The expected
CSV, expected.csv, was written out from those files with the csv module alone, and read here as
ZeroSCROLLS' verifier reads a submission.
"""
from __future__ import annotations

import csv
import json
import os
import pathlib
import shutil
import types

import pytest

from seqio_tasks import zeroscrolls
from t5align import leaderboard

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / 'testdata' / 't5x_infer'
QASPER = 't5align_zeroscrolls_qasper_512-predict.jsonl-00000-of-00001'


@pytest.fixture
def infer_dir(tmp_path, monkeypatch) -> pathlib.Path:
  """A copy of the golden t5x.infer output folder, with the invented test records as the
  ZeroSCROLLS folder."""
  monkeypatch.setenv(zeroscrolls.ENV_DIR, str(FIXTURES / 'zero_scrolls'))
  return pathlib.Path(shutil.copytree(FIXTURES / 'infer_output', tmp_path / 'infer'))


def _read_like_the_verifier(path: pathlib.Path) -> dict[str, dict[str, str]]:
  """{task: {id: prediction}} of a CSV with columns exactly Task, ID, Prediction, each (task, id)
  once (verify_submission.py reads every field as a string)."""
  with open(path, newline='', encoding='utf-8') as f:
    rows = list(csv.reader(f))
  assert rows[0] == ['Task', 'ID', 'Prediction']
  out: dict[str, dict[str, str]] = {}
  for task, example_id, prediction in rows[1:]:
    assert example_id not in out.setdefault(task, {})
    out[task][example_id] = prediction
  return out


def test_golden_output_is_t5x_infers_format():
  """The golden files are as t5x.infer writes them with gin/t5x/infer.gin: a marker per file, the
  id as the only input feature, the test split in config.gin."""
  folder = FIXTURES / 'infer_output'
  files = sorted(p.name for p in folder.glob('*-of-00001'))
  assert files == sorted(f't5align_zeroscrolls_{t}_512-predict.jsonl-00000-of-00001'
                         for t in zeroscrolls.TASKS)
  assert all((folder / f'{name}.COMPLETED').is_file() for name in files)
  records = [json.loads(line) for line in (folder / QASPER).read_text().splitlines()]
  assert [sorted(r) for r in records] == [['inputs', 'prediction']] * 2
  assert [r['inputs'] for r in records] == [{'id': '5eed0a11'}, {'id': '5eed0b22'}]
  assert "utils.DatasetConfig.split = 'test'" in (folder / 'config.gin').read_text()


def test_t5x_infer_output_exports_to_the_expected_csv(infer_dir, tmp_path):
  output = tmp_path / 'out' / 'zero_scrolls_predictions.csv'
  got = leaderboard.export([str(infer_dir)], str(output))
  assert output.read_bytes() == (FIXTURES / 'expected.csv').read_bytes()
  assert _read_like_the_verifier(output) == got
  assert list(got) == list(zeroscrolls.TASKS)
  assert {t: list(p) for t, p in got.items()} == {
      t: zeroscrolls.record_ids(t, 'test') for t in zeroscrolls.TASKS}
  # The files named one by one: the same CSV.
  again = tmp_path / 'again.csv'
  leaderboard.export([str(p) for p in sorted(infer_dir.glob('*-of-00001'))], str(again))
  assert again.read_bytes() == output.read_bytes()


def test_an_id_twice_is_kept_once_and_two_predictions_for_it_are_refused(infer_dir, tmp_path):
  path = infer_dir / QASPER
  first = path.read_text().splitlines()[0]
  path.write_text(path.read_text() + first + '\n')
  leaderboard.export([str(infer_dir)], str(tmp_path / 'a.csv'))
  assert (tmp_path / 'a.csv').read_bytes() == (FIXTURES / 'expected.csv').read_bytes()
  other = json.loads(first)
  other['prediction'] = 'another answer'
  path.write_text(path.read_text() + json.dumps(other) + '\n')
  with pytest.raises(ValueError, match=rf"{QASPER}:4: id '5eed0a11' has two different "
                                       'predictions'):
    leaderboard.export([str(infer_dir)], str(tmp_path / 'b.csv'))
  assert not (tmp_path / 'b.csv').exists()


@pytest.mark.parametrize('line, message', [
    ('{"inputs": {"id": "5eed0b22"}, "prediction": "x"', 'not valid JSON'),
    # Written without gin/t5x/infer.gin: t5x keeps only the *_pretokenized features.
    ('{"inputs": {"targets_pretokenized": ""}, "prediction": "x"}',
     r'expected \{"inputs": \{"id": \.\.\.\}, "prediction": \.\.\.\}'),
    ('{"inputs": {"id": "5eed0b22"}, "score": -3.5}', 'expected {"inputs"'),
    ('{"inputs": {"id": "5eed0b22"}, "prediction": 7}', 'expected {"inputs"'),
    ('["5eed0b22", "x"]', 'expected {"inputs"'),
])
def test_a_malformed_line_names_the_file_and_line(infer_dir, tmp_path, line, message):
  path = infer_dir / QASPER
  kept = path.read_text().splitlines()[0]
  path.write_text(f'{kept}\n{line}\n')
  with pytest.raises(ValueError) as error:
    leaderboard.export([str(infer_dir)], str(tmp_path / 'x.csv'))
  assert str(error.value).startswith(f'{path}:2: ')
  assert error.match(message)


def test_what_the_run_must_show(infer_dir, tmp_path, capsys):
  """The split, the run's end and every shard; the task's predictions once."""
  output = str(tmp_path / 'x.csv')
  config = infer_dir / 'config.gin'
  text = config.read_text()
  config.write_text(text.replace("utils.DatasetConfig.split = 'test'",
                                 "utils.DatasetConfig.split = 'validation'"))
  with pytest.raises(ValueError, match=r"config.gin: t5x.infer predicted the split 'validation'; "
                                       "the leaderboard takes the 'test' split"):
    leaderboard.export([str(infer_dir)], output)
  config.unlink()
  # The first task read names the file (gov_report: the tasks are read in the README's order).
  with pytest.raises(ValueError, match=r'gov_report_512-predict.jsonl-00000-of-00001: no '
                                       'config.gin beside it'):
    leaderboard.export([str(infer_dir)], output)
  config.write_text(text)

  (infer_dir / f'{QASPER}.COMPLETED').unlink()
  with pytest.raises(ValueError, match=rf'{QASPER}: the run has not finished'):
    leaderboard.export([str(infer_dir)], output)
  got = leaderboard.export([str(infer_dir)], output, allow_incomplete=True)
  assert 'warning: ' in capsys.readouterr().err and len(got['qasper']) == 2

  # One shard of two: the other is missing.
  (infer_dir / QASPER).rename(infer_dir / QASPER.replace('00000-of-00001', '00001-of-00002'))
  with pytest.raises(ValueError, match=r'shard\(s\) \[0\] of 2 are missing'):
    leaderboard.export([str(infer_dir)], output, allow_incomplete=False)

  # The same task from t5x.infer and from a t5align.eval folder.
  eval_folder = tmp_path / 'eval' / 't5align_zeroscrolls_quality_512'
  eval_folder.mkdir(parents=True)
  with pytest.raises(ValueError, match='quality: several predictions of the same task and '
                                       'length'):
    leaderboard.export([str(infer_dir), str(tmp_path / 'eval')], output)
  with pytest.raises(ValueError, match='not a folder, nor a t5x.infer output file'):
    leaderboard.export([str(config)], output)


@pytest.mark.parametrize('written', [
    'utils.DatasetConfig.split = "test"',  # Double quotes: gin's string all the same.
    "utils.DatasetConfig:\n  split = 'test'",  # gin's block form.
    "SPLIT = 'test'\nutils.DatasetConfig.split = %SPLIT",  # Through a macro.
])
def test_config_gin_is_read_by_gins_parser(infer_dir, tmp_path, written):
  """A double-quoted split used to read as 'no split given'."""
  config = infer_dir / 'config.gin'
  config.write_text(config.read_text().replace("utils.DatasetConfig.split = 'test'", written))
  leaderboard.export([str(infer_dir)], str(tmp_path / 'x.csv'))
  assert (tmp_path / 'x.csv').read_bytes() == (FIXTURES / 'expected.csv').read_bytes()
  config.write_text(config.read_text() + "\nscoped/utils.DatasetConfig.split = 'validation'\n"
                    'utils.DatasetConfig.split = "validation"\n')  # The last unscoped one.
  with pytest.raises(ValueError, match="t5x.infer predicted the split 'validation'"):
    leaderboard.export([str(infer_dir)], str(tmp_path / 'x.csv'))
  config.write_text('utils.DatasetConfig.split = (\n')
  with pytest.raises(ValueError, match=r'config\.gin:\d+: not a gin file t5x\.infer wrote'):
    leaderboard.export([str(infer_dir)], str(tmp_path / 'x.csv'))


def test_an_unfinished_files_torn_last_line_is_dropped_under_allow_incomplete(
    infer_dir, tmp_path, capsys):
  """t5x.infer stopped mid-write leaves a torn last line and no .COMPLETED; --allow_incomplete
  used to refuse the file for it."""
  path = infer_dir / QASPER
  whole = path.read_text()
  path.write_text(whole + '{"inputs": {"id": "5eed0c33"}, "predic')
  (infer_dir / f'{QASPER}.COMPLETED').unlink()
  got = leaderboard.export([str(infer_dir)], str(tmp_path / 'x.csv'), allow_incomplete=True)
  assert list(got['qasper']) == ['5eed0a11', '5eed0b22']
  assert f'warning: {path}:3: a torn last line (38 bytes) dropped: the run was stopped while ' \
         'writing it.' in capsys.readouterr().err
  (infer_dir / f'{QASPER}.COMPLETED').write_text('')  # Finished, yet torn: cut or edited.
  with pytest.raises(ValueError, match=rf'{QASPER}:3: a torn last line \(38 bytes, no newline\) '
                                       'in the file of a finished run'):
    leaderboard.export([str(infer_dir)], str(tmp_path / 'y.csv'), allow_incomplete=True)


def test_a_file_of_an_unknown_task_is_refused_naming_it(infer_dir, tmp_path):
  """A misspelt task's file was ignored without a word."""
  odd = infer_dir / 't5align_zeroscrolls_quallity_512-predict.jsonl-00000-of-00001'
  shutil.copyfile(infer_dir / QASPER, odd)
  with pytest.raises(ValueError, match=rf'unknown task\(s\) quallity; the tasks are gov_report, '
                                       rf'.*; found as {odd}'):
    leaderboard.export([str(infer_dir)], str(tmp_path / 'x.csv'))
  assert not (tmp_path / 'x.csv').exists()


@pytest.mark.parametrize('kind', ['fifo', 'device'])
def test_a_predictions_file_that_is_no_regular_file_is_refused(infer_dir, tmp_path, kind):
  """A fifo hung the export; a link to /dev/zero read until the OOM killer came (19.6 GB)."""
  path = infer_dir / QASPER
  path.unlink()
  if kind == 'fifo':
    os.mkfifo(path)
  else:
    path.symlink_to('/dev/zero')
  with pytest.raises(ValueError, match=rf'predictions file {path} is a {kind}, not a regular '
                                       'file: give a file'):
    leaderboard.export([str(infer_dir)], str(tmp_path / 'x.csv'))


def test_a_mixed_submission(infer_dir, tmp_path):
  """t5x.infer files for some tasks, a t5align.eval folder for another: one CSV."""
  name = 't5align_zeroscrolls_quality_512'
  infer_file = infer_dir / f'{name}-predict.jsonl-00000-of-00001'
  (record,) = [json.loads(line) for line in infer_file.read_text().splitlines()]
  infer_file.unlink()
  folder = tmp_path / 'eval' / name
  folder.mkdir(parents=True)
  (folder / 'run.json').write_text(json.dumps({'task': name, 'split': 'test'}))
  (folder / 'predictions.jsonl').write_text(json.dumps(
      {'id': record['inputs']['id'], 'prediction': record['prediction']}) + '\n')
  (folder / 'metrics.json').write_text('{}')
  output = tmp_path / 'x.csv'
  leaderboard.export([str(infer_dir), str(tmp_path / 'eval')], str(output))
  assert output.read_bytes() == (FIXTURES / 'expected.csv').read_bytes()


@pytest.mark.cli
def test_command_on_t5x_infer_output(infer_dir, tmp_path, capsys):
  output = tmp_path / 'zero_scrolls_predictions.csv'
  assert leaderboard.main([str(infer_dir), '--output', str(output)]) == 0
  assert 'wrote' in capsys.readouterr().err
  assert output.read_bytes() == (FIXTURES / 'expected.csv').read_bytes()
  (infer_dir / QASPER).write_text('{"inputs": {}, "prediction": "x"}\n')
  with pytest.raises(SystemExit):
    leaderboard.main([str(infer_dir), '--output', str(output)])
  assert f'{infer_dir / QASPER}:1: expected' in capsys.readouterr().err


@pytest.mark.tensorflow
def test_infer_input_length_is_the_longest_of_the_split(monkeypatch):
  """gin/t5x/infer.gin's TASK_FEATURE_LENGTHS['inputs'] (t5x_gin.longest_inputs) for the golden
  run's tasks: the untruncated input's SentencePiece tokens + EOS, or L = 512 when cut."""
  sentencepiece = pytest.importorskip('sentencepiece')
  pytest.importorskip('seqio')
  from t5align import t5x_gin  # pylint: disable=g-import-not-at-top
  from t5align.shipped import assets  # pylint: disable=g-import-not-at-top
  vocabulary = t5x_gin.shipped_vocabulary(assets.ASSET_DIR)
  monkeypatch.setenv(zeroscrolls.ENV_DIR, str(FIXTURES / 'zero_scrolls'))
  monkeypatch.setenv('T5ALIGN_VOCABULARY', vocabulary)
  processor = sentencepiece.SentencePieceProcessor(model_file=vocabulary)
  (quality,) = [json.loads(line) for line in
                (FIXTURES / 'zero_scrolls' / 'quality' / 'test.jsonl').read_text().splitlines()]
  untruncated = len(processor.encode(quality['input'])) + 1
  assert untruncated < 512

  def longest(name: str, split: str = 'test') -> int:
    return t5x_gin.longest_inputs(types.SimpleNamespace(mixture_or_task_name=name, split=split))

  assert longest('t5align_zeroscrolls_quality_512') == untruncated
  assert longest('t5align_zeroscrolls_qasper_512') == 512  # 5eed0b22 is cut to L.
  assert longest('t5align_zeroscrolls_512') == 512
  with pytest.raises(FileNotFoundError, match='quality'):
    longest('t5align_zeroscrolls_quality_512', 'validation')
