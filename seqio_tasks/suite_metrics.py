"""The long-context suites' scoring rules (ZeroSCROLLS, SCROLLS), per example and per task.

Written from the suites' definitions (ZeroSCROLLS paper section 3.3; SCROLLS' metric file
tau/scrolls:metrics/scrolls.py as transcribed in ../shared/docs/YARDSTICKS.md sections 2.3, 3.3).
Every rule takes the max over an example's references; per-example scores are in [0, 100]:

  rouge_geo     ROUGE-1, -2 and -L F-measures (rouge-score, no stemming: its tokenizer lower-cases
                and keeps runs of [a-z0-9]), each the max over the references. The task's 'score'
                is the geometric mean of the three task means (SCROLLS' code; the same for
                SQuALITY, whose max per ROUGE type over its references comes first); the mean of
                the per-example geometric means is reported beside it.
  f1            SQuAD token F1 after SQuAD normalization (lower case, no ASCII punctuation, no
                a/an/the, single spaces); 0 when nothing is shared, two empty answers included.
  f1_unidecode  the same with the normalized text transliterated to ASCII (`unidecode`) last.
  exact_match   the SQuAD-normalized strings are equal.
  letter_acc    the first standalone letter A-D of the prediction is the reference's (QuALITY).
  exp_sim       0.5 ** (|p - q| / 10) for the first percentages (regex `\\d+\\.?\\d*%`) of the
                reference (p; none: 0) and the prediction (q; none: the score is 0) (SpaceDigest).
  c_index       every character but digits, commas and white space dropped, the integers left
                are summary IDs; 0 unless they are the reference's IDs (as a multiset), else the
                fraction of ID pairs in the reference's relative order (BookSumSort).

Each rule is a `family.Family` of `FAMILIES` (`seqio_tasks.metrics.FAMILIES` holds them with the
others): its per-example scores, and a task's metrics, means over its examples plus 'score', the
suite's number for the task. Examples without references (a test split, whose gold is private)
are not scored.
`rouge-score` and `unidecode` (setup.cfg's seqio extras) are imported when first needed.
"""
from __future__ import annotations

import collections
import functools
import importlib
import math
import re
import string
from typing import Callable, Mapping, Sequence

from seqio_tasks import family

# The per-example score each family averages into 'score' (rouge_geo: see `_rouge_aggregate`).
SCORE_KEY = {'rouge_geo': 'rouge_geometric_mean', 'f1': 'f1', 'f1_unidecode': 'f1',
             'exact_match': 'exact_match', 'letter_acc': 'accuracy',
             'exp_sim': 'exp_similarity', 'c_index': 'concordance_index'}
ROUGE_TYPES = ('rouge1', 'rouge2', 'rougeL')

_ARTICLES = re.compile(r'\b(a|an|the)\b')
_PUNCTUATION = frozenset(string.punctuation)
_LETTER = re.compile(r'\b[A-D]\b')
_PERCENTAGE = re.compile(r'\d+\.?\d*%')
_NOT_ID = re.compile(r'[^0-9\s,]')
_EXTRAS = "pip install -e '.[seqio]' (t5align's seqio extras)"


def _require(module: str, package: str, family: str):
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise ImportError(f'the {family} metric needs the package {package}: {_EXTRAS}, or pip '
                      f'install {package}.') from e


# ---------------------------------------------------------------------------------------------
# ROUGE.


@functools.cache
def _rouge_scorer():
  rouge_scorer = _require('rouge_score.rouge_scorer', 'rouge-score', 'rouge_geo')
  return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=False)


def geometric_mean(values: Sequence[float]) -> float:
  """The geometric mean of non-negative values (0 if any is 0)."""
  if any(v <= 0 for v in values):
    return 0.0
  return float(math.exp(sum(math.log(v) for v in values) / len(values)))


def rouge(prediction: str, references: Sequence[str]) -> dict[str, float]:
  """{'rouge1', 'rouge2', 'rougeL'}: each F-measure x 100, the max over `references`."""
  scorer = _rouge_scorer()
  best = dict.fromkeys(ROUGE_TYPES, 0.0)
  for reference in references:
    scores = scorer.score(reference, prediction)  # (target, prediction)
    for key in ROUGE_TYPES:
      best[key] = max(best[key], 100 * scores[key].fmeasure)
  return best


# ---------------------------------------------------------------------------------------------
# Answers: F1 and exact match.


def normalize_answer(text: str, transliterate: bool = False) -> str:
  """SQuAD normalization (lower case, no ASCII punctuation, no a/an/the, single spaces; the
  paper's tasks use it too, as `metrics.normalize_answer`), then ZeroSCROLLS' `unidecode` of the
  result when `transliterate` (after normalizing, as upstream: so '«The»' keeps its '<<>>')."""
  text = ''.join(ch for ch in text.lower() if ch not in _PUNCTUATION)
  text = ' '.join(_ARTICLES.sub(' ', text).split())
  if transliterate:
    text = _require('unidecode', 'unidecode', 'f1_unidecode').unidecode(text)
  return text


def token_f1(prediction: str, reference: str, transliterate: bool = False) -> float:
  """SQuAD token F1 x 100 of the normalized texts; 0 when they share no token."""
  pred = normalize_answer(prediction, transliterate).split()
  gold = normalize_answer(reference, transliterate).split()
  same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred), same / len(gold)
  return 100 * 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, reference: str) -> float:
  """100 if the SQuAD-normalized texts are equal, else 0."""
  return 100.0 * (normalize_answer(prediction) == normalize_answer(reference))


