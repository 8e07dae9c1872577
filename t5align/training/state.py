"""Train checkpoints in MODEL_DIR: checkpoint_N/ (T5X legacy layout) with train_state_N.msgpack
(the optimizer state and step) beside it; saved, listed, restored and pruned."""
from __future__ import annotations

import glob
import os
import re
import shutil
from typing import Any

from flax import serialization
import jax
import numpy as np

from t5align import checkpoints
from t5align import network
from t5align.runtime import fileio


def train_state_path(model_dir: str, step: int) -> str:
  """MODEL_DIR/train_state_{step}.msgpack: the optimizer state and step of checkpoint_{step}."""
  return os.path.join(model_dir, f'train_state_{step}.msgpack')


def save_checkpoint(model_dir: str, step: int, params: Any, opt_state: Any) -> str:
  """Writes train_state_{step}.msgpack, then checkpoint_{step}/ (both atomic); returns the latter.

  The state goes first, so a checkpoint_N directory always has its optimizer state.
  """
  fileio.makedirs(model_dir)
  state = {'step': np.asarray(step, np.int64),
           'opt_state': serialization.to_state_dict(jax.device_get(opt_state))}
  fileio.write_atomic(train_state_path(model_dir, step), serialization.msgpack_serialize(state))
  return checkpoints.save_t5x_checkpoint(jax.device_get(params), model_dir, step)


def checkpoint_steps(model_dir: str) -> list[int]:
  """Steps with both checkpoint_N/checkpoint and train_state_N.msgpack, ascending."""
  steps = []
  for path in glob.glob(os.path.join(model_dir, 'checkpoint_*', 'checkpoint')):
    m = re.fullmatch(r'checkpoint_(\d+)', os.path.basename(os.path.dirname(path)))
    if m and os.path.exists(train_state_path(model_dir, int(m.group(1)))):
      steps.append(int(m.group(1)))
  return sorted(steps)


def restore_checkpoint(model_dir: str, step: int, config: network.T5Config,
                       opt_state_template: Any) -> tuple[dict, Any]:
  """(params, opt_state) of step `step`; params checked strictly against `config`."""
  params, _ = checkpoints.load_params(os.path.join(model_dir, f'checkpoint_{step}'), config,
                                      source_dtypes=('float32',))
  with open(train_state_path(model_dir, step), 'rb') as f:
    state = serialization.msgpack_restore(f.read())
  if int(state['step']) != step:
    raise ValueError(f'{train_state_path(model_dir, step)} holds step {int(state["step"])}.')
  opt_state = serialization.from_state_dict(opt_state_template, state['opt_state'])
  return params, opt_state


def prune(model_dir: str, keep: int) -> None:
  """Removes all but the newest `keep` checkpoints (each with its train state)."""
  for step in checkpoint_steps(model_dir)[:-keep]:
    shutil.rmtree(os.path.join(model_dir, f'checkpoint_{step}'))
    os.remove(train_state_path(model_dir, step))
