"""t5align/memory.py: the per-device estimate by hand, and the refusal of runs that cannot fit."""
from __future__ import annotations

import pathlib

import jax.numpy as jnp
import pytest

from t5align import calibration
from t5align import memory
from t5align import network
from t5align.shipped import assets

# Flan-T5-XXL (T5 1.1 XXL shapes): 11,135,332,352 parameters (t5x's published count).
XXL = network.T5Config(vocab_size=32128, dtype=jnp.bfloat16, emb_dim=4096, num_heads=64,
                       num_encoder_layers=24, num_decoder_layers=24, head_dim=64, mlp_dim=10240,
                       mlp_activations=('gelu', 'linear'), dropout_rate=0.0)
TINY = network.T5Config(vocab_size=128, dtype=jnp.float32, emb_dim=64, num_heads=4,
                        num_encoder_layers=2, num_decoder_layers=2, head_dim=16, mlp_dim=128,
                        mlp_activations=('gelu', 'linear'), dropout_rate=0.0)


def _tiny_param_count() -> int:
  e, v, hd, m, layers = 64, 128, 4 * 16, 128, 2
  encoder = layers * (4 * e * hd + 3 * e * m + 2 * e) + 4 * 32 + e
  decoder = layers * (8 * e * hd + 3 * e * m + 3 * e) + 4 * 32 + e
  return v * e + e * v + encoder + decoder


def test_estimate_matches_a_hand_computation():
  est = memory.estimate(TINY, length=4096, batch_size=8, params_dtype='float32',
                        model_shards=2, data_shards=2)
  assert _tiny_param_count() == 214_016
  assert est.params == 214_016 * 4 // 2
  # 4 examples x 2 heads per device; logits + probabilities + bias, float32.
  assert est.attention == 4 * (2 * 4 * 2 * 4096**2 + 2 * 4096**2) == 1_207_959_552
  # [4, 4096] rows x (2 x 64 + 2 x 2 x 16 + 3 x 64) float32 values, and two float32 copies of
  # each example's [4096, 64] residual stream.
  assert est.hidden == 4 * 4096 * (128 + 64 + 192) * 4 + 4 * 4096 * 2 * 64 * 4
  assert est.cache == 0
  assert est.total == est.params + est.attention + est.hidden

  blockwise = memory.estimate(TINY.replace(attention_impl="blockwise"),
                              length=4096, batch_size=8, params_dtype='float32', model_shards=2,
                              data_shards=2)
  # Per row and head: float32 accumulators and stacked outputs [4096, 16], 3 [512, 512] tiles.
  assert blockwise.attention == 4 * 4 * 2 * (2 * 4096 * 16 + 3 * 512 * 512)
  decoding = memory.estimate(TINY, length=4096, batch_size=8, params_dtype='float32',
                             model_shards=2, data_shards=2, decoding=True)
  # Cross-attention keys and values of 2 decoder layers, 4 examples x 2 heads x [4096, 16].
  assert decoding.cache == 2 * 2 * 4 * 4096 * 2 * 16 * 4
  assert decoding.total == est.total + decoding.cache
  # Calibration: 11 taus over a 'tau' axis of 4 -> 3 per device, times 4 examples.
  calib = memory.estimate(TINY, length=1024, batch_size=8, params_dtype='bfloat16',
                          data_shards=2, taus=11, tau_shards=4)
  assert calib.params == 214_016 * 2
  assert calib.attention == 4 * (2 * 12 * 4 * 1024**2 + 4 * 1024**2)


