"""Evaluation library (no seqio): resumable prediction logs, temperatures, partitioned decode and score.

`t5align.eval` feeds it seqio examples; everything here works on numpy token lists, so it is
tested without seqio. Files of a task folder:
  predictions.jsonl  one JSON record per example, keyed by 'index', appended batch by batch
                     (one write + fsync each); a torn last line from a kill is dropped on reopen.
  run.json           the settings the records were made with; a rerun must match them.
  metrics.json       written atomically once every example has a record.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from t5align import decoding
from t5align import network
from t5align import partitioning
# Imported here, not lazily: it registers a gin configurable, which gin refuses after its config
# is locked (t5x.eval locks it before the model first runs).
from t5align import fileio
from t5align import outputs
from t5align import validate
from t5align import schedule as schedule_lib

# ---------------------------------------------------------------------------------------------
# Files.


class PredictionLog:
  """Append-only JSONL of per-example records with a unique integer 'index'.

  Opening reads the records already there. A last line without its newline (the process died
  while writing it) is cut off, so its examples are simply redone. A duplicated index or a bad
  line elsewhere is corruption and raises, naming the file and line.
  """

  def __init__(self, path: str | os.PathLike[str]):
    self.path = os.fspath(path)
    self.records: dict[int, dict[str, Any]] = {}
    fileio.makedirs(fileio.dirname(self.path))
    raw = outputs.repair_jsonl(self.path)
    for number, line in enumerate(outputs.decode_lines(raw, self.path), start=1):
      try:
        record = json.loads(line)
        index = int(record['index'])
      except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f'{self.path}:{number}: not a prediction record ({e}).') from e
      if index in self.records:
        raise ValueError(f'{self.path}:{number}: index {index} recorded twice.')
      self.records[index] = record

  def __contains__(self, index: int) -> bool:
    return index in self.records

  def __len__(self) -> int:
    return len(self.records)

  def append(self, records: Sequence[Mapping[str, Any]]) -> None:
    """Adds records in one write and fsyncs; raises on an index already present."""
    lines = []
    for record in records:
      index = int(record['index'])
      if index in self.records:
        raise ValueError(f'{self.path}: index {index} is already recorded.')
      lines.append(json.dumps(record, ensure_ascii=False, sort_keys=True, allow_nan=True))
    if not lines:
      return
    if fileio.is_remote(self.path):  # Object stores cannot append: rewrite the whole object.
      old = [json.dumps(r, ensure_ascii=False, sort_keys=True, allow_nan=True)
             for r in self.records.values()]
      fileio.write_atomic(self.path, '\n'.join(old + lines) + '\n')
      for record in records:
        self.records[int(record['index'])] = dict(record)
      return
    with open(self.path, 'a', encoding='utf-8') as f:
      f.write('\n'.join(lines) + '\n')
      f.flush()
      os.fsync(f.fileno())
    for record in records:
      self.records[int(record['index'])] = dict(record)

  def ordered(self) -> list[dict[str, Any]]:
    return [self.records[i] for i in sorted(self.records)]


def check_run(folder: str | os.PathLike[str], settings: Mapping[str, Any]) -> None:
  """Writes run.json, or checks that an earlier run of this folder used the same settings.

  A run.json whose folder holds no result yet (no prediction record, no metrics.json: the run
  failed before its first batch) is replaced, so a corrected rerun is not refused.
  """
  path = fileio.join(folder, 'run.json')
  settings = json.loads(json.dumps(settings, sort_keys=True))
  predictions = fileio.join(folder, 'predictions.jsonl')
  has_results = fileio.exists(fileio.join(folder, 'metrics.json')) or (
      fileio.exists(predictions) and b'\n' in fileio.read_bytes(predictions))
  if fileio.exists(path) and has_results:
    before = outputs.read_json(path)
    diff = {k: (before.get(k), settings.get(k)) for k in sorted(set(before) | set(settings))
            if before.get(k) != settings.get(k)}
    if diff:
      raise ValueError(f'{folder} holds results of a different run; differing settings '
                       f'(before, now): {diff}. Use another output folder.')
    return
  fileio.write_json_atomic(path, settings)


# ---------------------------------------------------------------------------------------------
# Temperatures.

STRATEGY_LABELS = {'pmax': 'w/ P_max', 'entropy': 'w/ H', 'log_length': 'w/ log_Lex L_tr'}


@dataclasses.dataclass(frozen=True)
class Temperature:
  """The encoder temperature of a run: one constant, or a schedule giving one per example."""

  constant: float | tuple[float, ...] | None = None
  schedule: Any = None  # a t5align.schedule.TemperatureSchedule
  label: str = ''

  def __post_init__(self):
    if (self.constant is None) == (self.schedule is None):
      raise ValueError('give exactly one of a constant temperature and a schedule.')
    if not self.label:
      object.__setattr__(self, 'label', self.default_label())

  def default_label(self) -> str:
    if self.schedule is not None:
      strategy = self.schedule.strategy
      return STRATEGY_LABELS.get(strategy, f'w/ {strategy}')
    values = np.ravel(self.constant)
    if values.size > 1:
      return 'tau = (' + ', '.join(f'{v:g}' for v in values) + ')'
    return f'tau = {float(values[0]):g}'

  def taus(self, tokens: np.ndarray) -> np.ndarray:
    """float32 `[b, 1]` or `[b, layers]` temperatures for `[b, l]` encoder tokens."""
    if self.schedule is not None:
      taus = np.array(self.schedule.temperatures(tokens), np.float32)
      validate.temperatures(taus, f'schedule temperatures ({self.schedule.strategy})')
      return taus
    tau = np.asarray(self.constant, np.float32).reshape(1, -1)
    return np.repeat(tau, tokens.shape[0], axis=0)

  def describe(self) -> dict[str, Any]:
    """JSON-able settings for run.json and metrics.json."""
    if self.schedule is not None:
      return {'label': self.label, 'schedule_strategy': self.schedule.strategy,
              'schedule': self.schedule.to_dict()}
    return {'label': self.label, 'temperature': self.constant}


# ---------------------------------------------------------------------------------------------
# Batches.


def pad_tokens(rows: Sequence[Sequence[int]], multiple: int = 128,
               min_length: int = 1) -> np.ndarray:
  """int32 `[b, l]`, zero-padded; l is the longest row rounded up to `multiple` (fewer compiles)."""
  longest = max([len(r) for r in rows] + [min_length])
  length = int(math.ceil(longest / multiple) * multiple)
  out = np.zeros((len(rows), length), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def pad_batch(tokens: np.ndarray, size: int) -> np.ndarray:
  """Adds all-padding rows up to `size` (a multiple of the data axis); callers drop them."""
  if tokens.shape[0] >= size:
    return tokens
  return np.concatenate([tokens, np.zeros((size - tokens.shape[0], *tokens.shape[1:]),
                                          tokens.dtype)])


def strip_eos(row: Sequence[int], eos_id: int = 1) -> list[int]:
  """Tokens before the first EOS (and without padding zeros)."""
  out = []
  for t in row:
    if t == eos_id:
      break
    if t != 0:
      out.append(int(t))
  return out


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
  for start in range(0, len(items), size):
    yield items[start:start + size]


class Progress:
  """A one-line text progress bar on stderr: done/total, rate and time left."""

  def __init__(self, total: int, desc: str = '', done: int = 0, stream=None, width: int = 30):
    self.total, self.desc, self.done, self.width = total, desc, done, width
    self.stream = stream or sys.stderr
    self.start, self.start_done = time.monotonic(), done
    self._draw()

  def update(self, n: int) -> None:
    self.done += n
    self._draw()

  def _draw(self) -> None:
    frac = self.done / self.total if self.total else 1.0
    bar = '#' * int(frac * self.width)
    elapsed = time.monotonic() - self.start
    rate = (self.done - self.start_done) / elapsed if elapsed > 0 else 0.0
    left = (self.total - self.done) / rate if rate > 0 else float('nan')
    eta = f'{left:.0f}s left' if math.isfinite(left) else '--'
    self.stream.write(f'\r{self.desc} [{bar:<{self.width}}] {self.done}/{self.total} '
                      f'{rate:.2f} ex/s {eta}')
    self.stream.flush()

  def close(self) -> None:
    self.stream.write('\n')
    self.stream.flush()


# ---------------------------------------------------------------------------------------------
# Scoring (teacher forcing) and decoding, one device or partitioned over a ('data', 'model') mesh.


def score(model: network.Transformer, params: Any, inputs: jax.Array, targets: jax.Array,
          temperature: jax.Array | None = None) -> jax.Array:
  """Sum of target-token log-likelihoods per example (traceable; `score_batch` is its jit).

  Args:
    model: the Transformer.
    params: its 'params'.
    inputs: int `[b, k]` encoder tokens (0 = padding).
    targets: int `[b, l]` target tokens (0 = padding, not scored).
    temperature: encoder temperature, see `network.layer_temperatures`.

  Returns:
    float32 `[b]`.
  """
  # [b, l] -> [b, l]: decoder inputs are the targets shifted right, starting from 0.
  decoder_inputs = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  logits = model.apply({'params': params}, inputs, decoder_inputs, targets,
                       enable_dropout=False, temperature=temperature)
  # [b, l, vocab] -> [b, l]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  token_ll = jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return jnp.sum(jnp.where(targets > 0, token_ll, 0.0), axis=-1)


score_batch = jax.jit(score, static_argnames=('model',))


def _batch_shardings(mesh: Mesh, *ndims: int) -> tuple:
  return tuple(partitioning.batch_sharding(mesh, n) for n in ndims)


@functools.lru_cache(maxsize=32)
def partitioned_score(model: network.Transformer, mesh: Mesh) -> Callable:
  """`(params, inputs [b, k], targets [b, l], taus [b, 1|n]) -> [b]` on `mesh`.

  Parameters sharded over 'model' (`partitioning.param_shardings`), every batch argument and
  the result over 'data'; traced under the logical axis rules, so activations follow them.
  """
  return partitioning.partition(
      functools.partial(score, model), mesh,
      in_shardings=(partitioning.param_shardings(model.config, mesh),
                    *_batch_shardings(mesh, 2, 2, 2)),
      out_shardings=partitioning.batch_sharding(mesh, 1))


@functools.lru_cache(maxsize=32)
def partitioned_greedy_decode(model: network.Transformer, mesh: Mesh, max_decode_length: int,
                              eos_id: int) -> Callable:
  """`(params, inputs [b, k], taus [b, 1|n]) -> tokens [b, max_decode_length]` on `mesh`.

  `decoding.greedy` with the shardings of `partitioned_score`.
  """
  def fn(params, inputs, taus):
    return decoding.greedy(model, params, inputs, max_decode_length=max_decode_length,
                           eos_id=eos_id, temperature=taus)

  return partitioning.partition(
      fn, mesh, in_shardings=(partitioning.param_shardings(model.config, mesh),
                              *_batch_shardings(mesh, 2, 2)),
      out_shardings=partitioning.batch_sharding(mesh, 2))


# ---------------------------------------------------------------------------------------------
# The resumable loop.


def run_examples(examples: Sequence[Mapping[str, Any]], log: Any,
                 process: Callable[[Sequence[Mapping[str, Any]]], list[dict[str, Any]]], *,
                 batch_size: int, desc: str = '', show_progress: bool = True,
                 total: int | None = None,
                 collect: Callable[[list[Any]], list[Any]] = list) -> None:
  """Runs `process` on batches of the examples that `log` lacks and appends its records.

  Args:
    examples: dicts with an int 'index' (unique); with several processes, this one's share.
    log: where records go (`PredictionLog`, or anything with `in`, `len` and `append`);
      examples whose index it holds are skipped.
    process: batch of examples -> one record (with the same 'index') per example. With several
      processes every one calls it equally often; a process out of examples passes [].
    batch_size: examples per call.
    desc: progress label.
    show_progress: draw the progress bar.
    total: examples over all processes (default: len(examples)), for the progress bar.
    collect: this process's records -> every process's (`multihost.gather_json`); a record
      made by several processes (same index) is kept once.
  """
  todo = [e for e in examples if int(e['index']) not in log]
  total = len(examples) if total is None else total
  steps = max(collect([-(-len(todo) // batch_size)]))  # The same count on every process.
  progress = Progress(total, desc, len(log)) if show_progress else None
  for step in range(steps):
    batch = todo[step * batch_size:(step + 1) * batch_size]
    records = process(batch)
    if sorted(int(r['index']) for r in records) != sorted(int(e['index']) for e in batch):
      raise ValueError('process() must return one record per example, with its index.')
    unique = list({int(r['index']): r for r in reversed(collect(records))}.values())[::-1]
    log.append(sorted(unique, key=lambda r: int(r['index'])))
    if progress:
      progress.update(len(unique))
  if progress:
    progress.close()


def label_order(label: str) -> tuple[int, str]:
  """Row order of the paper's tables: tau = 1, P_max, H, log-length, then the rest."""
  order = ['tau = 1', STRATEGY_LABELS['pmax'], STRATEGY_LABELS['entropy'],
           STRATEGY_LABELS['log_length']]
  return (order.index(label), label) if label in order else (len(order), label)


