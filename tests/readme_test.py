"""README.md as tested code: each fenced block runs as written, or is checked (doc_blocks.py).

The shell blocks that run write below $OUT, set here to a temporary folder.
"""
from __future__ import annotations

import pytest

import doc_blocks

README = doc_blocks.REPO_ROOT / 'README.md'
EXAMPLES = doc_blocks.examples(README)


def test_readme_has_runnable_and_check_only_blocks():
  blocks = [e.parsed for e in EXAMPLES]
  assert sum(b.needs is None and b.language == 'python' for b in blocks) >= 1
  assert sum(b.needs is None and b.language == 'sh' for b in blocks) >= 1
  assert all(b.needs for b in blocks if b.needs is not None)


@pytest.mark.parametrize('example', EXAMPLES, ids=lambda e: f'README.md:{e.line}')
def test_readme_block(example, tmp_path_factory, monkeypatch):
  monkeypatch.setenv('OUT', str(tmp_path_factory.mktemp('readme_out')))
  example.evaluate()


@pytest.mark.parametrize('language, source, message', [
    # README before issue 22: names never defined.
    ('python', "from t5align import calibration\nc = calibration.calibrate(params, config, "
               "long_tokens, 'pmax', reference_length=512)\n",
     r'never defined in the block: params \(line 2\), config \(line 2\), long_tokens'),
    ('python', 'from t5align import calibration\ncalibration.calibrate_all()\n',
     "t5align.calibration has no 'calibrate_all'"),
    ('python', 'from t5align import checkpoints\ncheckpoints.load_params("/c", dtyp="bf16")\n',
     r"load_params\(\) has no parameter 'dtyp'"),
    # t5x parses --gin.NAME=VALUE as gin: a path needs escaped quotes.
    ('sh', 'python -m t5x.eval --gin_file=gin/t5x/retrieval_t5.gin --gin_file=gin/t5x/schedule.gin '
           '--gin.SCHEDULE_PATH=/path --gin.MIXTURE_OR_TASK_NAME=\\"t\\"',
     r"--gin.SCHEDULE_PATH=/path: t5x binds `SCHEDULE_PATH = /path`, which gin cannot parse"),
    ('sh', 'python -m t5x.eval --gin_file=gin/t5x/retrieval_t5.gin --gin_file=gin/t5x/schedule.gin '
           '--gin.SCHEDULE_PATH=\\"/s.json\\" --gin.TEMPERATURE=0.8',
     'TEMPERATURE together with gin/t5x/schedule.gin is refused'),
    ('sh', 'python -m t5x.eval --gin_file=gin/t5x/retrieval_t5.gin --gin.SCHEDULE_PAHT=\\"/s\\"',
     'no macro SCHEDULE_PAHT'),
    # t5align's CLIs: flags, files, macros and bindings as the run parses them.
    ('sh', 'python -m t5align.eval --gin_file=gin/runs/eval.gin '
           '--gin_file=gin/models/retrieval_small.gin --gin.SCHEDULE_PAHT=/s.json',
     'no macro SCHEDULE_PAHT'),
    ('sh', 'python -m t5align.calibrate --gin_file=gin/calibrate.gin '
           "--gin_bindings='calibrate.run.no_such = 1'", 'no_such'),
    ('sh', 'python -m t5align.calibrate --gin_file=gin/no_such.gin', 'no_such.gin'),
    ('sh', 'python -m t5align.report /tmp/x --outptu r.md', 't5align.report defines no flag'),
    ('sh', 'python -m t5align.preflight --topology=v4-32 --length=32768 '
           '--gin_file=gin/runs/eval.gin --gin.NUM_PARTITON=8', 'no macro NUM_PARTITON'),
    ('sh', 'make demoo', "no target 'demoo'"),
    ('sh', "pip install -e '.[seqoi]'", "setup.cfg has no extras \\['seqoi'\\]"),
    ('sh', 'gcloud compute tpus tpu-vm ssh t --command="cd t5align && python -m t5align.eval '
           '--gin_file=gin/runs/eval.gin --gin.NUM_PARTITON=8"', 'no macro NUM_PARTITON'),
])
def test_check_only_blocks_catch_wrong_names(language, source, message):
  check = doc_blocks.check_python if language == 'python' else doc_blocks.check_shell
  with pytest.raises(AssertionError, match=message):
    check(source, 'README.md:1')
