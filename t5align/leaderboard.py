r"""The ZeroSCROLLS leaderboard's CSV from test-split evaluation folders.

    python -m t5align.leaderboard EVAL_OUTPUT_DIR [EVAL_OUTPUT_DIR ...] \
      --output zero_scrolls_predictions.csv [--length 8192] [--allow_incomplete]

Reads every `t5align_zeroscrolls_{task}_{L}` folder under the folders (`python -m t5align.eval`
writes one per task, on its default split 'test'): run.json (its split must be 'test'),
metrics.json (written once every example has its record: the run finished) and predictions.jsonl
(each record's 'id' and 'prediction', the decoded output as is). An id recorded twice is kept
once (the verifier keys predictions by id; two different predictions for one id are an error).
The predictions are then checked by the rules of ZeroSCROLLS' verifier
(tau-nlp/zero_scrolls:submission/verify_submission.py and verify_task.py): all 10 tasks, a
prediction for every test id of the data (read from the ZeroSCROLLS folder,
`seqio_tasks.zeroscrolls.zeroscrolls_dir`) and for no other id, each a string; and written
atomically as the CSV with columns Task, ID, Prediction, to upload at
https://www.zero.scrolls-benchmark.com/submission (5 submissions a week).

--length picks one input length when the folders hold several. --allow_incomplete writes the
CSV even when tasks or test ids are missing, or the data is not there to check the ids against
(to look at, not to upload; each gap is printed).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Mapping, Sequence

from t5align.runtime import fileio
from t5align.runtime import outputs

FOLDER = re.compile(r'^t5align_zeroscrolls_(?P<task>[a-z_]+)_(?P<length>\d+)$')


def task_folders(folders: Sequence[str], length: int | None = None) -> dict[str, str]:
  """{ZeroSCROLLS task: its folder} under `folders` (at `length` input tokens, if given).

  Raises:
    ValueError: when a task has folders at several lengths (and no `length`), or two folders
      at the same length.
  """
  found: dict[str, dict[int, list[str]]] = {}
  for folder in folders:
    for root, dirs, _ in os.walk(folder):
      dirs.sort()
      match = FOLDER.match(os.path.basename(root))
      if match and (length is None or int(match['length']) == length):
        found.setdefault(match['task'], {}).setdefault(int(match['length']), []).append(root)
  out = {}
  for task, by_length in found.items():
    if len(by_length) > 1:
      raise ValueError(f'{task} was evaluated at several input lengths '
                       f'({", ".join(map(str, sorted(by_length)))}): pick one with --length.')
    (paths,) = by_length.values()
    if len(paths) > 1:
      raise ValueError(f'{task}: several folders of the same task and length: '
                       f'{", ".join(paths)}; pass only the one to submit.')
    out[task] = paths[0]
  return out


def read_predictions(folder: str, allow_incomplete: bool = False) -> dict[str, str]:
  """{id: prediction} of one task folder, each id once.

  Raises:
    ValueError: naming the folder, for a split other than 'test', an unfinished run (unless
      `allow_incomplete`), a record without a string 'id' and 'prediction', or an id with two
      different predictions.
  """
  run = outputs.read_json(os.path.join(folder, 'run.json'), 'run record')
  split = run.get('split') if isinstance(run, dict) else None
  if split != 'test':
    raise ValueError(f'{folder} holds predictions for the split {split!r}; the leaderboard takes '
                     "the 'test' split: evaluate with t5align.eval's default split.")
  if not fileio.exists(os.path.join(folder, 'metrics.json')):
    message = (f'{folder}: the run has not finished (no metrics.json); rerun the same '
               't5align.eval command to finish it.')
    if not allow_incomplete:
      raise ValueError(message)
    print(f'warning: {message}', file=sys.stderr)
  path = os.path.join(folder, 'predictions.jsonl')
  raw = fileio.read_bytes(path)
  predictions: dict[str, str] = {}
  # Read only (a torn last line is not a record, and not cut here: the folder is the run's).
  for number, line in enumerate(outputs.decode_lines(outputs.whole_lines(raw), path), 1):
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f'{path}:{number}: not valid JSON ({e.msg}).') from e
    example_id = record.get('id') if isinstance(record, dict) else None
    prediction = record.get('prediction') if isinstance(record, dict) else None
    if not isinstance(example_id, str) or not isinstance(prediction, str):
      raise ValueError(f'{path}:{number}: expected a string "id" and "prediction" (a '
                       't5align.eval prediction record).')
    if predictions.setdefault(example_id, prediction) != prediction:
      raise ValueError(f'{path}:{number}: id {example_id!r} has two different predictions; the '
                       'leaderboard takes one per id.')
  return predictions


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
  """Writes the CSV of the folders' predictions to `output` (atomically); returns them.

  Raises:
    ValueError: for what the verifier refuses (see the module docstring) and bad folders.
    FileNotFoundError: for a missing ZeroSCROLLS file (unless `allow_incomplete`).
  """
  from seqio_tasks import zeroscrolls  # pylint: disable=g-import-not-at-top
  folder_of = task_folders(folders, length)
  if not folder_of:
    raise ValueError(f'no t5align_zeroscrolls_* task folder under {", ".join(folders)}'
                     + (f' at length {length}' if length else '') + '.')
  predictions = {t: read_predictions(folder_of[t], allow_incomplete)
                 for t in zeroscrolls.TASKS if t in folder_of}
  missing, invalid = zeroscrolls.submission_problems(
      predictions, expected_ids(list(predictions), allow_incomplete))
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
  parser.add_argument('folders', nargs='+', help='t5align.eval output folders (test split)')
  parser.add_argument('--output', required=True, help='the CSV file to write')
  parser.add_argument('--length', type=int, help='the input length to take (several present)')
  parser.add_argument('--allow_incomplete', action='store_true',
                      help='write even with tasks or test ids missing (not to upload)')
  args = parser.parse_args(argv)
  missing = [f for f in args.folders if not os.path.isdir(f)]
  if missing:
    parser.error(f'not a folder: {", ".join(missing)}')
  try:
    predictions = export(args.folders, args.output, length=args.length,
                         allow_incomplete=args.allow_incomplete)
  except (ValueError, FileNotFoundError) as e:  # DataError is a ValueError.
    parser.error(str(e))
  print(_summary(predictions, args.output), file=sys.stderr)
  return 0


if __name__ == '__main__':
  sys.exit(main())