def iter_metrics_files(folders: Iterable[str | os.PathLike[str]]) -> Iterator[str]:
  """metrics.json files under each folder (the folder itself may be a task folder)."""
  for folder in folders:
    for root, dirs, files in os.walk(os.fspath(folder)):
      dirs.sort()
      if 'metrics.json' in files:
        yield os.path.join(root, 'metrics.json')


# ---------------------------------------------------------------------------------------------
# A network with a schedule built in, for callers that cannot pass `temperature` (t5x.eval).


@functools.cache
def cached_schedule(path: str, strategy: str | None = None) -> schedule_lib.TemperatureSchedule:
  return schedule_lib.load_schedule(path, strategy)


class ScheduledTransformer(network.Transformer):
  """`network.Transformer` whose encoder temperature comes per example from a schedule file.

  For callers that never pass `temperature` (t5x's EncoderDecoderModel calls `encode(tokens)`):
  each row's tau is `schedule.temperatures(encoder_input_tokens)`, from its non-pad length.
  Parameters and signatures are the parent's; an explicit `temperature` still wins.
  """

  schedule_path: str | None = None
  schedule_strategy: str | None = None

  def encode(self, encoder_input_tokens, encoder_segment_ids=None, enable_dropout=True,
             temperature=None):
    if temperature is None and self.schedule_path:
      temperature = cached_schedule(self.schedule_path, self.schedule_strategy).temperatures(
          encoder_input_tokens)
    return super().encode(encoder_input_tokens, encoder_segment_ids=encoder_segment_ids,
                          enable_dropout=enable_dropout, temperature=temperature)
