"""Tests for t5align/checkpoints/: T5X legacy/Orbax, HF, Mesh-TF readers and the T5X writer.

The writer's folders follow the umask. A bad checkpoint gets an error naming it and what is
wrong, before anything is allocated: a plain file, a non-float PARAMS_DTYPE, NaN weights (each
layout), an Orbax checkpoint without its manifest, declared arrays larger than the host, a garbage
Mesh-TF index, and HF checkpoints whose config.json is invalid, of the wrong type or contradicts
the weights (their own lm_head under a tied config), or whose tensors are int32.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil

from flax import serialization
import jax.numpy as jnp
import numpy as np
import pytest

from t5align import checkpoints
from t5align import memory
from t5align import network

pytestmark = pytest.mark.newest_jax

TESTDATA = pathlib.Path(__file__).parents[1] / 'testdata' / 't5x'
FIXTURES = ('t5_1_1_tiny', 't5_1_0_tiny')


def _legacy(name: str) -> pathlib.Path:
  return TESTDATA / name / 'legacy' / 'checkpoint_0'


def _fixture_config(name: str) -> dict:
  with open(TESTDATA / name / 'config.json') as f:
    cfg = json.load(f)['t5config']
  cfg['mlp_activations'] = tuple(cfg['mlp_activations'])
  return cfg


def _network_config(name: str) -> network.T5Config:
  cfg = _fixture_config(name)
  cfg['dtype'] = jnp.dtype(cfg['dtype'])
  return network.T5Config(**cfg)


def _writable_copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
  """Copies a (read-only) fixture and makes the copy writable."""
  shutil.copytree(src, dst)
  for root, dirs, files in os.walk(dst):
    for name in dirs + files:
      os.chmod(os.path.join(root, name), 0o755)
  os.chmod(dst, 0o755)
  return dst


def _assert_trees_equal(actual, expected):
  actual, expected = checkpoints.flatten_params(actual), checkpoints.flatten_params(expected)
  assert sorted(actual) == sorted(expected)
  for path in expected:
    assert actual[path].dtype == expected[path].dtype, path
    np.testing.assert_array_equal(actual[path], expected[path], err_msg=path)


def _shapes(tree) -> dict:
  return {k: tuple(v.shape) for k, v in checkpoints.flatten_params(tree).items()}


# ---------------------------------------------------------------- T5X fixtures


@pytest.mark.parametrize('name', FIXTURES)
def test_legacy_and_orbax_checkpoints_are_equal_with_the_network_tree(name):
  legacy = checkpoints.read_params(_legacy(name))
  orbax = checkpoints.read_params(TESTDATA / name / 'orbax' / 'checkpoint_0')
  from_file = checkpoints.read_params(_legacy(name) / 'checkpoint')

  _assert_trees_equal(orbax, legacy)
  _assert_trees_equal(from_file, legacy)
  assert _shapes(legacy) == _shapes(network.param_shapes(_network_config(name)))
  assert {v.dtype for v in checkpoints.flatten_params(legacy).values()} == {np.dtype('float32')}


@pytest.mark.parametrize('name,fmt', [(n, f) for n in FIXTURES for f in ('legacy', 'orbax')])
def test_load_params_bfloat16_is_the_cast(name, fmt):
  path = TESTDATA / name / fmt / 'checkpoint_0'
  f32, _ = checkpoints.load_params(path)
  bf16, config = checkpoints.load_params(path, dtype=jnp.bfloat16)

  expected = {k: v.astype(jnp.bfloat16) for k, v in checkpoints.flatten_params(f32).items()}
  _assert_trees_equal(bf16, checkpoints.unflatten_params(expected))
  assert config.vocab_size == _fixture_config(name)['vocab_size']


@pytest.mark.parametrize('name', FIXTURES)
def test_infer_config_equals_fixture_config(name):
  expected = _fixture_config(name)
  del expected['dtype'], expected['dropout_rate']  # Not recorded in checkpoints.

  assert checkpoints.infer_config(checkpoints.read_params(_legacy(name))) == expected
  _, config = checkpoints.load_params(_legacy(name))
  assert {k: getattr(config, k) for k in expected} == expected


def test_an_encoder_only_checkpoint_is_refused_by_the_inference():
  # Its config would hold num_decoder_layers = 0, which T5Config refuses less helpfully.
  params = dict(checkpoints.read_params(_legacy('t5_1_1_tiny')))
  params['decoder'] = {k: v for k, v in params['decoder'].items() if not k.startswith('layers_')}
  with pytest.raises(ValueError, match=r'^Cannot infer the T5 config: no decoder/layers_N '
                                       r'parameters \(t5align runs encoder-decoder T5\)\.$'):
    checkpoints.infer_config(params)


def test_detect_format():
  assert checkpoints.detect_format(_legacy('t5_1_0_tiny')) == 't5x'
  assert checkpoints.detect_format(_legacy('t5_1_0_tiny') / 'checkpoint') == 't5x'
  assert checkpoints.detect_format(TESTDATA / 't5_1_0_tiny/orbax/checkpoint_0') == 't5x_orbax'
  assert checkpoints.detect_format(TESTDATA / 't5_1_0_tiny/orbax/checkpoint_0/state') == (
      't5x_orbax')


def test_optimizer_state_arrays_are_never_opened(tmp_path):
  ckpt = _writable_copy(_legacy('t5_1_0_tiny'), tmp_path / 'checkpoint_0')
  for entry in ckpt.iterdir():
    if entry.name.startswith('state.'):
      shutil.rmtree(entry)

  _assert_trees_equal(checkpoints.read_params(ckpt),
                      checkpoints.read_params(_legacy('t5_1_0_tiny')))


# ---------------------------------------------------------------- writer


def test_save_t5x_checkpoint_round_trip_and_fixture_layout(tmp_path):
  params = checkpoints.read_params(_legacy('t5_1_1_tiny'))
  written = checkpoints.save_t5x_checkpoint(params, tmp_path, step=0)

  assert written == str(tmp_path / 'checkpoint_0')
  assert os.listdir(tmp_path) == ['checkpoint_0']  # No temporary directory left behind.
  _assert_trees_equal(checkpoints.read_params(written), params)
  ours = serialization.msgpack_restore((tmp_path / 'checkpoint_0/checkpoint').read_bytes())
  theirs = serialization.msgpack_restore((_legacy('t5_1_1_tiny') / 'checkpoint').read_bytes())
  assert sorted(ours) == sorted(theirs) == ['optimizer', 'version']
  assert ours['version'] == theirs['version'] == 3
  assert sorted(ours['optimizer']) == sorted(theirs['optimizer']) == ['state', 'target']
  assert ours['optimizer']['target'] == theirs['optimizer']['target']  # Same specs, key for key.
  step = ours['optimizer']['state']['step']
  assert (step.dtype, step.shape, int(step)) == (theirs['optimizer']['state']['step'].dtype, (), 0)
  folders = sorted(p.name for p in (tmp_path / 'checkpoint_0').iterdir() if p.is_dir())
  # target.* and, for the default Adafactor state, state.param_states.*.v (t5x_train_state_test).
  assert folders == sorted(p.name for p in _legacy('t5_1_1_tiny').iterdir() if p.is_dir())
  for folder in folders:
    ours_zarray = json.loads((tmp_path / 'checkpoint_0' / folder / '.zarray').read_text())
    theirs_zarray = json.loads((_legacy('t5_1_1_tiny') / folder / '.zarray').read_text())
    assert ours_zarray == theirs_zarray, folder


def test_save_t5x_checkpoint_inline_bfloat16_and_chunked_msgpack(tmp_path, monkeypatch):
  params = checkpoints.read_params(_legacy('t5_1_0_tiny'))
  bf16 = checkpoints.cast_params(params, jnp.bfloat16)
  monkeypatch.setattr(serialization, 'MAX_CHUNK_SIZE', 1024)  # Forces chunked msgpack arrays.
  path = checkpoints.save_t5x_checkpoint(bf16, tmp_path, step=7, inline_max_bytes=2**30)
  monkeypatch.undo()

  assert os.listdir(path) == ['checkpoint']
  assert b'__msgpack_chunked_array__' in (tmp_path / 'checkpoint_7/checkpoint').read_bytes()
  _assert_trees_equal(checkpoints.read_params(path), bf16)


def test_save_t5x_checkpoint_refuses_existing_and_cleans_up_on_failure(tmp_path):
  params = {'encoder': {'a': np.ones((2, 3), np.float32)}}
  checkpoints.save_t5x_checkpoint(params, tmp_path, step=1)
  with pytest.raises(FileExistsError, match='checkpoint_1'):
    checkpoints.save_t5x_checkpoint(params, tmp_path, step=1)
  with pytest.raises(TypeError, match='encoder/b'):
    checkpoints.save_t5x_checkpoint({'encoder': {'a': np.ones(2), 'b': np.array(['x'])}},
                                    tmp_path, step=2)
  assert sorted(os.listdir(tmp_path)) == ['checkpoint_1']


@pytest.mark.parametrize('umask, mode', [(0o022, 0o755), (0o077, 0o700), (0o002, 0o775)])
def test_checkpoint_folders_follow_the_umask(tmp_path, umask, mode):
  params = {'a': np.zeros((2, 3), np.float32)}
  old = os.umask(umask)
  try:
    path = checkpoints.save_t5x_checkpoint(params, str(tmp_path), 1, optimizer_state=None)
  finally:
    os.umask(old)
  assert os.stat(path).st_mode & 0o777 == mode
  assert os.stat(os.path.join(path, 'target.a')).st_mode & 0o777 == mode


# ---------------------------------------------------------------- bad input


def test_missing_array_folder_names_parameter_and_path(tmp_path):
  ckpt = _writable_copy(_legacy('t5_1_0_tiny'), tmp_path / 'checkpoint_0')
  shutil.rmtree(ckpt / 'target.encoder.layers_1.mlp.wo.kernel')

  with pytest.raises(FileNotFoundError) as e:
    checkpoints.load_params(ckpt)
  assert 'encoder/layers_1/mlp/wo/kernel' in str(e.value)
  assert str(ckpt / 'target.encoder.layers_1.mlp.wo.kernel') in str(e.value)


def test_truncated_msgpack_names_the_file(tmp_path):
  ckpt = _writable_copy(_legacy('t5_1_0_tiny'), tmp_path / 'checkpoint_0')
  data = (ckpt / 'checkpoint').read_bytes()
  (ckpt / 'checkpoint').write_bytes(data[:len(data) // 2])

  with pytest.raises(checkpoints.CheckpointReadError, match=str(ckpt / 'checkpoint')):
    checkpoints.load_params(ckpt)


def test_corrupt_or_missing_zarr_chunk_names_parameter(tmp_path):
  ckpt = _writable_copy(_legacy('t5_1_0_tiny'), tmp_path / 'checkpoint_0')
  (ckpt / 'target.decoder.layers_0.mlp.wi.kernel' / '0.0').write_bytes(b'not gzip')
  os.remove(ckpt / 'target.encoder.encoder_norm.scale' / '0')

  with pytest.raises(checkpoints.CheckpointReadError, match='decoder/layers_0/mlp/wi/kernel'):
    checkpoints.read_params(ckpt)
  (ckpt / 'target.decoder.layers_0.mlp.wi.kernel' / '0.0').write_bytes(
      (_legacy('t5_1_0_tiny') / 'target.decoder.layers_0.mlp.wi.kernel' / '0.0').read_bytes())
  with pytest.raises(FileNotFoundError, match='encoder/encoder_norm/scale'):
    checkpoints.read_params(ckpt)


@pytest.fixture(name='t5_1_0')
def _t5_1_0_params():
  return checkpoints.flatten_params(checkpoints.read_params(_legacy('t5_1_0_tiny')))


def test_wrong_shape_lists_both_shapes(tmp_path, t5_1_0):
  t5_1_0['encoder/layers_0/mlp/wi/kernel'] = np.zeros((48, 95), np.float32)
  path = checkpoints.save_t5x_checkpoint(checkpoints.unflatten_params(t5_1_0), tmp_path, 0)

  with pytest.raises(checkpoints.CheckpointMismatchError) as e:
    checkpoints.load_params(path, _network_config('t5_1_0_tiny'))
  assert e.value.mismatched == {'encoder/layers_0/mlp/wi/kernel': ((48, 95), (48, 96))}
  assert (e.value.missing, e.value.unexpected) == ([], [])
  assert 'encoder/layers_0/mlp/wi/kernel: checkpoint (48, 95) != expected (48, 96)' in str(e.value)


def test_unknown_parameter_is_listed(tmp_path, t5_1_0):
  t5_1_0['encoder/layers_0/extra/kernel'] = np.zeros((2, 2), np.float32)
  path = checkpoints.save_t5x_checkpoint(checkpoints.unflatten_params(t5_1_0), tmp_path, 0)

  with pytest.raises(checkpoints.CheckpointMismatchError) as e:
    checkpoints.load_params(path)
  assert (e.value.missing, e.value.unexpected, e.value.mismatched) == (
      [], ['encoder/layers_0/extra/kernel'], {})
  assert 'unexpected: encoder/layers_0/extra/kernel' in str(e.value)


def test_one_error_lists_missing_unexpected_and_misshaped(tmp_path, t5_1_0):
  del t5_1_0['decoder/layers_1/mlp/wo/kernel']
  t5_1_0['decoder/logits_dense/kernel'] = np.zeros((48, 100), np.float32)
  t5_1_0['encoder/relpos_bias/rel_embedding'] = np.zeros((3, 31), np.float32)
  path = checkpoints.save_t5x_checkpoint(checkpoints.unflatten_params(t5_1_0), tmp_path, 0)

  with pytest.raises(checkpoints.CheckpointMismatchError) as e:
    checkpoints.load_params(path, _network_config('t5_1_0_tiny'))
  assert e.value.missing == ['decoder/layers_1/mlp/wo/kernel']
  assert e.value.unexpected == ['decoder/logits_dense/kernel']
  assert e.value.mismatched == {'encoder/relpos_bias/rel_embedding': ((3, 31), (3, 32))}
  assert path in str(e.value)


def test_config_mismatch_lists_every_difference():
  with pytest.raises(checkpoints.CheckpointMismatchError) as e:
    checkpoints.load_params(_legacy('t5_1_1_tiny'), _network_config('t5_1_0_tiny'))
  assert 'decoder/logits_dense/kernel' in e.value.unexpected
  assert 'encoder/layers_0/mlp/wi/kernel' in e.value.missing
  assert e.value.mismatched['token_embedder/embedding'] == ((128, 64), (100, 48))


def test_float64_needs_explicit_permission(tmp_path, t5_1_0):
  t5_1_0['encoder/encoder_norm/scale'] = t5_1_0['encoder/encoder_norm/scale'].astype(np.float64)
  path = checkpoints.save_t5x_checkpoint(checkpoints.unflatten_params(t5_1_0), tmp_path, 0)

  with pytest.raises(checkpoints.CheckpointDtypeError, match='encoder/encoder_norm/scale: float64'):
    checkpoints.load_params(path)
  params, _ = checkpoints.load_params(
      path, source_dtypes=checkpoints.DEFAULT_SOURCE_DTYPES + ('float64',))
  assert params['encoder']['encoder_norm']['scale'].dtype == np.float32


def test_missing_checkpoint_names_the_path(tmp_path):
  with pytest.raises(FileNotFoundError, match=str(tmp_path / 'nope')):
    checkpoints.load_params(tmp_path / 'nope')
  with pytest.raises(FileNotFoundError, match=str(tmp_path / 'nope' / 'checkpoint')):
    checkpoints.read_params(tmp_path / 'nope', format='t5x')
  with pytest.raises(FileNotFoundError, match=str(tmp_path / 'nope')):
    checkpoints.read_params(tmp_path / 'nope', format='t5x_orbax')


def test_non_float_dtype_is_refused_before_reading():
  with pytest.raises(ValueError, match=r"PARAMS_DTYPE\)='int8' is not a floating dtype"):
    checkpoints.load_params('/no/such/checkpoint', dtype='int8')
  with pytest.raises(ValueError, match='T5Config.dtype'):
    network.T5Config(vocab_size=8, dtype='int32')


def test_plain_file_as_checkpoint(tmp_path):
  path = tmp_path / 'a_file'
  path.write_text('x')
  with pytest.raises(ValueError, match=rf'{path} is a file, not a checkpoint'):
    checkpoints.load_params(str(path))


def _nan_params(config: network.T5Config) -> dict:
  rng = np.random.default_rng(0)
  params = {k: rng.standard_normal(v.shape).astype(np.float32)
            for k, v in checkpoints.flatten_params(network.param_shapes(config)).items()}
  params['encoder/layers_0/attention/query/kernel'][1, 2] = np.nan
  return checkpoints.unflatten_params(params)


@pytest.mark.parametrize('layout', ['zarr', 'msgpack', 'orbax'])
def test_nan_weights_are_refused_naming_parameter_and_checkpoint(layout, tmp_path):
  config = network.T5Config(vocab_size=32, emb_dim=8, num_heads=2, num_encoder_layers=1,
                            num_decoder_layers=1, head_dim=4, mlp_dim=16)
  params = _nan_params(config)
  if layout == 'orbax':
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    path = tmp_path / 'checkpoint_1'
    ocp.PyTreeCheckpointer().save(str(path / 'state'),
                                  args=ocp.args.PyTreeSave({'target': params}))
  else:
    path = pathlib.Path(checkpoints.save_t5x_checkpoint(
        params, str(tmp_path), 1, inline_max_bytes=0 if layout == 'zarr' else 1 << 30))
  with pytest.raises(ValueError, match=rf'checkpoint {path} has non-finite values .* encoder/'
                                       r'layers_0/attention/query/kernel \(1 of 64 values\)'):
    checkpoints.load_params(str(path), config)
  loaded, _ = checkpoints.load_params(str(path), config, check_finite=False)  # The opt-out.
  assert np.isnan(loaded['encoder']['layers_0']['attention']['query']['kernel'][1, 2])


def test_orbax_without_manifest(tmp_path):
  path = _writable_copy(TESTDATA / 't5_1_0_tiny' / 'orbax' / 'checkpoint_0',
                       tmp_path / 'checkpoint_0')
  os.remove(path / 'state' / 'manifest.ocdbt')
  with pytest.raises(checkpoints.CheckpointReadError,
                     match=rf'Orbax checkpoint {path / "state"}: its metadata lists no arrays'):
    checkpoints.read_params(str(path))


def test_a_checkpoint_declaring_a_huge_embedding_is_refused_before_allocating(tmp_path):
  config = network.T5Config(vocab_size=32, emb_dim=8, num_heads=2, num_encoder_layers=1,
                            num_decoder_layers=1, head_dim=4, mlp_dim=16,
                            logits_via_embedding=True)
  params = checkpoints.unflatten_params({
      k: np.zeros(v.shape, np.float32)
      for k, v in checkpoints.flatten_params(network.param_shapes(config)).items()})
  path = pathlib.Path(checkpoints.save_t5x_checkpoint(params, str(tmp_path), 1,
                                                      optimizer_state=None))
  rows = 10**12  # 32 TB of float32: more than any host.
  contents = serialization.msgpack_restore((path / 'checkpoint').read_bytes())
  contents['optimizer']['target']['token_embedder']['embedding']['metadata']['shape'] = [rows, 8]
  (path / 'checkpoint').write_bytes(serialization.msgpack_serialize(contents))
  zarray = path / 'target.token_embedder.embedding' / '.zarray'
  zarray.write_text(json.dumps({**json.loads(zarray.read_text()), 'shape': [rows, 8]}))
  for mesh in (None, 'eval'):
    if mesh:
      from t5align import partitioning  # pylint: disable=g-import-not-at-top
      mesh = partitioning.eval_mesh(1)
    with pytest.raises(memory.DoesNotFitError,
                       match=rf'checkpoint {path} declares arrays of 2\.98e\+04 GiB in float32 '
                             r'for this process, .* the largest: token_embedder/embedding '
                             rf'\({rows}, 8\)'):
      checkpoints.load_params(str(path), mesh=mesh)
  assert checkpoints.embedding_rows(str(path)) == rows


# ---------------------------------------------------------------- tensorstore spec resolution


def _spec(kvstore, **extra):
  return {'driver': 'zarr', 'dtype': 'float32', 'kvstore': kvstore,
          'metadata': {'chunks': [4, 8], 'compressor': {'id': 'gzip', 'level': 1},
                       'shape': [4, 8]}, **extra}


@pytest.mark.parametrize('spec,checkpoint_dir,kvstore', [
    # Relative kvstore path, as written by current t5x for local checkpoints.
    (_spec({'driver': 'file', 'path': 'target.a.kernel/'}), '/ckpt/checkpoint_5',
     {'driver': 'file', 'path': '/ckpt/checkpoint_5/target.a.kernel/'}),
    (_spec({'driver': 'file', 'path': 'target.a.kernel/'}), 'gs://bkt/model/checkpoint_5',
     {'driver': 'gcs', 'bucket': 'bkt', 'path': 'model/checkpoint_5/target.a.kernel/'}),
    # gcs with the dummy bucket: the checkpoint's own location, remote or local.
    (_spec({'driver': 'gcs', 'bucket': 't5x-dummy-bucket', 'path': 'target.a.kernel'}),
     'gs://bkt/model/checkpoint_5',
     {'driver': 'gcs', 'bucket': 'bkt', 'path': 'model/checkpoint_5/target.a.kernel/'}),
    (_spec({'driver': 'gcs', 'bucket': 't5x-dummy-bucket', 'path': 'target.a.kernel'}),
     '/ckpt/checkpoint_5', {'driver': 'file', 'path': '/ckpt/checkpoint_5/target.a.kernel/'}),
    # Older specs: top-level 'path' beside a path-less kvstore.
    (_spec({'driver': 'gcs', 'bucket': 't5x-dummy-bucket'}, path='target.a.kernel'),
     'gs://bkt/model/checkpoint_5',
     {'driver': 'gcs', 'bucket': 'bkt', 'path': 'model/checkpoint_5/target.a.kernel/'}),
    (_spec({'driver': 'file'}, path='target.a.kernel'), '/ckpt/checkpoint_5',
     {'driver': 'file', 'path': '/ckpt/checkpoint_5/target.a.kernel/'}),
    # Absolute paths and real buckets are kept.
    (_spec({'driver': 'gfile', 'path': 'gs://other/x/target.a.kernel'}), '/ckpt/checkpoint_5',
     {'driver': 'gcs', 'bucket': 'other', 'path': 'x/target.a.kernel/'}),
    (_spec({'driver': 'file', 'path': '/abs/target.a.kernel'}), 'gs://bkt/checkpoint_5',
     {'driver': 'file', 'path': '/abs/target.a.kernel/'}),
    (_spec({'driver': 'gcs', 'bucket': 'real', 'path': 'm/target.a.kernel'}), '/ckpt/checkpoint_5',
     {'driver': 'gcs', 'bucket': 'real', 'path': 'm/target.a.kernel/'}),
])
def test_resolve_ts_spec(spec, checkpoint_dir, kvstore):
  resolved = checkpoints.resolve_ts_spec(spec, checkpoint_dir)

  assert resolved == {'driver': 'zarr', 'dtype': 'float32', 'kvstore': kvstore,
                      'metadata': {'shape': [4, 8]}, 'fill_missing_data_reads': False}
  assert spec['metadata']['chunks'] == [4, 8]  # The input is not modified.


def test_resolve_ts_spec_rejects_unknown_driver_and_uint16():
  with pytest.raises(checkpoints.CheckpointReadError, match="'s3'"):
    checkpoints.resolve_ts_spec(_spec({'driver': 's3', 'path': 'x'}), '/ckpt')
  with pytest.raises(checkpoints.CheckpointReadError, match='uint16'):
    checkpoints.resolve_ts_spec(
        {**_spec({'driver': 'file', 'path': 'x'}), 'dtype': 'uint16'}, '/ckpt')


def test_checkpoint_paths_and_kvstore_spec():
  assert checkpoints.t5x_checkpoint_paths('gs://b/m/checkpoint_9') == (
      'gs://b/m/checkpoint_9/checkpoint', 'gs://b/m/checkpoint_9')
  assert checkpoints.t5x_checkpoint_paths('gs://b/m/checkpoint_9/checkpoint') == (
      'gs://b/m/checkpoint_9/checkpoint', 'gs://b/m/checkpoint_9')
  assert checkpoints.kvstore_spec('gs://b/m/checkpoint_9/') == {
      'driver': 'gcs', 'bucket': 'b', 'path': 'm/checkpoint_9/'}


# ---------------------------------------------------------------- Mesh-TF


def _mesh_tf_variables(rng, gated: bool) -> dict[str, np.ndarray]:
  e, hd, h, f, v = 8, 6, 2, 10, 20
  norm = 'rms_norm' if gated else 'layer_norm'
  mlp_in = ('wi_0', 'wi_1') if gated else ('wi',)
  names = {'shared/embedding': (v, e), 'global_step': (),
           f"encoder/{'rms_norm' if gated else 'final_layer_norm'}/scale": (e,),
           f"decoder/{'rms_norm' if gated else 'final_layer_norm'}/scale": (e,)}
  if gated:
    names['decoder/logits/kernel'] = (e, v)
  for stack, sublayers in (('encoder', ('SelfAttention', 'DenseReluDense')),
                           ('decoder', ('SelfAttention', 'EncDecAttention', 'DenseReluDense'))):
    names[f'{stack}/block_000/layer_000/SelfAttention/relative_attention_bias'] = (h, 32)
    for b in range(2):
      for i, module in enumerate(sublayers):
        prefix = f'{stack}/block_{b:03d}/layer_{i:03d}'
        names[f'{prefix}/{norm}/scale'] = (e,)
        if module == 'DenseReluDense':
          names.update({f'{prefix}/DenseReluDense/{w}/kernel': (e, f) for w in mlp_in})
          names[f'{prefix}/DenseReluDense/wo/kernel'] = (f, e)
        else:
          names.update({f'{prefix}/{module}/{p}': (e, h * hd) for p in 'qkv'})
          names[f'{prefix}/{module}/o'] = (h * hd, e)
  variables = {n: rng.standard_normal(s).astype(np.float32) for n, s in names.items()}
  variables.update({f'{n}_slot_vc': np.zeros(3, np.float32) for n in list(names)[:3]})
  variables['encoder/block_000/layer_000/SelfAttention/q_slot_v'] = np.zeros(3, np.float32)
  return variables


@pytest.mark.parametrize('gated', [False, True])
def test_params_from_mesh_tf(gated):
  tf_vars = _mesh_tf_variables(np.random.default_rng(0), gated)
  norm = 'rms_norm' if gated else 'layer_norm'
  expected = {'token_embedder/embedding': tf_vars['shared/embedding']}
  for stack in ('encoder', 'decoder'):
    expected[f'{stack}/relpos_bias/rel_embedding'] = tf_vars[
        f'{stack}/block_000/layer_000/SelfAttention/relative_attention_bias']
    final = f"{stack}/{'rms_norm' if gated else 'final_layer_norm'}/scale"
    expected[f"{stack}/{stack}_norm/scale"] = tf_vars[final]
  if gated:
    expected['decoder/logits_dense/kernel'] = tf_vars['decoder/logits/kernel']
  for b in range(2):
    enc, dec = f'encoder/block_{b:03d}', f'decoder/block_{b:03d}'
    out_e, out_d = f'encoder/layers_{b}', f'decoder/layers_{b}'
    expected[f'{out_e}/pre_attention_layer_norm/scale'] = tf_vars[f'{enc}/layer_000/{norm}/scale']
    expected[f'{out_e}/pre_mlp_layer_norm/scale'] = tf_vars[f'{enc}/layer_001/{norm}/scale']
    expected[f'{out_d}/pre_self_attention_layer_norm/scale'] = tf_vars[
        f'{dec}/layer_000/{norm}/scale']
    expected[f'{out_d}/pre_cross_attention_layer_norm/scale'] = tf_vars[
        f'{dec}/layer_001/{norm}/scale']
    expected[f'{out_d}/pre_mlp_layer_norm/scale'] = tf_vars[f'{dec}/layer_002/{norm}/scale']
    for tf_name, t5x_name in zip('qkvo', ('query', 'key', 'value', 'out')):
      expected[f'{out_e}/attention/{t5x_name}/kernel'] = tf_vars[
          f'{enc}/layer_000/SelfAttention/{tf_name}']
      expected[f'{out_d}/self_attention/{t5x_name}/kernel'] = tf_vars[
          f'{dec}/layer_000/SelfAttention/{tf_name}']
      expected[f'{out_d}/encoder_decoder_attention/{t5x_name}/kernel'] = tf_vars[
          f'{dec}/layer_001/EncDecAttention/{tf_name}']
    for w in (('wi_0', 'wi_1', 'wo') if gated else ('wi', 'wo')):
      expected[f'{out_e}/mlp/{w}/kernel'] = tf_vars[f'{enc}/layer_001/DenseReluDense/{w}/kernel']
      expected[f'{out_d}/mlp/{w}/kernel'] = tf_vars[f'{dec}/layer_002/DenseReluDense/{w}/kernel']

  params = checkpoints.params_from_mesh_tf(tf_vars)
  _assert_trees_equal(params, checkpoints.unflatten_params(expected))
  assert checkpoints.infer_config(params) == {
      'vocab_size': 20, 'emb_dim': 8, 'num_heads': 2, 'num_encoder_layers': 2,
      'num_decoder_layers': 2, 'head_dim': 6, 'mlp_dim': 10,
      'mlp_activations': ('gelu', 'linear') if gated else ('relu',),
      'logits_via_embedding': not gated}


def test_mesh_tf_unknown_variable_is_reported_by_the_strict_check():
  tf_vars = _mesh_tf_variables(np.random.default_rng(0), gated=False)
  tf_vars['encoder/block_001/layer_000/SelfAttention/relative_attention_bias'] = np.zeros((2, 32))
  params = checkpoints.params_from_mesh_tf(tf_vars)
  config = network.T5Config(**checkpoints.infer_config(params))

  with pytest.raises(checkpoints.CheckpointMismatchError) as e:
    checkpoints.check_params(params, network.param_shapes(config))
  assert e.value.unexpected == [
      'unmapped/encoder/block_001/layer_000/SelfAttention/relative_attention_bias']


def test_read_mesh_tf_without_tensorflow_says_so():
  try:
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
    pytest.skip('tensorflow is installed')
  except ImportError:
    pass
  with pytest.raises(ImportError, match='tensorflow'):
    checkpoints.read_mesh_tf_checkpoint('/nonexistent/model.ckpt-1')


@pytest.mark.tensorflow
def test_read_real_mesh_tf_checkpoint(tmp_path):
  """A name-based TF checkpoint, as Mesh-TF's Saver writes it, with optimizer slots and step."""
  tf = pytest.importorskip('tensorflow')
  tf_vars = _mesh_tf_variables(np.random.default_rng(0), gated=True)
  optimizer = {'global_step': np.array(7, np.int64),
               'shared/embedding_slot_vr': np.ones((20,), np.float32),
               'encoder/block_000/layer_000/SelfAttention/q_slot_vc': np.ones((6,), np.float32)}
  everything = {**tf_vars, **optimizer}
  prefix = str(tmp_path / 'model.ckpt-7')
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=list(everything),
                    shape_and_slices=[''] * len(everything),
                    tensors=[tf.constant(v) for v in everything.values()])
  assert checkpoints.detect_format(prefix) == 'mesh_tf'
  params, config = checkpoints.load_params(prefix)
  _assert_trees_equal(params, checkpoints.params_from_mesh_tf(tf_vars))
  assert config.mlp_activations == ('gelu', 'linear') and not config.logits_via_embedding


