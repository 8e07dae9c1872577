"""Registers every `seqio_tasks.catalog` spec as a seqio Task `t5align_*`, plus mixtures.

Vocabulary: the tokenizer at `vocabulary_path()`: the gin binding
`seqio_tasks.vocabulary_path.path = '...'`, else $T5ALIGN_VOCABULARY, else T5's (the same file as
the t5x model gins' VOCABULARY, so t5x's vocabulary check passes). A SentencePiece model, or a
HuggingFace tokenizer (a tokenizer.json, a folder with one or with BPE vocab.json + merges.txt, or
'vocab.json,merges.txt': CodeT5+), through `t5align.vocabularies`; EOS is the tokenizer's. It is
resolved when first used, after gin has parsed, so a binding anywhere in the gin files applies.

Each task has its spec's splits: 'test' (the ZeroSCROLLS tasks: 'validation' and 'test'). Its
examples are built when the dataset is first requested; a missing data file raises there
(FileNotFoundError saying where to get it), never an empty task. Features: 'inputs' and 'targets'
(tokens, EOS appended), '*_pretokenized' text, 'id', and 'meta' (JSON with what the metrics
need). Pre-tokenized tasks (`spec.tokenized`: the LM and ZeroSCROLLS tasks) pass their tokens
through untrimmed, and any '*_pretokenized' text their examples hold.

SCROLLS: the catalog's evaluation tasks `t5align_scrolls_{config}_{L}` ('validation', 'test'),
and the fine-tuning tasks `t5align_scrolls_{config}` ('train', 'validation', 'test', over TFDS)
with their mixture `t5align_scrolls`, registered by `seqio_tasks.scrolls.register`.
"""
from __future__ import annotations

import os

import gin
import seqio
import tensorflow as tf

from seqio_tasks import catalog
from seqio_tasks import metrics
from seqio_tasks import scrolls
from seqio_tasks import suite
from t5align import vocabularies

T5_VOCABULARY = 'gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model'
ENV_VOCABULARY = 'T5ALIGN_VOCABULARY'
# The settings that give the vocabulary, as its errors name them.
WHAT = 'vocabulary (seqio_tasks.vocabulary_path.path or $T5ALIGN_VOCABULARY)'


@gin.configurable(module='seqio_tasks')
def vocabulary_path(path: str | None = None) -> str:
  """The SentencePiece model file: gin binding, then $T5ALIGN_VOCABULARY, then T5's."""
  return path or os.environ.get(ENV_VOCABULARY) or T5_VOCABULARY


def _is_sentencepiece(path: str) -> bool:
  return not (path.endswith('.json') or ',' in path or os.path.isdir(path))


class ConfiguredVocabulary(seqio.SentencePieceVocabulary):  # pylint: disable=protected-access
  """A SentencePieceVocabulary whose file is `vocabulary_path()` at the time of use; a HuggingFace
  tokenizer path makes every method delegate to `vocabularies.as_seqio` of it instead."""

  def __init__(self):
    super().__init__(T5_VOCABULARY)
    self._other_path, self._other = None, None

  def _delegate(self) -> seqio.Vocabulary | None:
    path = vocabulary_path()
    if _is_sentencepiece(path):
      return None
    if path != getattr(self, '_other_path', None):
      self._other = vocabularies.as_seqio(vocabularies.load_vocabulary(path, what=WHAT))
      self._other_path = path
    return self._other

  @property
  def eos_id(self):
    other = self._delegate()
    return super().eos_id if other is None else other.eos_id

  @property
  def unk_id(self):
    other = self._delegate()
    return super().unk_id if other is None else other.unk_id

  @property
  def pad_id(self):
    other = self._delegate()
    return super().pad_id if other is None else other.pad_id

  @property
  def _base_vocab_size(self):
    other = self._delegate()
    return super()._base_vocab_size if other is None else other._base_vocab_size

  def _encode(self, s):
    other = self._delegate()
    return super()._encode(s) if other is None else other._encode(s)

  def _decode(self, ids):
    other = self._delegate()
    return super()._decode(ids) if other is None else other._decode(ids)

  def _encode_tf(self, s):
    other = self._delegate()
    return super()._encode_tf(s) if other is None else other._encode_tf(s)

  def _decode_tf(self, ids):
    other = self._delegate()
    return super()._decode_tf(ids) if other is None else other._decode_tf(ids)

  def _sync(self) -> None:
    path = vocabulary_path()
    if path != self._sentencepiece_model_file:
      if '://' not in path and os.path.lexists(path):  # Named here; seqio's reader names none.
        vocabularies.SentencePieceVocabulary(path, what=WHAT)
      self._sentencepiece_model_file = path
      self._model = None

  def _model_context(self):
    self._sync()
    return super()._model_context()

  @property
  def sentencepiece_model_file(self) -> str:
    self._sync()
    return self._sentencepiece_model_file

  def __getstate__(self):
    self._sync()
    state = super().__getstate__()
    for key in ('_other_path', '_other'):  # A cache; not part of the vocabulary's identity.
      state.pop(key, None)
    return state

  # NOTE: equality and hash both follow `vocabulary_path()` at the time of the call, so a
  # ConfiguredVocabulary used as a dict key must not outlive a change of $T5ALIGN_VOCABULARY.
  def __eq__(self, other):
    if isinstance(other, ConfiguredVocabulary):
      other = other._delegate() or other
    mine = self._delegate()
    if mine is not None:
      return mine == other
    if not isinstance(other, seqio.SentencePieceVocabulary):
      return False
    return self.__getstate__() == other.__getstate__()

  def __hash__(self):
    """From the state `__eq__` compares: the delegate's hash, else the SentencePiece state's."""
    mine = self._delegate()
    if mine is not None:
      return hash(mine)
    state = self.__getstate__()
    # The normalizer override is a proto (unhashable): hashed by its bytes.
    return hash(tuple(sorted(
        (k, v.SerializeToString(deterministic=True) if hasattr(v, 'SerializeToString') else v)
        for k, v in state.items())))


