"""Synthetic retrieval examples for training a small T5: passkey (also with decoy codes), line
and key-value retrieval.

Prompts come from `seqio_tasks.retrieval` (passkey, LongChat LongEval lines, Lost in the Middle
key-value); the line-retrieval prompt, which upstream ships only inside its data files, is filled
here with random line ids and numbers. Every example is drawn from a generator seeded by integers
only, so a (seed, index) pair always gives the same example, and is filled to a token budget:
the largest number of filler characters / lines / key-value pairs whose input, with EOS, fits.

Targets: the pass key for passkey; for lines and key-value retrieval, the queried record quoted
whole ('line amber-spoon: REGISTER_CONTENT is <2708>', '"<key>": "<value>"'), so the model names
the record before its number or value: a lookup in two supervised steps (copy the queried id from
the question, then continue the record that has it) instead of one. Scores use
`seqio_tasks.metrics.score_example` with the task's family (`FAMILY`) against `Example.answer`,
the number or value alone, as for any model's free-text answer.
"""
from __future__ import annotations

import dataclasses
import functools
import uuid
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

import numpy as np

from seqio_tasks import data
from seqio_tasks import retrieval
from t5align.runtime import batching
from t5align import fields
from t5align import vocabularies

TASKS = ('passkey', 'passkey_decoys', 'lines', 'kv')
# Tasks for training only (never evaluated or reported): 'lines_near' is line retrieval with each
# record shortened to 'line <id>: <n>', so the number sits 2 tokens after its id instead of 6;
# the question and header are LongEval's. A step towards the full format, whose lookup a small
# model does not find on its own within a CPU budget (TRAINING.md, run5).
TRAIN_TASKS = TASKS + ('lines_near',)
# Scoring family (`seqio_tasks.metrics`) of each task.
FAMILY = {'passkey': 'passkey', 'passkey_decoys': 'passkey', 'lines': 'lines', 'kv': 'kv',
          'lines_near': 'lines'}
# Passkey with decoys: 1..MAX_DECOYS other codes, worded like the pass key, in the filler.
DECOY_NAMES = ('door code', 'room number', 'locker code', 'safe code', 'gate code',
               'ticket number', 'order number', 'badge number')
MAX_DECOYS = 3

LINES_MAX = 50000
# Line ids are '<first>-<second>' as upstream's random word pairs (e.g. 'torpid-kid').
ID_FIRST = (
    'amber', 'ancient', 'bitter', 'bold', 'brave', 'brisk', 'calm', 'clever', 'crimson', 'curly',
    'damp', 'eager', 'early', 'fancy', 'fierce', 'frail', 'gentle', 'giant', 'glossy', 'grumpy',
    'hollow', 'humble', 'icy', 'jolly', 'keen', 'lazy', 'loud', 'lucky', 'mellow', 'misty',
    'narrow', 'noble', 'odd', 'pale', 'plain', 'proud', 'quiet', 'rapid', 'rusty', 'shy',
    'silent', 'sleepy', 'smoky', 'steady', 'sunny', 'tidy', 'torpid', 'wild')
ID_SECOND = (
    'anchor', 'badger', 'basket', 'beacon', 'bell', 'bridge', 'button', 'candle', 'castle',
    'chair', 'cloud', 'comet', 'crane', 'desert', 'engine', 'falcon', 'feather', 'garden',
    'harbor', 'helmet', 'island', 'jacket', 'kettle', 'kid', 'ladder', 'lantern', 'meadow',
    'mirror', 'needle', 'orchard', 'otter', 'pepper', 'pillow', 'planet', 'pocket', 'rabbit',
    'river', 'saddle', 'shadow', 'spoon', 'thistle', 'tiger', 'tunnel', 'valley', 'wagon',
    'walnut', 'whale', 'window')


def random_uuid(rng: np.random.Generator) -> str:
  """A version-4 UUID string from `rng` (as Lost in the Middle's uuid4 keys and values)."""
  return str(uuid.UUID(bytes=rng.bytes(16), version=4))


