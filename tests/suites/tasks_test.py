"""The long-context suites as tasks (ZeroSCROLLS, SCROLLS, RULER): the catalog's specs and
mixtures of every `catalog.SUITES` suite and their decode lengths (parametrized over the suites),
then each suite's own readers and registered seqio tasks: ZeroSCROLLS' files, the official runner's
truncation and the leaderboard's CSV; SCROLLS' truncation and its tasks over mocked TFDS data;
RULER's options, records as examples and the real generator on the offline tasks.

Every fixture is written by the test in the suite's record format (ZeroSCROLLS: {id, pid, input,
output, document_start_index, document_end_index, query_start_index, query_end_index,
truncation_seperator}, inside `{task}.zip` as `{task}/{split}.jsonl`, or extracted; SCROLLS: TFDS
`tfds.testing.mock_data` rows {id, pid, input, output}, rows sharing an id holding one reference
each, as NarrativeQA's and Qasper's do; RULER: written-out records in its jsonl format through a
stand-in generator); no suite data is committed. ZeroSCROLLS' truncation is checked on a
SentencePiece model trained in the test; the seqio tasks on the shipped model's vocabulary.
Upstream facts for RULER (NVIDIA/RULER at c3f5e3b, ../shared/docs/YARDSTICKS.md section 1):
tokens_to_generate 128 (NIAH), 30 (vt), 120 (cwe), 50 (fwe), 32 (qa); QA scored with
string_match_part, the rest with string_match_all; NUM_SAMPLES = 500.
"""
from __future__ import annotations

import csv
import json
import pathlib
import shutil
import sys
import types
import zipfile

import numpy as np
import pytest

from seqio_tasks import catalog
from seqio_tasks import data
from seqio_tasks import metrics
from seqio_tasks import ruler
from seqio_tasks import scrolls
from seqio_tasks import zeroscrolls
from seqio_tasks.ruler import suite

SHIPPED_VOCABULARY = (pathlib.Path(__file__).resolve().parents[2] / 't5align' / 'shipped'
                      / 'retrieval_t5' / 'sentencepiece.model')
EOS = 1
SUITES = {one.name: one for one in catalog.SUITES}


# ---------------------------------------------------------------------------------------------
# Every suite: the catalog.

# suite -> (its specs, its lengths, one spec and its (family, table, group, column, splits,
# tokenized, decode length), every task's family).
CATALOG = {
    'zeroscrolls': (50, (512, 1024, 2048, 4096, 8192), 't5align_zeroscrolls_book_sum_sort_2048',
                    ('c_index', 'zeroscrolls', '2048', 'BkSS', ('validation', 'test'), True, 1024),
                    {'gov_report': 'rouge_geo', 'summ_screen_fd': 'rouge_geo',
                     'qmsum': 'rouge_geo', 'squality': 'rouge_geo', 'qasper': 'f1_unidecode',
                     'narrative_qa': 'f1_unidecode', 'quality': 'letter_acc',
                     'musique': 'f1_unidecode', 'space_digest': 'exp_sim',
                     'book_sum_sort': 'c_index'}),
    'scrolls': (42, (512, 1024, 2048, 4096, 8192, 16384), 't5align_scrolls_quality_4096',
                ('exact_match', 'scrolls', '4096', 'QALT', ('validation', 'test'), True, 1024),
                {'gov_report': 'rouge_geo', 'summ_screen_fd': 'rouge_geo', 'qmsum': 'rouge_geo',
                 'qasper': 'f1', 'narrative_qa': 'f1', 'quality': 'exact_match',
                 'contract_nli': 'exact_match'}),
    'ruler': (13 * 6, (512, 1024, 2048, 4096, 8192, 16384), 't5align_ruler_qa_2_16384',
              ('string_match_part', 'ruler', '16384', 'qa_2', ('test',), False, 32),
              {t: 'string_match_part' if t.startswith('qa') else 'string_match_all'
               for t in ('niah_single_1', 'niah_single_2', 'niah_single_3', 'niah_multikey_1',
                         'niah_multikey_2', 'niah_multikey_3', 'niah_multivalue',
                         'niah_multiquery', 'vt', 'cwe', 'fwe', 'qa_1', 'qa_2')}),
}
# The tasks of each suite in the report's order, as upstream names them.
SUITE_TASKS = {
    'zeroscrolls': ('gov_report', 'summ_screen_fd', 'qmsum', 'squality', 'qasper',
                    'narrative_qa', 'quality', 'musique', 'space_digest', 'book_sum_sort'),
    'scrolls': ('gov_report', 'summ_screen_fd', 'qmsum', 'qasper', 'narrative_qa', 'quality',
                'contract_nli'),
    'ruler': ('niah_single_1', 'niah_single_2', 'niah_single_3', 'niah_multikey_1',
              'niah_multikey_2', 'niah_multikey_3', 'niah_multivalue', 'niah_multiquery', 'vt',
              'cwe', 'fwe', 'qa_1', 'qa_2'),
}
DECODE = {'vt': 30, 'cwe': 120, 'fwe': 50, 'qa_1': 32, 'qa_2': 32}


def test_the_catalog_holds_the_three_suites():
  assert list(SUITES) == ['zeroscrolls', 'scrolls', 'ruler']
  for one in catalog.SUITES:
    for attribute in ('tasks', 'columns', 'families', 'splits', 'lengths', 'decode_lengths',
                      'tokenized', 'subsets', 'examples'):
      assert hasattr(one, attribute), (one.name, attribute)


@pytest.mark.parametrize('name', list(CATALOG))
def test_specs_and_mixtures(name):
  one = SUITES[name]
  count, lengths, example, fields, families = CATALOG[name]
  names = [f't5align_{name}_{t}_{n}' for n in lengths for t in SUITE_TASKS[name]]
  assert len(names) == count and set(names) <= set(catalog.SPECS)
  assert [n for n in catalog.SPECS if n.startswith(f't5align_{name}_')] == names
  assert one.tasks == SUITE_TASKS[name] and one.lengths == lengths
  for n in lengths:
    assert catalog.resolve(f't5align_{name}_{n}') == tuple(
        f't5align_{name}_{t}_{n}' for t in SUITE_TASKS[name])
  spec = catalog.SPECS[example]
  assert (spec.family, spec.table, spec.group, spec.column, spec.splits, spec.tokenized,
          spec.max_decode_length) == fields
  for task in SUITE_TASKS[name]:
    for n in lengths:
      spec = catalog.SPECS[f't5align_{name}_{task}_{n}']
      assert spec.family == families[task] == one.families[task]
      assert (spec.table, spec.group, spec.column, spec.splits) == (
          name, str(n), one.columns[task], one.splits)
      assert spec.max_decode_length == (1024 if name != 'ruler' else DECODE.get(task, 128))
  if len(one.splits) > 1:
    with pytest.raises(ValueError, match="has the split.s. validation, test; got 'train'"):
      spec.examples(None, 'train')


