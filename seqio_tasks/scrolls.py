"""SCROLLS (Shaham et al., 2022, arXiv:2201.03533) as seqio tasks over the TFDS data set `scrolls`.

Data: TFDS `scrolls/{config}:1.0.0` (`tfds_name`), prepared once by the user (TFDS downloads
`https://scrolls-tau.s3.us-east-2.amazonaws.com/{config}.zip`, the files the HuggingFace data set
tau/scrolls serves); read from `scrolls_data_dir()` when the gin binding
`seqio_tasks.scrolls_data_dir.path` names a folder, else where seqio and TFDS look (t5x's
--tfds_data_dir, $TFDS_DATA_DIR, ~/tensorflow_datasets). Every row is {id, pid, input, output}
(Text features; TFDS stores a test row's null output as ''); `input` already holds the query
before the document (two newlines between), QuALITY's options in the query. Rows that share an
`id` share their input and hold one reference each.

Two kinds of tasks, named 't5align_' + :
  scrolls_{config}        fine-tuning (`register`): splits 'train', 'validation', 'test', one
                          example per row: 'inputs' = input, 'targets' = output, tokenized and cut
                          by seqio to the run's feature lengths keeping the start, EOS appended
                          (`append_eos_after_trim`), as SCROLLS' baselines cut (HF tokenizer
                          truncation at max_source_length). No metric: score with the next kind.
  scrolls_{config}_{L}    evaluation (`examples`, seqio_tasks.catalog): splits 'validation' and
                          'test', one example per id, its input's first L - 1 tokens and EOS, its
                          'meta' holding every reference of its rows, scored by SCROLLS' metric
                          for the config (`FAMILIES`: the max over the references per example).
Mixtures: `t5align_scrolls` (the 7 fine-tuning tasks, rates proportional to their training rows)
and, in the catalog, `t5align_scrolls_{L}` (the 7 evaluation tasks at L).
"""
from __future__ import annotations

import functools
import hashlib
from typing import Any, Callable, Iterator, Sequence

import gin
import numpy as np

from seqio_tasks import data
from seqio_tasks import suite
from t5align.evaluation.suites import scrolls as layout

Encode = Callable[[str], Sequence[int]]

# Task names: PREFIX + config (fine-tuning), PREFIX + config + '_' + L (evaluation).
PREFIX = 't5align_scrolls_'
MIXTURE = 't5align_scrolls'  # The fine-tuning tasks'.
# The leaderboard's order; its abbreviations, as the report's layout writes them (their one
# place).
TASKS = ('gov_report', 'summ_screen_fd', 'qmsum', 'qasper', 'narrative_qa', 'quality',
         'contract_nli')
COLUMNS = dict(zip(TASKS, layout.LAYOUT.columns, strict=True))
# Each config's metric (a `seqio_tasks.suite_metrics` family), as SCROLLS' metric file's
# DATASET_TO_METRICS: ROUGE's geometric mean, SQuAD F1, exact match.
FAMILIES = {'gov_report': 'rouge_geo', 'summ_screen_fd': 'rouge_geo', 'qmsum': 'rouge_geo',
            'qasper': 'f1', 'narrative_qa': 'f1', 'quality': 'exact_match',
            'contract_nli': 'exact_match'}
VERSION = '1.0.0'
FEATURES = ('id', 'pid', 'input', 'output')
SPLITS = ('train', 'validation', 'test')
EVAL_SPLITS = ('validation', 'test')
# Evaluation input lengths: 512 and 1024 (BART-base's longer baselines, 256 being the third; a
# T5 fine-tuned that long reads them in distribution), 2048 (UL2's published setting), 4096
# (LED-base's middle baseline), 8192 (the curve between), 16384 (LED-base's longest and
# LongT5's published setting).
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
# The baselines' generation length (max_target_length 1024), greedy (num_beams 1).
MAX_DECODE_LENGTH = 1024
DOWNLOAD = 'https://scrolls-tau.s3.us-east-2.amazonaws.com/{config}.zip'
SETTING = ("the gin binding seqio_tasks.scrolls_data_dir.path = '/path', $TFDS_DATA_DIR, or "
           "t5x's --tfds_data_dir")


def tfds_name(config: str) -> str:
  """The TFDS name of a config, version pinned: 'scrolls/qasper:1.0.0'."""
  _check(config)
  return f'scrolls/{config}:{VERSION}'


