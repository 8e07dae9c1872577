"""Tokenizers behind one interface: SentencePiece (T5, Flan-T5) and HuggingFace `tokenizers`
(byte-level BPE: CodeT5 / CodeT5+), with EOS and padding ids read from the vocabulary.

    vocab = load_vocabulary('/path/sentencepiece.model')          # SentencePiece
    vocab = load_vocabulary('/path/codet5p-770m/tokenizer.json')  # HF tokenizer file
    vocab = load_vocabulary('/path/codet5p-770m')                 # folder: tokenizer.json, or
                                                                  # vocab.json + merges.txt
    ids = vocab.encode('def f():')        # no EOS; callers append vocab.eos_id
    text = vocab.decode(ids)                # up to the first EOS, padding dropped

`as_seqio(vocab)` wraps one as a `seqio.Vocabulary`, so seqio tasks and t5x can use it (seqio is
imported there only). `train_sentencepiece` trains the shipped model's vocabulary.
"""
from __future__ import annotations

import io
import os
from typing import Any, Iterable, Sequence

from t5align.runtime import fileio

# T5's SentencePiece ids (`SentencePieceVocabulary(path, t5_ids=True)` checks a model has them).
PAD_ID = 0
EOS_ID = 1
UNK_ID = 2

# CodeT5's special tokens (RoBERTa-style byte-level BPE): <s> = 1, </s> = 2, <pad> = 0, <unk> = 3.
HF_EOS_TOKENS = ('</s>', '<|endoftext|>', '<eos>')
HF_PAD_TOKENS = ('<pad>',)
HF_UNK_TOKENS = ('<unk>',)

# What errors call a vocabulary path whose caller names no setting: the settings that give one.
DEFAULT_WHAT = 'vocabulary (VOCABULARY_PATH, $T5ALIGN_VOCABULARY or seqio_tasks.vocabulary_path)'
FORMS = ('A vocabulary is a SentencePiece model (*.model), a HuggingFace tokenizer.json, or a '
         "folder with tokenizer.json or vocab.json + merges.txt (or 'vocab.json,merges.txt').")


def _read_file(path: str, what: str) -> bytes:
  """The bytes of vocabulary file `path` (`fileio.read_input`: a regular file, size-bounded,
  checked before it is opened). A missing file raises FileNotFoundError; one that is not a
  regular file, or is empty, ValueError; each names `what` (the setting), the file and `FORMS`."""
  if not os.path.lexists(path):
    raise FileNotFoundError(f'{what} {path} does not exist. {FORMS}')
  try:
    data = fileio.read_input(path, what)
  except ValueError as e:
    raise ValueError(f'{e} {FORMS}') from e
  if not data:
    raise ValueError(f'{what} {path} is empty. {FORMS}')
  return data


class Vocabulary:
  """What t5align needs from a tokenizer. Ids of `encode` never include EOS; `decode` reads ids
  as a model writes them (up to EOS, padded, from embedding rows rounded up past the vocabulary).
  """

  path: str
  eos_id: int
  pad_id: int
  unk_id: int | None
  vocab_size: int

  def encode(self, text: str) -> list[int]:
    raise NotImplementedError

  def decode(self, ids: Sequence[int]) -> str:
    """The text of `ids` up to the first EOS; padding is dropped, and ids past the vocabulary (a
    model's embedding rows are rounded up, e.g. to 1024) read as unk.

    Raises:
      ValueError: an id past the vocabulary, and the vocabulary has no unk piece.
    """
    out = []
    for i in ids:
      i = int(i)
      if i == self.eos_id:
        break
      if i == self.pad_id:
        continue
      if i >= self.vocab_size:
        if self.unk_id is None:
          raise ValueError(f'id {i} is past the {self.vocab_size} pieces of {self.path}, which '
                           'has no unk piece to read it as.')
        i = self.unk_id
      out.append(i)
    return self._decode(out)

  def _decode(self, ids: list[int]) -> str:
    """The text of `ids`, all within the vocabulary, with no EOS or padding."""
    raise NotImplementedError

  def __repr__(self) -> str:
    return (f'{type(self).__name__}({self.path!r}, vocab_size={self.vocab_size}, '
            f'eos_id={self.eos_id}, pad_id={self.pad_id})')