VOCABULARY = ConfiguredVocabulary()


class _Tokenizer(suite.Tokenizer):

  def __init__(self, vocabulary: seqio.Vocabulary):
    self._vocabulary = vocabulary

  @property
  def eos_id(self) -> int:
    return self._vocabulary.eos_id

  def encode(self, text: str):
    return self._vocabulary.encode(text)


def _signature(spec: catalog.TaskSpec, example: dict) -> dict[str, tf.TensorSpec]:
  text = tf.TensorSpec([], tf.string)
  io = tf.TensorSpec([None], tf.int32) if spec.tokenized else text
  # A pre-tokenized example's text, as seqio's tokenize preprocessor keeps it for the others.
  given = {k: text for k in example if spec.tokenized and k.endswith('_pretokenized')}
  return {'id': text, 'inputs': io, 'targets': io, 'meta': text, **given}


def _dataset_fn(spec: catalog.TaskSpec):
  def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
    del shuffle_files, seed  # Examples are seeded per index; order is fixed.
    # Built eagerly so that a bad file fails here, naming the file and line.
    examples = list(spec.examples(_Tokenizer(VOCABULARY), split))
    if not examples:
      raise ValueError(f'{spec.task_name}: its source produced no examples.')
    return tf.data.Dataset.from_generator(lambda: iter(examples),
                                          output_signature=_signature(spec, examples[0]))
  return dataset_fn


def output_features(tokenized: bool = False) -> dict[str, seqio.Feature]:
  # Prefix-LM targets are a cut continuation: no EOS to score at its end.
  return {'inputs': seqio.Feature(VOCABULARY, add_eos=True),
          'targets': seqio.Feature(VOCABULARY, add_eos=not tokenized)}


def register() -> None:
  """Adds every catalog task and mixture that is not registered yet."""
  present = set(seqio.TaskRegistry.names())
  for name, spec in catalog.SPECS.items():
    if name in present:
      continue
    preprocessors = [] if spec.tokenized else [seqio.preprocessors.tokenize,
                                               seqio.preprocessors.append_eos_after_trim]
    seqio.TaskRegistry.add(
        name,
        source=seqio.FunctionDataSource(_dataset_fn(spec), splits=list(spec.splits)),
        preprocessors=preprocessors,
        output_features=output_features(spec.tokenized),
        postprocess_fn=metrics.postprocess,
        metric_fns=[metrics.make_metric_fn(spec.family)],
        shuffle_buffer_size=None)
  present = set(seqio.MixtureRegistry.names())
  for name, tasks in catalog.MIXTURES.items():
    if name not in present:
      seqio.MixtureRegistry.add(name, list(tasks), default_rate=1.0)


register()
# SCROLLS' fine-tuning tasks (TFDS `scrolls`) and their mixture: `seqio_tasks.scrolls`.
scrolls.register(output_features())