def test_rulers_offline_mixture():
  assert catalog.MIXTURES['t5align_ruler_offline_512'] == tuple(
      f't5align_ruler_{t}_512' for t in ('niah_single_1', 'niah_multikey_2', 'niah_multikey_3',
                                         'vt', 'cwe', 'fwe'))


def test_scrolls_tfds_names():
  assert scrolls.tfds_name('qasper') == 'scrolls/qasper:1.0.0'
  with pytest.raises(ValueError, match="no SCROLLS config 'squality'"):
    scrolls.tfds_name('squality')


@pytest.mark.parametrize('task, max_decode_length, mode', [
    ('t5align_zeroscrolls_qasper_8192', None, (False, 1024)),
    ('t5align_zeroscrolls_qasper_8192', 64, (False, 64)),
    ('t5align_scrolls_gov_report_16384', None, (False, 1024)),
    ('t5align_ruler_vt_2048', None, (False, 30)),
])
def test_eval_decodes_them_greedily_for_their_steps(task, max_decode_length, mode):
  from t5align import jobs  # pylint: disable=g-import-not-at-top
  job = jobs.EvalJob() if max_decode_length is None else jobs.EvalJob(
      max_decode_length=max_decode_length)
  assert job.task_mode(catalog.SPECS[task]) == mode


@pytest.mark.parametrize('name, targets', [
    ('t5align_zeroscrolls_8192', 1024), ('t5align_scrolls_16384', 1024),
    ('t5align_ruler_cwe_1024', 120),
    # A mixture decodes its longest (t5x; t5align.eval stops each task at its own).
    ('t5align_ruler_512', 128),
])
def test_t5x_decodes_their_steps(name, targets):
  from t5align import t5x_gin  # pylint: disable=g-import-not-at-top
  assert t5x_gin.task_feature_lengths(name) == {'targets': targets}


# ---------------------------------------------------------------------------------------------
# ZeroSCROLLS: the files, the runner's truncation, the seqio task, the leaderboard's CSV.

QASPER_INSTRUCTION = (
    'You are given a scientific article and a question. Answer the question as concisely as you '
    'can, using a single phrase or sentence if possible. If the question cannot be answered based '
    'on the information in the article, write "unanswerable". If the question is a yes/no '
    'question, answer "yes", "no", or "unanswerable".')
SEPARATOR = '... [The rest of the article is omitted]\n\n'
SENTENCES = [
    'We train a sequence to sequence model on English and German news articles.',
    'The encoder reads the whole document and the decoder writes a short answer.',
    'Our baseline is a recurrent network with attention over the input tokens.',
    'Results improve when the model is pretrained on a large corpus of web text.',
]
SPM_TEXT = [QASPER_INSTRUCTION, *SENTENCES, 'Article: Question: Answer: which languages?',
            SEPARATOR.strip()]
EOS = 1


def qasper_record(example_id: str, article: str, question: str, output: str | None,
                  pid: str | None = None) -> dict:
  """A Qasper record as ZeroSCROLLS publishes it: the prompt in 'input', character indices."""
  head = f'{QASPER_INSTRUCTION}\n\nArticle:\n'
  before_query = f'{head}{article}\n\n'
  text = f'{before_query}Question:\n{question}\n\nAnswer:'
  query_start = len(before_query)
  return {'id': example_id, 'pid': pid or f'{example_id}_0', 'input': text, 'output': output,
          'document_start_index': len(head), 'document_end_index': len(head) + len(article),
          'query_start_index': query_start,
          'query_end_index': query_start + len('Question:\n') + len(question),
          'truncation_seperator': SEPARATOR}


def jsonl(records) -> str:
  return ''.join(json.dumps(r) + '\n' for r in records)


def write_zip(folder: pathlib.Path, task: str, splits: dict[str, str]) -> pathlib.Path:
  """`{task}.zip` holding `{task}/{split}.jsonl` with each split's text."""
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / f'{task}.zip'
  with zipfile.ZipFile(path, 'w') as archive:
    archive.writestr(f'{task}/', '')
    for split, text in splits.items():
      archive.writestr(f'{task}/{split}.jsonl', text)
  return path


LONG_ARTICLE = ' '.join(SENTENCES * 6)
QASPER_VALIDATION = [
    qasper_record('q-long', LONG_ARTICLE, 'Which languages are used?', 'English and German'),
    qasper_record('q-short', SENTENCES[0], 'What is the baseline?', 'a recurrent network'),
]


@pytest.fixture
def zs_dir(tmp_path, monkeypatch):
  monkeypatch.setenv(zeroscrolls.ENV_DIR, str(tmp_path))
  return tmp_path


@pytest.fixture(scope='module')
def toy_tokenizer(toy_sentencepiece):
  """A SentencePiece model of ~100 pieces trained here: `encode(text) -> ids` (EOS = 1)."""
  sentencepiece = pytest.importorskip('sentencepiece')
  return sentencepiece.SentencePieceProcessor(model_proto=toy_sentencepiece(SPM_TEXT))

# ---------------------------------------------------------------------------------------------
# Files and records.


def test_qasper_zip_with_every_field(zs_dir, toy_tokenizer):
  write_zip(zs_dir, 'qasper', {'validation': jsonl(QASPER_VALIDATION),
                               'test': jsonl([{**r, 'output': None} for r in QASPER_VALIDATION])})
  entries = zeroscrolls.read_entries('qasper', 'validation')
  assert [(e.id, e.outputs, e.line) for e in entries] == [
      ('q-long', ('English and German',), 1), ('q-short', ('a recurrent network',), 2)]
  assert entries[1].input[entries[1].query_start_index:] == (
      'Question:\nWhat is the baseline?\n\nAnswer:')
  got = list(zeroscrolls.examples('qasper', 'validation', 64, toy_tokenizer.encode, EOS))
  assert [e['id'] for e in got] == ['q-long', 'q-short']
  assert [e['targets_pretokenized'] for e in got] == ['English and German', 'a recurrent network']
  np.testing.assert_array_equal(got[0]['targets'],
                                [*toy_tokenizer.encode('English and German'), EOS])
  meta = json.loads(got[0]['meta'])
  assert meta == {'outputs': ['English and German'], 'task': 'qasper', 'line': 1,
                  'input_tokens': len(toy_tokenizer.encode(QASPER_VALIDATION[0]['input'])) + 1}
  assert len(got[0]['inputs']) == 64 < meta['input_tokens']
  (test_long, _) = zeroscrolls.examples('qasper', 'test', 64, toy_tokenizer.encode, EOS)
  np.testing.assert_array_equal(test_long['inputs'], got[0]['inputs'])
  assert test_long['targets'].tolist() == [EOS] and test_long['targets_pretokenized'] == ''
  assert zeroscrolls.record_ids('qasper') == ['q-long', 'q-short']


