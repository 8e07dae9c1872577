"""Tests for gin/models/: every file parses, builds `network.T5Config` and has the T5X tree.

Full sizes are only shape-evaluated (`network.param_shapes`, i.e. `jax.eval_shape`); only
tiny.gin runs. Include paths inside gin/models/ are relative to the repository root, which these
tests add as a gin search path and then parse from another working directory, the same way
`--gin_search_paths=<repo root>` works for the t5x binary.
"""
from __future__ import annotations

import functools
import math
import pathlib
import re
from typing import NamedTuple

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5align import network

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS_DIR = REPO_ROOT / 'gin' / 'models'
T5X_CKPT = 'gs://t5-data/pretrained_models/t5x'
SPM_VOCAB = 'gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model'


class Arch(NamedTuple):
  """Expected architecture, written independently of the gin files (the released checkpoints').
  """

  emb: int
  heads: int
  head_dim: int
  layers: int  # Encoder and decoder alike.
  mlp: int
  gated: bool  # T5 1.1 gated-GELU (wi_0, wi_1) vs T5 1.0 ReLU (wi).
  tied: bool  # Logits via the embedding (no decoder/logits_dense).
  vocab: int = 32128
  dtype: str = 'bfloat16'
  decoder_layers: int | None = None  # None: as many as `layers`.

  @property
  def dec(self) -> int:
    return self.layers if self.decoder_layers is None else self.decoder_layers


def _t5_1_1(emb, heads, layers, mlp, **kw):
  return Arch(emb, heads, 64, layers, mlp, gated=True, tied=False, **kw)


def _t5_1_0(emb, heads, head_dim, layers, mlp, **kw):
  return Arch(emb, heads, head_dim, layers, mlp, gated=False, tied=True, **kw)


T5_1_1 = {
    'small': _t5_1_1(512, 6, 8, 1024),
    'base': _t5_1_1(768, 12, 12, 2048),
    'large': _t5_1_1(1024, 16, 24, 2816),
    'xl': _t5_1_1(2048, 32, 24, 5120),
    'xxl': _t5_1_1(4096, 64, 24, 10240),
}
T5_1_0 = {
    'small': _t5_1_0(512, 8, 64, 6, 2048),
    'base': _t5_1_0(768, 12, 64, 12, 3072),
    'large': _t5_1_0(1024, 16, 64, 24, 4096),
    '3B': _t5_1_0(1024, 32, 128, 24, 16384),
    '11B': _t5_1_0(1024, 128, 128, 24, 65536),
}
FLAN_STEPS = {'small': 1198000, 'base': 1184000, 'large': 1164000, 'xl': 1138000, 'xxl': 1114000}
# t5x docs/models.md lists these T5 1.0 steps (not all 1000000).
T5_1_0_STEPS = {'small': 1000000, 'base': 999900, 'large': 1000700, '3B': 1000000,
                '11B': 1000000}

# file (relative to gin/models) -> (architecture, checkpoint path its header must name or None).
EXPECTED: dict[str, tuple[Arch, str | None]] = {
    'tiny.gin': (Arch(8, 4, 3, 2, 16, gated=True, tied=False, dtype='float32'), None),
    'codet5p_770m.gin': (_t5_1_0(1024, 16, 64, 24, 4096, vocab=32100), None),
    # The retrieval T5 trained by the project (t5align/shipped/retrieval_t5).
    'retrieval_small.gin': (Arch(128, 8, 16, 3, 256, gated=True, tied=False, vocab=1024,
                                 dtype='float32', decoder_layers=2), None),
}
for _s, _a in T5_1_1.items():
  EXPECTED[f't5_1_1/{_s}.gin'] = (_a, f'{T5X_CKPT}/t5_1_1_{_s}/checkpoint_1000000')
  EXPECTED[f'flan_t5/{_s}.gin'] = (_a, f'{T5X_CKPT}/flan_t5_{_s}/checkpoint_{FLAN_STEPS[_s]}')
  EXPECTED[f't5_1_1_lm100k/{_s}.gin'] = (_a, f'{T5X_CKPT}/t5_1_1_lm100k_{_s}/checkpoint_1100000')
for _s, _a in T5_1_0.items():
  EXPECTED[f't5_1_0/{_s}.gin'] = (_a, f'{T5X_CKPT}/t5_{_s}/checkpoint_{T5_1_0_STEPS[_s]}')