class SentencePieceVocabulary(Vocabulary):
  """A SentencePiece model file (T5's: pad 0, EOS 1, UNK 2; `t5_ids=True` refuses others).

  A missing file raises FileNotFoundError; one that is not a regular file, is empty or is no
  SentencePiece model raises ValueError, each naming `what` (the setting that gave the path).
  """

  def __init__(self, path: str, *, t5_ids: bool = False, what: str = DEFAULT_WHAT):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self.path = str(path)
    data = _read_file(self.path, what)
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=data)
    except RuntimeError as e:  # sentencepiece's parse error names no file.
      raise ValueError(f'{what} {self.path} is not a SentencePiece model (it does not parse as '
                       f'one). {FORMS}') from e
    self.eos_id = int(self._sp.eos_id())
    if self.eos_id < 0:
      raise ValueError(f'SentencePiece model {path} defines no EOS piece.')
    pad = int(self._sp.pad_id())
    self.pad_id = pad if pad >= 0 else 0
    unk = int(self._sp.unk_id())
    self.unk_id = unk if unk >= 0 else None
    self.vocab_size = int(self._sp.get_piece_size())
    ids = (int(self._sp.pad_id()), self.eos_id, unk)
    if t5_ids and ids != (PAD_ID, EOS_ID, UNK_ID):
      raise ValueError(f'{self.path}: (pad, eos, unk) ids are {ids}; T5 needs '
                       f'{(PAD_ID, EOS_ID, UNK_ID)}.')

  def encode(self, text: str) -> list[int]:
    return list(self._sp.encode(text))

  def _decode(self, ids: list[int]) -> str:
    return self._sp.decode(ids)


class HuggingFaceVocabulary(Vocabulary):
  """A HuggingFace `tokenizers` tokenizer: a tokenizer.json, or byte-level BPE vocab + merges.

  EOS / pad / unk are the ids of the first of `HF_EOS_TOKENS` / `HF_PAD_TOKENS` /
  `HF_UNK_TOKENS` (or the given names) the vocabulary has; a missing EOS or pad is an error.
  Encoding adds no special tokens (no <s>, no </s>): the caller appends `eos_id`, as T5 does.
  A missing file raises FileNotFoundError; one that is not a regular file, is empty or does not
  parse raises ValueError, each naming `what` (the setting that gave the path).
  """

  def __init__(self, tokenizer_json: str | None = None, *, vocab_json: str | None = None,
               merges_txt: str | None = None, eos_token: str | None = None,
               pad_token: str | None = None, what: str = DEFAULT_WHAT):
    from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
    from tokenizers import decoders, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
    if (tokenizer_json is None) == (vocab_json is None or merges_txt is None):
      raise ValueError('give a tokenizer.json, or vocab.json and merges.txt.')
    if tokenizer_json is not None:
      self.path = str(tokenizer_json)
      data = _read_file(self.path, what)
      try:
        self._tok = Tokenizer.from_str(data.decode('utf-8'))
      except Exception as e:  # pylint: disable=broad-except  (tokenizers raises bare Exception)
        raise ValueError(f'{what} {self.path} is not a HuggingFace tokenizer.json ({e}). '
                         f'{FORMS}') from e
    else:
      self.path = f'{vocab_json},{merges_txt}'
      for f in (vocab_json, merges_txt):
        _read_file(f, what)
      try:
        bpe = models.BPE.from_file(vocab_json, merges_txt)
      except Exception as e:  # pylint: disable=broad-except  (tokenizers raises bare Exception)
        raise ValueError(f'{what} {self.path}: not a BPE vocab.json + merges.txt ({e}). '
                         f'{FORMS}') from e
      tok = Tokenizer(bpe)
      tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
      tok.decoder = decoders.ByteLevel()
      # vocab.json holds the special tokens as plain entries: mark them special (as CodeT5's
      # RobertaTokenizer does), so encoding never splits them and decoding drops them.
      tok.add_special_tokens([t for t in (*HF_PAD_TOKENS, '<s>', *HF_EOS_TOKENS, *HF_UNK_TOKENS,
                                          '<mask>') if tok.token_to_id(t) is not None])
      self._tok = tok
    self.eos_id = self._special(HF_EOS_TOKENS if eos_token is None else (eos_token,), 'EOS')
    self.pad_id = self._special(HF_PAD_TOKENS if pad_token is None else (pad_token,), 'pad')
    self.unk_id = self._special(HF_UNK_TOKENS, 'unk', required=False)
    self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))

  def _special(self, names: Sequence[str], what: str, required: bool = True) -> int | None:
    for name in names:
      i = self._tok.token_to_id(name)
      if i is not None:
        return int(i)
    if required:
      raise ValueError(f'tokenizer {self.path} has no {what} token (looked for {list(names)}).')
    return None

  def encode(self, text: str) -> list[int]:
    return list(self._tok.encode(text, add_special_tokens=False).ids)

  def _decode(self, ids: list[int]) -> str:
    return self._tok.decode(ids, skip_special_tokens=True)


