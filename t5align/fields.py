"""Settings fields that carry their check: every field of a settings object or job is declared
with `setting(default, check)`, and the object's `__post_init__` calls `check_fields(self)`, so a
value gin (or Python) gives is refused when the object is built, before anything loads, naming
the field in gin's form and the macro that set it:

  training.OptimizerConfig.clip_norm = -1.0 (--gin.CLIP_NORM): expected a positive number or
  None.

A check (`Check`) says in words what the field takes (`expected`) and returns the value it
stores (a list becomes a tuple, an int a float where the field is a float; nothing else is cast:
a string where a number goes is refused, not converted). tests/project/settings_fields_test.py
enumerates the fields of every settings object and fails on one declared without a check.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from t5align import gin_cli
from t5align import run_identity
from t5align.runtime import validate

CHECK = 'check'  # The metadata key of a field's `Check`.


class Refused(ValueError):
  """A check's refusal of a value; `check_fields` words the error around it."""


@dataclasses.dataclass(frozen=True)
class Check:
  """What a field takes: `expected` (the error's words, e.g. 'a positive integer') and
  `convert(value)`, which returns the value to store or raises `Refused` (its message, if any,
  says more than `expected`)."""

  expected: str
  convert: Callable[[Any], Any]

  def __call__(self, value: Any) -> Any:
    return self.convert(value)


def setting(default: Any = dataclasses.MISSING, *, check: Check,
            default_factory: Any = dataclasses.MISSING, unrecorded: str | None = None,
            metadata: Mapping[str, Any] | None = None) -> Any:
  """A dataclass field with its check (and, with `unrecorded`, the reason it is not part of a
  run's identity: `run_identity.NOT_IDENTITY`)."""
  meta = {CHECK: check, **(metadata or {})}
  if unrecorded is not None:
    meta[run_identity.NOT_IDENTITY] = unrecorded
  return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def check_fields(obj: Any) -> None:
  """Checks every field of the dataclass `obj` (built frozen or not) by its declared check,
  storing what the check returns; raises ValueError naming `obj.GIN_NAME.field`, the value, the
  macro that set it (the object's `field_macro(name)` if it has one, else the macro gin's
  configuration binds the field to, if any) and what the field takes. A field
  declared without a check is a TypeError (a programming error)."""
  gin_name = type(obj).GIN_NAME
  # An object held twice by a job (two checkpoints) says itself which flag set a field.
  field_macro = getattr(obj, 'field_macro', lambda name: None)
  for f in dataclasses.fields(obj):
    check = f.metadata.get(CHECK)
    if check is None:
      raise TypeError(f'{gin_name}.{f.name} is declared without a check (fields.setting).')
    value = getattr(obj, f.name)
    try:
      stored = check(value)
    except Refused as e:
      macro = field_macro(f.name) or gin_cli.macro_bound_to(gin_name, f.name)
      where = f'{gin_name}.{f.name} = {value!r}' + (f' (--gin.{macro})' if macro else '')
      raise ValueError(f'{where}: expected {check.expected}{f" ({e})" if str(e) else ""}.'
                       ) from None
    if stored is not value:
      object.__setattr__(obj, f.name, stored)


# -------------------------------------------------------------------------------- the checks


def _is_int(value: Any) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def integer(minimum: int | None = None, maximum: int | None = None) -> Check:
  """An int (no bool, float or text) in [minimum, maximum]."""
  if minimum == 1 and maximum is None:
    words = 'a positive integer'
  elif maximum is None:
    words = 'an integer' if minimum is None else f'an integer >= {minimum}'
  else:
    words = f'an integer from {minimum} to {maximum}'

  def convert(value):
    if not _is_int(value) or (minimum is not None and value < minimum) or (
        maximum is not None and value > maximum):
      raise Refused()
    return int(value)
  return Check(words, convert)


def number(minimum: float | None = None, *, above: bool = False,
           maximum: float | None = None) -> Check:
  """A finite real number (no bool or text), > `minimum` with `above`, else >= it, and <=
  `maximum`; stored as a float."""
  if minimum == 0 and above and maximum is None:
    words = 'a positive number'
  elif minimum is None:
    words = 'a finite number'
  else:
    words = f'a number {">" if above else ">="} {minimum:g}'
    if maximum is not None:
      words = f'a number in {"(" if above else "["}{minimum:g}, {maximum:g}]'

  def convert(value):
    if not _is_real(value) or not math.isfinite(value) or (
        minimum is not None and (value <= minimum if above else value < minimum)) or (
            maximum is not None and value > maximum):
      raise Refused()
    return float(value)
  return Check(words, convert)


def optional(check: Check, none: str = 'None') -> Check:
  """None, or what `check` takes (`none` says what None means, for the error's words)."""
  return Check(f'{check.expected} or {none}', lambda v: None if v is None else check(v))