# Known totals, derived by hand (V vocab, E emb, A = H*D, F mlp, L layers per stack):
#   embedding V*E; logits_dense E*V when untied; relpos 2*H*32 (one table per stack);
#   encoder layer 4*E*A + (3 if gated else 2)*E*F + 2*E; decoder layer 8*E*A + (3|2)*E*F + 3*E;
#   final norms 2*E.
# Flan-T5-XL (V 32128, E 2048, A 2048, F 5120, L 24, gated, untied):
#   2*65,798,144 + 2,048 + 24*48,238,592 + 24*65,017,856 + 4,096 = 2,849,757,184 (2.85 B).
# Flan-T5-XXL (E 4096, A 4096, F 10240):
#   2*131,596,288 + 4,096 + 24*192,946,176 + 24*260,059,136 + 8,192 = 11,135,332,352 (11.1 B).
# T5 1.0 Base (E 768, A 768, F 3072, L 12, relu, tied):
#   24,674,304 + 768 + 12*7,079,424 + 12*9,439,488 + 1,536 = 222,903,552.
# The others equal the parameter counts transformers reports for the HF copies
# (t5-small 60.5 M, flan-t5-base 247.6 M, t5-11b 11.3 B, ...).
KNOWN_PARAM_COUNTS = {
    'flan_t5/xl.gin': 2_849_757_184,
    'flan_t5/xxl.gin': 11_135_332_352,
    't5_1_0/base.gin': 222_903_552,
    'flan_t5/small.gin': 76_961_152,
    'flan_t5/base.gin': 247_577_856,
    'flan_t5/large.gin': 783_150_080,
    't5_1_0/small.gin': 60_506_624,
    't5_1_0/large.gin': 737_668_096,
    't5_1_0/3B.gin': 2_851_598_336,
    't5_1_0/11B.gin': 11_307_321_344,
}


def expected_tree(a: Arch) -> dict[str, tuple[int, ...]]:
  """The T5X 'params' tree for `a`, as {'encoder/layers_0/mlp/wo/kernel': shape}."""
  joined = a.heads * a.head_dim
  attention = {f'{n}/kernel': (a.emb, joined) for n in ('query', 'key', 'value')}
  attention['out/kernel'] = (joined, a.emb)
  wi = ('wi_0', 'wi_1') if a.gated else ('wi',)
  mlp = {**{f'{n}/kernel': (a.emb, a.mlp) for n in wi}, 'wo/kernel': (a.mlp, a.emb)}
  norm = {'scale': (a.emb,)}

  def block(prefix, parts):
    return {f'{prefix}/{name}/{k}': v for name, sub in parts for k, v in sub.items()}

  tree = {'token_embedder/embedding': (a.vocab, a.emb),
          'encoder/relpos_bias/rel_embedding': (a.heads, 32),
          'encoder/encoder_norm/scale': (a.emb,),
          'decoder/relpos_bias/rel_embedding': (a.heads, 32),
          'decoder/decoder_norm/scale': (a.emb,)}
  for i in range(a.layers):
    tree.update(block(f'encoder/layers_{i}', [
        ('pre_attention_layer_norm', norm), ('attention', attention),
        ('pre_mlp_layer_norm', norm), ('mlp', mlp)]))
  for i in range(a.dec):
    tree.update(block(f'decoder/layers_{i}', [
        ('pre_self_attention_layer_norm', norm), ('self_attention', attention),
        ('pre_cross_attention_layer_norm', norm), ('encoder_decoder_attention', attention),
        ('pre_mlp_layer_norm', norm), ('mlp', mlp)]))
  if not a.tied:
    tree['decoder/logits_dense/kernel'] = (a.emb, a.vocab)
  return tree


def tree_count(tree: dict[str, tuple[int, ...]]) -> int:
  return sum(math.prod(shape) for shape in tree.values())


@functools.lru_cache(maxsize=None)
def actual_tree(config: network.T5Config) -> dict[str, tuple[int, ...]]:
  """`network.param_shapes(config)` flattened; cached since families share configs."""
  flat = jax.tree_util.tree_flatten_with_path(network.param_shapes(config))[0]
  return {'/'.join(k.key for k in path): tuple(leaf.shape) for path, leaf in flat}


@pytest.fixture(autouse=True)
def gin_env(monkeypatch, tmp_path, clean_gin):  # pylint: disable=unused-argument
  """Resolves includes through the repo-root search path only, and leaves gin clean."""
  if str(REPO_ROOT) not in gin.config._LOCATION_PREFIXES:  # pylint: disable=protected-access
    gin.add_config_file_search_path(str(REPO_ROOT))
  monkeypatch.chdir(tmp_path)


