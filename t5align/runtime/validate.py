"""Checks of values at the boundary (flags, files, loaded weights), one function per kind.

Each raises a `ValueError` naming the value, where it came from (flag, file, parameter) and what
is allowed. Everything here runs on the host, on concrete values, before anything enters jit: a
traced value cannot be checked, so callers validate before tracing.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

# The smallest temperature the float32 softmax can divide by without the logits overflowing for
# ordinary logit sizes: float32's smallest normal number (1e-50 is 0 in float32, 1e-40 is a
# subnormal whose reciprocal is inf).
_F32_TINY = float(np.finfo(np.float32).tiny)
# What a temperature is, in an error's words.
TEMPERATURE_RANGE = (f'finite and > 0, in float32 too (from {_F32_TINY:.3g} to '
                     f'{float(np.finfo(np.float32).max):.3g})')


def temperatures(values: Any, name: str = 'temperature') -> np.ndarray:
  """float64 array of `values`; raises unless every value is finite, > 0 and a normal float32.

  Traced values (inside jit) cannot be inspected and are returned as they are; check before
  tracing.
  """
  try:
    taus = np.asarray(values, dtype=np.float64)
  except Exception as e:  # pylint: disable=broad-except  (tracers raise several jax error types)
    if type(e).__module__.startswith('jax'):
      return values
    raise ValueError(f'{name} must be numbers; got {values!r}.') from e
  bad = bad_temperatures(taus)
  if bad.size:
    raise ValueError(f'{name} must be {TEMPERATURE_RANGE}; got '
                     f'{bad.tolist()}' + (f' in {taus.tolist()}' if taus.size > 1 else '') + '.')
  return taus


def bad_temperatures(taus: np.ndarray) -> np.ndarray:
  """The values of float64 `taus` that are not temperatures (`TEMPERATURE_RANGE`), flat."""
  with np.errstate(over='ignore'):
    as_f32 = taus.astype(np.float32)  # inf where float32 overflows.
  return taus[~(np.isfinite(taus) & (taus > 0) & np.isfinite(as_f32) & (as_f32 >= _F32_TINY))]


def temperature_array(values: Any, name: str = 'temperatures') -> np.ndarray:
  """float64 `[t]`, `[t, layers]` or `[t, layers, heads]` candidate temperatures (a scalar
  becomes `[1]`); ValueError unless non-empty, at most 3-D and valid per `temperatures`."""
  taus = np.asarray(values, dtype=np.float64)
  if taus.ndim == 0:
    taus = taus[None]
  if taus.ndim > 3 or taus.shape[0] == 0:
    raise ValueError(f'{name} must be a non-empty [t], [t, layers] or [t, layers, heads] array; '
                     f'got shape {taus.shape}.')
  return temperatures(taus, name)


def constant_temperature(value: Any, name: str) -> float | tuple[float, ...] | tuple[
    tuple[float, ...], ...]:
  """A run's constant temperature as a hashable value: a float, a tuple (one per layer) or a
  tuple of equal-length tuples (`[layers][heads]`); ValueError naming `name` for anything else
  (ragged or deeper nesting, or values rejected by `temperatures`)."""
  shapes = 'a float, a tuple of floats (one per layer) or a tuple of equal-length tuples ' \
      '(one per layer and head)'
  if isinstance(value, (list, tuple)) and any(isinstance(v, (list, tuple)) for v in value):
    if not all(isinstance(v, (list, tuple)) for v in value) or len({len(v) for v in value}) != 1 \
        or any(isinstance(x, (list, tuple)) for v in value for x in v):
      raise ValueError(f'{name}={value!r} is not {shapes}.')
  try:
    taus = np.asarray(value, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise ValueError(f'{name}={value!r} is not {shapes}.') from e
  if taus.ndim > 2 or 0 in taus.shape:
    raise ValueError(f'{name}={value!r} is not {shapes}.')
  temperatures(taus, name)
  if taus.ndim == 0:
    return float(taus)
  return tuple(taus.tolist()) if taus.ndim == 1 else tuple(tuple(row) for row in taus.tolist())


def float_dtype(dtype: Any, name: str = 'dtype') -> np.dtype:
  """`np.dtype(dtype)` if it is a floating type (float16/32/64, bfloat16), else ValueError."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top  (bfloat16's numpy type)
  try:
    out = jnp.dtype(dtype)
  except TypeError as e:
    raise ValueError(f'{name}={dtype!r} is not a dtype; use float32 or bfloat16.') from e
  if not jnp.issubdtype(out, jnp.floating):
    raise ValueError(f'{name}={dtype!r} is not a floating dtype; the model needs floating '
                     'parameters (float32 or bfloat16).')
  return out


