"""Every evaluation task of the paper, one spec per task and length setting (no seqio needed).

`seqio_tasks.tasks` registers each spec with seqio as `t5align_<name>`; `t5align.evaluation` and
the report use the specs' table layout. Settings (paper section and tables):

  passkey_{2,5,10,20,30,40,50,55}k          filler characters as upstream (the paper's 20k..55k)
  lines_{200,...,680,1000,1350}              LongEval line retrieval files
  topics_{1,5,...,30}                        LongEval topic retrieval files
  kv_{75,140,300}keys_gold{K}                Lost in the Middle key-value retrieval
  mdqa_{10,20,30}docs_gold{K}                Lost in the Middle multi-document QA (released files)
  mdqa_oracle_{10,20,30}docs_gold{K}         the same format built from nq-open-oracle
  code_completion_{stdlib,lcc}               next line; EM / ES bucketed by input length
  code_key_{2,4,8,16}k_{stdlib,lcc}          code key retrieval (the paper reports ~16k)
  lm_{wiki,text}_{512,...,15000}             prefix-LM perplexity (LM-adapted checkpoints)
  zeroscrolls_{task}_{512,...,8192}          ZeroSCROLLS at that many input tokens (the runner's
                                             truncation), splits 'validation' and 'test'
  ruler_{task}_{512,1024,...,16384}          RULER's 13 tasks generated at that many tokens
                                             (`seqio_tasks.ruler`; options' ruler_examples)
  scrolls_{config}_{512,...,16384}           SCROLLS' 7 configs, one example per id (every
                                             reference), the input's first L tokens; splits
                                             'validation' and 'test' (`seqio_tasks.scrolls`)

Sizes, seeds and user file paths are gin-configurable through `options`, or the environment
variables T5ALIGN_LCC_PATH and T5ALIGN_LM_TEXT_PATH for the two user files; the ZeroSCROLLS folder
through `seqio_tasks.zeroscrolls_dir` or T5ALIGN_ZEROSCROLLS_DIR (`seqio_tasks.zeroscrolls`);
RULER's budget and files through `options`' ruler_* or T5ALIGN_RULER_* (`seqio_tasks.ruler.suite`).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Iterator, Mapping

import gin

from seqio_tasks import code
from seqio_tasks import lm
from seqio_tasks import qa
from seqio_tasks import retrieval
from seqio_tasks import ruler
from seqio_tasks import scrolls
from seqio_tasks import suite
from seqio_tasks import zeroscrolls

PREFIX = 't5align_'
PASSKEY_CHARS = (2000, 5000, 10000, 20000, 30000, 40000, 50000, 55000)
LINES = (200, 300, 400, 500, 600, 680, 1000, 1350)
TOPICS = (1, 5, 10, 15, 20, 25, 30)
KV_KEYS = (75, 140, 300)
CODE_KEY_TOKENS = (2000, 4000, 8000, 16000)
LM_LENGTHS = (512, 1024, 2048, 4096, 8192, 15000)
# The long-context suites (`suite.Suite`), each a spec per task and length and a mixture per length.
SUITES: tuple[suite.Suite, ...] = (zeroscrolls.SUITE, scrolls.SUITE, ruler.SUITE)
# The paper's Table 4 columns.
PAPER_RETRIEVAL = (tuple(f'topics_{n}' for n in (5, 10, 15, 20, 25))
                   + tuple(f'lines_{n}' for n in (200, 300, 400, 500, 600, 680))
                   + tuple(f'passkey_{n}k' for n in (20, 30, 40, 50, 55)))


@gin.configurable(module='seqio_tasks')
def options(*, seed: int = 0, passkey_examples: int = 100, code_key_examples: int = 100,
            code_completion_examples: int = 300, lm_examples: int = 500,
            lm_continuation: int = lm.CONTINUATION, mdqa_oracle_examples: int | None = None,
            lcc_path: str | None = None, lm_text_path: str | None = None,
            ruler_examples: int = 500, ruler_budget: str = 'upstream',
            ruler_essays: str | None = None, ruler_squad: str | None = None,
            ruler_hotpotqa: str | None = None) -> dict:
  """Sizes, seed and user files of the generated and user-file tasks."""
  return dict(seed=seed, passkey_examples=passkey_examples,
              code_key_examples=code_key_examples,
              code_completion_examples=code_completion_examples, lm_examples=lm_examples,
              lm_continuation=lm_continuation, mdqa_oracle_examples=mdqa_oracle_examples,
              lcc_path=lcc_path or os.environ.get('T5ALIGN_LCC_PATH'),
              lm_text_path=lm_text_path or os.environ.get('T5ALIGN_LM_TEXT_PATH'),
              ruler_examples=ruler_examples, ruler_budget=ruler_budget,
              ruler_essays=ruler_essays, ruler_squad=ruler_squad, ruler_hotpotqa=ruler_hotpotqa)


def _user_file(key: str, env: str, what: str) -> str:
  path = options()[key]
  if not path:
    raise FileNotFoundError(
        f'no {what} file configured: set ${env} or the gin binding seqio_tasks.options.{key} '
        f"= '/path/file.jsonl'.")
  return path


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """One task: its family (scoring rule), table placement, splits and example builder."""

  name: str  # without PREFIX
  family: str  # a key of seqio_tasks.metrics.FAMILIES
  # Report table: 'retrieval', 'kv', 'mdqa', 'mdqa_oracle', 'code', 'code_key', 'lm' or
  # 'zeroscrolls'.
  table: str
  group: str  # column group in that table
  column: str  # column label within the group
  max_decode_length: int  # greedy decoding steps (0: scored, not decoded)
  # Examples, given the task vocabulary: `build(tokenizer)` for a task of one split,
  # `build(tokenizer, split)` for a task of several.
  build: Callable[..., Iterator[dict]]
  tokenized: bool = False  # examples already hold int 'inputs' / 'targets'
  splits: tuple[str, ...] = ('test',)

  @property
  def task_name(self) -> str:
    return PREFIX + self.name

  def examples(self, tokenizer: suite.Tokenizer, split: str = 'test') -> Iterator[dict]:
    """The examples of `split`; raises ValueError for a split the task does not have."""
    if split not in self.splits:
      raise ValueError(f'{self.task_name} has the split(s) {", ".join(self.splits)}; got '
                       f'{split!r}.')
    return self.build(tokenizer) if len(self.splits) == 1 else self.build(tokenizer, split)


def _count(tokenizer: suite.Tokenizer) -> Callable[[str], int]:
  return lambda text: len(tokenizer.encode(text))


def _specs() -> list[TaskSpec]:
  specs = []
  add = specs.append
  for n in PASSKEY_CHARS:
    add(TaskSpec(f'passkey_{n // 1000}k', 'passkey', 'retrieval', 'Passkey, # of sentences',
                 f'{n // 1000}k', 16,
                 lambda tok, n=n: retrieval.passkey_examples(
                     n, options()['passkey_examples'], options()['seed'])))
  for n in LINES:
    add(TaskSpec(f'lines_{n}', 'lines', 'retrieval', 'Line, # of lines', str(n), 32,
                 lambda tok, n=n: retrieval.lines_examples(n)))
  for n in TOPICS:
    add(TaskSpec(f'topics_{n}', 'topics', 'retrieval', 'Topic, # of topics', str(n), 32,
                 lambda tok, n=n: retrieval.topics_examples(n)))
  for n in KV_KEYS:
    for k in retrieval.kv_gold_positions(n):
      add(TaskSpec(f'kv_{n}keys_gold{k}', 'kv', 'kv', f'{n} keys', str(k), 64,
                   lambda tok, n=n, k=k: retrieval.kv_examples(n, k)))
  for n, positions in qa.GOLD_POSITIONS.items():
    for k in positions:
      add(TaskSpec(f'mdqa_{n}docs_gold{k}', 'mdqa', 'mdqa', f'{n} Docs', str(k), 64,
                   lambda tok, n=n, k=k: qa.upstream_examples(n, k)))
      add(TaskSpec(f'mdqa_oracle_{n}docs_gold{k}', 'mdqa', 'mdqa_oracle', f'{n} Docs', str(k), 64,
                   lambda tok, n=n, k=k: qa.oracle_examples(
                       n, k, options()['seed'], options()['mdqa_oracle_examples'])))
  add(TaskSpec('code_completion_stdlib', 'code_completion', 'code', 'stdlib', 'all', 64,
               lambda tok: code.stdlib_completion_examples(
                   options()['code_completion_examples'], _count(tok), seed=options()['seed'])))
  add(TaskSpec('code_completion_lcc', 'code_completion', 'code', 'LCC', 'all', 64,
               lambda tok: code.lcc_completion_examples(
                   _user_file('lcc_path', 'T5ALIGN_LCC_PATH', 'LCC'))))
  for n in CODE_KEY_TOKENS:
    add(TaskSpec(f'code_key_{n // 1000}k_stdlib', 'code_key', 'code_key', 'stdlib',
                 f'{n // 1000}k', 8,
                 lambda tok, n=n: code.code_key_examples(
                     n, options()['code_key_examples'], _count(tok), seed=options()['seed'])))
    add(TaskSpec(f'code_key_{n // 1000}k_lcc', 'code_key', 'code_key', 'LCC', f'{n // 1000}k', 8,
                 lambda tok, n=n: code.code_key_examples(
                     n, options()['code_key_examples'], _count(tok), seed=options()['seed'],
                     lcc_path=_user_file('lcc_path', 'T5ALIGN_LCC_PATH', 'LCC'))))
  for n in LM_LENGTHS:
    add(TaskSpec(f'lm_wiki_{n}', 'lm', 'lm', 'wiki', str(n), 0,
                 lambda tok, n=n: lm.wiki_examples(
                     n, options()['lm_examples'], tok.encode,
                     continuation=options()['lm_continuation'], seed=options()['seed'],
                     eos_id=tok.eos_id), tokenized=True))
    add(TaskSpec(f'lm_text_{n}', 'lm', 'lm', 'text', str(n), 0,
                 lambda tok, n=n: lm.text_examples(
                     _user_file('lm_text_path', 'T5ALIGN_LM_TEXT_PATH', 'LM text'), n,
                     options()['lm_examples'], tok.encode,
                     continuation=options()['lm_continuation'], eos_id=tok.eos_id),
                 tokenized=True))
  for one in SUITES:  # Table: the suite; group: the length; column: the task's.
    for n in one.lengths:
      for task in one.tasks:
        add(TaskSpec(f'{one.name}_{task}_{n}', one.families[task], one.name, str(n),
                     one.columns[task], one.decode_lengths[task], _suite_build(one, task, n),
                     tokenized=one.tokenized, splits=one.splits))
  return specs


def _suite_build(one: suite.Suite, task: str, n: int) -> Callable[..., Iterator[dict]]:
  """A suite task's `build`: `build(tokenizer)` for a suite of one split, else
  `build(tokenizer, split)`."""
  if len(one.splits) == 1:
    return lambda tok: one.examples(task, one.splits[0], n, tok, options())
  return lambda tok, split: one.examples(task, split, n, tok, options())


SPECS: Mapping[str, TaskSpec] = {s.task_name: s for s in _specs()}


def _mixtures() -> dict[str, tuple[str, ...]]:
  names = list(SPECS)
  out = {
      'passkey': [n for n in names if n.startswith(PREFIX + 'passkey_')],
      'lines': [n for n in names if n.startswith(PREFIX + 'lines_')],
      'topics': [n for n in names if n.startswith(PREFIX + 'topics_')],
      'retrieval': [PREFIX + n for n in PAPER_RETRIEVAL],
      'code_key_stdlib': [n for n in names if n.startswith(PREFIX + 'code_key_')
                          and n.endswith('_stdlib')],
      'lm_wiki': [n for n in names if n.startswith(PREFIX + 'lm_wiki_')],
      'lm_text': [n for n in names if n.startswith(PREFIX + 'lm_text_')],
  }
  for n in KV_KEYS:
    out[f'kv_{n}keys'] = [t for t in names if t.startswith(f'{PREFIX}kv_{n}keys_')]
  for one in SUITES:  # All tasks at a length, then each subset.
    for n in one.lengths:
      for subset, tasks in {'': one.tasks, **one.subsets}.items():
        name = f'{one.name}_{subset}_{n}' if subset else f'{one.name}_{n}'
        out[name] = [f'{PREFIX}{one.name}_{task}_{n}' for task in tasks]
  for variant in ('mdqa', 'mdqa_oracle'):
    for n in qa.GOLD_POSITIONS:
      out[f'{variant}_{n}docs'] = [t for t in names if t.startswith(f'{PREFIX}{variant}_{n}docs_')]
    out[variant] = [t for n in qa.GOLD_POSITIONS for t in out[f'{variant}_{n}docs']]
  return {PREFIX + k: tuple(v) for k, v in out.items()}


MIXTURES: Mapping[str, tuple[str, ...]] = _mixtures()


def resolve(name: str) -> tuple[str, ...]:
  """Task names of a task or mixture name; raises KeyError listing what exists."""
  if name in SPECS:
    return (name,)
  if name in MIXTURES:
    return MIXTURES[name]
  raise KeyError(f'unknown task or mixture {name!r}. Tasks: {", ".join(SPECS)}; mixtures: '
                 f'{", ".join(MIXTURES)}.')
