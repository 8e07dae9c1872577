"""The suites' extra models: gin/models/{ul2,flan_ul2,t0pp}.gin and their gin/t5x counterparts.

Expected architectures are written out here from the published HF config.json files (google/ul2,
google/flan-ul2: the same values; bigscience/T0pp), independently of the gin files: the config
fields, every parameter shape of the T5X tree (`network.param_shapes`, i.e. `jax.eval_shape` of
the model init) and the total count, derived by hand and compared with the published sizes. The
HF side is checked against transformers itself: the state dict transformers builds (on the meta
device) from each published config.json, mapped by t5align's HF loader, has exactly the gin
file's tree. UL2's gated-SiLU MLP is checked against a numpy float64 re-derivation and, end to end
on a tiny random model, against HF PyTorch T5. The t5x files' header commands are checked the way
the docs' check-only blocks are (tests/doc_blocks.py).
"""
from __future__ import annotations

import functools
import json
import math
import pathlib
import re

import gin
import jax.numpy as jnp
import numpy as np
import pytest

from t5align import checkpoints
from t5align import layers
from t5align import network

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
T5_VOCAB = 'gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model'

# Published HF config.json values (architecture keys). google/ul2 has no tie_word_embeddings key:
# transformers' default (True) ties lm_head to `shared` and scales the decoder output by
# d_model**-0.5, i.e. T5X's logits_via_embedding. google/flan-ul2's config.json has the same values.
UL2_HF_CONFIG = {
    'd_ff': 16384, 'd_kv': 256, 'd_model': 4096, 'decoder_start_token_id': 0,
    'dense_act_fn': 'silu', 'eos_token_id': 1, 'feed_forward_proj': 'gated-silu',
    'is_encoder_decoder': True, 'is_gated_act': True, 'layer_norm_epsilon': 1e-06,
    'num_decoder_layers': 32, 'num_heads': 16, 'num_layers': 32, 'pad_token_id': 0,
    'relative_attention_max_distance': 128, 'relative_attention_num_buckets': 32,
    'vocab_size': 32128}
T0PP_HF_CONFIG = {
    'd_ff': 10240, 'd_kv': 64, 'd_model': 4096, 'decoder_start_token_id': 0, 'eos_token_id': 1,
    'feed_forward_proj': 'gated-gelu', 'is_encoder_decoder': True, 'layer_norm_epsilon': 1e-06,
    'num_decoder_layers': 24, 'num_heads': 64, 'num_layers': 24, 'pad_token_id': 0,
    'relative_attention_max_distance': 128, 'relative_attention_num_buckets': 32,
    'tie_word_embeddings': False, 'vocab_size': 32128}

# T5Config fields each gin file must give (from the configs above; dtype and attention are the big
# models' run defaults, dropout 0 for evaluation, temperature 1.0 = the released model).
UL2_FIELDS = {
    'vocab_size': 32128, 'emb_dim': 4096, 'num_heads': 16, 'head_dim': 256,
    'num_encoder_layers': 32, 'num_decoder_layers': 32, 'mlp_dim': 16384,
    'mlp_activations': ('silu', 'linear'), 'logits_via_embedding': True,
    'dtype': 'bfloat16', 'attention_impl': 'auto', 'dropout_rate': 0.0,
    'encoder_attention_temperature': 1.0, 'float32_attention_logits': False}
T0PP_FIELDS = {
    **UL2_FIELDS, 'num_heads': 64, 'head_dim': 64, 'num_encoder_layers': 24,
    'num_decoder_layers': 24, 'mlp_dim': 10240, 'mlp_activations': ('gelu', 'linear'),
    'logits_via_embedding': False}