@dataclasses.dataclass(frozen=True)
class Draft:
  """One example's random content for up to `capacity` units; `build(n)` uses the first n.

  Units are filler characters (passkey), lines (lines) or key-value pairs (kv).
  """

  task: str
  min_units: int
  capacity: int
  build: Callable[[int], tuple[str, str, dict]]  # n -> (inputs, targets, meta)


def passkey_draft(key: int, depth: float, capacity: int) -> Draft:
  """The passkey example with `key` at `depth` (0..1) of the filler, up to `capacity` chars."""

  def build(n):
    prefix = int(depth * n)
    return (retrieval.passkey_prompt(n, prefix, key), str(key),
            {'depth': prefix / max(n, 1), 'units': n})
  return Draft('passkey', 0, capacity, build)


def _passkey_draft(rng: np.random.Generator, capacity: int) -> Draft:
  depth = rng.random()
  return passkey_draft(int(rng.integers(1, retrieval.PASSKEY_MAX + 1)), depth, capacity)


def passkey_decoys_draft(key: int, depth: float, decoys: Sequence[tuple[float, str, int]],
                         capacity: int) -> Draft:
  """Passkey with `decoys` = (depth, name, value) needles (see `retrieval.passkey_prompt`)."""

  def build(n):
    prefix = int(depth * n)
    placed = [(int(d * n), name, value) for d, name, value in decoys]
    return (retrieval.passkey_prompt(n, prefix, key, placed), str(key),
            {'depth': prefix / max(n, 1), 'units': n, 'decoys': len(decoys)})
  return Draft('passkey_decoys', 0, capacity, build)


def _passkey_decoys_draft(rng: np.random.Generator, capacity: int) -> Draft:
  depth = rng.random()
  key = int(rng.integers(1, retrieval.PASSKEY_MAX + 1))
  count = int(rng.integers(1, MAX_DECOYS + 1))
  names = rng.choice(len(DECOY_NAMES), size=count, replace=False)
  values = []
  while len(values) < count:  # Distinct, and never the key.
    value = int(rng.integers(1, retrieval.PASSKEY_MAX + 1))
    if value != key and value not in values:
      values.append(value)
  decoys = [(float(rng.random()), DECOY_NAMES[n], v) for n, v in zip(names, values)]
  return passkey_decoys_draft(key, depth, decoys, capacity)


def _lines_draft(rng: np.random.Generator, capacity: int, task: str = 'lines') -> Draft:
  cells = len(ID_FIRST) * len(ID_SECOND)
  if capacity > cells:
    raise ValueError(f'{capacity} lines need more than the {cells} distinct line ids.')
  picks = rng.choice(cells, size=capacity, replace=False)
  ids = [f'{ID_FIRST[p // len(ID_SECOND)]}-{ID_SECOND[p % len(ID_SECOND)]}' for p in picks]
  numbers = rng.integers(1, LINES_MAX + 1, size=capacity)
  records = [(i, int(n)) for i, n in zip(ids, numbers)]
  depth = rng.random()

  record = retrieval.lines_record if task == 'lines' else _near_record

  def build(n):
    q = min(int(depth * n), n - 1)
    return (retrieval.lines_prompt(records[:n], records[q][0], record), record(*records[q]),
            {'depth': q / max(n - 1, 1), 'units': n, 'answer': str(records[q][1])})
  return Draft(task, 1, capacity, build)


def _near_record(line_id: str, number: int) -> str:
  """A 'lines_near' record: 'line <id>: <n>'."""
  return f'line {line_id}: <{number}>'


def _kv_draft(rng: np.random.Generator, capacity: int) -> Draft:
  records = [(random_uuid(rng), random_uuid(rng)) for _ in range(capacity)]
  depth = rng.random()

  def build(n):
    q = min(int(depth * n), n - 1)
    return (retrieval.kv_prompt(records[:n], records[q][0]), retrieval.kv_record(*records[q]),
            {'depth': q / max(n - 1, 1), 'key': records[q][0], 'units': n,
             'answer': records[q][1]})
  return Draft('kv', 1, capacity, build)


