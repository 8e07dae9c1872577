"""Tokenizers: SentencePiece and a byte-level BPE (CodeT5's kind) trained here with `tokenizers`."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from t5align import vocabularies

CODE = ['def add(a, b):\n    return a + b\n', 'class Point:\n    def __init__(self, x):\n'
        '        self.x = {"x": x}  # café <3\n', 'for i in range(10):\n\tprint(i ** 2)\n']
SPECIALS = ['<pad>', '<s>', '</s>', '<unk>']  # CodeT5's order: pad 0, <s> 1, </s> 2, unk 3.


def train_bpe(folder) -> dict[str, str]:
  """A byte-level BPE tokenizer (< 1 s); returns the paths of its three file forms."""
  from tokenizers import ByteLevelBPETokenizer  # pylint: disable=g-import-not-at-top
  tok = ByteLevelBPETokenizer(add_prefix_space=False)
  tok.train_from_iterator(CODE * 20, vocab_size=400, min_frequency=1, special_tokens=SPECIALS,
                          show_progress=False)
  folder.mkdir(parents=True, exist_ok=True)
  tok.save(str(folder / 'tokenizer.json'))
  vocab_json, merges = tok.save_model(str(folder))
  return {'json': str(folder / 'tokenizer.json'), 'pair': f'{vocab_json},{merges}',
          'folder': str(folder)}


@pytest.fixture(scope='module')
def bpe(tmp_path_factory):
  return train_bpe(tmp_path_factory.mktemp('bpe'))


@pytest.mark.parametrize('form', ['json', 'pair', 'folder'])
def test_bpe_round_trip_and_special_ids(bpe, form):
  from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
  vocab = vocabularies.load_vocabulary(bpe[form])
  assert isinstance(vocab, vocabularies.HuggingFaceVocabulary)
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 2, 3)
  reference = Tokenizer.from_file(bpe['json'])
  for text in CODE + ['x = {1: "<é>"}\n\n\tpass']:
    ids = vocab.encode(text)
    assert ids == reference.encode(text, add_special_tokens=False).ids  # the library's own BPE
    assert 2 not in ids and vocab.decode(ids) == text  # byte level: every character survives
  assert vocab.decode(vocab.encode('a + b') + [vocab.eos_id]) == 'a + b'  # EOS is not text


def test_sentencepiece_vocabulary_reads_its_ids():
  import pathlib  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(__file__).resolve().parents[2]
  path = root / 't5align/shipped/retrieval_t5/sentencepiece.model'
  vocab = vocabularies.load_vocabulary(str(path))
  assert isinstance(vocab, vocabularies.SentencePieceVocabulary)
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
  assert vocab.decode(vocab.encode('The pass key is 123.')) == 'The pass key is 123.'


def test_bad_paths_name_the_file(tmp_path):
  with pytest.raises(FileNotFoundError, match='nope.json'):
    vocabularies.load_vocabulary(str(tmp_path / 'nope.json'))
  with pytest.raises(ValueError, match='no tokenizer.json'):
    vocabularies.load_vocabulary(str(tmp_path))


@pytest.mark.tensorflow
def test_seqio_wrapper_and_task_vocabulary(bpe, monkeypatch):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seqio_tasks import tasks  # pylint: disable=g-import-not-at-top
  from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
  vocab = vocabularies.load_vocabulary(bpe['json'])
  wrapped = vocabularies.as_seqio(vocab)
  text = CODE[1]
  ids = wrapped.encode(text)
  assert ids == vocab.encode(text) and wrapped.eos_id == 2
  assert wrapped.vocab_size == vocab.vocab_size == len(Tokenizer.from_file(bpe['json']).get_vocab())
  np.testing.assert_array_equal(wrapped.encode_tf(tf.constant(text)).numpy(), ids)
  # seqio semantics: decoding stops at EOS.
  assert wrapped.decode_tf(tf.constant(ids + [2, 5, 6])).numpy().decode() == text
  # The tasks' vocabulary follows $T5ALIGN_VOCABULARY to a HF tokenizer.
  monkeypatch.setenv(tasks.ENV_VOCABULARY, bpe['folder'])
  assert tasks.VOCABULARY.eos_id == 2 and tasks.VOCABULARY.encode(text) == ids
  assert tasks.VOCABULARY.decode(ids) == text


SHIPPED = str(pathlib.Path(__file__).resolve().parents[2] /
              't5align/shipped/retrieval_t5/sentencepiece.model')


def test_decode_reads_ids_as_a_model_writes_them(bpe):
  """One `decode` for every tokenizer: up to the first EOS, padding dropped, ids past the
  vocabulary (a model's embedding rows are rounded up) read as unk."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
  hf = vocabularies.load_vocabulary(bpe['json'])
  sp = vocabularies.load_vocabulary(SHIPPED)
  references = [  # the libraries' own decoders on the ids a model's output means
      (hf, lambda ids: Tokenizer.from_file(bpe['json']).decode(ids, skip_special_tokens=True)),
      (sp, spm.SentencePieceProcessor(model_file=SHIPPED).decode)]
  for vocab, reference in references:
    ids = vocab.encode('a + b = 12')
    written = [*ids, vocab.vocab_size + 3, vocab.pad_id, vocab.eos_id, *ids, vocab.pad_id]
    assert vocab.decode(written) == reference([*ids, vocab.unk_id])
  sp.unk_id = None
  with pytest.raises(ValueError, match=rf'id {sp.vocab_size} is past the .*sentencepiece.model'):
    sp.decode([sp.vocab_size])


def test_t5_ids_are_checked_where_asked(tmp_path):
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  shipped = vocabularies.SentencePieceVocabulary(SHIPPED, t5_ids=True)
  assert shipped.decode([5, 1, 6]) == vocabularies.load_vocabulary(SHIPPED).decode([5])
  # SentencePiece's own default ids: unk 0, bos 1, eos 2 (no pad).
  spm.SentencePieceTrainer.train(sentence_iterator=iter(CODE * 5), model_prefix=str(tmp_path / 'd'),
                                 vocab_size=60, hard_vocab_limit=False, minloglevel=2)
  path = str(tmp_path / 'd.model')
  assert vocabularies.SentencePieceVocabulary(path).eos_id == 2
  with pytest.raises(ValueError, match=r'd\.model: \(pad, eos, unk\) ids are \(-1, 2, 0\); T5'):
    vocabularies.SentencePieceVocabulary(path, t5_ids=True)


FORMS = ('SentencePiece model', 'HuggingFace tokenizer.json', 'vocab.json + merges.txt')


@pytest.mark.parametrize('name, content', [
    ('empty.model', b''), ('notes.txt', b'plain text, not a vocabulary\n'),
    ('empty.json', b''), ('tokenizer.json', b'plain text, not JSON\n')],
    ids=['empty_model', 'text_file', 'empty_json', 'text_json'])
def test_an_empty_or_text_file_as_vocabulary_names_the_setting_file_and_forms(name, content,
                                                                            tmp_path):
  """Not sentencepiece's 'unk is not defined' / 'could not parse ModelProto', nor tokenizers'
  JSON error: the setting, the file and what a vocabulary may be."""
  path = tmp_path / name
  path.write_bytes(content)
  for what, named in ((None, 'VOCABULARY_PATH'), ('--vocabulary', '--vocabulary')):
    kwargs = {} if what is None else {'what': what}
    with pytest.raises(ValueError) as e:
      vocabularies.load_vocabulary(str(path), **kwargs)
    message = str(e.value)
    assert named in message and str(path) in message, message
    assert ('is empty' if not content else 'is not') in message, message
    assert all(form in message for form in FORMS), message


_LOAD = ('import sys; from t5align import vocabularies; '
         'vocabularies.load_vocabulary(sys.argv[1])')


@pytest.mark.parametrize('kind', ['fifo', 'fifo_json', 'dev_zero', 'fifo_in_folder'])
def test_a_vocabulary_that_is_no_regular_file_is_refused_at_once(kind, tmp_path):
  """A fifo would block sentencepiece / tokenizers forever and /dev/zero read without end: each
  is refused before it is opened, naming the setting and the file (a process bounded to 60 s)."""
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(__file__).resolve().parents[2]
  path = {'fifo': tmp_path / 'pipe.model', 'fifo_json': tmp_path / 'tokenizer.json',
          'dev_zero': pathlib.Path('/dev/zero'),
          'fifo_in_folder': tmp_path / 'folder' / 'tokenizer.json'}[kind]
  if kind != 'dev_zero':
    path.parent.mkdir(exist_ok=True)
    os.mkfifo(path)
  given = path.parent if kind == 'fifo_in_folder' else path
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get('PYTHONPATH', '')]))
  result = subprocess.run([sys.executable, '-c', _LOAD, str(given)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
  assert result.returncode == 1, result.stderr
  wanted = 'a device' if kind == 'dev_zero' else 'a fifo'
  assert f'{path} is {wanted}, not a regular file' in result.stderr, result.stderr
  assert 'VOCABULARY_PATH' in result.stderr, result.stderr
