"""What a run's results depend on, recorded beside them and compared before they are added to.

A run identity is a JSON object: its layout's version ('format': `FORMAT`), the content
fingerprints of the files the results are computed from (checkpoint, vocabulary, data files), the
facts of the run (the model's config, the mesh, the temperatures applied, task options, ...) and
'settings': the job's settings, each field of the job and of the settings objects it holds
(`settings_record`) but those whose metadata says why they are not (`NOT_IDENTITY`). gin's
configuration is written beside it as text (config.gin, as t5x writes it), not compared. A record
of an earlier format is upgraded on read, once, by `upgrade`; a setting added later raises
`FORMAT`, and `upgrade` gives the records before it the value those runs had.

A resumed run compares the identity it would record with the one recorded, field by field
(`differences`), and refuses naming each differing field (`check_same`):
  - `check_run`: eval's run.json per task folder, train's in MODEL_DIR;
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

# The layout of a run identity (run.json, a calibration log's header, a schedule's
# provenance['identity']). 1 (no 'format'): gin's bindings as 'gin', the settings at the top
# level, those added later only when not their defaults. 2: 'settings' from the jobs' fields.
FORMAT = 3
# The metadata key of a job's (or settings object's) field that is not part of its identity; its
# value says why (e.g. "where results go"). `settings_record` leaves such fields out.
NOT_IDENTITY = 'not_identity'
# The metadata key of a function a field's value is recorded through (e.g. sorted, for a set).
RECORDED_AS = 'recorded_as'
GIN_CONFIG_FILE = 'config.gin'


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


def gin_config() -> dict[str, str]:
  """Every binding of gin's current configuration (after overrides): {'MACRO' or
  '[scope/]selector.parameter': the value as gin writes it}, for comparing the processes of one
  run (`check_same_processes`). Empty when gin is not in use."""
  import gin  # pylint: disable=g-import-not-at-top
  out = {}
  for (scope, selector), params in gin.config._CONFIG.items():  # pylint: disable=protected-access
    for name, value in params.items():
      key = scope if selector == 'gin.macro' else f'{scope + "/" if scope else ""}{selector}.{name}'
      out[key] = gin.config._format_value(value)  # pylint: disable=protected-access
  return dict(sorted(out.items()))


def write_gin_config(path: str) -> None:
  """gin's operative configuration (every parameter the run used, after overrides) as text at
  `path` (a run folder's config.gin, as t5x writes it; OUTPUT_PATH.config.gin beside a
  schedule), written atomically: for reading, never compared. Nothing when gin is not in use (a
  job built in Python)."""
  gin = sys.modules.get('gin')
  text = gin.operative_config_str() if gin is not None else ''
  if text.strip():
    fileio.write_atomic(path, text)


# ---------------------------------------------------------------------------------------------
# A job's settings.


def settings_record(settings: Any) -> dict[str, Any]:
  """{field: value} of a job (or a settings object it holds, nested the same way): every
  dataclass field but those marked `NOT_IDENTITY` (their metadata says why), a value through
  its `RECORDED_AS` function if it has one."""
  out = {}
  for field in dataclasses.fields(settings):
    if NOT_IDENTITY in field.metadata:
      continue
    value = getattr(settings, field.name)
    if RECORDED_AS in field.metadata:
      value = field.metadata[RECORDED_AS](value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
      value = settings_record(value)
    out[field.name] = value
  return out


# ---------------------------------------------------------------------------------------------
# Identities and their comparison.


def make(*, checkpoint: str | None = None, vocabulary: Any = None,
         facts: Mapping[str, Any] | None = None,
         settings: Mapping[str, Any] | None = None, resolved_checkpoint: str | None = None,
         fingerprint: bool = True) -> dict[str, Any]:
  """A run identity of format `FORMAT` (JSON values only): how every job's record is formed
  (eval's run.json, calibrate's log header and schedule provenance, train's run.json, the
  demo's), compared by `check_same`.

  Args:
    checkpoint: the checkpoint path: recorded as 'checkpoint' (`checkpoint_fingerprint` of the
      resolved path), 'checkpoint_path' (as given) and 'checkpoint_resolved_path' (both
      informational: `INFORMATIONAL` fields are not compared).
    vocabulary: anything `vocabulary_fingerprint` takes.
    facts: what else the results depend on (JSON-able), at the top level.
    settings: the job's settings (`settings_record`), as 'settings'.
    resolved_checkpoint: where the run reads `checkpoint` from (`jobs.common.Checkpoint.resolved`);
      None: `checkpoint` with its symlinks resolved now.
    fingerprint: read the checkpoint's content for 'checkpoint' (False: None, for a process
      that records nothing).
  """
  out: dict[str, Any] = {'format': FORMAT}
  if checkpoint is not None:
    resolved = resolved_checkpoint or resolved_path(checkpoint)
    out['checkpoint'] = checkpoint_fingerprint(resolved) if fingerprint else None
    out['checkpoint_path'] = os.fspath(checkpoint)
    out['checkpoint_resolved_path'] = resolved
  if vocabulary is not None:
    out['vocabulary'] = vocabulary_fingerprint(vocabulary)
  out['jax_default_matmul_precision'] = matmul_precision()
  out.update(facts or {})
  if settings is not None:
    out['settings'] = dict(settings)
  return json.loads(json.dumps(out, sort_keys=True))


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


# ---------------------------------------------------------------------------------------------
# Records of earlier formats.

KINDS = ('eval', 'calibration', 'train', 'demo')
# Format 1's top-level settings by their place in format 2's 'settings' (dotted: a settings
# object's field), per kind of record; and the values format 1 left out (those added later,
# recorded only when not their defaults), as runs had them then.
_FORMAT_1_SETTINGS = {
    'eval': {'params_dtype': 'checkpoint.params_dtype', 'split': 'split',
             'truncate_inputs': 'truncate_inputs'},
    'calibration': {
        'params_dtype': 'checkpoint.params_dtype', 'per_task': 'per_task',
        'reference_tasks': 'reference_tasks', 'lengths': 'lengths', 'strategies': 'strategies',
        'reference_length': 'reference_length', 'num_samples': 'num_samples', 'seed': 'seed',
        'mesh_shape': 'mesh_shape', 'grid': 'search.grid', 'tol': 'search.tol',
        'bracket': 'search.bracket', 'points': 'search.points'},
    'train': {
        'seed': 'seed', 'num_steps': 'num_steps', 'batch_size': 'batch_size',
        'learning_rate': 'optimizer.learning_rate', 'warmup_steps': 'optimizer.warmup_steps',
        'weight_decay': 'optimizer.weight_decay', 'clip_norm': 'optimizer.clip_norm',
        'optimizer': 'optimizer.name', 'schedule': 'optimizer.schedule',
        'decay_fraction': 'optimizer.decay_fraction', 'per_example_loss': 'per_example_loss',
        'mix': 'mix.weights', 'min_length': 'mix.min_length',
        'length_power': 'mix.length_power', 'min_units': 'mix.min_units',
        'input_length': 'input_length', 'target_length': 'target_length',
        'vocab_size': 'vocab_size', 'mixture_or_task_name': 'mixture_or_task_name'},
    'demo': {},
}
_FORMAT_1_UNRECORDED = {
    'eval': {'truncate_inputs': None},
    'calibration': {'search.bracket': [0.05, 1.0], 'search.points': None},
    'train': {'optimizer.clip_norm': 1.0, 'optimizer.decay_fraction': 0.2,
              'mix.min_length': 0, 'mixture_or_task_name': None},
    'demo': {},
}
# Task options format 1 recorded only when not their defaults (RULER's, added later).
_FORMAT_1_TASK_OPTIONS = {'ruler_examples': 500, 'ruler_budget': 'upstream',
                          'ruler_essays': None, 'ruler_squad': None, 'ruler_hotpotqa': None}
# What format 1 left out of a fine-tuning run's record: the synthetic data's settings.
_FORMAT_1_FINETUNING_UNRECORDED = ('mix', 'vocab_size')


def _place(tree: dict[str, Any], dotted: str, value: Any) -> None:
  *parents, leaf = dotted.split('.')
  for name in parents:
    tree = tree.setdefault(name, {})
  tree[leaf] = value


def _format_1_to_2(record: dict[str, Any], kind: str) -> dict[str, Any]:
  """Format 1 -> 2: 'gin' goes (config.gin holds it now); the settings move into 'settings';
  what format 1 left out at its default gets that default; jax's matmul precision, recorded
  only when set, reads as None when absent."""
  out = {k: v for k, v in record.items() if k != 'gin'}
  settings: dict[str, Any] = {}
  finetuning = kind == 'train' and 'mixture_or_task_name' in record
  for old, new in _FORMAT_1_SETTINGS[kind].items():
    if old in out:
      _place(settings, new, out.pop(old))
    elif new in _FORMAT_1_UNRECORDED[kind] and not (
        finetuning and new.split('.')[0] in _FORMAT_1_FINETUNING_UNRECORDED):
      _place(settings, new, _FORMAT_1_UNRECORDED[kind][new])
  if kind == 'train':
    # Fine-tuning read its initial checkpoint in float32 (format 1 recorded its content only).
    settings['initial_checkpoint'] = {'params_dtype': 'float32'} if 'checkpoint' in out else None
  if kind == 'eval' and isinstance(out.get('task_options'), Mapping):
    out['task_options'] = {**_FORMAT_1_TASK_OPTIONS, **out['task_options']}
  out.setdefault('jax_default_matmul_precision', None)
  if settings or kind != 'demo':
    out['settings'] = settings
  out['format'] = 2
  return out


# Format 3 added T5Config.encoder_bias_rule to the recorded config (eval, train); every run
# before it read T5's bias as trained.
_FORMAT_2_BIAS_RULE = "BiasRule(kind='none', scale=None, reference_length=None)"


def _format_2_to_3(record: dict[str, Any]) -> dict[str, Any]:
  """Format 2 -> 3: a recorded model config gets `encoder_bias_rule`, T5's bias."""
  out = dict(record)
  if isinstance(out.get('config'), Mapping) and 'encoder_bias_rule' not in out['config']:
    out['config'] = {**out['config'], 'encoder_bias_rule': _FORMAT_2_BIAS_RULE}
  out['format'] = 3
  return out


