"""Tests for ZeroSCROLLS: the user's files, the official runner's truncation, the suites' metrics,
the registered seqio tasks and the leaderboard's CSV.

Every fixture is written by the test in the upstream record format ({id, pid, input, output,
document_start_index, document_end_index, query_start_index, query_end_index,
truncation_seperator}, inside `{task}.zip` as `{task}/{split}.jsonl`, or extracted); no suite data
is committed. Truncation is checked on a SentencePiece model trained in the test; the seqio task
on the shipped model's vocabulary. Metric values are written out: SCROLLS' metric docstring
example (tau/scrolls:metrics/scrolls.py, ../shared/docs/YARDSTICKS.md section 3.3), the
ZeroSCROLLS paper's examples, and `rouge_score` called directly.
"""
from __future__ import annotations

import csv
import json
import math
import pathlib
import shutil
import zipfile

import numpy as np
import pytest

from seqio_tasks import catalog
from seqio_tasks import data
from seqio_tasks import metrics
from seqio_tasks import suite_metrics
from seqio_tasks import zeroscrolls

SHIPPED_VOCABULARY = (pathlib.Path(__file__).resolve().parents[1] / 't5align' / 'shipped'
                      / 'retrieval_t5' / 'sentencepiece.model')
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


# ---------------------------------------------------------------------------------------------
# Metrics.

# SCROLLS' metric docstring example (tau/scrolls:metrics/scrolls.py).
DOC_PREDICTIONS = ['exact match example', 'hello there', 'general kenobi']
DOC_REFERENCES = [['exact match example'], ['hello', 'hi there'], ['commander kenobi']]


def _aggregate(family, predictions, references):
  return suite_metrics.aggregate(family, [suite_metrics.score_example(family, p, r)
                                          for p, r in zip(predictions, references)])


def test_scrolls_docstring_example():
  rouge = _aggregate('rouge_geo', DOC_PREDICTIONS, DOC_REFERENCES)
  assert rouge['rouge1'] == pytest.approx(72.2222, abs=1e-4)
  assert rouge['rouge2'] == pytest.approx(33.3333, abs=1e-4)
  assert rouge['rougeL'] == pytest.approx(72.2222, abs=1e-4)
  assert rouge['rouge_geometric_mean'] == pytest.approx(55.8136, abs=1e-4)
  assert rouge['score'] == rouge['rouge_geometric_mean']
  # Per example: only the first has a ROUGE-2 above 0, so only its geometric mean is.
  assert rouge['rouge_geometric_mean_per_example'] == pytest.approx(100 / 3)
  for family in ('f1', 'f1_unidecode'):
    assert _aggregate(family, DOC_PREDICTIONS, DOC_REFERENCES) == {
        'f1': pytest.approx(72.2222, abs=1e-4), 'score': pytest.approx(72.2222, abs=1e-4)}
  assert _aggregate('exact_match', DOC_PREDICTIONS, DOC_REFERENCES)['score'] == pytest.approx(
      33.3333, abs=1e-4)


def test_rouge_against_rouge_score():
  rouge_scorer = pytest.importorskip('rouge_score.rouge_scorer')
  scorer = rouge_scorer.RougeScorer(['rouge1', 'rouge2', 'rougeL'], use_stemmer=False)
  prediction = 'The committee approved the budget, citing rising costs.'
  # The first reference has every word in another order (best ROUGE-1), the second some words
  # in order (best ROUGE-2 and -L): the max per type comes from different references, before
  # the geometric mean (SQuALITY).
  references = ['Costs rising citing budget; the approved committee, the!',
                'The committee approved a plan.']
  want = {k: max(100 * scorer.score(r, prediction)[k].fmeasure for r in references)
          for k in ('rouge1', 'rouge2', 'rougeL')}
  best_of = {k: max(range(2), key=lambda i, k=k: scorer.score(references[i], prediction)[k]
                    .fmeasure) for k in want}
  assert len(set(best_of.values())) == 2, best_of  # The maxima come from both references.
  got = suite_metrics.score_example('rouge_geo', prediction, references)
  assert got == {**{k: pytest.approx(v) for k, v in want.items()},
                 'rouge_geometric_mean': pytest.approx(
                     (want['rouge1'] * want['rouge2'] * want['rougeL']) ** (1 / 3))}
  # The task score: the geometric mean of the mean F-measures, not the mean geometric mean.
  second = suite_metrics.score_example('rouge_geo', 'Budget approved.', references[1:])
  task = suite_metrics.aggregate('rouge_geo', [got, second])
  means = [(got[k] + second[k]) / 2 for k in ('rouge1', 'rouge2', 'rougeL')]
  assert task['score'] == pytest.approx(math.prod(means) ** (1 / 3))
  assert task['rouge_geometric_mean_per_example'] == pytest.approx(
      (got['rouge_geometric_mean'] + second['rouge_geometric_mean']) / 2)
  assert task['score'] > task['rouge_geometric_mean_per_example']
  # rouge-score's tokenizer: case and punctuation do not count; no stemming.
  assert suite_metrics.rouge('THE Cats!', ['the cats'])['rouge2'] == 100.0
  assert suite_metrics.rouge('the cat', ['the cats'])['rouge1'] == 50.0


