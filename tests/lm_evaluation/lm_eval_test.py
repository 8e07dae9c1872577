"""t5align as an lm-eval model (`t5align.lm_eval`), against lm-eval's own hf backend.

The references: lm-eval 0.4.13's `hf` model (`backend=seq2seq`, float32, CPU) on a tiny T5 and
tokenizer written by HuggingFace's own code, compared through lm-eval's own `--log_samples`
output; HF's PyTorch T5 with its encoder self-attention tempered (`hf_reference`); and
`t5align.calibrate` on the same contexts. The local tasks are written here (`dataset_path:
json`), one per output type lm-eval has.
"""
from __future__ import annotations

import glob
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

lm_eval = pytest.importorskip('lm_eval')

from t5align.attention import reference  # noqa: E402  # pylint: disable=g-import-not-at-top
from t5align.lm_eval import engine as engine_lib  # noqa: E402  # pylint: disable=g-import-not-at-top
from t5align.lm_eval import settings  # noqa: E402
from t5align.lm_eval import sources  # noqa: E402
from t5align.lm_eval import temperatures  # noqa: E402
from t5align.shipped import assets  # noqa: E402

# The tests that need torch (the hf backend, HF's PyTorch T5) skip where it is not installed.
pytestmark = pytest.mark.newest_jax

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = REPO_ROOT / 't5align' / 'shipped' / 'retrieval_t5'
SHIPPED_CHECKPOINT = assets.checkpoint_dir(str(SHIPPED))
WORDS = ('amber river falcon garden lantern meadow orchard pepper planet rabbit saddle thistle '
         'tiger valley walnut window harbor island kettle ladder').split()
MAX_LENGTH = 96  # Shorter than about half of the toy contexts.
TOY_TASKS = ('toy_mc', 'toy_ll', 'toy_gen', 'toy_gen_long', 'toy_rolling')
GEN_TOKS = {'toy_gen': 24, 'toy_gen_long': 5}


# -------------------------------------------------------------------------------------------
# The arguments, the shapes and the buckets: no model.


@pytest.mark.parametrize('kwargs, message', [
    ({'pretrained': '/c', 'tempreature': 0.8}, r"unknown model argument 'tempreature' \(did you "
                                               r'mean temperature\?\)'),
    ({'pretrained': '/c', 'trust_remote_code': True}, 'an hf argument with no meaning here'),
    ({'pretrained': '/c', 'backend': 'causal'}, "backend='causal'"),
    ({'pretrained': '/c', 'calibrate': 'pmax'}, 'calibrate=pmax needs reference_length'),
    ({'pretrained': '/c', 'calibrate': 'pmax', 'reference_length': 512, 'max_length': 512},
     'reference_length=512 is not below max_length=512'),
    ({'pretrained': '/c', 'calibrate': 'pmaks', 'reference_length': 512},
     "calibrate='pmaks': 'pmaks' is not a strategy"),
    ({'pretrained': '/c', 'calibrate': 'pmax:bias=joint', 'reference_length': 512},
     'give the bias rule as bias_rule='),
    ({'pretrained': '/c', 'bias_rule': 'stretch'}, "bias_rule='stretch': expected one of none"),
    ({'pretrained': '/c', 'bias_rule': 'interpolate'},
     'bias_rule=interpolate: .*give L_tr .* \\(bias_scale=, reference_length=\\)'),
    ({'pretrained': '/c', 'bias_rule': 'extend', 'bias_scale': '0.5'},
     'bias_rule=extend: .*extension=0.5'),
    ({'pretrained': '/c', 'bias_scale': 2.0}, 'bias_scale is read with bias_rule= only'),
    ({'pretrained': '/c', 'temperature': 0.8, 'schedule': '/s.json'}, 'both set the temperature'),
    ({'pretrained': '/c', 'schedule_task': 'x'}, 'schedule_task is read with schedule= only'),
    ({'pretrained': '/c', 'reference_length': 512}, 'reference_length is read with calibrate='),
    ({'pretrained': '/c', 'batch_size': 'auto'}, "batch_size='auto': t5align takes a number"),
    ({'pretrained': '/c', 'truncation': True}, 'truncation=True: expected one of left, middle'),
    ({'pretrained': '/c', 'max_length': 0}, 'max_length must be a positive integer'),
    ({'pretrained': '/c', 'temperature': -1.0}, 'temperature must be finite and > 0'),
    ({'pretrained': '/c', 'attention_impl': 'flash'}, "attention_impl='flash': expected one of"),
    ({'pretrained': '/c', 'dtype': 'float16'}, "dtype='float16': expected one of"),
    ({}, 'pretrained is required'),
])
def test_model_arguments_refused_by_name(kwargs, message):
  with pytest.raises(ValueError, match=message):
    settings.ModelArgs.from_kwargs(kwargs)