def upgrade(record: Any, kind: str, source: str = 'a run record') -> Any:
  """A recorded identity (`kind`: one of `KINDS`; `source`: where it was read, for errors) in
  today's format (`FORMAT`): the one place records of an earlier format are converted, on read,
  as t5x and gemma convert checkpoints. A record that is not an object is returned as it is
  (`check_same` refuses it)."""
  if kind not in KINDS:
    raise ValueError(f'kind={kind!r}; expected one of {KINDS}.')
  if not isinstance(record, Mapping):
    return record
  record = dict(record)
  version = record.get('format', 1)
  if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT:
    raise ValueError(f'{source} is of format {version!r}: this t5align reads formats 1 to '
                     f'{FORMAT} (a newer t5align wrote it?).')
  if version == 1:
    record = _format_1_to_2(record, kind)
  if record['format'] == 2:
    record = _format_2_to_3(record)
  return record


def differences(before: Any, now: Any, *, ignore: Collection[str] = INFORMATIONAL,
                prefix: str = '') -> dict[str, tuple[Any, Any]]:
  """{dotted field: (before, now)} of every field that differs; objects are compared key by
  key (a missing key reads as None), everything else as a whole. `ignore`: top-level fields."""
  if not (isinstance(before, Mapping) and isinstance(now, Mapping)):
    return {} if before == now else {prefix or '(value)': (before, now)}
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


def check_same(before: Mapping[str, Any] | None, now: Mapping[str, Any], *, kind: str,
               what: str, hint: str, ignore: Collection[str] = INFORMATIONAL,
               checkpoint_setting: str = 'CHECKPOINT_PATH') -> None:
  """Raises `RunMismatchError` naming every field where `now` differs from `before`.

  Args:
    before: the recorded identity, of any format (`upgrade`d first); None: nothing was
      recorded (refused: the results there cannot be attributed).
    kind: what recorded it (`KINDS`), for `upgrade`.
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
  diff = differences(upgrade(before, kind), now, ignore=ignore)
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


def check_run(folder: str | os.PathLike[str], settings: Mapping[str, Any], *, kind: str,
              has_results: bool | None = None) -> None:
  """Writes run.json, or checks that the run that made the folder's results had the same
  identity (`check_same`: every field but `INFORMATIONAL`; a record of an earlier format is
  upgraded, the file left as it is). Either way gin's configuration goes beside it
  (`write_gin_config`).

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
    check_same(before, settings, kind=kind, what=os.fspath(folder),
               hint='Use another output folder (or move this one away).')
  else:
    fileio.write_json_atomic(path, settings)
  write_gin_config(fileio.join(folder, GIN_CONFIG_FILE))