def positive_int(value: Any, name: str, *, allow_none: bool = False,
                 minimum: int = 1) -> int | None:
  """`value` as an int >= `minimum` (None passes with `allow_none`); bools, floats, text raise."""
  if value is None and allow_none:
    return None
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    kind = 'a positive integer' if minimum == 1 else f'an integer >= {minimum}'
    raise ValueError(f'{name} must be {kind}; got {value!r}.')
  return int(value)


def int_tuple(values: Any, name: str, *, minimum: int, why: str = '',
              example: str = '(1, 2)') -> tuple[int, ...]:
  """A non-empty tuple or list of ints >= `minimum` (`why` says where the bound comes from)."""
  if not isinstance(values, (tuple, list)) or not values:
    raise ValueError(f'{name}={values!r}: expected a tuple of integers, e.g. {name}={example}.')
  for value in values:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
      raise ValueError(f'{name}={tuple(values)!r}: {value!r} is not an integer >= {minimum}'
                       f'{f" ({why})" if why else ""}.')
  return tuple(int(v) for v in values)


def strategy_names(values: Any, name: str, known: Sequence[str],
                   parse: Callable[[str], Any] | None = None) -> tuple[str, ...]:
  """A non-empty tuple or list of distinct names out of `known`, or that `parse` takes (it
  raises ValueError saying why not: `calibration.parse_name`, names with options)."""
  if not isinstance(values, (tuple, list)) or not values:
    raise ValueError(f'{name}={values!r}: expected a tuple of strategy names, e.g. '
                     f"{name}=('{known[0]}',); known: {', '.join(known)}.")
  for value in values:
    if parse is not None and value not in known:
      try:
        parse(value)
      except ValueError as e:
        raise ValueError(f'{name}={tuple(values)!r}: {e}') from None
    elif value not in known:
      raise ValueError(f'{name}={tuple(values)!r}: {value!r} is not a strategy; known: '
                       f'{", ".join(known)}.')
  if len(set(values)) != len(values):
    raise ValueError(f'{name}={tuple(values)!r} names a strategy twice.')
  return tuple(values)


def temperature_setting(value: Any, name: str, num_layers: int, model: str,
                        num_heads: int | None = None) -> Any:
  """A constant temperature: a number, one per encoder layer of `model` (e.g. the checkpoint it
  names), or `[num_layers][num_heads]` (a tuple of tuples: one per layer and head); text, other
  lengths and values `temperatures` refuses raise. Returned as `constant_temperature` does."""
  number = lambda v: isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(
      v, bool)
  nested = isinstance(value, (list, tuple)) and any(isinstance(v, (list, tuple)) for v in value)
  if isinstance(value, (list, tuple)) and not nested:
    if len(value) not in (1, num_layers) or not all(number(v) for v in value):
      raise ValueError(
          f'{name}={tuple(value)!r}: give one temperature, or {num_layers} numbers (one per '
          f'encoder layer of {model}, which has {num_layers}); got {len(value)} values.')
  elif not nested and not number(value):
    raise ValueError(f'{name}={value!r} is not a temperature: give a number (e.g. {name}=0.8) '
                     f'or a tuple of {num_layers}, one per encoder layer of {model}.')
  out = constant_temperature(value, name)
  shape = np.shape(out)
  if len(shape) == 2 and shape != (num_layers, num_heads or shape[1]):
    raise ValueError(
        f'{name}: {shape[0]} tuples of {shape[1]} (one per layer and head), but {model} has '
        f'{num_layers} encoder layers of {num_heads} heads.')
  return out