@gin.configurable(module='seqio_tasks')
def scrolls_data_dir(path: str | None = None) -> str | None:
  """The TFDS data folder holding `scrolls/`: the gin binding; None: seqio's and TFDS's own
  choice (seqio's override, i.e. t5x's --tfds_data_dir, then $TFDS_DATA_DIR, then
  ~/tensorflow_datasets)."""
  return path


def _check(config: str, split: str | None = None, splits: Sequence[str] = SPLITS) -> None:
  if config not in TASKS:
    raise ValueError(f'no SCROLLS config {config!r}; the configs are {", ".join(TASKS)}.')
  if split is not None and split not in splits:
    raise ValueError(f'SCROLLS {config}: no split {split!r} here; the splits are {splits}.')


def missing_message(config: str, split: str, error: Exception) -> str:
  """What to do when the TFDS data of `config` is not prepared where it is read."""
  return (f'SCROLLS {config} ({split}): TFDS has no prepared {tfds_name(config)} where it looked '
          f'({error}). Prepare it once on a machine with network access, '
          f"tfds.builder('{tfds_name(config)}', data_dir=DIR).download_and_prepare() (it fetches "
          f'{DOWNLOAD.format(config=config)}), copy DIR here and name it with {SETTING}.')


@functools.cache
def _source_class():
  """seqio.TfdsDataSource reading `scrolls_data_dir()` at the time of use, and naming the fix
  when the data is not prepared (seqio is imported here, not with this module)."""
  import seqio  # pylint: disable=g-import-not-at-top

  class ScrollsSource(seqio.TfdsDataSource):
    """TFDS `scrolls/{config}:1.0.0`, read-only (nothing is downloaded by a run)."""

    def __init__(self, config: str):
      super().__init__(tfds_name=tfds_name(config), splits=SPLITS, read_only=True)
      self.config = config
      self._loaders: dict[str, Any] = {}

    @property
    def tfds_dataset(self):
      path = scrolls_data_dir()
      if path is None:
        return super().tfds_dataset
      if path not in self._loaders:  # The binding wins over seqio's global override.
        loader = seqio.utils.LazyTfdsLoader(tfds_name(self.config), read_only=True)
        loader.override_data_dir(path)
        self._loaders[path] = loader
      return self._loaders[path]

    def get_dataset(self, split: str = 'train', shuffle: bool = True,
                    seed: int | None = None, shard_info: Any = None, **kwargs):
      _check(self.config, split)
      try:
        return super().get_dataset(split, shuffle, seed, shard_info, **kwargs)
      except AssertionError as e:  # TFDS's "could not find data in DIR".
        raise FileNotFoundError(missing_message(self.config, split, e)) from e

  return ScrollsSource


def source(config: str):
  """The `seqio.TfdsDataSource` of a config (`scrolls_data_dir` read when a split is)."""
  _check(config)
  return _source_class()(config)


def read_rows(config: str, split: str) -> Iterator[tuple[int, dict[str, str]]]:
  """(row index, row) for each row of a split in TFDS's order, its fields checked as text.

  Raises:
    FileNotFoundError: when the data is not prepared (`missing_message`).
    data.DataError: for a row without one of `FEATURES` or with a field that is not UTF-8
      text, naming the data set, split, row and pid.
  """
  _check(config, split)
  where = f'{tfds_name(config)} split {split!r}'
  dataset = source(config).get_dataset(split, shuffle=False)
  for index, raw in enumerate(dataset.as_numpy_iterator()):
    missing = [k for k in FEATURES if k not in raw]
    if missing:
      raise data.DataError(f'{where}, row {index}: missing field(s) {missing} of the SCROLLS '
                           f'record format; the row has {sorted(raw)}.')
    row = {}
    for key in FEATURES:
      value = raw[key]
      if isinstance(value, bytes):
        try:
          value = value.decode('utf-8')
        except UnicodeDecodeError as e:
          raise data.DataError(f'{where}, row {index}: field {key!r} is not UTF-8 ({e}).') from e
      if not isinstance(value, str):
        raise data.DataError(f'{where}, row {index}: field {key!r} should be text, got '
                             f'{type(value).__name__}.')
      row[key] = value
    yield index, row


