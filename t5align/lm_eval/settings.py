"""The lm-eval model's arguments (`--model_args`): `ModelArgs`, each field checked where it is
declared, and the parse of lm-eval's keyword arguments into it (`ModelArgs.from_kwargs`).

lm-eval's `hf` names are kept where they mean the same thing (`pretrained`, `revision`,
`tokenizer`, `max_length`, `dtype`, `batch_size`, `max_batch_size`, `device`); `truncation`
names the side cut (hf's is a switch of the tokenizer's own truncation, which this model has no
use for). Imports nothing of lm-eval: the arguments are checked before anything is loaded.
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Mapping

from t5align.calibration import strategies as strategies_lib
from t5align.attention import dispatch
from t5align.attention import reference
from t5align.runtime import validate

TRUNCATION_SIDES = ('left', 'middle', 'right')
DTYPES = ('float32', 'bfloat16')
# hf arguments with no meaning here, and why (named in the refusal).
HF_ONLY = {
    'parallelize': 'the model is sharded over the device mesh: set num_partitions',
    'attn_implementation': "t5align's attention implementations are named by attention_impl",
    'add_bos_token': 'T5 has no BOS token',
    'trust_remote_code': 't5align runs its own T5, no remote code',
    'logits_cache': 'continuations that share a context always share its encoding',
    'softmax_dtype': 'the log-softmax is always float32',
}


def _positive_int(name: str, allow_none: bool = False) -> Callable[[Any], Any]:
  return lambda v: validate.positive_int(v, name, allow_none=allow_none)


def _choice(name: str, choices: tuple[str, ...], allow_none: bool = False
            ) -> Callable[[Any], Any]:
  def check(value):
    if value is None and allow_none:
      return None
    if value not in choices:
      raise ValueError(f'{name}={value!r}: expected one of {", ".join(choices)}.')
    return value
  return check


def _text(name: str) -> Callable[[Any], Any]:
  def check(value):
    if value is None:
      return None
    if not isinstance(value, str) or not value.strip():
      raise ValueError(f'{name}={value!r}: expected a path or a name (text).')
    return value
  return check


def _switch(name: str) -> Callable[[Any], Any]:
  def check(value):
    if not isinstance(value, bool):
      raise ValueError(f'{name}={value!r}: expected true or false.')
    return value
  return check


def _batch_size(value: Any) -> int:
  if isinstance(value, str) and value.startswith('auto'):
    raise ValueError(f"batch_size={value!r}: t5align takes a number of contexts per call (its "
                     'memory check refuses a batch that does not fit the device, naming the '
                     'settings that lower it); pass e.g. --batch_size 4.')
  if isinstance(value, str) and value.isdigit():  # lm-eval's --batch_size is text.
    value = int(value)
  return validate.positive_int(value, 'batch_size')


def _temperature(value: Any) -> Any:
  if value is None:
    return None
  # The layer and head counts are checked once the model is known (`temperature_setting`).
  validate.constant_temperature(value, 'temperature')
  return value


def _calibrate(value: Any) -> Any:
  if value is None:
    return None
  try:
    spec = strategies_lib.parse_name(value)
  except ValueError as e:
    raise ValueError(f'calibrate={value!r}: {e}') from None
  if spec.bias != 'none' or spec.base == strategies_lib.NONE:
    raise ValueError(f'calibrate={value!r}: the lm-eval model calibrates temperatures only; give '
                     'the bias rule as bias_rule= (its requests are encoded in batches of mixed '
                     'widths, one rule for all).')
  return value


def _bias_scale(value: Any) -> Any:
  if value is None:
    return None
  if isinstance(value, str):  # lm-eval's --model_args values are text.
    try:
      value = float(value)
    except ValueError:
      raise ValueError(f'bias_scale={value!r}: expected a number.') from None
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ValueError(f'bias_scale={value!r}: expected a number.')
  return float(value)


def _attention(value: Any) -> Any:
  if value not in dispatch.NAMES:
    raise ValueError(f'attention_impl={value!r}: expected one of '
                     f'{", ".join(sorted(dispatch.NAMES))}.')
  return value


def _setting(default: Any, check: Callable[[Any], Any], doc: str) -> Any:
  return dataclasses.field(default=default, metadata={'check': check, 'doc': doc})


@dataclasses.dataclass(frozen=True)
class ModelArgs:
  """What `--model_args` sets (and `T5AlignLM(**kwargs)` takes); every field is checked as the
  object is built, each error naming the argument."""

  pretrained: str | None = _setting(None, _text('pretrained'), (
      'a T5X (legacy or Orbax), HuggingFace or Mesh-TF checkpoint, local or gs://, or a '
      "HuggingFace hub id resolved through huggingface_hub's cache"))
  revision: str | None = _setting(None, _text('revision'), 'the hub revision of a hub id')
  tokenizer: str | None = _setting(None, _text('tokenizer'), (
      'an HF tokenizer folder or hub id, or a SentencePiece model; default: the checkpoint\'s '
      'own'))
  model: str | None = _setting(None, _text('model'), (
      'a gin/models file giving the architecture (default: read from the checkpoint)'))
  max_length: int | None = _setting(None, _positive_int('max_length', allow_none=True), (
      'encoder tokens kept of each context; unset: nothing is cut'))
  truncation: str = _setting('left', _choice('truncation', TRUNCATION_SIDES), (
      "the side a longer context is cut from: 'left' (lm-eval's: the last max_length tokens), "
      "'middle' (LongBench's: the first and last halves), 'right'"))
  dtype: str = _setting('float32', _choice('dtype', DTYPES), (
      'the parameters\' and the activations\' dtype'))
  batch_size: int = _setting(1, _batch_size, 'contexts per encoder call (rounded up to the '
                             "mesh's 'data' axis)")
  max_batch_size: int | None = _setting(None, _positive_int('max_batch_size', allow_none=True),
                                        "lm-eval's bound for batch_size='auto' (recorded)")
  device: str | None = _setting(None, _text('device'), (
      "lm-eval's device (recorded); t5align runs on JAX's devices (JAX_PLATFORMS)"))
  temperature: Any = _setting(None, _temperature, (
      'the encoder temperature: a number, one per layer, or [layers][heads]'))
  schedule: str | None = _setting(None, _text('schedule'), (
      "a schedule JSON of t5align.calibrate: each request's tau by its context's length"))
  schedule_strategy: str | None = _setting(None, _text('schedule_strategy'), (
      "the schedule's strategy applied (default: its own)"))
  schedule_task: str | None = _setting(None, _text('schedule_task'), (
      "the schedule's per-task entry to apply, or 'pooled' (default: the request's task's)"))
  schedule_other_checkpoint: bool = _setting(False, _switch('schedule_other_checkpoint'), (
      'apply a schedule calibrated on another checkpoint'))
  calibrate: str | None = _setting(None, _calibrate, (
      "a strategy, calibrated per length bucket on the requests' own contexts"))
  reference_length: int | None = _setting(None, _positive_int('reference_length',
                                                              allow_none=True),
                                          'L_tr, for calibrate and bias_rule')
  calibrate_samples: int = _setting(8, _positive_int('calibrate_samples'), (
      'contexts calibrated on per length bucket'))
  bias_rule: str = _setting('none', _choice('bias_rule', reference.BIAS_RULES), (
      "the encoder's relative-bias rule: 'interpolate' (offsets read as round(d * L_tr / L)) or "
      "'extend' (buckets over 128 * L / L_tr), L the batch's encoder width, L_tr "
      'reference_length'))
  bias_scale: float | None = _setting(None, _bias_scale, (
      "the rule's s or e at every width instead (then reference_length is not needed)"))
  attention_impl: str = _setting('auto', _attention, 'the encoder attention implementation')
  num_partitions: int = _setting(1, _positive_int('num_partitions'), (
      "devices along the mesh's 'model' axis"))

  def __post_init__(self):
    for field in dataclasses.fields(self):
      object.__setattr__(self, field.name, field.metadata['check'](getattr(self, field.name)))
    if self.pretrained is None:
      raise ValueError('pretrained is required: --model_args pretrained=CHECKPOINT (a T5X, '
                       'HuggingFace or Mesh-TF checkpoint, or a hub id).')
    given = [n for n in ('temperature', 'schedule', 'calibrate') if getattr(self, n) is not None]
    if len(given) > 1:
      raise ValueError(f'{" and ".join(given)} both set the temperature: give one.')
    for name, needs in (('schedule_strategy', 'schedule'), ('schedule_task', 'schedule'),
                        ('calibrate_samples', 'calibrate')):
      if getattr(self, name) != _default(name) and getattr(self, needs) is None:
        raise ValueError(f'{name} is read with {needs}= only; {needs} is not set.')
    if (self.reference_length is not None and self.calibrate is None
        and self.bias_rule == 'none'):
      raise ValueError('reference_length is read with calibrate= or bias_rule= only; neither is '
                       'set.')
    if self.bias_scale is not None and self.bias_rule == 'none':
      raise ValueError('bias_scale is read with bias_rule= only; bias_rule is not set.')
    # The rule itself checks its scale and L_tr (naming them).
    self.encoder_bias_rule()
    if self.schedule_other_checkpoint and self.schedule is None:
      raise ValueError('schedule_other_checkpoint is read with schedule= only; schedule is not '
                       'set.')
    if self.calibrate is not None and self.reference_length is None:
      raise ValueError(f'calibrate={self.calibrate} needs reference_length (L_tr, the length the '
                       'model was trained at: contexts up to it keep tau = 1 and every longer '
                       'bucket is aligned to it), e.g. reference_length=512.')
    if (self.calibrate is not None and self.max_length is not None
        and self.reference_length >= self.max_length):
      raise ValueError(f'reference_length={self.reference_length} is not below max_length='
                       f'{self.max_length}: contexts are cut to max_length, so none is longer '
                       'than L_tr and there is nothing to calibrate.')

  def encoder_bias_rule(self) -> reference.BiasRule:
    """The encoder's `reference.BiasRule` of bias_rule, bias_scale and reference_length."""
    if self.bias_rule == 'none':
      return reference.BiasRule()
    try:
      return reference.BiasRule(self.bias_rule, scale=self.bias_scale,
                                reference_length=self.reference_length)
    except ValueError as e:
      raise ValueError(f'bias_rule={self.bias_rule}: {e} (bias_scale=, reference_length=)'
                       ) from None

  @classmethod
  def from_kwargs(cls, kwargs: Mapping[str, Any]) -> ModelArgs:
    """The arguments lm-eval passes (`--model_args` plus its batch_size, max_batch_size and
    device); an unknown one is refused naming it, the nearest known names and, for hf's own
    arguments, why t5align has no such thing."""
    kwargs = dict(kwargs)
    backend = kwargs.pop('backend', 'seq2seq')  # hf's; the only one an encoder-decoder has.
    if backend != 'seq2seq':
      raise ValueError(f"backend={backend!r}: t5align's T5 is an encoder-decoder model, which "
                       "lm-eval's hf backend calls 'seq2seq'.")
    known = {f.name for f in dataclasses.fields(cls)}
    for name in kwargs:
      if name in known:
        continue
      if name in HF_ONLY:
        raise ValueError(f'model argument {name}={kwargs[name]!r} is an hf argument with no '
                         f'meaning here: {HF_ONLY[name]}.')
      close = difflib.get_close_matches(name, sorted(known), n=3)
      raise ValueError(f'unknown model argument {name!r}'
                       + (f' (did you mean {", ".join(close)}?)' if close else '')
                       + f'; the arguments are: {", ".join(sorted(known))}.')
    return cls(**kwargs)

  def record(self) -> dict[str, Any]:
    """The arguments that differ from their defaults, for lm-eval's results."""
    out = {}
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if value != field.default:
        out[field.name] = value
    return out


def _default(name: str) -> Any:
  return next(f.default for f in dataclasses.fields(ModelArgs) if f.name == name)
