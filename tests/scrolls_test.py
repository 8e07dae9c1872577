"""Tests for SCROLLS: its metric (through seqio's postprocessor and metric functions), the
evaluation tasks' grouping by id over TFDS `scrolls`, the fine-tuning tasks and the catalog.

Metric values are written out: the example of SCROLLS' metric file docstring (tau/scrolls
metrics/scrolls.py, the HuggingFace data set's; ../shared/docs/YARDSTICKS.md section 3.3) and
`rouge_score` called directly. The TFDS data is `tfds.testing.mock_data` with rows written here
in the record format {id, pid, input, output} (TFDS's Text features), rows sharing an id holding
one reference each, as NarrativeQA's and Qasper's do; no suite data is committed. Tokens come
from the shipped model's SentencePiece file.
"""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from seqio_tasks import catalog
from seqio_tasks import data
from seqio_tasks import metrics
from seqio_tasks import scrolls

SHIPPED_VOCABULARY = (pathlib.Path(__file__).resolve().parents[1] / 't5align' / 'shipped'
                      / 'retrieval_t5' / 'sentencepiece.model')
EOS = 1

# SCROLLS' metric file docstring: "Examples: predictions = [...] references = [[...], ...]" and
# its printed results for 'gov_report', 'contract_nli' and 'narrative_qa' (each also stands for
# the configs the docstring names beside it: qmsum and summ_screen_fd, quality, qasper).
DOC_PREDICTIONS = ['exact match example', 'hello there', 'general kenobi']
DOC_REFERENCES = [['exact match example'], ['hello', 'hi there'], ['commander kenobi']]
DOC_RESULTS = {
    'gov_report': {'rouge1': 72.2222, 'rouge2': 33.3333, 'rougeL': 72.2222, 'score': 55.8136},
    'contract_nli': {'exact_match': 33.3333, 'score': 33.3333},
    'narrative_qa': {'f1': 72.2222, 'score': 72.2222},
}
SIBLINGS = {'gov_report': ('qmsum', 'summ_screen_fd'), 'contract_nli': ('quality',),
            'narrative_qa': ('qasper',)}

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


def _target(outputs: list[str]) -> dict:
  """A target as the evaluation tasks' postprocessor makes it (meta 'outputs': every
  reference)."""
  example = {'inputs': np.ones(3, np.int32), 'targets': np.ones(2, np.int32),
             'meta': json.dumps({'outputs': outputs}).encode()}
  return metrics.postprocess((outputs[0] if outputs else '').encode(), example=example,
                             is_target=True)


# ---------------------------------------------------------------------------------------------
# The metric.


@pytest.mark.parametrize('config', sorted(DOC_RESULTS))
def test_the_metric_files_docstring_example(config):
  """Every config scores the docstring's example as SCROLLS' metric prints it (rounded to 4
  decimals, as it rounds)."""
  for name in (config, *SIBLINGS[config]):
    metric = metrics.make_metric_fn(scrolls.FAMILIES[name])
    got = metric([_target(r) for r in DOC_REFERENCES], DOC_PREDICTIONS)
    assert {k: round(got[k], 4) for k in DOC_RESULTS[config]} == DOC_RESULTS[config], name


def test_rouge_is_rouge_score_with_the_max_over_references_and_the_geometric_mean():
  """The summaries' metric against `rouge_score` called directly, as SCROLLS' compute_rouge
  calls it (no stemmer; its sentence split, one sentence a line, changes only ROUGE-Lsum, so
  the texts are scored here with that split and ours without)."""
  rouge_scorer = pytest.importorskip('rouge_score.rouge_scorer')
  scorer = rouge_scorer.RougeScorer(['rouge1', 'rouge2', 'rougeL'], use_stemmer=False)
  predictions = ['The committee approved the budget. It cited rising costs.',
                 'Officials said the bridge will reopen in May after repairs.']
  references = [['Costs rising, the committee approved the budget.',
                 'The budget was approved. The committee cited costs.'],
                ['The bridge reopens in May.', 'Repairs close the bridge until spring.']]
  one_per_line = lambda text: text.replace('. ', '.\n')
  want = {}
  for key in ('rouge1', 'rouge2', 'rougeL'):
    per_example = [max(100 * scorer.score(one_per_line(r), one_per_line(p))[key].fmeasure
                       for r in refs) for p, refs in zip(predictions, references)]
    want[key] = sum(per_example) / 2
  want['score'] = (want['rouge1'] * want['rouge2'] * want['rougeL']) ** (1 / 3)
  metric = metrics.make_metric_fn(scrolls.FAMILIES['qmsum'])
  got = metric([_target(r) for r in references], predictions)
  assert {k: got[k] for k in want} == pytest.approx(want, rel=1e-12)
  assert got['rouge_geometric_mean'] == got['score']