@pytest.mark.tensorflow
def test_garbage_mesh_tf_index(tmp_path):
  pytest.importorskip('tensorflow')
  (tmp_path / 'model.ckpt-1.index').write_bytes(b'garbage' * 10)
  with pytest.raises(checkpoints.CheckpointReadError,
                     match=rf'Cannot read Mesh-TF checkpoint {tmp_path / "model.ckpt-1"}'):
    checkpoints.read_params(str(tmp_path / 'model.ckpt-1'))


# ---------------------------------------------------------------- HuggingFace

_HF_SIZES = dict(vocab_size=40, d_model=16, d_kv=6, num_heads=2, d_ff=24, num_layers=2,
                 num_decoder_layers=3)


def _hf_expected(sd: dict[str, np.ndarray], head: np.ndarray | None) -> dict[str, np.ndarray]:
  """Independent numpy re-derivation of the T5X tree from HF tensors (`head`: lm_head or None)."""
  exp = {'token_embedder/embedding': sd['shared.weight'],
         'encoder/encoder_norm/scale': sd['encoder.final_layer_norm.weight'],
         'decoder/decoder_norm/scale': sd['decoder.final_layer_norm.weight']}
  if head is not None:
    exp['decoder/logits_dense/kernel'] = head.T
  for stack, n in (('encoder', 2), ('decoder', 3)):
    exp[f'{stack}/relpos_bias/rel_embedding'] = sd[
        f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight'].T
    for i in range(n):
      hf, t5x = f'{stack}.block.{i}.layer', f'{stack}/layers_{i}'
      attention = ([(0, 'SelfAttention', 'attention')] if stack == 'encoder' else
                   [(0, 'SelfAttention', 'self_attention'),
                    (1, 'EncDecAttention', 'encoder_decoder_attention')])
      for j, hf_name, t5x_name in attention:
        for a, b in zip('qkvo', ('query', 'key', 'value', 'out')):
          exp[f'{t5x}/{t5x_name}/{b}/kernel'] = sd[f'{hf}.{j}.{hf_name}.{a}.weight'].T
      norms = (['pre_attention_layer_norm', 'pre_mlp_layer_norm'] if stack == 'encoder' else
               ['pre_self_attention_layer_norm', 'pre_cross_attention_layer_norm',
                'pre_mlp_layer_norm'])
      for j, norm in enumerate(norms):
        exp[f'{t5x}/{norm}/scale'] = sd[f'{hf}.{j}.layer_norm.weight']
      mlp = len(norms) - 1
      for w in ('wi', 'wi_0', 'wi_1', 'wo'):
        if f'{hf}.{mlp}.DenseReluDense.{w}.weight' in sd:
          exp[f'{t5x}/mlp/{w}/kernel'] = sd[f'{hf}.{mlp}.DenseReluDense.{w}.weight'].T
  return exp


def _write_flax_msgpack(sd: dict[str, np.ndarray], path: pathlib.Path):
  """HF Flax naming: nn.Dense 'kernel' [in, out], nn.Embed 'embedding', T5LayerNorm 'weight'."""
  flat = {}
  for name, value in sd.items():
    module = name.removesuffix('.weight').split('.')
    if name == 'shared.weight' or name.endswith('relative_attention_bias.weight'):
      flat['/'.join(module + ['embedding'])] = value
    elif 'layer_norm' in name:
      flat['/'.join(module + ['weight'])] = value
    else:
      flat['/'.join(module + ['kernel'])] = value.T
  path.write_bytes(serialization.msgpack_serialize(checkpoints.unflatten_params(flat)))


@pytest.fixture(scope='module', name='hf_dirs')
def _hf_dirs(tmp_path_factory):
  """Tiny HF checkpoints: T5 1.0-style (relu, tied) and T5 1.1-style (gated-gelu, untied)."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('hf')
  torch.manual_seed(0)
  dirs, tensors = {}, {}

  relu = transformers.T5ForConditionalGeneration(
      transformers.T5Config(feed_forward_proj='relu', **_HF_SIZES))
  relu.save_pretrained(root / 'relu_safetensors')
  sd = {k: v.detach().clone().contiguous() for k, v in relu.state_dict().items()}
  os.makedirs(root / 'relu_bin')
  torch.save(sd, root / 'relu_bin' / 'pytorch_model.bin')
  shutil.copy(root / 'relu_safetensors' / 'config.json', root / 'relu_bin')
  dirs.update(relu_safetensors=root / 'relu_safetensors', relu_bin=root / 'relu_bin')
  tensors['relu'] = ({k: v.numpy() for k, v in sd.items()}, None)

  # transformers >= 5 always builds tied models (its T5Config forces tie_word_embeddings=True);
  # an untied one is written by hand.
  gated = transformers.T5ForConditionalGeneration(
      transformers.T5Config(feed_forward_proj='gated-gelu', tie_word_embeddings=False,
                            **_HF_SIZES))
  sd = {k: v.detach().clone().contiguous() for k, v in gated.state_dict().items()
        if not k.endswith('embed_tokens.weight')}
  sd['lm_head.weight'] = torch.randn(_HF_SIZES['vocab_size'], _HF_SIZES['d_model'])
  config = gated.config.to_dict()
  config.pop('scale_decoder_outputs', None)
  config['tie_word_embeddings'] = False  # As in released T5 1.1 / Flan config.json files.
  os.makedirs(root / 'gated_safetensors')
  save_file(sd, root / 'gated_safetensors' / 'model.safetensors', metadata={'format': 'pt'})
  (root / 'gated_safetensors' / 'config.json').write_text(json.dumps(config))
  reloaded = transformers.T5ForConditionalGeneration.from_pretrained(root / 'gated_safetensors')
  assert torch.equal(reloaded.lm_head.weight, sd['lm_head.weight'])  # HF sees it untied.
  reloaded.save_pretrained(root / 'gated_sharded', max_shard_size='20KB')
  assert (root / 'gated_sharded' / 'model.safetensors.index.json').exists()
  os.makedirs(root / 'gated_flax')
  np_sd = {k: v.numpy() for k, v in sd.items()}
  _write_flax_msgpack(np_sd, root / 'gated_flax' / 'flax_model.msgpack')
  shutil.copy(root / 'gated_safetensors' / 'config.json', root / 'gated_flax')
  dirs.update(gated_safetensors=root / 'gated_safetensors', gated_sharded=root / 'gated_sharded',
              gated_flax=root / 'gated_flax')
  tensors['gated'] = (np_sd, np_sd['lm_head.weight'])
  return dirs, tensors


# NOTE: slow, as the fixture imports torch and transformers and builds two models: 3.5 s on the
# idle 2-core VM, 10.2 s (over the fast lane's limit) when the disk cache was cold.
@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize('kind', ['relu_safetensors', 'relu_bin', 'gated_safetensors',
                                  'gated_sharded', 'gated_flax'])
def test_hf_checkpoint_maps_every_parameter(hf_dirs, kind):
  dirs, tensors = hf_dirs
  sd, head = tensors[kind.split('_')[0]]

  params = checkpoints.read_params(dirs[kind])
  assert checkpoints.detect_format(dirs[kind]) == 'hf'
  _assert_trees_equal(params, checkpoints.unflatten_params(_hf_expected(sd, head)))
  loaded, config = checkpoints.load_params(dirs[kind])
  _assert_trees_equal(loaded, params)
  gated = kind.startswith('gated')
  assert (config.mlp_activations, config.logits_via_embedding) == (
      (('gelu', 'linear'), False) if gated else (('relu',), True))
  assert (config.num_encoder_layers, config.num_decoder_layers, config.num_heads,
          config.head_dim, config.emb_dim, config.mlp_dim) == (2, 3, 2, 6, 16, 24)


@pytest.mark.slow  # The fixture's imports (above).
@pytest.mark.torch
def test_hf_unscaled_tied_head_becomes_logits_dense(hf_dirs):
  sd, _ = hf_dirs[1]['relu']
  params = checkpoints.params_from_hf_state_dict(sd, {'scale_decoder_outputs': False})
  np.testing.assert_array_equal(params['decoder']['logits_dense']['kernel'], sd['shared.weight'].T)
  with pytest.raises(checkpoints.CheckpointReadError, match='lm_head'):
    checkpoints.params_from_hf_state_dict(
        {**sd, 'lm_head.weight': sd['shared.weight'] + 1}, {'tie_word_embeddings': True})


def test_invalid_hf_config(tmp_path):
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  save_file({'shared.weight': np.zeros((4, 2), np.float32)}, str(tmp_path / 'model.safetensors'))
  (tmp_path / 'config.json').write_text('{"d_model": 8,\n oops}')
  with pytest.raises(checkpoints.CheckpointReadError,
                     match=rf'HF config {tmp_path / "config.json"}:2: not valid JSON'):
    checkpoints.load_params(str(tmp_path))


def test_hf_layer_norm_epsilon_other_than_t5s_is_refused():
  with pytest.raises(ValueError, match=r'layer_norm_epsilon=1e-05; T5X .* use 1e-6'):
    checkpoints.hf_config_hints({'layer_norm_epsilon': 1e-5})
  assert checkpoints.hf_config_hints({'layer_norm_epsilon': 1e-6}) == {'mlp_activations': ('relu',)}


@pytest.mark.parametrize('field, value, message', [
    ('feed_forward_proj', None, r'"feed_forward_proj": null; expected a string, one of '
                                r'gated-gelu, gated-gelu_new, '),
    ('layer_norm_epsilon', '1e-6', r'"layer_norm_epsilon": "1e-6", a str; expected a JSON '
                                   r'number: 1e-06 \(no quotes\)'),
])
def test_hf_config_of_the_wrong_type(tmp_path, field, value, message):
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  save_file({'shared.weight': np.zeros((4, 2), np.float32)}, str(tmp_path / 'model.safetensors'))
  (tmp_path / 'config.json').write_text(json.dumps({'d_model': 2, field: value}))
  with pytest.raises(ValueError, match=rf'{tmp_path / "config.json"}: HF config has {message}'):
    checkpoints.load_params(str(tmp_path))


def _hf_dir(root: pathlib.Path, config: dict, *, own_head: bool = True) -> pathlib.Path:
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  root.mkdir()
  state = {'shared.weight': np.zeros((4, 2), np.float32)}
  if own_head:
    state['lm_head.weight'] = np.ones((4, 2), np.float32)
  save_file(state, str(root / 'model.safetensors'))
  (root / 'config.json').write_text(json.dumps(config))
  return root


@pytest.mark.parametrize('config, said', [
    ({'d_model': 2}, r'no "tie_word_embeddings" \(HF\'s default: true\)'),
    ({}, r'no "tie_word_embeddings" \(HF\'s default: true\)'),
    ({'d_model': 2, 'tie_word_embeddings': True}, '"tie_word_embeddings": true'),
    ({'d_model': 2, 'scale_decoder_outputs': True}, '"scale_decoder_outputs": true'),
])
def test_hf_own_head_under_a_tied_config_names_the_file_and_key(tmp_path, config, said):
  path = _hf_dir(tmp_path / 'hf', config)
  with pytest.raises(checkpoints.CheckpointReadError,
                     match=rf'{path / "config.json"}: HF config has {said}, a head tied to '
                           r'shared\.weight and scaled by d_model\*\*-0\.5, but the weights hold '
                           r'their own lm_head\.weight, .* set "tie_word_embeddings": false\.'):
    checkpoints.load_params(str(path))


@pytest.mark.parametrize('key, value, shown', [
    ('tie_word_embeddings', 'false', r'"false", a str'),
    ('tie_word_embeddings', 0, '0, a int'),
    ('scale_decoder_outputs', None, 'null, a NoneType'),
])
def test_hf_head_flag_of_the_wrong_type_names_the_file_and_key(tmp_path, key, value, shown):
  path = _hf_dir(tmp_path / 'hf', {'d_model': 2, key: value}, own_head=False)
  with pytest.raises(checkpoints.CheckpointReadError,
                     match=rf'{path / "config.json"}: HF config has "{key}": {shown}; expected '
                           r'JSON true or false \(no quotes\)\.'):
    checkpoints.load_params(str(path))


@pytest.mark.slow
@pytest.mark.torch
def test_an_int32_tensor_in_an_hf_checkpoint_names_the_checkpoint(tmp_path):
  pytest.importorskip('torch')  # transformers' models need it (the newest-jax venv has none).
  transformers = pytest.importorskip('transformers')
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  model = transformers.T5ForConditionalGeneration(transformers.T5Config(
      vocab_size=40, d_model=16, d_kv=6, num_heads=2, d_ff=24, num_layers=1,
      num_decoder_layers=1, feed_forward_proj='relu'))
  model.save_pretrained(tmp_path / 'hf')
  weights = tmp_path / 'hf' / 'model.safetensors'
  state = load_file(str(weights))
  name = 'encoder.block.0.layer.0.SelfAttention.q.weight'
  state[name] = state[name].astype(np.int32)
  save_file(state, str(weights), metadata={'format': 'pt'})
  with pytest.raises(checkpoints.CheckpointDtypeError) as e:
    checkpoints.load_params(str(tmp_path / 'hf'))
  assert str(e.value) == (
      f'Checkpoint {tmp_path / "hf"} stores parameters in dtypes other than float32, bfloat16, '
      'float16:\n  encoder/layers_0/attention/query/kernel: int32\nConvert it to one of those '
      '(an integer array holds quantized or corrupt weights); callers of '
      'checkpoints.load_params or cast_params may allow a cast with source_dtypes=.')
