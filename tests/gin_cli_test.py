"""t5x-style flag parsing shared by the eval, calibrate and train entry points."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from t5align import gin_cli

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_binding_quotes_only_non_literals():
  assert gin_cli.binding('TEMPERATURE', '0.8') == 'TEMPERATURE = 0.8'
  assert gin_cli.binding('CHECKPOINT_PATH', '/a/b') == "CHECKPOINT_PATH = '/a/b'"
  assert gin_cli.binding('NAME', "'x'") == "NAME = 'x'"
  assert gin_cli.binding('NAME', 'None') == 'NAME = None'
  assert gin_cli.binding('TAUS', '(0.9, 0.8)') == 'TAUS = (0.9, 0.8)'


def test_parse_flags():
  files, bindings, paths = gin_cli.parse_flags(
      ['--gin.A=1', '--gin_search_paths=a,b', '--gin_file=x.gin', '--gin_file', 'y.gin',
       '--gin_bindings=B = 2', '--gin.C=/some/path'], prog='t')
  assert files == ['x.gin', 'y.gin']
  assert bindings == ['B = 2', 'A = 1', "C = '/some/path'"]
  assert paths == ['a', 'b', os.getcwd(), gin_cli.REPO_ROOT]


@pytest.mark.parametrize('argv, message', [
    (['--lengths=3', '--gin_file=x.gin'], "unrecognized argument '--lengths=3'"),
    (['schedule.json', '--gin_file=x.gin'], "unrecognized argument 'schedule.json'"),
    (['--gin.A'], "unrecognized argument '--gin.A'"),
    ([], 'at least one --gin_file is needed'),
])
def test_parse_flags_errors(argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    gin_cli.parse_flags(argv, prog='t', example_file='gin/runs/eval.gin')
  assert e.value.code == 2
  assert message in capsys.readouterr().err


@pytest.fixture
def clean_gin(clean_gin, monkeypatch):
  """conftest's clean gin config, with the repository root as the working directory (the gin
  files' paths are relative to it)."""
  monkeypatch.chdir(gin_cli.REPO_ROOT)
  return clean_gin


def test_a_later_gin_file_changing_a_macro_warns(clean_gin):
  # gin/calibrate.gin sets ATTENTION_IMPL = 'blockwise'; a model file after it sets its own.
  # The user touched neither: the change is announced, naming both files and values.
  argv = ['--gin_file=gin/calibrate.gin', '--gin_file=gin/models/retrieval_small.gin',
          '--gin.CHECKPOINT_PATH=/c', '--gin.OUTPUT_PATH=/o.json']
  with pytest.warns(UserWarning) as record:
    gin_cli.configure(argv, prog='t')
  messages = sorted(str(w.message) for w in record)
  assert messages == [
      "gin/models/retrieval_small.gin sets ACTIVATION_DTYPE = 'float32', replacing 'bfloat16' "
      'from gin/calibrate.gin (the later --gin_file wins). Pass --gin.ACTIVATION_DTYPE=... to '
      'choose it.',
      "gin/models/retrieval_small.gin sets ATTENTION_IMPL = 'auto', replacing 'blockwise' from "
      'gin/calibrate.gin (the later --gin_file wins). Pass --gin.ATTENTION_IMPL=... to choose it.']
  assert clean_gin.query_parameter('ATTENTION_IMPL/macro.value') == 'auto'
  # A macro the flags set is the user's choice: nothing to warn about; the flag's value holds.
  clean_gin.clear_config()
  import warnings  # pylint: disable=g-import-not-at-top
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    gin_cli.configure([*argv, "--gin.ATTENTION_IMPL='blockwise'",
                       "--gin.ACTIVATION_DTYPE='float32'"], prog='t')
  assert clean_gin.query_parameter('ATTENTION_IMPL/macro.value') == 'blockwise'
  # An include inside one file (t5_1_1/xl.gin over t5_1_1/base.gin) is that file's own setting.
  clean_gin.clear_config()
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    gin_cli.configure(['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/flan_t5/xl.gin',
                       '--gin.CHECKPOINT_PATH=/c', '--gin.MIXTURE_OR_TASK_NAME=t',
                       '--gin.EVAL_OUTPUT_DIR=/e'], prog='t')


def test_unset_required_binds_required_macros_to_none(tmp_path, clean_gin):
  """What t5align.preflight reads: macros a file marks %gin.REQUIRED become None unless a flag
  sets them; without `unset_required` gin refuses them, as before."""
  path = tmp_path / 'run.gin'
  path.write_text('CHECKPOINT_PATH = %gin.REQUIRED\nOUTPUT = %gin.REQUIRED\nBATCH = 8\n')
  gin_cli.configure([f'--gin_file={path}', '--gin.OUTPUT=/tmp/x'], prog='t',
                    unset_required=True)
  assert clean_gin.query_parameter('CHECKPOINT_PATH/macro.value') is None
  assert clean_gin.query_parameter('OUTPUT/macro.value') == '/tmp/x'
  assert clean_gin.query_parameter('BATCH/macro.value') == 8
  clean_gin.clear_config()
  with pytest.raises(ValueError, match='CHECKPOINT_PATH'):
    gin_cli.configure([f'--gin_file={path}', '--gin.OUTPUT=/tmp/x'], prog='t')


def test_command_lines_show_library_log_records_as_bare_lines(tmp_path):
  """The library logs (absl); a command line (`log_plainly`) shows the records as the messages
  alone, as it printed them before, and no other library's INFO records; a library user gets
  absl's default form."""
  torn = tmp_path / 'records.jsonl'
  code = ('import sys\nfrom absl import logging\nfrom t5align import gin_cli\n'
          'from t5align.runtime import outputs\n'
          'if sys.argv[2] == "cli":\n  gin_cli.log_plainly()\n'
          'logging.info("another library\'s INFO record")\noutputs.repair_jsonl(sys.argv[1])\n')
  line = f'{torn}: dropped a torn last line (4 bytes, an interrupted write).\n'
  for mode, expected in (('cli', line), ('library', 'WARNING:absl:' + line)):
    torn.write_bytes(b'{"a": 1}\n{"b"')
    done = subprocess.run([sys.executable, '-c', code, str(torn), mode], capture_output=True,
                          text=True, check=True, cwd=REPO_ROOT)
    assert done.stderr == expected
    assert torn.read_bytes() == b'{"a": 1}\n'
