"""What tests of the jobs share: the shipped model and the settings of a small eval and
calibration on it, an environment for the subprocesses they start, and the inputs they change.

`eval_args` and `calibrate_args` run 2 passkey examples and a calibration of 2 lengths on the
shipped retrieval model (t5align/shipped/retrieval_t5), small enough for the test lanes. Imported
as `import runs`, beside conftest.py.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket

import numpy as np

from t5align import calibration
from t5align import checkpoints
from t5align import jobs
from t5align import schedule
from t5align.shipped import assets

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
ASSET = REPO_ROOT / 't5align' / 'shipped' / 'retrieval_t5'
CKPT = pathlib.Path(assets.checkpoint_dir(str(ASSET)))
VOCAB = ASSET / 'sentencepiece.model'
TASK = 't5align_passkey_2k'
# A subprocess's environment: this checkout first on its path.
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT),
                                                   os.environ.get('PYTHONPATH', '')]))


def eval_args(out: pathlib.Path, checkpoint: pathlib.Path | str, *extra: str,
              num_examples: int = 2) -> list[str]:
  """`python -m t5align.eval`'s flags: `num_examples` passkey examples of `checkpoint` (the
  shipped model's gin file) into `out`, 4 tokens decoded, then `extra`."""
  return ['--gin_file=gin/runs/eval.gin', '--gin_file=gin/models/retrieval_small.gin',
          f'--gin.CHECKPOINT_PATH={checkpoint}', f'--gin.EVAL_OUTPUT_DIR={out}',
          f'--gin.MIXTURE_OR_TASK_NAME={TASK}', f'--gin.NUM_EXAMPLES={num_examples}',
          '--gin.BATCH_SIZE=2', '--gin.MAX_DECODE_LENGTH=4', *extra]


def calibrate_args(tmp_path: pathlib.Path) -> dict:
  """`jobs.CalibrationJob`'s fields: pmax and entropy at 384 and 512 on the README's text, one
  sample and a 3-point grid, into `tmp_path`/schedule.json."""
  return dict(checkpoint=jobs.Checkpoint(str(CKPT)), output_path=str(tmp_path / 'schedule.json'),
              text_file=str(REPO_ROOT / 'README.md'), vocabulary_path=str(VOCAB),
              lengths=(384, 512), strategies=('pmax', 'entropy'), reference_length=256,
              num_samples=1, dtype='float32', attention_impl='reference',
              search=calibration.SearchSettings(grid=(1.0, 0.9, 0.8), batch_size=1))


def vocabulary(path: pathlib.Path, *, extra_pieces: int = 0, rescore: bool = False) -> str:
  """The shipped SentencePiece model with `extra_pieces` more pieces, or one score changed."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(VOCAB.read_bytes())
  for i in range(extra_pieces):
    piece = proto.pieces.add()
    piece.piece, piece.score = f'extra{i}', -100.0 - i
  if rescore:
    proto.pieces[-1].score -= 1.0
  path.write_bytes(proto.SerializeToString())
  return str(path)


def two_checkpoints(root: pathlib.Path, source: pathlib.Path) -> tuple[str, str]:
  """checkpoint_8 (a copy of `source`) and checkpoint_12 (every weight negated) under `root`."""
  eight = root / 'run8' / 'checkpoint_8'
  shutil.copytree(source, eight)
  params = checkpoints.read_params(str(eight))
  negated = {k: -np.asarray(v) for k, v in checkpoints.flatten_params(params).items()}
  twelve = checkpoints.save_t5x_checkpoint(checkpoints.unflatten_params(negated),
                                           str(root / 'run12'), 12, optimizer_state=None)
  return str(eight), twelve


def point(link: pathlib.Path, target: str) -> None:
  """Re-points `link` at `target` atomically (a new link renamed over it), as `ln -sfn` would."""
  tmp = link.with_name(link.name + '.new')
  os.symlink(target, tmp)
  os.replace(tmp, link)


def schedule_with_target(path: pathlib.Path, target) -> pathlib.Path:
  """A one-calibration schedule file (pmax at 512) whose informational `target` is `target`."""
  data = {'format': schedule.FORMAT, 'reference_length': 256, 'strategy': 'pmax',
          'calibrations': {'pmax': [{'strategy': 'pmax', 'length': 512, 'tau': 0.9,
                                     'reference_length': 256, 'target': target}]}}
  path.write_text(json.dumps(data))  # json writes NaN for float('nan').
  return path


def free_port() -> int:
  """A TCP port of 127.0.0.1 that nothing listens at (for a coordinator address)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]