# The T5X parameter tree, written out: top-level shapes, then one encoder and one decoder layer.
UL2_TOP = {
    'token_embedder/embedding': (32128, 4096),
    'encoder/relpos_bias/rel_embedding': (16, 32),
    'encoder/encoder_norm/scale': (4096,),
    'decoder/relpos_bias/rel_embedding': (16, 32),
    'decoder/decoder_norm/scale': (4096,),
    # No decoder/logits_dense: logits via the embedding.
}
UL2_ENCODER_LAYER = {
    'pre_attention_layer_norm/scale': (4096,),
    'attention/query/kernel': (4096, 4096),  # emb x (16 heads x 256)
    'attention/key/kernel': (4096, 4096),
    'attention/value/kernel': (4096, 4096),
    'attention/out/kernel': (4096, 4096),
    'pre_mlp_layer_norm/scale': (4096,),
    'mlp/wi_0/kernel': (4096, 16384),
    'mlp/wi_1/kernel': (4096, 16384),
    'mlp/wo/kernel': (16384, 4096),
}
UL2_DECODER_LAYER = {
    'pre_self_attention_layer_norm/scale': (4096,),
    'self_attention/query/kernel': (4096, 4096),
    'self_attention/key/kernel': (4096, 4096),
    'self_attention/value/kernel': (4096, 4096),
    'self_attention/out/kernel': (4096, 4096),
    'pre_cross_attention_layer_norm/scale': (4096,),
    'encoder_decoder_attention/query/kernel': (4096, 4096),
    'encoder_decoder_attention/key/kernel': (4096, 4096),
    'encoder_decoder_attention/value/kernel': (4096, 4096),
    'encoder_decoder_attention/out/kernel': (4096, 4096),
    'pre_mlp_layer_norm/scale': (4096,),
    'mlp/wi_0/kernel': (4096, 16384),
    'mlp/wi_1/kernel': (4096, 16384),
    'mlp/wo/kernel': (16384, 4096),
}
T0PP_TOP = {
    'token_embedder/embedding': (32128, 4096),
    'encoder/relpos_bias/rel_embedding': (64, 32),
    'encoder/encoder_norm/scale': (4096,),
    'decoder/relpos_bias/rel_embedding': (64, 32),
    'decoder/decoder_norm/scale': (4096,),
    'decoder/logits_dense/kernel': (4096, 32128),  # its own lm_head (tie_word_embeddings false)
}
_T0PP_MLP = {'mlp/wi_0/kernel': (4096, 10240), 'mlp/wi_1/kernel': (4096, 10240),
             'mlp/wo/kernel': (10240, 4096)}
T0PP_ENCODER_LAYER = {**UL2_ENCODER_LAYER, **_T0PP_MLP}  # 64 heads x 64 = 4096: same attention.
T0PP_DECODER_LAYER = {**UL2_DECODER_LAYER, **_T0PP_MLP}

# Totals, by hand (E 4096, A = heads x head_dim = 4096, V 32128, F mlp):
#   embedding V*E = 131,596,288; encoder layer 4*E*A + 3*E*F + 2*E; decoder layer
#   8*E*A + 3*E*F + 3*E; relative biases 2 * heads * 32; final norms 2*E; logits_dense E*V when
#   untied.
# UL2 (F 16384, 16 heads, 32 + 32 layers, tied):
#   encoder layer 67,108,864 + 201,326,592 + 8,192 = 268,443,648
#   decoder layer 134,217,728 + 201,326,592 + 12,288 = 335,556,608
#   131,596,288 + 32 * 268,443,648 + 32 * 335,556,608 + 1,024 + 8,192 = 19,459,613,696
#   ("20B": google-research/google-research ul2/README.md; 19.5B on third-party model pages; an
#   untied head would add 131,596,288, 19.59B).
# T0pp (F 10240, 64 heads, 24 + 24 layers, untied): T5 1.1 XXL's
#   2 * 131,596,288 + 24 * 192,946,176 + 24 * 260,059,136 + 4,096 + 8,192 = 11,135,332,352
#   ("11 billion": the bigscience/T0pp model card).
MODELS = {
    'ul2.gin': dict(fields=UL2_FIELDS, top=UL2_TOP, enc=UL2_ENCODER_LAYER, dec=UL2_DECODER_LAYER,
                    layers=32, count=19_459_613_696, published_billions=(20, 10),
                    hf_config=UL2_HF_CONFIG, t5x='ul2.gin',
                    checkpoint='gs://scenic-bucket/ul2/ul220b/checkpoint_2650000'),
    'flan_ul2.gin': dict(fields=UL2_FIELDS, top=UL2_TOP, enc=UL2_ENCODER_LAYER,
                         dec=UL2_DECODER_LAYER, layers=32, count=19_459_613_696,
                         published_billions=(20, 10), hf_config=UL2_HF_CONFIG, t5x='flan_ul2.gin',
                         checkpoint='gs://scenic-bucket/ul2/flan-ul220b-v3/checkpoint_2283000'),
    't0pp.gin': dict(fields=T0PP_FIELDS, top=T0PP_TOP, enc=T0PP_ENCODER_LAYER,
                     dec=T0PP_DECODER_LAYER, layers=24, count=11_135_332_352,
                     published_billions=(11, 1), hf_config=T0PP_HF_CONFIG, t5x='t0pp.gin',
                     checkpoint=None),
}


