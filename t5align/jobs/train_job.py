"""The training job: a small T5 on synthetic retrieval (passkey, with decoys too; lines; kv).

MODEL_DIR gets sentencepiece.model (trained first, from the tasks' prompts), checkpoint_N/ (T5X
legacy layout, float32) with train_state_N.msgpack beside it (optax state and step; written
first, atomically), train_log.jsonl, run.json (`TrainJob.identity`: every optimization, data and
model setting) and, at the end, eval.json (held-out greedy accuracy per task and length). A rerun
resumes from the newest checkpoint that has its train state; the data stream is a function of
(seed, step), so a resumed run sees the same batches as an uninterrupted one.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import json
import os
import re
import shutil
import sys
import time
from typing import Any, Mapping, Sequence

from flax import serialization
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5align import checkpoints
from t5align import gin_cli
from t5align.jobs import common
from t5align import network
from t5align import run_identity
from t5align.runtime import fileio
from t5align.runtime import outputs
from t5align.runtime import validate
from t5align.shipped import assets
from t5align.shipped import heldout
from t5align.shipped import train_data
from t5align import vocabularies

Array = jax.Array


# ---------------------------------------------------------------------------------------------
# Loss, optimizer and step.


def cross_entropy(logits: Array, targets: Array, per_example: bool = False
                  ) -> tuple[Array, Array]:
  """Cross entropy and token accuracy over non-pad targets.

  Args:
    logits: float32 `[b, l, vocab]`.
    targets: int `[b, l]`, 0 = padding.
    per_example: average each example's tokens first, then the examples (every example weighs
      the same, whatever its target length); else one mean over all tokens (t5x).

  Returns:
    (loss, token accuracy): float32 scalars.
  """
  mask = (targets > 0).astype(jnp.float32)
  if per_example:
    # [b, l] / [b, 1]: each example's tokens sum to 1.
    mask = mask / jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1.0)
  # [b, l, vocab] -> [b, l]
  nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  denom = jnp.maximum(jnp.sum(mask), 1e-9)
  correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
  return jnp.sum(nll * mask) / denom, jnp.sum(correct * mask) / denom


OPTIMIZERS = ('adamw', 'adafactor')
LEARNING_RATE_SCHEDULES = ('cosine', 'wsd')


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW or Adafactor with a learning-rate schedule.

  Schedules: 'cosine' (linear warmup, cosine decay to 10% of the peak at `total_steps`) or 'wsd'
  (warmup, stable at the peak, then linear decay to 10% over the last `decay_fraction` of the
  steps; it keeps the peak rate while the model first learns to retrieve). AdamW clips the global
  gradient norm at `clip_norm`; Adafactor is T5's (factored second moments, updates scaled by each
  parameter's RMS, update clipping at 1.0). Hashable, so the jitted `train_step` takes it as a
  static argument and reuses compilations.
  """

  learning_rate: float
  total_steps: int
  warmup_steps: int
  weight_decay: float = 0.0
  clip_norm: float = 1.0
  name: str = 'adamw'
  schedule: str = 'cosine'
  decay_fraction: float = 0.2

  def learning_rate_schedule(self) -> optax.Schedule:
    peak, end = self.learning_rate, 0.1 * self.learning_rate
    total = max(self.total_steps, self.warmup_steps + 1)
    if self.schedule == 'cosine':
      return optax.warmup_cosine_decay_schedule(0.0, peak, self.warmup_steps, total,
                                                end_value=end)
    if self.schedule == 'wsd':
      decay = max(1, int(self.decay_fraction * total))
      stable = max(0, total - self.warmup_steps - decay)
      return optax.join_schedules(
          [optax.linear_schedule(0.0, peak, self.warmup_steps),
           optax.constant_schedule(peak),
           optax.linear_schedule(peak, end, decay)],
          [self.warmup_steps, self.warmup_steps + stable])
    raise ValueError(f"schedule={self.schedule!r}; expected 'cosine' or 'wsd'.")

  def make(self) -> optax.GradientTransformation:
    schedule = self.learning_rate_schedule()
    if self.name == 'adamw':
      return optax.chain(optax.clip_by_global_norm(self.clip_norm),
                         optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=self.weight_decay))
    if self.name == 'adafactor':
      return optax.adafactor(schedule, decay_rate=0.8, clipping_threshold=1.0,
                             multiply_by_parameter_scale=True,
                             weight_decay_rate=self.weight_decay or None)
    raise ValueError(f"optimizer name={self.name!r}; expected 'adamw' or 'adafactor'.")


