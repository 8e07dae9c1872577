"""Tests for seqio_tasks: upstream formats, determinism, data errors, and the seqio registration.

Builders are checked on small generated files in upstream's record format (and on the shipped
files in ../shared/data when they are there); the seqio part uses a SentencePiece model trained
in the test (vocabulary <= 128 pieces).
"""
from __future__ import annotations

import gzip
import json
import pathlib

import gin
import numpy as np
import pytest

from seqio_tasks import catalog
from seqio_tasks import suite
from seqio_tasks import code
from seqio_tasks import data
from seqio_tasks import lm
from seqio_tasks import qa
from seqio_tasks import retrieval

SHARED_DATA = pathlib.Path(__file__).resolve().parents[3] / 'shared' / 'data'
SPM_TEXT = [
    'There is an important info hidden inside a lot of irrelevant text. Find it and memorize',
    'The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.',
    'What is the pass key? The pass key is 12345. Remember it. 67890 is the pass key.',
    'def my_function() -> int: return assert == import class self None True False',
    'Write a high-quality answer for the given question using only the provided search',
    'Document [1](Title: x) Question: Answer: line REGISTER_CONTENT is JSON data Key value',
]


def _write_jsonl(path: pathlib.Path, records, compress=False) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  text = ''.join(json.dumps(r) + '\n' for r in records)
  if compress:
    path = path.with_suffix(path.suffix + '.gz')
    with gzip.open(path, 'wt') as f:
      f.write(text)
  else:
    path.write_text(text)
  return path


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
  monkeypatch.setenv(data.ENV_DATA_DIR, str(tmp_path))
  return tmp_path


@pytest.fixture(scope='module')
def spm_model(tmp_path_factory, toy_sentencepiece):
  path = tmp_path_factory.mktemp('spm') / 'tiny.model'
  path.write_bytes(toy_sentencepiece(SPM_TEXT))
  return path


@pytest.fixture(scope='module')
def tokenizer(spm_model):
  import sentencepiece  # pylint: disable=g-import-not-at-top

  class Tok(suite.Tokenizer):
    eos_id = 1
    processor = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))

    def encode(self, text):
      return self.processor.encode(text)

  return Tok()


# ---------------------------------------------------------------------------------------------
# Passkey.


def test_passkey_prompt_upstream_format():
  filler = ' '.join([retrieval.PASSKEY_FILLER] * 3)
  expected = '\n'.join([
      'There is an important info hidden inside a lot of irrelevant text. Find it and memorize '
      'them. I will quiz you about the important information there.',
      filler[:30],
      'The pass key is 4242. Remember it. 4242 is the pass key.',
      filler[:70],
      'What is the pass key? The pass key is'])
  assert retrieval.passkey_prompt(100, 30, 4242) == expected


def test_passkey_prompt_with_decoys():
  filler = ' '.join([retrieval.PASSKEY_FILLER] * 3)
  prompt = retrieval.passkey_prompt(100, 30, 4242, [(80, 'door code', 17), (10, 'safe code', 9)])
  assert prompt.split('\n') == [
      prompt.split('\n')[0],
      filler[:10], 'The safe code is 9. Remember it. 9 is the safe code.',
      filler[:20], 'The pass key is 4242. Remember it. 4242 is the pass key.',
      filler[:50], 'The door code is 17. Remember it. 17 is the door code.',
      filler[:20], 'What is the pass key? The pass key is']
  with pytest.raises(ValueError, match='needle position 101 outside'):
    retrieval.passkey_prompt(100, 30, 4242, [(101, 'door code', 17)])


def test_passkey_examples_seeded_per_index():
  a = list(retrieval.passkey_examples(20000, 5))
  b = list(retrieval.passkey_examples(20000, 8))
  assert a == b[:5]  # Example i does not depend on how many are asked for.
  assert len({e['targets'] for e in b}) == 8
  for e in b:
    key = int(e['targets'])
    assert 1 <= key <= 50000
    assert e['inputs'].count(f'The pass key is {key}. Remember it. {key} is the pass key.') == 1
    task, *filler, question = e['inputs'].split('\n')
    assert task == retrieval.PASSKEY_TASK and question == retrieval.PASSKEY_QUESTION
    assert len(filler[0]) + len(filler[2]) == 20000
  assert list(retrieval.passkey_examples(20000, 3, seed=1)) != a[:3]


# ---------------------------------------------------------------------------------------------
# LongEval lines and topics.

