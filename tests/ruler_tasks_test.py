"""RULER as seqio tasks: the catalog's specs and mixtures, the options, records turned into
examples (input + answer_prefix; every reference in the meta), and the registered tasks'
features, postprocessor and metric functions.

Where a test needs no particular sample it feeds the tasks written-out records in RULER's jsonl
format through a stand-in generator; the tests at the end run the real generator
(`seqio_tasks.ruler.generate`) on the offline tasks with the shipped vocabulary. Upstream facts
(NVIDIA/RULER at c3f5e3b, ../shared/docs/YARDSTICKS.md section 1): tokens_to_generate 128 (NIAH),
30 (vt), 120 (cwe), 50 (fwe), 32 (qa); QA scored with string_match_part, the rest with
string_match_all; NUM_SAMPLES = 500.
"""
from __future__ import annotations

import json
import pathlib
import sys
import types

import numpy as np
import pytest

from seqio_tasks import catalog
from seqio_tasks import data
from seqio_tasks import metrics
from seqio_tasks import ruler
from seqio_tasks.ruler import suite

SHIPPED_VOCABULARY = (pathlib.Path(__file__).resolve().parents[1] / 't5align' / 'shipped'
                      / 'retrieval_t5' / 'sentencepiece.model')
TASKS = ('niah_single_1', 'niah_single_2', 'niah_single_3', 'niah_multikey_1', 'niah_multikey_2',
         'niah_multikey_3', 'niah_multivalue', 'niah_multiquery', 'vt', 'cwe', 'fwe', 'qa_1',
         'qa_2')
DECODE = {'vt': 30, 'cwe': 120, 'fwe': 50, 'qa_1': 32, 'qa_2': 32}
PREFIX = ' The special magic numbers for wry-tenant mentioned in the provided text are'
# Two written-out records in upstream's format (niah.py's fields).
RECORDS = [
    {'index': 0, 'input': 'Some special magic numbers are hidden ... wry-tenant is: 1234567. ...',
     'outputs': ['1234567', '7654321'], 'length': 40, 'length_w_model_temp': 40,
     'answer_prefix': PREFIX, 'token_position_answer': {'1234567': 12}},
    {'index': 1, 'input': 'Some special magic numbers ... One for wry-tenant is: 5555555.',
     'outputs': ['5555555'], 'length': 30, 'length_w_model_temp': 30, 'answer_prefix': PREFIX},
]


def test_specs_and_mixtures():
  names = [n for n in catalog.SPECS if n.startswith('t5align_ruler_')]
  assert len(names) == 13 * 6
  assert ruler.TASKS == TASKS and ruler.LENGTHS == (512, 1024, 2048, 4096, 8192, 16384)
  for task in TASKS:
    for length in ruler.LENGTHS:
      spec = catalog.SPECS[f't5align_ruler_{task}_{length}']
      assert spec.family == ('string_match_part' if task.startswith('qa') else 'string_match_all')
      assert spec.max_decode_length == DECODE.get(task, 128)
      assert (spec.table, spec.group, spec.column, spec.splits, spec.tokenized) == (
          'ruler', str(length), task, ('test',), False)
  assert catalog.MIXTURES['t5align_ruler_4096'] == tuple(f't5align_ruler_{t}_4096' for t in TASKS)
  assert catalog.MIXTURES['t5align_ruler_offline_512'] == tuple(
      f't5align_ruler_{t}_512' for t in ('niah_single_1', 'niah_multikey_2', 'niah_multikey_3',
                                         'vt', 'cwe', 'fwe'))


def test_decode_lengths_in_t5align_eval_and_t5x():
  from t5align import jobs  # pylint: disable=g-import-not-at-top
  from t5align import t5x_gin  # pylint: disable=g-import-not-at-top
  assert jobs.EvalJob().task_mode(catalog.SPECS['t5align_ruler_vt_2048']) == (False, 30)
  assert t5x_gin.task_feature_lengths('t5align_ruler_cwe_1024') == {'targets': 120}
  # A mixture decodes its longest (t5x; t5align.eval stops each task at its own).
  assert t5x_gin.task_feature_lengths('t5align_ruler_512') == {'targets': 128}


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
  for task in TASKS:
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
  assert set(generate.TASKS) == set(TASKS) and set(generate.OFFLINE_TASKS) == set(
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
