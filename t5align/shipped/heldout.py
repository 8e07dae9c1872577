"""Held-out accuracy of the retrieval tasks (`train_data.TASKS`): greedy answers, scored one by one.

The examples are `train_data.eval_examples` (seeded, filled to a token length); the answers are
scored by `seqio_tasks.metrics.score_example` with the task's family (`train_data.FAMILY`).
`t5align.train` runs it at the end of training, the demo per report cell.
"""
from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from t5align import decoding
from t5align import network
from t5align.shipped import train_data
from t5align import vocabularies

# Greedy decoding steps per scoring family (`train_data.FAMILY`): a key of <= 5 digits (+ EOS),
# a quoted line (<= 17 tokens with EOS) or a quoted key-value pair (<= 72 tokens with EOS).
DECODE_LENGTH = {'passkey': 8, 'lines': 20, 'kv': 80}
# The examples of the last few (task, length, count, seed): evaluating one cell at several
# temperatures (the demo's rows) builds and tokenizes them once. Read-only.
_eval_examples = functools.lru_cache(maxsize=8)(train_data.eval_examples)


def retrieval_predictions(model: network.Transformer, params: Any, vocab: vocabularies.Vocabulary,
                          *, tasks: Sequence[str] = train_data.TASKS, length: int = 256,
                          num_examples: int = 100, seed: int = 1000, batch_size: int = 16,
                          temperature: Any = None, decode_length: int | None = None
                          ) -> dict[str, list[dict[str, Any]]]:
  """Per task, one JSON-able record per held-out example, in example order.

  Args:
    model, params, vocab: the model, its 'params' and its vocabulary.
    tasks: names from `train_data.TASKS`.
    length: input tokens every example is filled to (inputs are padded to it).
    num_examples: examples per task.
    seed: `train_data.eval_examples` seed.
    batch_size: examples per decoding call (the last batch is padded with copies of its first
      example, so every call has the same shape: one compilation).
    temperature: encoder temperature (None: the config's), see `network.layer_temperatures`.
    decode_length: greedy steps for every task (at least the longest `DECODE_LENGTH` of
      `tasks`), so that tasks of different families share one compiled decoder; each answer is
      then cut to its family's `DECODE_LENGTH` (greedy decoding is causal: the same tokens as
      decoding that many steps). None: each family's own `DECODE_LENGTH`.

  Returns:
    {task: [{'index', 'task', 'family', 'length', 'input_tokens', 'target', 'answer', 'meta',
    'prediction', 'accuracy'}]}: 'target' is what the model is trained to write, 'answer' what
    the score compares with (`train_data.Example.answer`); 'accuracy' is 0 or 1.
  """
  out = {}
  longest = max(DECODE_LENGTH[train_data.FAMILY[task]] for task in tasks)
  if decode_length is not None and decode_length < longest:
    raise ValueError(f'decode_length={decode_length} is shorter than the {longest} steps the '
                     f'answers of {list(tasks)} need (DECODE_LENGTH).')
  for task in tasks:
    examples = _eval_examples(task, vocab, length, num_examples, seed)
    keep = DECODE_LENGTH[train_data.FAMILY[task]]
    steps = decode_length or keep
    records = []
    for start in range(0, len(examples), batch_size):
      chunk = examples[start:start + batch_size]
      padded = list(chunk) + [chunk[0]] * (batch_size - len(chunk))
      arrays = train_data.batch_arrays(padded, length, steps)
      # [b, length] -> [b, steps]
      tokens = np.asarray(decoding.greedy_decode(
          model, params, jnp.asarray(arrays['encoder_input_tokens']), max_decode_length=steps,
          eos_id=vocab.eos_id, temperature=temperature))[:, :keep]
      for i, (ex, row) in enumerate(zip(chunk, tokens)):
        prediction = vocab.decode(row)
        records.append({'index': start + i, 'task': task, 'family': train_data.FAMILY[task],
                        'length': length, 'input_tokens': len(ex.input_ids),
                        'target': ex.targets, 'answer': ex.answer, 'meta': ex.meta,
                        'prediction': prediction,
                        'accuracy': ex.score(prediction)})
    out[task] = records
  return out


def accuracy(records: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, float]:
  """Accuracy in percent per task of `retrieval_predictions` records."""
  return {task: 100.0 * float(np.mean([r['accuracy'] for r in items]))
          for task, items in records.items()}


def retrieval_accuracy(model: network.Transformer, params: Any, vocab: vocabularies.Vocabulary,
                       **kwargs: Any) -> dict[str, float]:
  """Accuracy (percent) per task on held-out examples; arguments as `retrieval_predictions`."""
  return accuracy(retrieval_predictions(model, params, vocab, **kwargs))
