"""A CodeT5-shaped model (T5 1.0 relu, tied embeddings, byte-level BPE with </s> = 2) evaluated on
the code-completion task end to end through t5align.eval, with and without the paper's
'truncation' baseline (Table 6)."""
from __future__ import annotations

import json
import pathlib

import gin
import jax
import numpy as np
import pytest

from t5align import checkpoints
from t5align import decoding
from t5align import eval as t5align_eval
from t5align import network
from t5align.evaluation import tables
from t5align.runtime import batching
from t5align import vocabularies
from model.vocabularies_test import train_bpe  # pylint: disable=g-bad-import-order

# Both tests run a command on the module's model (a tokenizer trained, a checkpoint written, ~4 s):
# they share one xdist worker, so that is done once.
pytestmark = [pytest.mark.cli, pytest.mark.tensorflow, pytest.mark.xdist_group('codet5')]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TRUNCATE = 12  # L_tr of the tiny model (its inputs: 19 to 47 BPE tokens)
SIZES = dict(emb_dim=32, num_heads=2, head_dim=8, num_encoder_layers=2, num_decoder_layers=2,
             mlp_dim=64)


@pytest.fixture(scope='module')
def codet5(tmp_path_factory):
  """(tokenizer folder, checkpoint path, config, params, LCC file) of a random tiny CodeT5."""
  root = tmp_path_factory.mktemp('codet5')
  bpe = train_bpe(root / 'tokenizer')
  vocab = vocabularies.load_vocabulary(bpe['folder'])
  vocab_size = -(-vocab.vocab_size // 8) * 8
  config = network.T5Config(vocab_size=vocab_size, dtype='float32', mlp_activations=('relu',),
                            logits_via_embedding=True, dropout_rate=0.0, **SIZES)
  x = np.ones((1, 4), np.int32)
  params = network.Transformer(config).init(jax.random.PRNGKey(0), x, x, x,
                                            enable_dropout=False)['params']
  ckpt = checkpoints.save_t5x_checkpoint(params, str(root / 'model'), 0)
  records = [{'context': 'def add(a, b):\n    return a + b\n\n' * (k + 1) + 'class Point:\n',
              'gt': '    def __init__(self, x):'} for k in range(3)]
  lcc = root / 'lcc.jsonl'
  lcc.write_text(''.join(json.dumps(r) + '\n' for r in records))
  return bpe['folder'], ckpt, config, params, str(lcc), vocab


def _eval(codet5, out, *extra):
  """One t5align.eval run; gin's config is cleared after it, for the next run of the test."""
  folder, ckpt, _, _, lcc, vocab = codet5
  args = ['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/codet5p_770m.gin',
          f'--gin.NUM_EMBEDDINGS={-(-vocab.vocab_size // 8) * 8}',
          "--gin.ACTIVATION_DTYPE='float32'",
          *[f'--gin_bindings=network.T5Config.{k} = {v}' for k, v in SIZES.items()],
          f"--gin_bindings=seqio_tasks.vocabulary_path.path = '{folder}'",
          f"--gin_bindings=seqio_tasks.options.lcc_path = '{lcc}'",
          f'--gin.CHECKPOINT_PATH={ckpt}', f'--gin.EVAL_OUTPUT_DIR={out}',
          '--gin.MIXTURE_OR_TASK_NAME=t5align_code_completion_lcc', '--gin.BATCH_SIZE=3',
          '--gin.MAX_DECODE_LENGTH=4', '--gin.MODEL_NAME=tiny-codet5', *extra]
  try:
    return t5align_eval.main(args)
  finally:
    gin.clear_config()


@pytest.mark.usefixtures('clean_gin')
def test_codet5_code_completion_and_truncation_row(codet5, tmp_path, monkeypatch):
  _, _, config, params, _, vocab = codet5
  monkeypatch.chdir(REPO_ROOT)
  full = _eval(codet5, tmp_path / 'tau1')['t5align_code_completion_lcc']
  cut = _eval(codet5, tmp_path / 'trunc', f'--gin.TRUNCATE_INPUTS={TRUNCATE}')[
      't5align_code_completion_lcc']
  assert full['label'] == 'tau = 1' and cut['label'] == 'w/ truncation'
  assert full['num_examples'] == cut['num_examples'] == 3
  # The truncated run decoded each input's last TRUNCATE tokens (EOS = </s> = 2 last): the same
  # greedy decode run here directly on the BPE tokens gives its predictions.
  task_dir = tmp_path / 'trunc' / 't5align_code_completion_lcc'
  run = json.loads((task_dir / 'run.json').read_text())
  assert run['settings']['truncate_inputs'] == TRUNCATE
  records = [json.loads(l) for l in (task_dir / 'predictions.jsonl').read_text().splitlines()]
  lcc = [json.loads(l) for l in pathlib.Path(codet5[4]).read_text().splitlines()]
  model = network.Transformer(config)
  for r in records:
    ids = vocab.encode(lcc[r['index']]['context']) + [vocab.eos_id]
    assert vocab.eos_id == 2 and r['input_length'] == len(ids) > TRUNCATE
    x = np.asarray(ids[-TRUNCATE:], np.int32)[None]
    out = np.asarray(decoding.greedy_decode(model, params, x, max_decode_length=4, eos_id=2))[0]
    assert r['prediction'] == vocab.decode(batching.strip_eos(out, 2))
  # Table 6 gets its truncation row, last, after tau = 1.
  text = tables.render(tables.load_results([tmp_path]))
  lines = [l for l in text.splitlines() if l.startswith('| tiny-codet5') or
           l.startswith('| w/ truncation')]
  assert lines and lines[0].startswith('| tiny-codet5 tau = 1') and lines[1].startswith(
      '| w/ truncation'), text


@pytest.mark.usefixtures('clean_gin')
def test_codet5_calibration_uses_the_bpe_tokenizer(codet5, tmp_path, monkeypatch):
  from t5align import calibrate  # pylint: disable=g-import-not-at-top
  from t5align import schedule  # pylint: disable=g-import-not-at-top
  folder, ckpt, _, _, lcc, vocab = codet5
  monkeypatch.chdir(REPO_ROOT)
  jsonl = tmp_path / 'code.jsonl'
  jsonl.write_text(''.join(json.dumps({'inputs': json.loads(l)['context'], 'task': 'lcc'}) + '\n'
                           for l in pathlib.Path(lcc).read_text().splitlines()))
  out = tmp_path / 'schedule.json'
  calibrate.main(['--gin_file=gin/calibrate.gin', '--gin_file=gin/models/codet5p_770m.gin',
                  f'--gin.NUM_EMBEDDINGS={-(-vocab.vocab_size // 8) * 8}',
                  "--gin.ACTIVATION_DTYPE='float32'",
                  *[f'--gin_bindings=network.T5Config.{k} = {v}' for k, v in SIZES.items()],
                  '--gin_bindings=jobs.CalibrationJob.config = @network.T5Config()',
                  f'--gin.CHECKPOINT_PATH={ckpt}', f'--gin.JSONL_FILE={jsonl}',
                  f'--gin.VOCABULARY_PATH={folder}', f'--gin.OUTPUT_PATH={out}',
                  '--gin.LENGTHS=(24,)', f'--gin.REFERENCE_LENGTH={TRUNCATE}',
                  '--gin.NUM_SAMPLES=3', "--gin.STRATEGIES=('pmax',)"])
  loaded = schedule.load_schedule(str(out))
  assert loaded.provenance['eos_id'] == 2 and loaded.reference_length == TRUNCATE
  cal = loaded.tasks['lcc']['pmax'][0]
  lengths = [len(vocab.encode(json.loads(l)['inputs'])) + 1
             for l in jsonl.read_text().splitlines()]
  assert cal.length == max(lengths) and cal.tau in cal.details['grid']