LINES_RECORD = {
    'random_idx': ['torpid-kid', 1], 'expected_number': 2416, 'num_lines': 2, 'token_size': 50,
    'correct_line': 'line torpid-kid: REGISTER_CONTENT is <2416>\n',
    'prompt': ('Below is a record of lines I want you to remember. ...\n\n'
               'line grotesque-classmate: REGISTER_CONTENT is <42527>\n'
               'line torpid-kid: REGISTER_CONTENT is <2416>\n\nNow the record is over. '
               'Tell me what is the <REGISTER_CONTENT> in line torpid-kid? I need the number. ')}
TOPICS_RECORD = {'test_id': 0, 'prompt': 'Below is a record of our previous conversation ...',
                 'topics': ['The psychology of creativity', 'The impact of social media']}


def test_lines_examples(data_dir):
  _write_jsonl(data_dir / 'longeval/lines/2_lines.jsonl', [LINES_RECORD, LINES_RECORD],
               compress=True)
  examples = list(retrieval.lines_examples(2))
  assert [e['targets'] for e in examples] == ['2416', '2416']
  assert examples[0]['inputs'] == LINES_RECORD['prompt']
  assert examples[0]['id'] == '2_lines/1'


def test_topics_examples(data_dir):
  _write_jsonl(data_dir / 'longeval/topics/2_topics.jsonl', [TOPICS_RECORD])
  (example,) = retrieval.topics_examples(2)
  assert example['inputs'] == TOPICS_RECORD['prompt']
  assert example['targets'] == 'The psychology of creativity'
  assert json.loads(example['meta'])['topics'] == TOPICS_RECORD['topics']


@pytest.mark.skipif(not (SHARED_DATA / 'longeval').is_dir(), reason='shared data not present')
def test_shipped_longeval_files(monkeypatch):
  monkeypatch.setenv(data.ENV_DATA_DIR, str(SHARED_DATA))
  lines = list(retrieval.lines_examples(200))
  assert len(lines) == 50
  for e in lines:
    assert e['inputs'].endswith('I need the number. ')
    assert f'REGISTER_CONTENT is <{e["targets"]}>' in e['inputs']
  topics = list(retrieval.topics_examples(5))
  assert len(topics) == 50
  assert topics[0]['targets'] == 'The psychology of creativity'


# ---------------------------------------------------------------------------------------------
# Lost in the Middle: key-value retrieval and multi-document QA.


def test_kv_prompt_upstream_format():
  records = [('test key1', 'test value1'), ('test key2', 'test value2'),
             ('test key3', 'test value3')]
  assert retrieval.kv_prompt(records, 'test key2') == '\n'.join([
      'Extract the value corresponding to the specified key in the JSON object below.', '',
      'JSON data:', '{"test key1": "test value1",', ' "test key2": "test value2",',
      ' "test key3": "test value3"}', '', 'Key: "test key2"', 'Corresponding value:'])


def test_kv_examples_move_the_gold_pair(data_dir):
  pairs = [[f'k{i}', f'v{i}'] for i in range(5)]
  _write_jsonl(data_dir / 'lost_in_the_middle/kv-retrieval-5_keys.jsonl',
               [{'ordered_kv_records': pairs, 'key': 'k3', 'value': 'v3'}])
  for gold in range(5):
    (e,) = retrieval.kv_examples(5, gold)
    body = e['inputs'].split('JSON data:\n')[1].split('\n\n')[0]
    assert body.split('\n')[gold].strip(' {},') == '"k3": "v3"'
    assert e['targets'] == 'v3' and e['inputs'].endswith('Key: "k3"\nCorresponding value:')
  assert retrieval.kv_gold_positions(75) == (0, 24, 49, 74)


def test_qa_prompt_upstream_format():
  prompt = qa.qa_prompt('test question', [('first doc', 'first doc text'),
                                          ('second doc', 'second doc text')])
  assert prompt == (
      'Write a high-quality answer for the given question using only the provided search results '
      '(some of which might be irrelevant).\n\nDocument [1](Title: first doc) first doc text\n'
      'Document [2](Title: second doc) second doc text\n\nQuestion: test question\nAnswer:')


def _nq_records(n):
  return [{'question': f'question {i}?', 'answers': [f'answer{i}'],
           'ctxs': [{'title': f'title {i}', 'text': f'passage {i} says answer{i}.',
                     'hasanswer': True, 'isgold': True}]} for i in range(n)]


