"""Writes zero_scrolls/{task}/test.jsonl beside this file: one or two invented test records per
ZeroSCROLLS task in the suite's record format (no suite text; see README.md).

    python tests/testdata/t5x_infer/make_zero_scrolls.py
"""
from __future__ import annotations

import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
SEPARATOR = '... [the remainder is left out]\n\n'
NOTES = ('The keeper of the Marrow Isle lighthouse logs the tide at dawn and at dusk. '
         'The ferry from Port Calder runs on Tuesdays and Fridays in spring. '
         'Supplies arrive in blue crates painted with a gull. ')
MEMO = ('The orchard committee met on a rainy Thursday to plan the cider festival. '
        'Volunteers will press apples in the old barn and sell jars of pear jam. ')
# task: (instruction, document label, [(id, repeats of the text, question or None)]).
RECORDS = {
    'gov_report': ('Write a short summary of the memo.', 'Memo', [('beef0c33', 3, None),
                                                                 ('beef0d44', 30, None)]),
    'summ_screen_fd': ('Summarize the scene in two sentences.', 'Scene', [('a1b2c3d4', 2, None)]),
    'qmsum': ('Answer the request about the minutes.', 'Minutes',
              [('d00d0001', 4, 'What will volunteers sell?')]),
    'squality': ('Answer the request about the story.', 'Story',
                 [('5a1e0001', 2, 'Describe the meeting.')]),
    'qasper': ('Answer from the notes with a short phrase.', 'Notes',
               [('5eed0a11', 2, 'What is painted on the crates?'),
                ('5eed0b22', 40, 'Who logs the tide?'),
                ('5eed0a11', 2, 'What is painted on the crates?')]),  # one id, two rows
    'narrative_qa': ('Answer from the tale in a few words.', 'Tale',
                     [('7a1e0001', 5, 'When does the ferry run?')]),
    'quality': ('Pick the right option and give its letter.', 'Text',
                [('0a7c0001', 2, 'Which day?\n\n(A) Monday\n(B) Tuesday\n(C) Sunday\n(D) None')]),
    'musique': ('Answer from the paragraphs.', 'Paragraphs',
                [('3e5a0001', 3, 'Where does the ferry start?')]),
    'space_digest': ('Give the percentage of positive reviews.', 'Reviews',
                     [('5bac0001', 2, None)]),
    'book_sum_sort': ('Order the chapter summaries.', 'Summaries', [('b00c0001', 2, None)]),
}
WITH_INNER_DOCS = ('musique', 'space_digest', 'book_sum_sort')


def record(task: str, instruction: str, label: str, rid: str, repeats: int, question,
           row: int) -> dict:
  """One record: 'input' = instruction, document, query, response header; character indices."""
  text = (MEMO if task in ('gov_report', 'qmsum', 'squality') else NOTES) * repeats
  head = f'{instruction}\n\n{label}:\n'
  before = f'{head}{text}\n\n'
  if question is None:
    prompt, query_end = f'{before}Answer:', len(before)
  else:
    prompt = f'{before}Question:\n{question}\n\nAnswer:'
    query_end = len(before) + len('Question:\n') + len(question)
  out = {'id': rid, 'pid': f'{rid}_{row}', 'input': prompt, 'output': None,
         'document_start_index': len(head), 'document_end_index': len(head) + len(text),
         'query_start_index': len(before), 'query_end_index': query_end,
         'truncation_seperator': SEPARATOR}
  if task in WITH_INNER_DOCS:
    out['inner_docs_start_indices'] = [len(head)]
  return out


def main() -> None:
  for task, (instruction, label, rows) in RECORDS.items():
    folder = HERE / 'zero_scrolls' / task
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(record(task, instruction, label, *row, n)) for n, row in enumerate(rows)]
    (folder / 'test.jsonl').write_text(''.join(line + '\n' for line in lines), encoding='utf-8')


if __name__ == '__main__':
  main()