def load_vocabulary(path: str, what: str = DEFAULT_WHAT) -> Vocabulary:
  """A SentencePiece model (*.model), a tokenizer.json (*.json), a folder holding one of
  tokenizer.json / vocab.json + merges.txt / *.model, or 'vocab.json,merges.txt'.

  Args:
    path: the vocabulary.
    what: the setting that gave `path` ('VOCABULARY_PATH'), named in the errors.

  Raises:
    FileNotFoundError: a file is missing.
    ValueError: a file is empty, does not parse as its form, or is not a regular file (a fifo
      or a device is refused before it is opened); each error names `what`, the file and the
      accepted forms.
  """
  path = str(path)
  if ',' in path:
    vocab_json, merges = (p.strip() for p in path.split(',', 1))
    return HuggingFaceVocabulary(vocab_json=vocab_json, merges_txt=merges, what=what)
  if os.path.isdir(path):
    names = set(os.listdir(path))
    if 'tokenizer.json' in names:
      return HuggingFaceVocabulary(os.path.join(path, 'tokenizer.json'), what=what)
    if {'vocab.json', 'merges.txt'} <= names:
      return HuggingFaceVocabulary(vocab_json=os.path.join(path, 'vocab.json'),
                                   merges_txt=os.path.join(path, 'merges.txt'), what=what)
    models = sorted(n for n in names if n.endswith('.model'))
    if len(models) == 1:
      return SentencePieceVocabulary(os.path.join(path, models[0]), what=what)
    raise ValueError(f'{what} {path} is a folder with no tokenizer.json, vocab.json + '
                     f'merges.txt or single *.model (it has {sorted(names)[:20]}). {FORMS}')
  if path.endswith('.json'):
    return HuggingFaceVocabulary(path, what=what)
  return SentencePieceVocabulary(path, what=what)


def train_sentencepiece(texts: Iterable[str], path: str,
                        vocab_size: int) -> SentencePieceVocabulary:
  """Trains a BPE SentencePiece model on `texts` and writes it to `path` atomically.

  Digits are split (`split_digits=True`) so a model copies numbers digit by digit; every character
  of `texts` is covered. Training is deterministic for the same texts (one thread, no sampling).
  NOTE: BPE, not T5's unigram: on prompt text dominated by filler and hex digits, unigram keeps
  the rarer instruction words in pieces (227 vs 129 tokens for the smallest line-retrieval
  prompt), which would leave little of a 256-token budget for the retrieval content.

  Args:
    texts: training sentences (each is one line of the trainer's input; newlines become spaces,
      as SentencePiece's default normalization does to any input).
    path: where to write the `.model` file.
    vocab_size: upper bound on the number of pieces (fewer if the text has fewer).

  Returns:
    The trained vocabulary (T5's ids: pad 0, EOS 1, UNK 2).
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=(t.replace('\n', ' ') for t in texts), model_writer=model,
      vocab_size=vocab_size, hard_vocab_limit=False, model_type='bpe',
      character_coverage=1.0, split_digits=True, pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID,
      bos_id=-1, num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
      max_sentence_length=1 << 16, minloglevel=2)
  fileio.write_atomic(path, model.getvalue())
  return SentencePieceVocabulary(path, t5_ids=True)


def as_seqio(vocab: Vocabulary) -> Any:
  """`vocab` as a `seqio.Vocabulary` (imports seqio and tensorflow)."""
  return _seqio_class()(vocab)


_SEQIO_CLASS = None


def _seqio_class() -> type:
  global _SEQIO_CLASS
  if _SEQIO_CLASS is not None:
    return _SEQIO_CLASS
  import seqio  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  class SeqioVocabulary(seqio.Vocabulary):
    """A t5align `Vocabulary` behind seqio's interface (TF ops through tf.py_function)."""

    def __init__(self, vocab: Vocabulary):
      self.vocab = vocab
      super().__init__(extra_ids=0)

    @property
    def eos_id(self) -> int:
      return self.vocab.eos_id

    @property
    def pad_id(self) -> int:
      return self.vocab.pad_id

    @property
    def unk_id(self) -> int | None:
      return self.vocab.unk_id

    @property
    def _base_vocab_size(self) -> int:
      return self.vocab.vocab_size

    def _encode(self, s: str) -> list[int]:
      return self.vocab.encode(s)

    def _decode(self, ids) -> str:
      return self.vocab.decode([int(i) for i in ids if int(i) >= 0])

    def _encode_tf(self, s):
      def encode(x):
        return tf.constant(self.vocab.encode(x.numpy().decode('utf-8')), tf.int32)
      out = tf.py_function(encode, [s], tf.int32)
      out.set_shape([None])
      return out

    def _decode_tf(self, ids):
      def decode(x):
        return tf.constant(self.vocab.decode([int(i) for i in x.numpy() if i >= 0]))
      out = tf.py_function(decode, [ids], tf.string)
      out.set_shape([])
      return out

    def __eq__(self, other) -> bool:
      return isinstance(other, SeqioVocabulary) and other.vocab.path == self.vocab.path

    def __hash__(self) -> int:
      return hash(self.vocab.path)

  _SEQIO_CLASS = SeqioVocabulary
  return _SEQIO_CLASS