def test_rows_of_one_id_are_one_example_with_every_reference(zs_dir):
  rows = [qasper_record('a', 'Text one.', 'Q?', 'first', pid='a_0'),
          qasper_record('b', 'Text two.', 'Q?', 'only'),
          qasper_record('a', 'Text one.', 'Q?', 'second', pid='a_1')]
  write_zip(zs_dir, 'narrative_qa', {'validation': jsonl(rows)})
  entries = zeroscrolls.read_entries('narrative_qa', 'validation')
  assert [(e.id, e.outputs) for e in entries] == [('a', ('first', 'second')), ('b', ('only',))]
  rows[2] = qasper_record('a', 'Another text.', 'Q?', 'second')
  write_zip(zs_dir, 'narrative_qa', {'validation': jsonl(rows)})
  with pytest.raises(data.DataError, match=r"validation\.jsonl:3: id 'a' repeats line 1 with "
                                           'another input'):
    zeroscrolls.read_entries('narrative_qa', 'validation')


def test_extracted_files_are_read_before_the_zip(zs_dir):
  write_zip(zs_dir, 'musique', {'validation': jsonl(QASPER_VALIDATION)})
  (zs_dir / 'musique').mkdir()
  (zs_dir / 'musique' / 'validation.jsonl').write_text(jsonl(QASPER_VALIDATION[1:]))
  assert zeroscrolls.record_ids('musique', 'validation') == ['q-short']
  assert zeroscrolls.find_file('musique', 'validation') == (
      zs_dir / 'musique' / 'validation.jsonl', None)


def test_missing_file_names_the_file_setting_and_source(zs_dir):
  with pytest.raises(FileNotFoundError) as error:
    zeroscrolls.read_entries('gov_report', 'test')
  message = str(error.value)
  for part in (str(zs_dir / 'gov_report.zip'), str(zs_dir / 'gov_report' / 'test.jsonl'),
               'https://huggingface.co/datasets/tau/zero_scrolls/resolve/main/gov_report.zip',
               '$T5ALIGN_ZEROSCROLLS_DIR', 'seqio_tasks.zeroscrolls_dir.path'):
    assert part in message
  with pytest.raises(ValueError, match='no ZeroSCROLLS task'):
    zeroscrolls.find_file('gov_reports', 'test')
  with pytest.raises(ValueError, match="no split 'train'"):
    zeroscrolls.find_file('gov_report', 'train')


def test_folder_from_gin_then_environment_then_data_dir(tmp_path, monkeypatch, clean_gin):
  monkeypatch.delenv(zeroscrolls.ENV_DIR, raising=False)
  monkeypatch.setenv(data.ENV_DATA_DIR, str(tmp_path / 'data'))
  assert zeroscrolls.zeroscrolls_dir() == tmp_path / 'data' / 'zero_scrolls'
  monkeypatch.setenv(zeroscrolls.ENV_DIR, str(tmp_path / 'env'))
  assert zeroscrolls.zeroscrolls_dir() == tmp_path / 'env'
  import seqio_tasks  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  clean_gin.parse_config(f"seqio_tasks.zeroscrolls_dir.path = '{tmp_path / 'gin'}'")
  assert zeroscrolls.zeroscrolls_dir() == tmp_path / 'gin'


GOOD = QASPER_VALIDATION[1]


@pytest.mark.parametrize('text, message', [
    (jsonl([GOOD]) + '{not json\n', r'qasper\.zip:qasper/validation\.jsonl:2: not valid JSON'),
    ('[1]\n', r'validation\.jsonl:1: expected a JSON object'),
    (jsonl([{k: v for k, v in GOOD.items() if k != 'truncation_seperator'}]),
     r"validation\.jsonl:1: missing field\(s\) \['truncation_seperator'\]"),
    (jsonl([{**GOOD, 'output': None}]), r"validation\.jsonl:1: field 'output' should be str"),
    (jsonl([{**GOOD, 'query_start_index': '12'}]),
     r"validation\.jsonl:1: field 'query_start_index' should be int"),
    (jsonl([{**GOOD, 'query_start_index': 10 ** 6}]),
     r'validation\.jsonl:1: query_start_index 1000000 is outside the input'),
    (jsonl([{**GOOD, 'inner_docs_start_indices': 3}]),
     r"validation\.jsonl:1: field 'inner_docs_start_indices' should be list"),
    ('\n\n', r'validation\.jsonl: no records'),
])
def test_malformed_records_name_file_and_line(zs_dir, text, message):
  write_zip(zs_dir, 'qasper', {'validation': text})
  with pytest.raises(data.DataError, match=message):
    zeroscrolls.read_entries('qasper', 'validation')


def test_test_split_outputs_may_be_null_or_absent(zs_dir):
  rows = [{**GOOD, 'output': None}, {k: v for k, v in GOOD.items() if k != 'output'}]
  rows[1]['id'] = 'other'
  write_zip(zs_dir, 'qasper', {'test': jsonl(rows)})
  assert [e.outputs for e in zeroscrolls.read_entries('qasper', 'test')] == [(), ()]


def test_broken_zips(zs_dir):
  (zs_dir / 'quality.zip').write_bytes(b'not a zip')
  with pytest.raises(data.DataError, match=r'quality\.zip: not a readable zip .*download it '
                                           r'again from https://huggingface\.co/'):
    zeroscrolls.read_entries('quality', 'test')
  write_zip(zs_dir, 'quality', {'validation': jsonl([GOOD])})
  with pytest.raises(data.DataError, match=r"quality\.zip: holds no quality/test\.jsonl"):
    zeroscrolls.read_entries('quality', 'test')


# ---------------------------------------------------------------------------------------------
# Truncation (the runner's process_model_input).


@pytest.mark.parametrize('length', [64, 128, 512])
def test_truncation_invariants(toy_tokenizer, length):
  record = QASPER_VALIDATION[0]
  text, start = record['input'], record['query_start_index']
  encode = toy_tokenizer.encode
  tokens, full = zeroscrolls.model_input(text, start, SEPARATOR, length, encode, EOS)
  assert full == len(encode(text)) + 1 > length
  assert tokens.dtype == np.int32 and len(tokens) == length and tokens[-1] == EOS
  tail = [*encode(SEPARATOR + 'Question:\nWhich languages are used?\n\nAnswer:'), EOS]
  assert len(tail) < length
  assert tokens[-len(tail):].tolist() == tail
  head = tokens[:-len(tail)].tolist()
  assert head and head == encode(text[:start])[:len(head)]  # A prefix of the document part.
  assert EOS not in head


