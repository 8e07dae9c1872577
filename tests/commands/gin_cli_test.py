"""t5x-style flag parsing shared by the eval, calibrate and train entry points.

What the command line gets wrong is refused as it is parsed: a misspelt macro (with the close
match), a flag and a binding setting one value differently, a run file without its model file."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import gin
import pytest

from t5align import gin_cli
from t5align import jobs

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


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
  path.write_text('CHECKPOINT_PATH = %gin.REQUIRED\nOUTPUT = %gin.REQUIRED\nBATCH = 8\n'
                  'jobs.EvalJob.output_dir = %OUTPUT\n')  # A macro a flag sets is read.
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


# ------------------------------------------- the jobs' gin names and their required settings

# Each job's run files and the required macros they mark %gin.REQUIRED (written out: the macros
# the gin files' headers document under "Required to be set").
RUN_FILES = {
    'EvalJob': (['gin/runs/eval.gin', 'gin/models/tiny.gin'],
                ['CHECKPOINT_PATH', 'EVAL_OUTPUT_DIR', 'MIXTURE_OR_TASK_NAME']),
    'CalibrationJob': (['gin/calibrate.gin'], ['CHECKPOINT_PATH', 'OUTPUT_PATH']),
    'TrainJob': (['gin/runs/train_retrieval.gin', 'gin/models/tiny.gin'], ['MODEL_DIR']),
}


@pytest.mark.parametrize('job', sorted(RUN_FILES))
def test_a_job_built_without_its_required_settings_names_their_macros(job, clean_gin):
  """`check` names each required setting by the macro its run file defines (EvalJob's
  output_dir is EVAL_OUTPUT_DIR, not OUTPUT_DIR), and every such macro is one the run file
  marks %gin.REQUIRED; the command line, given none of them, names the same macros."""
  cls = getattr(jobs, job)
  files, required = RUN_FILES[job]
  with pytest.raises(ValueError) as error:
    cls().check()
  message = str(error.value)
  for field, macro in cls.REQUIRED.items():
    if macro is None:  # The model: bound by the run file, configured by a gin/models file.
      assert f'jobs.{job}.{field} is required: the run file binds it' in message
    else:
      assert f'{macro} (jobs.{job}.{field}) is required: pass --gin.{macro}=VALUE' in message
  assert sorted(m for m in cls.REQUIRED.values() if m) == required
  with pytest.raises(ValueError) as error:
    gin_cli.configure([f'--gin_file={f}' for f in files], prog='t')
  for macro in required:  # The checkpoint's path is jobs.Checkpoint's, which the job holds.
    owner = 'Checkpoint' if macro == 'CHECKPOINT_PATH' else job
    assert f'{macro} (jobs.{owner}.' in str(error.value)
    assert f'is required: pass --gin.{macro}=VALUE' in str(error.value)
  clean_gin.clear_config()
  gin_cli.configure([f'--gin_file={f}' for f in files], prog='t', unset_required=True)
  assert all(clean_gin.query_parameter(f'{m}/macro.value') is None for m in required)


def test_finetune_names_every_macro_it_requires(clean_gin):
  with pytest.raises(ValueError) as error:
    gin_cli.configure(['--gin_file=gin/runs/finetune.gin', '--gin_file=gin/models/tiny.gin',
                       '--gin.MODEL_DIR=/m'], prog='t')
  expected = {'INITIAL_CHECKPOINT_PATH': 'Checkpoint.path', 'L_TR': 'TrainJob.input_length',
              'MIXTURE_OR_TASK_NAME': 'TrainJob.mixture_or_task_name',
              'NUM_STEPS': 'TrainJob.num_steps', 'TARGET_LENGTH': 'TrainJob.target_length'}
  assert str(error.value) == '; '.join(
      f'{m} (jobs.{f}) is required: pass --gin.{m}=VALUE'
      for m, f in sorted(expected.items())) + '.'


_EVAL = ['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/tiny.gin',
         '--gin.CHECKPOINT_PATH=/c', '--gin.MIXTURE_OR_TASK_NAME=t', '--gin.EVAL_OUTPUT_DIR=/e']


def test_jobs_are_bound_under_their_own_names(clean_gin):
  import warnings  # pylint: disable=g-import-not-at-top
  with warnings.catch_warnings():
    warnings.simplefilter('error')  # The run files use no old name.
    gin_cli.configure([*_EVAL, '--gin_bindings=jobs.EvalJob.temperature = 0.9'], prog='t')
  job = gin_cli.call_configured('t5align.jobs.EvalJob')
  assert type(job).__name__ == 'EvalJob' and job.temperature == 0.9 and job.output_dir == '/e'
  assert clean_gin.query_parameter('t5align.jobs.EvalJob.temperature') == 0.9
  with clean_gin.unlock_config(), pytest.raises(ValueError, match=r"no_such"):
    clean_gin.parse_config('jobs.EvalJob.no_such = 1')


@pytest.mark.parametrize('binding', ['t5align_eval.evaluate.temperature = 0.9',
                                     'calibrate.run.seed = 7', 'train.train.seed = 7'])
def test_the_jobs_old_gin_names_are_gone(binding, clean_gin):
  """Removed in 0.2.0 (CHANGELOG): the selectors the jobs had before their own names bind
  nothing; gin names the one it cannot find."""
  with pytest.raises(ValueError, match=re.escape(binding.split('.')[-2].split(' ')[0])):
    gin_cli.configure([*_EVAL, f'--gin_bindings={binding}'], prog='t')


@pytest.mark.parametrize('module, name', [('t5align.eval', 'evaluate'),
                                          ('t5align.calibrate', 'run'), ('t5align.train', 'train')])
def test_the_commands_old_python_names_are_gone(module, name):
  import importlib  # pylint: disable=g-import-not-at-top
  assert not hasattr(importlib.import_module(module), name)


# ------------------------------------------- a misspelt macro, a value set twice, a missing file


def test_misspelt_macro_is_refused_with_the_close_match(tmp_path, clean_gin):
  config = tmp_path / 'run.gin'
  config.write_text('SCHEDULE_PATH = None\nSCHEDULE_STRATEGY = None\nBATCH_SIZE = 8\n'
                    'jobs.EvalJob.schedule_path = %SCHEDULE_PATH\n'
                    'jobs.EvalJob.batch_size = %BATCH_SIZE\n')
  with pytest.raises(ValueError, match=r'--gin.SCHEDULE_PAHT: no macro SCHEDULE_PAHT in .*'
                                       r'run.gin.*Did you mean SCHEDULE_PATH'):
    gin_cli.configure([f'--gin_file={config}', '--gin.SCHEDULE_PAHT=x.json'], prog='t')
  clean_gin.clear_config()
  # A new macro is fine where another binding reads it.
  gin_cli.configure([f'--gin_file={config}', '--gin.SCHEDULE_PATH=x.json',
                     '--gin_bindings=NEW = 4', '--gin_bindings=BATCH_SIZE = %NEW'], prog='t')
  assert clean_gin.query_parameter('%SCHEDULE_PATH') == 'x.json'


def test_a_flag_and_a_binding_that_set_one_value_differently_are_refused(clean_gin):
  base = ['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/retrieval_small.gin']
  with pytest.raises(ValueError, match=r"--gin_bindings='jobs.EvalJob.temperature = "
                                       r"0\.7' and --gin\.TEMPERATURE=0\.5 set TEMPERATURE "
                                       r'differently \(t5align\.jobs\.EvalJob\.temperature is '
                                       r'bound to %TEMPERATURE in the gin files\)'):
    gin_cli.configure([*base, '--gin.TEMPERATURE=0.5',
                       '--gin_bindings=jobs.EvalJob.temperature = 0.7'], prog='t')
  gin.clear_config()
  with pytest.raises(ValueError, match=r"--gin_bindings='TEMPERATURE = 0\.6' and "
                                       r'--gin\.TEMPERATURE=0\.5 set TEMPERATURE differently;'):
    gin_cli.configure([*base, '--gin.TEMPERATURE=0.5', '--gin_bindings=TEMPERATURE = 0.6'],
                      prog='t')
  gin.clear_config()
  # The same value twice is no conflict.
  gin_cli.configure([*base, '--gin.TEMPERATURE=0.7', '--gin.CHECKPOINT_PATH=c',
                     '--gin.EVAL_OUTPUT_DIR=o', '--gin.MIXTURE_OR_TASK_NAME=t',
                     '--gin_bindings=jobs.EvalJob.temperature = 0.7'], prog='t')
  assert gin.query_parameter('%TEMPERATURE') == 0.7


def test_a_flag_that_a_later_gin_file_cut_off_is_refused_naming_both(clean_gin, tmp_path):
  """A user's gin file that binds the setting itself (`jobs.Checkpoint.path = 'B'`, as old
  configs do) would win over --gin.CHECKPOINT_PATH=A: the run read B, exit 0."""
  over = tmp_path / 'over.gin'
  over.write_text("jobs.Checkpoint.path = '/ckpt/B'\n")
  base = ['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/retrieval_small.gin',
          '--gin.EVAL_OUTPUT_DIR=o', '--gin.MIXTURE_OR_TASK_NAME=t']
  with pytest.raises(ValueError, match=re.escape(
      f"--gin.CHECKPOINT_PATH does not reach t5align.jobs.Checkpoint.path: {over} binds it to "
      "'/ckpt/B', replacing %CHECKPOINT_PATH from gin/runs/eval.gin, so gin would apply "
      "'/ckpt/B' and ignore the flag. Give the value once: the flag, or the binding.")):
    gin_cli.configure([*base, f'--gin_file={over}', '--gin.CHECKPOINT_PATH=/ckpt/A'], prog='t')
  gin.clear_config()
  # Without the flag the file's binding is the one value given: it runs.
  gin_cli.configure([*base, f'--gin_file={over}'], prog='t', unset_required=True)
  assert gin.query_parameter('t5align.jobs.Checkpoint.path') == '/ckpt/B'


def test_a_flag_no_binding_reads_is_refused(clean_gin, tmp_path):
  """A macro defined but read by nothing (a file rebinding, inside one parse, every parameter
  that read it) would be ignored."""
  alone = tmp_path / 'alone.gin'
  alone.write_text("include 'gin/runs/eval.gin'\njobs.EvalJob.temperature = 0.9\n")
  with pytest.raises(ValueError, match=re.escape(
      f'--gin.TEMPERATURE: {alone}, gin/models/retrieval_small.gin define TEMPERATURE, but no '
      'binding reads %TEMPERATURE, so the value would be ignored. Bind the setting itself '
      'instead.')):
    gin_cli.configure([f'--gin_file={alone}', '--gin_file=gin/models/retrieval_small.gin',
                       '--gin.TEMPERATURE=0.5'], prog='t', unset_required=True)


def test_eval_without_a_model_file_names_what_is_missing(clean_gin):
  with pytest.raises(ValueError, match=r'@network\.Transformer\(\) \(called by t5align\.jobs'
                                       r'\.EvalJob\.model\) needs t5align\.network\.Transformer'
                                       r'\.config, which no gin file or flag binds\. Give the '
                                       r'gin files the run needs: gin/runs/eval\.gin plus a '
                                       r'gin/models file\.'):
    gin_cli.configure(['--gin_file=gin/runs/eval.gin'], prog='t',
                      example_file='gin/runs/eval.gin plus a gin/models file')


# ---------------------------------------------------------------- a run stopped by a signal

_STOPPED_RUN = '''
import os, signal, sys, time
from t5align import gin_cli

class Job:
  def run(self):
    try:
      {stop}
      time.sleep(30)
    finally:
      open(sys.argv[1], 'w').write('closed')  # What the run holds is closed first.

  def resume_note(self):
    return 'The examples recorded so far are kept in DIR; rerun the same command.'

gin_cli.run_job(Job(), 'python -m t5align.eval')
'''


@pytest.mark.parametrize('stop, code, name', [
    ('os.kill(os.getpid(), signal.SIGTERM)', 143, 'SIGTERM'),
    ('raise KeyboardInterrupt', 130, 'SIGINT (Ctrl-C)'),
])
def test_a_run_stopped_by_a_signal_says_what_is_kept(tmp_path, stop, code, name):
  """SIGTERM used to end eval and calibrate with exit 143 and no word (the resume worked)."""
  closed = tmp_path / 'closed'
  done = subprocess.run([sys.executable, '-c', _STOPPED_RUN.format(stop=stop), str(closed)],
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
  assert done.returncode == code, done.stderr
  assert done.stderr.endswith(f'python -m t5align.eval: stopped by {name}. The examples recorded '
                              'so far are kept in DIR; rerun the same command.\n'), done.stderr
  assert 'Traceback' not in done.stderr
  assert closed.read_text() == 'closed'


def test_each_job_says_what_a_stopped_run_keeps():
  assert jobs.EvalJob(output_dir='/out').resume_note() == (
      'The examples recorded so far are kept in /out (predictions.jsonl per task); rerun the '
      'same command to finish from them.')
  assert jobs.CalibrationJob(output_path='/s/schedule.json').resume_note().startswith(
      'The calibrations finished so far are kept in /s/schedule.json.')
  assert jobs.TrainJob(model_dir='/m', checkpoint_every=50).resume_note() == (
      'The checkpoints written so far (every 50 steps, CHECKPOINT_EVERY) are kept in /m; rerun '
      'the same command to continue from the last.')
