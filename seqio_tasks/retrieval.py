"""Retrieval tasks as text examples: passkey, LongEval lines and topics, JSON key-value retrieval.

Every builder yields dicts {'id', 'inputs', 'targets', 'meta'} where 'meta' is a JSON string
with what the metrics need beyond 'targets'. Nothing here imports seqio.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

from seqio_tasks import data

# Passkey retrieval (Mohtashami & Jaggi 2023, landmark attention), upstream wording.
PASSKEY_TASK = ('There is an important info hidden inside a lot of irrelevant text. Find it and '
                'memorize them. I will quiz you about the important information there.')
PASSKEY_FILLER = ('The grass is green. The sky is blue. The sun is yellow. Here we go. '
                  'There and back again.')
PASSKEY_QUESTION = 'What is the pass key? The pass key is'
PASSKEY_MAX = 50000

# LongChat LongEval line retrieval (longeval/evaluation/lines), upstream wording. Upstream ships the
# prompt only inside its data files (`lines_examples` reads them); `lines_prompt` rebuilds it.
LINES_HEADER = (
    "Below is a record of lines I want you to remember. Each line begins with 'line <line "
    "index>' and contains a '<REGISTER_CONTENT>' at the end of the line as a numerical value. "
    'For each line index, memorize its corresponding <REGISTER_CONTENT>. At the end of the '
    'record, I will ask you to retrieve the corresponding <REGISTER_CONTENT> of a certain line '
    'index. Now the record start:\n\n')
LINES_QUESTION = ('\nNow the record is over. Tell me what is the <REGISTER_CONTENT> in line {}? '
                  'I need the number. ')

# Lost in the Middle key-value retrieval prompt.
KV_INSTRUCTION = 'Extract the value corresponding to the specified key in the JSON object below.'


# ---------------------------------------------------------------------------------------------
# Passkey.


def passkey_needle(name: str, value: int) -> str:
  """'The pass key is 123. Remember it. 123 is the pass key.' for name 'pass key'."""
  return f'The {name} is {value}. Remember it. {value} is the {name}.'


def passkey_prompt(n_garbage: int, prefix_chars: int, key: int,
                   decoys: Sequence[tuple[int, str, int]] = ()) -> str:
  """Task line, `prefix_chars` of filler, the needle, the rest of the filler, the question.

  As upstream, `n_garbage` counts filler *characters*: each filler piece is cut from the start
  of the filler sentences repeated, so a piece may end mid-sentence. The paper's "# of sentences"
  settings 20k..55k are these character counts (55k characters are ~15k T5 tokens).

  `decoys` (not in the paper; used to train and test the shipped model) are extra needles
  `(chars, name, value)` worded like the pass key's ('The door code is 77. Remember it. ...'),
  each placed after `chars` filler characters; at equal positions the pass key comes first.
  """
  needles = [(prefix_chars, passkey_needle('pass key', key))]
  needles += [(chars, passkey_needle(name, value)) for chars, name, value in decoys]
  for chars, _ in needles:
    if not 0 <= chars <= n_garbage:
      raise ValueError(f'needle position {chars} outside [0, {n_garbage}].')
  filler = ' '.join([PASSKEY_FILLER] * (n_garbage // len(PASSKEY_FILLER) + 2))
  parts, done = [PASSKEY_TASK], 0
  for chars, text in sorted(needles, key=lambda n: n[0]):
    parts += [filler[:chars - done], text]
    done = chars
  return '\n'.join(parts + [filler[:n_garbage - done], PASSKEY_QUESTION])


def passkey_examples(n_garbage: int, num_examples: int, seed: int = 0) -> Iterator[data.Example]:
  """Example i: needle depth and key in 1..50000 drawn from a generator seeded (seed, n, i)."""
  for i in range(num_examples):
    rng = data.rng_for(seed, n_garbage, i)
    prefix = int(rng.integers(0, n_garbage + 1))
    key = int(rng.integers(1, PASSKEY_MAX + 1))
    yield data.example(f'passkey_{n_garbage}/{i}', passkey_prompt(n_garbage, prefix, key),
                       str(key), depth=prefix / max(n_garbage, 1))


# ---------------------------------------------------------------------------------------------
# LongChat LongEval lines and topics.


def lines_examples(num_lines: int) -> Iterator[data.Example]:
  """LongEval line retrieval: the file's prompt; target the expected REGISTER_CONTENT number."""
  path = data.find_file(f'longeval/lines/{num_lines}_lines.jsonl', 'longeval')
  for line, record in data.read_jsonl(path, ('prompt', 'expected_number')):
    prompt = data.field(record, 'prompt', str, path, line)
    number = data.field(record, 'expected_number', int, path, line)
    yield data.example(f'{num_lines}_lines/{line}', prompt, str(number), line=line)


