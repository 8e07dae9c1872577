"""Multi-document QA in the Lost in the Middle format (no seqio needed).

Two sources with one prompt:
  upstream  the released files qa_data/{N}_total_documents/nq-open-{N}_total_documents_gold_at_{K}
            (retrieved distractors, gold document at position K), used as they are.
  oracle    built here from nq-open-oracle (each question with its gold document only): the
            N - 1 distractors of question i are gold documents of other questions, drawn by a
            generator seeded (seed, N, i) and skipping any that contain one of question i's
            answers (normalized, as whole words), then the gold document is put at position K.
            The distractors and their order do not depend on K, so the positions compare like
            upstream's.
Retrieved distractors are harder than other questions' gold passages, so the oracle variant
scores higher than the paper's numbers; it is for relative comparisons (tau settings, positions).
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

from seqio_tasks import data
from seqio_tasks import metrics

QA_INSTRUCTION = ('Write a high-quality answer for the given question using only the provided '
                  'search results (some of which might be irrelevant).')
# The paper's settings: 10, 20 and 30 documents, gold at the first, every fifth and last place.
GOLD_POSITIONS = {10: (0, 4, 9), 20: (0, 4, 9, 14, 19), 30: (0, 4, 9, 14, 19, 24, 29)}


def qa_prompt(question: str, documents: Sequence[tuple[str, str]]) -> str:
  """Instruction, 'Document [i](Title: t) text' lines, then 'Question: ...\\nAnswer:'."""
  docs = '\n'.join(f'Document [{i + 1}](Title: {title}) {text}'
                   for i, (title, text) in enumerate(documents))
  return f'{QA_INSTRUCTION}\n\n{docs}\n\nQuestion: {question}\nAnswer:'


def _documents(record: dict[str, Any], path: Any, line: int) -> list[tuple[str, str]]:
  ctxs = record['ctxs']
  if not isinstance(ctxs, list) or not ctxs:
    raise data.DataError(f"{path}:{line}: field 'ctxs' should be a non-empty list.")
  docs = []
  for j, ctx in enumerate(ctxs):
    if not isinstance(ctx, dict) or not isinstance(ctx.get('title'), str) or not isinstance(
        ctx.get('text'), str):
      raise data.DataError(f"{path}:{line}: ctxs[{j}] needs string fields 'title' and 'text'.")
    docs.append((ctx['title'], ctx['text']))
  return docs


def _answers(record: dict[str, Any], path: Any, line: int) -> list[str]:
  answers = record['answers']
  if not isinstance(answers, list) or not answers or not all(
      isinstance(a, str) for a in answers):
    raise data.DataError(f"{path}:{line}: field 'answers' should be a non-empty list of "
                         'strings.')
  return answers


def read_qa_file(path) -> Iterator[tuple[int, str, list[str], list[tuple[str, str]]]]:
  """(line, question, answers, documents) for each record of a Lost in the Middle QA file."""
  for line, record in data.read_jsonl(path, ('question', 'answers', 'ctxs')):
    question = data.field(record, 'question', str, path, line)
    yield line, question, _answers(record, path, line), _documents(record, path, line)


def upstream_examples(num_docs: int, gold_index: int) -> Iterator[data.Example]:
  """The released Lost in the Middle file for (num_docs, gold_index), as is."""
  path = data.find_file(
      f'lost_in_the_middle/qa_data/{num_docs}_total_documents/'
      f'nq-open-{num_docs}_total_documents_gold_at_{gold_index}.jsonl', 'lost_in_the_middle')
  for line, question, answers, docs in read_qa_file(path):
    if len(docs) != num_docs:
      raise data.DataError(f'{path}:{line}: {len(docs)} documents; expected {num_docs}.')
    yield data.example(f'mdqa_{num_docs}/{gold_index}/{line}', qa_prompt(question, docs),
                       answers[0], answers=answers)


def oracle_examples(num_docs: int, gold_index: int, seed: int = 0,
                    num_examples: int | None = None) -> Iterator[data.Example]:
  """The built-in variant from nq-open-oracle (see the module docstring)."""
  if not 0 <= gold_index < num_docs:
    raise ValueError(f'gold_index={gold_index} outside [0, {num_docs}).')
  path = data.find_file('lost_in_the_middle/nq-open-oracle.jsonl', 'lost_in_the_middle')
  records = list(read_qa_file(path))
  if len(records) < num_docs:
    raise data.DataError(f'{path}: {len(records)} questions; {num_docs} documents need at least '
                         f'{num_docs} (distractors are other questions\' gold documents).')
  golds = [docs[0] for _, _, _, docs in records]
  gold_norm = [f' {metrics.normalize_answer(f"{t} {x}")} ' for t, x in golds]
  count = len(records) if num_examples is None else min(num_examples, len(records))
  for i in range(count):
    line, question, answers, docs = records[i]
    normalized = [f' {a} ' for a in (metrics.normalize_answer(a) for a in answers) if a]
    rng = data.rng_for(seed, num_docs, i)
    distractors = []
    for j in rng.permutation(len(records)):
      # Whole-word match, so that a one-letter answer ('S') does not rule out every passage.
      if j == i or golds[j] == docs[0] or any(a in gold_norm[j] for a in normalized):
        continue
      distractors.append(golds[j])
      if len(distractors) == num_docs - 1:
        break
    if len(distractors) < num_docs - 1:
      raise data.DataError(f'{path}:{line}: only {len(distractors)} documents without the '
                           f'answer; {num_docs - 1} distractors needed.')
    ordered = distractors[:gold_index] + [docs[0]] + distractors[gold_index:]
    yield data.example(f'mdqa_oracle_{num_docs}/{gold_index}/{line}',
                       qa_prompt(question, ordered), answers[0], answers=answers)