def build_config(gin_file: str, bindings: tuple[str, ...] = ()) -> network.T5Config:
  """Parses gin/models/`gin_file` plus `bindings`; returns the Transformer's bound config."""
  gin.clear_config()
  gin.parse_config_files_and_bindings(
      [f'gin/models/{gin_file}'], list(bindings), finalize_config=False)
  return gin.get_configurable(network.Transformer)().config


def test_every_model_file_is_expected():
  found = sorted(str(p.relative_to(MODELS_DIR)) for p in MODELS_DIR.rglob('*.gin'))
  # The suites' UL2 / Flan-UL2 (gated-SiLU) and T0pp: tests/model/suite_models_test.py checks them.
  assert found == sorted([*EXPECTED, 'flan_ul2.gin', 't0pp.gin', 'ul2.gin'])


@pytest.mark.parametrize('gin_file', sorted(EXPECTED))
def test_header_and_imports(gin_file):
  text = (MODELS_DIR / gin_file).read_text()
  imports = re.findall(r'^(?:from|import)\s.*$', text, flags=re.M)
  # Model files configure only our network, so neither t5x nor seqio must be importable.
  assert all(re.match(r'from (__gin__|t5align(\.\w+)*) import', line) for line in imports), imports
  for line in re.findall(r'^include\s.*$', text, flags=re.M):
    assert re.fullmatch(r"include 'gin/models/[\w/]+\.gin'", line), line
  if gin_file in ('t5_1_1/base.gin', 't5_1_0/base.gin'):  # The family files name the vocabulary.
    assert SPM_VOCAB in text
  checkpoint = EXPECTED[gin_file][1]
  if checkpoint is not None:
    header = text.split('\n\n', 1)[0]
    assert re.search(re.escape(checkpoint) + r'\s', header), (gin_file, checkpoint)


@pytest.mark.parametrize('gin_file', sorted(EXPECTED))
def test_config_fields(gin_file):
  arch = EXPECTED[gin_file][0]
  cfg = build_config(gin_file)
  actual = {f: getattr(cfg, f) for f in (
      'vocab_size', 'dtype', 'emb_dim', 'num_heads', 'head_dim', 'num_encoder_layers',
      'num_decoder_layers', 'mlp_dim', 'mlp_activations', 'logits_via_embedding',
      'float32_attention_logits', 'dropout_rate', 'encoder_attention_temperature',
      'attention_impl')}
  assert actual == {
      'vocab_size': arch.vocab, 'dtype': arch.dtype, 'emb_dim': arch.emb,
      'num_heads': arch.heads, 'head_dim': arch.head_dim, 'num_encoder_layers': arch.layers,
      'num_decoder_layers': arch.dec, 'mlp_dim': arch.mlp,
      'mlp_activations': ('gelu', 'linear') if arch.gated else ('relu',),
      'logits_via_embedding': arch.tied, 'float32_attention_logits': False,
      'dropout_rate': 0.0, 'encoder_attention_temperature': 1.0,
      'attention_impl': 'auto' if gin_file in [*BIG_MODELS, *AUTO_MODELS] else 'reference'}


# Files whose defaults are the big-run ones: bfloat16 activations, blockwise attention above 2048.
BIG_MODELS = [f'{family}/{size}.gin' for family in ('t5_1_1', 'flan_t5', 't5_1_1_lm100k')
              for size in ('xl', 'xxl')] + ['t5_1_0/3B.gin', 't5_1_0/11B.gin']
# float32 files with 'auto' attention: the shipped model, run on CPU to 16x its L_tr.
AUTO_MODELS = ['retrieval_small.gin']


def test_shipped_model_config_from_python_equals_its_gin_file():
  # Calibrating the shipped model at 2048+ tokens from Python must not materialize [L, L]
  # attention where the gin path would not: both say 'auto'.
  import dataclasses  # pylint: disable=g-import-not-at-top
  from t5align.shipped import assets  # pylint: disable=g-import-not-at-top
  from_python = assets.load_shipped()[1]
  from_gin = build_config('retrieval_small.gin')
  assert from_python.attention_impl == from_gin.attention_impl == 'auto'
  fields = ('vocab_size', 'dtype', 'emb_dim', 'num_heads', 'head_dim', 'num_encoder_layers',
            'num_decoder_layers', 'mlp_dim', 'mlp_activations', 'logits_via_embedding',
            'blockwise_threshold')
  as_dict = lambda cfg: {f: jnp.dtype(cfg.dtype) if f == 'dtype' else getattr(cfg, f)
                         for f in fields}
  assert as_dict(from_python) == as_dict(from_gin), dataclasses.asdict(from_python)


