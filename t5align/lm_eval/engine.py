"""The lm-eval model's token work, on a mesh and in few shapes: each distinct context encoded once
and every continuation of it scored against that encoding (`Engine.score`), and greedy decoding
(`Engine.generate`).

Contexts run longest first, `batch_size` of them per call (rounded up to the mesh's 'data'
axis), padded to one of a few widths (`width`: 128 x 1, 2, 3, 4, 6, 8, 12, ..., each at most
1.5 times the one below); continuations are padded to power-of-two rows and lengths. So a run
compiles a few programs (`Engine.programs` counts them), each compiled once, checked against the
device's memory before it first runs (`memory.check_compiled`), then called for every batch of
its shape. Every process of a multi-process run calls the engine with the same requests; each
supplies its rows of a batch and gets every result back (`multihost.gather`).

Imports nothing of lm-eval: everything here is token arrays.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh
from tqdm import tqdm

from t5align.evaluation import scoring
from t5align import memory
from t5align import network
from t5align import partitioning
from t5align.runtime import batching
from t5align.runtime import multihost

WIDTH_MULTIPLE = 128
MIN_TARGET_WIDTH = 8
# Continuations scored per call against one batch of encodings (a power of two).
MAX_TARGET_ROWS = 64


def width(length: int) -> int:
  """The width a context of `length` tokens is padded to: the smallest 128 x 2^k or
  128 x 3 x 2^k that holds it (so padding adds at most half of the length)."""
  units = batching.ceil_div(max(int(length), 1), WIDTH_MULTIPLE)
  power = 1
  while power < units:
    if power >= 2 and power * 3 // 2 >= units:
      return WIDTH_MULTIPLE * power * 3 // 2
    power *= 2
  return WIDTH_MULTIPLE * power


def power_of_two(n: int, minimum: int = 1) -> int:
  """The smallest power of two >= max(n, minimum)."""
  out = 1
  while out < max(n, minimum):
    out *= 2
  return out


@dataclasses.dataclass
class Engine:
  """The model on its mesh, with the programs it has compiled.

  Attributes:
    model: the network (its config: the activation dtype and the attention implementation).
    params: its parameters, placed on `mesh` (`partitioning.param_shardings`).
    mesh: the ('data', 'model') mesh.
    batch_size: contexts per call, before rounding up to the 'data' axis.
    eos_id: the token that ends a generation.
    show_progress: draw progress bars (process 0 only).
    programs: {shape key: compiled program}, one per distinct shape run so far.
    calls: calls made of each program kind ('encode', 'score', 'greedy').
  """

  model: network.Transformer
  params: Any
  mesh: Mesh
  batch_size: int
  eos_id: int
  show_progress: bool = True
  programs: dict[tuple[Any, ...], Any] = dataclasses.field(default_factory=dict)
  calls: collections.Counter = dataclasses.field(default_factory=collections.Counter)

  @property
  def rows(self) -> int:
    """Contexts per call as compiled: `batch_size` rounded up to the 'data' axis."""
    return batching.round_up(self.batch_size, self.mesh.shape['data'])

  def _place(self, x: np.ndarray) -> jax.Array:
    """A global array of host array `x` (the whole batch, the same on every process), its rows
    over 'data': this process supplies its own."""
    sharding = partitioning.batch_sharding(self.mesh, x.ndim)
    mine = multihost.process_rows(sharding, x.shape[0])
    return multihost.global_batch(np.ascontiguousarray(x[mine]), sharding, x.shape[0])

  def _hints(self, length: int) -> list[str]:
    hints = [f'batch_size (now {self.batch_size}) lower',
             f"num_partitions (devices on the 'model' axis, now {self.mesh.shape['model']}) "
             'higher', 'max_length lower (longer contexts are cut to it)']
    if network.encoder_attention_impl(self.model.config, length) == 'reference':
      hints.insert(1, f"attention_impl='blockwise' (now 'reference' at {length} tokens)")
    return hints

  def _run(self, key: tuple[Any, ...], fn: Callable, args: tuple[Any, ...], what: str) -> Any:
    """`fn(*args)` through its compiled program for `key`: compiled and checked against the
    device's memory the first time (`memory.DoesNotFitError` names what to change)."""
    if key not in self.programs:
      compiled = fn.lower(*args).compile()
      memory.check_compiled(
          memory.Compiled.of(compiled, parameter_bytes=memory.per_device_bytes(args[0]),
                             input_bytes=memory.per_device_bytes(args[1:])),
          hints=self._hints(key[2]), what=what)
      self.programs[key] = compiled
    self.calls[key[0]] += 1
    return self.programs[key](*args)

  def _batches(self, contexts: Sequence[np.ndarray]) -> list[list[int]]:
    """Indices of `contexts`, longest first (ties in order), in batches of `batch_size`. With
    an encoder bias rule (resolved at the batch's width), a batch holds contexts of one `width`
    only, so that a context's rule is its own width's, whatever its batch-mates."""
    order = sorted(range(len(contexts)), key=lambda i: (-len(contexts[i]), i))
    if not self.model.config.has_bias_rule:
      return [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
    groups = collections.defaultdict(list)
    for i in order:
      groups[width(len(contexts[i]))].append(i)
    return [g[i:i + self.batch_size] for g in groups.values()
            for i in range(0, len(g), self.batch_size)]

  def _inputs(self, contexts: Sequence[np.ndarray], taus: np.ndarray,
              batch: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """int32 `[rows, width]` tokens and float32 `[rows, ...]` taus of a batch; the rows past it
    are all padding at tau 1."""
    w = width(len(contexts[batch[0]]))
    tokens = np.zeros((self.rows, w), np.int32)
    for r, i in enumerate(batch):
      tokens[r, :len(contexts[i])] = contexts[i]
    tau = np.ones((self.rows, *taus.shape[1:]), np.float32)
    tau[:len(batch)] = taus[list(batch)]
    return tokens, tau

  def _progress(self, total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, disable=not (self.show_progress and multihost.is_writer()))

  def score(self, contexts: Sequence[np.ndarray], taus: np.ndarray,
            targets: Sequence[tuple[int, Sequence[int]]], desc: str = 'loglikelihood'
            ) -> tuple[np.ndarray, np.ndarray]:
    """Log-likelihoods of continuations, teacher-forced, each context encoded once.

    Args:
      contexts: int token arrays (encoder inputs as given: nothing is cut here).
      taus: float32 `[len(contexts), 1 | layers (, heads)]`, each context's temperature.
      targets: (index into `contexts`, continuation tokens) per request.
      desc: the progress bar's label.

    Returns:
      float64 `[len(targets)]` summed log-likelihoods and bool `[len(targets)]`: whether greedy
      decoding would produce each continuation.
    """
    ll = np.zeros(len(targets), np.float64)
    greedy = np.zeros(len(targets), bool)
    by_context = collections.defaultdict(list)
    for j, (i, _) in enumerate(targets):
      by_context[i].append(j)
    encode = scoring.partitioned_encode(self.model, self.mesh)
    score = scoring.partitioned_score_encoded(self.model, self.mesh)
    data = self.mesh.shape['data']
    with self._progress(len(targets), desc) as bar:
      for batch in self._batches(contexts):
        tokens, tau = self._inputs(contexts, taus, batch)
        placed = self._place(tokens)
        encoded = self._run(('encode', self.rows, tokens.shape[1], tau.shape[1:]), encode,
                            (self.params, placed, self._place(tau)),
                            f'Encoding {tokens.shape[1]}-token contexts')
        jobs = [(r, j) for r, i in enumerate(batch) for j in by_context[i]]
        for start in range(0, len(jobs), MAX_TARGET_ROWS):
          chunk = jobs[start:start + MAX_TARGET_ROWS]
          n = batching.round_up(power_of_two(len(chunk)), data)
          t = power_of_two(max(len(targets[j][1]) for _, j in chunk), MIN_TARGET_WIDTH)
          rows = np.zeros(n, np.int32)
          continuations = np.zeros((n, t), np.int32)
          for k, (r, j) in enumerate(chunk):
            rows[k] = r
            continuations[k, :len(targets[j][1])] = targets[j][1]
          out = self._run(('score', self.rows, tokens.shape[1], n, t), score,
                          (self.params, encoded, placed, self._place(rows),
                           self._place(continuations)),
                          f'Scoring {t}-token continuations of {tokens.shape[1]}-token contexts')
          got_ll, got_greedy = (np.asarray(x) for x in multihost.gather(out))
          for k, (_, j) in enumerate(chunk):
            ll[j], greedy[j] = got_ll[k], got_greedy[k]
          bar.update(len(chunk))
    return ll, greedy

  def generate(self, contexts: Sequence[np.ndarray], taus: np.ndarray, steps: int,
               desc: str = 'generate_until') -> list[np.ndarray]:
    """Greedy decoding of `steps` tokens after each context (`decoding.greedy`: a row stops at
    its first EOS, which it keeps; later positions are 0).

    Args:
      contexts: int token arrays (encoder inputs as given).
      taus: float32 `[len(contexts), 1 | layers (, heads)]`.
      steps: decoded positions.
      desc: the progress bar's label.

    Returns:
      int32 `[steps]` tokens per context, in the order given.
    """
    out: list[np.ndarray] = [np.zeros(0, np.int32)] * len(contexts)
    fn = scoring.partitioned_greedy_decode(self.model, self.mesh, steps, self.eos_id)
    with self._progress(len(contexts), desc) as bar:
      for batch in self._batches(contexts):
        tokens, tau = self._inputs(contexts, taus, batch)
        decoded = self._run(('greedy', self.rows, tokens.shape[1], tau.shape[1:], steps), fn,
                            (self.params, self._place(tokens), self._place(tau)),
                            f'Greedy decoding of {steps} tokens after {tokens.shape[1]}-token '
                            'contexts')
        decoded = np.asarray(multihost.gather(decoded))
        for r, i in enumerate(batch):
          out[i] = decoded[r]
        bar.update(len(batch))
    return out

  def shapes(self) -> dict[str, list[list[Any]]]:
    """The programs compiled so far, by kind: their shape keys."""
    out: dict[str, list[list[Any]]] = {}
    for key in self.programs:
      out.setdefault(key[0], []).append([list(k) if isinstance(k, tuple) else k
                                         for k in key[1:]])
    return out