def test_bias_rule_arguments_make_the_encoders_rule():
  args = settings.ModelArgs.from_kwargs({'pretrained': '/c', 'bias_rule': 'interpolate',
                                         'reference_length': 256})
  assert args.encoder_bias_rule() == reference.BiasRule('interpolate', reference_length=256)
  args = settings.ModelArgs.from_kwargs({'pretrained': '/c', 'bias_rule': 'extend',
                                         'bias_scale': '2'})
  assert args.encoder_bias_rule().at(4096) == reference.OffsetMap(extension=2.0)
  assert settings.ModelArgs(pretrained='/c').encoder_bias_rule() == reference.BiasRule()


def test_with_a_bias_rule_a_batch_holds_one_width():
  """The rule is resolved at a batch's width: with one, contexts of different widths
  (`engine.width`) never share a batch, so a request's rule is its own width's; without one,
  batches are longest first as before."""
  import types  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  lengths = [700, 100, 390, 120, 500, 90]  # widths 768, 128, 512, 128, 512, 128
  contexts = [np.ones(n, np.int32) for n in lengths]
  config = network.T5Config(vocab_size=32)
  plain = types.SimpleNamespace(model=types.SimpleNamespace(config=config), batch_size=2)
  assert engine_lib.Engine._batches(plain, contexts) == [[0, 4], [2, 3], [1, 5]]  # pylint: disable=protected-access
  ruled = types.SimpleNamespace(model=types.SimpleNamespace(config=config.replace(
      encoder_bias_rule=reference.BiasRule('interpolate', reference_length=256))), batch_size=2)
  assert engine_lib.Engine._batches(ruled, contexts) == [[0], [4, 2], [3, 1], [5]]  # pylint: disable=protected-access


def test_model_arguments_as_lm_eval_passes_them():
  args = settings.ModelArgs.from_kwargs({
      'pretrained': '/c', 'backend': 'seq2seq', 'batch_size': '4', 'max_batch_size': 64,
      'device': 'cuda:0', 'max_length': 512, 'temperature': 0.8})
  assert (args.batch_size, args.max_length, args.temperature) == (4, 512, 0.8)
  assert args.record() == {'pretrained': '/c', 'batch_size': 4, 'max_batch_size': 64,
                           'device': 'cuda:0', 'max_length': 512, 'temperature': 0.8}


def test_widths_and_buckets_written_out():
  assert [engine_lib.width(n) for n in (1, 128, 129, 257, 385, 513, 1025, 2049, 4097, 6145,
                                        8192, 12289, 16385)] == [
      128, 128, 256, 384, 512, 768, 1536, 3072, 6144, 8192, 8192, 16384, 24576]
  assert [engine_lib.power_of_two(n, 8) for n in (1, 8, 9, 33)] == [8, 8, 16, 64]
  assert [temperatures.bucket(n) for n in (1, 256, 257, 512, 513, 3000)] == [
      1, 256, 512, 512, 1024, 4096]


def test_hub_ids_and_paths(tmp_path, monkeypatch):
  assert sources.is_hub_id('google/flan-t5-xl') and sources.is_hub_id('t5-small')
  assert not sources.is_hub_id(str(tmp_path)) and not sources.is_hub_id('./ckpt')
  assert not sources.is_hub_id('gs://bucket/ckpt')
  with pytest.raises(FileNotFoundError, match=r"pretrained='/no/such/checkpoint': no such"):
    sources.resolve('/no/such/checkpoint', None)


def test_hub_id_resolved_through_the_cache_offline(tmp_path, monkeypatch):
  """A hub id in huggingface_hub's cache resolves to its snapshot with the hub unreachable; one
  not cached is refused naming it and the cache."""
  snapshot = tmp_path / 'models--org--tiny-t5' / 'snapshots' / ('a' * 40)
  snapshot.mkdir(parents=True)
  (snapshot / 'config.json').write_text('{}')
  (tmp_path / 'models--org--tiny-t5' / 'refs').mkdir()
  (tmp_path / 'models--org--tiny-t5' / 'refs' / 'main').write_text('a' * 40)
  monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path))
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  import huggingface_hub.constants  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(tmp_path))
  monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)
  assert pathlib.Path(sources.resolve('org/tiny-t5', None)) == snapshot
  with pytest.raises(FileNotFoundError, match=r"pretrained='org/other'.*huggingface-cli download"):
    sources.resolve('org/other', None)