@pytest.mark.parametrize('gin_file', BIG_MODELS)
def test_big_models_default_to_bfloat16_and_blockwise_above_the_threshold(gin_file):
  cfg = build_config(gin_file)
  assert (cfg.dtype, cfg.attention_impl, cfg.blockwise_threshold) == ('bfloat16', 'auto', 2048)
  assert [network.encoder_attention_impl(cfg, n) for n in (512, 2048, 2049, 32768)] == [
      'reference', 'reference', 'blockwise', 'blockwise']
  cfg = build_config(gin_file, ("ATTENTION_IMPL = 'reference'", "ACTIVATION_DTYPE = 'float32'"))
  assert (cfg.dtype, network.encoder_attention_impl(cfg, 32768)) == ('float32', 'reference')


@pytest.mark.parametrize('gin_file', sorted(EXPECTED))
def test_param_tree_and_count(gin_file):
  arch = EXPECTED[gin_file][0]
  expected = expected_tree(arch)
  actual = actual_tree(build_config(gin_file))
  missing = sorted(set(expected) - set(actual))
  unexpected = sorted(set(actual) - set(expected))
  wrong = {k: (actual[k], expected[k]) for k in expected.keys() & actual.keys()
           if actual[k] != expected[k]}
  assert not (missing or unexpected or wrong), (
      f'missing={missing[:5]} unexpected={unexpected[:5]} wrong (actual, expected)={wrong}')
  assert tree_count(actual) == tree_count(expected)
  if gin_file in KNOWN_PARAM_COUNTS:
    assert tree_count(expected) == KNOWN_PARAM_COUNTS[gin_file]


def test_flan_and_lm100k_share_the_t5_1_1_architecture():
  for size in T5_1_1:
    base = build_config(f't5_1_1/{size}.gin')
    assert build_config(f'flan_t5/{size}.gin') == base
    assert build_config(f't5_1_1_lm100k/{size}.gin') == base


def test_temperature_binding_overrides_the_macro():
  cfg = build_config('flan_t5/xl.gin', ('network.T5Config.encoder_attention_temperature = 0.8',))
  assert cfg.encoder_attention_temperature == 0.8
  # A later macro value does not undo an explicit parameter binding.
  cfg = build_config('flan_t5/xl.gin', ('network.T5Config.encoder_attention_temperature = 0.8',
                                        'ENCODER_TEMPERATURE = 2.0'))
  assert cfg.encoder_attention_temperature == 0.8


@pytest.mark.parametrize('gin_file', ['t5_1_1/base.gin', 'flan_t5/xxl.gin', 't5_1_0/11B.gin',
                                      'codet5p_770m.gin', 'tiny.gin'])
def test_macros_reach_the_config(gin_file):
  cfg = build_config(gin_file, ('ENCODER_TEMPERATURE = 0.7', "ACTIVATION_DTYPE = 'float32'",
                                'DROPOUT_RATE = 0.1'))
  assert (cfg.encoder_attention_temperature, cfg.dtype, cfg.dropout_rate) == (0.7, 'float32', 0.1)
  with pytest.raises(ValueError, match=r"network\.T5Config\.attention_impl = 'no_such_impl' "
                                       r'\(--gin\.ATTENTION_IMPL\): expected one of'):
    build_config(gin_file, ("ATTENTION_IMPL = 'no_such_impl'",))


def test_per_layer_temperature_tuple():
  taus = tuple(0.5 + 0.05 * i for i in range(24))
  cfg = build_config('flan_t5/xl.gin', (f'ENCODER_TEMPERATURE = {taus}',))
  assert cfg.encoder_attention_temperature == taus
  cfg = build_config('flan_t5/xl.gin',
                     (f'network.T5Config.encoder_attention_temperature = {taus}',))
  assert cfg.encoder_attention_temperature == taus
  with pytest.raises(ValueError, match='expected one float, num_encoder_layers=24 values, or'):
    build_config('flan_t5/xl.gin', ('ENCODER_TEMPERATURE = (0.9, 0.9)',))
  with pytest.raises(ValueError, match=r'encoder_attention_temperature = \(1\.0, 0\.0\) '
                                       r'\(--gin\.ENCODER_TEMPERATURE\): expected a temperature, '
                                       r'finite and > 0, in float32 too .* \(0\.0 is not\)\.'):
    build_config('tiny.gin', ('ENCODER_TEMPERATURE = (1.0, 0.0)',))


