"""Where the lm-eval model's checkpoint and tokenizer come from: a local or gs:// path, or a
HuggingFace hub id resolved through `huggingface_hub`'s cache (`resolve`), and the tokenizer a
checkpoint carries (`own_tokenizer`)."""
from __future__ import annotations

import os
import re

from t5align.runtime import fileio

# What a hub id looks like ('google/flan-t5-xl', 't5-small'); a path that exists is never one.
_HUB_ID = re.compile(r'[A-Za-z0-9][\w.-]*(/[\w.-]+)?')
# The files that make a folder an HF tokenizer (what `transformers.AutoTokenizer` reads).
HF_TOKENIZER_FILES = ('tokenizer_config.json', 'tokenizer.json', 'spiece.model')
# Where `t5align.train` puts the vocabulary: beside the checkpoint_N folders.
SENTENCEPIECE_FILE = 'sentencepiece.model'


def is_hub_id(name: str) -> bool:
  """True for a name that is no local or gs:// path and reads as a hub id."""
  return (not fileio.is_remote(name) and not os.path.lexists(name)
          and not name.startswith(('.', '/', '~')) and bool(_HUB_ID.fullmatch(name)))


def resolve(pretrained: str, revision: str | None, what: str = 'pretrained') -> str:
  """The local (or gs://) folder of `pretrained`: itself when it is a path, else the snapshot of
  hub id `pretrained` (at `revision`) in huggingface_hub's cache, downloaded when the machine may
  reach the hub (HF_HUB_OFFLINE unset).

  Raises:
    FileNotFoundError: naming `what`, for a path that does not exist, or a hub id that is not in
      the cache of an offline machine.
  """
  if fileio.is_remote(pretrained) or os.path.lexists(pretrained):
    return pretrained
  if not is_hub_id(pretrained):
    raise FileNotFoundError(f'{what}={pretrained!r}: no such checkpoint (not a path that exists, '
                            'nor a HuggingFace hub id like google/flan-t5-xl).')
  try:
    import huggingface_hub  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise FileNotFoundError(f'{what}={pretrained!r} is no local path, and huggingface_hub (which '
                            "resolves hub ids) is not installed: pip install 't5align[lm_eval]'."
                            ) from e
  try:
    return huggingface_hub.snapshot_download(repo_id=pretrained, revision=revision)
  except Exception as e:  # pylint: disable=broad-except  (the hub raises many kinds)
    cache = os.environ.get('HF_HUB_CACHE') or os.environ.get('HF_HOME') or '~/.cache/huggingface'
    raise FileNotFoundError(
        f'{what}={pretrained!r}: not a local path, and huggingface_hub could not give the hub '
        f'model{f" at revision {revision}" if revision else ""} ({type(e).__name__}: {e}); its '
        f'cache is {cache}. Download it there (huggingface-cli download {pretrained}) or pass '
        'a local checkpoint.') from e


def own_tokenizer(checkpoint: str) -> str | None:
  """The tokenizer a checkpoint carries: its folder when it holds an HF tokenizer, else the
  SentencePiece model beside a T5X checkpoint_N folder (`t5align.train`'s layout); None when it
  carries none."""
  if fileio.is_remote(checkpoint):
    return None
  folder = checkpoint if os.path.isdir(checkpoint) else os.path.dirname(checkpoint)
  if any(os.path.isfile(os.path.join(folder, name)) for name in HF_TOKENIZER_FILES):
    return folder
  for place in (folder, os.path.dirname(os.path.abspath(folder))):
    if os.path.isfile(os.path.join(place, SENTENCEPIECE_FILE)):
      return os.path.join(place, SENTENCEPIECE_FILE)
  return None
