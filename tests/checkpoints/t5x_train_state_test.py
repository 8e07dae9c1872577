"""`checkpoints.save_t5x_checkpoint` writes the train state t5x.train restores.

The reference is the t5x-written legacy fixture (tests/testdata/t5x/*/legacy/checkpoint_0: t5x's
Adafactor state, freshly initialized, with every parameter's `v` unfactored since no dim there
reaches 128) and, for factored parameters, the shapes t5x's `Adafactor.init_param_state` gives,
written out below.
"""
from __future__ import annotations

import json
import pathlib

from flax import serialization
import numpy as np
import pytest

from t5align import checkpoints

TESTDATA = pathlib.Path(__file__).parents[1] / 'testdata' / 't5x'


def _layout(checkpoint_dir: pathlib.Path) -> dict[str, tuple]:
  """Every msgpack leaf by path: ('zarr', shape, dtype, .zarray) or ('inline', shape, dtype)."""
  contents = serialization.msgpack_restore((checkpoint_dir / 'checkpoint').read_bytes())
  is_spec = lambda x: isinstance(x, dict) and 'kvstore' in x
  out = {}
  for path, leaf in checkpoints.flatten_params(contents, is_leaf=is_spec).items():
    if is_spec(leaf):
      folder = checkpoint_dir / leaf['kvstore']['path']
      zarray = json.loads((folder / '.zarray').read_text())
      out[path] = ('zarr', tuple(leaf['metadata']['shape']), leaf['dtype'], zarray)
    else:
      leaf = np.asarray(leaf)
      out[path] = ('inline', leaf.shape, leaf.dtype.name)
  return out


@pytest.mark.parametrize('name', ['t5_1_1_tiny', 't5_1_0_tiny'])
def test_train_state_layout_equals_t5x_s(name, tmp_path):
  fixture = TESTDATA / name / 'legacy' / 'checkpoint_0'
  params = checkpoints.read_params(fixture)
  written = pathlib.Path(checkpoints.save_t5x_checkpoint(params, tmp_path, step=0))
  ours, theirs = _layout(written), _layout(fixture)
  assert any('/param_states/' in k for k in theirs)
  assert sorted(ours) == sorted(theirs)  # Every key: version, target, step, param_states.
  wrong = {k: (ours[k], theirs[k]) for k in theirs if ours[k] != theirs[k]}
  assert not wrong, wrong
  # The state starts from zeros, as t5x initialises it.
  state = serialization.msgpack_restore((written / 'checkpoint').read_bytes())['optimizer']['state']
  leaves = checkpoints.flatten_params(state['param_states'], is_leaf=lambda x: 'kvstore' in x)
  assert all(np.all(np.asarray(v) == 0) for v in leaves.values() if not isinstance(v, dict))
  assert sorted(p.name for p in written.iterdir()) == sorted(p.name for p in fixture.iterdir())


def test_factored_state_shapes_and_placement(tmp_path):
  # t5x's heuristic: factor when the second-largest dim is >= 128; v_row drops the largest dim,
  # v_col the second largest (argsort order on ties); v then and m (no beta1) are (1,).
  params = {'token_embedder': {'embedding': np.ones((1024, 128), np.float32)},
            'decoder': {'logits_dense': {'kernel': np.ones((128, 1024), np.float32)},
                        'mlp': {'wo': {'kernel': np.ones((256, 128), np.float32)}},
                        'attention': {'query': {'kernel': np.ones((128, 128), np.float32)}},
                        'relpos_bias': {'rel_embedding': np.ones((4, 32), np.float32)},
                        'norm': {'scale': np.ones((128,), np.float32)}}}
  expected = {  # path: (v, v_row, v_col)
      'token_embedder/embedding': ((1,), (128,), (1024,)),
      'decoder/logits_dense/kernel': ((1,), (128,), (1024,)),
      'decoder/mlp/wo/kernel': ((1,), (128,), (256,)),
      'decoder/attention/query/kernel': ((1,), (128,), (128,)),
      'decoder/relpos_bias/rel_embedding': ((4, 32), (1,), (1,)),
      'decoder/norm/scale': ((128,), (1,), (1,)),
  }
  written = pathlib.Path(checkpoints.save_t5x_checkpoint(params, tmp_path, step=2400))
  layout = _layout(written)
  for path, (v, v_row, v_col) in expected.items():
    state = f'optimizer/state/param_states/{path}'
    assert layout[f'{state}/m'] == ('inline', (1,), 'float32')
    assert layout[f'{state}/v_row'] == ('inline', v_row, 'float32')
    assert layout[f'{state}/v_col'] == ('inline', v_col, 'float32')
    kind = 'inline' if v == (1,) else 'zarr'
    assert layout[f'{state}/v'][:3] == (kind, v, 'float32'), path
  assert layout['optimizer/state/step'] == ('inline', (), 'int32')


def test_params_only_and_bad_option(tmp_path):
  params = checkpoints.read_params(TESTDATA / 't5_1_0_tiny' / 'legacy' / 'checkpoint_0')
  written = pathlib.Path(checkpoints.save_t5x_checkpoint(params, tmp_path, 3, optimizer_state=None))
  assert not any('param_states' in k for k in _layout(written))
  assert all(p.name.startswith('target.') for p in written.iterdir() if p.is_dir())
  with pytest.raises(ValueError, match="optimizer_state='adam'"):
    checkpoints.save_t5x_checkpoint(params, tmp_path, 4, optimizer_state='adam')
  with pytest.raises(ValueError, match='rank 3'):
    checkpoints.adafactor_param_state((2, 3, 4))