@pytest.fixture(autouse=True)
def gin_env(monkeypatch, tmp_path, clean_gin):  # pylint: disable=unused-argument
  """Includes resolve through the repository root only (as --gin_search_paths=<root>)."""
  if str(REPO_ROOT) not in gin.config._LOCATION_PREFIXES:  # pylint: disable=protected-access
    gin.add_config_file_search_path(str(REPO_ROOT))
  monkeypatch.chdir(tmp_path)


def build_config(gin_file: str) -> network.T5Config:
  gin.clear_config()
  gin.parse_config_files_and_bindings([f'gin/models/{gin_file}'], [], finalize_config=False)
  return gin.get_configurable(network.Transformer)().config


@functools.lru_cache(maxsize=None)
def actual_tree(config: network.T5Config) -> dict[str, tuple[int, ...]]:
  """`network.param_shapes(config)` (jax.eval_shape) flattened; cached: UL2's two share it."""
  return {k: tuple(v.shape)
          for k, v in checkpoints.flatten_params(network.param_shapes(config)).items()}


def expected_tree(model: dict) -> dict[str, tuple[int, ...]]:
  tree = dict(model['top'])
  for i in range(model['layers']):
    tree.update({f'encoder/layers_{i}/{k}': v for k, v in model['enc'].items()})
    tree.update({f'decoder/layers_{i}/{k}': v for k, v in model['dec'].items()})
  return tree


def header(text: str) -> str:
  """A gin file's leading comment block, '#' and one space stripped."""
  lines = []
  for line in text.splitlines():
    if not line.startswith('#'):
      break
    lines.append(line[2:] if line.startswith('# ') else line[1:])
  return '\n'.join(lines)


@pytest.mark.parametrize('gin_file', sorted(MODELS))
def test_config_fields(gin_file):
  cfg = build_config(gin_file)
  fields = MODELS[gin_file]['fields']
  assert {f: getattr(cfg, f) for f in fields} == fields


def test_flan_ul2_is_ul2_and_t0pp_is_t5_1_1_lm_adapted_xxl():
  assert build_config('flan_ul2.gin') == build_config('ul2.gin')
  assert build_config('t0pp.gin') == build_config('t5_1_1_lm100k/xxl.gin')


@pytest.mark.parametrize('gin_file', sorted(MODELS))
def test_headers_cite_the_published_config_and_checkpoint(gin_file):
  model = MODELS[gin_file]
  text = header((REPO_ROOT / 'gin' / 'models' / gin_file).read_text())
  cited = 'bigscience/T0pp config.json' if gin_file == 't0pp.gin' else 'config.json'
  assert cited in text
  if model['checkpoint']:
    assert re.search(re.escape(model['checkpoint']) + r'\s', text), model['checkpoint']
  ul2 = header((REPO_ROOT / 'gin' / 'models' / 'ul2.gin').read_text())
  # Every architecture value of the published config is named in the UL2 / T0pp header.
  source = ul2 if gin_file != 't0pp.gin' else text
  for key in ('d_model', 'd_kv', 'num_heads', 'num_layers', 'num_decoder_layers', 'd_ff',
              'vocab_size', 'feed_forward_proj'):
    value = model['hf_config'][key]
    assert re.search(rf'{key} "?{re.escape(str(value))}"?(?!\w)', source), (gin_file, key, value)


@pytest.mark.slow
@pytest.mark.parametrize('gin_file', sorted(MODELS))
def test_param_tree_and_count(gin_file):
  """jax.eval_shape of the model init equals the written-out tree; the total the derived one."""
  model = MODELS[gin_file]
  actual = actual_tree(build_config(gin_file))
  expected = expected_tree(model)
  missing = sorted(expected.keys() - actual.keys())
  unexpected = sorted(actual.keys() - expected.keys())
  wrong = {k: (actual[k], expected[k]) for k in expected.keys() & actual.keys()
           if actual[k] != expected[k]}
  assert not (missing or unexpected or wrong), (
      f'missing={missing[:5]} unexpected={unexpected[:5]} wrong (actual, expected)={wrong}')
  count = sum(math.prod(s) for s in actual.values())
  assert count == model['count']
  # The published size, to the precision it is stated with: '20B' (to the nearest 10 billion),
  # '11 billion' (to the nearest billion).
  published, unit = model['published_billions']
  assert round(count / (unit * 1e9)) * unit == published


