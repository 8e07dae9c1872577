"""What the gin/t5x files compute in Python (t5x itself is never imported here).

The gin/t5x files run t5x's own binaries (`t5x.eval`, `t5x.train`) with t5align's network and
seqio tasks; they reference these functions through gin's dynamic registration:
- `task_feature_lengths`: t5x's TASK_FEATURE_LENGTHS with the targets length = the task's
  greedy decoding length (as `t5align.eval` decodes), inputs uncut.
- `check_no_temperature`: the refusal of TEMPERATURE together with gin/t5x/schedule.gin.
- `shipped_vocabulary`, `shipped_checkpoint`: the model in t5align/shipped/retrieval_t5.
- `longest_inputs`: t5x.infer's input length (gin/t5x/infer.gin), the longest of the split.
"""
from __future__ import annotations

import os
from typing import Any

from t5align.shipped import assets
from t5align.shipped.assets import ASSET_DIR
from t5align.shipped.assets import VOCAB_FILE


def task_feature_lengths(mixture_or_task_name: str,
                         inputs: int | None = None) -> dict[str, int]:
  """t5x's `task_feature_lengths` for greedy evaluation of a t5align task or mixture.

  'targets' is the task's `max_decode_length` (seqio_tasks.catalog), which t5x's
  EncoderDecoderModel uses as its number of decoding steps; for a mixture whose tasks decode
  different lengths it is the largest (tasks with a shorter one may then predict more tokens
  than `t5align.eval`, which stops each task at its own). 'inputs' is left out unless given, so
  seqio uses the longest input of the data: nothing is cut.

  Raises:
    KeyError: for a name that is not a t5align task or mixture.
    ValueError: for scored (LM) tasks, which do not decode.
  """
  from seqio_tasks import catalog  # pylint: disable=g-import-not-at-top
  lengths = {catalog.SPECS[t].max_decode_length for t in catalog.resolve(mixture_or_task_name)}
  if 0 in lengths:
    raise ValueError(f'{mixture_or_task_name} holds scored (LM) tasks, which t5x.eval does not '
                     'decode; evaluate them with `python -m t5align.eval`.')
  out = {'targets': max(lengths)}
  if inputs is not None:
    out['inputs'] = inputs
  return out


def check_no_temperature(config: Any, temperature: Any = None) -> Any:
  """Returns `config`; raises if a constant TEMPERATURE is set beside a schedule.

  gin/t5x/schedule.gin sets TEMPERATURE = None and binds this between the schedule network and
  its config, so `--gin.TEMPERATURE=x` given with it fails when the model is configured instead
  of being silently replaced by the schedule's temperatures (as `t5align.eval` refuses the pair).
  """
  if temperature is not None:
    raise ValueError(
        f'TEMPERATURE={temperature!r} is set together with gin/t5x/schedule.gin, whose '
        'per-example temperatures would replace it: drop --gin.TEMPERATURE, or drop '
        'schedule.gin (and SCHEDULE_PATH).')
  return config


def shipped_checkpoint(model_dir: str = ASSET_DIR) -> str:
  """The one `checkpoint_N/` folder of the shipped model (a T5X legacy checkpoint)."""
  return assets.checkpoint_dir(model_dir)


def shipped_vocabulary(model_dir: str = ASSET_DIR) -> str:
  """The shipped model's SentencePiece file."""
  path = os.path.join(model_dir, VOCAB_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f'no {VOCAB_FILE} in {model_dir}.')
  return path


def longest_inputs(dataset_cfg: Any) -> int:
  """The longest 'inputs' (in tokens) of `dataset_cfg`'s split of its task or mixture.

  t5x.infer, unlike t5x.eval, needs TASK_FEATURE_LENGTHS['inputs'], and seqio's feature converter
  cuts longer inputs without a word: gin/t5x/infer.gin sets it to this, so nothing is cut.
  `dataset_cfg` is a t5x `utils.DatasetConfig` (its `mixture_or_task_name` and `split` are read),
  the same split t5x.infer predicts; reading it builds the split's examples once more.

  Raises:
    ValueError: for a split without examples.
  """
  import seqio  # pylint: disable=g-import-not-at-top
  import seqio_tasks  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  name, split = dataset_cfg.mixture_or_task_name, dataset_cfg.split
  longest, count = 0, 0
  for task in seqio.get_subtasks(seqio.get_mixture_or_task(name)):
    dataset = task.get_dataset(sequence_length=None, split=split, shuffle=False,
                               use_cached=False)
    for example in dataset.as_numpy_iterator():
      longest, count = max(longest, len(example['inputs'])), count + 1
  if not count:
    raise ValueError(f'{name}: no examples in its split {split!r}.')
  return longest
