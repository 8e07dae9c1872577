r"""The ZeroSCROLLS leaderboard's CSV from test-split predictions: `t5align.eval` folders or
`t5x.infer` output files.

    python -m t5align.leaderboard PATH [PATH ...] \
      --output zero_scrolls_predictions.csv [--length 8192] [--allow_incomplete]

Each PATH is a folder, searched for both kinds, or a t5x.infer output file:
- `t5align_zeroscrolls_{task}_{L}` folders (`python -m t5align.eval` writes one per task, on its
  default split 'test'): run.json (its split must be 'test'), metrics.json (written once every
  example has its record: the run finished) and predictions.jsonl (each record's 'id' and
  'prediction', the decoded output as is).
- `t5align_zeroscrolls_{task}_{L}-predict.jsonl-{shard}-of-{shards}` files (`python -m t5x.infer`
  with gin/t5x/infer.gin writes one per task and shard): each line {"inputs": {"id": ...},
  "prediction": ...}; the config.gin beside them (t5x writes it) must give the split 'test'
  (`utils.DatasetConfig.split`), every shard of the task must be there and each must have its
  `.COMPLETED` marker (t5x writes it once the file is whole: the run finished).

An id recorded twice is kept once (the verifier keys predictions by id; two different predictions
for one id are an error). The predictions are then checked by the rules of ZeroSCROLLS' verifier
(tau-nlp/zero_scrolls:submission/verify_submission.py and verify_task.py): all 10 tasks, a
prediction for every test id of the data (read from the ZeroSCROLLS folder,
`seqio_tasks.zeroscrolls.zeroscrolls_dir`) and for no other id, each a string; and written
atomically as the CSV with columns Task, ID, Prediction, to upload at
https://www.zero.scrolls-benchmark.com/submission (5 submissions a week).

--length picks one input length when the paths hold several. A task found twice at one length
(two folders, or a folder and t5x.infer files) is refused: pass only the one to submit.
--allow_incomplete writes the CSV even when tasks, test ids or t5x.infer shards are missing, a run
has not finished, or the data is not there to check the ids against (to look at, not to upload;
each gap is printed).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import tokenize
from typing import Mapping, Sequence

from gin import config_parser

from t5align import run_identity
from t5align.runtime import fileio
from t5align.runtime import outputs

FOLDER = re.compile(r'^t5align_zeroscrolls_(?P<task>[a-z_]+)_(?P<length>\d+)$')
# t5x.infer's output file of a task: `{task name}-{mode}.jsonl-{shard:05}-of-{shards:05}`
# (t5x/infer.py; 'predict_with_aux' records hold the 'prediction' too).
INFER_FILE = re.compile(r'^t5align_zeroscrolls_(?P<task>[a-z_]+)_(?P<length>\d+)'
                        r'-(?:predict|predict_with_aux)\.jsonl-(?P<shard>\d{5})-of-(?P<shards>\d{5})$')


@dataclasses.dataclass(frozen=True)
class Source:
  """Where one task's predictions are: a t5align.eval folder, or t5x.infer's files of one run
  (its shards of the task, in one folder)."""

  task: str
  length: int
  folder: str  # the t5align.eval task folder, or the folder of the t5x.infer files
  infer_files: tuple[str, ...] = ()  # () for a t5align.eval folder

  def __str__(self) -> str:
    if not self.infer_files:
      return self.folder
    return self.infer_files[0] + (f' (+{len(self.infer_files) - 1} shards)'
                                  if len(self.infer_files) > 1 else '')


def _infer_file(path: str, length: int | None) -> re.Match | None:
  match = INFER_FILE.match(os.path.basename(path))
  return match if match and (length is None or int(match['length']) == length) else None


def task_sources(paths: Sequence[str], length: int | None = None) -> dict[str, Source]:
  """{ZeroSCROLLS task: where its predictions are} under `paths` (folders, searched for
  t5align.eval task folders and t5x.infer files, or t5x.infer files), at `length` input tokens
  if given.

  Raises:
    ValueError: for a file that is not a t5x.infer output file of a ZeroSCROLLS task, a task
      found at several lengths (and no `length`), or twice at the same length.
  """
  found: dict[str, dict[int, list[Source]]] = {}
  infer: dict[tuple[str, str, int], list[str]] = {}  # (folder, task, length): files

  def add_infer(path: str) -> None:
    match = _infer_file(path, length)
    if match:
      key = (os.path.dirname(path), match['task'], int(match['length']))
      infer.setdefault(key, []).append(path)

  for path in paths:
    if not os.path.isdir(path):
      if not INFER_FILE.match(os.path.basename(path)):
        raise ValueError(f'{path}: not a folder, nor a t5x.infer output file of a ZeroSCROLLS '
                         'task (t5align_zeroscrolls_{task}_{L}-predict.jsonl-00000-of-00001).')
      add_infer(path)
      continue
    for root, dirs, files in os.walk(path):
      dirs.sort()
      match = FOLDER.match(os.path.basename(root))
      if match and (length is None or int(match['length']) == length):
        source = Source(match['task'], int(match['length']), root)
        found.setdefault(source.task, {}).setdefault(source.length, []).append(source)
      for name in sorted(files):
        add_infer(os.path.join(root, name))
  for (folder, task, task_length), files in infer.items():
    source = Source(task, task_length, folder, tuple(sorted(set(files))))
    found.setdefault(task, {}).setdefault(task_length, []).append(source)
  out = {}
  for task, by_length in found.items():
    if len(by_length) > 1:
      raise ValueError(f'{task} was evaluated at several input lengths '
                       f'({", ".join(map(str, sorted(by_length)))}): pick one with --length.')
    (sources,) = by_length.values()
    if len(sources) > 1:
      raise ValueError(f'{task}: several predictions of the same task and length: '
                       f'{", ".join(map(str, sources))}; pass only the one to submit.')
    out[task] = sources[0]
  return out


class _Values(config_parser.ParserDelegate):
  """Reads a config.gin without its configurables: a reference or macro stays a name."""

  def configurable_reference(self, scoped_name: str, evaluate: bool) -> tuple[str, str]:
    return ('@', scoped_name)

  def macro(self, name: str) -> tuple[str, str]:
    return ('%', name)


def infer_split(config: str) -> object:
  """The split t5x.infer predicted: `utils.DatasetConfig.split` (unscoped, the last binding, as
  gin applies them; through a macro too) in the config.gin t5x wrote, read by gin's own parser
  (either quote style, the block form `utils.DatasetConfig:` too); None if none is bound.

  Raises:
    ValueError: naming the file and line, for text gin cannot parse.
  """
  text = fileio.read_input(config, 't5x.infer config').decode('utf-8', 'replace')
  split, macros = None, {}
  try:
    for statement in config_parser.ConfigParser(text, _Values()):
      if not isinstance(statement, config_parser.BindingStatement):
        continue
      if not statement.arg_name:  # A macro: `NAME = value`.
        macros[statement.selector] = statement.value
      elif (not statement.scope and statement.arg_name == 'split' and (
          statement.selector == 'utils.DatasetConfig'
          or statement.selector.endswith('.utils.DatasetConfig'))):
        split = statement.value
  except SyntaxError as e:
    raise ValueError(f'{config}:{e.lineno}: not a gin file t5x.infer wrote ({e.msg}).') from e
  except tokenize.TokenError as e:  # gin's tokenizer: an unclosed bracket or string.
    message, (line, _) = e.args
    raise ValueError(f'{config}:{line}: not a gin file t5x.infer wrote ({message}).') from e
  for _ in range(len(macros) + 1):  # A macro of a macro: followed to its value.
    if not (isinstance(split, tuple) and split[:1] == ('%',)):
      break
    split = macros.get(split[1])
  return split


def _unfinished(message: str, allow_incomplete: bool) -> None:
  if not allow_incomplete:
    raise ValueError(message)
  print(f'warning: {message}', file=sys.stderr)


def _add_records(path: str, lines: Sequence[str], pick, what: str,
                 predictions: dict[str, str]) -> None:
  """Adds each line's (id, prediction), `pick(record)` (None: not such a record), to
  `predictions`; an id recorded again must have the same prediction."""
  for number, line in enumerate(lines, 1):
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f'{path}:{number}: not valid JSON ({e.msg}).') from e
    picked = pick(record) if isinstance(record, dict) else None
    if picked is None or not all(isinstance(v, str) for v in picked):
      raise ValueError(f'{path}:{number}: expected {what}.')
    example_id, prediction = picked
    if predictions.setdefault(example_id, prediction) != prediction:
      raise ValueError(f'{path}:{number}: id {example_id!r} has two different predictions; the '
                       'leaderboard takes one per id.')


def read_predictions(folder: str, allow_incomplete: bool = False) -> dict[str, str]:
  """{id: prediction} of one t5align.eval task folder, each id once.

  Raises:
    ValueError: naming the folder, for a split other than 'test', an unfinished run (unless
      `allow_incomplete`), a record without a string 'id' and 'prediction', or an id with two
      different predictions.
  """
  run_file = os.path.join(folder, 'run.json')
  run = run_identity.upgrade(outputs.read_json(run_file, 'run record'), 'eval', run_file)
  settings = run.get('settings') if isinstance(run, dict) else None
  split = settings.get('split') if isinstance(settings, dict) else None
  if split != 'test':
    raise ValueError(f'{folder} holds predictions for the split {split!r}; the leaderboard takes '
                     "the 'test' split: evaluate with t5align.eval's default split.")
  finished = fileio.exists(os.path.join(folder, 'metrics.json'))
  if not finished:
    _unfinished(f'{folder}: the run has not finished (no metrics.json); rerun the same '
                't5align.eval command to finish it.', allow_incomplete)
  path = os.path.join(folder, 'predictions.jsonl')
  predictions: dict[str, str] = {}
  _add_records(path, _whole_lines(path, finished), lambda r: (r.get('id'), r.get('prediction')),
               'a string "id" and "prediction" (a t5align.eval prediction record)', predictions)
  return predictions


def _whole_lines(path: str, finished: bool) -> list[str]:
  """The lines of a predictions file (read through `fileio.read_input`: no fifo, device or
  oversized file). A torn last line (no newline: the writer was stopped mid-line) is no record:
  in a finished run's file an error, in an unfinished one's (allowed by `allow_incomplete`, the
  caller checked) dropped, with a warning that counts its bytes. Read only: the file is the
  run's, not cut here."""
  raw = fileio.read_input(path, 'predictions file')
  whole = outputs.whole_lines(raw)
  if len(whole) < len(raw):
    line = whole.count(b'\n') + 1
    torn = f'{path}:{line}: a torn last line ({len(raw) - len(whole)} bytes'
    if finished:
      raise ValueError(f'{torn}, no newline) in the file of a finished run; the file was cut or '
                       'edited: rerun the command that wrote it.')
    print(f'warning: {torn}) dropped: the run was stopped while writing it.', file=sys.stderr)
  return outputs.decode_lines(whole, path)