@functools.partial(jax.jit, static_argnames=('model', 'optimizer', 'per_example_loss'))
def train_step(params: Any, opt_state: Any, batch: Mapping[str, Array], rng: Array, *,
               model: network.Transformer, optimizer: OptimizerConfig,
               per_example_loss: bool = False) -> tuple[Any, Any, dict[str, Array]]:
  """One optimizer step on the cross entropy of `batch` (t5x's feature dict; see `cross_entropy`).

  Returns:
    (params, opt_state, {'loss', 'token_accuracy', 'grad_norm'}).
  """

  def loss_fn(p):
    logits = model.apply(
        {'params': p}, batch['encoder_input_tokens'], batch['decoder_input_tokens'],
        batch['decoder_target_tokens'], enable_dropout=model.config.dropout_rate > 0,
        rngs={'dropout': rng})
    return cross_entropy(logits, batch['decoder_target_tokens'], per_example_loss)

  (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  updates, opt_state = optimizer.make().update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  return params, opt_state, {'loss': loss, 'token_accuracy': acc,
                             'grad_norm': optax.tree.norm(grads)}


# ---------------------------------------------------------------------------------------------
# Checkpoints: T5X params + optimizer state beside them.


def train_state_path(model_dir: str, step: int) -> str:
  return os.path.join(model_dir, f'train_state_{step}.msgpack')


def save_checkpoint(model_dir: str, step: int, params: Any, opt_state: Any) -> str:
  """Writes train_state_{step}.msgpack, then checkpoint_{step}/ (both atomic); returns the latter.

  The state goes first, so a checkpoint_N directory always has its optimizer state.
  """
  fileio.makedirs(model_dir)
  state = {'step': np.asarray(step, np.int64),
           'opt_state': serialization.to_state_dict(jax.device_get(opt_state))}
  fileio.write_atomic(train_state_path(model_dir, step), serialization.msgpack_serialize(state))
  return checkpoints.save_t5x_checkpoint(jax.device_get(params), model_dir, step)


def checkpoint_steps(model_dir: str) -> list[int]:
  """Steps with both checkpoint_N/checkpoint and train_state_N.msgpack, ascending."""
  steps = []
  for path in glob.glob(os.path.join(model_dir, 'checkpoint_*', 'checkpoint')):
    m = re.fullmatch(r'checkpoint_(\d+)', os.path.basename(os.path.dirname(path)))
    if m and os.path.exists(train_state_path(model_dir, int(m.group(1)))):
      steps.append(int(m.group(1)))
  return sorted(steps)


def restore_checkpoint(model_dir: str, step: int, config: network.T5Config,
                       opt_state_template: Any) -> tuple[dict, Any]:
  """(params, opt_state) of step `step`; params checked strictly against `config`."""
  params, _ = checkpoints.load_params(os.path.join(model_dir, f'checkpoint_{step}'), config,
                                      source_dtypes=('float32',))
  with open(train_state_path(model_dir, step), 'rb') as f:
    state = serialization.msgpack_restore(f.read())
  if int(state['step']) != step:
    raise ValueError(f'{train_state_path(model_dir, step)} holds step {int(state["step"])}.')
  opt_state = serialization.from_state_dict(opt_state_template, state['opt_state'])
  return params, opt_state


def _prune(model_dir: str, keep: int) -> None:
  for step in checkpoint_steps(model_dir)[:-keep]:
    shutil.rmtree(os.path.join(model_dir, f'checkpoint_{step}'))
    os.remove(train_state_path(model_dir, step))


def export(params: Any, vocab_path: str, export_dir: str, step: int, dtype: str) -> str:
  """Writes `export_dir/checkpoint_{step}` (params cast to `dtype`) and the vocabulary."""
  cast = jax.tree.map(lambda x: np.asarray(x).astype(jnp.dtype(dtype)), jax.device_get(params))
  path = checkpoints.save_t5x_checkpoint(cast, export_dir, step)
  shutil.copyfile(vocab_path, os.path.join(export_dir, assets.VOCAB_FILE))
  return path


# ---------------------------------------------------------------------------------------------
# The training loop.


def training_record(*, input_length: int, summary: Mapping[str, Any],
                    command: str | None = None) -> dict[str, Any]:
  """training.json beside exported weights: L_tr (what calibration aligns to), the command (if
  given), the run's summary and gin's configuration (call while it is still parsed)."""
  return {'input_length': input_length, 'command': command, 'summary': dict(summary),
          'gin_config': gin.config_str()}


def logged_training(model_dir: str) -> dict[str, float]:
  """From train_log.jsonl, over every run segment (resumes included): the last logged 'loss' and
  'token_accuracy', and 'loop_s', the training loop's wall time (each record's mean step time
  times the steps it covers)."""
  out = {'loss': float('nan'), 'token_accuracy': float('nan'), 'loop_s': 0.0}
  path = os.path.join(model_dir, 'train_log.jsonl')
  if not os.path.exists(path):
    return out
  previous = 0
  with open(path, encoding='utf-8') as f:
    for n, line in enumerate(f, 1):
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f'{path}:{n}: not a JSON record ({e}).') from e
      if record.get('event') == 'resume':
        previous = record['step']
      elif 'loss' in record and 'step' in record:
        out['loop_s'] += record['step_s'] * (record['step'] - previous)
        out['loss'], out['token_accuracy'] = record['loss'], record['token_accuracy']
        previous = record['step']
  return out