def test_scheduled_refuses_a_task_it_has_no_entry_for():
  from t5align import schedule as schedule_lib  # pylint: disable=g-import-not-at-top
  cal = schedule_lib.Calibration(strategy='pmax', length=1024, reference_length=512, tau=0.8)
  sched = schedule_lib.TemperatureSchedule(512, {'pmax': (cal,)}, 'pmax',
                                           tasks={'taskA': {'pmax': (cal,)}})
  policy = temperatures.Scheduled(sched, 's.json')
  np.testing.assert_allclose(policy.taus([np.ones(1024)], ['taskA']), [[0.8]], rtol=1e-6)
  with pytest.raises(ValueError, match="none for lm-eval task 'taskB'.*schedule_task=pooled"):
    policy.taus([np.ones(700)], ['taskB'])
  pooled = temperatures.Scheduled(sched, 's.json', task='pooled')
  # Halfway in log-length between L_tr (tau 1) and 1024 (0.8).
  np.testing.assert_allclose(pooled.taus([np.ones(724)], ['taskB']), [[0.9]], atol=2e-3)


def _tiny_engine(batch_size: int = 1):
  """An engine over a tiny random T5 (one device)."""
  import jax  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  from t5align import partitioning  # pylint: disable=g-import-not-at-top
  config = network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, num_encoder_layers=2,
                            num_decoder_layers=1, head_dim=8, mlp_dim=32, dropout_rate=0.0)
  params = network.init_variables(config, jax.random.PRNGKey(0))['params']
  return engine_lib.Engine(network.Transformer(config), params, partitioning.eval_mesh(),
                           batch_size, eos_id=1, show_progress=False)


@pytest.mark.slow  # It compiles the encoder for the check (10-20 s on a loaded 2-core VM).
def test_engine_refuses_a_program_the_device_cannot_hold(monkeypatch):
  """The first program of a shape is checked against the device's memory before it runs; a
  refusal names the model arguments that lower it."""
  from t5align import memory  # pylint: disable=g-import-not-at-top
  engine = _tiny_engine(batch_size=2)
  monkeypatch.setattr(memory, 'device_memory', lambda device=None: (2**16, 'a 64 KiB test device'))
  with pytest.raises(memory.DoesNotFitError, match=r'Encoding 256-token contexts needs .* GiB per '
                     r'device .*batch_size \(now 2\) lower; or .*num_partitions.*max_length lower'):
    engine.score([np.arange(2, 200, dtype=np.int32) % 60 + 2], np.ones((1, 1), np.float32),
                 [(0, [3, 4])])
  assert not engine.calls  # Nothing ran.


@pytest.mark.slow
def test_engine_encodes_each_context_once_in_few_shapes():
  """4 continuations of each of 3 contexts: 3 encoder calls (batch 1), each context's
  continuations scored in one call, the log-likelihoods those of scoring each pair alone; the
  programs are one per (kind, shape): 2 widths x (encode, score)."""
  from t5align.evaluation import scoring  # pylint: disable=g-import-not-at-top
  from t5align import network  # pylint: disable=g-import-not-at-top
  engine = _tiny_engine()
  config, params = engine.model.config, engine.params
  rng = np.random.default_rng(0)
  contexts = [rng.integers(2, 64, n).astype(np.int32) for n in (100, 200, 120)]
  targets = [(i, list(rng.integers(2, 64, k))) for i in range(3) for k in (1, 2, 3, 9)]
  taus = np.full((3, 1), 0.9, np.float32)
  ll, greedy = engine.score(contexts, taus, targets)
  assert dict(engine.calls) == {'encode': 3, 'score': 3}
  assert sorted(k[:3] for k in engine.programs) == [
      ('encode', 1, 128), ('encode', 1, 256), ('score', 1, 128), ('score', 1, 256)]
  # Each pair as its own row of one batch, its context repeated.
  inputs = np.zeros((12, 256), np.int32)
  continuations = np.zeros((12, 16), np.int32)
  for j, (i, target) in enumerate(targets):
    inputs[j, :len(contexts[i])] = contexts[i]
    continuations[j, :len(target)] = target
  alone = scoring.score_batch(network.Transformer(config), params, inputs, continuations,
                              np.float32(0.9))
  np.testing.assert_allclose(ll, np.asarray(alone), rtol=1e-5)
  assert greedy.dtype == bool and greedy.shape == (12,)


