"""The settings objects gin builds for the jobs (jobs.Checkpoint, calibration.SearchSettings,
training.OptimizerConfig, train_data.Mix): built by the run files from the macros, the only
place each setting is (the jobs' flat fields of before were removed in 0.2.0).

And what a `jobs.Checkpoint` reads (t5align/jobs/common.py): its path resolved once and
everything read from there, though the CHECKPOINT_PATH link is re-pointed after the fingerprint or
before every array read; a folder replaced at that place while it is read refused
(CheckpointChangedError); a path holding a byte that is not UTF-8 named.
"""
from __future__ import annotations

import os
import pathlib
import shutil

import numpy as np
import pytest

import runs

from t5align import calibration
from t5align import checkpoints
from t5align.checkpoints import store
from t5align import gin_cli
from t5align import jobs
from t5align.jobs import common
from t5align import network
from t5align import run_identity
from t5align.shipped import train_data
from t5align import training

TINY = (pathlib.Path(__file__).resolve().parents[1] / 'testdata' / 't5x' / 't5_1_0_tiny' / 'legacy'
        / 'checkpoint_0')

_CALIBRATE = ['--gin_file=gin/calibrate.gin', '--gin.CHECKPOINT_PATH=/ckpt',
              '--gin.OUTPUT_PATH=/out/schedule.json', '--gin.TEXT_FILE=/corpus.txt',
              '--gin.VOCABULARY_PATH=/spm.model']


def test_the_run_file_builds_the_objects_from_its_macros(clean_gin):
  import t5align.calibrate  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  gin_cli.configure([*_CALIBRATE, '--gin.PARAMS_DTYPE=bfloat16', '--gin.BATCH_SIZE=2',
                     '--gin_bindings=calibration.SearchSettings.grid = (1.0, 0.9)'], prog='t')
  job = gin_cli.call_configured('t5align.jobs.CalibrationJob')
  assert job.checkpoint == jobs.Checkpoint('/ckpt', params_dtype='bfloat16')
  assert job.search == calibration.SearchSettings(grid=(1.0, 0.9), batch_size=2)


def test_an_old_field_binding_is_refused_by_gin(clean_gin):
  import t5align.calibrate  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  with pytest.raises(ValueError, match=r"CalibrationJob.* parameter named 'tol'"):
    gin_cli.configure([*_CALIBRATE, '--gin_bindings=jobs.CalibrationJob.tol = 0.01'], prog='t')


@pytest.mark.parametrize('keyword, value', [
    ('learning_rate', 0.5), ('warmup_steps', 3), ('weight_decay', 0.1), ('schedule', 'wsd'),
    ('length_power', 2.0), ('min_units', {'kv': 2}), ('initial_checkpoint_path', '/c')])
def test_old_python_keywords_are_refused(keyword, value):
  model = network.Transformer(network.T5Config(vocab_size=1024))
  with pytest.raises(TypeError, match=rf"unexpected keyword argument '{keyword}'"):
    jobs.TrainJob(model=model, model_dir='/m', **{keyword: value})


@pytest.mark.parametrize('field, value, expected', [
    ('optimizer', 'adafactor', r'training\.OptimizerConfig'),
    ('mix', {'kv': 1.0}, r'train_data\.Mix'),
    ('initial_checkpoint', '/c', r'jobs\.Checkpoint')])
def test_a_value_where_a_settings_object_goes_is_refused_by_name(field, value, expected):
  model = network.Transformer(network.T5Config(vocab_size=1024))
  with pytest.raises(ValueError, match=rf'^jobs\.TrainJob\.{field} = .*: expected a {expected}'
                                       r'.* \(in gin: '):
    jobs.TrainJob(model=model, model_dir='/m', **{field: value})


def test_num_steps_and_l_tr_are_the_jobs_alone():
  # Stored once: the optimizer's schedule spans NUM_STEPS, the mix's budget is L_TR, passed
  # where they are used.
  assert 'total_steps' not in {f.name for f in _fields(training.OptimizerConfig)}
  assert 'max_length' not in {f.name for f in _fields(train_data.Mix)}
  model = network.Transformer(network.T5Config(vocab_size=1024))
  job = jobs.TrainJob(model=model, model_dir='/m', num_steps=10,
                      optimizer=training.OptimizerConfig(warmup_steps=2, schedule='cosine'))
  lr = job.optimizer.learning_rate_schedule(job.num_steps)
  assert float(lr(2)) == pytest.approx(1e-3) and float(lr(10)) == pytest.approx(1e-4)


def _fields(cls):
  import dataclasses  # pylint: disable=g-import-not-at-top
  return dataclasses.fields(cls)


def test_a_path_where_the_checkpoint_object_goes_is_refused_by_name():
  with pytest.raises(ValueError, match=r"^jobs\.EvalJob\.checkpoint = '/ckpt': expected a "
                                       r'jobs\.Checkpoint or None \(unset\) \(in gin: checkpoint = '
                                       r'@jobs\.Checkpoint\(\), its path bound as '
                                       r'jobs\.Checkpoint\.path; in Python: '
                                       r'checkpoint=jobs\.Checkpoint\(path\)\)\.$'):
    jobs.EvalJob(checkpoint='/ckpt')