# The settings a vocabulary trained by `train` is made from (`vocabulary_corpus(seed)`).
_VOCABULARY_SETTINGS = ('vocab_size', 'seed')


def _recorded_run(model_dir: str) -> Any:
  """MODEL_DIR/run.json's content, or None without one."""
  run_file = os.path.join(model_dir, 'run.json')
  return outputs.read_json(run_file, 'run record') if os.path.exists(run_file) else None


def _check_vocabulary_left(model_dir: str, vocab_path: str, settings: Mapping[str, Any]) -> None:
  """Before a run with no checkpoint to continue: refuses a vocabulary that a run with other
  vocabulary settings left in MODEL_DIR (killed before its first checkpoint), which this run
  would otherwise train with. A vocabulary without such a record (placed there) is used."""
  before = _recorded_run(model_dir)
  if not os.path.exists(vocab_path) or before is None:
    return
  changed = {k: (before.get(k), settings[k]) for k in _VOCABULARY_SETTINGS
             if isinstance(before, dict) and before.get(k) != settings[k]}
  if changed:
    raise run_identity.RunMismatchError(
        f'MODEL_DIR {model_dir} holds {assets.VOCAB_FILE}, trained by an earlier run (killed '
        f'before its first checkpoint) with other vocabulary settings '
        f'({run_identity.describe_differences(changed)}); this run would train with it. Remove '
        f'{vocab_path} to train a new one, or use another MODEL_DIR.')


def _drop_logged_steps_after(model_dir: str, step: int) -> None:
  """Rewrites train_log.jsonl without the records of steps after `step` (a killed run's, after
  its last checkpoint, which this run trains again), so no step is logged twice."""
  path = os.path.join(model_dir, 'train_log.jsonl')
  if not os.path.exists(path):
    return
  with open(path, encoding='utf-8') as f:
    lines = f.read().splitlines()
  kept = [line for line in lines if json.loads(line).get('step', 0) <= step]
  if len(kept) < len(lines):
    fileio.write_atomic(path, ''.join(line + '\n' for line in kept))
    print(f'{path}: dropped {len(lines) - len(kept)} record(s) of steps after {step} (the last '
          'checkpoint), trained again now', file=sys.stderr, flush=True)


def _log(model_dir: str, record: Mapping[str, Any]) -> None:
  line = json.dumps(record, sort_keys=True)
  print(line, flush=True)
  with open(os.path.join(model_dir, 'train_log.jsonl'), 'a') as f:
    f.write(line + '\n')