def lines_record(line_id: str, number: int) -> str:
  """One line of LongEval's record: 'line <id>: REGISTER_CONTENT is <n>'."""
  return f'line {line_id}: REGISTER_CONTENT is <{number}>'


def lines_prompt(records: Sequence[tuple[str, int]], line_id: str,
                 record: Callable[[str, int], str] = lines_record) -> str:
  """LongEval's prompt: header, one `record` (LongEval's `lines_record`) per line, question."""
  body = ''.join(record(k, v) + '\n' for k, v in records)
  return LINES_HEADER + body + LINES_QUESTION.format(line_id)


def _topic_list(value, path, line) -> list[str]:
  if (not isinstance(value, list) or not value
      or not all(isinstance(t, str) and t.strip() for t in value)):
    raise data.DataError(f"{path}:{line}: field 'topics' should be a non-empty list of "
                         f'non-empty strings, got {str(value)[:80]!r}.')
  return value


def topics_examples(num_topics: int) -> Iterator[data.Example]:
  """LongEval topic retrieval: the file's prompt; target topics[0], the first topic discussed."""
  path = data.find_file(f'longeval/topics/{num_topics}_topics.jsonl', 'longeval')
  for line, record in data.read_jsonl(path, ('prompt', 'topics')):
    prompt = data.field(record, 'prompt', str, path, line)
    topics = _topic_list(record['topics'], path, line)
    yield data.example(f'{num_topics}_topics/{line}', prompt, topics[0], topics=topics)


# ---------------------------------------------------------------------------------------------
# Lost in the Middle key-value retrieval.


def kv_record(key: str, value: str) -> str:
  """One pair of the upstream prompt's JSON object: '"key": "value"'."""
  return f'"{key}": "{value}"'


def kv_prompt(records: Sequence[tuple[str, str]], key: str) -> str:
  """The upstream prompt: one JSON object, one `kv_record` per line."""
  pairs = [kv_record(k, v) for k, v in records]
  body = '{' + ',\n '.join(pairs) + '}'
  return f'{KV_INSTRUCTION}\n\nJSON data:\n{body}\n\nKey: "{key}"\nCorresponding value:'


def kv_gold_positions(num_keys: int) -> tuple[int, ...]:
  """Upstream's gold positions: first, then every quarter (75 keys: 0, 24, 49, 74)."""
  return {75: (0, 24, 49, 74), 140: (0, 34, 69, 104, 139),
          300: (0, 49, 99, 149, 199, 249, 299)}.get(
              num_keys, tuple(sorted({0, *(round(num_keys * q / 4) - 1 for q in (1, 2, 3, 4))})))


def kv_examples(num_keys: int, gold_index: int) -> Iterator[data.Example]:
  """Key-value retrieval with the queried pair moved to `gold_index`, as upstream does."""
  path = data.find_file(f'lost_in_the_middle/kv-retrieval-{num_keys}_keys.jsonl',
                        'lost_in_the_middle')
  for line, record in data.read_jsonl(path, ('ordered_kv_records', 'key', 'value')):
    key = data.field(record, 'key', str, path, line)
    value = data.field(record, 'value', str, path, line)
    records = record['ordered_kv_records']
    if (not isinstance(records, list)
        or not all(isinstance(r, list) and len(r) == 2 for r in records)):
      raise data.DataError(f"{path}:{line}: 'ordered_kv_records' should be a list of "
                           '[key, value] pairs.')
    records = [tuple(r) for r in records]
    if (key, value) not in records:
      raise data.DataError(f'{path}:{line}: the pair ({key!r}, {value!r}) is not among '
                           "'ordered_kv_records'.")
    if not 0 <= gold_index < len(records):
      raise ValueError(f'gold_index={gold_index} outside the {len(records)} records of {path}.')
    records.remove((key, value))
    records.insert(gold_index, (key, value))
    yield data.example(f'kv_{num_keys}/{gold_index}/{line}', kv_prompt(records, key), value,
                       key=key)