# -------------------------------------------------------------------------------------------
# A tiny T5 and tokenizer written by HuggingFace's code, and local tasks of each output type.


def _sentences(rng: np.random.Generator, count: int) -> str:
  return ' '.join(' '.join(rng.choice(WORDS, 6)) + '.' for _ in range(count))


@pytest.fixture(scope='module')
def toy_model(tmp_path_factory, toy_sentencepiece):
  """A folder holding a tiny gated-GELU T5 (random weights, initializer_factor 1.5 so that greedy
  decoding varies) and its T5 tokenizer, both saved by transformers."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  folder = tmp_path_factory.mktemp('toy_t5')
  rng = np.random.default_rng(0)
  texts = [_sentences(rng, 3) for _ in range(40)] + ['Which word comes next? Answer:']
  (folder / 'spiece.model').write_bytes(toy_sentencepiece(texts))
  (folder / 'tokenizer_config.json').write_text(
      json.dumps({'tokenizer_class': 'T5Tokenizer', 'extra_ids': 0}))
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
  tokenizer.save_pretrained(str(folder))
  config = transformers.T5Config(
      vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=48, num_layers=2,
      num_decoder_layers=2, num_heads=4, feed_forward_proj='gated-gelu', dropout_rate=0.0,
      tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
      initializer_factor=1.5)
  torch.manual_seed(0)
  transformers.T5ForConditionalGeneration(config).save_pretrained(str(folder))
  return folder


def _yaml(fields: dict) -> str:
  return ''.join(f'{k}: {json.dumps(v)}\n' for k, v in fields.items())


@pytest.fixture(scope='module')
def toy_tasks(tmp_path_factory):
  """A task folder for `--include_path`: one task per output type over 8 contexts of 5..300
  tokens (about half longer than MAX_LENGTH), one of them empty for the loglikelihood task."""
  folder = tmp_path_factory.mktemp('toy_tasks')
  docs = []
  for i in range(8):
    rng = np.random.default_rng(100 + i)
    words = list(rng.choice(WORDS, 4, replace=False))
    docs.append({'context': _sentences(rng, 1 + 4 * i), 'choices': words,
                 'label': int(rng.integers(4)), 'next': words[0]})
  docs[0]['ll_context'] = ''
  for d in docs[1:]:
    d['ll_context'] = d['context']
  data = folder / 'toy.jsonl'
  data.write_text(''.join(json.dumps(d) + '\n' for d in docs))
  common = {'dataset_path': 'json', 'dataset_kwargs': {'data_files': {'test': str(data)}},
            'test_split': 'test'}
  question = '{{context}} Which word comes next? Answer:'
  tasks = {
      'toy_mc': {'output_type': 'multiple_choice', 'doc_to_text': question,
                 'doc_to_choice': '{{choices}}', 'doc_to_target': '{{label}}',
                 'metric_list': [{'metric': 'acc'}]},
      'toy_ll': {'output_type': 'loglikelihood', 'doc_to_text': '{{ll_context}}',
                 'doc_to_target': "{{' ' + next}}", 'metric_list': [{'metric': 'acc'}]},
      'toy_gen': {'output_type': 'generate_until', 'doc_to_text': question,
                  'doc_to_target': '{{next}}',
                  'generation_kwargs': {'until': ['e', 'a'], 'max_gen_toks': GEN_TOKS['toy_gen']},
                  'metric_list': [{'metric': 'exact_match'}]},
      'toy_gen_long': {'output_type': 'generate_until', 'doc_to_text': question,
                       'doc_to_target': '{{next}}',
                       'generation_kwargs': {'until': [],
                                             'max_gen_toks': GEN_TOKS['toy_gen_long']},
                       'metric_list': [{'metric': 'exact_match'}]},
      'toy_rolling': {'output_type': 'loglikelihood_rolling', 'doc_to_text': '',
                      'doc_to_target': '{{context}}',
                      'metric_list': [{'metric': 'word_perplexity'}]},
  }
  for name, fields in tasks.items():
    (folder / f'{name}.yaml').write_text(_yaml({'task': name, **common, **fields}))
  return folder


def _samples(out: pathlib.Path) -> dict[str, list[dict]]:
  """{task: its samples by doc_id} from lm-eval's --log_samples output folder."""
  found = {}
  for path in glob.glob(str(out / '*' / 'samples_*.jsonl')):
    task = os.path.basename(path)[len('samples_'):].rsplit('_', 1)[0]
    rows = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]
    found[task] = sorted(rows, key=lambda r: r['doc_id'])
  return found