@dataclasses.dataclass(frozen=True)
class TrainJob:
  """`python -m t5align.train`'s settings (gin/runs/train_retrieval.gin binds its macros to these
  fields, as `t5align.train.train`) and its run: trains `model` on the retrieval mix, resuming from
  MODEL_DIR's newest checkpoint.


  Attributes:
    model: the Transformer (its config's vocab_size must hold `vocab_size` pieces).
    model_dir: output folder (see the module docstring).
    seed: parameter init, data stream (example i of the run is `train_data.train_example(...,
      seed, i)`) and dropout.
    num_steps: total optimizer steps.
    batch_size, learning_rate, warmup_steps, weight_decay, optimizer, schedule: see
      `OptimizerConfig` ('adamw' or 'adafactor'; 'cosine' or 'wsd').
    per_example_loss: weigh examples equally in the loss (see `cross_entropy`).
    mix: task weights, e.g. {'passkey': 1, 'lines': 1, 'kv': 1}; None: equal.
    length_power: input budgets are `low + u**length_power * (input_length - low)` (see
      `train_data.Mix`); 2 favours short inputs.
    min_units: per task, the fewest units an example has (`train_data.Mix.min_units`), e.g.
      {'lines': 3}; None: each task's own minimum.
    input_length: L_tr; inputs (with EOS) have at most input_length tokens.
    target_length: decoder length (longest target with EOS).
    vocab_size: SentencePiece pieces, trained on the tasks' prompts on first run.
    checkpoint_every, keep_checkpoints, log_every: checkpoint and log cadence.
    eval_lengths, eval_examples, eval_seed, eval_batch_size: held-out greedy evaluation at the
      end (tau = 1), written to MODEL_DIR/eval.json; empty `eval_lengths` skips it.
    export_dir: if set, the final params (as `export_dtype`), vocabulary and training.json
      (`training_record`) are written there (e.g. t5align/shipped/retrieval_t5).
    command: the command line to record in training.json, if any.

  """

  model: network.Transformer | None = None
  model_dir: str | None = None
  seed: int = 0
  num_steps: int = 1000
  batch_size: int = 32
  learning_rate: float = 1e-3
  warmup_steps: int = 100
  weight_decay: float = 0.0
  optimizer: str = 'adamw'
  schedule: str = 'cosine'
  per_example_loss: bool = False
  mix: Mapping[str, float] | None = None
  length_power: float = 1.0
  min_units: Mapping[str, int] | None = None
  input_length: int = 256
  target_length: int = 40
  vocab_size: int = 1000
  checkpoint_every: int = 200
  keep_checkpoints: int = 2
  log_every: int = 20
  eval_lengths: Sequence[int] = (256,)
  eval_examples: int = 100
  eval_seed: int = 1000
  eval_batch_size: int = 16
  export_dir: str | None = None
  export_dtype: str = 'float32'
  command: str | None = None

  def check(self) -> None:
    """Every setting, each error naming its macro, before any file is written."""
    gin_cli.require('train', model=self.model, model_dir=self.model_dir)
    validate.run_settings(
        seed=self.seed, num_steps=self.num_steps, batch_size=self.batch_size,
        learning_rate=self.learning_rate, warmup_steps=self.warmup_steps,
        weight_decay=self.weight_decay, length_power=self.length_power,
        input_length=self.input_length, target_length=self.target_length,
        vocab_size=self.vocab_size, checkpoint_every=self.checkpoint_every,
        keep_checkpoints=self.keep_checkpoints, log_every=self.log_every,
        eval_examples=self.eval_examples, eval_seed=self.eval_seed,
        eval_batch_size=self.eval_batch_size, export_dtype=self.export_dtype)
    if self.eval_lengths:
      validate.int_tuple(self.eval_lengths, 'EVAL_LENGTHS', minimum=2, example='(256, 1024)')
    for flag, value, known in (('OPTIMIZER', self.optimizer, OPTIMIZERS),
                               ('SCHEDULE', self.schedule, LEARNING_RATE_SCHEDULES)):
      if value not in known:
        raise ValueError(f'{flag}={value!r}; expected one of {", ".join(map(repr, known))}.')
    cfg = self.model.config
    validate.vocabulary_fits(self.vocab_size, cfg.vocab_size,
                             vocabulary='the vocabulary to train (VOCAB_SIZE)',
                             model=f'the model (network.T5Config.vocab_size={cfg.vocab_size})')
    for name, folder in (('MODEL_DIR', self.model_dir), ('EXPORT_DIR', self.export_dir)):
      if folder and fileio.is_remote(folder):
        raise ValueError(f'{name}={folder}: training writes local checkpoints; use a local '
                         'folder (copy the exported model to a bucket afterwards).')

  def optimizer_config(self) -> OptimizerConfig:
    return OptimizerConfig(learning_rate=self.learning_rate, total_steps=self.num_steps,
                           warmup_steps=self.warmup_steps, weight_decay=self.weight_decay,
                           name=self.optimizer, schedule=self.schedule)

  def settings(self) -> dict[str, Any]:
    """What determines the weights (run.json's settings)."""
    cfg = self.model.config
    return {
        'seed': self.seed, 'num_steps': self.num_steps, 'batch_size': self.batch_size,
        'learning_rate': self.learning_rate, 'warmup_steps': self.warmup_steps,
        'weight_decay': self.weight_decay, 'optimizer': self.optimizer,
        'schedule': self.schedule, 'per_example_loss': self.per_example_loss, 'mix': self.mix,
        'length_power': self.length_power, 'min_units': self.min_units,
        'input_length': self.input_length, 'target_length': self.target_length,
        'vocab_size': self.vocab_size,
        'config': {f.name: str(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}}

  def identity(self, vocab_path: str | None = None) -> dict[str, Any]:
    """run.json: the settings, and the vocabulary's content once `vocab_path` exists."""
    files = {'vocabulary': vocab_path} if vocab_path and os.path.exists(vocab_path) else {}
    return run_identity.make(gin=False, settings=self.settings(), files=files)

  def programs(self, params: Any = None) -> list[common.Program]:
    """The train step on a batch of BATCH_SIZE examples (`params` default: abstract, float32,
    as `network.init_variables` makes them)."""
    cfg = self.model.config
    if params is None:
      params = jax.eval_shape(lambda: network.init_variables(cfg, jax.random.PRNGKey(0)))[
          'params']
    opt = self.optimizer_config()
    opt_state = jax.eval_shape(opt.make().init, params)
    tokens = lambda width: jax.ShapeDtypeStruct((self.batch_size, width), jnp.int32)
    batch = {'encoder_input_tokens': tokens(self.input_length),
             'decoder_input_tokens': tokens(self.target_length),
             'decoder_target_tokens': tokens(self.target_length)}
    rng = jax.eval_shape(lambda: jax.random.PRNGKey(0))
    fn = functools.partial(train_step, model=self.model, optimizer=opt,
                           per_example_loss=self.per_example_loss)
    return [common.Program(
        name='train', description='one optimizer step', fn=jax.jit(fn),
        args=(params, opt_state, batch, rng), names=('opt_state', 'batch', 'rng'),
        units=self.batch_size, unit='example',
        settings={'length': self.input_length, 'batch_size': self.batch_size},
        hints=dict(model_shards=1, batch_size=self.batch_size, length=self.input_length,
                   attention_impl=network.encoder_attention_impl(cfg, self.input_length)),
        estimate={})]

  def run(self) -> dict[str, Any]:
    """Trains, evaluates and exports.

  Returns:
    {'step', 'loss', 'token_accuracy' (the last logged, see `logged_training`), 'eval':
    {length: {task: accuracy}}, 'wall_s' (this call's training, setup included), 'loop_s' (the
    training loop over all segments), 'eval_wall_s'}.
    """
    with outputs.claim(self.model_dir, 'MODEL_DIR'):  # Unset: `check` reports it.
      return self._run()

  def _run(self) -> dict[str, Any]:
    self.check()
    cfg = self.model.config
    fileio.makedirs(self.model_dir)
    settings = self.settings()
    vocab_path = os.path.join(self.model_dir, assets.VOCAB_FILE)
    resuming = bool(checkpoint_steps(self.model_dir))
    if not resuming:
      _check_vocabulary_left(self.model_dir, vocab_path, settings)
    # A resumed run continues the weights only if everything that made them is the same: the
    # settings and the vocabulary's content (recorded once it exists).
    # NOTE: a MODEL_DIR whose run.json predates the vocabulary's record resumes on its settings.
    recorded = _recorded_run(self.model_dir) if resuming else None
    with_vocabulary = not (isinstance(recorded, dict) and 'vocabulary' not in recorded)

    identity = lambda: self.identity(vocab_path if with_vocabulary else None)

    run_identity.check_run(self.model_dir, identity(), has_results=resuming)
    # A torn line from a kill.
    outputs.repair_jsonl(os.path.join(self.model_dir, 'train_log.jsonl'))
    start = time.time()
    if not os.path.exists(vocab_path):
      vocabularies.train_sentencepiece(train_data.vocabulary_corpus(self.seed), vocab_path,
                                       self.vocab_size)
      run_identity.check_run(self.model_dir, identity(), has_results=False)  # Now with its content.
    vocab = vocabularies.SentencePieceVocabulary(vocab_path, t5_ids=True)
    validate.vocabulary_fits(vocab.vocab_size, cfg.vocab_size,
                             vocabulary=f'vocabulary {vocab_path}',
                             model=f'the model (network.T5Config.vocab_size={cfg.vocab_size})')
    task_mix = train_data.Mix(weights=dict(self.mix or {t: 1.0 for t in train_data.TASKS}),
                              max_length=self.input_length, length_power=self.length_power,
                              min_units=dict(self.min_units or {}))

    rng = jax.random.PRNGKey(self.seed)
    params = network.init_variables(cfg, rng)['params']
    opt_state = self.optimizer_config().make().init(params)
    (program,) = self.programs(params)
    done = checkpoint_steps(self.model_dir)
    step = done[-1] if done else 0
    # Logged by a killed run after its last checkpoint.
    _drop_logged_steps_after(self.model_dir, step)
    if done:
      params, opt_state = restore_checkpoint(self.model_dir, step, cfg, opt_state)
      _log(self.model_dir, {'event': 'resume', 'step': step})
    batches = train_data.train_batches(vocab, task_mix, seed=self.seed, batch_size=self.batch_size,
                                       target_length=self.target_length, start_step=step)
    window: list[dict] = []
    t0 = time.time()
    while step < self.num_steps:
      batch = next(batches)
      params, opt_state, metrics = program.fn(params, opt_state, batch,
                                              jax.random.fold_in(rng, step))
      step += 1
      window.append(metrics)
      if step % self.log_every == 0 or step == self.num_steps:
        means = {k: float(np.mean([m[k] for m in window])) for k in window[0]}
        _log(self.model_dir, {'step': step, **means, 'step_s': (time.time() - t0) / len(window)})
        window, t0 = [], time.time()
      if step % self.checkpoint_every == 0 or step == self.num_steps:
        if step not in checkpoint_steps(self.model_dir):
          save_checkpoint(self.model_dir, step, params, opt_state)
          _prune(self.model_dir, self.keep_checkpoints)
    train_wall = time.time() - start

    if self.export_dir:
      export(params, vocab_path, self.export_dir, step, self.export_dtype)
    results: dict[str, Any] = {}
    for length in self.eval_lengths:
      results[str(length)] = heldout.retrieval_accuracy(
          self.model, params, vocab, length=length, num_examples=self.eval_examples,
          seed=self.eval_seed, batch_size=self.eval_batch_size)
      _log(self.model_dir, {'event': 'eval', 'length': length, **results[str(length)]})
    logged = logged_training(self.model_dir)  # Covers earlier segments of a resumed run too.
    summary = {'step': step, 'loss': logged['loss'], 'token_accuracy': logged['token_accuracy'],
               'eval': results, 'wall_s': train_wall, 'loop_s': logged['loop_s'],
               'eval_wall_s': time.time() - start - train_wall}
    if self.eval_lengths:
      fileio.write_json_atomic(os.path.join(self.model_dir, 'eval.json'), summary)
    if self.export_dir:
      # What the demo calibrates against (L_tr), and how the shipped weights were made.
      fileio.write_json_atomic(os.path.join(self.export_dir, 'training.json'), training_record(
          input_length=self.input_length, summary=summary, command=self.command), sort_keys=False)
    return summary