def test_inputs_that_fit_are_unchanged(toy_tokenizer):
  record = QASPER_VALIDATION[1]
  encode = toy_tokenizer.encode
  whole = [*encode(record['input']), EOS]
  for length in (len(whole), len(whole) + 1, 8192):
    tokens, full = zeroscrolls.model_input(record['input'], record['query_start_index'],
                                           SEPARATOR, length, encode, EOS)
    assert tokens.tolist() == whole and full == len(whole)
  tokens, _ = zeroscrolls.model_input(record['input'], record['query_start_index'], SEPARATOR,
                                      len(whole) - 1, encode, EOS)
  assert len(tokens) == len(whole) - 1 and tokens.tolist() != whole[:-1]


def test_a_tail_longer_than_the_budget_is_sliced_as_upstream(toy_tokenizer):
  """Upstream's torch slice `[:, :L - len(tail)]` with a negative stop drops tokens from the
  head's end instead of emptying it; kept for parity."""
  record = QASPER_VALIDATION[0]
  encode = toy_tokenizer.encode
  start = record['query_start_index']
  tail = [*encode(SEPARATOR + record['input'][start:]), EOS]
  head = [*encode(record['input'][:start]), EOS]
  length = len(tail) - 3
  tokens, _ = zeroscrolls.model_input(record['input'], start, SEPARATOR, length, encode, EOS)
  assert tokens.tolist() == head[:-3] + tail


@pytest.mark.tensorflow
def test_seqio_task_from_the_fixture(zs_dir, monkeypatch):
  seqio = pytest.importorskip('seqio')
  sentencepiece = pytest.importorskip('sentencepiece')
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(SHIPPED_VOCABULARY))
  from seqio_tasks import tasks  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  write_zip(zs_dir, 'qasper', {'validation': jsonl(QASPER_VALIDATION),
                               'test': jsonl([{**r, 'output': None} for r in QASPER_VALIDATION])})
  processor = sentencepiece.SentencePieceProcessor(model_file=str(SHIPPED_VOCABULARY))
  long, short = QASPER_VALIDATION
  assert len(processor.encode(long['input'])) + 1 > 512  # The fixture is truncated at 512.
  task = seqio.get_mixture_or_task('t5align_zeroscrolls_qasper_512')
  got = list(task.get_dataset(None, split='validation', shuffle=False).as_numpy_iterator())
  assert [ex['id'].decode() for ex in got] == ['q-long', 'q-short']
  assert [len(ex['inputs']) for ex in got] == [512, len(processor.encode(short['input'])) + 1]
  for ex, record in zip(got, QASPER_VALIDATION):
    want, _ = zeroscrolls.model_input(record['input'], record['query_start_index'], SEPARATOR,
                                      512, processor.encode, processor.eos_id())
    np.testing.assert_array_equal(ex['inputs'], want)
    assert ex['targets_pretokenized'].decode() == record['output']
    assert ex['targets'].tolist() == [*processor.encode(record['output']), processor.eos_id()]
  tail = [*processor.encode(SEPARATOR + 'Question:\nWhich languages are used?\n\nAnswer:'), 1]
  assert got[0]['inputs'][-len(tail):].tolist() == tail
  # The task's postprocessor and metric functions score its own gold as 100.
  targets = [task.postprocess_fn(ex['targets_pretokenized'], example=ex, is_target=True)
             for ex in got]
  (metric_fn,) = task.predict_metric_fns
  assert metric_fn(targets, ['English and German', 'a recurrent net']) == {
      'f1': pytest.approx(75.0), 'score': pytest.approx(75.0)}
  test = list(task.get_dataset(None, split='test', shuffle=False).as_numpy_iterator())
  assert [ex['id'].decode() for ex in test] == ['q-long', 'q-short']
  assert [ex['targets'].tolist() for ex in test] == [[1], [1]]
  with pytest.raises(ValueError, match='train'):
    task.get_dataset(None, split='train', shuffle=False)

# ---------------------------------------------------------------------------------------------
# The leaderboard's CSV.


def _write_test_data(folder: pathlib.Path) -> dict[str, list[str]]:
  """Two test records per task, extracted; returns {task: ids}."""
  ids = {}
  for task in zeroscrolls.TASKS:
    records = [qasper_record(f'{task}-{i}', SENTENCES[i], 'Q?', None) for i in range(2)]
    (folder / task).mkdir(parents=True)
    (folder / task / 'test.jsonl').write_text(jsonl(records))
    ids[task] = [r['id'] for r in records]
  return ids


def _write_eval_folder(folder: pathlib.Path, task: str, length: int,
                       predictions: list[tuple[str, str]], split: str = 'test',
                       finished: bool = True) -> pathlib.Path:
  """A task folder as t5align.eval writes it (run.json, predictions.jsonl, metrics.json)."""
  path = folder / f't5align_zeroscrolls_{task}_{length}'
  path.mkdir(parents=True)
  (path / 'run.json').write_text(json.dumps({'task': path.name, 'split': split}))
  records = [{'prediction': p, 'scores': {}, 'index': i, 'id': example_id, 'input_length': 9,
              'target': '', 'tau': [1.0], 'postprocessed_target': {'target': ''}}
             for i, (example_id, p) in enumerate(predictions)]
  (path / 'predictions.jsonl').write_text(jsonl(records))
  if finished:
    (path / 'metrics.json').write_text(json.dumps({'task': path.name, 'metrics': {}}))
  return path


def _read_like_the_verifier(path: pathlib.Path) -> dict[str, dict[str, str]]:
  """The CSV read as verify_submission.py does (pandas `dtype=object, keep_default_na=False`:
  every field a string), checked as it checks: columns exactly Task, ID, Prediction; every task;
  {task: {id: prediction}} as `set_index('ID')['Prediction'].to_dict()` builds it."""
  with open(path, newline='', encoding='utf-8') as f:
    rows = list(csv.reader(f))
  assert rows[0] == ['Task', 'ID', 'Prediction']
  out: dict[str, dict[str, str]] = {}
  for task, example_id, prediction in rows[1:]:
    assert prediction != zeroscrolls.VERIFIER_NA
    assert example_id not in out.setdefault(task, {}), 'deduplicated by id'
    out[task][example_id] = prediction
  assert set(out) == set(zeroscrolls.TASKS)
  return out


@pytest.fixture
def leaderboard_setup(tmp_path, monkeypatch):
  monkeypatch.setenv(zeroscrolls.ENV_DIR, str(tmp_path / 'zero_scrolls'))
  ids = _write_test_data(tmp_path / 'zero_scrolls')
  eval_dir = tmp_path / 'eval'
  tricky = 'Line one, "quoted"\nline two, with commas\r\n and trailing space '
  lone_cr = 'a lone\rcarriage return'
  for task in zeroscrolls.TASKS:
    predictions = [(ids[task][0], tricky if task == 'qasper' else f'{task} zero'),
                   (ids[task][1], lone_cr if task == 'qasper' else f'{task} one')]
    if task == 'quality':
      predictions.append(predictions[0])  # The same id recorded twice: kept once.
    _write_eval_folder(eval_dir, task, 8192, predictions)
  return tmp_path, eval_dir, ids, tricky


