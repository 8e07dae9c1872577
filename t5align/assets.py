"""The retrieval T5 that ships with t5align (t5align/assets/retrieval_t5): where, how to load it.

A model directory holds one T5X checkpoint_N/, its `VOCAB_FILE` and training.json (how it was
trained; 'input_length' is its training length L_tr). `t5align.train` writes such a directory.
"""
from __future__ import annotations

import glob
import json
import os

from t5align import checkpoints
from t5align import network
from t5align import vocab as vocab_lib

ASSET_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'assets', 'retrieval_t5')
VOCAB_FILE = 'sentencepiece.model'


def checkpoint_dir(path: str = ASSET_DIR) -> str:
  """The one `checkpoint_N/` folder (a T5X legacy checkpoint) of a model directory."""
  found = sorted(glob.glob(os.path.join(path, 'checkpoint_*')))
  if len(found) != 1:
    raise FileNotFoundError(f'expected one checkpoint_N/ in {path}; found {found}.')
  return found[0]


def load_shipped(path: str = ASSET_DIR) -> tuple[dict, network.T5Config, vocab_lib.Vocabulary]:
  """(float32 params, config, vocabulary) of a model directory holding one checkpoint_N/."""
  params, config = checkpoints.load_params(checkpoint_dir(path))
  return params, config, vocab_lib.Vocabulary(os.path.join(path, VOCAB_FILE))


def training_length(path: str = ASSET_DIR) -> int:
  """L_tr of a model directory: training.json's 'input_length'; errors name the file."""
  record = os.path.join(path, 'training.json')
  try:
    with open(record, encoding='utf-8') as f:
      value = json.load(f)['input_length']
  except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
    raise ValueError(f'{record}: cannot read its "input_length" ({type(e).__name__}: {e}).') from e
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f'{record}: "input_length" must be a positive integer; got {value!r}.')
  return value