def test_answers_are_scored_without_transliteration():
  """SCROLLS' F1 and exact match normalize as SQuAD (lower case, no punctuation, no a/an/the);
  unlike ZeroSCROLLS' F1 they do not transliterate: 'Zürich' is not 'zurich'."""
  f1 = metrics.make_metric_fn(scrolls.FAMILIES['qasper'])
  assert f1([_target(['zurich'])], ['Zürich']) == {'f1': 0.0, 'score': 0.0}
  assert f1([_target(['The big, red dog!'])], ['a red dog']) == {
      'f1': pytest.approx(80.0), 'score': pytest.approx(80.0)}  # P = 1, R = 2/3.
  em = metrics.make_metric_fn(scrolls.FAMILIES['contract_nli'])
  assert em([_target(['Entailment']), _target(['Not mentioned'])],
            ['entailment.', 'Contradiction']) == {'exact_match': 50.0, 'score': 50.0}


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
# The catalog.


def test_catalog_tasks_and_mixtures():
  names = [f't5align_scrolls_{c}_{n}' for n in (512, 1024, 2048, 4096, 8192, 16384)
           for c in scrolls.TASKS]
  assert len(names) == 42 and set(names) <= set(catalog.SPECS)
  for n in scrolls.LENGTHS:
    assert catalog.resolve(f't5align_scrolls_{n}') == tuple(
        f't5align_scrolls_{c}_{n}' for c in ('gov_report', 'summ_screen_fd', 'qmsum', 'qasper',
                                             'narrative_qa', 'quality', 'contract_nli'))
  spec = catalog.SPECS['t5align_scrolls_quality_4096']
  assert (spec.family, spec.table, spec.group, spec.column) == ('exact_match', 'scrolls', '4096',
                                                                'QALT')
  assert spec.splits == ('validation', 'test') and spec.tokenized
  assert spec.max_decode_length == 1024
  assert {c: catalog.SPECS[f't5align_scrolls_{c}_512'].family for c in scrolls.TASKS} == {
      'gov_report': 'rouge_geo', 'summ_screen_fd': 'rouge_geo', 'qmsum': 'rouge_geo',
      'qasper': 'f1', 'narrative_qa': 'f1', 'quality': 'exact_match',
      'contract_nli': 'exact_match'}
  with pytest.raises(ValueError, match="has the split.s. validation, test; got 'train'"):
    spec.examples(None, 'train')
  assert scrolls.tfds_name('qasper') == 'scrolls/qasper:1.0.0'
  with pytest.raises(ValueError, match="no SCROLLS config 'squality'"):
    scrolls.tfds_name('squality')


def test_eval_decodes_them_greedily_for_1024_steps():
  from t5align import jobs  # pylint: disable=g-import-not-at-top
  from t5align import t5x_gin  # pylint: disable=g-import-not-at-top
  assert jobs.EvalJob().task_mode(catalog.SPECS['t5align_scrolls_gov_report_16384']) == (
      False, 1024)
  assert t5x_gin.task_feature_lengths('t5align_scrolls_16384') == {'targets': 1024}


# ---------------------------------------------------------------------------------------------
# The seqio tasks over mocked TFDS data.


@pytest.fixture
def seqio_env(monkeypatch):
  """seqio with the tasks registered on the shipped vocabulary, and no TFDS builder memoized
  from another test."""
  seqio = pytest.importorskip('seqio')
  monkeypatch.setenv('T5ALIGN_VOCABULARY', str(SHIPPED_VOCABULARY))
  monkeypatch.setattr(seqio.utils.LazyTfdsLoader, '_MEMOIZED_BUILDERS', {})
  from seqio_tasks import tasks  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  return seqio


@pytest.fixture
def mock_scrolls(seqio_env):
  """`mock_scrolls({(config, split): rows})`: TFDS `scrolls` mocked to read those rows."""
  tf = pytest.importorskip('tensorflow')
  tfds = pytest.importorskip('tensorflow_datasets')
  seen = []

  def start(rows_by_split):
    def as_dataset(builder, split, **kwargs):
      del kwargs
      key = (builder.builder_config.name, str(split))
      seen.append((builder.name, str(builder.version), *key))
      rows = rows_by_split[key]
      return tf.data.Dataset.from_generator(
          lambda: iter(rows),
          output_signature={k: tf.TensorSpec([], tf.string) for k in scrolls.FEATURES})
    return tfds.testing.mock_data(as_dataset_fn=as_dataset,
                                  policy=tfds.testing.MockPolicy.USE_CODE)
  start.seen = seen
  return start


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