def test_leaderboard_csv_passes_the_verifiers_rules(leaderboard_setup):
  from t5align import leaderboard  # pylint: disable=g-import-not-at-top
  tmp_path, eval_dir, ids, tricky = leaderboard_setup
  output = tmp_path / 'out' / 'zero_scrolls_predictions.csv'
  leaderboard.export([str(eval_dir)], str(output))
  got = _read_like_the_verifier(output)
  assert {t: list(p) for t, p in got.items()} == ids
  assert got['qasper'] == {ids['qasper'][0]: tricky, ids['qasper'][1]: 'a lone\rcarriage return'}
  assert got['book_sum_sort'] == {'book_sum_sort-0': 'book_sum_sort zero',
                                  'book_sum_sort-1': 'book_sum_sort one'}
  assert [p.name for p in output.parent.iterdir()] == [output.name]  # No temporary file left.


@pytest.mark.parametrize('change, message', [
    # An id recorded with two different predictions.
    (lambda d, ids: _write_eval_folder(d, 'musique', 512, [(ids['musique'][0], 'a'),
                                                           (ids['musique'][0], 'b')]),
     "musique_512/predictions.jsonl:2: id 'musique-0' has two different predictions"),
    # A test id without a prediction; an id the test split does not have.
    (lambda d, ids: _write_eval_folder(d, 'musique', 512, [(ids['musique'][0], 'a')]),
     r"musique: 1 of the 2 test ids have no prediction \(e\.g\. \['musique-1'\]\)"),
    (lambda d, ids: _write_eval_folder(d, 'musique', 512, [(i, 'a') for i in ids['musique']]
                                       + [('musique-9', 'a')]),
     r"musique: 1 ids are not test ids of the task \(e\.g\. \['musique-9'\]\)"),
    (lambda d, ids: _write_eval_folder(d, 'musique', 512, [(i, zeroscrolls.VERIFIER_NA)
                                                           for i in ids['musique']]),
     'which the verifier reads as missing'),
    (lambda d, ids: _write_eval_folder(d, 'musique', 512, [(i, 'a') for i in ids['musique']],
                                       split='validation'),
     "holds predictions for the split 'validation'; the leaderboard takes the 'test' split"),
    (lambda d, ids: _write_eval_folder(d, 'musique', 512, [(i, 'a') for i in ids['musique']],
                                       finished=False),
     r'the run has not finished \(no metrics\.json\)'),
])
def test_leaderboard_refuses_what_the_verifier_refuses(leaderboard_setup, change, message):
  from t5align import leaderboard  # pylint: disable=g-import-not-at-top
  tmp_path, eval_dir, ids, _ = leaderboard_setup
  shutil.rmtree(eval_dir / 't5align_zeroscrolls_musique_8192')
  other = tmp_path / 'other'
  change(other, ids)
  with pytest.raises(ValueError, match=message):
    leaderboard.export([str(eval_dir), str(other)], str(tmp_path / 'x.csv'))
  assert not (tmp_path / 'x.csv').exists()


def test_leaderboard_lengths_and_incomplete_runs(leaderboard_setup, capsys):
  from t5align import leaderboard  # pylint: disable=g-import-not-at-top
  tmp_path, eval_dir, ids, _ = leaderboard_setup
  _write_eval_folder(tmp_path / 'short', 'qasper', 512, [(i, 'short') for i in ids['qasper']])
  folders = [str(eval_dir), str(tmp_path / 'short')]
  with pytest.raises(ValueError, match=r'qasper was evaluated at several input lengths '
                                       r'\(512, 8192\): pick one with --length'):
    leaderboard.export(folders, str(tmp_path / 'x.csv'))
  with pytest.raises(ValueError, match=r'no predictions for the task\(s\) gov_report, '
                                       r'summ_screen_fd, qmsum, squality, narrative_qa'):
    leaderboard.export(folders, str(tmp_path / 'x.csv'), length=512)
  got = leaderboard.export(folders, str(tmp_path / 'x.csv'), length=512, allow_incomplete=True)
  assert got == {'qasper': {'qasper-0': 'short', 'qasper-1': 'short'}}
  assert 'warning: no predictions for the task(s) gov_report' in capsys.readouterr().err
  with open(tmp_path / 'x.csv', newline='', encoding='utf-8') as f:
    assert f.read() == 'Task,ID,Prediction\r\nqasper,qasper-0,short\r\nqasper,qasper-1,short\r\n'


@pytest.mark.cli
def test_leaderboard_command(leaderboard_setup, capsys, monkeypatch):
  from t5align import leaderboard  # pylint: disable=g-import-not-at-top
  tmp_path, eval_dir, _, _ = leaderboard_setup
  output = tmp_path / 'zero_scrolls_predictions.csv'
  output.write_text('an older file\n')
  assert leaderboard.main([str(eval_dir), '--output', str(output)]) == 0
  assert 'wrote' in capsys.readouterr().err and len(_read_like_the_verifier(output)) == 10
  monkeypatch.setenv(zeroscrolls.ENV_DIR, str(tmp_path / 'nowhere'))
  with pytest.raises(SystemExit):
    leaderboard.main([str(eval_dir), '--output', str(output)])
  assert '--allow_incomplete writes the CSV without the check' in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# SCROLLS: the truncation, the tasks over mocked TFDS data.

QUESTION = 'Who leaves the village at the end of the story?'
STORY = ' '.join(['The miller and his daughter lived by the river for many years.',
                  'Every winter the river froze and the mill stood still until spring.',
                  'One morning a stranger arrived with a letter from the distant city.'] * 30)
# NarrativeQA as SCROLLS publishes it: the question, two newlines, the document; a row per
# reference, the rows of one question sharing its id (pid: id and the reference's index).
NARRATIVE_VALIDATION = [
    {'id': 'q1', 'pid': 'q1_0', 'input': f'{QUESTION}\n\n{STORY}', 'output': 'The daughter.'},
    {'id': 'q2', 'pid': 'q2_0', 'input': f'Where is the mill?\n\n{STORY[:400]}',
     'output': 'By the river.'},
    {'id': 'q1', 'pid': 'q1_1', 'input': f'{QUESTION}\n\n{STORY}',
     'output': "The miller's daughter leaves."},
]
NARRATIVE_TEST = [{**row, 'output': ''} for row in NARRATIVE_VALIDATION]