def required(check: Check) -> Check:
  """Unset (None, or %gin.REQUIRED: the job's `check` names its macro, `gin_cli.require`) or
  what `check` takes."""
  return Check(check.expected, lambda v: v if gin_cli.is_unset(v) else check(v))


def boolean() -> Check:
  """True or False (not 'no', 0 or 1)."""
  def convert(value):
    if not isinstance(value, (bool, np.bool_)):
      raise Refused()
    return bool(value)
  return Check('True or False', convert)


def text(choices: Sequence[str] | None = None, *, blank: bool = True) -> Check:
  """A string, one of `choices` if given (not only spaces, unless `blank`)."""
  words = ('one of ' + ', '.join(repr(c) for c in choices) if choices is not None
           else 'a string' if blank else 'a non-blank string')

  def convert(value):
    if not isinstance(value, str) or (choices is not None and value not in choices) or (
        not blank and not value.strip()):
      raise Refused()
    return value
  return Check(words, convert)


def path() -> Check:
  """A path: a string or an os.PathLike (stored as given)."""
  def convert(value):
    if not isinstance(value, (str, os.PathLike)):
      raise Refused()
    return value
  return Check('a path (a string)', convert)


def integers(minimum: int, *, empty: bool = False) -> Check:
  """A tuple or list of ints (no bool, float or text) >= `minimum`, non-empty unless `empty`;
  stored as a tuple."""
  each = 'positive integers' if minimum == 1 else f'integers >= {minimum}'
  words = f'a {"" if empty else "non-empty "}tuple of {each}'

  def convert(values):
    if not isinstance(values, (tuple, list)) or not (values or empty):
      raise Refused()
    for v in values:
      if not _is_int(v) or v < minimum:
        raise Refused(f'{v!r} is not')
    return tuple(int(v) for v in values)
  return Check(words, convert)


def mapping(keys: Sequence[str] | None, value: Check) -> Check:
  """A dict from some of `keys` (None: any strings) to values `value` takes (stored as given if
  it holds)."""
  words = (f'a dict from strings to {value.expected}' if keys is None
           else f'a dict from some of {", ".join(keys)} to {value.expected}')

  def convert(mapping_):
    if not isinstance(mapping_, Mapping):
      raise Refused()
    for k, v in mapping_.items():
      if not isinstance(k, str) or (keys is not None and k not in keys):
        raise Refused(f'{k!r} is not one of them' if keys is not None else f'{k!r} is not one')
      try:
        value(v)
      except Refused:
        raise Refused(f'[{k!r}] = {v!r} is not {value.expected}') from None
    return mapping_
  return Check(words, convert)


def instance(kind: type | tuple[type, ...], words: str) -> Check:
  """An instance of `kind` (`words` names it as the user would give it)."""
  def convert(value):
    if not isinstance(value, kind):
      raise Refused()
    return value
  return Check(words, convert)


def dtype() -> Check:
  """A floating dtype's name ('float32', 'bfloat16', ...), as `validate.float_dtype` takes."""
  def convert(value):
    try:
      validate.float_dtype(value if isinstance(value, str) else None)
    except (TypeError, ValueError):
      raise Refused() from None
    return value
  return Check("a floating dtype's name ('float32' or 'bfloat16')", convert)


def temperature() -> Check:
  """A constant encoder temperature, as `validate.constant_temperature` takes: a number, a tuple
  (one per encoder layer) or equal-length tuples (`[layers][heads]`), each finite and > 0
  (stored as given: the run checks its layers against the model's)."""
  def convert(value):
    if any(isinstance(v, (str, bytes, bool, np.bool_)) for v in _leaves(value)):
      raise Refused()  # numpy would read '0.8' as a number, and True as 1.
    try:
      validate.constant_temperature(value, 'temperature')
    except ValueError:
      try:  # The form holds: name the first value that is not a temperature.
        bad = validate.bad_temperatures(np.asarray(value, np.float64).ravel())
      except (TypeError, ValueError):
        raise Refused() from None
      raise Refused(f'{float(bad[0])!r} is not' if bad.size else '') from None
    return value
  return Check(f'a temperature, {validate.TEMPERATURE_RANGE}: a number, a tuple (one per encoder '
               'layer) or a tuple of equal-length tuples (one per layer and head)', convert)


def _leaves(value: Any) -> list[Any]:
  """The values of nested tuples and lists (`value` itself if it is neither)."""
  if isinstance(value, (tuple, list)):
    return [leaf for v in value for leaf in _leaves(v)]
  return [value]


def by(words: str, check: Callable[[Any], Any]) -> Check:
  """A check made of a function that returns the value to store or raises ValueError or
  TypeError (e.g. a `validate` function); its message is kept, after `words`."""
  def convert(value):
    try:
      return check(value)
    except Refused:
      raise
    except (TypeError, ValueError) as e:
      raise Refused(str(e).rstrip('.')) from None
  return Check(words, convert)