def model_input(text: str, max_tokens: int, encode: Encode,
                eos_id: int) -> tuple[np.ndarray, int]:
  """An input cut as SCROLLS' baselines cut it: its first `max_tokens - 1` tokens and EOS.

  Returns:
    (tokens int32 `[min(n + 1, max_tokens)]`, the untruncated length n + 1 with its EOS).
  """
  if max_tokens < 1:
    raise ValueError(f'max_tokens is {max_tokens}; an input needs room for its EOS.')
  tokens = list(encode(text))
  return np.asarray([*tokens[:max_tokens - 1], eos_id], np.int32), len(tokens) + 1


def examples(config: str, split: str, max_tokens: int, encode: Encode,
             eos_id: int) -> Iterator[dict[str, Any]]:
  """A config's evaluation examples at `max_tokens` input tokens, one per id, in the order of
  each id's first row (the seqio tasks' `build`).

  Each is {'id', 'inputs': int32 `[n <= max_tokens]` (`model_input`), 'targets': the first
  reference's tokens + EOS (none, in 'test': EOS alone), 'targets_pretokenized': that reference
  ('' without), 'meta': JSON of {'outputs': every reference of the id's rows in row order,
  'config', 'row': the first row, 'pids', 'input_tokens': the untruncated length}}. In 'test'
  (outputs private: '') an id has no reference and is predicted, not scored.

  Raises:
    data.DataError: for rows sharing an id with different inputs, and for a 'validation' row
      with an empty output (gold outputs are there; TFDS writes a null one as ''), naming the
      data set, split, row and pid.
  """
  _check(config, split, EVAL_SPLITS)
  where = f'{tfds_name(config)} split {split!r}'

  def as_row(index: int, fields: dict[str, str]) -> suite.Row[tuple[np.ndarray, int]]:
    at = f'{where}, row {index} (pid {fields["pid"]!r})'
    if split == 'validation' and not fields['output']:
      raise data.DataError(f'{at}: empty output; the validation split holds gold outputs (a '
                           'null one reads as "").')
    return suite.Row(fields['id'], hashlib.sha256(fields['input'].encode('utf-8')).digest(),
                     fields['output'] or None, index,
                     lambda: model_input(fields['input'], max_tokens, encode, eos_id),
                     lambda first: f'{at}: id {fields["id"]!r} repeats row {first} with another '
                     'input.', fields['pid'])

  for group in suite.group_by_id(as_row(*r) for r in read_rows(config, split)):
    tokens, full = group.first
    target = group.outputs[0] if group.outputs else ''
    example = data.example(group.id, '', target, outputs=group.outputs, config=config,
                           row=group.position, pids=group.pids, input_tokens=full)
    example['inputs'] = tokens
    example['targets'] = np.asarray([*encode(target), eos_id] if target else [eos_id], np.int32)
    example['targets_pretokenized'] = target
    yield example


# SCROLLS' evaluation tasks as a `suite.Suite`: `t5align_scrolls_{config}_{L}`, splits
# 'validation' and 'test', read where `scrolls_data_dir()` says.
SUITE = suite.FileSuite('scrolls', TASKS, COLUMNS, FAMILIES, EVAL_SPLITS, LENGTHS,
                        dict.fromkeys(TASKS, MAX_DECODE_LENGTH), examples)


# ---------------------------------------------------------------------------------------------
# Fine-tuning tasks (seqio).


def register(output_features: Any) -> None:
  """Registers the fine-tuning tasks `t5align_scrolls_{config}` and the mixture
  `t5align_scrolls` that are not registered yet (`seqio_tasks.tasks` calls it with its
  vocabulary's features: 'inputs' and 'targets', EOS appended)."""
  import seqio  # pylint: disable=g-import-not-at-top
  rekey = functools.partial(seqio.preprocessors.rekey,
                            key_map={'inputs': 'input', 'targets': 'output', 'id': 'id',
                                     'pid': 'pid'})
  present = set(seqio.TaskRegistry.names())
  names = [f'{PREFIX}{config}' for config in TASKS]
  for config, name in zip(TASKS, names):
    if name not in present:
      seqio.TaskRegistry.add(
          name, source=source(config),
          preprocessors=[rekey, seqio.preprocessors.tokenize,
                         seqio.preprocessors.append_eos_after_trim],
          output_features=output_features, metric_fns=[])
  if MIXTURE not in seqio.MixtureRegistry.names():
    seqio.MixtureRegistry.add(MIXTURE, names, default_rate=seqio.mixing_rate_num_examples)
