"""The retrieval T5 that ships with t5align (t5align/shipped/retrieval_t5): where, how to load it.

A model directory holds one T5X checkpoint_N/, its `VOCAB_FILE` and training.json (how it was
trained; 'input_length' is its training length L_tr). `t5align.train` writes such a directory.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import warnings

from t5align import checkpoints
from t5align import network
from t5align import vocabularies

ASSET_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'retrieval_t5')
VOCAB_FILE = 'sentencepiece.model'


def checkpoint_dir(path: str = ASSET_DIR) -> str:
  """The one `checkpoint_N/` folder (a T5X legacy checkpoint) of a model directory."""
  found = sorted(glob.glob(os.path.join(path, 'checkpoint_*')))
  if len(found) != 1:
    raise FileNotFoundError(f'expected one checkpoint_N/ in {path}; found {found}.')
  return found[0]


def load_shipped(path: str = ASSET_DIR) -> tuple[dict, network.T5Config, vocabularies.Vocabulary]:
  """(float32 params, config, vocabulary) of a model directory holding one checkpoint_N/.

  The config's encoder attention is 'auto' (materialized up to its `blockwise_threshold`
  tokens, blockwise above), as gin/models/retrieval_small.gin's: the same model from Python and
  from gin, and long inputs in O(L) memory.
  """
  params, config = checkpoints.load_params(checkpoint_dir(path))
  config = dataclasses.replace(config, attention_impl='auto')
  vocab = vocabularies.SentencePieceVocabulary(os.path.join(path, VOCAB_FILE), t5_ids=True)
  return params, config, vocab


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


def check_reference_length(checkpoint_path: str, reference_length: int,
                           what: str = 'reference_length') -> None:
  """Warns when a checkpoint's model directory records another L_tr than `reference_length`.

  Knowable for a `checkpoint_N/` inside a model directory with training.json (the shipped model,
  `t5align.train`'s exports); other checkpoints pass silently.
  """
  folder = os.path.dirname(os.path.normpath(str(checkpoint_path)))
  for model_dir in (str(checkpoint_path), folder):
    if os.path.isfile(os.path.join(model_dir, 'training.json')):
      l_tr = training_length(model_dir)
      if l_tr != reference_length:
        warnings.warn(
            f'{what}={reference_length}, but {checkpoint_path} was trained at L_tr = {l_tr} '
            f'({os.path.join(model_dir, "training.json")}): the temperatures would match the '
            f'attention at {reference_length} tokens, not at the training length. '
            f'Set {what}={l_tr}.', stacklevel=2)
      return
