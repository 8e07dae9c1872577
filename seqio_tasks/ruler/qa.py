"""RULER's QA generator (NVIDIA/RULER:scripts/data/synthetic/qa.py, c3f5e3b): a question and its
gold documents among `size` documents, draws in upstream's order.

Documents: SQuAD v2.0 dev paragraphs (qa_1; answerable questions only, their article's other
paragraphs drawn first as distractors) or HotpotQA dev-distractor titled paragraphs (qa_2:
"title\\nsentences..."), each pool sorted and deduplicated. Sample i asks question i; the
documents are its gold ones, then same-article ones, then random others, shuffled with the seed,
as "Document {i}:\\n{text}" joined by blank lines. The search probes with question 0.
"""
from __future__ import annotations

import random
from typing import Any, Mapping

from seqio_tasks.ruler import assets as assets_lib
from seqio_tasks.ruler import search
from seqio_tasks.ruler import templates


def read_squad(data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
  """read_squad over the parsed dev-v2.0.json: (questions, documents)."""
  docs = sorted({p['context'] for d in data['data'] for p in d['paragraphs']})
  doc_index = {c: i for i, c in enumerate(docs)}
  questions = []
  for d in data['data']:
    more = [doc_index[p['context']] for p in d['paragraphs']]
    for p in d['paragraphs']:
      for qa in p['qas']:
        if not qa['is_impossible']:
          this = doc_index[p['context']]
          questions.append({'query': qa['question'],
                            'outputs': [a['text'] for a in qa['answers']],
                            'context': [this],
                            'more_context': [i for i in more if i != this]})
  return questions, docs


def read_hotpotqa(data: list[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
  """read_hotpotqa over the parsed hotpot_dev_distractor_v1.json: (questions, documents)."""
  docs = sorted({f"{t}\n{''.join(p)}" for d in data for t, p in d['context']})
  doc_index = {c: i for i, c in enumerate(docs)}
  questions = [{'query': d['question'], 'outputs': [d['answer']],
                'context': [doc_index[f"{t}\n{''.join(p)}"] for t, p in d['context']]}
               for d in data]
  return questions, docs


class QA:
  """qa.py's draws for one task."""

  def __init__(self, dataset: str, rng: random.Random, seed: int, assets: assets_lib.Assets):
    if dataset == 'squad':
      self.questions, self.docs = read_squad(assets.require('squad'))
    elif dataset == 'hotpotqa':
      self.questions, self.docs = read_hotpotqa(assets.require('hotpotqa'))
    else:
      raise ValueError(f'RULER qa: data set {dataset!r}; expected squad or hotpotqa.')
    self.rng, self.seed = rng, seed

  def draw(self, index: int, size: int) -> tuple[str, list[str]]:
    """generate_input_output(index, num_docs=size)."""
    question = self.questions[index]
    gold, more = question['context'], question.get('more_context', [])
    if size < len(self.docs):
      if size < len(gold):  # upstream's random.sample(more, negative) raises ValueError.
        raise search.DrawError(f'{size} documents, fewer than question {index}\'s {len(gold)} '
                               'gold ones')
      if size - len(gold) > len(more):
        taken = set(gold + more)
        others = [i for i in range(len(self.docs)) if i not in taken]
        chosen = gold + more + self.rng.sample(others, max(0, size - len(gold) - len(more)))
      else:
        chosen = gold + self.rng.sample(more, size - len(gold))
      documents = [self.docs[i] for i in chosen]
    else:
      repeats = (size + len(self.docs) - 1) // len(self.docs)
      documents = (self.docs * repeats)[:size]
    random.Random(self.seed).shuffle(documents)
    context = '\n\n'.join(templates.DOCUMENT_PROMPT.format(i=i + 1, document=d)
                          for i, d in enumerate(documents))
    return templates.prompt('qa').format(context=context, query=question['query']), \
        question['outputs']


def generate(task: str, args: Mapping[str, Any], tokenizer: search.Tokenizer, *,
             max_seq_length: int, reserve: int, seed: int, num_samples: int,
             progress: search.Progress,
             assets: assets_lib.Assets | None) -> list[dict[str, Any]]:
  """qa.py's generate_samples (one chunk, pre_samples 0): the records it writes."""
  if assets is None:
    assets = assets_lib.Assets.from_data_dir((args['dataset'],))
  qa = QA(args['dataset'], random.Random(seed), seed, assets)
  if num_samples > len(qa.questions):
    raise ValueError(f'RULER {task}: {num_samples} samples asked for, but the data set has '
                     f'{len(qa.questions)} questions (upstream would loop forever).')
  step = 10
  size = search.haystack_size(lambda n: qa.draw(0, n), tokenizer, max_seq_length=max_seq_length,
                              incremental=step, estimate_at=step,
                              upper_bound=search.upper_bound_3x, reserve=reserve)
  marker = templates.answer_prefix_marker('qa')
  records = []
  for index in range(num_samples):
    text, answer, length = search.sample(lambda n, i=index: qa.draw(i, n), tokenizer, size=size,
                                         incremental=step, max_seq_length=max_seq_length,
                                         reserve=reserve, task=task, unit='documents')
    records.append(search.record(index, text, answer, length, marker))
    progress()
  return records
