"""gin/t5x/*.gin without t5x: parsed against a stub of the t5x configurables they use.

t5x is not installable from the package index, so this test registers a fake `t5x` package whose
configurables carry t5x's names and the signatures of the parameters these files bind
(t5x/models.py, decoding.py, utils.py, ...), and writes stand-ins for the three t5x gin files
they include (configs/runs/eval.gin, configs/runs/finetune.gin, examples/t5/t5_1_1/base.gin)
with the macros and bindings of the real ones that matter here. What it checks is t5align's
side: greedy decoding for the task's length, one vocabulary for model and tasks, the shipped
model's files, the TEMPERATURE/schedule refusal, and fine-tuning with a temperature. The same
files with t5x itself: the commands in their headers.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import sys
import types
from typing import Any

import gin
import numpy as np
import pytest

if importlib.util.find_spec('t5x') is not None:
  pytest.skip('t5x is installed: these stubs would shadow it.', allow_module_level=True)
pytest.importorskip('seqio')

import seqio  # pylint: disable=g-import-not-at-top,wrong-import-position
import seqio_tasks  # pylint: disable=g-import-not-at-top,wrong-import-position
import t5align  # pylint: disable=g-import-not-at-top,wrong-import-position
from t5align import network  # pylint: disable=g-import-not-at-top,wrong-import-position
from t5align import scheduled  # pylint: disable=g-import-not-at-top,wrong-import-position
from t5align import t5x_gin  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = pytest.mark.tensorflow

T5X_FILES = sorted(p.name for p in (pathlib.Path(t5align.gin_dir()) / 'gin' / 't5x').glob('*.gin'))
# Add-ons and shared parts, included by or added to the per-model files.
PARTS = ('eval.gin', 'finetune.gin', 'schedule.gin', 'vocabulary.gin', 'shared.gin', 'infer.gin')
T5_VOCAB = 'gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model'


# -------------------------------------------------------------- the stub t5x (signatures as t5x's)


class EncoderDecoderModel:

  def __init__(self, module, input_vocabulary, output_vocabulary, optimizer_def, decode_fn=None,
               feature_converter_cls=None, label_smoothing=0.0, z_loss=0.0,
               loss_normalizing_factor=None):
    self.module, self.input_vocabulary, self.decode_fn = module, input_vocabulary, decode_fn
    self.output_vocabulary, self.optimizer_def = output_vocabulary, optimizer_def


def beam_search(inputs, cache, tokens_to_logits, eos_id, num_decodes=4, alpha=0.6):
  return {'fn': 'beam_search', 'alpha': alpha}


def temperature_sample(inputs, cache, tokens_to_logits, eos_id, decode_rng=None, num_decodes=1,
                       temperature=1.0, topk=1, topp=0.0, cache_offset=0, initial_index=None,
                       max_decode_steps=None):
  return {'fn': 'temperature_sample', 'temperature': temperature, 'topk': topk}


class Adafactor:

  def __init__(self, learning_rate=None, factored=True, multiply_by_parameter_scale=True,
               beta1=None, decay_rate=0.8, step_offset=0, min_dim_size_to_factor=128,
               logical_factor_rules=None):
    pass


def standard_logical_factor_rules():
  return {}


@dataclasses.dataclass
class DatasetConfig:
  mixture_or_task_name: Any
  task_feature_lengths: Any
  split: str
  batch_size: int
  shuffle: bool
  seed: Any
  use_cached: bool = False
  pack: bool = False
  use_custom_packing_ops: bool = False
  module: Any = None


@dataclasses.dataclass
class RestoreCheckpointConfig:
  path: Any
  mode: str = 'latest'
  dtype: str = 'float32'


@dataclasses.dataclass
class SaveCheckpointConfig:
  period: Any = None
  dtype: str = 'float32'
  keep: Any = None
  save_dataset: bool = False


@dataclasses.dataclass
class CheckpointConfig:
  save: Any = None
  restore: Any = None


class PjitPartitioner:

  def __init__(self, num_partitions=None, model_parallel_submesh=None, logical_axis_rules=None):
    pass


def standard_logical_axis_rules():
  return ()


class T5Config:  # t5x.examples.t5.network's; its values are unused once t5align's network is in.

  def __init__(self, vocab_size, dtype='float32', emb_dim=512, num_heads=8, num_encoder_layers=6,
               num_decoder_layers=6, head_dim=64, mlp_dim=2048, mlp_activations=('relu',),
               dropout_rate=0.1, logits_via_embedding=False, float32_attention_logits=False):
    pass


class T5xTransformer:

  def __init__(self, config):
    pass


def evaluate(*, model, dataset_cfg, restore_checkpoint_cfg, partitioner, output_dir):
  return dict(model=model, dataset_cfg=dataset_cfg, restore_checkpoint_cfg=restore_checkpoint_cfg)


def train(*, model, model_dir, train_dataset_cfg, train_eval_dataset_cfg, infer_eval_dataset_cfg,
          checkpoint_cfg, partitioner, total_steps):
  return dict(model=model, model_dir=model_dir, train_dataset_cfg=train_dataset_cfg,
              train_eval_dataset_cfg=train_eval_dataset_cfg,
              infer_eval_dataset_cfg=infer_eval_dataset_cfg, checkpoint_cfg=checkpoint_cfg,
              total_steps=total_steps)


def _module(name: str, **attrs) -> types.ModuleType:
  module = types.ModuleType(name)
  for key, value in attrs.items():
    if isinstance(value, type) or callable(value):
      value.__module__ = name
    setattr(module, key, value)
  return module


T5X_NETWORK = type('Transformer', (T5xTransformer,), {})
STUB_MODULES = {
    't5x': _module('t5x'),
    't5x.models': _module('t5x.models', EncoderDecoderModel=EncoderDecoderModel),
    't5x.decoding': _module('t5x.decoding', beam_search=beam_search,
                            temperature_sample=temperature_sample),
    't5x.adafactor': _module('t5x.adafactor', Adafactor=Adafactor,
                             standard_logical_factor_rules=standard_logical_factor_rules),
    't5x.utils': _module('t5x.utils', DatasetConfig=DatasetConfig,
                         RestoreCheckpointConfig=RestoreCheckpointConfig,
                         SaveCheckpointConfig=SaveCheckpointConfig,
                         CheckpointConfig=CheckpointConfig),
    't5x.partitioning': _module('t5x.partitioning', PjitPartitioner=PjitPartitioner,
                                standard_logical_axis_rules=standard_logical_axis_rules),
    't5x.examples': _module('t5x.examples'),
    't5x.examples.t5': _module('t5x.examples.t5'),
    't5x.examples.t5.network': _module('t5x.examples.t5.network', T5Config=T5Config,
                                       Transformer=T5X_NETWORK),
    # The binary run as `python -m t5x.eval` / `t5x.train` (t5x's run gins import __main__).
    '__main__': _module('__main__', evaluate=evaluate, train=train),
}
for _name, _mod in STUB_MODULES.items():
  if '.' in _name:
    parent, child = _name.rsplit('.', 1)
    setattr(STUB_MODULES[parent], child, _mod)

# Stand-ins for t5x's gin files, reduced to what the gin/t5x files rely on.
STUB_GIN = {
    't5x/examples/t5/t5_1_1/base.gin': '''
from __gin__ import dynamic_registration
import seqio
from t5x import adafactor
from t5x import models
from t5x.examples.t5 import network
DROPOUT_RATE = %gin.REQUIRED
VOCABULARY = @seqio.SentencePieceVocabulary()
seqio.SentencePieceVocabulary.sentencepiece_model_file = "T5_VOCAB"
OPTIMIZER = @adafactor.Adafactor()
adafactor.Adafactor.logical_factor_rules = @adafactor.standard_logical_factor_rules()
MODEL = @models.EncoderDecoderModel()
models.EncoderDecoderModel:
  module = @network.Transformer()
  input_vocabulary = %VOCABULARY
  output_vocabulary = %VOCABULARY
  optimizer_def = %OPTIMIZER
network.Transformer.config = @network.T5Config()
network.T5Config:
  vocab_size = 32128
  dropout_rate = %DROPOUT_RATE
'''.replace('T5_VOCAB', T5_VOCAB),
    't5x/configs/runs/eval.gin': '''
from __gin__ import dynamic_registration
import __main__ as eval_script
from t5x import partitioning
from t5x import utils
MIXTURE_OR_TASK_NAME = %gin.REQUIRED
CHECKPOINT_PATH = %gin.REQUIRED
EVAL_OUTPUT_DIR = %gin.REQUIRED
TASK_FEATURE_LENGTHS = None
eval_script.evaluate:
  model = %MODEL
  dataset_cfg = @utils.DatasetConfig()
  partitioner = @partitioning.PjitPartitioner()
  restore_checkpoint_cfg = @utils.RestoreCheckpointConfig()
  output_dir = %EVAL_OUTPUT_DIR
utils.DatasetConfig:
  mixture_or_task_name = %MIXTURE_OR_TASK_NAME
  task_feature_lengths = %TASK_FEATURE_LENGTHS
  split = 'test'
  batch_size = 32
  shuffle = False
  seed = 42
utils.RestoreCheckpointConfig:
  path = %CHECKPOINT_PATH
  mode = 'specific'
''',
    't5x/configs/runs/finetune.gin': '''
from __gin__ import dynamic_registration
import __main__ as train_script
from t5x import partitioning
from t5x import utils
MODEL_DIR = %gin.REQUIRED
MIXTURE_OR_TASK_NAME = %gin.REQUIRED
TASK_FEATURE_LENGTHS = %gin.REQUIRED
TRAIN_STEPS = %gin.REQUIRED
INITIAL_CHECKPOINT_PATH = %gin.REQUIRED
DROPOUT_RATE = 0.1
USE_CACHED_TASKS = True
BATCH_SIZE = 128
train_script.train:
  model = %MODEL
  model_dir = %MODEL_DIR
  train_dataset_cfg = @train/utils.DatasetConfig()
  train_eval_dataset_cfg = @train_eval/utils.DatasetConfig()
  infer_eval_dataset_cfg = @infer_eval/utils.DatasetConfig()
  checkpoint_cfg = @utils.CheckpointConfig()
  partitioner = @partitioning.PjitPartitioner()
  total_steps = %TRAIN_STEPS
train/utils.DatasetConfig:
  mixture_or_task_name = %MIXTURE_OR_TASK_NAME
  task_feature_lengths = %TASK_FEATURE_LENGTHS
  split = 'train'
  batch_size = %BATCH_SIZE
  shuffle = True
  seed = None
  use_cached = %USE_CACHED_TASKS
  pack = True
train_eval/utils.DatasetConfig:
  mixture_or_task_name = %MIXTURE_OR_TASK_NAME
  task_feature_lengths = %TASK_FEATURE_LENGTHS
  split = 'validation'
  batch_size = %BATCH_SIZE
  shuffle = False
  seed = 42
infer_eval/utils.DatasetConfig:
  mixture_or_task_name = %MIXTURE_OR_TASK_NAME
  task_feature_lengths = None
  split = 'validation'
  batch_size = %BATCH_SIZE
  shuffle = False
  seed = 42
utils.CheckpointConfig:
  restore = @utils.RestoreCheckpointConfig()
  save = @utils.SaveCheckpointConfig()
utils.RestoreCheckpointConfig:
  path = %INITIAL_CHECKPOINT_PATH
  mode = 'specific'
utils.SaveCheckpointConfig.period = 5000
''',
}


@pytest.fixture(autouse=True)
def stub_t5x(monkeypatch, tmp_path, clean_gin):  # pylint: disable=unused-argument
  """The fake t5x modules, the stand-in t5x gin files (a search path), a clean gin config."""
  for name, module in STUB_MODULES.items():
    monkeypatch.setitem(sys.modules, name, module)
  for rel, text in STUB_GIN.items():
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text(text)
  # pylint: disable=protected-access
  registered = set(gin.config._REGISTRY._selector_map)
  inverse = set(gin.config._INVERSE_REGISTRY)
  for path in (t5align.gin_dir(), str(tmp_path)):
    gin.add_config_file_search_path(path)
  monkeypatch.chdir(tmp_path)
  yield
  gin.config._LOCATION_PREFIXES.remove(str(tmp_path))
  # Forget the configurables the files registered dynamically (the stub t5x's among them), or
  # later tests would find e.g. `network.T5Config` ambiguous.
  for selector in set(gin.config._REGISTRY._selector_map) - registered:
    gin.config._REGISTRY.pop(selector)
  for fn in set(gin.config._INVERSE_REGISTRY) - inverse:
    del gin.config._INVERSE_REGISTRY[fn]
  # pylint: enable=protected-access


def _run(files, bindings=(), entry=evaluate):
  gin.parse_config_files_and_bindings([f'gin/t5x/{f}' for f in files], list(bindings),
                                      finalize_config=False)
  return gin.get_configurable(entry)()


def _eval(files=('retrieval_t5.gin',), *bindings):
  return _run(files, ("MIXTURE_OR_TASK_NAME = 't5align_passkey_10k'",
                      "EVAL_OUTPUT_DIR = '/tmp/unused'", *bindings))


def test_shipped_model_eval_is_greedy_with_the_task_length_and_its_own_files():
  run = _eval()
  model = run['model']
  # t5x's default would be beam search: the decoding is greedy temperature sampling at 0.0.
  assert model.decode_fn(None, None, None, 1) == {
      'fn': 'temperature_sample', 'temperature': 0.0, 'topk': 1}
  assert run['dataset_cfg'].task_feature_lengths == {'targets': 16}  # passkey's max_decode_length
  assert run['restore_checkpoint_cfg'].path == t5x_gin.shipped_checkpoint()
  assert model.input_vocabulary.sentencepiece_model_file == t5x_gin.shipped_vocabulary()
  assert seqio_tasks.vocabulary_path() == t5x_gin.shipped_vocabulary()
  assert type(model.module) is network.Transformer  # pylint: disable=unidiomatic-typecheck
  cfg = model.module.config
  assert (cfg.vocab_size, cfg.num_encoder_layers, cfg.encoder_attention_temperature,
          cfg.dropout_rate) == (1024, 3, 1.0, 0.0)


def test_temperature_reaches_the_network():
  run = _eval(('retrieval_t5.gin',), 'TEMPERATURE = 0.75')
  assert run['model'].module.config.encoder_attention_temperature == 0.75
  run = _eval(('retrieval_t5.gin',), 'TEMPERATURE = (0.9, 0.8, 0.7)')
  assert run['model'].module.config.encoder_attention_temperature == (0.9, 0.8, 0.7)


def _schedule_file(folder, tasks=()) -> str:
  """A schedule (L_tr 256): pooled tau 0.8 at 1024; each of `tasks` its own 0.6 at 1024."""
  from t5align import calibration  # pylint: disable=g-import-not-at-top
  from t5align import schedule  # pylint: disable=g-import-not-at-top
  cals = lambda tau: {'pmax': (calibration.Calibration('pmax', 1024, 256, tau),)}
  path = folder / f'schedule_{len(tasks)}.json'
  schedule.TemperatureSchedule(256, cals(0.8), 'pmax', tasks={t: cals(0.6) for t in tasks}
                               ).save(str(path))
  return str(path)


def test_schedule_and_its_refusal_of_a_temperature(tmp_path):
  path = _schedule_file(tmp_path)
  run = _eval(('retrieval_t5.gin', 'schedule.gin'), f"SCHEDULE_PATH = '{path}'")
  module = run['model'].module
  assert isinstance(module, scheduled.ScheduledTransformer)
  assert (module.schedule_path, module.config.encoder_attention_temperature) == (path, 1.0)
  for tau in ('0.3', '1.0'):
    with pytest.raises(ValueError, match=rf'TEMPERATURE={tau} is set together with '
                                         r'gin/t5x/schedule.gin'):
      _eval(('retrieval_t5.gin', 'schedule.gin'), f"SCHEDULE_PATH = '{path}'",
            f'TEMPERATURE = {tau}')


def test_schedule_applies_the_evaluated_tasks_own_entry(tmp_path):
  # Calibrated per task (tau 0.6 at 1024 tokens), pooled 0.8: the network t5x.eval runs for
  # t5align_passkey_10k gives its inputs the task's 0.6, as t5align.eval does.
  path = _schedule_file(tmp_path, tasks=('t5align_passkey_10k', 't5align_passkey_2k'))
  module = _eval(('retrieval_t5.gin', 'schedule.gin'), f"SCHEDULE_PATH = '{path}'")['model'].module
  assert module.schedule_task == 't5align_passkey_10k'
  tokens = np.ones((1, 1024), np.int32)
  applied = scheduled.task_schedule(module.schedule_path, None, module.schedule_task)
  np.testing.assert_allclose(applied.temperatures(tokens), [[0.6]], rtol=1e-6)
  # A task without an entry: refused (it used to get the pooled 0.8 with a warning), unless
  # the user allows it: then the pooled 0.8, with a warning.
  with pytest.raises(ValueError, match=r"\(SCHEDULE_PATH\) has no calibration for task "
                                       r"'t5align_passkey_20k' \(it has t5align_passkey_10k, "
                                       r't5align_passkey_2k\).*ALLOW_SCHEDULE_MISMATCH=True'):
    _eval(('retrieval_t5.gin', 'schedule.gin'), f"SCHEDULE_PATH = '{path}'",
          "MIXTURE_OR_TASK_NAME = 't5align_passkey_20k'")
  with pytest.warns(UserWarning, match="no calibration for task 't5align_passkey_20k'"):
    module = _eval(('retrieval_t5.gin', 'schedule.gin'), f"SCHEDULE_PATH = '{path}'",
                   "MIXTURE_OR_TASK_NAME = 't5align_passkey_20k'",
                   'ALLOW_SCHEDULE_MISMATCH = True')['model'].module
  np.testing.assert_allclose(scheduled.task_schedule(
      module.schedule_path, None, module.schedule_task, True).temperatures(tokens), [[0.8]],
      rtol=1e-6)
  # A mixture holding tasks with entries: one run cannot apply each its own; refused when the
  # model is configured, before any checkpoint is read.
  with pytest.raises(ValueError, match=r'per-task calibrations for t5align_passkey_10k, '
                                       r't5align_passkey_2k, tasks of the mixture '
                                       r"'t5align_passkey'.*Evaluate each task in its own run"):
    _eval(('retrieval_t5.gin', 'schedule.gin'), f"SCHEDULE_PATH = '{path}'",
          "MIXTURE_OR_TASK_NAME = 't5align_passkey'")


@pytest.mark.parametrize('gin_file', [f for f in T5X_FILES if f not in PARTS])
def test_every_model_file_is_greedy_with_one_vocabulary(gin_file):
  run = _eval((gin_file,), "CHECKPOINT_PATH = '/ckpt'", "VOCABULARY_PATH = '/my/spm.model'")
  model = run['model']
  assert model.decode_fn(None, None, None, 1)['temperature'] == 0.0
  assert isinstance(model.module, network.Transformer)
  assert model.input_vocabulary.sentencepiece_model_file == '/my/spm.model'
  assert seqio_tasks.vocabulary_path() == '/my/spm.model'
  if gin_file != 'retrieval_t5.gin':  # The released models: T5's vocabulary by default.
    model = _eval((gin_file,), "CHECKPOINT_PATH = '/ckpt'")['model']
    assert model.input_vocabulary.sentencepiece_model_file == T5_VOCAB
    assert seqio_tasks.vocabulary_path() == T5_VOCAB


def test_task_feature_lengths():
  assert t5x_gin.task_feature_lengths('t5align_lines_200') == {'targets': 32}
  assert t5x_gin.task_feature_lengths('t5align_passkey') == {'targets': 16}
  # A mixture decodes for its longest task (topics and lines: 32; passkey: 16).
  assert t5x_gin.task_feature_lengths('t5align_retrieval', inputs=4096) == {
      'targets': 32, 'inputs': 4096}
  with pytest.raises(ValueError, match='scored'):
    t5x_gin.task_feature_lengths('t5align_lm_wiki_512')
  with pytest.raises(KeyError, match='no_such_task'):
    t5x_gin.task_feature_lengths('no_such_task')


def test_finetune_trains_the_shipped_model_with_a_temperature():
  run = _run(['finetune.gin'], ["INITIAL_CHECKPOINT_PATH = '/init/checkpoint_5000'",
                                "MODEL_DIR = '/tmp/ft'", 'TRAIN_STEPS = 5020',
                                'TEMPERATURE = 0.8'], entry=train)
  model = run['model']
  cfg = model.module.config
  assert isinstance(model.module, network.Transformer)
  assert (cfg.vocab_size, cfg.encoder_attention_temperature, cfg.dropout_rate) == (1024, 0.8, 0.1)
  assert model.input_vocabulary.sentencepiece_model_file == t5x_gin.shipped_vocabulary()
  assert seqio_tasks.vocabulary_path() == t5x_gin.shipped_vocabulary()
  data = run['train_dataset_cfg']
  assert (data.mixture_or_task_name, data.split, data.shuffle, data.pack, data.use_cached) == (
      't5align_train_retrieval', 'train', True, False, False)
  assert data.task_feature_lengths == {'inputs': 256, 'targets': 80}
  assert run['train_eval_dataset_cfg'] is None and run['infer_eval_dataset_cfg'] is None
  assert run['checkpoint_cfg'].restore.path == '/init/checkpoint_5000'
  # The task exists with a train split and a shuffle buffer, as t5x.train needs.
  task = seqio.get_mixture_or_task(data.mixture_or_task_name)
  assert 'train' in task.splits and task.shuffle_buffer_size


@pytest.mark.slow
def test_schedule_gin_applies_per_head_temperatures(tmp_path):
  """gin/t5x/schedule.gin with a per-head schedule: the network encodes each input at its own
  length's `[layers, heads]` taus, as `network.Transformer` does when given them."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from t5align import calibration  # pylint: disable=g-import-not-at-top
  from t5align import schedule  # pylint: disable=g-import-not-at-top
  from t5align.shipped import assets  # pylint: disable=g-import-not-at-top
  params, shipped, _ = assets.load_shipped()
  n, h = shipped.num_encoder_layers, shipped.num_heads
  rng = np.random.default_rng(0)
  sched = schedule.TemperatureSchedule(32, {'pmax_per_head': tuple(
      calibration.Calibration('pmax_per_head', L, 32, tuple(map(tuple, rng.uniform(
          0.4, 1.0, (n, h)).tolist()))) for L in (64, 128))}, 'pmax_per_head')
  path = tmp_path / 'per_head.json'
  sched.save(str(path))
  module = _eval(('retrieval_t5.gin', 'schedule.gin'), f"SCHEDULE_PATH = '{path}'")['model'].module
  tokens = rng.integers(5, 1000, (2, 128)).astype(np.int32)
  tokens[1, 40:] = 0
  encode = jax.jit(lambda model, x, tau: model.apply(
      {'params': params}, x, enable_dropout=False, method=model.encode, temperature=tau),
                   static_argnums=0)
  scheduled_out = encode(module, tokens, None)
  plain = network.Transformer(module.config)
  np.testing.assert_allclose(scheduled_out, encode(plain, tokens, sched.temperatures(tokens)),
                             rtol=0, atol=1e-6)
  # Row 1 (40 tokens) at its length's taus, [1, layers, heads], as every row's; tau = 1 differs.
  np.testing.assert_allclose(scheduled_out[1, :40],
                             encode(plain, tokens, sched.encode_temperature(40))[1, :40], rtol=0,
                             atol=1e-5)
  ones = encode(plain, tokens, np.ones((1, n, h), np.float32))
  assert np.abs(np.asarray(ones) - np.asarray(scheduled_out)).max() > 1e-3