def test_a_checkpoint_path_that_is_not_a_path_is_refused_by_its_flag():
  with pytest.raises(ValueError, match=r'^jobs\.Checkpoint\.path = 5 \(--gin\.CHECKPOINT_PATH\): '
                                       r'expected a path \(a string\)\.$'):
    jobs.Checkpoint(5)
  with pytest.raises(ValueError, match=r'= \(1,\) \(--gin\.INITIAL_CHECKPOINT_PATH\)'):
    jobs.Checkpoint((1,), flag='INITIAL_CHECKPOINT_PATH')


# ------------------------------------------------------------------ what jobs.Checkpoint reads


def _flat(params) -> dict[str, np.ndarray]:
  return {k: np.asarray(v) for k, v in checkpoints.flatten_params(params).items()}


def test_link_repointed_after_the_fingerprint_is_read_from_the_resolved_place(tmp_path,
                                                                              monkeypatch):
  eight, twelve = runs.two_checkpoints(tmp_path, TINY)
  link = tmp_path / 'current'
  os.symlink(eight, link)
  want, other = _flat(checkpoints.read_params(eight)), _flat(checkpoints.read_params(twelve))
  fingerprint = run_identity.checkpoint_fingerprint

  def fingerprint_then_repoint(path, **kwargs):
    found = fingerprint(path, **kwargs)
    runs.point(link, twelve)  # Between the fingerprint and every later read.
    return found

  monkeypatch.setattr(run_identity, 'checkpoint_fingerprint', fingerprint_then_repoint)
  checkpoint = common.Checkpoint(str(link))
  assert checkpoint.fingerprint() == fingerprint(eight)
  assert os.readlink(link) == twelve
  assert checkpoint.resolved == os.path.realpath(eight)
  assert checkpoint.embedding_rows() == want['token_embedder/embedding'].shape[0]
  params, _ = checkpoint.load(None, None)
  got = _flat(params)
  assert got.keys() == want.keys()
  for name, array in want.items():
    np.testing.assert_array_equal(got[name], array, err_msg=name)
    assert not np.array_equal(got[name], other[name]) or not array.any(), name


def test_link_repointed_before_every_array_read_still_reads_one_checkpoint(tmp_path,
                                                                           monkeypatch):
  eight, twelve = runs.two_checkpoints(tmp_path, TINY)
  link = tmp_path / 'current'
  os.symlink(eight, link)
  want, other = _flat(checkpoints.read_params(eight)), _flat(checkpoints.read_params(twelve))
  result = store.ts_result
  reads = []

  def repoint_then_read(name, spec, future):  # Every array opened or read: the link flips.
    reads.append(name)
    runs.point(link, twelve if len(reads) % 2 else eight)
    return result(name, spec, future)

  monkeypatch.setattr(store, 'ts_result', repoint_then_read)
  # The hook works: a loader reopening the link's path mixes the two checkpoints.
  mixed = _flat(checkpoints.load_params(str(link))[0])
  assert {k for k in want if np.array_equal(mixed[k], want[k]) and want[k].any()}
  assert {k for k in want if np.array_equal(mixed[k], other[k]) and want[k].any()}
  runs.point(link, eight)
  reads.clear()
  got = _flat(common.Checkpoint(str(link)).load(None, None)[0])
  assert len(reads) >= len(want)
  for name, array in want.items():
    np.testing.assert_array_equal(got[name], array, err_msg=name)


def test_checkpoint_replaced_at_its_resolved_path_during_the_load_is_refused(tmp_path,
                                                                             monkeypatch):
  eight, twelve = runs.two_checkpoints(tmp_path, TINY)
  checkpoint = common.Checkpoint(eight)
  checkpoint.fingerprint()
  load = checkpoints.load_params

  def load_then_replace(*args, **kwargs):
    loaded = load(*args, **kwargs)
    os.rename(eight, eight + '.old')
    shutil.copytree(twelve, eight)  # Another folder at the same (resolved) path.
    return loaded

  monkeypatch.setattr(checkpoints, 'load_params', load_then_replace)
  with pytest.raises(common.CheckpointChangedError,
                     match=rf"CHECKPOINT_PATH '{eight}' \({eight}\) was replaced or changed "
                           r'while this run read it'):
    checkpoint.load(None, None)


def test_checkpoint_path_with_a_non_utf8_byte_is_named(tmp_path):
  path = os.fsdecode(os.fsencode(str(tmp_path)) + b'/checkpoint_\xff8')
  shutil.copytree(TINY, path)
  message = (rf'CHECKPOINT_PATH {repr(path)}'.replace('\\', '\\\\')
             + r" holds a byte that is not UTF-8 \(b'\\xff' at character \d+\); checkpoints "
               r'are read through tensorstore, which takes UTF-8 paths only\. Rename')
  checkpoint = common.Checkpoint(path)
  for call in (checkpoint.fingerprint, checkpoint.embedding_rows,
               lambda: checkpoint.load(None, None)):
    with pytest.raises(ValueError, match=message):
      call()
  with pytest.raises(ValueError, match=r'checkpoint path .* holds a byte that is not UTF-8'):
    checkpoints.load_params(path)
  link = tmp_path / 'plain'
  os.symlink(path, link)  # A UTF-8 link to it: the resolved path is named too.
  with pytest.raises(ValueError, match=rf"CHECKPOINT_PATH '{link}' resolves to .*, which "
                                       r'holds a byte that is not UTF-8'):
    common.Checkpoint(str(link)).fingerprint()