def _results(out: pathlib.Path) -> dict:
  (path,) = glob.glob(str(out / '*' / 'results_*.json'))
  return json.loads(pathlib.Path(path).read_text())


def _run(module: str, model: str, model_args: str, tasks_dir: pathlib.Path, tasks, out,
         extra=(), env=None) -> subprocess.CompletedProcess:
  cmd = [sys.executable, '-m', module, '--model', model, '--model_args', model_args,
         '--include_path', str(tasks_dir), '--tasks', ','.join(tasks), '--log_samples',
         '--output_path', str(out), *extra]
  proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                        env={**os.environ, 'TOKENIZERS_PARALLELISM': 'false', **(env or {})})
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
  return proc


def _responses(sample: dict) -> list:
  """A sample's responses: [(log-likelihood, is greedy)] or [text] per request."""
  return [r[0] for r in sample['resps']]


def _close(a: str, b: str) -> bool:
  return abs(float(a) - float(b)) <= 1e-4 * max(1.0, abs(float(b)))


@pytest.mark.cli
@pytest.mark.torch
def test_requests_equal_lm_evals_hf_backend(toy_model, toy_tasks, tmp_path):
  """Request by request through lm-eval's own --log_samples output: log-likelihoods within 1e-4
  (relative), equal is_greedy; each generation is HF's greedy one of at most max_gen_toks new
  tokens cut as lm-eval cuts, so equal to the hf backend's where that ended (stop string or
  EOS) within max_gen_toks, else the prefix hf's starts with; contexts past max_length cut alike
  (left)."""
  common = f'pretrained={toy_model},max_length={MAX_LENGTH}'
  extra = ['--batch_size', '2']
  _run('lm_eval', 'hf', f'{common},backend=seq2seq,dtype=float32', toy_tasks, TOY_TASKS,
       tmp_path / 'hf', [*extra, '--device', 'cpu'])
  proc = _run('t5align.lm_eval', 't5align', common, toy_tasks, TOY_TASKS, tmp_path / 'ours',
              extra)
  hf, ours = _samples(tmp_path / 'hf'), _samples(tmp_path / 'ours')
  assert sorted(hf) == sorted(ours) == sorted(TOY_TASKS)
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from lm_eval.models import utils as lm_utils  # pylint: disable=g-import-not-at-top
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(toy_model))
  hf_model = transformers.T5ForConditionalGeneration.from_pretrained(str(toy_model)).eval()

  def within_budget(context: str, task: str) -> str:
    """HF's greedy generation of at most max_gen_toks new tokens, cut as lm-eval cuts it."""
    ids = tokenizer.encode(context)[-MAX_LENGTH:]
    with torch.no_grad():
      out = hf_model.generate(torch.tensor([ids]), max_new_tokens=GEN_TOKS[task],
                              do_sample=False, num_beams=1)
    until = lm_utils.handle_stop_sequences(hf[task][0]['arguments']['gen_args_0']['arg_1'][
        'until'], eos='</s>')
    return lm_utils.postprocess_generated_text(
        tokenizer.decode(out[0], skip_special_tokens=True), until, None)

  seen = {'equal': 0, 'prefix': 0, 'cut': 0}
  for task in TOY_TASKS:
    assert [s['doc_id'] for s in hf[task]] == [s['doc_id'] for s in ours[task]]
    for a, b in zip(hf[task], ours[task]):
      assert a['arguments'] == b['arguments']
      theirs, mine = _responses(a), _responses(b)
      where = f'{task} doc {a["doc_id"]}'
      if task.startswith('toy_gen'):
        (t,), (m,) = theirs, mine
        context = a['arguments']['gen_args_0']['arg_0']
        assert m == within_budget(context, task), where
        assert t.startswith(m), (where, t, m)
        seen['equal' if m == t else 'prefix'] += 1
        seen['cut'] += len(tokenizer.encode(context)) > MAX_LENGTH
      elif task == 'toy_rolling':
        assert len(theirs) == len(mine) == 1 and _close(mine[0], theirs[0]), (where, theirs, mine)
      else:
        assert len(theirs) == len(mine), where
        for (t_ll, t_greedy), (m_ll, m_greedy) in zip(theirs, mine):
          assert _close(m_ll, t_ll), (where, t_ll, m_ll)
          assert m_greedy == t_greedy, where
  assert seen['equal'] and seen['prefix'] and seen['cut'], seen
  info = _results(tmp_path / 'ours')['config']['t5align']
  contexts = info['contexts']
  assert contexts['loglikelihood']['cut'] > 0 and contexts['generate_until']['cut'] > 0
  assert info['programs']['count'] <= 16, info['programs']
  assert 'were longer than max_length=96 and were cut (left)' in proc.stderr


