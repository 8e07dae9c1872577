"""t5align as an lm-evaluation-harness model: `T5AlignLM`, registered as 't5align'.

A T5X (legacy or Orbax), HuggingFace or Mesh-TF checkpoint answers lm-eval's three request kinds
with the encoder temperature the model arguments choose (`settings.ModelArgs`), request for
request as lm-eval's own hf backend (`backend=seq2seq`) answers them at tau = 1:

- `loglikelihood`: the context encoded as hf encodes it (EOS appended), the continuation (no
  special tokens) teacher-forced from decoder start 0; its summed log-probability and whether
  greedy decoding would produce it. Continuations that share a context share its encoding.
- `generate_until`: greedy decoding of at most `max_gen_toks` tokens (ended early by EOS), cut at
  the first stop string as lm-eval cuts. (hf's seq2seq path lets the decoder run to
  len(context) + max_gen_toks tokens; t5align reads max_gen_toks as lm-eval means it.)
- `loglikelihood_rolling`: hf's seq2seq windows (`max_length` decoder tokens each, after a
  one-token encoder context), which need `max_length`; without it the request is refused.

`max_length` unset cuts nothing (T5's relative positions have no limit; the memory check
refuses what does not fit); set, a longer context is cut from `truncation`'s side, and the
number of contexts cut goes into lm-eval's results (`get_model_info`) with the temperatures
used. Every process of a multi-process run (`jax.distributed`) runs the same requests over one
mesh and reports itself as lm-eval's only rank, so each returns the whole results;
`python -m t5align.lm_eval` lets process 0 alone write them.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import importlib.metadata
import logging
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lm_eval import utils as lm_eval_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models import utils as lm_models_utils

from t5align.calibration import samples as samples_lib
from t5align import checkpoints
from t5align.evaluation import temperature as temperature_lib
from t5align.jobs import common
from t5align.lm_eval import engine as engine_lib
from t5align.lm_eval import settings
from t5align.lm_eval import sources
from t5align.lm_eval import temperatures
from t5align.lm_eval import tokenizer as tokenizer_lib
from t5align import network
from t5align import partitioning
from t5align import run_identity
from t5align.runtime import multihost
from t5align.runtime import validate

log = logging.getLogger(__name__)

NAME = 't5align'
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's hf default.
# Generation settings a request may carry: the rest (beams, sampling settings) are refused.
GREEDY_KWARGS = ('until', 'max_gen_toks', 'do_sample', 'temperature')


def _model_config(path: str) -> network.T5Config:
  """The `network.T5Config` a gin/models file binds; its includes ('gin/models/...') are found
  from the working directory, the repository root and t5align's gin folder."""
  import gin  # pylint: disable=g-import-not-at-top
  import t5align  # pylint: disable=g-import-not-at-top
  from t5align import gin_cli  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  for folder in (os.getcwd(), gin_cli.REPO_ROOT, t5align.gin_dir()):
    gin.add_config_file_search_path(folder)
  try:
    gin.parse_config_file(path)
    bound = gin.get_bindings(network.T5Config)
  except Exception as e:  # pylint: disable=broad-except  (gin raises many kinds)
    raise ValueError(f'model={path}: gin cannot read it as a gin/models file '
                     f'({type(e).__name__}: {e}).') from e
  if 'vocab_size' not in bound:
    raise ValueError(f'model={path} binds no network.T5Config.vocab_size: give a gin/models '
                     'file (e.g. gin/models/flan_t5/xl.gin).')
  return gin.get_configurable(network.T5Config)()