def test_f1_transliterates_after_normalizing():
  assert suite_metrics.token_f1('Café Müller', 'cafe muller', transliterate=True) == 100.0
  assert suite_metrics.token_f1('Café Müller', 'cafe muller') == 0.0
  # Articles and ASCII punctuation go first, then unidecode: '«The»' keeps its '<< >>'.
  assert suite_metrics.normalize_answer('«The» answer', transliterate=True) == '<< >> answer'
  assert suite_metrics.token_f1('', '', transliterate=True) == 0.0  # Nothing shared: 0.
  assert suite_metrics.token_f1('the big red dog', 'a red dog') == pytest.approx(
      100 * 2 * (2 / 3) * 1 / (2 / 3 + 1))
  assert suite_metrics.score_example('f1_unidecode', 'Zürich', ['Geneva', 'zurich']) == {
      'f1': 100.0}


def test_letter_accuracy():
  assert suite_metrics.letter_accuracy('The answer is (B) because', '(B) The house') == 100.0
  assert suite_metrics.letter_accuracy('A or B', 'B') == 0.0  # The first letter counts.
  assert suite_metrics.letter_accuracy('Based on it, C', 'C') == 100.0  # 'Based' is no letter.
  assert suite_metrics.letter_accuracy('none', 'D') == 0.0
  with pytest.raises(ValueError, match='holds no option letter'):
    suite_metrics.letter_accuracy('A', 'no letter here')


def test_exponential_similarity():
  assert suite_metrics.exp_similarity('40%', '30%') == 50.0
  assert suite_metrics.exp_similarity('30%', '30%') == 100.0
  assert suite_metrics.exp_similarity('12.5%', '32.5%') == 25.0
  assert suite_metrics.exp_similarity('about forty percent', '40%') == 0.0
  assert suite_metrics.exp_similarity('10%', 'no percentage') == 50.0  # Gold counts as 0%.
  # The paper's example: the first percentage is the answer.
  paper = ('Out of 50 reviews, 20 are positive and 30 are negative, so 40% of the reviews are '
           'positive 60% are negative.')
  assert suite_metrics.percentage(paper) == 40.0
  assert suite_metrics.exp_similarity(paper, '40%') == 100.0


def test_concordance_index():
  assert suite_metrics.concordance_index('1, 3, 2', '1, 2, 3') == pytest.approx(66.6667,
                                                                                abs=1e-4)
  assert suite_metrics.concordance_index('Order: 3, 2, 1.', '1, 2, 3') == 0.0
  assert suite_metrics.concordance_index('Summary IDs: 2 1 3 4', '1, 2, 3, 4') == pytest.approx(
      500 / 6)
  assert suite_metrics.concordance_index('1, 2', '1, 2, 3') == 0.0  # Not the same IDs.
  assert suite_metrics.concordance_index('1, 2, 2', '1, 2, 3') == 0.0
  assert suite_metrics.summary_ids('Summary 12, then 3rd; 4') == [12, 3, 4]
  with pytest.raises(ValueError, match='not an order of 2 or more'):
    suite_metrics.concordance_index('1', '1')


def test_seqio_metric_path():
  """`metrics.postprocess` then the task's metric function, as seqio (and t5align.eval) call
  them: references from the target's meta; a test split (no references) scores nothing."""
  def target(outputs):
    example = {'inputs': np.ones(5, np.int32), 'targets': np.ones(2, np.int32),
               'meta': json.dumps({'outputs': outputs}).encode()}
    return metrics.postprocess((outputs[0] if outputs else '').encode(), example=example,
                               is_target=True)

  metric = metrics.make_metric_fn('f1_unidecode')
  targets = [target(['English and German', 'German']), target(['yes'])]
  assert metric(targets, ['German', 'no']) == {'f1': 50.0, 'score': 50.0}
  assert metrics.score_example('c_index', target(['1, 2, 3']), '1, 3, 2')[
      'concordance_index'] == pytest.approx(200 / 3)
  assert metric([target([]), target([])], ['a', 'b']) == {}
  with pytest.raises(ValueError, match='1 of 2 examples have no reference'):
    metric([target(['x']), target([])], ['a', 'b'])
  assert set(suite_metrics.FAMILIES) <= set(metrics.FAMILIES)


# ---------------------------------------------------------------------------------------------
# Catalog and registration.


def test_catalog_tasks_and_mixtures():
  names = [f't5align_zeroscrolls_{t}_{n}' for n in (512, 1024, 2048, 4096, 8192)
           for t in zeroscrolls.TASKS]
  assert len(names) == 50 and set(names) <= set(catalog.SPECS)
  for n in zeroscrolls.LENGTHS:
    assert catalog.resolve(f't5align_zeroscrolls_{n}') == tuple(
        f't5align_zeroscrolls_{t}_{n}' for t in zeroscrolls.TASKS)
  spec = catalog.SPECS['t5align_zeroscrolls_book_sum_sort_2048']
  assert (spec.family, spec.table, spec.group, spec.column) == ('c_index', 'zeroscrolls',
                                                                '2048', 'BkSS')
  assert spec.splits == ('validation', 'test') and spec.tokenized
  assert spec.max_decode_length == 1024
  assert {catalog.SPECS[n].family for n in names} == {'rouge_geo', 'f1_unidecode', 'letter_acc',
                                                      'exp_sim', 'c_index'}
  with pytest.raises(ValueError, match="has the split.s. validation, test; got 'train'"):
    spec.examples(None, 'train')


def test_eval_decodes_them_greedily_for_1024_steps():
  from t5align import jobs  # pylint: disable=g-import-not-at-top
  from t5align import t5x_gin  # pylint: disable=g-import-not-at-top
  spec = catalog.SPECS['t5align_zeroscrolls_qasper_8192']
  assert jobs.EvalJob().task_mode(spec) == (False, 1024)
  assert jobs.EvalJob(max_decode_length=64).task_mode(spec) == (False, 64)
  assert t5x_gin.task_feature_lengths('t5align_zeroscrolls_8192') == {'targets': 1024}


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