def test_a_workload_states_each_figure_once():
  """`Workload`: an eval step's (inputs padded to 128, the batch over 'data') and a calibration
  sweep's (taus over 'tau') report, refusal advice and estimate, written out by hand."""
  ref = TINY.replace(attention_impl='reference')
  step = memory.Workload(ref, 4000, 6, 'float32', pad_to=128, model_shards=2, data_shards=4,
                         decoding=True, decode_steps=16, tasks=('t',))
  assert (step.width, step.rows) == (4096, 8)
  assert step.settings() == {'length': 4000, 'batch_size': 6, 'params_dtype': 'float32',
                             'num_partitions': 2, 'max_decode_length': 16, 'scored': False,
                             'target_length': 0, 'tasks': ['t']}
  assert step.settings_to_change() == [
      "NUM_PARTITIONS (devices on the 'model' axis, now 2) higher",
      "ATTENTION_IMPL='blockwise' (now 'reference' at 4096 tokens)",
      'BATCH_SIZE (now 6) lower']
  est = step.estimate('cpu')
  # 2 examples (6 over 4 'data' devices, rounded up) x 2 heads per device at 4096 tokens.
  assert est.params == 214_016 * 4 // 2
  assert est.attention == 4 * (2 * 2 * 2 * 4096**2 + 2 * 4096**2)
  assert est.cache == 2 * 2 * 2 * 4096 * 2 * 16 * 4
  sweep = memory.Workload(TINY.replace(attention_impl='blockwise'), 1024, 8, 'bfloat16',
                          data_shards=2, tau_shards=4, taus=11, mesh_shape=(4, 2, 1),
                          model_setting="MESH_SHAPE's third entry")
  assert sweep.settings() == {'length': 1024, 'batch_size': 8, 'params_dtype': 'bfloat16',
                              'mesh_shape': (4, 2, 1), 'tau_batch': 11}
  assert sweep.settings_to_change() == [
      "MESH_SHAPE's third entry (devices on the 'model' axis, now 1) higher",
      'BATCH_SIZE (now 8) lower',
      'the tau batch (TAU_BATCH_SIZE, now 11 candidates per call) lower']
  # 4 examples x 3 of 11 taus per device, 4 heads: accumulators, outputs and 3 [512, 512] tiles.
  est = sweep.estimate('tpu')
  assert (est.params, est.cache) == (214_016 * 2, 0)
  assert est.attention == 4 * 12 * 4 * (2 * 1024 * 16 + 3 * 512 * 512)


def test_xxl_at_32k_with_reference_attention_is_estimated_by_hand():
  """Flan-T5-XXL at 32k tokens, 'reference' attention, one device: t5x's published parameter
  count in bfloat16, and three float32 `[h, L, L]` arrays per layer (768 GiB)."""
  est = memory.estimate(XXL, length=32768, batch_size=1, params_dtype='bfloat16')
  assert est.params == 11_135_332_352 * 2
  assert est.attention == 4 * (2 * 64 * 32768**2 + 64 * 32768**2)  # 768 GiB


def test_auto_attention_and_sharding_make_xxl_fit():
  auto = XXL.replace(attention_impl='auto')
  est = memory.estimate(auto, length=32768, batch_size=8, params_dtype='bfloat16',
                        model_shards=16, data_shards=2)
  assert est.attention_impl == 'blockwise' and est.total < 16 * 2**30


@pytest.mark.cli
@pytest.mark.tensorflow
@pytest.mark.usefixtures('clean_gin')
def test_eval_cli_refuses_before_running(tmp_path, monkeypatch):
  """`t5align.eval`'s entry point (in process: the same `main(argv)` the CLI runs) compiles the
  step for the widest batch and refuses it on XLA's memory figure, before writing anything."""
  pytest.importorskip('seqio')
  from t5align import eval as t5align_eval  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(__file__).resolve().parents[2]
  model = root / 't5align' / 'shipped' / 'retrieval_t5'
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(model / 'sentencepiece.model'))
  monkeypatch.chdir(root)
  with pytest.raises(memory.DoesNotFitError,
                     match=r'as XLA compiled it \(arguments .* temporaries .*BATCH_SIZE '
                           r'\(now 100000\) lower'):
    t5align_eval.main([
        '--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/retrieval_small.gin',
        f'--gin.CHECKPOINT_PATH={assets.checkpoint_dir(str(model))}',
        f'--gin.EVAL_OUTPUT_DIR={tmp_path}',
        '--gin.MIXTURE_OR_TASK_NAME=t5align_passkey_2k',
        '--gin_bindings=seqio_tasks.options.passkey_examples = 2',
        '--gin.BATCH_SIZE=100000'])  # 10^5 rows of ~2k tokens: terabytes of activations.
  assert not list(tmp_path.rglob('predictions.jsonl'))  # Nothing ran.


@pytest.mark.slow
def test_calibration_sweep_is_refused_on_xla_figure(load_t5x_fixture):
  """The sweep program `t5align.calibrate` checks before its sweeps (`CalibrationJob.programs`):
  10^5 samples of 2048 tokens need terabytes; a small sweep passes with XLA's figures."""
  from t5align import jobs  # pylint: disable=g-import-not-at-top
  config, params, _ = load_t5x_fixture('t5_1_1_tiny')

  def check(length, batch_size, taus):
    search = calibration.SearchSettings(batch_size=batch_size, tau_batch_size=taus)
    (sweep,) = jobs.CalibrationJob(search=search).programs(config, None, params, length=length)
    return sweep.check_memory('This calibration sweep')

  with pytest.raises(memory.DoesNotFitError, match=r'This calibration sweep needs .* as XLA '
                     r'compiled it .*BATCH_SIZE \(now 100000\) lower.*TAU_BATCH_SIZE, now 11'):
    check(2048, 100_000, 11)
  fits = check(256, 2, 3)
  assert 0 < fits.total < 2**30 and fits.temporaries > 0