def _infer_id(record: dict) -> tuple[object, object] | None:
  inputs = record.get('inputs')
  return (inputs.get('id'), record.get('prediction')) if isinstance(inputs, dict) else None


def read_infer_predictions(files: Sequence[str],
                           allow_incomplete: bool = False) -> dict[str, str]:
  """{id: prediction} of one task's t5x.infer output files (the shards of one run), each id once.

  Raises:
    ValueError: naming the file, for a config.gin beside them that is missing or gives a split
      other than 'test'; shards of different counts; a missing shard or one without its
      .COMPLETED marker (unless `allow_incomplete`); a line that is not {"inputs": {"id": str},
      "prediction": str}; an id with two different predictions.
  """
  folder = os.path.dirname(files[0])
  config = os.path.join(folder, 'config.gin')
  if not fileio.exists(config):
    raise ValueError(f'{files[0]}: no config.gin beside it, which says the split t5x.infer '
                     'predicted; pass the INFER_OUTPUT_DIR as t5x.infer left it.')
  split = infer_split(config)
  if split != 'test':
    raise ValueError(f'{config}: t5x.infer predicted the split '
                     f'{"(none given)" if split is None else repr(split)}; the leaderboard takes '
                     "the 'test' split (utils.DatasetConfig.split, gin/t5x/infer.gin's default).")
  shards = {int(INFER_FILE.match(os.path.basename(f))['shards']) for f in files}
  if len(shards) > 1:
    raise ValueError(f'{folder}: t5x.infer files of one task with different shard counts '
                     f'({", ".join(map(os.path.basename, files))}).')
  (count,) = shards
  present = {int(INFER_FILE.match(os.path.basename(f))['shard']) for f in files}
  lacking = sorted(set(range(count)) - present)
  if lacking:
    _unfinished(f'{files[0]}: shard(s) {lacking} of {count} are missing; run t5x.infer with '
                'each --shard_id.', allow_incomplete)
  predictions: dict[str, str] = {}
  for path in files:
    finished = fileio.exists(path + '.COMPLETED')
    if not finished:
      _unfinished(f'{path}: the run has not finished (no {os.path.basename(path)}.COMPLETED); '
                  'rerun the same t5x.infer command to finish it.', allow_incomplete)
    _add_records(path, _whole_lines(path, finished), _infer_id,
                 '{"inputs": {"id": ...}, "prediction": ...} with string values (a t5x.infer '
                 'record written with gin/t5x/infer.gin, which writes the id)', predictions)
  return predictions


