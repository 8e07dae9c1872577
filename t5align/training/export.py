"""What a training run leaves for use: the final weights in a dtype with their vocabulary
(`export`), and training.json beside them (`training_record`)."""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from t5align import checkpoints
from t5align.runtime import fileio
from t5align.shipped import assets


def export(params: Any, vocab_path: str | Sequence[str], export_dir: str, step: int,
           dtype: str) -> str:
  """Writes `export_dir/checkpoint_{step}` (params cast to `dtype`) and the vocabulary: a
  SentencePiece file (a path, or a list of one) as sentencepiece.model, a tokenizer of other
  files (a HuggingFace tokenizer's; local or `gs://`) under their own names."""
  cast = jax.tree.map(lambda x: np.asarray(x).astype(jnp.dtype(dtype)), jax.device_get(params))
  path = checkpoints.save_t5x_checkpoint(cast, export_dir, step)
  files = [vocab_path] if isinstance(vocab_path, (str, os.PathLike)) else list(vocab_path)
  one_model = len(files) == 1 and not os.fspath(files[0]).endswith('.json')
  for file in files:
    name = assets.VOCAB_FILE if one_model else os.path.basename(os.fspath(file))
    fileio.write_atomic(os.path.join(export_dir, name), fileio.read_bytes(os.fspath(file)))
  return path


def training_record(*, input_length: int, summary: Mapping[str, Any],
                    command: str | None = None) -> dict[str, Any]:
  """training.json beside exported weights: L_tr (what calibration aligns to), the command (if
  given), the run's summary and gin's configuration (call while it is still parsed)."""
  return {'input_length': input_length, 'command': command, 'summary': dict(summary),
          'gin_config': gin.config_str()}