# Units drafted per budget token: generous upper bounds (filler is ~0.25 tokens per character, a
# line ~15 tokens, a key-value pair ~70), checked in `fill`.
_DRAFTS = {'passkey': (_passkey_draft, 8.0), 'passkey_decoys': (_passkey_decoys_draft, 8.0),
           'lines': (_lines_draft, 0.25), 'kv': (_kv_draft, 0.125),
           'lines_near': (functools.partial(_lines_draft, task='lines_near'), 0.25)}


def draft(task: str, rng: np.random.Generator, budget: int) -> Draft:
  if task not in _DRAFTS:
    raise ValueError(f'unknown task {task!r}; expected one of {TRAIN_TASKS}.')
  make, per_token = _DRAFTS[task]
  return make(rng, max(2, int(per_token * budget)))


@dataclasses.dataclass(frozen=True)
class Example:
  task: str
  inputs: str
  targets: str
  meta: dict
  input_ids: tuple[int, ...]  # With EOS.
  target_ids: tuple[int, ...]  # With EOS.

  def score(self, prediction: str) -> float:
    from seqio_tasks import metrics  # pylint: disable=g-import-not-at-top
    return metrics.score_example(FAMILY[self.task], {'target': self.answer, 'meta': self.meta},
                                 prediction)['accuracy']

  @property
  def answer(self) -> str:
    """What the metric compares with: the number or value, where `targets` quotes its record."""
    return self.meta.get('answer', self.targets)


def _tokenize(vocab: vocabularies.Vocabulary, text: str) -> list[int]:
  return list(vocab.encode(text)) + [vocab.eos_id]


def fill(d: Draft, vocab: vocabularies.Vocabulary, budget: int) -> Example:
  """The example with the most units whose input (with EOS) has at most `budget` tokens.

  Raises:
    ValueError: if even `d.min_units` does not fit, or all `d.capacity` units do (the draft is
      too small to fill the budget).
  """
  cache: dict[int, tuple] = {}

  def make(n):
    if n not in cache:
      inputs, targets, meta = d.build(n)
      cache[n] = (inputs, targets, meta, _tokenize(vocab, inputs))
    return cache[n]

  if len(make(d.min_units)[3]) > budget:
    raise ValueError(f'{d.task}: the smallest example has {len(make(d.min_units)[3])} tokens, '
                     f'over the budget of {budget}.')
  if len(make(d.capacity)[3]) <= budget:
    raise ValueError(f'{d.task}: {d.capacity} units fit in {budget} tokens; draft more.')
  # Interpolation search (token counts grow about linearly with units): make(lo) fits, make(hi)
  # does not. A few tokenizations instead of a bisection's dozen.
  lo, hi = d.min_units, d.capacity
  while hi - lo > 1:
    t_lo, t_hi = len(make(lo)[3]), len(make(hi)[3])
    guess = lo + (budget - t_lo) * (hi - lo) // max(t_hi - t_lo, 1)
    mid = min(max(guess, lo + 1), hi - 1)
    if len(make(mid)[3]) <= budget:
      lo = mid
      if mid + 1 < hi and len(make(mid + 1)[3]) > budget:  # The usual case: done.
        hi = mid + 1
    else:
      hi = mid
      if mid - 1 > lo and len(make(mid - 1)[3]) <= budget:
        lo = mid - 1
  inputs, targets, meta, ids = make(lo)
  return Example(d.task, inputs, targets, meta, tuple(ids), tuple(_tokenize(vocab, targets)))