def test_oracle_examples(data_dir):
  records = _nq_records(12)
  # Question 0's answer also appears in question 5's passage: 5 must not be a distractor.
  records[5]['ctxs'][0]['text'] += ' Also answer0.'
  _write_jsonl(data_dir / 'lost_in_the_middle/nq-open-oracle.jsonl', records)
  per_position = {}
  for gold in (0, 4, 9):
    examples = list(qa.oracle_examples(10, gold, num_examples=3))
    assert len(examples) == 3
    docs = examples[0]['inputs'].split('\n\n')[1].split('\n')
    assert len(docs) == 10
    assert docs[gold] == f'Document [{gold + 1}](Title: title 0) passage 0 says answer0.'
    assert not any('title 5)' in d for d in docs)
    per_position[gold] = sorted(d.split(') ', 1)[1] for d in docs)
    assert json.loads(examples[0]['meta'])['answers'] == ['answer0']
  # The same documents at every gold position; only the order changes.
  assert per_position[0] == per_position[4] == per_position[9]
  assert list(qa.oracle_examples(10, 4, num_examples=3)) == list(
      qa.oracle_examples(10, 4, num_examples=3))


def test_upstream_qa_file(data_dir):
  record = _nq_records(1)[0]
  record['ctxs'] = [{'title': f't{j}', 'text': f'x{j}'} for j in range(10)]
  _write_jsonl(data_dir / 'lost_in_the_middle/qa_data/10_total_documents/'
               'nq-open-10_total_documents_gold_at_4.jsonl', [record], compress=True)
  (e,) = qa.upstream_examples(10, 4)
  assert 'Document [10](Title: t9) x9\n\nQuestion: question 0?\nAnswer:' in e['inputs']


@pytest.mark.skipif(not (SHARED_DATA / 'lost_in_the_middle').is_dir(),
                    reason='shared data not present')
def test_shipped_nq_oracle(monkeypatch):
  monkeypatch.setenv(data.ENV_DATA_DIR, str(SHARED_DATA))
  examples = list(qa.oracle_examples(30, 14, num_examples=20))
  path = data.find_file('lost_in_the_middle/nq-open-oracle.jsonl', 'lost_in_the_middle')
  records = list(qa.read_qa_file(path))[:20]
  for e, (_, question, _, docs) in zip(examples, records):
    # Passages may contain newlines, so find the numbered documents in order.
    starts = [e['inputs'].index(f'\nDocument [{i}](Title: ') for i in range(1, 31)]
    assert starts == sorted(starts) and 'Document [31]' not in e['inputs']
    title, text = docs[0]
    assert f'Document [15](Title: {title}) {text}\nDocument [16]' in e['inputs']
    assert e['inputs'].endswith(f'Question: {question}\nAnswer:')
  (kv,) = list(retrieval.kv_examples(75, 49))[:1]
  assert kv['inputs'].count('": "') == 75


# ---------------------------------------------------------------------------------------------
# Malformed and missing data.


@pytest.mark.parametrize('content, message', [
    ('{"prompt": "p", "expected_number": 1}\n{not json\n', r'2_lines\.jsonl:2: not valid JSON'),
    ('{"prompt": "p"}\n', r"2_lines\.jsonl:1: missing field\(s\) \['expected_number'\]"),
    ('\n{"prompt": "p", "expected_number": "7"}\n', r"2_lines\.jsonl:2: field 'expected_number'"),
    ('[1, 2]\n', r'2_lines\.jsonl:1: expected a JSON object'),
    ('', r'2_lines\.jsonl: no records'),
    ('\n\n', r'2_lines\.jsonl: no records'),
])
def test_malformed_files_name_file_and_line(data_dir, content, message):
  path = data_dir / 'longeval/lines/2_lines.jsonl'
  path.parent.mkdir(parents=True)
  path.write_text(content)
  with pytest.raises(data.DataError, match=message):
    list(retrieval.lines_examples(2))


def test_malformed_nested_fields(data_dir):
  _write_jsonl(data_dir / 'lost_in_the_middle/kv-retrieval-2_keys.jsonl',
               [{'ordered_kv_records': [['a', 'b'], ['c', 'd']], 'key': 'x', 'value': 'y'}])
  with pytest.raises(data.DataError, match=r'kv-retrieval-2_keys\.jsonl:1: the pair'):
    list(retrieval.kv_examples(2, 0))
  _write_jsonl(data_dir / 'lost_in_the_middle/nq-open-oracle.jsonl',
               [{'question': 'q', 'answers': ['a'], 'ctxs': [{'title': 't'}]}])
  with pytest.raises(data.DataError, match=r"oracle\.jsonl:1: ctxs\[0\] needs"):
    list(qa.oracle_examples(10, 0))


def test_corrupt_gzip(data_dir):
  path = data_dir / 'longeval/topics/5_topics.jsonl.gz'
  path.parent.mkdir(parents=True)
  path.write_bytes(b'not gzip at all')
  with pytest.raises(data.DataError, match=r'5_topics\.jsonl\.gz: cannot be read'):
    list(retrieval.topics_examples(5))