# ---------------------------------------------------------------------------------------------
# Truncation.


def test_model_input_keeps_the_start_and_ends_in_eos():
  """SCROLLS' baselines cut an input to max_source_length with the tokenizer (the query, which
  comes first, is kept); for T5 that is the first L - 1 tokens and EOS."""
  encode = lambda text: [len(w) + 10 for w in text.split()]
  tokens, full = scrolls.model_input('a bb ccc dddd eeeee', 3, encode, EOS)
  assert tokens.dtype == np.int32 and tokens.tolist() == [11, 12, EOS] and full == 6
  tokens, full = scrolls.model_input('a bb', 8, encode, EOS)
  assert tokens.tolist() == [11, 12, EOS] and full == 3
  tokens, _ = scrolls.model_input('a bb', 3, encode, EOS)  # Exactly fits.
  assert tokens.tolist() == [11, 12, EOS]
  with pytest.raises(ValueError, match='max_tokens is 0'):
    scrolls.model_input('a', 0, encode, EOS)

# ---------------------------------------------------------------------------------------------
# The seqio tasks over mocked TFDS data.


@pytest.fixture(scope='module')
def processor():
  sentencepiece = pytest.importorskip('sentencepiece')
  return sentencepiece.SentencePieceProcessor(model_file=str(SHIPPED_VOCABULARY))


@pytest.mark.tensorflow
def test_evaluation_task_one_example_per_id_with_every_reference(mock_scrolls, processor):
  """t5align_scrolls_narrative_qa_512 reads TFDS scrolls/narrative_qa:1.0.0 and, as SCROLLS'
  evaluator (drop_duplicates_in_input), makes one example per id, its references every row's
  output in row order; the model input is its first 511 tokens and EOS. Its seqio
  postprocessor and metric function score a prediction against all of them."""
  seqio = pytest.importorskip('seqio')
  encode = processor.encode
  long_input = NARRATIVE_VALIDATION[0]['input']
  assert len(encode(long_input)) + 1 > 512  # Cut at 512.
  task = seqio.get_mixture_or_task('t5align_scrolls_narrative_qa_512')
  with mock_scrolls({('narrative_qa', 'validation'): NARRATIVE_VALIDATION,
                     ('narrative_qa', 'test'): NARRATIVE_TEST}):
    got = list(task.get_dataset(None, split='validation', shuffle=False).as_numpy_iterator())
    test = list(task.get_dataset(None, split='test', shuffle=False).as_numpy_iterator())
  assert mock_scrolls.seen[0] == ('scrolls', '1.0.0', 'narrative_qa', 'validation')
  assert [ex['id'].decode() for ex in got] == ['q1', 'q2']
  first, second = got
  assert first['inputs'].tolist() == [*encode(long_input)[:511], EOS]
  assert second['inputs'].tolist() == [*encode(NARRATIVE_VALIDATION[1]['input']), EOS]
  assert first['targets_pretokenized'].decode() == 'The daughter.'
  assert first['targets'].tolist() == [*encode('The daughter.'), EOS]
  assert json.loads(first['meta']) == {
      'outputs': ['The daughter.', "The miller's daughter leaves."], 'config': 'narrative_qa',
      'row': 0, 'pids': ['q1_0', 'q1_1'], 'input_tokens': len(encode(long_input)) + 1}
  assert json.loads(second['meta'])['outputs'] == ['By the river.']
  targets = [task.postprocess_fn(ex['targets_pretokenized'], example=ex, is_target=True)
             for ex in got]
  (metric_fn,) = task.predict_metric_fns
  # q1: the second reference matches exactly (the max over references: 100); q2: 'river' of 3
  # normalized tokens 'by river' -> P = 1, R = 1/2, F1 = 2/3.
  assert metric_fn(targets, ["The miller's daughter leaves", 'river']) == {
      'f1': pytest.approx(250 / 3), 'score': pytest.approx(250 / 3)}
  # The test split (outputs private): the same examples, nothing to score.
  assert [ex['id'].decode() for ex in test] == ['q1', 'q2']
  assert [ex['targets'].tolist() for ex in test] == [[EOS], [EOS]]
  np.testing.assert_array_equal(test[0]['inputs'], first['inputs'])
  test_targets = [task.postprocess_fn(ex['targets_pretokenized'], example=ex, is_target=True)
                  for ex in test]
  assert metric_fn(test_targets, ['a', 'b']) == {}


@pytest.mark.tensorflow
@pytest.mark.slow  # 7-11 s on a shared 2-core machine (tf.data tracing of seqio's preprocessors).
def test_finetuning_task_a_row_an_example_cut_by_seqio(mock_scrolls, processor):
  """t5align_scrolls_{config}: every row (duplicates of an id too), input -> inputs and output
  -> targets, cut to the feature lengths keeping the start, EOS last: the evaluation tasks' cut
  at the same length."""
  seqio = pytest.importorskip('seqio')
  task = seqio.get_mixture_or_task('t5align_scrolls_narrative_qa')
  assert tuple(task.splits) == ('train', 'validation', 'test')
  with mock_scrolls({('narrative_qa', 'train'): NARRATIVE_VALIDATION}):
    # try_in_mem_cache=False: seqio's cache check reads the split's size, which a mock lacks.
    got = list(task.get_dataset({'inputs': 512, 'targets': 4}, split='train', shuffle=False,
                                try_in_mem_cache=False).as_numpy_iterator())
  encode = processor.encode
  assert [(ex['id'].decode(), ex['pid'].decode()) for ex in got] == [
      ('q1', 'q1_0'), ('q2', 'q2_0'), ('q1', 'q1_1')]
  for ex, row in zip(got, NARRATIVE_VALIDATION):
    want, _ = scrolls.model_input(row['input'], 512, encode, EOS)
    np.testing.assert_array_equal(ex['inputs'], want)
    assert ex['targets'].tolist() == [*encode(row['output'])[:3], EOS]
    assert ex['targets_pretokenized'].decode() == row['output']
  mixture = seqio.get_mixture_or_task('t5align_scrolls')
  assert sorted(t.name for t in mixture.tasks) == sorted(f't5align_scrolls_{c}'
                                                        for c in scrolls.TASKS)


@pytest.mark.tensorflow
@pytest.mark.parametrize('rows, message', [
    ([NARRATIVE_VALIDATION[0], {**NARRATIVE_VALIDATION[2], 'input': 'Another text.'}],
     r"scrolls/narrative_qa:1\.0\.0 split 'validation', row 1 \(pid 'q1_1'\): id 'q1' repeats "
     r'row 0 with another input'),
    ([NARRATIVE_VALIDATION[1], {**NARRATIVE_VALIDATION[0], 'output': ''}],
     r"split 'validation', row 1 \(pid 'q1_0'\): empty output"),
])
def test_bad_rows_name_the_data_set_split_row_and_pid(mock_scrolls, rows, message):
  seqio = pytest.importorskip('seqio')
  task = seqio.get_mixture_or_task('t5align_scrolls_narrative_qa_1024')
  with mock_scrolls({('narrative_qa', 'validation'): rows}):
    with pytest.raises(data.DataError, match=message):
      task.get_dataset(None, split='validation', shuffle=False)