def eval_examples(task: str, vocab: vocabularies.Vocabulary, length: int, num_examples: int,
                  seed: int) -> list[Example]:
  """Held-out examples filled to `length` input tokens; example i uses rng (seed, task, length,
  i)."""
  t = TRAIN_TASKS.index(task)
  return [fill(draft(task, data.rng_for(seed, t, length, i), length), vocab, length)
          for i in range(num_examples)]


def _weights(weights: Any) -> Mapping[str, float]:
  """`Mix.weights`: a mapping from training tasks to numbers >= 0, one of them > 0."""
  checked = fields.mapping(TRAIN_TASKS, fields.number(0))(weights)
  if not sum(checked.values()) > 0:
    raise fields.Refused('all are 0')
  return checked


@dataclasses.dataclass(frozen=True)
class Mix:
  """Training mixture: task weights and the input budgets (tokens, with EOS).

  An example's budget is `low + u**length_power * (max_length - low)` with u uniform in [0, 1),
  `max_length` the run's input length (L_TR: `train_example`'s)
  and `low` the larger of `min_length` and the example's smallest size: power 1 is uniform,
  power 2 favours short inputs (cheaper steps, and attention that is less dispersed while the
  model first learns to find the answer) and still reaches `max_length`.

  `min_units` raises a task's smallest example to that many units (`Draft`: lines for 'lines',
  key-value pairs for 'kv', filler characters for the passkey tasks), e.g. {'lines': 3} so that
  no line-retrieval example can be answered by copying its only number; None: each task's own.

  `weights` None weighs the evaluated tasks (`TASKS`) equally. gin builds it for
  `jobs.TrainJob.mix` (gin/runs/train_retrieval.gin: MIX, LENGTH_POWER, MIN_UNITS).
  """

  weights: Mapping[str, float] | None = fields.setting(None, check=fields.optional(fields.Check(
      f'a dict from some of {", ".join(TRAIN_TASKS)} to numbers >= 0, not all 0', _weights),
      'None (the evaluated tasks equally)'))
  min_length: int = fields.setting(0, check=fields.integer(0))
  length_power: float = fields.setting(1.0, check=fields.number(0, above=True))
  min_units: Mapping[str, int] | None = fields.setting(None, check=fields.optional(
      fields.mapping(TRAIN_TASKS, fields.integer(1)), "None (each task's own)"))

  GIN_NAME: ClassVar[str] = 'train_data.Mix'

  def __post_init__(self):
    fields.check_fields(self)

  def check_fits(self, max_length: int, limit: str) -> None:
    """Raises ValueError when `min_length` is over `max_length` tokens (`limit` names it)."""
    if self.min_length > max_length:
      raise ValueError(f'train_data.Mix.min_length = {self.min_length}: over {limit}: no '
                       'example can be that long.')

  def probabilities(self) -> np.ndarray:
    weights = self.task_weights
    w = np.array([float(weights.get(t, 0.0)) for t in TRAIN_TASKS])
    return w / w.sum()

  @property
  def task_weights(self) -> Mapping[str, float]:
    """`weights`, or 1 for each of `TASKS`."""
    return dict.fromkeys(TASKS, 1.0) if self.weights is None else self.weights

  @property
  def task_min_units(self) -> Mapping[str, int]:
    return self.min_units or {}


def train_example(vocab: vocabularies.Vocabulary, mix: Mix, seed: int, index: int, *,
                  max_length: int) -> Example:
  """Training example `index`: task by `mix`, then its content, then its input budget of at
  most `max_length` tokens (L_TR; see `Mix`)."""
  mix.check_fits(max_length, f'max_length={max_length}')
  rng = data.rng_for(seed, index)
  task = TRAIN_TASKS[int(rng.choice(len(TRAIN_TASKS), p=mix.probabilities()))]
  d = draft(task, rng, max_length)
  d = dataclasses.replace(d, min_units=max(d.min_units, mix.task_min_units.get(task, 0)))
  smallest = len(_tokenize(vocab, d.build(d.min_units)[0]))
  low = max(mix.min_length, smallest)
  if low > max_length:
    raise ValueError(f'{task}: the smallest example ({d.min_units} units) has {smallest} tokens, '
                     f'over max_length={max_length}.')
  u = rng.random() ** mix.length_power
  return fill(d, vocab, low + int(u * (max_length + 1 - low)))