def test_hf_config_hints_give_the_gin_activations():
  """t5align's HF loader maps the published feed_forward_proj to the gin file's activations."""
  assert checkpoints.hf_config_hints(UL2_HF_CONFIG) == {'mlp_activations': ('silu', 'linear')}
  assert checkpoints.hf_config_hints(T0PP_HF_CONFIG) == {'mlp_activations': ('gelu', 'linear')}
  for proj, act in (('silu', 'silu'), ('swish', 'silu'), ('gated-swish', 'silu')):
    gated = proj.startswith('gated-')
    assert checkpoints.hf_config_hints({'feed_forward_proj': proj}) == {
        'mlp_activations': (act, 'linear') if gated else (act,)}


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize('gin_file', sorted(MODELS))
def test_published_hf_state_dict_maps_onto_the_gin_tree(gin_file):
  """transformers' own T5 built from the published config.json (meta device: shapes only),
  mapped by t5align's HF loader, is exactly the gin file's tree, and the loader's inferred config
  (shapes + config.json hints) is the gin file's."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  hf_config = MODELS[gin_file]['hf_config']
  with torch.device('meta'):
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(**hf_config))
  # Zero-stride arrays: the published shapes without the memory.
  state = {k: np.broadcast_to(np.zeros((), np.float32), tuple(v.shape))
           for k, v in hf.state_dict().items()}
  params = checkpoints.params_from_hf_state_dict(state, hf_config)
  cfg = build_config(gin_file)
  checkpoints.check_params(params, network.param_shapes(cfg), source=f'HF {gin_file}')
  inferred = {**checkpoints.infer_config(params), **checkpoints.hf_config_hints(hf_config)}
  assert {k: getattr(cfg, k) for k in inferred} == inferred


def _mlp_reference(x, wi_0, wi_1, wo):
  """Gated-SiLU MLP in numpy float64: (silu(x wi_0) * (x wi_1)) wo, silu(z) = z / (1 + e^-z)."""
  x, wi_0, wi_1, wo = (np.asarray(a, np.float64) for a in (x, wi_0, wi_1, wo))
  gate = x @ wi_0
  return ((gate / (1.0 + np.exp(-gate))) * (x @ wi_1)) @ wo


def test_gated_silu_mlp_matches_numpy_float64():
  rng = np.random.default_rng(0)
  x = rng.normal(0.0, 3.0, (2, 5, 32)).astype(np.float32)  # [b, l, e]
  params = {'wi_0': {'kernel': rng.normal(0.0, 0.3, (32, 48)).astype(np.float32)},  # [e, f]
            'wi_1': {'kernel': rng.normal(0.0, 0.3, (32, 48)).astype(np.float32)},  # [e, f]
            'wo': {'kernel': rng.normal(0.0, 0.3, (48, 32)).astype(np.float32)}}  # [f, e]
  expected = _mlp_reference(x, params['wi_0']['kernel'], params['wi_1']['kernel'],
                            params['wo']['kernel'])

  def run(activations):
    mlp = layers.MlpBlock(intermediate_dim=48, activations=activations,
                          intermediate_dropout_rate=0.0, dtype=jnp.float32)
    return np.asarray(mlp.apply({'params': params}, x, deterministic=True))

  np.testing.assert_allclose(run(('silu', 'linear')), expected, rtol=1e-5, atol=1e-5)
  # gelu in the gate differs from it by far more: the comparison above can fail.
  assert np.abs(run(('gelu', 'linear')) - expected).max() > 1e-2


def test_t5x_checkpoint_without_decoder_norm_scale_is_refused_by_name(tmp_path):
  """What the gin headers say of the released UL2 T5X checkpoints (reported without the decoder's
  final norm scale): the loader refuses such a checkpoint, naming the parameter."""
  cfg = network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8,
                         num_encoder_layers=1, num_decoder_layers=1, mlp_dim=24,
                         mlp_activations=('silu', 'linear'), logits_via_embedding=True)
  params = {k: np.ones(v.shape, np.float32) for k, v in
            checkpoints.flatten_params(network.param_shapes(cfg)).items()
            if k != 'decoder/decoder_norm/scale'}
  path = checkpoints.save_t5x_checkpoint(checkpoints.unflatten_params(params), str(tmp_path), 1,
                                         optimizer_state=None)
  with pytest.raises(checkpoints.CheckpointMismatchError, match='decoder/decoder_norm/scale'):
    checkpoints.load_params(path, cfg)


# ----------------------------------------------------------------------- HF PyTorch parity (tiny)

HF_VOCAB = 96


def _tiny_ul2_like(path) -> None:
  """A tiny random gated-SiLU T5 saved by transformers, with a config.json written like
  google/ul2's (no tie_word_embeddings key: tied lm_head, output scaled by d_model**-0.5)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  config = {**UL2_HF_CONFIG, 'd_model': 32, 'd_kv': 8, 'd_ff': 48, 'num_heads': 4,
            'num_layers': 2, 'num_decoder_layers': 3, 'vocab_size': HF_VOCAB,
            'dropout_rate': 0.0}
  torch.manual_seed(0)
  model = transformers.T5ForConditionalGeneration(transformers.T5Config(**config))
  with torch.no_grad():  # Larger than the init's scale, so the gate works off its linear part.
    for name, p in model.named_parameters():
      if 'DenseReluDense.wi' in name:
        p.mul_(4.0)
  model.save_pretrained(path)
  with open(f'{path}/config.json', 'w', encoding='utf-8') as f:
    json.dump({**config, 'architectures': ['T5ForConditionalGeneration'], 'model_type': 't5'}, f)