def test_missing_file_says_where_to_get_it(data_dir):
  with pytest.raises(FileNotFoundError, match=r'(?s)300_lines\.jsonl\[\.gz\] not found.*'
                                              r'DachengLi1/LongChat.*T5ALIGN_DATA_DIR'):
    list(retrieval.lines_examples(300))
  with pytest.raises(FileNotFoundError, match='nelson-liu/lost-in-the-middle'):
    list(qa.upstream_examples(20, 4))


@pytest.mark.usefixtures('clean_gin')
def test_gin_data_dir(tmp_path):
  _write_jsonl(tmp_path / 'longeval/topics/2_topics.jsonl', [TOPICS_RECORD])
  with gin.unlock_config():
    gin.bind_parameter('seqio_tasks.data.data_dir.path', str(tmp_path))
  assert len(list(retrieval.topics_examples(2))) == 1


# ---------------------------------------------------------------------------------------------
# Code and LM.


def test_stdlib_files_sorted_without_tests():
  files = code.stdlib_files()
  assert len(files) > 100
  assert not any('test' in p.parts or 'site-packages' in p.parts for p in files)


def test_code_completion_examples(tokenizer):
  count = lambda text: len(tokenizer.encode(text))
  examples = list(code.stdlib_completion_examples(4, count, min_tokens=200, max_tokens=600))
  assert examples == list(code.stdlib_completion_examples(4, count, min_tokens=200,
                                                          max_tokens=600))
  for e in examples:
    budget = json.loads(e['meta'])['budget']
    assert count(e['inputs'].rstrip('\n')) <= budget
    assert e['targets'] and e['targets'] == e['targets'].strip()
    assert e['inputs'].endswith('\n')


def test_lcc_file(data_dir):
  _write_jsonl(data_dir / 'lcc.jsonl', [{'context': 'import os\n', 'gt': '  x = 1  '},
                                        {'context': 'a = 1\n', 'answers': ['b = 2']}])
  examples = list(code.lcc_completion_examples(str(data_dir / 'lcc.jsonl')))
  assert [(e['inputs'], e['targets']) for e in examples] == [('import os\n', 'x = 1'),
                                                             ('a = 1\n', 'b = 2')]
  _write_jsonl(data_dir / 'bad.jsonl', [{'context': 'x'}])
  with pytest.raises(data.DataError, match=r"bad\.jsonl:1: missing field 'gt'"):
    list(code.lcc_completion_examples(str(data_dir / 'bad.jsonl')))


def test_code_key_examples(tokenizer):
  count = lambda text: len(tokenizer.encode(text))
  examples = list(code.code_key_examples(600, 3, count))
  assert examples == list(code.code_key_examples(600, 3, count))
  for e in examples:
    key = int(e['targets'])
    assert 1 <= key <= 100
    assert code.KEY_FUNCTION.format(key=key) in e['inputs'] + '\n'
    assert e['inputs'].endswith('assert my_function() == ')
    assert 500 <= count(e['inputs']) <= 620


def test_lm_windows(data_dir, tokenizer):
  _write_jsonl(data_dir / 'lost_in_the_middle/nq-open-oracle.jsonl', _nq_records(40))
  examples = list(lm.wiki_examples(64, 3, tokenizer.encode, continuation=16))
  again = list(lm.wiki_examples(64, 3, tokenizer.encode, continuation=16))
  for e, f in zip(examples, again, strict=True):
    np.testing.assert_array_equal(e['inputs'], f['inputs'])
    np.testing.assert_array_equal(e['targets'], f['targets'])
  for e in examples:
    assert len(e['inputs']) == 64 and e['inputs'][-1] == 1 and 1 not in e['inputs'][:-1]
    assert len(e['targets']) == 16
  _write_jsonl(data_dir / 'docs.jsonl', [{'text': ' '.join(SPM_TEXT)}] * 3)
  windows = list(lm.text_examples(str(data_dir / 'docs.jsonl'), 32, 100, tokenizer.encode,
                                  continuation=8))
  stream = np.concatenate([tokenizer.encode(' '.join(SPM_TEXT))] * 3)
  assert len(windows) == len(stream) // 39
  np.testing.assert_array_equal(windows[1]['inputs'][:-1], stream[39:70])
  np.testing.assert_array_equal(windows[1]['targets'], stream[70:78])