def batch_arrays(examples: Sequence[Example], input_length: int,
                 target_length: int) -> dict[str, np.ndarray]:
  """T5X's feature dict: int32 `[b, input_length]` inputs, `[b, target_length]` decoder arrays.

  Decoder inputs are the targets shifted right with 0 as the start token (t5x's convention).
  """
  b = len(examples)
  enc = np.zeros((b, input_length), np.int32)
  tgt = np.zeros((b, target_length), np.int32)
  for j, ex in enumerate(examples):
    if len(ex.input_ids) > input_length or len(ex.target_ids) > target_length:
      raise ValueError(f'example {j} ({ex.task}) has {len(ex.input_ids)} input / '
                       f'{len(ex.target_ids)} target tokens; limits {input_length} / '
                       f'{target_length}.')
    enc[j, :len(ex.input_ids)] = ex.input_ids
    tgt[j, :len(ex.target_ids)] = ex.target_ids
  dec_in = np.zeros_like(tgt)
  dec_in[:, 1:] = tgt[:, :-1]
  return {'encoder_input_tokens': enc, 'decoder_input_tokens': dec_in,
          'decoder_target_tokens': tgt}


def train_batches(vocab: vocabularies.Vocabulary, mix: Mix, *, max_length: int, seed: int,
                  batch_size: int, target_length: int, start_step: int = 0, group: int = 8,
                  input_multiple: int = 64, short_target: int = 8
                  ) -> Iterator[dict[str, np.ndarray]]:
  """Training batches; batch s comes from examples of group s // `group`, so a resumed run
  continues the same stream from `start_step`.

  To spend less compute on padding, each group of `group` * `batch_size` examples (example i of
  the run is `train_example(..., seed, i, max_length=...)`) is sorted by (long target, input
  length) and cut into batches, which come in a seeded random order. A batch is padded to its
  longest input rounded up to `input_multiple` (at most `max_length`), and its targets to
  `short_target` when they all fit, else `target_length`: few distinct shapes, so few
  compilations.
  """
  g, skip = divmod(start_step, group)
  n = group * batch_size
  while True:
    examples = [train_example(vocab, mix, seed, g * n + j, max_length=max_length)
                for j in range(n)]
    examples.sort(key=lambda e: (len(e.target_ids) > short_target, len(e.input_ids)))
    order = data.rng_for(seed, g, group).permutation(group)  # 3 keys: not an example's.
    for k in order[skip:]:
      chunk = examples[k * batch_size:(k + 1) * batch_size]
      length = min(max_length,
                   batching.round_up(max(len(e.input_ids) for e in chunk), input_multiple))
      short = max(len(e.target_ids) for e in chunk) <= short_target
      yield batch_arrays(chunk, length, short_target if short else target_length)
    g, skip = g + 1, 0


def vocabulary_corpus(seed: int = 0, num_prompts: int = 300) -> Iterator[str]:
  """Text for the SentencePiece model: prompts of every task (filler, line words, UUIDs and
  numbers), cut into sentences, plus the line-id words and numbers on their own."""
  for i in range(num_prompts):
    rng = data.rng_for(seed, len(TASKS), i)  # Not a training stream (those have 2 keys).
    task = TASKS[i % len(TASKS)]
    d = draft(task, rng, 256)
    inputs, targets, _ = d.build(int(rng.integers(d.min_units, d.capacity + 1)))
    yield from (s for s in inputs.split('\n') if s.strip())
    yield targets
  yield ' '.join(ID_FIRST + ID_SECOND)
  rng = data.rng_for(seed, len(TASKS), num_prompts)
  yield ' '.join(str(n) for n in rng.integers(1, LINES_MAX + 1, size=200))