# ---------------------------------------------------------------------------------------------
# QuALITY, SpaceDigest, BookSumSort.


def option_letter(text: str) -> str | None:
  """The first standalone letter A, B, C or D of `text` (None if there is none)."""
  match = _LETTER.search(text)
  return match.group() if match else None


def letter_accuracy(prediction: str, reference: str) -> float:
  """100 if the prediction's first option letter is the reference's.

  Raises:
    ValueError: for a reference without an option letter (not a QuALITY answer).
  """
  gold = option_letter(reference)
  if gold is None:
    raise ValueError(f'the QuALITY reference {reference[:80]!r} holds no option letter A-D.')
  return 100.0 * (option_letter(prediction) == gold)


def percentage(text: str) -> float | None:
  """The number of the first percentage in `text` ('40%' -> 40.0), None if there is none."""
  match = _PERCENTAGE.search(text)
  return float(match.group()[:-1]) if match else None


def exp_similarity(prediction: str, reference: str) -> float:
  """100 * 0.5 ** (|p - q| / 10); 0 when the prediction holds no percentage (a reference
  without one counts as 0%, as upstream)."""
  gold, pred = percentage(reference), percentage(prediction)
  if pred is None:
    return 0.0
  return 100 * 0.5 ** (abs((gold or 0.0) - pred) / 10)


def summary_ids(text: str) -> list[int]:
  """The integers left once every character but digits, commas and white space is dropped."""
  return [int(t) for t in _NOT_ID.sub('', text).replace(',', ' ').split()]


def concordance_index(prediction: str, reference: str) -> float:
  """100 x the fraction of ID pairs whose order in the prediction is the reference's; 0 unless
  the prediction's IDs are the reference's (as a multiset).

  Raises:
    ValueError: for a reference of fewer than 2 IDs or with a repeated ID (no order to score).
  """
  gold, pred = summary_ids(reference), summary_ids(prediction)
  if len(gold) < 2 or len(set(gold)) != len(gold):
    raise ValueError(f'the BookSumSort reference {reference[:80]!r} is not an order of 2 or '
                     'more distinct summary IDs.')
  if sorted(pred) != sorted(gold):
    return 0.0
  where = {summary: i for i, summary in enumerate(pred)}
  # Pairs (a, b) with a before b in the reference: in order when a is before b in the prediction.
  pairs = [(where[a], where[b]) for i, a in enumerate(gold) for b in gold[i + 1:]]
  return 100 * sum(x < y for x, y in pairs) / len(pairs)


# ---------------------------------------------------------------------------------------------
# The families: per example (the max over the references) and per task.


def _task_metrics(keys: Sequence[str], scores: Sequence[Mapping[str, float]]
                  ) -> dict[str, float]:
  """The mean of each of `keys` over the scored examples; {} when none was scored (a test split).

  Raises:
    ValueError: when only some examples were scored (references missing from some).
  """
  scored = [s for s in scores if s]
  if not scored:
    return {}
  if len(scored) != len(scores):
    raise ValueError(f'{len(scores) - len(scored)} of {len(scores)} examples have no reference '
                     'to score against: a task is scored as a whole (validation) or not (test).')
  return {k: float(sum(s[k] for s in scored) / len(scored)) for k in keys}


def _rouge_score(target: family.Target, prediction: str) -> dict[str, float]:
  references = family.references(target)
  if not references:
    return {}
  scores = rouge(prediction, references)
  return {**scores, 'rouge_geometric_mean': geometric_mean(list(scores.values()))}


def _rouge_aggregate(targets: Sequence[family.Target],
                     scores: Sequence[Mapping[str, float]]) -> dict[str, float]:
  """The mean ROUGE-1/2/L, their geometric mean as 'rouge_geometric_mean' and 'score', and the
  mean per-example geometric mean as 'rouge_geometric_mean_per_example'."""
  del targets
  out = _task_metrics((*ROUGE_TYPES, 'rouge_geometric_mean'), scores)
  if out:
    out['rouge_geometric_mean_per_example'] = out.pop('rouge_geometric_mean')
    out['rouge_geometric_mean'] = geometric_mean([out[k] for k in ROUGE_TYPES])
    out['score'] = out['rouge_geometric_mean']
  return out


def _best_of(name: str, one: Callable[[str, str], float]) -> family.Family:
  """A family scoring `one(prediction, reference)`, the max over the references, as
  `SCORE_KEY[name]`; the task's 'score' is its mean."""
  key = SCORE_KEY[name]

  def score(target: family.Target, prediction: str) -> dict[str, float]:
    references = family.references(target)
    return {key: max(one(prediction, r) for r in references)} if references else {}

  def aggregate(targets: Sequence[family.Target],
                scores: Sequence[Mapping[str, float]]) -> dict[str, float]:
    del targets
    out = _task_metrics((key,), scores)
    return {**out, 'score': out[key]} if out else out

  return family.Family(name, score, aggregate, 'score')


# Each example's scores are {} without references (a test split, whose gold is private); a
# task's metrics then are {} too.
FAMILIES = family.registry(
    family.Family('rouge_geo', _rouge_score, _rouge_aggregate, 'score'),
    _best_of('f1', token_f1),
    _best_of('f1_unidecode', functools.partial(token_f1, transliterate=True)),
    _best_of('exact_match', exact_match),
    _best_of('letter_acc', letter_accuracy),
    _best_of('exp_sim', exp_similarity),
    _best_of('c_index', concordance_index))
