"""The trainable seqio tasks (t5align.shipped.seqio_training): train and validation splits,
shuffling."""
from __future__ import annotations

import ast
import json
import pathlib
import re

import gin
import pytest

seqio = pytest.importorskip('seqio')

from t5align.shipped import assets  # pylint: disable=g-import-not-at-top,wrong-import-position
from t5align.shipped import seqio_training  # pylint: disable=g-import-not-at-top,wrong-import-position
from t5align.shipped import train_data  # pylint: disable=g-import-not-at-top,wrong-import-position
from t5align import t5x_gin  # pylint: disable=g-import-not-at-top,wrong-import-position
from t5align import vocabularies  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = pytest.mark.tensorflow

LENGTHS = {'inputs': 256, 'targets': 80}  # gin/t5x/finetune.gin's TASK_FEATURE_LENGTHS


@pytest.fixture(autouse=True)
def shipped_vocabulary(clean_gin):
  clean_gin.bind_parameter('seqio_tasks.vocabulary_path.path', t5x_gin.shipped_vocabulary())
  clean_gin.bind_parameter('seqio_tasks.training_options.validation_examples', 2)


def _take(name, split, n, **kw):
  task = seqio.get_mixture_or_task(name)
  ds = task.get_dataset(LENGTHS, split=split, num_epochs=1, **kw)
  return list(ds.take(n).as_numpy_iterator())


@pytest.mark.slow
def test_train_split_is_the_shipped_model_s_training_stream():
  task = seqio.get_mixture_or_task('t5align_train_retrieval')
  assert set(task.splits) == {'train', 'validation'}
  assert task.shuffle_buffer_size == seqio_training.SHUFFLE_BUFFER_SIZE
  examples = _take('t5align_train_retrieval', 'train', 4, shuffle=False, seed=None)
  # Unshuffled from seed None: examples 0..3 of train_data's stream (seed 0), same tokens.
  vocab = vocabularies.SentencePieceVocabulary(t5x_gin.shipped_vocabulary(), t5_ids=True)
  mix = train_data.Mix(seqio_training.MIXES['train_retrieval'], length_power=2.0,
                       min_units=seqio_training.MIN_UNITS)
  for i, ex in enumerate(examples):
    expected = train_data.train_example(vocab, mix, 0, i, max_length=256)
    assert ex['id'].decode() == f'train_retrieval/{i}'
    assert tuple(ex['inputs']) == expected.input_ids and len(ex['inputs']) <= 256
    assert tuple(ex['targets']) == expected.target_ids


def _recorded_macro(gin_config: str, name: str):
  """A macro's value in training.json's gin config (gin prints long values on later lines)."""
  found = re.search(rf'^{name} = (?:\\\n)?(.*?)\n(?=\S)', gin_config, re.M | re.S)
  return ast.literal_eval(found.group(1).strip())


def test_training_options_are_the_shipped_model_s_recipe():
  """MIXES['train_retrieval'], MIN_UNITS and the stream options are those training.json records
  for the shipped weights, so the seqio stream cannot drift from the model's recipe."""
  record = json.loads((pathlib.Path(assets.ASSET_DIR) / 'training.json').read_text())
  config = record['gin_config']
  opts = seqio_training.training_options()
  assert _recorded_macro(config, 'MIX') == seqio_training.MIXES['train_retrieval']
  assert _recorded_macro(config, 'MIN_UNITS') == seqio_training.MIN_UNITS == opts['min_units']
  assert (_recorded_macro(config, 'SEED'), _recorded_macro(config, 'L_TR'),
          _recorded_macro(config, 'LENGTH_POWER')) == (
              opts['seed'], opts['input_length'], opts['length_power'])
  assert record['input_length'] == opts['input_length']
  # gin/runs/train_retrieval.gin's defaults are that recipe too (training.json records the
  # command-line values the run used).
  root = pathlib.Path(__file__).resolve().parents[2]
  gin.clear_config()
  gin.add_config_file_search_path(str(root))
  gin.parse_config_files_and_bindings(
      [str(root / 'gin/runs/train_retrieval.gin'), str(root / 'gin/models/retrieval_small.gin')],
      ["MODEL_DIR = '/unused'"], finalize_config=False)
  for name in ('MIX', 'MIN_UNITS', 'SEED', 'L_TR', 'LENGTH_POWER', 'NUM_STEPS'):
    assert gin.query_parameter(f'{name}/macro.value') == _recorded_macro(config, name), name


def test_seeded_runs_start_elsewhere_in_the_stream():
  source = seqio.get_mixture_or_task('t5align_train_kv').source
  ids = lambda seed: [ex['id'] for ex in source.get_dataset(
      'train', shuffle=False, seed=seed).take(3).as_numpy_iterator()]
  assert ids(None) == [b'train_kv/0', b'train_kv/1', b'train_kv/2']
  assert ids(1) == ids(1) and set(ids(1)).isdisjoint(ids(2))


def test_validation_split_and_metric():
  examples = _take('t5align_train_passkey', 'validation', 10, shuffle=False)
  # 2 held-out examples per family member: passkey and passkey_decoys.
  assert [ex['id'].decode() for ex in examples] == [
      'train_passkey/passkey/0', 'train_passkey/passkey/1',
      'train_passkey/passkey_decoys/0', 'train_passkey/passkey_decoys/1']
  task = seqio.get_mixture_or_task('t5align_train_passkey')
  targets = [task.postprocess_fn(ex['targets_pretokenized'], example=ex, is_target=True)
             for ex in examples]
  right = [t['target'] for t in targets]
  assert seqio_training.accuracy(targets, right) == {'accuracy': 100.0}
  assert seqio_training.accuracy(targets, ['0'] * 3 + right[3:]) == {'accuracy': 25.0}
  with pytest.raises(ValueError, match="splits 'train' and 'validation'; got 'test'"):
    _take('t5align_train_passkey', 'test', 1, shuffle=False)