@pytest.mark.tensorflow
def test_unprepared_data_names_the_folder_the_fix_and_the_setting(seqio_env, tmp_path,
                                                                  clean_gin):
  """Nothing is downloaded by a run: data TFDS has not prepared in the folder the gin binding
  names fails there, saying how to prepare it."""
  import seqio_tasks  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  clean_gin.parse_config(f"seqio_tasks.scrolls_data_dir.path = '{tmp_path}'")
  assert scrolls.scrolls_data_dir() == str(tmp_path)
  task = seqio_env.get_mixture_or_task('t5align_scrolls_qasper_2048')
  with pytest.raises(FileNotFoundError) as error:
    task.get_dataset(None, split='validation', shuffle=False)
  message = str(error.value)
  for part in ('SCROLLS qasper (validation)', 'scrolls/qasper:1.0.0', str(tmp_path),
               "tfds.builder('scrolls/qasper:1.0.0', data_dir=DIR).download_and_prepare()",
               'https://scrolls-tau.s3.us-east-2.amazonaws.com/qasper.zip',
               'seqio_tasks.scrolls_data_dir.path', '$TFDS_DATA_DIR'):
    assert part in message
  with pytest.raises(ValueError, match="SCROLLS qasper: no split 'dev'"):
    scrolls.source('qasper').get_dataset('dev')


# ---------------------------------------------------------------------------------------------
# RULER: the options, records as examples, the registered tasks, the real generator.

PREFIX = ' The special magic numbers for wry-tenant mentioned in the provided text are'
# Two written-out records in upstream's format (niah.py's fields).
RECORDS = [
    {'index': 0, 'input': 'Some special magic numbers are hidden ... wry-tenant is: 1234567. ...',
     'outputs': ['1234567', '7654321'], 'length': 40, 'length_w_model_temp': 40,
     'answer_prefix': PREFIX, 'token_position_answer': {'1234567': 12}},
    {'index': 1, 'input': 'Some special magic numbers ... One for wry-tenant is: 5555555.',
     'outputs': ['5555555'], 'length': 30, 'length_w_model_temp': 30, 'answer_prefix': PREFIX},
]


def test_options(clean_gin):
  assert catalog.options()['ruler_examples'] == 500
  clean_gin.parse_config('import seqio_tasks\nseqio_tasks.options.ruler_examples = 3')
  assert catalog.options()['ruler_examples'] == 3


@pytest.mark.parametrize('task, targets', [('niah_multivalue', '1234567, 7654321'),
                                           ('qa_1', '1234567')])
def test_a_record_becomes_an_example(task, targets):
  example = suite.to_example(task, 1024, {**RECORDS[0], 'index': 917}, 3)
  assert example['id'] == f'{task}_1024_3'  # The sample number, not the record's 'index'.
  assert example['inputs'] == RECORDS[0]['input'] + PREFIX
  assert example['targets'] == targets
  assert json.loads(example['meta']) == {'outputs': ['1234567', '7654321'], 'task': task,
                                         'index': 917, 'length': 40, 'answer_prefix': PREFIX}


@pytest.mark.parametrize('change, message', [
    ({'input': None}, r"sample 0: 'input' is None; expected a str"),
    ({'outputs': '1234567'}, r"sample 0: 'outputs' is '1234567'; expected a list"),
    ({'outputs': []}, r"sample 0: 'outputs' is \[\]; expected a non-empty list of strings"),
    ({'outputs': [7]}, r"sample 0: 'outputs' is \[7\]; expected a non-empty list of strings"),
    ({'answer_prefix': None}, r"sample 0: 'answer_prefix' is None; expected a str"),
])
def test_bad_records_name_task_length_index_and_field(change, message):
  with pytest.raises(data.DataError, match=r'RULER vt at 512 tokens, ' + message):
    suite.to_example('vt', 512, {**RECORDS[0], **change}, 0)


def test_bad_settings():
  with pytest.raises(ValueError, match="no RULER task 'niah'"):
    list(suite.examples('niah', 512, list, seed=0, num_samples=1))
  with pytest.raises(ValueError, match='RULER length 500 is not one of'):
    list(suite.examples('vt', 500, list, seed=0, num_samples=1))
  with pytest.raises(ValueError, match=r'seqio_tasks.options.ruler_examples = 0; expected a '
                                       'positive integer'):
    list(suite.examples('vt', 512, list, seed=0, num_samples=0))


@pytest.fixture
def fake_generator(monkeypatch):
  """A stand-in `seqio_tasks.ruler.generate` returning RECORDS; yields its calls."""
  calls = []

  def samples(task, max_seq_length, tokenizer, *, seed, num_samples, assets=None,
              budget='upstream'):
    calls.append(dict(task=task, max_seq_length=max_seq_length, seed=seed,
                      num_samples=num_samples, assets=assets, budget=budget,
                      tokens=tokenizer.text_to_tokens('special magic')))
    return [dict(r) for r in RECORDS[:num_samples]]

  fake = types.ModuleType('seqio_tasks.ruler.generate')
  fake.samples = samples
  monkeypatch.setitem(sys.modules, 'seqio_tasks.ruler.generate', fake)
  monkeypatch.setattr(sys.modules['seqio_tasks.ruler'], 'generate', fake, raising=False)
  return calls


def test_examples_call_the_generator_with_the_options(fake_generator, clean_gin):
  clean_gin.parse_config('import seqio_tasks\nseqio_tasks.options.ruler_examples = 2\n'
                         'seqio_tasks.options.seed = 7')
  encode = lambda text: [len(word) for word in text.split()]
  spec = catalog.SPECS['t5align_ruler_niah_multikey_2_2048']
  got = list(spec.examples(types.SimpleNamespace(encode=encode, eos_id=1)))
  assert [e['id'] for e in got] == ['niah_multikey_2_2048_0', 'niah_multikey_2_2048_1']
  assert fake_generator == [dict(task='niah_multikey_2', max_seq_length=2048, seed=7,
                                 num_samples=2, assets=None, budget='upstream', tokens=[7, 5])]
  clean_gin.parse_config("seqio_tasks.options.ruler_budget = 'encoder'")
  list(spec.examples(types.SimpleNamespace(encode=encode, eos_id=1)))
  assert fake_generator[-1]['budget'] == 'encoder'
  clean_gin.parse_config("seqio_tasks.options.ruler_budget = 'decoder'")
  with pytest.raises(ValueError, match=r"seqio_tasks.options.ruler_budget = 'decoder'; expected "
                                       r"one of \('encoder', 'upstream'\)"):
    list(spec.examples(types.SimpleNamespace(encode=encode, eos_id=1)))