def test_per_head_temperature_tuple_of_tuples():
  """`[layers][heads]` as a gin tuple of tuples, through the macro and the parameter."""
  taus = tuple(tuple(round(0.5 + 0.01 * (i + j), 2) for j in range(32)) for i in range(24))
  for binding in (f'ENCODER_TEMPERATURE = {taus}',
                  f'network.T5Config.encoder_attention_temperature = {taus}'):
    assert build_config('flan_t5/xl.gin', (binding,)).encoder_attention_temperature == taus
  with pytest.raises(ValueError, match=r'has shape \(24, 31\); expected one float, '
                                       r'num_encoder_layers=24 values, or \[num_encoder_layers=24\]'
                                       r'\[num_heads=32\]'):
    build_config('flan_t5/xl.gin', (f'ENCODER_TEMPERATURE = {tuple(t[:31] for t in taus)}',))
  with pytest.raises(ValueError, match=r'\(--gin\.ENCODER_TEMPERATURE\): expected a temperature, '
                                       r'finite and > 0, in float32 too .*: a number, a tuple'):
    build_config('flan_t5/xl.gin', (f'ENCODER_TEMPERATURE = {taus[:23] + (taus[0][:5],)}',))


def _random_variables(cfg: network.T5Config) -> dict:
  """Random float32 params shaped like `cfg`'s (much faster on CPU than running the init)."""
  rng = np.random.default_rng(0)
  return {'params': jax.tree.map(
      lambda s: jnp.asarray(rng.normal(scale=0.5, size=s.shape), s.dtype),
      network.param_shapes(cfg))}


@functools.lru_cache(maxsize=None)
def _tiny_encoder(cfg: network.T5Config):
  """Jitted `(temperature) -> [1, 8, emb]` encoder output for a fixed padded input."""
  model = network.Transformer(cfg)
  variables = _random_variables(cfg)
  tokens = jnp.array([[5, 9, 13, 2, 7, 1, 0, 0]], jnp.int32)
  return jax.jit(lambda t: model.apply(variables, tokens, enable_dropout=False, temperature=t,
                                       method=model.encode))


def test_tiny_per_layer_temperature_reaches_the_encoder():
  per_layer = _tiny_encoder(build_config('tiny.gin', ('ENCODER_TEMPERATURE = (0.5, 2.0)',)))(None)
  default = _tiny_encoder(build_config('tiny.gin'))
  np.testing.assert_allclose(per_layer, default(jnp.array([0.5, 2.0])), rtol=1e-6, atol=1e-6)
  assert not np.allclose(per_layer, default(jnp.array([1.0, 1.0])), atol=1e-4)


def test_tiny_runs_with_the_released_bfloat16_dtype_string():
  cfg = build_config('tiny.gin', ("ACTIVATION_DTYPE = 'bfloat16'",))
  assert cfg.dtype == 'bfloat16'
  model = network.Transformer(cfg)
  variables = _random_variables(cfg)
  tokens = jnp.array([[5, 9, 13, 1, 0]], jnp.int32)
  logits = jax.jit(lambda v: model.apply(v, tokens, tokens, tokens, enable_dropout=False))(
      variables)
  assert logits.shape == (1, 5, 32128) and logits.dtype == jnp.float32
  assert np.isfinite(np.asarray(logits)).all()
  # Parameters stay float32 whatever the activation dtype.
  assert {s.dtype for s in jax.tree.leaves(network.param_shapes(cfg))} == {np.dtype('float32')}


def test_bias_rule_macros_build_the_encoders_rule():
  """BIAS_RULE / BIAS_SCALE / TRAINING_LENGTH reach `T5Config.encoder_bias_rule`: T5's bias by
  default, the length-derived rule over the model's L_tr (256 for the shipped model, 512 for
  the released ones), a given scale; a bad rule is refused by gin's call naming it."""
  from t5align.attention import reference  # pylint: disable=g-import-not-at-top
  assert build_config('retrieval_small.gin').encoder_bias_rule == reference.BiasRule(
      'none', reference_length=256)
  rule = build_config('retrieval_small.gin', ("BIAS_RULE = 'interpolate'",)).encoder_bias_rule
  assert rule == reference.BiasRule('interpolate', reference_length=256)
  assert rule.at(1024) == reference.OffsetMap(interpolation=0.25)
  rule = build_config('flan_t5/base.gin', ("BIAS_RULE = 'extend'", 'BIAS_SCALE = 2.0')
                      ).encoder_bias_rule
  assert rule.at(700) == reference.OffsetMap(extension=2.0) and rule.reference_length == 512
  with pytest.raises(ValueError, match="BiasRule.kind='stretch'"):
    build_config('retrieval_small.gin', ("BIAS_RULE = 'stretch'",))