def read_source(source: Source, allow_incomplete: bool = False) -> dict[str, str]:
  """{id: prediction} of a task's `Source`."""
  if source.infer_files:
    return read_infer_predictions(source.infer_files, allow_incomplete)
  return read_predictions(source.folder, allow_incomplete)


def expected_ids(tasks: Sequence[str], allow_incomplete: bool = False) -> dict[str, list[str]]:
  """{task: the test split's ids} from the ZeroSCROLLS files (without them: an error, or with
  `allow_incomplete` a warning and no check for that task)."""
  from seqio_tasks import zeroscrolls  # pylint: disable=g-import-not-at-top
  out = {}
  for task in tasks:
    try:
      out[task] = zeroscrolls.record_ids(task, 'test')
    except FileNotFoundError as e:
      if not allow_incomplete:
        raise FileNotFoundError(f'{e} (The ids are checked against it; --allow_incomplete '
                                'writes the CSV without the check.)') from e
      print(f'warning: {task}: test ids not checked ({e})', file=sys.stderr)
  return out


def export(folders: Sequence[str], output: str, *, length: int | None = None,
           allow_incomplete: bool = False) -> dict[str, dict[str, str]]:
  """Writes the CSV of the predictions in `folders` (folders or t5x.infer files; see
  `task_sources`) to `output` (atomically); returns them.

  Raises:
    ValueError: for what the verifier refuses (see the module docstring) and bad inputs.
    FileNotFoundError: for a missing ZeroSCROLLS file (unless `allow_incomplete`).
  """
  from seqio_tasks import zeroscrolls  # pylint: disable=g-import-not-at-top
  source_of = task_sources(folders, length)
  if not source_of:
    raise ValueError(f'no t5align_zeroscrolls_* task folder or t5x.infer file in '
                     f'{", ".join(folders)}' + (f' at length {length}' if length else '') + '.')
  predictions = {t: read_source(source_of[t], allow_incomplete)
                 for t in zeroscrolls.TASKS if t in source_of}
  # A task not ZeroSCROLLS' (a misspelt folder or file) is refused by the verifier's rule,
  # naming where it was found; it is not read.
  unknown = {t: {} for t in source_of if t not in zeroscrolls.TASKS}
  missing, invalid = zeroscrolls.submission_problems(
      {**predictions, **unknown}, expected_ids(list(predictions), allow_incomplete))
  if unknown:
    invalid.append('found as ' + ', '.join(str(source_of[t]) for t in unknown))
  if invalid or (missing and not allow_incomplete):
    raise ValueError('the leaderboard would refuse these predictions: '
                     + '; '.join(invalid + missing) + '.'
                     + (' (--allow_incomplete writes them anyway, to look at.)'
                        if missing and not invalid else ''))
  for problem in missing:
    print(f'warning: {problem}; the leaderboard would refuse this CSV.', file=sys.stderr)
  fileio.write_atomic(output, zeroscrolls.leaderboard_csv(predictions))
  return predictions


def _summary(predictions: Mapping[str, Mapping[str, str]], output: str) -> str:
  counts = ', '.join(f'{t} {len(p)}' for t, p in predictions.items())
  return f'wrote {output}: {sum(len(p) for p in predictions.values())} predictions ({counts})'


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m t5align.leaderboard', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('folders', nargs='+', metavar='PATH',
                      help='t5align.eval output folders, t5x.infer output folders or files '
                           '(test split)')
  parser.add_argument('--output', required=True, help='the CSV file to write')
  parser.add_argument('--length', type=int, help='the input length to take (several present)')
  parser.add_argument('--allow_incomplete', action='store_true',
                      help='write even with tasks or test ids missing (not to upload)')
  args = parser.parse_args(argv)
  missing = [f for f in args.folders if not os.path.exists(f)]
  if missing:
    parser.error(f'no such folder or file: {", ".join(missing)}')
  try:
    predictions = export(args.folders, args.output, length=args.length,
                         allow_incomplete=args.allow_incomplete)
  except (ValueError, FileNotFoundError) as e:  # DataError is a ValueError.
    parser.error(str(e))
  print(_summary(predictions, args.output), file=sys.stderr)
  return 0


if __name__ == '__main__':
  sys.exit(main())
