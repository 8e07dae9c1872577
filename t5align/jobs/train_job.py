"""The training job: a small T5 on synthetic retrieval (passkey, with decoys too; lines; kv).

MODEL_DIR gets sentencepiece.model (trained first, from the tasks' prompts), checkpoint_N/ (T5X
legacy layout, float32) with train_state_N.msgpack beside it (optax state and step; written
first, atomically), train_log.jsonl, run.json (`TrainJob.identity`: every optimization, data and
model setting) and, at the end, eval.json (held-out greedy accuracy per task and length). A rerun
resumes from the newest checkpoint that has its train state; the data stream is a function of
(seed, step), so a resumed run sees the same batches as an uninterrupted one.

Fine-tuning (`TrainJob.mixture_or_task_name`, as t5x's finetune.gin): batches come from a seqio
task's or mixture's 'train' split (`training.SeqioBatches`), tokenized with the task's
vocabulary (no vocabulary is trained), and the weights start from `initial_checkpoint_path`; the
rest (loss, optimizer, step, checkpoints, resuming, export) is the same.

The loss, optimizer, step, train checkpoints, train log and export are `t5align.training`'s;
this job holds the settings, what run.json records, the program and the run over them.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import time
from typing import Any, ClassVar, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from t5align import checkpoints
from t5align import fields
from t5align import gin_cli
from t5align.jobs import common
from t5align import memory
from t5align import network
from t5align import run_identity
from t5align.runtime import fileio
from t5align.runtime import outputs
from t5align.runtime import validate
from t5align.shipped import assets
from t5align.shipped import heldout
from t5align.shipped import train_data
from t5align import training
from t5align.training import train_log
from t5align import vocabularies

# The settings a vocabulary trained by `train` is made from (`vocabulary_corpus(seed)`).
_VOCABULARY_SETTINGS = ('vocab_size', 'seed')
# Settings of the synthetic data only (not in a fine-tuning run's identity).
_SYNTHETIC_ONLY = ('mix', 'vocab_size')


def _recorded_run(model_dir: str) -> Any:
  """MODEL_DIR/run.json's content in today's format (`run_identity.upgrade`), or None without
  one."""
  run_file = os.path.join(model_dir, 'run.json')
  if not os.path.exists(run_file):
    return None
  return run_identity.upgrade(outputs.read_json(run_file, 'run record'), TrainJob.KIND)


def _check_vocabulary_left(model_dir: str, vocab_path: str, settings: Mapping[str, Any]) -> None:
  """Before a run with no checkpoint to continue: refuses a vocabulary that a run with other
  vocabulary settings left in MODEL_DIR (killed before its first checkpoint), which this run
  would otherwise train with. A vocabulary without such a record (placed there) is used."""
  before = _recorded_run(model_dir)
  if not os.path.exists(vocab_path) or before is None:
    return
  before = before.get('settings') if isinstance(before, dict) else None
  changed = {k: (before.get(k), settings[k]) for k in _VOCABULARY_SETTINGS
             if isinstance(before, dict) and before.get(k) != settings[k]}
  if changed:
    raise run_identity.RunMismatchError(
        f'MODEL_DIR {model_dir} holds {assets.VOCAB_FILE}, trained by an earlier run (killed '
        f'before its first checkpoint) with other vocabulary settings '
        f'({run_identity.describe_differences(changed)}); this run would train with it. Remove '
        f'{vocab_path} to train a new one, or use another MODEL_DIR.')


@dataclasses.dataclass(frozen=True)
class TrainJob:
  """`python -m t5align.train`'s settings (gin/runs/train_retrieval.gin and gin/runs/finetune.gin
  bind their macros to these fields, as `jobs.TrainJob`: `gin_cli.register_job`) and its run:
  trains `model` on the retrieval mix, or fine-tunes it on a seqio task or mixture, resuming
  from MODEL_DIR's newest checkpoint.


  Attributes:
    model: the Transformer (its config's vocab_size must hold `vocab_size` pieces).
    model_dir: output folder (see the module docstring).
    seed: parameter init, data stream (example i of the run is `train_data.train_example(...,
      seed, i)`) and dropout.
    num_steps: total optimizer steps.
    batch_size: examples per step.
    optimizer: `training.OptimizerConfig` (LEARNING_RATE, WARMUP_STEPS, weight decay,
      OPTIMIZER 'adamw' or 'adafactor', SCHEDULE 'cosine', 'wsd' or 'constant'), its schedule
      over NUM_STEPS.
    per_example_loss: weigh examples equally in the loss (see `training.cross_entropy`).
    mix: the synthetic tasks' mixture, `train_data.Mix` (MIX: task weights, e.g. {'passkey': 1,
      'lines': 1, 'kv': 1}, None: equal; LENGTH_POWER: input budgets are `low + u**length_power
      * (input_length - low)`, 2 favours short inputs; MIN_UNITS: per task, the fewest units
      an example has, e.g. {'lines': 3}, None: each task's own), its inputs at most L_TR
      tokens.
    input_length: L_tr; inputs (with EOS) have at most input_length tokens.
    target_length: decoder length (longest target with EOS).
    vocab_size: SentencePiece pieces, trained on the tasks' prompts on first run.
    checkpoint_every, keep_checkpoints, log_every: checkpoint and log cadence.
    eval_lengths, eval_examples, eval_seed, eval_batch_size: held-out greedy evaluation at the
      end (tau = 1), written to MODEL_DIR/eval.json; empty `eval_lengths` skips it.
    export_dir: if set, the final params (as `export_dtype`), vocabulary and training.json
      (`training.training_record`) are written there (e.g. t5align/shipped/retrieval_t5).
    command: the command line to record in training.json, if any.
    mixture_or_task_name: if set, fine-tuning (t5x's finetune.gin): batches come from this seqio
      task's or mixture's 'train' split (`training.SeqioBatches`: seeded by `seed`, resumable;
      inputs and targets cut to `input_length` / `target_length` as seqio cuts them for t5x,
      not refused, and the cut examples counted in train_log.jsonl's 'inputs_trimmed' /
      'targets_trimmed' / 'examples_trimmed' and the summary's 'trimmed'), tokenized with the
      task's vocabulary (`vocab_size`, `mix`, `length_power` and `min_units` are unused;
      MODEL_DIR gets no vocabulary: the export copies the task's).
    initial_checkpoint: with `mixture_or_task_name`, the weights the first segment starts
      from (`jobs.Checkpoint` with flag INITIAL_CHECKPOINT_PATH: any checkpoint
      `checkpoints.load_params` reads, checked strictly against `model`'s config); None:
      initialized from `seed`. A resumed run continues MODEL_DIR's checkpoint.

  run.json (`identity`) records the fields as settings but those whose metadata says why not
  (and, fine-tuning, `mix` and `vocab_size`, which only the synthetic data uses), the model's
  config, the vocabulary's content and, fine-tuning, the initial checkpoint's.
  """

  model: network.Transformer | None = fields.setting(
      None, check=fields.required(fields.instance(
          network.Transformer, 'a network.Transformer (gin: @network.Transformer())')),
      unrecorded="recorded as 'config'")
  model_dir: str | None = fields.setting(None, check=fields.required(fields.path()),
                                         unrecorded='where the run goes')
  seed: int = fields.setting(0, check=fields.integer(0))
  num_steps: int = fields.setting(1000, check=fields.integer(1))
  batch_size: int = fields.setting(32, check=fields.integer(1))
  optimizer: training.OptimizerConfig = fields.setting(
      default_factory=training.OptimizerConfig,
      check=common.settings_object(training.OptimizerConfig, 'optimizer'))
  per_example_loss: bool = fields.setting(False, check=fields.boolean())
  # Its inputs fit in L_TR: `check`.
  mix: train_data.Mix = fields.setting(default_factory=train_data.Mix,
                                       check=common.settings_object(train_data.Mix, 'mix'))
  input_length: int = fields.setting(256, check=fields.integer(1))
  target_length: int = fields.setting(40, check=fields.integer(1))
  # At most the model's embedding rows: `check`.
  vocab_size: int = fields.setting(1000, check=fields.integer(1))
  checkpoint_every: int = fields.setting(
      200, check=fields.integer(1),
      unrecorded='the weights at a step are the same whichever steps were saved')
  keep_checkpoints: int = fields.setting(2, check=fields.integer(1), unrecorded='how many stay')
  log_every: int = fields.setting(20, check=fields.integer(1),
                                  unrecorded='how often the log writes')
  eval_lengths: Sequence[int] = fields.setting(
      (256,), check=fields.integers(2, empty=True),
      unrecorded='the held-out evaluation after training (eval.json), not the weights')
  eval_examples: int = fields.setting(
      100, check=fields.integer(1),
      unrecorded='the held-out evaluation after training (eval.json), not the weights')
  eval_seed: int = fields.setting(
      1000, check=fields.integer(0),
      unrecorded='the held-out evaluation after training (eval.json), not the weights')
  eval_batch_size: int = fields.setting(
      16, check=fields.integer(1),
      unrecorded='the held-out evaluation after training (eval.json), not the weights')
  export_dir: str | None = fields.setting(
      None, check=fields.optional(fields.path(), 'None (no export)'),
      unrecorded='where the final weights are copied')
  export_dtype: str = fields.setting('float32', check=fields.dtype(),
                                     unrecorded='how the final weights are copied')
  command: str | None = fields.setting(None, check=fields.optional(fields.text()),
                                       unrecorded='recorded in training.json')
  mixture_or_task_name: str | None = fields.setting(
      None, check=fields.optional(fields.text(blank=False), 'None (the synthetic mix)'))
  initial_checkpoint: common.Checkpoint | None = fields.setting(
      None, check=common.settings_object(common.Checkpoint, 'initial_checkpoint',
                                         none='None (initialized from the seed)'))

  GIN_NAME: ClassVar[str] = 'jobs.TrainJob'

  # The settings a run needs, by their gin macro (`gin_cli.require`; the model is bound by the
  # run file, configured by a gin/models file). gin/runs/finetune.gin requires more
  # (`gin_cli.check_required_macros`).
  REQUIRED: ClassVar[Mapping[str, str | None]] = {'model': None, 'model_dir': 'MODEL_DIR'}
  KIND: ClassVar[str] = 'train'

  def __post_init__(self):
    fields.check_fields(self)  # Unset (None, %gin.REQUIRED): `check` names the macro.

  @property
  def params_dtype(self) -> str:
    """Training holds its parameters in float32."""
    return 'float32'

  def mesh(self) -> None:
    """Training runs on one device."""
    return None

  @property
  def finetuning(self) -> bool:
    return self.mixture_or_task_name is not None

  def check(self) -> None:
    """Every setting, each error naming its macro, before any file is written."""
    gin_cli.require(self)
    # Each field was checked as the job (and its settings objects) was built (`fields`); here
    # what one field's check cannot see.
    if not self.finetuning:
      self.mix.check_fits(self.input_length, "the run's input length (jobs.TrainJob."
                          f'input_length = {self.input_length}, L_TR)')
    cfg = self.model.config
    if self.initial_checkpoint is not None and not self.finetuning:
      raise ValueError(
          f'INITIAL_CHECKPOINT_PATH={self.initial_checkpoint.path} needs MIXTURE_OR_TASK_NAME: '
          'the synthetic mix trains its own vocabulary from scratch. Fine-tune on it through '
          "its seqio tasks, e.g. MIXTURE_OR_TASK_NAME='t5align_train_retrieval'.")
    if not self.finetuning:
      validate.vocabulary_fits(self.vocab_size, cfg.vocab_size,
                               vocabulary='the vocabulary to train (VOCAB_SIZE)',
                               model=f'the model (network.T5Config.vocab_size={cfg.vocab_size})')
    for name, folder in (('MODEL_DIR', self.model_dir), ('EXPORT_DIR', self.export_dir)):
      if folder and fileio.is_remote(folder):
        raise ValueError(f'{name}={folder}: training writes local checkpoints; use a local '
                         'folder (copy the exported model to a bucket afterwards).')

  def identity(self, facts: Mapping[str, Any]) -> dict[str, Any]:
    """run.json: the settings (fine-tuning: less those of the synthetic data), the model's
    config, the initial checkpoint's content when fine-tuning, and `facts` (the vocabulary's
    content, once the run has one)."""
    cfg = self.model.config
    settings = run_identity.settings_record(self)
    if self.finetuning:
      for key in _SYNTHETIC_ONLY:
        settings.pop(key)
    start = self.initial_checkpoint
    return run_identity.make(
        settings=settings, checkpoint=start.path if start else None,
        resolved_checkpoint=start.resolved if start else None, facts={
            'config': {f.name: str(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)},
            **facts})

  def programs(self, config: network.T5Config, mesh: Any = None, params: Any = None, *,
               length: int | None = None) -> list[common.Program]:
    """The train step of `config`'s model on a batch of BATCH_SIZE examples of `length` (None:
    L_TR) input tokens (`params` None: abstract, float32, as `network.init_variables` makes
    them); over `mesh` (the pre-flight's one chip) its arguments are placed there, replicated,
    else on the default device."""
    model = network.Transformer(config)
    if params is None:
      params = jax.eval_shape(lambda: network.init_variables(config, jax.random.PRNGKey(0)))[
          'params']
    opt = self.optimizer.make(self.num_steps)
    workload = memory.Workload(config, length or self.input_length, self.batch_size,
                               target_length=self.target_length, training=True)
    tokens = lambda width: jax.ShapeDtypeStruct((workload.rows, width), jnp.int32)
    args = (params, jax.eval_shape(opt.init, params),
            {'encoder_input_tokens': tokens(workload.width),
             'decoder_input_tokens': tokens(workload.target_length),
             'decoder_target_tokens': tokens(workload.target_length)},
            jax.eval_shape(lambda: jax.random.PRNGKey(0)))
    if mesh is not None:
      placed = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
      args = (args[0], *jax.tree.map(
          lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed), args[1:]))
    fn = functools.partial(training.train_step, model=model, optimizer=self.optimizer,
                           total_steps=self.num_steps, per_example_loss=self.per_example_loss)
    return [common.Program(
        name='train', description='one optimizer step', fn=jax.jit(fn), args=args,
        names=('opt_state', 'batch', 'rng'), units=workload.rows, unit='example',
        workload=workload)]

  def resume_note(self) -> str:
    return (f'The checkpoints written so far (every {self.checkpoint_every} steps, '
            f'CHECKPOINT_EVERY) are kept in {self.model_dir}; rerun the same command to continue '
            'from the last.')

  def run(self) -> dict[str, Any]:
    """Trains, evaluates and exports.

  Returns:
    {'step', 'loss', 'token_accuracy' (the last logged, see `training.logged_training`), 'eval':
    {length: {task: accuracy}}, 'wall_s' (this call's training, setup included), 'loop_s' (the
    training loop over all segments), 'eval_wall_s'}.
    """
    with outputs.claim(self.model_dir, 'MODEL_DIR'):  # Unset: `check` reports it.
      return self._run()

  def _run(self) -> dict[str, Any]:
    self.check()
    cfg = self.model.config
    if self.finetuning:
      return self._train(*self._finetuning_setup(cfg))
    fileio.makedirs(self.model_dir)
    vocab_path = os.path.join(self.model_dir, assets.VOCAB_FILE)
    resuming = bool(training.checkpoint_steps(self.model_dir))
    if not resuming:
      _check_vocabulary_left(self.model_dir, vocab_path, run_identity.settings_record(self))
    # A resumed run continues the weights only if everything that made them is the same: the
    # settings and the vocabulary's content (recorded once it exists).
    # NOTE: a MODEL_DIR whose run.json predates the vocabulary's record resumes on its settings.
    recorded = _recorded_run(self.model_dir) if resuming else None
    with_vocabulary = not (isinstance(recorded, dict) and 'vocabulary' not in recorded)

    identity = lambda: self.identity(
        {'vocabulary': run_identity.file_fingerprint(vocab_path)}
        if with_vocabulary and os.path.exists(vocab_path) else {})

    run_identity.check_run(self.model_dir, identity(), kind=self.KIND, has_results=resuming)
    # A torn line from a kill.
    outputs.repair_jsonl(train_log.path(self.model_dir))
    start = time.time()
    if not os.path.exists(vocab_path):
      vocabularies.train_sentencepiece(train_data.vocabulary_corpus(self.seed), vocab_path,
                                       self.vocab_size)
      # Now with its content.
      run_identity.check_run(self.model_dir, identity(), kind=self.KIND, has_results=False)
    vocab = vocabularies.SentencePieceVocabulary(vocab_path, t5_ids=True)
    validate.vocabulary_fits(vocab.vocab_size, cfg.vocab_size,
                             vocabulary=f'vocabulary {vocab_path}',
                             model=f'the model (network.T5Config.vocab_size={cfg.vocab_size})')
    batches = lambda step: train_data.train_batches(
        vocab, self.mix, max_length=self.input_length, seed=self.seed,
        batch_size=self.batch_size, target_length=self.target_length, start_step=step)
    return self._train(start, vocab, vocab_path, batches, None)

  def _finetuning_setup(self, cfg: network.T5Config) -> tuple[Any, ...]:
    """Fine-tuning's data, vocabulary and initial weights, each checked before MODEL_DIR is
    written: (start time, vocabulary, its files, batches at a step, initial params or None)."""
    data = training.SeqioBatches(
        self.mixture_or_task_name, seed=self.seed, batch_size=self.batch_size,
        input_length=self.input_length, target_length=self.target_length)
    files = run_identity.vocabulary_files(data.vocabulary)
    validate.vocabulary_fits(
        data.vocabulary.vocab_size, cfg.vocab_size,
        vocabulary=f'vocabulary {",".join(files)} (of MIXTURE_OR_TASK_NAME='
                   f'{self.mixture_or_task_name!r})',
        model=f'the model (network.T5Config.vocab_size={cfg.vocab_size})')
    resuming = bool(training.checkpoint_steps(self.model_dir))
    initial = None
    if self.initial_checkpoint is not None and not resuming:
      try:
        initial, _ = self.initial_checkpoint.load(cfg, None)
      except checkpoints.CheckpointMismatchError as e:
        raise checkpoints.CheckpointMismatchError(
            e.missing, e.unexpected, e.mismatched,
            source=f'INITIAL_CHECKPOINT_PATH={self.initial_checkpoint.path} (for the model '
                   'file\'s network.T5Config)') from e
    fileio.makedirs(self.model_dir)
    run_identity.check_run(
        self.model_dir, self.identity(
            {'vocabulary': run_identity.vocabulary_fingerprint(data.vocabulary)}),
        kind=self.KIND, has_results=resuming)
    outputs.repair_jsonl(train_log.path(self.model_dir))
    vocab = None
    if self.eval_lengths:  # The held-out retrieval tasks read text: a t5align vocabulary.
      vocab = vocabularies.load_vocabulary(','.join(files), what='MIXTURE_OR_TASK_NAME\'s '
                                           'vocabulary')
    return time.time(), vocab, files, data.start, initial

  def _train(self, start: float, vocab: Any, vocab_path: str | Sequence[str],
             batches_at: Any, initial: Any) -> dict[str, Any]:
    """The loop, export and held-out evaluation both kinds of run share; `batches_at(step)`:
    the batch iterator from a step; `initial`: the params to start from (None: from `seed`)."""
    cfg = self.model.config
    rng = jax.random.PRNGKey(self.seed)
    params = network.init_variables(cfg, rng)['params'] if initial is None else initial
    opt_state = self.optimizer.make(self.num_steps).init(params)
    (program,) = self.programs(cfg, None, params)
    log = functools.partial(train_log.append, self.model_dir)
    done = training.checkpoint_steps(self.model_dir)
    step = done[-1] if done else 0
    # Logged by a killed run after its last checkpoint.
    train_log.drop_steps_after(self.model_dir, step)
    if done:
      params, opt_state = training.restore_checkpoint(self.model_dir, step, cfg, opt_state)
      log({'event': 'resume', 'step': step})
    batches = batches_at(step)
    seqio_data = batches if isinstance(batches, training.SeqioBatches) else None
    counted = dict(seqio_data.trimmed) if seqio_data else {}
    if seqio_data and seqio_data.skipped and step < self.num_steps:
      t0 = time.time()  # The first batch reads the examples of the steps done first.
      batches = itertools.chain([next(batches)], batches)
      log({'event': 'skipped', 'step': step, 'examples': seqio_data.skipped,
           'skip_s': time.time() - t0})
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
        if seqio_data:  # Examples cut to the feature lengths since the last record.
          means.update({f'{k}_trimmed': v - counted[k] for k, v in seqio_data.trimmed.items()})
          counted = dict(seqio_data.trimmed)
        log({'step': step, **means, 'step_s': (time.time() - t0) / len(window)})
        window, t0 = [], time.time()
      if step % self.checkpoint_every == 0 or step == self.num_steps:
        if step not in training.checkpoint_steps(self.model_dir):
          training.save_checkpoint(self.model_dir, step, params, opt_state)
          training.prune(self.model_dir, self.keep_checkpoints)
    train_wall = time.time() - start

    if self.export_dir:
      training.export(params, vocab_path, self.export_dir, step, self.export_dtype)
    results: dict[str, Any] = {}
    for length in self.eval_lengths:
      results[str(length)] = heldout.retrieval_accuracy(
          self.model, params, vocab, length=length, num_examples=self.eval_examples,
          seed=self.eval_seed, batch_size=self.eval_batch_size)
      log({'event': 'eval', 'length': length, **results[str(length)]})
    # Covers earlier segments of a resumed run too.
    logged = training.logged_training(self.model_dir)
    summary = {'step': step, 'loss': logged['loss'], 'token_accuracy': logged['token_accuracy'],
               'eval': results, 'wall_s': train_wall, 'loop_s': logged['loop_s'],
               'eval_wall_s': time.time() - start - train_wall}
    if self.finetuning:
      summary['trimmed'] = training.logged_trimming(self.model_dir)
    if self.eval_lengths:
      fileio.write_json_atomic(os.path.join(self.model_dir, 'eval.json'), summary)
    if self.export_dir:
      # What the demo calibrates against (L_tr), and how the shipped weights were made.
      fileio.write_json_atomic(
          os.path.join(self.export_dir, 'training.json'), training.training_record(
              input_length=self.input_length, summary=summary, command=self.command),
          sort_keys=False)
    return summary


gin_cli.register_job(TrainJob)
