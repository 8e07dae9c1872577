"""lm-eval task folders of t5align's own retrieval prompts, offline: `write_tasks` writes a
YAML per task and length (`dataset_path: json` over a JSONL written beside it) that
`--include_path` reads, for the shipped model or any T5 with its vocabulary.

Per task of `shipped.train_data` (passkey, passkey with decoys, LongEval lines, key-value) and
length, two lm-eval tasks over the same held-out prompts:
  t5align_local_{task}_{length}     generate_until: greedy answer, exact match against the
                                    record the shipped model was trained to name
  t5align_local_{task}_{length}_mc  multiple_choice: that record among three distractors of
                                    the same form (accuracy): for lines and key-value, the
                                    queried id with the numbers or values of three other records
                                    of the same prompt; for the passkey, the decoys' codes of
                                    the prompt, then other prompts' keys
and the groups `t5align_local` (everything), `t5align_local_{length}`.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Sequence

import numpy as np

from seqio_tasks import retrieval
from t5align.runtime import fileio
from t5align.shipped import train_data

EVAL_SEED = 2000  # The demo's evaluation seed: never the calibration samples'.
CHOICES = 4
MAX_GEN_TOKS = 80  # The shipped model's target length (TARGET_LENGTH in its training.json).


def _yaml(fields: dict[str, Any]) -> str:
  """A flat YAML mapping (values as JSON, which YAML reads)."""
  return ''.join(f'{key}: {json.dumps(value)}\n' for key, value in fields.items())


def _distractors(ex: Any, others: Sequence[Any]) -> list[str]:
  """`CHOICES - 1` wrong answers in the form of `ex.targets`, from the prompt's own other
  records where it has them (see the module), then from `others`' targets."""
  if ex.task == 'lines':
    line_id = re.match(r'line (\S+): ', ex.targets).group(1)
    numbers = re.findall(r'^line \S+: REGISTER_CONTENT is <(\d+)>$', ex.inputs, re.M)
    wrong = [retrieval.lines_record(line_id, int(n)) for n in numbers]
  elif ex.task == 'kv':
    values = re.findall(r'"[0-9a-f-]{36}": "([0-9a-f-]{36})"', ex.inputs)
    wrong = [retrieval.kv_record(ex.meta['key'], v) for v in values]
  else:
    wrong = [n for n in re.findall(r'\b(\d+)\b', ex.inputs) if n != ex.targets]
  out = []
  for choice in [*wrong, *(o.targets for o in others)]:
    if choice != ex.targets and choice not in out:
      out.append(choice)
  return out[:CHOICES - 1]


def _task(name: str, data: str, output_type: str, max_gen_toks: int) -> dict[str, Any]:
  fields = {'task': name, 'dataset_path': 'json',
            'dataset_kwargs': {'data_files': {'test': data}}, 'test_split': 'test',
            'output_type': output_type, 'doc_to_text': 'inputs'}
  if output_type == 'generate_until':
    return {**fields, 'doc_to_target': 'targets',
            'generation_kwargs': {'until': [], 'max_gen_toks': max_gen_toks,
                                  'do_sample': False},
            'metric_list': [{'metric': 'exact_match', 'aggregation': 'mean',
                             'higher_is_better': True}]}
  return {**fields, 'doc_to_choice': 'choices', 'doc_to_target': 'label',
          'metric_list': [{'metric': 'acc', 'aggregation': 'mean', 'higher_is_better': True}]}


def write_tasks(folder: str, vocab: Any, lengths: Sequence[int], num_examples: int,
                tasks: Sequence[str] = train_data.TASKS, seed: int = EVAL_SEED,
                max_gen_toks: int = MAX_GEN_TOKS) -> list[str]:
  """Writes the task folder; returns the task names written.

  Args:
    folder: where the YAML and JSONL files go (created).
    vocab: the vocabulary the prompts are filled with (`vocabularies.Vocabulary`): each prompt
      has at most `length` tokens in it, with EOS.
    lengths: prompt lengths in tokens.
    num_examples: prompts per task and length (at least `CHOICES`).
    tasks: of `train_data.TASKS`.
    seed: the held-out examples' seed (`train_data.eval_examples`).
    max_gen_toks: the generation tasks' bound on generated tokens.
  """
  if num_examples < CHOICES:
    raise ValueError(f'num_examples={num_examples}: a multiple-choice task needs {CHOICES}.')
  unknown = sorted(set(tasks) - set(train_data.TASKS))
  if unknown:
    raise ValueError(f'tasks {unknown} are not of {train_data.TASKS}.')
  os.makedirs(folder, exist_ok=True)
  names: list[str] = []
  groups: dict[str, list[str]] = {}
  for length in lengths:
    for task in tasks:
      examples = train_data.eval_examples(task, vocab, length, num_examples, seed)
      rng = np.random.default_rng([seed, train_data.TASKS.index(task), length])
      rows = []
      for i, ex in enumerate(examples):
        others = _distractors(ex, [examples[(i + k) % len(examples)]
                                   for k in range(1, len(examples))])
        label = int(rng.integers(CHOICES))
        choices = others[:label] + [ex.targets] + others[label:]
        rows.append({'inputs': ex.inputs, 'targets': ex.targets, 'choices': choices,
                     'label': label})
      base = f't5align_local_{task}_{length}'
      data = os.path.abspath(os.path.join(folder, f'{base}.jsonl'))
      fileio.write_atomic(data, ''.join(json.dumps(r) + '\n' for r in rows))
      for name, kind in ((base, 'generate_until'), (f'{base}_mc', 'multiple_choice')):
        fileio.write_atomic(os.path.join(folder, f'{name}.yaml'),
                            _yaml(_task(name, data, kind, max_gen_toks)))
        names.append(name)
        groups.setdefault(f't5align_local_{length}', []).append(name)
  groups['t5align_local'] = list(names)
  for group, members in groups.items():
    fileio.write_atomic(os.path.join(folder, f'{group}.yaml'),
                        _yaml({'group': group, 'task': members}))
  return names
