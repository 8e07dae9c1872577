"""Closed-form temperatures: Propositions 1-2, and the data-free formulas (host float64 numpy).

Propositions 1-2 take summaries of layer 0's average sorted logit vector (`summarize_logit_vector`
of `stats.layer0_sorted_logits`) and Prop. 1's P_tr (`reference_pmax`). The data-free formulas
(`FORMULAS`: the paper's log-length baseline and the training-free temperatures of other work:
InfoScale, Llama 4's attention temperature tuning, YaRN's attention scaling) take the lengths and
the attention's shape only.

Convention: t5align divides the encoder's attention logits by tau. A source that multiplies the
logits by lambda (or the queries and keys by m, so the logits by m^2) is tau = 1/lambda (1/m^2).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np

if TYPE_CHECKING:
  from t5align.calibration.stats import AttentionStats


class LogitSummary(NamedTuple):
  """Summary of an average sorted logit vector (Assumption 1: its entries ~ N(0, sigma^2))."""

  sigma: float  # std of the entries
  vector_pmax: float  # max probability of softmax(vector); NOT Prop. 1's P_tr (`reference_pmax`)
  lmax: float  # largest entry minus the mean (paper Table 7's l_max)
  length: int


def reference_pmax(reference_stats: AttentionStats) -> float:
  """Proposition 1's P_tr: layer 0's mean row P_max at L_tr, tau = 1.

  Proposition 1 (paper Sec. 6.2) aligns P_max^tr = P_max^ex; in the paper P_max^tr is the
  statistic of Sec. 4 (the mean over logit vectors of each vector's max probability), and for the
  propositions "we evaluate P_max^tr and sigma_tr at the training length ... considering only the
  0-th layer" (App. A.4): so the mean over layer 0's heads x non-pad query rows, as Algorithm 1
  measures it, not the max probability of softmax(average sorted logit vector)
  (`LogitSummary.vector_pmax`, which the paper never uses as P_tr).

  Args:
    reference_stats: `encoder_attention_stats` of the L_tr inputs whose first temperature is 1.
  """
  return float(reference_stats.layer_pmax[0, 0])


def clamp_tau(tau: float) -> tuple[float, str]:
  """Clamps a closed-form tau to (0, 1]: (tau, '') or (1.0, a note saying it was clamped).

  Alignment sharpens (tau < 1); a closed form above 1 (e.g. Prop. 1's closest approach when the
  quadratic has no real root) would flatten attention further, so it is clamped to 1 and marked.
  A tau <= 0 or non-finite has no meaning and raises ValueError.
  """
  if not np.isfinite(tau) or tau <= 0:
    raise ValueError(f'tau={tau} is not in (0, 1].')
  if tau > 1.0:
    return 1.0, f'closed form gave tau={tau:.4g} > 1; clamped to 1'
  return float(tau), ''


def log_length_tau(length: Any, reference_length: int) -> np.ndarray | float:
  """Length-only baseline tau = log L_tr / log L_ex (Yao et al. 2021; Su 2021)."""
  reference_length = _reference(reference_length, 'log-length')
  length = np.asarray(length, np.float64)
  if np.any(~np.isfinite(length)) or np.any(length < 2):
    raise ValueError(f'lengths must be >= 2; got L_ex={length.tolist()}, L_tr={reference_length}.')
  tau = math.log(reference_length) / np.log(length)
  return float(tau) if tau.ndim == 0 else tau


def _reference(reference_length: Any, name: str) -> int:
  """L_tr as an int >= 2 (a token count: no NaN, inf, float or text); ValueError naming `name`."""
  if isinstance(reference_length, (bool, np.bool_)) or not isinstance(
      reference_length, (int, np.integer)) or reference_length < 2:
    raise ValueError(f'{name}: reference_length (L_tr)={reference_length!r}; expected an integer '
                     '>= 2 (a token count).')
  return int(reference_length)


def _lengths(length: Any, reference_length: int, name: str) -> np.ndarray:
  """float64 L_ex (any shape), after checking L_ex >= 1 (finite) and L_tr (`_reference`)."""
  reference_length = _reference(reference_length, name)
  n = np.asarray(length, np.float64)
  if np.any(~np.isfinite(n)) or np.any(n < 1):
    raise ValueError(f'{name}: lengths must be >= 1 and L_tr >= 2; got L_ex={n.tolist()}, '
                     f'L_tr={reference_length}.')
  return n


def _finite_number(value: Any) -> bool:
  """A finite real number (not a bool or text)."""
  return (isinstance(value, (int, float, np.integer, np.floating))
          and not isinstance(value, (bool, np.bool_)) and bool(np.isfinite(value)))


def _scalar(tau: np.ndarray) -> np.ndarray | float:
  return float(tau) if tau.ndim == 0 else tau


def infoscale_tau(length: Any, reference_length: int, dim: int) -> np.ndarray | float:
  """InfoScale (Li et al., arXiv 2501.08570) as a temperature: tau = min(1, 1 / lambda).

  The authors' code (HT-NEKO/Information-Entropy-Invariance) multiplies the scaled logits by
  lambda(n) = sqrt((1 - n^(-2/d)) / (1 - N^(-2/d))), n the unmasked keys, N the training length
  (`train_len_ori`; 512 for T5's encoder), and in its T5 port clamps lambda >= 1
  (`torch.clamp(..., min=1)`). Dividing by tau = 1/lambda is the same, so
  tau = sqrt((1 - N^(-2/d)) / (1 - n^(-2/d))), 1 for n <= N. The paper's text gives no formula
  (YARDSTICKS.md section 8); this is the code's.

  `dim` is where the sources differ (the `infoscale_head` and `infoscale_model` strategies): the
  GAU code takes the query's last axis (`head_dim = q.shape[2]`, its one head's key size: d_h),
  the T5 port (tasks/LongBench/t5-small/overlap_attention.py) heads x d_kv
  (`query_states.shape[1] * query_states.shape[3]`; an earlier version of that file took
  `query_states.shape[3]`, d_kv). For large d, tau ~ sqrt(log_{L_ex} L_tr).

  Args:
    length: L_ex, the unmasked keys n (any shape; one tau each).
    reference_length: L_tr = N.
    dim: d, a positive integer.
  """
  if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
    raise ValueError(f'InfoScale: dim={dim!r}; expected a positive integer (d_h, or heads x d_h).')
  n = _lengths(length, reference_length, 'InfoScale')
  # 1 - x^(-2/d) as -expm1(-(2/d) ln x): exact where d is large and 1 - x^(-2/d) is small.
  one_minus = lambda x: -np.expm1(-2.0 / dim * np.log(x))
  with np.errstate(divide='ignore'):  # n = 1: lambda = 0, clamped to 1 like every n <= N.
    return _scalar(np.minimum(1.0, np.sqrt(one_minus(float(reference_length)) / one_minus(n))))


def llama4_length_tau(length: Any, reference_length: int, *, attn_scale: float = 0.1,
                      floor_scale: int | None = None) -> np.ndarray | float:
  """Llama 4's attention temperature tuning, adapted to an encoder: tau = 1 / lambda.

  Llama 4 (huggingface/transformers models/llama4/modeling_llama4.py; meta-llama/llama-models
  models/llama4/model.py) multiplies the queries of its layers without RoPE by
  lambda(pos) = 1 + attn_scale * ln(floor((pos + 1) / floor_scale) + 1) at query position pos,
  so the logits by lambda; its config's defaults are attn_scale = 0.1, floor_scale = 8192
  (configuration_llama4.py). The causal per-position form has no encoder counterpart; the
  adaptation (YARDSTICKS.md section 8, not the sources') takes n = L_ex for pos + 1 and the floor
  at L_tr: lambda(n) = 1 + 0.1 ln(floor(n / L_tr) + 1), tau = 1 / lambda. It steps: tau = 1 for
  L_ex < L_tr, 1 / (1 + 0.1 ln 2) = 0.935 at L_ex = L_tr itself (the source's step at
  pos + 1 = floor_scale), then down at each multiple of L_tr.

  Args:
    length: L_ex (any shape; one tau each).
    reference_length: L_tr.
    attn_scale: the source's `attn_scale`.
    floor_scale: the source's `floor_scale`; None: L_tr (the adaptation); 8192: Llama 4's own.
  """
  n = _lengths(length, reference_length, 'Llama 4 length')
  floor_scale = reference_length if floor_scale is None else floor_scale
  if isinstance(floor_scale, bool) or not isinstance(floor_scale, (int, np.integer)) or (
      floor_scale < 1):
    raise ValueError(f'Llama 4 length: floor_scale={floor_scale!r}; expected a positive integer.')
  if not _finite_number(attn_scale) or attn_scale < 0:
    raise ValueError(f'Llama 4 length: attn_scale={attn_scale!r}; expected a number >= 0.')
  return _scalar(1.0 / (1.0 + attn_scale * np.log(np.floor(n / floor_scale) + 1.0)))


def yarn_mscale_tau(length: Any, reference_length: int, *,
                    coefficient: float = 0.1) -> np.ndarray | float:
  """YaRN's attention scaling (Peng et al., arXiv 2309.00071) with s = L_ex / L_tr.

  YaRN computes softmax(q^T k / (t sqrt(|D|))) with sqrt(1/t) = 0.1 ln(s) + 1, s its context
  extension factor; its code (jquesnelle/yarn scaled_rope/LlamaYaRNScaledRotaryEmbedding.py,
  `get_mscale`: 0.1 ln(scale) + 1, and 1 for scale <= 1) multiplies the cached cos and sin, which
  rotate both q and k, by that mscale, so the logits by mscale^2 = 1/t. YaRN's t divides the
  logits as tau does: tau = t = 1 / (0.1 ln s + 1)^2 (not 1 / mscale, which would apply the
  factor once). Only this temperature carries over to T5 (YaRN's other part interpolates RoPE
  frequencies, which T5's bucketed relative bias lacks); s = L_ex / L_tr is the paper's dynamic
  scaling, s = max(1, l' / L) for a sequence of l' tokens and training length L.

  Args:
    length: L_ex (any shape; one tau each).
    reference_length: L_tr.
    coefficient: the 0.1 of 0.1 ln s + 1 (`0.1 * mscale` in transformers' `get_mscale`).
  """
  if not _finite_number(coefficient) or coefficient < 0:
    raise ValueError(f'YaRN mscale: coefficient={coefficient!r}; expected a number >= 0.')
  s = _lengths(length, reference_length, 'YaRN mscale') / reference_length
  mscale = np.where(s > 1, coefficient * np.log(np.maximum(s, 1.0)) + 1.0, 1.0)
  return _scalar(1.0 / np.square(mscale))


# The data-free strategies: tau from L_ex, L_tr, heads and d_h alone, with the details each
# records (`formula_tau`). Parameters other than these are the functions' source defaults.
FORMULAS: dict[str, Callable[[int, int, int, int], tuple[Any, dict[str, Any]]]] = {
    'log_length': lambda L, L_tr, heads, d_h: (log_length_tau(L, L_tr), {}),
    'infoscale_head': lambda L, L_tr, heads, d_h: (infoscale_tau(L, L_tr, d_h), {'dim': d_h}),
    'infoscale_model': lambda L, L_tr, heads, d_h: (infoscale_tau(L, L_tr, heads * d_h),
                                                    {'dim': heads * d_h}),
    'llama4_length': lambda L, L_tr, heads, d_h: (llama4_length_tau(L, L_tr), {}),
    'yarn_mscale': lambda L, L_tr, heads, d_h: (yarn_mscale_tau(L, L_tr), {}),
}


def formula_tau(strategy: str, length: int, reference_length: int, *, num_heads: int,
                head_dim: int) -> tuple[float, dict[str, Any]]:
  """(tau, details) of a data-free strategy (`FORMULAS`) for one L_ex, from the model's encoder
  attention shape (`num_heads`, `head_dim`: `network.T5Config`'s)."""
  if strategy not in FORMULAS:
    raise ValueError(f'strategy={strategy!r} is not a data-free formula; expected one of '
                     f'{tuple(FORMULAS)}.')
  tau, details = FORMULAS[strategy](length, reference_length, int(num_heads), int(head_dim))
  return float(tau), details


def prop1_tau(reference_length, length, sigma_tr, sigma_ex, pmax_tr, closest: bool = False):
  """Proposition 1 (P_max): the larger root of A tau^2 - B tau + C = 0.

  A = log L_ex + log P_tr, B = log L_tr + log P_tr + sigma_tr^2 / 2, C = sigma_ex^2 / 2, with
  P_tr = `pmax_tr` as `reference_pmax` defines it. `calibrate` clamps the result to (0, 1].
  Where no real root exists the model's P_ex(tau) never reaches P_tr: the result is NaN, or with
  `closest` the tau that brings P_ex nearest to it (its maximum, tau = 2C / B). Broadcasts.
  """
  a = np.log(np.asarray(length, np.float64)) + np.log(pmax_tr)
  b = math.log(reference_length) + np.log(pmax_tr) + np.square(sigma_tr) / 2
  c = np.square(np.asarray(sigma_ex, np.float64)) / 2
  disc = b * b - 4 * a * c
  with np.errstate(invalid='ignore', divide='ignore'):
    tau = np.where((disc >= 0) & (a > 0), (b + np.sqrt(np.maximum(disc, 0))) / (2 * a), np.nan)
    if closest:
      tau = np.where(np.isnan(tau) & (b > 0), 2 * c / b, tau)
  return float(tau) if tau.ndim == 0 else tau


def prop2_tau(reference_length, length, sigma_tr, sigma_ex):
  """Proposition 2 (entropy): tau = sigma_ex / sqrt(sigma_tr^2 + 2 log(L_ex / L_tr))."""
  ratio = np.asarray(length, np.float64) / reference_length
  tau = np.asarray(sigma_ex, np.float64) / np.sqrt(np.square(sigma_tr) + 2 * np.log(ratio))
  return float(tau) if tau.ndim == 0 else tau


def closed_form_tau(strategy: str, reference_length: int, length: int, sigma_tr: float,
                    sigma_ex: float, p_tr: float | None = None) -> tuple[float, str, float]:
  """Prop. 1 ('prop1', needs P_tr) or Prop. 2 ('prop2') tau, clamped to (0, 1].

  Returns:
    (tau in (0, 1], a note that is '' unless the closed form was replaced or clamped, the tau
    before clamping). Prop. 1 without a real root takes its closest approach 2C/B (noted).
    Raises ValueError where no positive tau exists.
  """
  notes = []
  if strategy == 'prop1':
    tau = prop1_tau(reference_length, length, sigma_tr, sigma_ex, p_tr)
    if np.isnan(tau):  # P_ex(tau) never reaches P_tr: take the closest approach, and say so.
      tau = prop1_tau(reference_length, length, sigma_tr, sigma_ex, p_tr, closest=True)
      notes.append('Prop. 1 has no real root; closest approach 2C/B used')
  elif strategy == 'prop2':
    tau = prop2_tau(reference_length, length, sigma_tr, sigma_ex)
  else:
    raise ValueError(f'strategy={strategy!r} has no closed form; expected prop1 or prop2.')
  if not np.isfinite(tau) or tau <= 0:
    raise ValueError(f'{strategy} has no positive solution (tau={tau}, sigma_tr={sigma_tr:.4g}, '
                     f'sigma_ex={sigma_ex:.4g}, P_tr={p_tr}).')
  clamped, note = clamp_tau(float(tau))
  return clamped, '; '.join(notes + ([note] if note else [])), float(tau)


def summarize_logit_vector(vector: Any) -> LogitSummary:
  """sigma, softmax max-probability and centred max of an average sorted logit vector."""
  v = np.asarray(vector, np.float64)
  return LogitSummary(sigma=float(np.std(v)),
                      vector_pmax=float(1.0 / np.sum(np.exp(v - v.max()))),
                      lmax=float(v.max() - v.mean()), length=int(v.size))