def test_catalog_covers_the_paper():
  names = set(catalog.SPECS)
  for n in ('20k', '30k', '40k', '50k', '55k'):
    assert f't5align_passkey_{n}' in names
  for n in (200, 300, 400, 500, 600, 680):
    assert f't5align_lines_{n}' in names
  for n in (5, 10, 15, 20, 25):
    assert f't5align_topics_{n}' in names
  for n, positions in ((10, (0, 4, 9)), (20, (0, 4, 9, 14, 19)),
                       (30, (0, 4, 9, 14, 19, 24, 29))):
    for k in positions:
      assert {f't5align_mdqa_{n}docs_gold{k}', f't5align_mdqa_oracle_{n}docs_gold{k}'} <= names
  for n in (512, 1024, 2048, 4096, 8192, 15000):
    assert f't5align_lm_wiki_{n}' in names
  assert {'t5align_code_completion_stdlib', 't5align_code_key_16k_stdlib',
          't5align_kv_75keys_gold24'} <= names
  assert all(n.startswith('t5align_') for n in list(names) + list(catalog.MIXTURES))
  assert len(catalog.MIXTURES['t5align_retrieval']) == 16


def test_user_file_not_configured(monkeypatch):
  monkeypatch.delenv('T5ALIGN_LCC_PATH', raising=False)
  with pytest.raises(FileNotFoundError, match='T5ALIGN_LCC_PATH'):
    list(catalog.SPECS['t5align_code_completion_lcc'].build(None))


# ---------------------------------------------------------------------------------------------
# seqio registration.


@pytest.fixture
def seqio_env(spm_model, data_dir, monkeypatch):
  seqio = pytest.importorskip('seqio')
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(spm_model))
  from seqio_tasks import tasks  # pylint: disable=g-import-not-at-top
  return seqio, tasks


@pytest.mark.tensorflow
def test_registry(seqio_env):
  seqio, _ = seqio_env
  registered = set(seqio.TaskRegistry.names())
  assert set(catalog.SPECS) <= registered
  assert set(catalog.MIXTURES) <= set(seqio.MixtureRegistry.names())


@pytest.mark.tensorflow
@pytest.mark.usefixtures('clean_gin')
def test_seqio_passkey_dataset(seqio_env, spm_model):
  seqio, tasks = seqio_env
  with gin.unlock_config():
    gin.bind_parameter('seqio_tasks.options.passkey_examples', 3)
  task = seqio.get_mixture_or_task('t5align_passkey_2k')
  got = list(task.get_dataset(None, split='test', shuffle=False).as_numpy_iterator())
  expected = list(retrieval.passkey_examples(2000, 3))
  assert len(got) == 3
  vocab = task.output_features['inputs'].vocabulary
  assert vocab.sentencepiece_model_file == str(spm_model)
  for ex, want in zip(got, expected):
    assert ex['inputs_pretokenized'].decode() == want['inputs']
    assert ex['targets_pretokenized'].decode() == want['targets']
    assert ex['inputs'][-1] == 1 and ex['targets'][-1] == 1  # EOS appended.
    assert vocab.decode(ex['targets'].tolist()) == want['targets']
  # The task's metric function on its own postprocessed targets.
  targets = [task.postprocess_fn(ex['targets_pretokenized'], example=ex, is_target=True)
             for ex in got]
  (metric_fn,) = task.predict_metric_fns
  predictions = [targets[0]['target'], 'no idea', f'{targets[2]["target"]}.']
  assert metric_fn(targets, predictions) == {'accuracy': pytest.approx(200 / 3)}


@pytest.mark.tensorflow
def test_seqio_missing_data_is_an_error(seqio_env):
  seqio, _ = seqio_env
  task = seqio.get_mixture_or_task('t5align_topics_25')
  with pytest.raises(FileNotFoundError, match='25_topics'):
    task.get_dataset(None, split='test', shuffle=False)


@pytest.mark.tensorflow
def test_vocabulary_matches_t5x_model_vocabulary(seqio_env, spm_model):
  seqio, tasks = seqio_env
  assert tasks.VOCABULARY == seqio.SentencePieceVocabulary(str(spm_model))
  assert tasks.VOCABULARY != seqio.SentencePieceVocabulary(tasks.T5_VOCABULARY)


def test_lines_prompt_is_longeval_format():
  prompt = retrieval.lines_prompt([('torpid-kid', 2416), ('calm-otter', 7)], 'torpid-kid')
  assert prompt.startswith('Below is a record of lines I want you to remember.')
  assert 'record start:\n\nline torpid-kid: REGISTER_CONTENT is <2416>\n' in prompt
  assert 'line calm-otter: REGISTER_CONTENT is <7>\n\nNow the record is over.' in prompt
  assert prompt.endswith('in line torpid-kid? I need the number. ')