def vocabulary_fits(vocab_size: int, embedding_rows: int, *, vocabulary: str,
                    model: str) -> None:
  """Raises unless every id of a `vocab_size`-piece vocabulary has an embedding row of `model`
  (e.g. 'checkpoint PATH'); `vocabulary` names the tokenizer (its flag or file)."""
  if int(vocab_size) > int(embedding_rows):
    raise ValueError(
        f'{vocabulary} has {vocab_size} pieces but {model} embeds {embedding_rows} ids: ids '
        f'{embedding_rows}..{vocab_size - 1} would have no embedding row. Use the vocabulary '
        'the model was trained with.')


def token_ids(tokens: Any, vocab_size: int, where: str) -> None:
  """Raises unless every token id of `tokens` is in 0..vocab_size-1."""
  tokens = np.asarray(tokens)
  if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
    bad = tokens[(tokens < 0) | (tokens >= vocab_size)]
    raise ValueError(f'{where}: token ids {sorted(set(bad.tolist()))[:5]} are outside the '
                     f"model's 0..{vocab_size - 1}; the tokenizer does not belong to this model.")


def nonfinite_count(array: Any) -> int:
  """How many NaN / inf values a host array holds (integer arrays: 0)."""
  array = np.asarray(array)
  if array.dtype.kind in 'iub':
    return 0
  if array.ndim == 0:
    array = array.reshape(1)
  # Blocks of rows of about 2**20 values: the temporaries stay small whatever the array's size
  # (a sharded load counts each slice as it reads it, and must not double its memory).
  step = max(1, 2**20 // max(1, array[0].size))
  count = 0
  for start in range(0, array.shape[0], step):
    block = array[start:start + step]
    try:
      finite = np.isfinite(block)
    except TypeError:  # A dtype numpy's isfinite lacks: compare in float32.
      finite = np.isfinite(block.astype(np.float32))
    count += int(block.size - np.count_nonzero(finite))
  return count


def finite_params(params: Mapping[str, Any], source: str,
                  counts: Mapping[str, int] | None = None) -> None:
  """Raises ValueError naming every parameter of `source` that holds NaN or inf (and how many).

  Args:
    params: the params tree (host arrays, or `jax.Array`s, which are copied to host one at a
      time: give `counts` instead for sharded arrays).
    source: the checkpoint, for the message.
    counts: non-finite counts per '/'-joined parameter path, already taken (e.g. per slice
      while a sharded load read them); then `params` is not read.
  """
  import jax  # pylint: disable=g-import-not-at-top
  leaves = {'/'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
  if counts is None:
    counts = {name: nonfinite_count(jax.device_get(leaf)) for name, leaf in leaves.items()}
  bad = [f'{name} ({count} of {int(np.prod(np.shape(leaves[name])))} values)'
         for name, count in counts.items() if count]
  if bad:
    raise ValueError(f'checkpoint {source} has non-finite values (NaN or inf) in '
                     f'{len(bad)} parameter(s): {"; ".join(bad[:10])}'
                     + (' ...' if len(bad) > 10 else '') +
                     '. The file is corrupt or was written from a diverged run; pass '
                     'check_finite=False to load it anyway.')


def schedule_lengths(lengths: Any, reference_length: Any, where: str) -> None:
  """Raises unless L_tr is a positive int and every calibrated length is an int >= L_tr."""
  if isinstance(reference_length, bool) or not isinstance(reference_length, int) \
      or reference_length < 1:
    raise ValueError(f'{where}: reference_length must be a positive integer; got '
                     f'{reference_length!r}.')
  for length in lengths:
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) \
        or not math.isfinite(length) or length < reference_length:
      raise ValueError(f'{where}: calibrated length {length!r} is not an integer >= '
                       f'reference_length (L_tr = {reference_length}); a schedule holds lengths '
                       'at or beyond its training length.')