@register_model(NAME)
class T5AlignLM(TemplateLM):
  """An lm-eval model over a T5 checkpoint with an encoder temperature (see the module).

  Built by lm-eval from `--model_args` (`create_from_arg_string`), or directly:
  `T5AlignLM(pretrained=..., temperature=0.8)`; the arguments are `settings.ModelArgs`'.
  """

  backend = 'seq2seq'  # TemplateLM: a continuation is tokenized apart from its context.

  def __init__(self, **kwargs: Any):
    super().__init__()
    self.args = settings.ModelArgs.from_kwargs(kwargs)
    multihost.initialize()  # Before JAX starts: several processes meet here.
    args = self.args
    run_identity.check_same_processes({'t5align.lm_eval model arguments': args.record()})
    self.path = sources.resolve(args.pretrained, args.revision)
    self.tokenizer_ = tokenizer_lib.load(args.tokenizer, self.path, args.revision)
    self.checkpoint = common.Checkpoint(self.path, params_dtype=args.dtype, flag='pretrained')
    rows = self.checkpoint.embedding_rows()
    validate.vocabulary_fits(self.tokenizer_.size, rows,
                             vocabulary=f'tokenizer {self.tokenizer_.name}',
                             model=f'pretrained={args.pretrained}')
    given = None if args.model is None else _model_config(args.model)
    self.mesh = partitioning.eval_mesh(args.num_partitions)
    params, config = self.checkpoint.load(given, self.mesh)
    self.config = dataclasses.replace(config, dtype=jnp.dtype(args.dtype), dropout_rate=0.0,
                                      attention_impl=args.attention_impl,
                                      encoder_bias_rule=args.encoder_bias_rule())
    self.engine = engine_lib.Engine(network.Transformer(self.config), params, self.mesh,
                                    args.batch_size, self.tokenizer_.eos_id)
    self.policy = self._policy(params)
    # {request kind: [requests, contexts cut]}, for the results.
    self.cut = collections.defaultdict(lambda: [0, 0])
    # {(task, length bucket): [requests, smallest tau, largest tau]} (a request's tau: the mean
    # over its layers and heads), for the results.
    self.applied: dict[tuple[str, int], list[Any]] = {}

  # -------------------------------------------------------------------------------------------
  # Set-up.

  def _policy(self, params: Any) -> temperatures.Policy:
    args, config = self.args, self.config
    name = f'pretrained={args.pretrained}'
    if args.calibrate is not None:
      tok = self.tokenizer_
      boundaries = functools.cache(lambda: samples_lib.boundary_ids(tok.decode, tok.size))
      return temperatures.Calibrated(
          args.calibrate, args.reference_length, args.calibrate_samples,
          temperatures.calibrator(params, config, self.mesh, args.calibrate,
                                  args.reference_length, tok.eos_id),
          boundaries, tok.eos_id)
    if args.schedule is not None:
      temp = temperature_lib.make_temperature(config, schedule_path=args.schedule,
                                              schedule_strategy=args.schedule_strategy,
                                              model=name)
      self._check_schedule(temp.schedule)
      ruled = {c.bias_rule for cals in [temp.schedule.calibrations, *temp.schedule.tasks.values()]
               for c in cals[temp.schedule.strategy]} - {'none'}
      if ruled:
        raise ValueError(
            f'schedule {args.schedule}: strategy {temp.schedule.strategy!r} was calibrated with '
            f'the bias rule {sorted(ruled)}, which the lm-eval model does not apply per request '
            '(one rule for batches of mixed widths): give it as bias_rule= with a schedule '
            'strategy without one.')
      return temperatures.Scheduled(temp.schedule, args.schedule, args.schedule_task)
    tau = config.encoder_attention_temperature if args.temperature is None else (
        validate.temperature_setting(args.temperature, 'temperature',
                                     config.num_encoder_layers, name, config.num_heads))
    return temperatures.Constant(tau)

  def _check_schedule(self, schedule: Any) -> None:
    """Refuses a schedule calibrated on another checkpoint (unless schedule_other_checkpoint),
    and a schedule_task it has no entry for."""
    args = self.args
    task = args.schedule_task
    if task is not None and task != temperatures.POOLED and task not in schedule.tasks:
      raise ValueError(f'schedule_task={task!r}: schedule {args.schedule} has entries for '
                       f'{sorted(schedule.tasks) or "no task"} (or {temperatures.POOLED}).')
    recorded = (schedule.provenance.get('identity') or {}).get('checkpoint') or {}
    if not recorded.get('sha256'):
      log.warning('schedule %s records no checkpoint it was calibrated on; applying it to %s as '
                  'given.', args.schedule, args.pretrained)
      return
    ours = self.checkpoint.fingerprint()
    if recorded['sha256'] != ours['sha256'] and not args.schedule_other_checkpoint:
      raise ValueError(
          f"schedule {args.schedule} was calibrated on checkpoint "
          f"{schedule.provenance.get('checkpoint')} (sha256 {recorded['sha256'][:12]}...), not on "
          f'pretrained={args.pretrained} (sha256 {ours["sha256"][:12]}...): its taus are for '
          "another model's logits. Calibrate this checkpoint (python -m t5align.calibrate), or "
          'pass schedule_other_checkpoint=true to apply it anyway.')

  # -------------------------------------------------------------------------------------------
  # lm-eval's tokenization interface.

  @property
  def eot_token_id(self) -> int:
    return self.tokenizer_.eos_id

  @property
  def prefix_token_id(self) -> int:
    """What an empty context is encoded as: BOS, else (T5) EOS, as hf's backend does."""
    bos = self.tokenizer_.bos_id
    return self.eot_token_id if bos is None else bos

  @functools.cached_property
  def _prefix_text(self) -> str:
    """The prefix token's text, which `tok_encode` looks for at the start of each string."""
    return self.tokenizer_.decode([self.prefix_token_id], skip_special_tokens=False)

  @property
  def max_length(self) -> int | None:
    return self.args.max_length

  @property
  def max_gen_toks(self) -> int:
    return DEFAULT_MAX_GEN_TOKS

  def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                 left_truncate_len: int | None = None, **kwargs: Any) -> list[int]:
    """As hf's backend: special tokens (EOS) added unless the string already starts with the
    prefix token's text or `add_special_tokens` says otherwise."""
    del kwargs
    if add_special_tokens is None:
      prefix = self._prefix_text
      add_special_tokens = not (prefix and string.startswith(prefix))
    ids = self.tokenizer_.encode(string, add_special_tokens=add_special_tokens)
    return ids[-left_truncate_len:] if left_truncate_len else ids

  def tok_decode(self, tokens: Any, skip_special_tokens: bool = True) -> str:
    ids = [tokens] if isinstance(tokens, (int, np.integer)) else list(tokens)
    return self.tokenizer_.decode(ids, skip_special_tokens=skip_special_tokens)

  def _cut(self, tokens: Sequence[int], kind: str) -> list[int]:
    """`tokens` cut to max_length from the truncation side (counted per request kind)."""
    tokens = list(tokens)
    self.cut[kind][0] += 1
    if self.args.max_length is None or len(tokens) <= self.args.max_length:
      return tokens
    self.cut[kind][1] += 1
    return lm_models_utils.truncate_tokens(tokens, self.args.max_length, self.args.truncation)

  def _taus(self, contexts: Sequence[np.ndarray], tasks: Sequence[str]) -> np.ndarray:
    """The policy's taus for the contexts, each recorded by its task and length bucket."""
    taus = self.policy.taus(contexts, tasks)
    for context, task, tau in zip(contexts, tasks, taus):
      key, mean = (task, temperatures.bucket(len(context))), float(np.mean(tau))
      count, low, high = self.applied.get(key, (0, mean, mean))
      self.applied[key] = [count + 1, min(low, mean), max(high, mean)]
    return taus

  def _report_cut(self, kind: str, before: Sequence[int]) -> None:
    total, cut = (a - b for a, b in zip(self.cut[kind], before))
    if cut:
      log.warning('t5align: the contexts of %d of %d %s requests were longer than max_length=%d '
                  'and were cut (%s).', cut, total, kind, self.args.max_length,
                  self.args.truncation)

  # -------------------------------------------------------------------------------------------
  # Requests.

  def _score(self, requests: Sequence[tuple[Any, list[int], list[int]]], tasks: Sequence[str],
             kind: str, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
    """(log-likelihood, is greedy) per (key, context tokens, continuation tokens); each
    distinct (context, temperature) encoded once."""
    before = list(self.cut[kind])
    cut = [self._cut(context, kind) for _, context, _ in requests]
    taus = self._taus([np.asarray(c, np.int32) for c in cut], tasks)
    index: dict[tuple[Any, ...], int] = {}
    contexts, context_taus, targets = [], [], []
    for tokens, tau, (_, _, continuation) in zip(cut, taus, requests):
      if not continuation:
        raise ValueError('a loglikelihood request has an empty continuation (lm-eval asserts '
                         'one token at least).')
      key = (tuple(tokens), tau.tobytes())
      if key not in index:
        index[key] = len(contexts)
        contexts.append(np.asarray(tokens, np.int32))
        context_taus.append(tau)
      targets.append((index[key], list(continuation)))
    self._report_cut(kind, before)
    self.engine.show_progress = not disable_tqdm
    ll, greedy = self.engine.score(contexts, np.asarray(context_taus), targets, desc=kind)
    return [(float(a), bool(b)) for a, b in zip(ll, greedy)]

  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
    return self._score(requests, [''] * len(requests), 'loglikelihood', disable_tqdm)

  def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
    """`TemplateLM.loglikelihood`'s tokenization (an empty context is the prefix token; a
    context's trailing spaces move to its continuation), then `_score` with each request's
    task, which per-task schedules and calibration read."""
    reqs = []
    for request in requests:
      context, continuation = request.args
      if context == '':
        cont = self.tok_encode(continuation, add_special_tokens=False)
        ctx, cont = (([self.prefix_token_id], cont) if self.prefix_token_id != cont[0]
                     else (cont[:1], cont[1:]))
      else:
        ctx, cont = self._encode_pair(context, continuation)
      reqs.append(((context, continuation), ctx, cont))
    out = self._score(reqs, [r.task_name or '' for r in requests], 'loglikelihood',
                      disable_tqdm)
    for (key, _, _), answer in zip(reqs, out):
      self.cache_hook.add_partial('loglikelihood', key, answer)
    return out

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    """hf's seq2seq windows: each window of up to max_length tokens is predicted by the decoder
    from the token before it (the first from the prefix token) as its encoder context."""
    if self.args.max_length is None:
      names = sorted({r.task_name or '?' for r in requests})
      raise ValueError(
          f'task {", ".join(names)} asks for loglikelihood_rolling (a perplexity over the whole '
          "text), which lm-eval's seq2seq convention computes in T5's decoder, max_length tokens "
          'per window: set max_length (e.g. --model_args ...,max_length=512).')
    windows, owners = [], []
    for n, request in enumerate(requests):
      (string,) = request.args
      for window in lm_eval_utils.get_rolling_token_windows(
          token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
          max_seq_len=self.args.max_length, context_len=1):
        context, continuation = lm_eval_utils.make_disjoint_window(window)
        windows.append((None, context, continuation))
        owners.append(n)
    tasks = [requests[n].task_name or '' for n in owners]
    scores = self._score(windows, tasks, 'loglikelihood_rolling', disable_tqdm)
    totals = [0.0] * len(requests)
    for n, (ll, _) in zip(owners, scores):
      totals[n] += ll
    for request, total in zip(requests, totals):
      self.cache_hook.add_partial('loglikelihood_rolling', request.args, total)
    return totals

  def _greedy_settings(self, gen_kwargs: dict[str, Any], task: str) -> tuple[list[str], int]:
    """(stop strings with EOS's text, max_gen_toks) of a request's generation settings, as hf
    normalizes them; sampling, beams or any other setting is refused naming the task."""
    if not isinstance(gen_kwargs, dict):
      raise ValueError(f'task {task}: generation settings {gen_kwargs!r} are not a dict.')
    kwargs = dict(lm_models_utils.normalize_gen_kwargs(gen_kwargs, self.max_gen_toks))
    until = lm_models_utils.handle_stop_sequences(
        kwargs.pop('until', None), eos=self.tok_decode(self.eot_token_id,
                                                       skip_special_tokens=False))
    max_gen_toks = kwargs.pop('max_gen_toks')
    do_sample, temperature = kwargs.pop('do_sample', False), kwargs.pop('temperature', 0.0)
    if do_sample or temperature:
      raise ValueError(f'task {task} asks for sampling ({gen_kwargs}); t5align decodes '
                       'greedily: run it with do_sample=false, temperature=0.')
    if kwargs:
      raise ValueError(f'task {task} sets generation settings {sorted(kwargs)} ({gen_kwargs}); '
                       f't5align decodes greedily and reads {", ".join(GREEDY_KWARGS)} only.')
    validate.positive_int(max_gen_toks, f'task {task}: max_gen_toks')
    return until, int(max_gen_toks)

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    out: list[str | None] = [None] * len(requests)
    groups: dict[tuple[Any, ...], list[int]] = {}
    settings_of = {}
    for n, request in enumerate(requests):
      context, gen_kwargs = request.args
      until, steps = self._greedy_settings(gen_kwargs, request.task_name or '?')
      key = (tuple(until), steps)
      settings_of[key] = (until, steps)
      groups.setdefault(key, []).append(n)
    before = list(self.cut['generate_until'])
    self.engine.show_progress = not disable_tqdm
    for key, members in groups.items():
      until, steps = settings_of[key]
      contexts = [np.asarray(self._cut(self.tokenizer_.encode(requests[n].args[0]),
                                       'generate_until'), np.int32) for n in members]
      taus = self._taus(contexts, [requests[n].task_name or '' for n in members])
      decoded = self.engine.generate(contexts, taus, steps)
      for n, tokens in zip(members, decoded):
        text = lm_models_utils.postprocess_generated_text(self.tok_decode(tokens), until, None)
        out[n] = text
        self.cache_hook.add_partial('generate_until', requests[n].args, text)
    self._report_cut('generate_until', before)
    return out

  # -------------------------------------------------------------------------------------------
  # lm-eval's other hooks.

  def set_cache_hook(self, cache_hook: Any) -> None:
    """lm-eval's response cache (`--use_cache`) is one file per rank, and every process here is
    rank 0: with several processes they would write one file, so it is refused."""
    if getattr(cache_hook, 'dbdict', None) is not None and jax.process_count() > 1:
      raise ValueError(f'--use_cache with {jax.process_count()} processes: every process runs '
                       'every request here and would write the same cache file; run without it.')
    super().set_cache_hook(cache_hook)

  def get_model_info(self) -> dict[str, Any]:
    """What lm-eval adds to its results' config: the checkpoint, the model, the temperatures
    used, the contexts cut and the programs compiled."""
    try:
      version = importlib.metadata.version('t5align')
    except importlib.metadata.PackageNotFoundError:
      version = None
    config = self.config
    return {NAME: {
        't5align_version': version, 'checkpoint': self.path,
        'checkpoint_format': checkpoints.detect_format(self.checkpoint.resolved),
        'model_args': self.args.record(), **tokenizer_lib.describe(self.tokenizer_),
        'config': {f.name: str(getattr(config, f.name)) for f in dataclasses.fields(config)},
        'max_length': self.args.max_length, 'truncation': self.args.truncation,
        'contexts': {kind: {'requests': n, 'cut': cut} for kind, (n, cut) in self.cut.items()},
        'temperatures': self.policy.describe(),
        'temperatures_by_bucket': [
            {'task': task, 'bucket': f'{top // 2 + 1}..{top}', 'requests': n,
             'tau_min': low, 'tau_max': high}
            for (task, top), (n, low, high) in sorted(self.applied.items())],
        'programs': {'count': len(self.engine.programs), 'shapes': self.engine.shapes(),
                     'calls': dict(self.engine.calls)},
        'platform': jax.default_backend(), 'device_argument': self.args.device,
        'process_count': jax.process_count(), 'device_count': jax.device_count(),
        'mesh': dict(self.mesh.shape)}}
