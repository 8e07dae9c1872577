"""Closed-form temperatures: Propositions 1-2 and the log-length baseline (host float64 numpy).

Inputs are summaries of layer 0's average sorted logit vector (`summarize_logit_vector` of
`stats.layer0_sorted_logits`) and Prop. 1's P_tr (`reference_pmax`).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

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
  length = np.asarray(length, np.float64)
  if np.any(length < 2) or reference_length < 2:
    raise ValueError(f'lengths must be >= 2; got L_ex={length.tolist()}, L_tr={reference_length}.')
  tau = math.log(reference_length) / np.log(length)
  return float(tau) if tau.ndim == 0 else tau


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