def test_decode_lengths_are_the_generators():
  from seqio_tasks.ruler import templates  # pylint: disable=g-import-not-at-top
  for task in SUITE_TASKS['ruler']:
    generator = templates.TASK_ARGS[task]['generator']
    assert ruler.MAX_DECODE_LENGTH[task] == templates.GENERATORS[generator]['tokens_to_generate']


@pytest.mark.parametrize('task, what, option, env, default', [
    ('niah_single_2', 'essays', 'ruler_essays', 'T5ALIGN_RULER_ESSAYS', 'PaulGrahamEssays'),
    ('qa_1', 'squad', 'ruler_squad', 'T5ALIGN_RULER_SQUAD', 'squad.json'),
    ('qa_2', 'hotpotqa', 'ruler_hotpotqa', 'T5ALIGN_RULER_HOTPOTQA', 'hotpotqa.json'),
])
def test_corpus_files_from_setting_then_environment_then_data_dir(
    task, what, option, env, default, tmp_path, monkeypatch):
  assert suite.needs(task) == what and suite.needs('vt') is None
  monkeypatch.setenv('T5ALIGN_DATA_DIR', str(tmp_path / 'data'))
  monkeypatch.delenv(env, raising=False)
  with pytest.raises(FileNotFoundError, match=(
      rf'RULER {what}: none of .*data/ruler/.*{default} exists and the gin binding '
      rf'seqio_tasks.options.{option} or \${env} is not set; get ')):
    suite.find_file(what, {})
  (tmp_path / 'data' / 'ruler' / default).mkdir(parents=True)
  assert suite.find_file(what, {}) == tmp_path / 'data' / 'ruler' / default
  monkeypatch.setenv(env, str(tmp_path / 'env'))
  with pytest.raises(FileNotFoundError, match=rf'{tmp_path}/env \(from the gin binding'):
    suite.find_file(what, {})
  (tmp_path / 'env').touch()
  assert suite.find_file(what, {}) == tmp_path / 'env'
  (tmp_path / 'setting').touch()
  assert suite.find_file(what, {option: str(tmp_path / 'setting')}) == tmp_path / 'setting'


@pytest.mark.tensorflow
def test_seqio_task_features_postprocessor_and_metric(fake_generator, monkeypatch, clean_gin):
  seqio = pytest.importorskip('seqio')
  sentencepiece = pytest.importorskip('sentencepiece')
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(SHIPPED_VOCABULARY))
  clean_gin.parse_config('import seqio_tasks\nseqio_tasks.options.ruler_examples = 2')
  from seqio_tasks import tasks  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  processor = sentencepiece.SentencePieceProcessor(model_file=str(SHIPPED_VOCABULARY))
  task = seqio.get_mixture_or_task('t5align_ruler_niah_multikey_2_512')
  got = list(task.get_dataset(None, split='test', shuffle=False).as_numpy_iterator())
  assert [ex['id'].decode() for ex in got] == ['niah_multikey_2_512_0', 'niah_multikey_2_512_1']
  for ex, record in zip(got, RECORDS):
    text = record['input'] + record['answer_prefix']
    assert ex['inputs_pretokenized'].decode() == text
    np.testing.assert_array_equal(ex['inputs'], [*processor.encode(text), 1])
    assert ex['targets_pretokenized'].decode() == ', '.join(record['outputs'])
  targets = [task.postprocess_fn(ex['targets_pretokenized'], example=ex, is_target=True)
             for ex in got]
  assert [t['meta']['outputs'] for t in targets] == [['1234567', '7654321'], ['5555555']]
  (metric_fn,) = task.predict_metric_fns
  # (1/2 + 0) / 2 = 25.0: the second prediction is empty after postprocessing.
  assert metric_fn(targets, ['7654321 is one', '\n\t']) == {
      'score': 25.0, 'string_match_all': 25.0, 'nulls': 1.0}
  assert metrics.primary_metric(catalog.SPECS[task.name].family) == 'score'


# ---------------------------------------------------------------------------------------------
# The real generator (seqio_tasks.ruler.generate): the offline tasks with the shipped vocabulary.


@pytest.fixture(scope='module')
def shipped_encode():
  sentencepiece = pytest.importorskip('sentencepiece')
  processor = sentencepiece.SentencePieceProcessor(model_file=str(SHIPPED_VOCABULARY))
  return processor.encode


@pytest.mark.parametrize('task', ['niah_single_1', 'niah_multikey_2', 'niah_multikey_3', 'vt',
                                  'cwe', 'fwe'])
def test_offline_tasks_from_the_generator(task, shipped_encode):
  from seqio_tasks.ruler import generate  # pylint: disable=g-import-not-at-top
  assert set(generate.TASKS) == set(SUITE_TASKS['ruler']) and set(generate.OFFLINE_TASKS) == set(
      ruler.OFFLINE_TASKS)
  first = list(suite.examples(task, 2048, shipped_encode, seed=3, num_samples=3))
  again = list(suite.examples(task, 2048, shipped_encode, seed=3, num_samples=3))
  assert first == again  # Deterministic per seed.
  assert len(first) == 3
  spec = catalog.SPECS[f't5align_ruler_{task}_2048']
  for example in first:
    meta = suite.meta_of(example)
    # Upstream's budget: the input with its answer prefix and the tokens to generate fit in L.
    assert len(shipped_encode(example['inputs'])) + ruler.MAX_DECODE_LENGTH[task] <= 2048
    assert example['inputs'].endswith(meta['answer_prefix'])
    for output in meta['outputs']:
      assert output in example['inputs'][:-len(meta['answer_prefix'])], (task, output)
    # Its own references score 100.
    target = metrics.postprocess(example['targets'].encode(), example=example, is_target=True)
    assert metrics.score_example(spec.family, target, ' '.join(meta['outputs']))[
        spec.family] == 1.0


def test_a_length_too_short_for_the_vocabulary_is_refused(shipped_encode):
  """The shipped 1,000-piece vocabulary spells CWE's smallest input (10 numbered words) in more
  than 1,024 tokens: the generator refuses, naming the task and length, as the seqio task does."""
  from seqio_tasks.ruler import generate  # pylint: disable=g-import-not-at-top
  spec = catalog.SPECS['t5align_ruler_cwe_1024']
  with pytest.raises(generate.RulerLengthError, match='cwe at max_seq_length=1024'):
    list(spec.examples(types.SimpleNamespace(encode=shipped_encode, eos_id=1)))
