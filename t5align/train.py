r"""Trains a small T5 on synthetic retrieval (passkey with decoys too, lines, kv), resumably.

    python -m t5align.train \
      --gin_file=gin/runs/train_retrieval.gin --gin_file=gin/models/retrieval_small.gin \
      --gin.MODEL_DIR=/tmp/retrieval_t5

`--gin.NAME=VALUE` binds a macro (VALUE is a gin literal, or a string when it is not one);
`--gin_bindings` and `--gin_search_paths` work as in t5x; the repository root is a search path.

MODEL_DIR gets sentencepiece.model (trained first, from the tasks' prompts), checkpoint_N/ (T5X
legacy layout, float32, via `checkpoints.save_t5x_checkpoint`) with train_state_N.msgpack beside
it (optax state and step; written first, atomically), train_log.jsonl, run.json (what determines
the weights: every optimization, data and model setting) and, at the end, eval.json (held-out
greedy accuracy per task and length). Rerunning the same command resumes from the newest
checkpoint that has its train state (a run with other settings is refused, naming them); the
data stream is a function of (seed, step), so a resumed run sees the same batches as an
uninterrupted one.

The small model trained this way ships in t5align/shipped/retrieval_t5/ (`assets.load_shipped`).
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import json
import os
import re
import shlex
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
from t5align.evaluation import predictions
from t5align import gin_cli
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


@outputs.claims('model_dir', 'MODEL_DIR')
def train(*,
          model: network.Transformer | None = None,
          model_dir: str | None = None,
          seed: int = 0,
          num_steps: int = 1000,
          batch_size: int = 32,
          learning_rate: float = 1e-3,
          warmup_steps: int = 100,
          weight_decay: float = 0.0,
          optimizer: str = 'adamw',
          schedule: str = 'cosine',
          per_example_loss: bool = False,
          mix: Mapping[str, float] | None = None,
          length_power: float = 1.0,
          min_units: Mapping[str, int] | None = None,
          input_length: int = 256,
          target_length: int = 40,
          vocab_size: int = 1000,
          checkpoint_every: int = 200,
          keep_checkpoints: int = 2,
          log_every: int = 20,
          eval_lengths: Sequence[int] = (256,),
          eval_examples: int = 100,
          eval_seed: int = 1000,
          eval_batch_size: int = 16,
          export_dir: str | None = None,
          export_dtype: str = 'float32',
          command: str | None = None) -> dict[str, Any]:
  """Trains `model` on the retrieval mix; resumes from MODEL_DIR's newest checkpoint.

  Args:
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

  Returns:
    {'step', 'loss', 'token_accuracy' (the last logged, see `logged_training`), 'eval':
    {length: {task: accuracy}}, 'wall_s' (this call's training, setup included), 'loop_s' (the
    training loop over all segments), 'eval_wall_s'}.
  """
  gin_cli.require('train', model=model, model_dir=model_dir)
  validate.run_settings(
      seed=seed, num_steps=num_steps, batch_size=batch_size, learning_rate=learning_rate,
      warmup_steps=warmup_steps, weight_decay=weight_decay, length_power=length_power,
      input_length=input_length, target_length=target_length, vocab_size=vocab_size,
      checkpoint_every=checkpoint_every, keep_checkpoints=keep_checkpoints, log_every=log_every,
      eval_examples=eval_examples, eval_seed=eval_seed, eval_batch_size=eval_batch_size,
      export_dtype=export_dtype)
  if eval_lengths:
    validate.int_tuple(eval_lengths, 'EVAL_LENGTHS', minimum=2, example='(256, 1024)')
  for flag, value, known in (('OPTIMIZER', optimizer, OPTIMIZERS),
                             ('SCHEDULE', schedule, LEARNING_RATE_SCHEDULES)):
    if value not in known:
      raise ValueError(f'{flag}={value!r}; expected one of {", ".join(map(repr, known))}.')
  cfg = model.config
  validate.vocabulary_fits(vocab_size, cfg.vocab_size,
                           vocabulary='the vocabulary to train (VOCAB_SIZE)',
                           model=f'the model (network.T5Config.vocab_size={cfg.vocab_size})')
  for name, folder in (('MODEL_DIR', model_dir), ('EXPORT_DIR', export_dir)):
    if folder and fileio.is_remote(folder):
      raise ValueError(f'{name}={folder}: training writes local checkpoints; use a local '
                       'folder (copy the exported model to a bucket afterwards).')
  fileio.makedirs(model_dir)
  settings = {
      'seed': seed, 'num_steps': num_steps, 'batch_size': batch_size,
      'learning_rate': learning_rate, 'warmup_steps': warmup_steps,
      'weight_decay': weight_decay, 'optimizer': optimizer, 'schedule': schedule,
      'per_example_loss': per_example_loss, 'mix': mix, 'length_power': length_power,
      'min_units': min_units, 'input_length': input_length, 'target_length': target_length,
      'vocab_size': vocab_size,
      'config': {f.name: str(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}}
  vocab_path = os.path.join(model_dir, assets.VOCAB_FILE)
  resuming = bool(checkpoint_steps(model_dir))
  if not resuming:
    _check_vocabulary_left(model_dir, vocab_path, settings)
  # A resumed run continues the weights only if everything that made them is the same: the
  # settings and the vocabulary's content (recorded once it exists).
  # NOTE: a MODEL_DIR whose run.json predates the vocabulary's record resumes on its settings.
  recorded = _recorded_run(model_dir) if resuming else None
  with_vocabulary = not (isinstance(recorded, dict) and 'vocabulary' not in recorded)

  def identity():
    return run_identity.make(gin=False, settings=settings, files=(
        {'vocabulary': vocab_path} if with_vocabulary and os.path.exists(vocab_path) else {}))

  predictions.check_run(model_dir, identity(), has_results=resuming)
  outputs.repair_jsonl(os.path.join(model_dir, 'train_log.jsonl'))  # A torn line from a kill.
  start = time.time()
  if not os.path.exists(vocab_path):
    vocabularies.train_sentencepiece(train_data.vocabulary_corpus(seed), vocab_path, vocab_size)
    predictions.check_run(model_dir, identity(), has_results=False)  # Now with its content.
  vocab = vocabularies.SentencePieceVocabulary(vocab_path, t5_ids=True)
  validate.vocabulary_fits(vocab.vocab_size, cfg.vocab_size, vocabulary=f'vocabulary {vocab_path}',
                           model=f'the model (network.T5Config.vocab_size={cfg.vocab_size})')
  task_mix = train_data.Mix(weights=dict(mix or {t: 1.0 for t in train_data.TASKS}),
                            max_length=input_length, length_power=length_power,
                            min_units=dict(min_units or {}))

  opt_config = OptimizerConfig(learning_rate=learning_rate, total_steps=num_steps,
                               warmup_steps=warmup_steps, weight_decay=weight_decay,
                               name=optimizer, schedule=schedule)
  rng = jax.random.PRNGKey(seed)
  params = network.init_variables(cfg, rng)['params']
  opt_state = opt_config.make().init(params)
  done = checkpoint_steps(model_dir)
  step = done[-1] if done else 0
  _drop_logged_steps_after(model_dir, step)  # Logged by a killed run after its last checkpoint.
  if done:
    params, opt_state = restore_checkpoint(model_dir, step, cfg, opt_state)
    _log(model_dir, {'event': 'resume', 'step': step})
  batches = train_data.train_batches(vocab, task_mix, seed=seed, batch_size=batch_size,
                                     target_length=target_length, start_step=step)
  window: list[dict] = []
  t0 = time.time()
  while step < num_steps:
    batch = next(batches)
    params, opt_state, metrics = train_step(params, opt_state, batch,
                                            jax.random.fold_in(rng, step), model=model,
                                            optimizer=opt_config,
                                            per_example_loss=per_example_loss)
    step += 1
    window.append(metrics)
    if step % log_every == 0 or step == num_steps:
      means = {k: float(np.mean([m[k] for m in window])) for k in window[0]}
      _log(model_dir, {'step': step, **means, 'step_s': (time.time() - t0) / len(window)})
      window, t0 = [], time.time()
    if step % checkpoint_every == 0 or step == num_steps:
      if step not in checkpoint_steps(model_dir):
        save_checkpoint(model_dir, step, params, opt_state)
        _prune(model_dir, keep_checkpoints)
  train_wall = time.time() - start

  if export_dir:
    export(params, vocab_path, export_dir, step, export_dtype)
  results: dict[str, Any] = {}
  for length in eval_lengths:
    results[str(length)] = heldout.retrieval_accuracy(model, params, vocab, length=length,
                                                      num_examples=eval_examples, seed=eval_seed,
                                                      batch_size=eval_batch_size)
    _log(model_dir, {'event': 'eval', 'length': length, **results[str(length)]})
  logged = logged_training(model_dir)  # Covers earlier segments of a resumed run too.
  summary = {'step': step, 'loss': logged['loss'], 'token_accuracy': logged['token_accuracy'],
             'eval': results, 'wall_s': train_wall, 'loop_s': logged['loop_s'],
             'eval_wall_s': time.time() - start - train_wall}
  if eval_lengths:
    fileio.write_json_atomic(os.path.join(model_dir, 'eval.json'), summary)
  if export_dir:
    # What the demo calibrates against (L_tr), and how the shipped weights were made.
    fileio.write_json_atomic(os.path.join(export_dir, 'training.json'), training_record(
        input_length=input_length, summary=summary, command=command), sort_keys=False)
  return summary


# ---------------------------------------------------------------------------------------------
# Command line.


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  gin_cli.log_plainly()
  argv = sys.argv[1:] if argv is None else list(argv)
  gin_cli.configure(argv, prog='python -m t5align.train', description=__doc__,
                    example_file='gin/runs/train_retrieval.gin plus gin/models/retrieval_small.gin')
  # training.json records the command line that produced the exported weights.
  return gin_cli.call_configured('t5align.train.train', command=shlex.join(
      ['python', '-m', 't5align.train', *argv]))


if __name__ == '__main__':
  main()
