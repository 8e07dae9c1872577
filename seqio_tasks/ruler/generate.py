"""RULER's 13 synthetic tasks, generated as NVIDIA/RULER's scripts generate them (no seqio needed).

`samples(task, max_seq_length, tokenizer, seed=..., num_samples=...)` returns the records that
`python scripts/data/prepare.py --task TASK --max_seq_length L --random_seed SEED --num_samples N
--model_template_type base` writes to TASK/validation.jsonl (NVIDIA/RULER at c3f5e3b, one chunk,
no --remove_newline_tab), for a tokenizer whose `text_to_tokens` counts as the one given there
does: same keys and values, example for example, because every random draw is made in upstream's
order from `random.Random(seed)` / `np.random.RandomState(seed)` (the states upstream's
`random.seed(seed)` / `np.random.seed(seed)` set). tests/suites/ruler_generate_test.py checks this
against records written by upstream's own scripts.

A record: 'index', 'input' (the prompt up to the answer prefix), 'outputs' (the answers),
'length' (the input's tokens with the answer prefix, plus the reserve below), 'length_w_model_temp'
(the same), 'answer_prefix'; the NIAH tasks add 'token_position_answer' and, as upstream, put the
first answer's character offset in 'index'. The model reads `input + answer_prefix`.

Budgets: 'upstream' (default; what makes the records equal upstream's) fits the input with the
answer prefix plus the task's tokens_to_generate (NIAH 128, vt 30, cwe 120, fwe 50, qa 32) into
max_seq_length; 'encoder' reserves 1 token (an encoder input with its EOS) instead, a t5align
option whose records are not upstream's.

Where upstream's scripts never finish (the smallest input already overflows: with the 1,000-piece
vocabulary vt and niah_multikey_3 at 512, cwe at 512, 1,024 and 4,096), `search.RulerLengthError`
is raised, after `search.MAX_REDRAWS` overflowing draws of the smallest haystack (upstream redraws
it until one fits, which for documents or words of varying length can take hundreds of draws).

Long lengths cost time: about 25 us per token per sample at 10^6 tokens (niah_single_1, vt;
12 us at 16k; a SentencePiece tokenizer on the 2-core CPU VM, 2026-12-02), so the default 500
samples of 10^6 tokens take over 3 hours; past 30 s, the progress is logged every 30 s
(`search.Progress`: samples done, seconds a sample, seconds left).

Corpus files: `assets.Assets` (default: `Assets.from_data_dir()`, read only by the essay and QA
tasks).
"""
from __future__ import annotations

from typing import Any

from seqio_tasks.ruler import assets as assets_lib
from seqio_tasks.ruler import niah
from seqio_tasks.ruler import qa
from seqio_tasks.ruler import search
from seqio_tasks.ruler import templates
from seqio_tasks.ruler import variable_tracking
from seqio_tasks.ruler import words
from seqio_tasks.ruler.assets import AssetError, Assets
from seqio_tasks.ruler.search import RulerLengthError, Tokenizer

__all__ = ['AssetError', 'Assets', 'BUDGETS', 'OFFLINE_TASKS', 'RulerLengthError', 'TASKS',
           'Tokenizer', 'samples']

# scripts/config_tasks.sh's order.
TASKS = tuple(templates.TASK_ARGS)
# Built from code and wonderwords alone.
OFFLINE_TASKS = ('niah_single_1', 'niah_multikey_2', 'niah_multikey_3', 'vt', 'cwe', 'fwe')
BUDGETS = ('upstream', 'encoder')
NUM_SAMPLES = 500  # scripts/config_tasks.sh NUM_SAMPLES.


def samples(task: str, max_seq_length: int, tokenizer: Tokenizer, *, seed: int,
            num_samples: int = NUM_SAMPLES, assets: Assets | None = None,
            budget: str = 'upstream') -> list[dict[str, Any]]:
  """RULER's records for `task` at `max_seq_length` tokens (module docstring).

  Args:
    task: one of `TASKS`.
    max_seq_length: the length budget in tokens of `tokenizer`.
    tokenizer: anything with `text_to_tokens(text) -> list` (only its length is used).
    seed: upstream's --random_seed (its default is 42).
    num_samples: upstream's --num_samples.
    assets: essays / SQuAD / HotpotQA for the tasks that need them (default: the data directory).
    budget: 'upstream' or 'encoder' (module docstring).

  Raises:
    ValueError: an unknown task or budget, a non-positive length or count.
    RulerLengthError: a length at which upstream's scripts never finish.
    AssetError: a corpus file missing or not the expected one.
  """
  if task not in templates.TASK_ARGS:
    raise ValueError(f'no RULER task {task!r}; the tasks are {", ".join(TASKS)}.')
  if budget not in BUDGETS:
    raise ValueError(f'RULER budget {budget!r}; expected one of {BUDGETS}.')
  for name, value, low in (('max_seq_length', max_seq_length, 1),
                           ('num_samples', num_samples, 1), ('seed', seed, 0)):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise ValueError(f'RULER {task}: {name} = {value!r}; expected an integer >= {low}.')
  if seed >= 2**32:  # upstream's np.random.seed(seed) takes 0 .. 2**32 - 1.
    raise ValueError(f'RULER {task}: seed = {seed}; expected one below 2**32 (numpy\'s limit).')
  args = templates.TASK_ARGS[task]
  generator = args['generator']
  tokens_to_generate = templates.GENERATORS[generator]['tokens_to_generate']
  reserve = tokens_to_generate if budget == 'upstream' else 1
  common = dict(max_seq_length=max_seq_length, reserve=reserve, seed=seed,
                num_samples=num_samples,
                progress=search.Progress(task, max_seq_length, num_samples))
  if task not in OFFLINE_TASKS and assets is None:
    assets = assets_lib.Assets.from_data_dir(
        (args['dataset'],) if generator == 'qa' else ('essays',))
  if generator == 'niah':
    return niah.generate(task, args, tokenizer, assets=assets, **common)
  if generator == 'variable_tracking':
    return variable_tracking.generate(task, args, tokenizer, **common)
  if generator == 'common_words_extraction':
    return words.generate_cwe(task, args, tokenizer, **common)
  if generator == 'freq_words_extraction':
    return words.generate_fwe(task, args, tokenizer, **common)
  return qa.generate(task, args, tokenizer, assets=assets, **common)
