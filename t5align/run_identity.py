"""What a run's results depend on, recorded beside them and compared before they are added to.

A run identity is a JSON object: the content fingerprints of the files the results are computed
from (checkpoint, vocabulary, data files), the gin configuration after every override, and the
run's settings (task options, seeds, temperature or schedule entry, dtypes, attention
implementation, ...). A resumed run compares the identity it would record with the one recorded,
field by field (`differences`), and refuses naming each differing field (`check_same`):
  - `check_run`: eval's run.json per task folder;
  - `calibration.CalibrationLog`: calibrate's progress beside OUTPUT_PATH, and a schedule's
    provenance['identity'] (what a reused schedule was calibrated for);
  - `check_same_processes`: every process of a multi-process run against process 0.

Fingerprints read content, not paths, so a checkpoint replaced at the same path is a different
run, and one moved elsewhere is the same. A checkpoint is fingerprinted at its path with symlinks
resolved, the place the run reads it from, recorded beside the path as given (both informational):
  - `file_fingerprint`: SHA-256 of the bytes (vocabularies, text files: they are small);
  - `checkpoint_fingerprint`: SHA-256 of every byte of a local checkpoint of at most
    `FULL_HASH_BYTES`; above, of each file's name and size plus its stored checksum (the
    CRC-32 a gzip member ends with: T5X's zarr chunks) or, for files without one, the bytes of
    `SAMPLED_BLOCKS` evenly spaced blocks (two trainings of one architecture differ there; an
    edit confined to unsampled bytes of a large file would not be seen). A `gs://` checkpoint is
    identified by its small metadata files only (array data is not read).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from typing import Any, Collection, Iterable, Mapping

from t5align.runtime import fileio
from t5align.runtime import outputs

FULL_HASH_BYTES = 256 * 2**20
SAMPLED_BLOCKS = 16
BLOCK_BYTES = 64 * 2**10
_SMALL_FILE_BYTES = 2**20  # Files up to this size are always hashed whole.
# Metadata files a remote checkpoint is identified by (those it has).
_REMOTE_METADATA = ('checkpoint', 'state/_METADATA', 'state/manifest.ocdbt',
                    '_CHECKPOINT_METADATA', 'config.json', 'model.safetensors.index.json')

# Gin bindings that do not determine a result (left out of a recorded identity): where the
# inputs are (their content is fingerprinted instead), where outputs go, row names, and batch
# sizes (examples are computed independently of their batch). Macro names, or the end of a
# 'selector.parameter' key.
NOT_IDENTITY = (
    'CHECKPOINT_PATH', 'VOCABULARY_PATH', 'TEXT_FILE', 'JSONL_FILE', 'SCHEDULE_PATH',
    'EVAL_OUTPUT_DIR', 'OUTPUT_PATH', 'MODEL_DIR', 'EXPORT_DIR', 'ANALYSIS_DIR',
    'LABEL', 'MODEL_NAME', 'BATCH_SIZE', 'TAU_BATCH_SIZE', 'vocabulary_path.path',
    # The inputs' fingerprint records what was read (split included).
    'SEQIO_SPLIT', 'seqio_split',
)


class RunMismatchError(ValueError):
  """Results recorded by one run would be mixed with another's.

  Attributes:
    fields: the differing fields' dotted names.
  """

  def __init__(self, message: str, fields: Iterable[str] = ()):
    super().__init__(message)
    self.fields = list(fields)


# ---------------------------------------------------------------------------------------------
# Fingerprints.


def _hash_file(path: str, digest: Any) -> None:
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(4 * 2**20), b''):
      digest.update(block)


def file_fingerprint(paths: str | Iterable[str]) -> dict[str, Any]:
  """{'sha256', 'bytes'} of the content of one file or several (in order; local or `gs://`)."""
  paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
  digest, total = hashlib.sha256(), 0
  for path in paths:
    path = os.fspath(path)
    if fileio.is_remote(path):
      data = fileio.read_bytes(path)
      digest.update(data)
      total += len(data)
    else:
      if not os.path.isfile(path):
        raise FileNotFoundError(f'{path} does not exist (or is not a file).')
      _hash_file(path, digest)
      total += os.path.getsize(path)
  return {'sha256': digest.hexdigest(), 'bytes': total}


def vocabulary_files(vocabulary: Any) -> list[str]:
  """The file(s) a tokenizer is read from: of a path (`vocabularies.load_vocabulary`'s forms), a
  `vocabularies.Vocabulary`, its seqio wrapper, `seqio_tasks`' configured vocabulary or a seqio
  SentencePieceVocabulary."""
  path = vocabulary if isinstance(vocabulary, (str, os.PathLike)) else None
  if path is None and hasattr(vocabulary, 'vocab'):  # vocabularies.as_seqio's wrapper.
    vocabulary = vocabulary.vocab
  if path is None and hasattr(vocabulary, '_delegate'):  # seqio_tasks.tasks.VOCABULARY
    from seqio_tasks import tasks  # pylint: disable=g-import-not-at-top
    path = tasks.vocabulary_path()
  if path is None:
    path = getattr(vocabulary, 'path', None) or getattr(vocabulary, 'sentencepiece_model_file',
                                                        None)
  if path is None:
    raise TypeError(f'cannot tell the file(s) of vocabulary {vocabulary!r}.')
  path = os.fspath(path)
  if not fileio.is_remote(path) and os.path.isdir(path):
    from t5align import vocabularies  # pylint: disable=g-import-not-at-top
    path = vocabularies.load_vocabulary(path).path  # The file(s) the folder's tokenizer uses.
  return [p.strip() for p in path.split(',')]


def vocabulary_fingerprint(vocabulary: Any) -> dict[str, Any]:
  """`file_fingerprint` of a tokenizer's file(s) (`vocabulary_files`)."""
  return file_fingerprint(vocabulary_files(vocabulary))


def _checkpoint_files(path: str) -> list[tuple[str, str]]:
  """(name relative to the checkpoint, path) of every file of a local checkpoint, sorted."""
  path = os.path.abspath(path.rstrip('/'))
  if os.path.isfile(path) and os.path.basename(path) == 'checkpoint':
    path = os.path.dirname(path)  # A T5X `checkpoint` file: its folder.
  if os.path.isdir(path):
    found = []
    for root, dirs, files in os.walk(path):
      dirs.sort()
      for name in files:
        full = os.path.join(root, name)
        found.append((os.path.relpath(full, path), full))
    return sorted(found)
  folder, prefix = os.path.split(path)  # A Mesh-TF prefix: PREFIX.index, PREFIX.data-*.
  names = os.listdir(folder) if os.path.isdir(folder) else []
  found = sorted((n, os.path.join(folder, n)) for n in names if n.startswith(prefix + '.'))
  if not found:
    raise FileNotFoundError(f'No such checkpoint: {path}')
  return found


def _stored_digest(path: str, size: int) -> bytes:
  """A large file's stored checksum (a gzip member's CRC-32 and length) or sampled blocks."""
  with open(path, 'rb') as f:
    if f.read(2) == b'\x1f\x8b' and size >= 18:
      f.seek(size - 8)
      return b'gzip' + f.read(8)
    digest = hashlib.sha256()
    last = max(0, size - BLOCK_BYTES)
    for i in range(SAMPLED_BLOCKS):
      f.seek(last * i // (SAMPLED_BLOCKS - 1))
      digest.update(f.read(BLOCK_BYTES))
    return b'blocks' + digest.digest()


def checkpoint_fingerprint(path: str, *, full_hash_bytes: int = FULL_HASH_BYTES
                           ) -> dict[str, Any]:
  """The content fingerprint of a checkpoint (see the module docstring): {'sha256', 'files',
  'bytes', 'method'}; `bytes` is None for a remote checkpoint."""
  path = os.fspath(path)
  if fileio.is_remote(path):
    root = path.rstrip('/')
    root = root[:-len('/checkpoint')] if root.endswith('/checkpoint') else root
    names = [n for n in _REMOTE_METADATA if fileio.exists(fileio.join(root, n))]
    if not names:
      raise FileNotFoundError(f'No checkpoint metadata ({", ".join(_REMOTE_METADATA)}) in {root}')
    digest = hashlib.sha256()
    for name in names:
      digest.update(name.encode() + b'\0' + fileio.read_bytes(fileio.join(root, name)))
    return {'sha256': digest.hexdigest(), 'files': len(names), 'bytes': None,
            'method': 'metadata files (remote: arrays not read)'}
  files = [(name, full, os.path.getsize(full)) for name, full in _checkpoint_files(path)]
  total = sum(size for _, _, size in files)
  whole = total <= full_hash_bytes
  digest = hashlib.sha256()
  for name, full, size in files:
    digest.update(f'{name}\0{size}\0'.encode())
    if whole or size <= _SMALL_FILE_BYTES:
      _hash_file(full, digest)
    else:
      digest.update(_stored_digest(full, size))
  return {'sha256': digest.hexdigest(), 'files': len(files), 'bytes': total,
          'method': 'every byte' if whole else 'sizes, gzip CRC-32s and sampled blocks'}


def array_fingerprint(arrays: Iterable[Any]) -> str:
  """SHA-256 of arrays' dtypes, shapes and bytes, in order (e.g. the examples a run reads)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  digest = hashlib.sha256()
  for array in arrays:
    array = np.ascontiguousarray(array)
    digest.update(f'{array.dtype.str}{array.shape}'.encode())
    digest.update(array.tobytes())
  return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Gin.


def gin_config(ignore: Collection[str] = NOT_IDENTITY) -> dict[str, str]:
  """Every binding of gin's current configuration (after overrides): {'MACRO' or
  '[scope/]selector.parameter': the value as gin writes it}, less the `ignore`d (macro names,
  or ends of 'selector.parameter' keys). Empty when gin is not in use."""
  import gin  # pylint: disable=g-import-not-at-top
  out = {}
  for (scope, selector), params in gin.config._CONFIG.items():  # pylint: disable=protected-access
    for name, value in params.items():
      key = scope if selector == 'gin.macro' else f'{scope + "/" if scope else ""}{selector}.{name}'
      if key in ignore or any(key.endswith('.' + i) for i in ignore):
        continue
      out[key] = gin.config._format_value(value)  # pylint: disable=protected-access
  return dict(sorted(out.items()))


# ---------------------------------------------------------------------------------------------
# Identities and their comparison.


def make(*, checkpoint: str | None = None, vocabulary: Any = None,
         files: Mapping[str, str | None] | None = None, settings: Mapping[str, Any] | None = None,
         gin: bool | Mapping[str, str] = True, resolved_checkpoint: str | None = None,
         fingerprint: bool = True) -> dict[str, Any]:
  """A run identity (JSON values only): how every job's record is formed (eval's run.json,
  calibrate's log header and schedule provenance, train's run.json), compared by `check_run`.

  Args:
    checkpoint: the checkpoint path: recorded as 'checkpoint' (`checkpoint_fingerprint` of the
      resolved path), 'checkpoint_path' (as given) and 'checkpoint_resolved_path' (both
      informational: `INFORMATIONAL` fields are not compared).
    vocabulary: anything `vocabulary_fingerprint` takes.
    files: {field: path (or None)} of data files, each recorded as its `file_fingerprint`.
    settings: any other JSON-able settings, recorded as given.
    gin: record 'gin': `gin_config()`; or the configuration to record, as a mapping (a job's
      `jobs.common.gin_record`).
    resolved_checkpoint: where the run reads `checkpoint` from (`jobs.common.Checkpoint.resolved`);
      None: `checkpoint` with its symlinks resolved now.
    fingerprint: read the checkpoint's content for 'checkpoint' (False: None, for a process
      that records nothing).
  """
  out: dict[str, Any] = {}
  if checkpoint is not None:
    resolved = resolved_checkpoint or resolved_path(checkpoint)
    out['checkpoint'] = checkpoint_fingerprint(resolved) if fingerprint else None
    out['checkpoint_path'] = os.fspath(checkpoint)
    out['checkpoint_resolved_path'] = resolved
  if vocabulary is not None:
    out['vocabulary'] = vocabulary_fingerprint(vocabulary)
  for field, path in (files or {}).items():
    out[field] = None if path is None else file_fingerprint(path)
  if gin is not False:
    out['gin'] = gin_config() if gin is True else dict(gin)
  # NOTE: recorded only when set, so identities written before the field existed still match.
  if (precision := matmul_precision()) is not None:
    out['jax_default_matmul_precision'] = precision
  out.update(settings or {})
  return json.loads(json.dumps(out, sort_keys=True))


def set_fields(settings: Any, names: Iterable[str]) -> dict[str, Any]:
  """The fields `names` of the dataclass `settings` that are not their declared defaults: what
  a run records of settings that could not be set when runs were first recorded, so that those
  records still match (`make` turns tuples into lists)."""
  defaults = {f.name: f.default for f in dataclasses.fields(settings)}
  return {n: getattr(settings, n) for n in names if getattr(settings, n) != defaults[n]}


def matmul_precision() -> str | None:
  """jax's `jax_default_matmul_precision`: the one opt-out of float32 dots at full precision
  (attention/reference.py `dot_precision`); None when unset or jax is not loaded."""
  jax = sys.modules.get('jax')
  return None if jax is None else jax.config.jax_default_matmul_precision


# Recorded, never compared. NOTE: 'checkpoint_resolved_path' came later; identities recorded
# without it still match, as it is not compared.
INFORMATIONAL = ('checkpoint_path', 'checkpoint_resolved_path', 'created_unix')


def resolved_path(path: str | os.PathLike[str]) -> str:
  """A local path absolute with its symlinks resolved; a remote one as given."""
  path = os.fspath(path)
  return path if fileio.is_remote(path) else os.path.realpath(path)


def _checkpoint_note(before: Mapping[str, Any], now: Mapping[str, Any],
                     diff: Mapping[str, Any], setting: str) -> str:
  """Where the recorded and the present checkpoint were read from, when their content differs."""
  if not any(k == 'checkpoint' or k.startswith('checkpoint.') for k in diff):
    return ''

  def where(identity):
    path = identity.get('checkpoint_path')
    resolved = identity.get('checkpoint_resolved_path')
    return f'{path}' + (f' -> {resolved}' if resolved and resolved != path else '')
  return (f' {setting} reads another checkpoint than the one these results were made from: '
          f'{where(now)} now, {where(before)} then.')


# The jobs' old names, kept until the next release (`gin_cli.deprecated_alias`): {command
# module: (its attribute, the gin selector the run files bound, the job in t5align.jobs)}.
OLD_JOB_NAMES = {'t5align.eval': ('evaluate', 't5align_eval.evaluate', 'EvalJob'),
                 't5align.calibrate': ('run', 'calibrate.run', 'CalibrationJob'),
                 't5align.train': ('train', 'train.train', 'TrainJob')}
# The selectors the jobs' gin bindings were recorded under before they were registered under
# their own names (2026-11-28): an identity recorded then compares under the new ones.
OLD_GIN_SELECTORS = {f't5align.{bound}': f't5align.jobs.{job}'
                     for _, bound, job in OLD_JOB_NAMES.values()}


def current_gin_names(config: Any) -> Any:
  """A recorded 'gin' field ({'[scope/]selector.parameter': value}) with the jobs' old
  selectors (`OLD_GIN_SELECTORS`) renamed to their own names; anything else as given."""
  if not isinstance(config, Mapping):
    return config
  out = {}
  for key, value in config.items():
    scope, _, binding = str(key).rpartition('/')
    for old, new in OLD_GIN_SELECTORS.items():
      if binding.startswith(old + '.'):
        key = (scope + '/' if scope else '') + new + binding[len(old):]
    out[key] = value
  return out


def differences(before: Any, now: Any, *, ignore: Collection[str] = INFORMATIONAL,
                prefix: str = '') -> dict[str, tuple[Any, Any]]:
  """{dotted field: (before, now)} of every field that differs; objects are compared key by
  key (a missing key reads as None), everything else as a whole. `ignore`: top-level fields.
  The top-level 'gin' field compares with the jobs' old selectors renamed (`current_gin_names`),
  so runs recorded before the jobs had their own gin names resume."""
  if not (isinstance(before, Mapping) and isinstance(now, Mapping)):
    return {} if before == now else {prefix or '(value)': (before, now)}
  if not prefix and ('gin' in before or 'gin' in now):
    before = {**before, 'gin': current_gin_names(before.get('gin'))} if 'gin' in before else before
    now = {**now, 'gin': current_gin_names(now.get('gin'))} if 'gin' in now else now
  out = {}
  for key in sorted(set(before) | set(now), key=str):
    if not prefix and key in ignore:
      continue
    out.update(differences(before.get(key), now.get(key), ignore=(),
                           prefix=f'{prefix}.{key}' if prefix else str(key)))
  return out


def _short(value: Any, width: int = 80) -> str:
  text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
  return text if len(text) <= width else text[:width - 3] + '...'


def describe_differences(diff: Mapping[str, tuple[Any, Any]], limit: int = 12) -> str:
  """'field: before -> now; ...' (the first `limit` fields)."""
  parts = [f'{k}: {_short(a)} -> {_short(b)}' for k, (a, b) in list(diff.items())[:limit]]
  more = len(diff) - limit
  return '; '.join(parts) + (f'; and {more} more' if more > 0 else '')


def check_same(before: Mapping[str, Any] | None, now: Mapping[str, Any], *, what: str,
               hint: str, ignore: Collection[str] = INFORMATIONAL,
               checkpoint_setting: str = 'CHECKPOINT_PATH') -> None:
  """Raises `RunMismatchError` naming every field where `now` differs from `before`.

  Args:
    before: the recorded identity; None: nothing was recorded (refused: the results there
      cannot be attributed).
    now: the identity of the run about to add to them.
    what: the results, for the message, e.g. 'EVAL_OUTPUT_DIR/task'.
    hint: what to do instead, e.g. 'Use another output folder.'
    ignore: top-level fields not compared.
    checkpoint_setting: what names the checkpoint, for the message when its content differs.
  """
  if before is None:
    raise RunMismatchError(f'{what} holds results but no record of the run that made them, so '
                           f'they cannot be resumed or extended. {hint}')
  now = json.loads(json.dumps(now))
  diff = differences(before, now, ignore=ignore)
  if diff:
    note = _checkpoint_note(before, now, diff, checkpoint_setting)
    raise RunMismatchError(f'{what} holds results of a different run; differing fields (before '
                           f'-> now): {describe_differences(diff)}. {hint}{note}', diff)


def check_same_processes(settings: Mapping[str, Any], what: str = 'settings') -> None:
  """Refuses, on every process alike, to go on if any process's `settings` (JSON-able) differ
  from process 0's, naming the processes and fields (`differences`)."""
  import jax  # pylint: disable=g-import-not-at-top  (this module is JAX-free otherwise)
  from t5align.runtime import multihost  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1:
    return
  everyone = multihost.gather_json([json.loads(json.dumps(settings, sort_keys=True))])
  problems = []
  for i, other in enumerate(everyone[1:], start=1):
    diff = differences(everyone[0], other, ignore=())
    if diff:
      problems.append(f'process {i}: {describe_differences(diff)}')
  if problems:
    raise RunMismatchError(
        f'the processes were started with different {what} (process 0 -> the other): '
        + ' | '.join(problems) + '. Start every process with the same command.')


def check_run(folder: str | os.PathLike[str], settings: Mapping[str, Any],
              has_results: bool | None = None) -> None:
  """Writes run.json, or checks that the run that made the folder's results had the same
  identity (`check_same`: every field but `INFORMATIONAL`).

  A run.json whose folder holds no result yet (by default: no prediction record, no
  metrics.json; the run failed before its first batch) is replaced, so a corrected rerun is not
  refused. Results without a run.json are refused: nothing says which run made them.
  """
  path = fileio.join(folder, 'run.json')
  settings = json.loads(json.dumps(settings, sort_keys=True))
  predictions = fileio.join(folder, 'predictions.jsonl')
  if has_results is None:
    has_results = fileio.exists(fileio.join(folder, 'metrics.json')) or (
        fileio.exists(predictions) and b'\n' in fileio.read_bytes(predictions))
  if has_results:
    before = outputs.read_json(path, 'run record') if fileio.exists(path) else None
    check_same(before, settings, what=os.fspath(folder),
                            hint='Use another output folder (or move this one away).')
    return
  fileio.write_json_atomic(path, settings)
