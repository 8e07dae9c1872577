"""Parity with HuggingFace transformers' PyTorch T5 (CPU, float32) on tiny random models.

Checkpoints are written by transformers itself and loaded through t5align's HF path. The
temperature is checked against HF's eager attention with its encoder self-attention softmax
divided by tau (`hf_reference.tempered_encoder`, independent of t5align's code).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

import hf_reference  # noqa: E402  # pylint: disable=g-import-not-at-top
from t5align import checkpoints  # pylint: disable=g-import-not-at-top
from t5align import decoding
from t5align import network

pytestmark = [pytest.mark.torch, pytest.mark.slow]

VOCAB = 96


def _hf_config(ff: str, tied: bool):
  return transformers.T5Config(
      vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=3,
      num_heads=4, feed_forward_proj=ff, dropout_rate=0.0, tie_word_embeddings=tied,
      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)


def _save_t5_1_0(path):
  """T5 1.0: relu MLP, output logits tied to the embedding (rescaled by d_model**-0.5)."""
  torch.manual_seed(0)
  model = transformers.T5ForConditionalGeneration(_hf_config('relu', tied=True))
  model.save_pretrained(path)


def _save_t5_1_1(path):
  """T5 1.1: gated-gelu, untied lm_head (written by hand: transformers>=5 ties when building)."""
  torch.manual_seed(1)
  model = transformers.T5ForConditionalGeneration(_hf_config('gated-gelu', tied=True))
  state = {k: v.clone().contiguous() for k, v in model.state_dict().items()}
  state['lm_head.weight'] = torch.randn(VOCAB, 32) * 0.5
  for k in ('encoder.embed_tokens.weight', 'decoder.embed_tokens.weight'):
    state.pop(k, None)
  _hf_config('gated-gelu', tied=False).save_pretrained(path)
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
  save_file(state, f'{path}/model.safetensors', metadata={'format': 'pt'})


@pytest.fixture(scope='module', params=['t5_1_0', 't5_1_1'])
def models(request, tmp_path_factory):
  path = str(tmp_path_factory.mktemp(request.param))
  (_save_t5_1_0 if request.param == 't5_1_0' else _save_t5_1_1)(path)
  hf = transformers.T5ForConditionalGeneration.from_pretrained(path, attn_implementation='eager')
  hf.eval()
  if request.param == 't5_1_1':
    assert not torch.equal(hf.lm_head.weight, hf.shared.weight), 'test model must be untied'
  params, config = checkpoints.load_params(path)
  return hf, params, config


def _inputs():
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, VOCAB, size=(2, 300)).astype(np.int32)  # offsets beyond 128
  tokens[0, -1] = 1
  tokens[1, 180:] = 0  # padding
  tokens[1, 179] = 1
  return tokens


def _hf_encode(hf, tokens, tau=1.0):
  """HF encoder; encoder self-attention computes softmax((q.k + bias + mask) / tau)."""
  with hf_reference.tempered_encoder(tau), torch.no_grad():
    out = hf.encoder(input_ids=torch.tensor(tokens, dtype=torch.long),
                     attention_mask=torch.tensor(tokens > 0)).last_hidden_state
  return out.numpy()


def _non_pad(x, tokens):
  return x[tokens > 0]


@pytest.mark.parametrize('tau', [1.0, 0.7])
def test_encoder_matches_hf(models, tau):
  hf, params, config = models
  tokens = _inputs()
  model = network.Transformer(config)
  ours = model.apply({'params': params}, tokens, enable_dropout=False, temperature=tau,
                     method=model.encode)
  # NOTE: HF leaves padded query rows unmasked, t5x makes them uniform: compare non-pad rows.
  np.testing.assert_allclose(_non_pad(np.asarray(ours), tokens),
                             _non_pad(_hf_encode(hf, tokens, tau), tokens), rtol=1e-4, atol=1e-4)


def _assert_logits_match(hf, params, config):
  """Teacher-forced logits of random targets over `_inputs()`: ours equal HF's (1e-4)."""
  tokens = _inputs()
  targets = np.random.default_rng(1).integers(2, VOCAB, size=(2, 7)).astype(np.int32)
  decoder_inputs = np.concatenate([np.zeros((2, 1), np.int32), targets[:, :-1]], axis=1)
  ours = network.Transformer(config).apply(
      {'params': params}, tokens, decoder_inputs, targets, enable_dropout=False)
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(tokens, dtype=torch.long),
                attention_mask=torch.tensor(tokens > 0),
                decoder_input_ids=torch.tensor(decoder_inputs, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_logits_match_hf(models):
  _assert_logits_match(*models)


def test_greedy_matches_hf(models):
  hf, params, config = models
  tokens = _inputs()
  ours = np.asarray(decoding.greedy_decode(network.Transformer(config), params, tokens,
                                           max_decode_length=8))
  with torch.no_grad():
    theirs = hf.generate(input_ids=torch.tensor(tokens, dtype=torch.long),
                         attention_mask=torch.tensor(tokens > 0), do_sample=False, num_beams=1,
                         max_new_tokens=8, min_new_tokens=0,
                         use_cache=False).numpy()[:, 1:]  # drop start token 0
  # HF pads finished rows with pad_token_id 0, as t5align does; align the lengths.
  theirs = np.pad(theirs, ((0, 0), (0, 8 - theirs.shape[1])))
  np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize('activations, tied', [(('gelu', 'linear'), False), (('relu',), True)])
def test_saved_hf_checkpoint_is_read_by_transformers_and_back(tmp_path, activations, tied):
  """`checkpoints.save_hf_checkpoint` writes what transformers reads (its logits equal ours) and
  what `load_params` reads back (every array equal)."""
  import jax  # pylint: disable=g-import-not-at-top
  config = network.T5Config(vocab_size=VOCAB, emb_dim=32, num_heads=4, num_encoder_layers=2,
                            num_decoder_layers=3, head_dim=8, mlp_dim=48,
                            mlp_activations=activations, dropout_rate=0.0,
                            logits_via_embedding=tied)
  params = jax.tree.map(np.asarray, network.init_variables(config, jax.random.PRNGKey(0))['params'])
  checkpoints.save_hf_checkpoint(str(tmp_path), params, config)
  back, read_config = checkpoints.load_params(str(tmp_path))
  assert read_config.logits_via_embedding == tied
  assert read_config.mlp_activations == activations
  want, got = checkpoints.flatten_params(params), checkpoints.flatten_params(back)
  assert want.keys() == got.keys()
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  hf = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
  _assert_logits_match(hf, params, config)