@pytest.mark.torch
@pytest.mark.slow
def test_gated_silu_logits_match_hf_pytorch(tmp_path):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  _tiny_ul2_like(str(tmp_path))
  hf = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path),
                                                               attn_implementation='eager')
  hf.eval()
  assert hf.config.dense_act_fn == 'silu' and hf.config.is_gated_act
  params, config = checkpoints.load_params(str(tmp_path))
  assert config.mlp_activations == ('silu', 'linear') and config.logits_via_embedding
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, HF_VOCAB, size=(2, 300)).astype(np.int32)  # offsets beyond 128
  tokens[0, -1] = 1
  tokens[1, 179], tokens[1, 180:] = 1, 0  # EOS, then padding
  targets = rng.integers(2, HF_VOCAB, size=(2, 7)).astype(np.int32)
  decoder_inputs = np.concatenate([np.zeros((2, 1), np.int32), targets[:, :-1]], axis=1)
  ours = np.asarray(network.Transformer(config).apply(
      {'params': params}, tokens, decoder_inputs, targets, enable_dropout=False))
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(tokens, dtype=torch.long),
                attention_mask=torch.tensor(tokens > 0),
                decoder_input_ids=torch.tensor(decoder_inputs, dtype=torch.long)).logits.numpy()
  assert ours.shape == theirs.shape == (2, 7, HF_VOCAB)
  # float32 on both sides. Measured 2026-11-28 (2-core CPU VM): max |difference| 4.9e-6 with
  # logits up to 3.8 in size; the same weights run with a gelu gate differ by 0.69.
  np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------- the gin/t5x counterparts


@pytest.mark.parametrize('gin_file', sorted(MODELS))
def test_t5x_file_includes_the_model_file_and_t5_vocabulary(gin_file):
  text = (REPO_ROOT / 'gin' / 't5x' / MODELS[gin_file]['t5x']).read_text()
  includes = re.findall(r"^include '([^']+)'", text, re.M)
  assert includes == [f'gin/models/{gin_file}', 't5x/examples/t5/t5_1_1/base.gin',
                      'gin/t5x/eval.gin']
  assert re.findall(r"^VOCABULARY_PATH = '([^']+)'$", text, re.M) == [T5_VOCAB]


@pytest.mark.parametrize('gin_file', sorted(MODELS))
def test_t5x_header_commands_pass_the_docs_checker(gin_file):
  """The commands in a gin/t5x file's header, checked as a docs check-only shell block: the
  t5x.eval flags name existing gin files and macros and parse as gin; python -c code resolves."""
  doc_blocks = pytest.importorskip('doc_blocks')  # Needs sybil (tests/doc_blocks.py).
  text = header((REPO_ROOT / 'gin' / 't5x' / MODELS[gin_file]['t5x']).read_text())
  block = '\n'.join(line[2:] for line in text.splitlines() if line.startswith('  '))
  commands = doc_blocks.check_shell(block, f'gin/t5x/{MODELS[gin_file]["t5x"]}')
  evals = [argv for argv in commands if argv[:3] == ['python', '-m', 't5x.eval']]
  assert len(evals) == 1
  # T0pp's header first writes a T5X checkpoint from the HF copy (`python -c`, checked too).
  assert len(commands) == (2 if gin_file == 't0pp.gin' else 1)
  assert f'--gin_file=gin/t5x/{MODELS[gin_file]["t5x"]}' in evals[0]
  if MODELS[gin_file]['checkpoint']:
    assert f'--gin.CHECKPOINT_PATH="{MODELS[gin_file]["checkpoint"]}"' in evals[0]