def _simple_evaluate(lm, tasks_dir, tasks):
  from lm_eval import tasks as lm_tasks  # pylint: disable=g-import-not-at-top
  return lm_eval.simple_evaluate(model=lm, tasks=list(tasks), log_samples=True,
                                 task_manager=lm_tasks.TaskManager(include_path=str(tasks_dir)))


def _lls(results) -> dict[tuple[str, int], list[float]]:
  return {(task, s['doc_id']): [float(r[0][0]) for r in s['resps']]
          for task, rows in results['samples'].items() for s in rows}


@pytest.mark.slow
@pytest.mark.torch
def test_temperature_reaches_the_encoder(toy_model, toy_tasks):
  """At temperature=0.8 the log-likelihoods equal hf's backend over a PyTorch T5 whose encoder
  self-attention scores are divided by 0.8 (within 1e-4), and differ from tau = 1's."""
  import hf_reference  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from lm_eval.models import huggingface  # pylint: disable=g-import-not-at-top
  from t5align.lm_eval import T5AlignLM  # pylint: disable=g-import-not-at-top
  tasks = ('toy_mc', 'toy_ll')
  ours = {tau: _lls(_simple_evaluate(
      T5AlignLM(pretrained=str(toy_model), max_length=MAX_LENGTH, temperature=tau), toy_tasks,
      tasks)) for tau in (1.0, 0.8)}
  model = transformers.T5ForConditionalGeneration.from_pretrained(
      str(toy_model), attn_implementation='eager').eval()
  hf = huggingface.HFLM(pretrained=model, tokenizer=transformers.AutoTokenizer.from_pretrained(
      str(toy_model)), backend='seq2seq', max_length=MAX_LENGTH, device='cpu')
  with hf_reference.tempered_encoder(0.8):
    theirs = _lls(_simple_evaluate(hf, toy_tasks, tasks))
  assert sorted(theirs) == sorted(ours[0.8])
  moved = 0
  for key, want in theirs.items():
    np.testing.assert_allclose(ours[0.8][key], want, rtol=1e-4, atol=1e-4, err_msg=str(key))
    moved += sum(abs(a - b) > 1e-3 for a, b in zip(ours[0.8][key], ours[1.0][key]))
  assert moved >= len(theirs), moved  # Most requests move.


# -------------------------------------------------------------------------------------------
# The shipped model: calibration, schedules and the bad input named.


@pytest.fixture(scope='module')
def shipped_tasks(tmp_path_factory):
  """Local tasks of the shipped model's own prompts at 2x and 4x its L_tr (256)."""
  from t5align.lm_eval import local_tasks  # pylint: disable=g-import-not-at-top
  folder = tmp_path_factory.mktemp('shipped_tasks')
  _, _, vocab = assets.load_shipped()
  local_tasks.write_tasks(str(folder), vocab, [512, 1024], 4, tasks=('passkey', 'lines'))
  return folder


@pytest.mark.slow
def test_calibrate_picks_what_t5align_calibrate_picks(shipped_tasks, tmp_path, clean_gin):
  """calibrate=pmax calibrates each (task, length bucket) on its contexts; t5align.calibrate,
  given the same contexts as a JSONL file's tasks, picks the same taus."""
  from t5align import jobs  # pylint: disable=g-import-not-at-top
  from t5align.lm_eval import T5AlignLM  # pylint: disable=g-import-not-at-top
  lm = T5AlignLM(pretrained=SHIPPED_CHECKPOINT, calibrate='pmax', reference_length=256)
  names = ('t5align_local_passkey_512_mc', 't5align_local_lines_1024')
  results = _simple_evaluate(lm, shipped_tasks, names)
  done = lm.policy.done
  assert sorted(done) == sorted([(names[0], 512), (names[1], 1024)])
  rows = []
  for task in names:
    data = shipped_tasks / f'{task.removesuffix("_mc")}.jsonl'
    for line in data.read_text().splitlines():
      text = json.loads(line)['inputs']
      length = len(lm.tok_encode(text))
      rows.append({'inputs': text, 'task': f'{task}/{temperatures.bucket(length)}'})
  jsonl = tmp_path / 'contexts.jsonl'
  jsonl.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  job = jobs.CalibrationJob(
      checkpoint=jobs.Checkpoint(SHIPPED_CHECKPOINT), output_path=str(tmp_path / 's.json'),
      jsonl_file=str(jsonl), vocabulary_path=str(SHIPPED / 'sentencepiece.model'),
      lengths=(512,), strategies=('pmax',), reference_length=256, num_samples=4)
  schedule = job.run()
  for (task, top), c in done.items():
    assert schedule.tasks[f'{task}/{top}']['pmax'][0].tau == c.tau, (task, top)
  described = results['config']['t5align']['temperatures']
  assert [(c['task'], c['bucket'], c['tau']) for c in described['calibrations']] == [
      (task, f'{top // 2 + 1}..{top}', c.tau) for (task, top), c in sorted(done.items())]


