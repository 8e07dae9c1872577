"""t5align/preflight.py: deviceless TPU compiles of the real programs, their figures, the CLI.

Compiles need libtpu (the test extras install it: `jax[tpu]`); without it those tests skip. The
references: hand-computed parameter bytes per chip and written-out loop costs (matmul FLOPs times
trip counts). The cost model itself is tested in hlo_cost_test.py.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from t5align import calibration
from t5align import jobs
from t5align import network
from t5align import partitioning
from t5align.jobs import preflight
from t5align.runtime import tpu_chips

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
needs_libtpu = pytest.mark.skipif(not preflight.libtpu_available(),
                                  reason='libtpu is not installed (pip install "jax[tpu]")')
V5E_2X2 = tpu_chips.parse_target('v5e:2x2')
# Tile-aligned shapes (multiples of 128 per shard), so XLA's TPU argument bytes are the logical
# ones: 2 + 2 layers, 8 heads x 32, d_model 256, d_ff 1024, vocabulary 2048.
SMALL = network.T5Config(vocab_size=2048, dtype=jnp.bfloat16, emb_dim=256, num_heads=8,
                         num_encoder_layers=2, num_decoder_layers=2, head_dim=32, mlp_dim=1024,
                         mlp_activations=('gelu', 'linear'), dropout_rate=0.0,
                         attention_impl='blockwise')


def _small_params_per_chip(model: int) -> tuple[int, int]:
  """float32 parameter values one chip holds, by hand, (encoder + embedding, decoder + logits):
  everything but the norm scales is split over 'model' (t5x's rules; the [heads, 32]
  relative-position tables by heads)."""
  e, hd, f, v = 256, 8 * 32, 1024, 2048
  enc_layer = 4 * e * hd + 3 * e * f  # q, k, v, o; wi_0, wi_1, wo
  dec_layer = 8 * e * hd + 3 * e * f  # self + cross attention; MLP
  encoder = (v * e + 2 * enc_layer + 8 * 32) // model + (2 * 2 + 1) * e
  decoder = (e * v + 2 * dec_layer + 8 * 32) // model + (2 * 3 + 1) * e
  return encoder, decoder


def test_tpu_type_names_map_to_topologies():
  for name, topology, chips in [('v4-32', 'v4:2x2x4', 16), ('v5litepod-16', 'v5e:4x4', 16),
                                ('v5e-16', 'v5e:4x4', 16), ('v5p-8', 'v5p:2x2x1', 4),
                                ('v6e-16', 'v6e:4x4', 16), ('v4-8', 'v4:2x2x1', 4),
                                ('v5litepod-8', 'v5e:2x4', 8), ('v6e-256', 'v6e:16x16', 256),
                                ('v5e:4x4', 'v5e:4x4', 16), ('v4:2x2x2', 'v4:2x2x2', 8)]:
    target = tpu_chips.parse_target(name)
    assert (target.topology, target.num_chips) == (topology, chips), name
  assert tpu_chips.parse_target('v4-32').topology_kwargs()['chip_config_name'] == 'megacore'
  assert tpu_chips.parse_target('v5e-16').chip.hbm_bytes == 16 * 2**30
  for bad, words in [('v4-30', 'v4-N takes N in'), ('v5litepod-12', 'v5litepod-N takes N in'),
                     ('v5e:4x4x4', r'2-D \(AxB\)'), ('tpu-16', 'TPU type name such as')]:
    with pytest.raises(ValueError, match=words):
      tpu_chips.parse_target(bad)


@pytest.mark.tpu_compile
@needs_libtpu
def test_meshes_over_a_slice_are_the_runs_meshes():
  """Inside `partitioning.target_devices` the run's mesh builders lay meshes over the slice as
  `jax.make_mesh` does over a real one; an axis that needs a physical axis split (8 along
  'model' on a 4x4 v6e, which `jax.make_mesh` refuses there) is split instead of failing."""
  from t5align import partitioning  # pylint: disable=g-import-not-at-top
  devices = preflight.compile_only_devices(tpu_chips.parse_target('v6e-16'))
  with partitioning.target_devices(devices):
    assert len(partitioning.all_devices()) == 16 and partitioning.process_count() == 4
    mesh = partitioning.eval_mesh(4)
    expected = jax.make_mesh((4, 4), ('data', 'model'), devices=devices)
    assert [d.id for d in mesh.devices.flat] == [d.id for d in expected.devices.flat]
    mesh = partitioning.calibration_mesh(2, 1, 8)
    assert dict(mesh.shape) == {'tau': 2, 'data': 1, 'model': 8}
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)
  assert partitioning.all_devices() == jax.devices()  # Outside the block: jax's own.


def _check(program, config, target, length, **settings):
  """The pre-flight report of the job ('eval' or 'calibration') with these settings (for
  calibration, `batch_size` and `tau_batch_size` are its `search`'s)."""
  if program == 'calibration':
    settings['search'] = calibration.SearchSettings(
        batch_size=settings.pop('batch_size', None),
        tau_batch_size=settings.pop('tau_batch_size', None))
  job = (jobs.EvalJob if program == 'eval' else jobs.CalibrationJob)(**settings)
  (report,) = preflight.check(preflight.Case(job, config, target, length))
  return report


# ~70 s of compiles on the 2-core machine: its tests share one xdist worker (compiled once).
@pytest.fixture(scope='module')
def small_reports():
  """The SMALL model's eval and calibration programs compiled for v5e:2x2 (data 2 x model 2)."""
  if not preflight.libtpu_available():
    pytest.skip('libtpu is not installed (pip install "jax[tpu]")')
  common = dict(config=SMALL, target=V5E_2X2, length=2048, batch_size=4)
  return {
      'eval': _check(
          'eval', num_partitions=2, max_decode_length=8, **common),
      'calibration': _check(
          'calibration', mesh_shape=(1, 2, 2), tau_batch_size=3, **common)}


@pytest.fixture(scope='module')
def small_fused_reports():
  """`small_reports`' programs with attention_impl='pallas': the Mosaic kernel."""
  if not preflight.libtpu_available():
    pytest.skip('libtpu is not installed (pip install "jax[tpu]")')
  common = dict(config=dataclasses.replace(SMALL, attention_impl='pallas'), target=V5E_2X2,
                length=2048, batch_size=4)
  return {
      'eval': _check(
          'eval', num_partitions=2, max_decode_length=8, **common),
      'calibration': _check(
          'calibration', mesh_shape=(1, 2, 2), tau_batch_size=3, **common)}


@pytest.mark.tpu_compile
@pytest.mark.xdist_group('preflight_small_reports')
def test_fused_kernel_counts_by_its_estimate_times_trip_counts(small_reports,
                                                               small_fused_reports):
  """The same programs with the Mosaic kernel ('pallas' on TPU): they fit, every kernel declares
  its cost, and the kernel's work is counted once per call it makes. Per chip and layer the
  kernel runs 4 heads x 2048^2 (query, key) pairs per encoder pass: one exp each and 4 x 32 + 8
  FLOPs (`pallas_tpu._cost`); eval makes 2 passes (examples), calibration 2 x 3 (examples x
  taus, one tau per trip of the sweep's loop). What else XLA counts (GELU's tanh, decoding's
  softmax) adds a few percent. Without the 128-key band the tiles' bias is one value per head:
  the kernel reads and writes far fewer bytes than blockwise's tiles do."""
  pairs = 2 * 4 * 2048 * 2048  # layers x heads x pairs
  for program, passes, loops in [('eval', 2, [(8, False)]),
                                 ('calibration', 6, [(3, True), (3, True)])]:
    fused, tiled = small_fused_reports[program], small_reports[program]
    assert fused.fits and fused.attention_impl == 'pallas_tpu', program
    assert fused.custom_calls_without_estimate == ()
    assert [(loop.trips, loop.exact) for loop in fused.loops] == loops, fused.loops
    kernel = passes * pairs
    assert kernel <= fused.cost.transcendentals <= 1.07 * kernel, program
    assert fused.cost.flops >= kernel * (4 * 32 + 8), program
    assert fused.cost.bytes_accessed < 0.8 * tiled.cost.bytes_accessed, program
    assert fused.memory.temporaries < tiled.memory.temporaries, program


@pytest.mark.tpu_compile
@pytest.mark.xdist_group('preflight_small_reports')
def test_argument_bytes_are_the_sharded_parameters_plus_inputs(small_reports):
  encoder, decoder = (4 * n for n in _small_params_per_chip(model=2))  # float32 bytes
  eval_report = small_reports['eval']
  assert eval_report.mesh == {'data': 2, 'model': 2}
  # Per chip: 2 of the 4 examples' tokens (int32) and taus (float32, one per example).
  inputs = 2 * 2048 * 4 + 2 * 4
  memory = eval_report.memory
  assert abs(memory.arguments - (encoder + decoder + inputs)) <= 2 * 4096, memory
  assert memory.unread_parameters == 0
  # Calibration reads the encoder side only, and of the last layer only what its attention
  # probabilities need (q, k: the statistics): XLA drops the rest from its arguments (the
  # last layer's v, o and MLP, the decoder). The run holds them all: unread parameters.
  calibration = small_reports['calibration']
  assert calibration.mesh == {'tau': 1, 'data': 2, 'model': 2}
  inputs = 2 * 2048 * 4 + 3 * 2 * 4  # 2 samples of 2048 tokens; all 3 taus x 2 layers
  unused = 4 * (2 * 256 * 256 + 3 * 256 * 1024) // 2 + 4 * 256  # v, o, MLP; MLP norm
  memory = calibration.memory
  assert abs(memory.arguments - (encoder - unused + inputs)) <= 2 * 4096, memory
  assert abs(memory.unread_parameters - (decoder + unused)) <= 2 * 4096, memory
  for report in small_reports.values():
    assert report.fits and 0 < report.memory.total < 2**30
    m = report.memory
    assert m.total == (m.arguments + m.temporaries + m.outputs - m.aliased + m.generated_code
                       + m.unread_parameters)


@pytest.mark.tpu_compile
@pytest.mark.xdist_group('preflight_small_reports')
def test_trip_counts_against_an_analytic_count(small_reports):
  """Calibration: the encoder's matmul FLOPs per chip by hand, with blockwise attention in
  512 x 512 tiles (4 x 4 of them per layer: `cost_analysis` counts one).

  Per chip: 2 samples, 3 taus, 4 of the 8 heads (128 of the 256 q/k/v units), 512 of the 1024
  MLP units. What does not depend on tau is computed once per sample (vmap batches only what
  does): layer 0's q, k, v projections and q.k logits. The statistics need no more of the last
  layer than its q.k (XLA drops the rest).
  """
  report = small_reports['calibration']
  e, hd, f, length = 256, 128, 512, 2048
  once = 2 * 3 * e * hd + 2 * length * hd  # layer 0: q, k, v; q.k
  per_tau = (2 * length * hd + 2 * e * hd + 2 * 3 * e * f  # layer 0: p.v, o, MLP
             + 2 * 2 * e * hd + 2 * length * hd)  # layer 1: q, k; q.k
  matmuls = 2 * length * (once + 3 * per_tau)  # per token x tokens x samples
  # Per layer: 4 query blocks x 4 key blocks; in the near tiles' two switch branches (masked or
  # not) the TPU's expansion of the bias window's gather, one row of the 512-query tile a trip.
  loops = [(loop.trips, loop.exact) for loop in report.loops]
  assert loops == [(4, True), (4, True), (512, True), (512, True)] * 2, loops
  # XLA also counts elementwise work (softmax, norms, GELU), which the hand count leaves out.
  assert matmuls <= report.cost.flops <= 1.25 * matmuls, (report.cost.flops, matmuls)
  assert report.xla_cost['flops'] < 0.7 * matmuls  # 1/16 of the attention
  assert report.units_per_call == 4 * 3
  per = report.per_unit()
  assert per['flops'] == pytest.approx(report.cost.flops * 4 / 12)
  chip = tpu_chips.CHIPS['v5e']
  assert per['roofline_seconds'] == pytest.approx(max(
      report.cost.flops / chip.peak_bf16_flops,
      report.cost.bytes_accessed / chip.hbm_bytes_per_s) / 12)


@pytest.mark.tpu_compile
@pytest.mark.xdist_group('preflight_small_reports')
def test_eval_decoding_loop_is_bounded_by_max_decode_length(small_reports):
  report = small_reports['eval']
  decode = [loop for loop in report.loops if not loop.exact]
  assert [loop.trips for loop in decode] == [8], report.loops
  assert report.units_per_call == 4 and report.shapes['inputs'] == (4, 2048)


@pytest.mark.tpu_compile
@needs_libtpu
@pytest.mark.parametrize('impl, kernel', [('blockwise', 'blockwise'), ('pallas', 'pallas_tpu')])
def test_tiny_model_programs_compile_for_v5e_2x2(impl, kernel, clean_gin):
  """gin/models/tiny.gin's eval step (encoder + 64 greedy steps) and calibration sweep (3 taus)
  for v5e:2x2, data 2 x model 2, with 'blockwise' and with the fused kernel ('pallas': Mosaic)."""
  from t5align import gin_cli  # pylint: disable=g-import-not-at-top
  gin_cli.configure(['--gin_file=gin/models/tiny.gin', f'--gin.ATTENTION_IMPL={impl!r}'],
                    prog='t')
  config = clean_gin.get_configurable(network.T5Config)()
  common = dict(config=config, target=V5E_2X2, length=1000, batch_size=3)
  report = _check('eval', num_partitions=2, **common)
  assert report.fits and report.mesh == {'data': 2, 'model': 2}
  assert report.attention_impl == kernel
  assert report.shapes == {'inputs': (4, 1024), 'taus': (4, 1)}  # 3 -> 4 rows; 128-multiple
  assert [(loop.trips, loop.exact) for loop in report.loops].count((64, False)) == 1
  assert report.cost.flops > report.xla_cost['flops'] and report.per_unit()['flops'] > 0
  report = _check('calibration', mesh_shape=(1, 2, 2), tau_batch_size=3, **common)
  assert report.fits and report.mesh == {'tau': 1, 'data': 2, 'model': 2}
  assert report.attention_impl == kernel and report.custom_calls_without_estimate == ()
  assert report.shapes == {'inputs': (4, 1000), 'taus': (3, 2, 1)}
  # One exp per (query, key) pair: per chip 2 examples x 3 taus x 2 heads in each of 2 layers,
  # over 1000^2 pairs, or 1024^2 as both count them (tiles of the input padded to 1024). XLA's
  # blockwise program takes each tile's exps in more than one fusion (about twice this).
  rows = 2 * 2 * 3 * 2
  assert rows * 1000**2 <= report.cost.transcendentals
  if impl == 'pallas':
    assert report.cost.transcendentals <= 1.05 * rows * 1024**2


def _cli(*args, tmp_path):
  env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
  return subprocess.run([sys.executable, '-m', 't5align.preflight', *args], cwd=REPO_ROOT,
                        env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.cli
@pytest.mark.tpu_compile
@needs_libtpu
def test_cli_refuses_a_run_that_does_not_fit(tmp_path):
  """gin/calibrate.gin + gin/models/tiny.gin, 'reference' attention at 32k tokens: 11 taus x 4
  heads of [32k, 32k] float32 logits and probabilities on one v5e chip. XLA refuses to compile
  it; exit 3, naming the settings to change; the JSON says so too."""
  out = tmp_path / 'report.json'
  result = _cli('--gin_file=gin/calibrate.gin', '--gin_file=gin/models/tiny.gin',
                '--gin.ATTENTION_IMPL=reference', '--gin.NUM_SAMPLES=1', '--topology=v5e:2x2',
                '--length=32768', f'--json_output={out}', tmp_path=tmp_path)
  assert result.returncode == preflight.DOES_NOT_FIT == 3, result.stderr[-3000:]
  assert 'XLA refused it for v5e: RESOURCE_EXHAUSTED' in result.stdout, result.stdout
  assert 'Does not fit' in result.stdout
  for setting in ("ATTENTION_IMPL='blockwise'", 'TAU_BATCH_SIZE, now 11', 'BATCH_SIZE (now 1)'):
    assert setting in result.stdout, result.stdout
  report = json.loads(out.read_text())
  assert not report['fits'] and report['program'] == 'calibration'
  # [11, 4, 32k, 32k] float32 is 176 GiB; XLA needs a few such buffers at once.
  assert report['memory_per_chip']['temporaries'] >= 176 * 2**30
  assert 'available HBM (15.75G)' in report['compile_error']
  assert report['mesh'] == {'tau': 1, 'data': 1, 'model': 1}  # MESH_SHAPE None: one device
  assert 'libtpu' not in result.stderr.lower() and 'TPU_WORKER' not in result.stderr


@pytest.mark.cli
@pytest.mark.tpu_compile
@needs_libtpu
def test_cli_passes_a_run_that_fits(tmp_path):
  out = tmp_path / 'report.json'
  result = _cli('--gin_file=gin/calibrate.gin', '--gin_file=gin/models/tiny.gin',
                '--gin.MESH_SHAPE=(2, 2)', '--gin.LENGTHS=(512, 1000)', '--topology=v5litepod-4',
                f'--json_output={out}', tmp_path=tmp_path)
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  report = json.loads(out.read_text())
  assert report['fits'] and report['settings']['length'] == 1000  # max(LENGTHS)
  assert report['mesh'] == {'tau': 2, 'data': 2, 'model': 1}
  # gin/models/tiny.gin (after gin/calibrate.gin) sets ATTENTION_IMPL, as for t5align.calibrate.
  assert report['settings']['attention_impl'] == 'reference'
  # gin/calibrate.gin's BATCH_SIZE = 1, rounded up to the 'data' axis; 11 taus rounded up to 12.
  assert report['shapes'] == {'inputs': [2, 1000], 'taus': [12, 2, 1]}
  assert report['target']['type_name'] == 'v5litepod-4'


@pytest.mark.cli
def test_cli_names_a_bad_topology(tmp_path):
  result = _cli('--gin_file=gin/calibrate.gin', '--topology=v5e-12', tmp_path=tmp_path)
  assert result.returncode == 2
  assert '--topology=v5e-12' in result.stderr and 'v5e-N takes N in' in result.stderr


@pytest.mark.cli
@pytest.mark.tpu_compile
@needs_libtpu
def test_cli_names_a_topology_libtpu_has_no_slice_of(tmp_path):
  """A well-formed topology that is no slice (v5e:3x3): exit 2 naming the flag, no traceback."""
  result = _cli('--gin_file=gin/calibrate.gin', '--topology=v5e:3x3', tmp_path=tmp_path)
  assert result.returncode == 2, result.stderr
  assert '--topology=v5e:3x3: libtpu has no such slice' in result.stderr, result.stderr
  assert 'v5e:4x4' in result.stderr and 'Traceback' not in result.stderr


@pytest.mark.tensorflow
def test_eval_programs_follow_the_tasks():
  """`EvalJob.programs` (what the pre-flight compiles): a scored task is scored over its
  continuation; decoded tasks group by their steps (the task's own, or MAX_DECODE_LENGTH for
  all); a name outside t5align's tasks is refused."""
  pytest.importorskip('seqio')
  from seqio_tasks import catalog  # pylint: disable=g-import-not-at-top
  config = network.T5Config(vocab_size=64, emb_dim=8, num_heads=2, num_encoder_layers=1,
                            num_decoder_layers=1, head_dim=4, mlp_dim=8)
  mesh = partitioning.eval_mesh(1)
  params = network.param_shapes(config)

  def programs(tasks, steps):
    return [(p.settings['scored'], p.settings['max_decode_length'], p.settings['target_length'],
             tuple(p.settings['tasks']))
            for p in jobs.EvalJob(mixture_or_task_name=tasks, max_decode_length=steps).programs(
                config, mesh, params, length=256)]

  steps = {catalog.SPECS[t].max_decode_length for t in catalog.resolve('t5align_retrieval')}
  assert programs(None, None) == [(False, 64, 0, ())]
  assert programs('t5align_lm_wiki_2048', 8) == [(True, None, 128, ('t5align_lm_wiki_2048',))]
  mixed = programs('t5align_lm_wiki_2048,t5align_retrieval', None)
  assert [p[0] for p in mixed] == [True] + [False] * len(steps)
  assert {p[1] for p in mixed[1:]} == steps
  assert sum(len(p[3]) for p in mixed[1:]) == len(catalog.resolve('t5align_retrieval'))
  one = programs('t5align_retrieval', 16)
  assert len(one) == 1 and one[0][1] == 16
  with pytest.raises(ValueError, match=r"MIXTURE_OR_TASK_NAME='my_task' is not a t5align task"):
    programs('t5align_passkey_20k,my_task', None)


@pytest.mark.cli
@pytest.mark.tpu_compile
@pytest.mark.tensorflow
@needs_libtpu
def test_cli_compiles_scoring_for_a_scored_task(tmp_path):
  """The LM task is scored by eval (128-token targets): the pre-flight compiles that program,
  not decoding, and says so."""
  pytest.importorskip('seqio')
  out = tmp_path / 'report.json'
  result = _cli('--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/tiny.gin',
                '--gin.MIXTURE_OR_TASK_NAME=t5align_lm_wiki_2048', '--topology=v5e:2x2',
                '--length=2048', f'--json_output={out}', tmp_path=tmp_path)
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  assert 'eval, scoring of 128-token targets (tasks t5align_lm_wiki_2048)' in result.stdout
  report = json.loads(out.read_text())
  assert report['compiled'] == 'scoring of 128-token targets (tasks t5align_lm_wiki_2048)'
  assert report['shapes']['targets'][1] == 128 and report['settings']['scored']


@pytest.mark.tensorflow
@pytest.mark.usefixtures('clean_gin')
def test_eval_settings_come_from_the_eval_gin_files():
  """The pre-flight's job is the one gin makes for `t5align.eval` (nothing of the command is
  imported but what the gin file imports)."""
  pytest.importorskip('seqio')
  from t5align import gin_cli  # pylint: disable=g-import-not-at-top
  gin_cli.configure(['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/flan_t5/xxl.gin',
                     '--gin.NUM_PARTITIONS=8', '--gin.BATCH_SIZE=2', '--gin.TRUNCATE_INPUTS=4000',
                     '--gin.PARAMS_DTYPE=bfloat16',
                     '--gin.TEMPERATURE=(' + ', '.join(['0.9'] * 24) + ')'],
                    prog='t', unset_required=True)
  case = preflight.case_from_gin(tpu_chips.parse_target('v5e-16'), 32768)
  job = case.job
  assert isinstance(job, jobs.EvalJob) and case.config.num_heads == 64 and case.length == 32768
  assert (job.truncate_inputs, job.batch_size, job.num_partitions) == (4000, 2, 8)
  assert job.temperature == (0.9,) * 24 and job.max_decode_length is None
  assert job.checkpoint.params_dtype == 'bfloat16' and case.config.attention_impl == 'auto'


@pytest.mark.cli
@pytest.mark.tpu_compile
@needs_libtpu
def test_cli_compiles_a_training_runs_step(tmp_path, clean_gin):
  """A training run (gin/runs/train_retrieval.gin, the shipped model's run file, on
  gin/models/tiny.gin's shapes), its one program compiled for a v5e chip as MaxText's
  train_compile does: the step's arguments hold the parameters, Adafactor's state and the batch
  the run feeds it; the figure is XLA's (the analytic estimate models inference, so none)."""
  out = tmp_path / 'report.json'
  result = _cli('--gin_file=gin/runs/train_retrieval.gin', '--gin_file=gin/models/tiny.gin',
                '--gin.BATCH_SIZE=4', '--gin.L_TR=128', '--gin.TARGET_LENGTH=16',
                '--topology=v5e:2x2', f'--json_output={out}', tmp_path=tmp_path)
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  report = json.loads(out.read_text())
  assert report['program'] == 'train' and report['fits'] and report['compile_error'] is None
  assert report['mesh'] == {'tau': 1, 'data': 1, 'model': 1}  # Training runs on one chip.
  assert report['shapes']['batch'] == {'decoder_input_tokens': [4, 16],
                                       'decoder_target_tokens': [4, 16],
                                       'encoder_input_tokens': [4, 128]}
  assert report['shapes']['opt_state'].endswith(' arrays')
  assert report['settings']['training'] and report['memory_estimate'] is None
  from t5align import gin_cli  # pylint: disable=g-import-not-at-top
  gin_cli.configure(['--gin_file=gin/models/tiny.gin'], prog='t')
  config = clean_gin.get_configurable(network.T5Config)()
  params = sum(math.prod(s.shape) * 4 for s in jax.tree.leaves(network.param_shapes(config)))
  memory = report['memory_per_chip']
  # The parameters, Adafactor's second moments (one per parameter here: it factors only
  # dimensions of 128 or more, and tiny.gin's are 8 to 16 wide but the vocabulary) and the batch
  # are the step's arguments; the outputs hold the new parameters and state.
  assert 2 * params < memory['arguments'] < 3 * params
  assert memory['outputs'] > params
  assert 'train, one optimizer step, on v5e:2x2' in result.stdout
