"""RULER's prompt strings, needle formats and per-task settings (NVIDIA/RULER at c3f5e3b).

The strings are upstream's, character for character (tests/suites/ruler_generate_test.py compares
them with the constants stored beside the golden samples, read from upstream's
scripts/data/synthetic/constants.py): a generator's prompt is its `template` followed by its
`answer_prefix` (scripts/data/prepare.py with the 'base' model template, `{task_template}`), and an
example's encoder input is RULER's `input` + `answer_prefix`, as scripts/pred/call_api.py sends it.

`TASK_ARGS` is scripts/synthetic.yaml: each of the 13 tasks' generator and arguments; the
arguments a generator script defaults (e.g. niah's `num_needle_k`) are filled in here.
"""
from __future__ import annotations

import types
from typing import Any, Mapping

# scripts/data/synthetic/constants.py TASKS: tokens to generate, template, answer prefix.
GENERATORS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType({
    'niah': {
        'tokens_to_generate': 128,
        'template': (
            'Some special magic {type_needle_v} are hidden within the following text. Make sure '
            'to memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\n'
            'What are all the special magic {type_needle_v} for {query} mentioned in the '
            'provided text?'),
        'answer_prefix': (
            ' The special magic {type_needle_v} for {query} mentioned in the provided text are'),
    },
    'variable_tracking': {
        'tokens_to_generate': 30,
        'template': (
            'Memorize and track the chain(s) of variable assignment hidden in the following '
            'text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} '
            'in the text above.'),
        'answer_prefix': (
            ' Answer: According to the chain(s) of variable assignment in the text above, {num_v} '
            'variables are assigned the value {query}, they are: '),
    },
    'common_words_extraction': {
        'tokens_to_generate': 120,
        'template': (
            'Below is a numbered list of words. In these words, some appear more often than '
            'others. Memorize the ones that appear most often.\n{context}\nQuestion: What are the '
            '10 most common words in the above list?'),
        'answer_prefix': ' Answer: The top 10 words that appear most often in the list are:',
    },
    'freq_words_extraction': {
        'tokens_to_generate': 50,
        'template': (
            'Read the following coded text and track the frequency of each coded word. Find the '
            'three most frequently appeared coded words. {context}\nQuestion: Do not provide any '
            "explanation. Please ignore the dots '....'. What are the three most frequently "
            'appeared words in the above coded text?'),
        'answer_prefix': (
            ' Answer: According to the coded text above, the three most frequently appeared words '
            'are:'),
    },
    'qa': {
        'tokens_to_generate': 32,
        'template': (
            'Answer the question based on the given documents. Only give me the answer and do not '
            'output any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer '
            'the question based on the given documents. Only give me the answer and do not output '
            'any other words.\n\nQuestion: {query}'),
        'answer_prefix': ' Answer:',
    },
})

# niah.py: a needle, and the `noise` haystack's sentence (also variable_tracking.py's).
NEEDLE = 'One of the special magic {type_needle_v} for {key} is: {value}.'
NOISE = ('The grass is green. The sky is blue. The sun is yellow. Here we go. There and back '
         'again.')
# qa.py: one document of the context.
DOCUMENT_PROMPT = 'Document {i}:\n{document}'

_NIAH = {'num_needle_k': 1, 'num_needle_v': 1, 'num_needle_q': 1, 'type_needle_k': 'words',
         'type_needle_v': 'numbers'}


def _niah(**overrides: Any) -> dict[str, Any]:
  return {'generator': 'niah', **_NIAH, **overrides}


# scripts/synthetic.yaml, in its order (the README's); niah.py then raises num_needle_k to at
# least num_needle_q, as here.
TASK_ARGS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType({
    'niah_single_1': _niah(type_haystack='noise'),
    'niah_single_2': _niah(type_haystack='essay'),
    'niah_single_3': _niah(type_haystack='essay', type_needle_v='uuids'),
    'niah_multikey_1': _niah(type_haystack='essay', num_needle_k=4),
    'niah_multikey_2': _niah(type_haystack='needle'),
    'niah_multikey_3': _niah(type_haystack='needle', type_needle_k='uuids',
                             type_needle_v='uuids'),
    'niah_multivalue': _niah(type_haystack='essay', num_needle_v=4),
    'niah_multiquery': _niah(type_haystack='essay', num_needle_q=4),
    'vt': {'generator': 'variable_tracking', 'type_haystack': 'noise', 'num_chains': 1,
           'num_hops': 4},
    'cwe': {'generator': 'common_words_extraction', 'freq_cw': 30, 'freq_ucw': 3, 'num_cw': 10,
            'num_fewshot': 1},
    'fwe': {'generator': 'freq_words_extraction', 'alpha': 2.0, 'coded_wordlen': 6,
            'vocab_size': -1},
    'qa_1': {'generator': 'qa', 'dataset': 'squad'},
    'qa_2': {'generator': 'qa', 'dataset': 'hotpotqa'},
})


def prompt(generator: str) -> str:
  """A generator's whole prompt (template + answer prefix), as prepare.py hands it to the script."""
  spec = GENERATORS[generator]
  return spec['template'] + spec['answer_prefix']


def answer_prefix_marker(generator: str) -> str:
  """The text a script looks for (`rfind`) to cut the answer prefix off: its first 10 characters."""
  return GENERATORS[generator]['answer_prefix'][:10]