def test_bad_input_named(tmp_path, toy_sentencepiece):
  """A checkpoint that is nowhere, a tokenizer whose ids exceed the embedding rows, a schedule
  calibrated on another checkpoint: each refused naming what is at fault."""
  from t5align.lm_eval import T5AlignLM  # pylint: disable=g-import-not-at-top
  from t5align import schedule as schedule_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(FileNotFoundError, match=r"pretrained='/no/such/ckpt': no such checkpoint"):
    T5AlignLM(pretrained='/no/such/ckpt')
  big = tmp_path / 'big.model'
  big.write_bytes(_big_sentencepiece())
  with pytest.raises(ValueError, match=r'tokenizer .*big.model has 1100 pieces but pretrained='
                                       r'.*checkpoint_5000 embeds 1024 ids'):
    T5AlignLM(pretrained=SHIPPED_CHECKPOINT, tokenizer=str(big))
  cal = schedule_lib.Calibration(strategy='pmax', length=1024, reference_length=256, tau=0.8)
  other = schedule_lib.TemperatureSchedule(
      256, {'pmax': (cal,)}, 'pmax',
      provenance={'checkpoint': '/elsewhere/checkpoint_1', 'identity': {
          'checkpoint': {'sha256': 'f' * 64}}})
  path = tmp_path / 'other.json'
  other.save(str(path))
  with pytest.raises(ValueError, match=r'calibrated on checkpoint /elsewhere/checkpoint_1 '
                                       r'\(sha256 ffffffffffff...\), not on pretrained='):
    T5AlignLM(pretrained=SHIPPED_CHECKPOINT, schedule=str(path))
  lm = T5AlignLM(pretrained=SHIPPED_CHECKPOINT, schedule=str(path),
                 schedule_other_checkpoint=True)
  np.testing.assert_allclose(lm.policy.taus([np.ones(1024, np.int32)], ['t']), [[0.8]])


def _big_sentencepiece() -> bytes:
  import io  # pylint: disable=g-import-not-at-top
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  letters = list('abcdefghijklmnopqrstuvwxyz')
  words = [''.join(rng.choice(letters, 5)) for _ in range(3000)]
  buf = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(' '.join(words[i:i + 20]) for i in range(0, 3000, 20)),
      model_writer=buf, vocab_size=1100, model_type='word', pad_id=0, eos_id=1, unk_id=2,
      bos_id=-1, minloglevel=2)
  return buf.getvalue()


def test_model_file_and_truncation_sides(tmp_path):
  """model= gives the architecture from a gin/models file (checked against the checkpoint);
  truncation='middle' keeps the first and last halves, as LongBench's own scripts cut."""
  from t5align import checkpoints  # pylint: disable=g-import-not-at-top
  from t5align.lm_eval import T5AlignLM  # pylint: disable=g-import-not-at-top
  lm = T5AlignLM(pretrained=SHIPPED_CHECKPOINT, model='gin/models/retrieval_small.gin',
                 max_length=10, truncation='middle')
  assert (lm.config.num_heads, lm.config.head_dim, lm.config.attention_impl) == (8, 16, 'auto')
  assert lm._cut(list(range(1, 21)), 'loglikelihood') == [1, 2, 3, 4, 5, 16, 17, 18, 19, 20]
  assert lm.get_model_info()['t5align']['contexts'] == {
      'loglikelihood': {'requests': 1, 'cut': 1}}
  with pytest.raises(checkpoints.CheckpointMismatchError):
    T5AlignLM(pretrained=SHIPPED_CHECKPOINT, model='gin/models/tiny.gin')
  with pytest.raises(ValueError, match=r'model=.*no_such\.gin: gin cannot read it'):
    T5AlignLM(pretrained=SHIPPED_CHECKPOINT, model=str(tmp_path / 'no_such.gin'))


