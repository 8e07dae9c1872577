"""RULER (Hsieh et al., 2024; NVIDIA/RULER, Apache-2.0) for t5align: a facade.

  `suite`     the 13 tasks, the lengths (512 .. 16384 tokens), each task's metric and decode
              length, and `examples(task, L, encode, ...)`: the generator's records as examples;
              `SUITE`, all of it as a `seqio_tasks.suite.Suite` (the `t5align_ruler_{task}_{L}`
              seqio tasks' source, `seqio_tasks.catalog`).
  `metrics`   string_match_all / string_match_part as upstream defines them.
  `generate`  the sample generator (`samples(task, max_seq_length, tokenizer, seed=...,
              num_samples=...)`), imported on first use: it needs the `wonderwords` word lists
              and, for the essay and QA tasks, the user's downloads (docs/ruler.md).
"""
from seqio_tasks.ruler import metrics
from seqio_tasks.ruler import suite
from seqio_tasks.ruler.suite import (FAMILIES, LENGTHS, MAX_DECODE_LENGTH, OFFLINE_TASKS, SUITE,
                                     TASKS)

__all__ = ['FAMILIES', 'LENGTHS', 'MAX_DECODE_LENGTH', 'OFFLINE_TASKS', 'SUITE', 'TASKS',
           'metrics', 'suite']


def __getattr__(name: str):
  if name == 'generate':  # Not at import: the catalog needs only the names above.
    import importlib  # pylint: disable=g-import-not-at-top
    return importlib.import_module('seqio_tasks.ruler.generate')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
