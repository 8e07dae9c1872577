"""Attention alignment: encoder softmax temperatures for long inputs (paper Alg. 1, Props. 1-2).

By level, each module importing only those below it:
  build        runs: a `TemperatureSchedule` over lengths x strategies (`build_schedule`), per
               task (`calibrate_tasks`), calibrate's resumable log (`CalibrationLog`);
  strategies   one calibration by strategy name (`calibrate`, `STRATEGIES`);
  search       Algorithm 1's grid and the continuous / per-layer / per-head searches;
  closed_form  Propositions 1-2, the log-length baseline and the other data-free formulas;
  stats        attention statistics at candidate taus (vmapped), inputs, `Memo`.
Beside them, over `stats`: analysis (the dispersion diagnostics, paper Table 1, Figures 1, 3-5, and
their figures) and samples (calibration samples read from a text file, a JSONL file or SeqIO
tasks).
The record of one calibration (`Calibration`) is the schedule's data (`t5align.schedule`).
The names below are importable from the package as `calibration.NAME` (analysis and samples are
not: import them as `from t5align.calibration import analysis`).
"""

from t5align.calibration.build import build_schedule
from t5align.calibration.build import calibrate_tasks
from t5align.calibration.build import calibration_key
from t5align.calibration.build import CalibrationLog
from t5align.calibration.build import remove_log
from t5align.calibration.build import resumed_calibrations
from t5align.calibration.closed_form import clamp_tau
from t5align.calibration.closed_form import closed_form_tau
from t5align.calibration.closed_form import formula_tau
from t5align.calibration.closed_form import FORMULAS
from t5align.calibration.closed_form import infoscale_tau
from t5align.calibration.closed_form import llama4_length_tau
from t5align.calibration.closed_form import log_length_tau
from t5align.calibration.closed_form import LogitSummary
from t5align.calibration.closed_form import prop1_tau
from t5align.calibration.closed_form import prop2_tau
from t5align.calibration.closed_form import reference_pmax
from t5align.calibration.closed_form import summarize_logit_vector
from t5align.calibration.closed_form import yarn_mscale_tau
from t5align.calibration.search import align_heads
from t5align.calibration.search import align_layers
from t5align.calibration.search import bisect_search
from t5align.calibration.search import bisect_steps
from t5align.calibration.search import grid_search
from t5align.calibration.search import grid_steps
from t5align.calibration.search import PAPER_GRID
from t5align.calibration.search import run_lockstep
from t5align.calibration.search import run_steps
from t5align.calibration.stats import AttentionStats
from t5align.calibration.stats import check_lengths
from t5align.calibration.stats import check_tokens
from t5align.calibration.stats import cut_at_boundary
from t5align.calibration.stats import cut_to_length
from t5align.calibration.stats import encoder_attention_stats
from t5align.calibration.stats import layer0_sorted_logits
from t5align.calibration.stats import length_groups
from t5align.calibration.stats import Memo
from t5align.calibration.strategies import calibrate
from t5align.calibration.strategies import is_strategy
from t5align.calibration.strategies import parse_name
from t5align.calibration.strategies import parse_strategy
from t5align.calibration.strategies import SCOPES
from t5align.calibration.strategies import SearchSettings
from t5align.calibration.strategies import STATISTICS
from t5align.calibration.strategies import STRATEGIES
from t5align.calibration.strategies import T5_EOS_ID
from t5align.schedule import Calibration
from t5align.schedule import Tau

__all__ = [
    'align_heads', 'align_layers', 'AttentionStats', 'bisect_search', 'bisect_steps',
    'build_schedule', 'calibrate', 'calibrate_tasks', 'Calibration', 'calibration_key',
    'CalibrationLog', 'check_lengths', 'check_tokens', 'clamp_tau',
    'closed_form_tau', 'cut_at_boundary', 'cut_to_length', 'encoder_attention_stats', 'grid_search',
    'grid_steps', 'layer0_sorted_logits', 'length_groups', 'log_length_tau', 'LogitSummary', 'Memo',
    'PAPER_GRID', 'is_strategy', 'parse_name', 'parse_strategy', 'prop1_tau', 'prop2_tau',
    'reference_pmax',
    'remove_log', 'resumed_calibrations', 'run_lockstep', 'run_steps', 'SCOPES', 'SearchSettings',
    'STATISTICS',
    'STRATEGIES',
    'summarize_logit_vector', 'T5_EOS_ID', 'Tau',
    'formula_tau', 'FORMULAS', 'infoscale_tau', 'llama4_length_tau', 'yarn_mscale_tau',
]