def test_rolling_without_max_length_refused_naming_the_task(shipped_tasks):
  from lm_eval.api.instance import Instance  # pylint: disable=g-import-not-at-top
  from t5align.lm_eval import T5AlignLM  # pylint: disable=g-import-not-at-top
  lm = T5AlignLM(pretrained=SHIPPED_CHECKPOINT)
  request = Instance('loglikelihood_rolling', doc={}, arguments=('some text',), idx=0,
                     metadata=('wikitext', 0, 1))
  with pytest.raises(ValueError, match='task wikitext asks for loglikelihood_rolling.*set '
                                       'max_length'):
    lm.loglikelihood_rolling([request])
  sampled = Instance('generate_until', doc={}, arguments=('x', {'do_sample': True,
                                                                'temperature': 0.7}),
                     idx=0, metadata=('babilong_qa1', 0, 1))
  with pytest.raises(ValueError, match='task babilong_qa1 asks for sampling'):
    lm.generate_until([sampled])


@pytest.mark.multiprocess
@pytest.mark.cli
def test_shipped_model_with_its_schedule_two_processes_equal_one(shipped_tasks, tmp_path,
                                                                 processes, clean_gin):
  """`python -m t5align.lm_eval` on the shipped model with a schedule t5align.calibrate wrote
  for it, on local long-context tasks: two processes (a 4-device mesh over both) give the one
  process's results and samples, with the parameters sharded over 'model' (num_partitions=2),
  and process 0 alone writes them."""
  from t5align import jobs  # pylint: disable=g-import-not-at-top
  texts = [json.loads(line)['inputs']
           for path in sorted(shipped_tasks.glob('*.jsonl')) for line in path.open()]
  corpus = tmp_path / 'prompts.txt'
  corpus.write_text('\n'.join(texts) + '\n')
  schedule = tmp_path / 'schedule.json'
  jobs.CalibrationJob(
      checkpoint=jobs.Checkpoint(SHIPPED_CHECKPOINT), output_path=str(schedule),
      text_file=str(corpus), vocabulary_path=str(SHIPPED / 'sentencepiece.model'),
      lengths=(512, 1024), strategies=('pmax',), reference_length=256, num_samples=4).run()
  tasks = ('t5align_local_passkey_512', 't5align_local_passkey_512_mc',
           't5align_local_lines_1024', 't5align_local_lines_1024_mc')
  model_args = f'pretrained={SHIPPED_CHECKPOINT},schedule={schedule}'
  _run('t5align.lm_eval', 't5align', model_args, shipped_tasks, tasks, tmp_path / 'one',
       ['--batch_size', '2'])
  args = ['t5align.lm_eval', '--model', 't5align', '--model_args', model_args,
          '--include_path', str(shipped_tasks), '--tasks', ','.join(tasks), '--log_samples',
          '--output_path', str(tmp_path / 'two'), '--batch_size', '2']
  args[args.index(model_args)] = f'{model_args},num_partitions=2'
  processes(args, tmp_path / 'logs', devices=2).wait()
  one, two = _results(tmp_path / 'one'), _results(tmp_path / 'two')  # One results file each.
  assert one['results'] == two['results']
  assert len(glob.glob(str(tmp_path / 'two' / '*' / '*'))) == len(tasks) + 1
  info = two['config']['t5align']
  assert (info['process_count'], info['device_count'], info['mesh']) == (
      2, 4, {'data': 2, 'model': 2})
  assert info['temperatures']['schedule'] == str(schedule)
  samples = _samples(tmp_path / 'one'), _samples(tmp_path / 'two')
  for task in tasks:
    for a, b in zip(samples[0][task], samples[1][task]):
      for x, y in zip(_responses(a), _responses(b)):
        if isinstance(x, str):
          assert x == y, (task, a['doc_id'])
        else:
          assert _close(y[0], x[0]) and x[1] == y[1], (task, a['doc_id'], x, y)
  assert {s['filtered_resps'][0] for s in samples[0]['t5align_local_passkey_512']} != {''}


def test_docs_page_lists_every_model_argument():
  """docs/lm_eval.md's table of model arguments names each `ModelArgs` field, and no other."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  text = (REPO_ROOT / 'docs' / 'lm_eval.md').read_text()
  table = text.split('| argument | default | what |')[1].split('\n\n')[0]
  named = {name for row in table.splitlines()[2:]
           for name in re.findall(r'`([a-z_]+)`', row.split('|')[1])}
  assert named == {f.name for f in dataclasses.fields(settings.ModelArgs)}
