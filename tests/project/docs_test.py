"""README.md, CHANGELOG.md and every page under docs/ as tested code, and the docs site's build.

Each fenced block runs as written, or is checked (doc_blocks.py). The shell blocks that run write
below $OUT, set here to a temporary folder. The site (mkdocs.yml) builds in strict mode: a broken
link or anchor, a page missing from the nav, or an API name mkdocstrings cannot resolve fails it.
"""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip('sybil')  # The newest-jax environment has no sybil; the main one does.
import doc_blocks  # noqa: E402

pytestmark = pytest.mark.docs

ROOT = doc_blocks.REPO_ROOT
PAGES = [ROOT / 'README.md', ROOT / 'CHANGELOG.md', *sorted((ROOT / 'docs').rglob('*.md'))]
EXAMPLES = [e for page in PAGES for e in doc_blocks.examples(page)]


def _name(example) -> str:
  return f'{pathlib.Path(example.path).relative_to(ROOT)}:{example.line}'


def test_docs_have_runnable_and_check_only_blocks():
  blocks = [e.parsed for e in EXAMPLES]
  assert sum(b.needs is None and b.language == 'python' for b in blocks) >= 1
  assert sum(b.needs is None and b.language == 'sh' for b in blocks) >= 1
  assert all(b.needs for b in blocks if b.needs is not None)


# A page's Python blocks share one namespace: its blocks run on one xdist worker, in order.
@pytest.mark.parametrize('example', [
    pytest.param(e, marks=pytest.mark.xdist_group(_name(e).split(':')[0]), id=_name(e))
    for e in EXAMPLES])
def test_doc_block(example, tmp_path_factory, monkeypatch):
  monkeypatch.setenv('OUT', str(tmp_path_factory.mktemp('docs_out')))
  example.evaluate()


@pytest.mark.parametrize('page', ['README.md', 'CHANGELOG.md'])
def test_links_outside_the_site_resolve_inside_the_repository(page):
  """README.md and CHANGELOG.md are outside the site (mkdocs checks the pages in docs/): each
  relative link names a file of the repository, and no link leaves it."""
  text = (ROOT / page).read_text()
  files = [link.split('#')[0] for link in re.findall(r'\]\(([^)\s]+)\)', text)
           if not re.match(r'[a-z]+://', link)]
  broken = [f for f in files
            if not ((ROOT / f).resolve().is_relative_to(ROOT) and (ROOT / f).exists())]
  assert not broken, f'{page}: links that leave the repository or name no file: {broken}'


def test_site_builds_strictly(tmp_path):
  """`mkdocs build --strict`, as `make docs` runs it."""
  proc = subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '--strict', '--site-dir',
                         str(tmp_path / 'site')], cwd=ROOT, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  assert (tmp_path / 'site' / 'api' / 'jobs' / 'index.html').is_file()


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
           "--gin_bindings='jobs.CalibrationJob.no_such = 1'", 'no_such'),
    ('sh', 'python -m t5align.calibrate --gin_file=gin/no_such.gin', 'no_such.gin'),
    ('sh', 'python -m t5align.report /tmp/x --outptu r.md', 't5align.report defines no flag'),
    ('sh', 'python -m t5align.preflight --topology=v4-32 --length=32768 '
           '--gin_file=gin/runs/eval.gin --gin.NUM_PARTITON=8', 'no macro NUM_PARTITON'),
    ('sh', 'make demoo', "no target 'demoo'"),
    ('sh', 'python -m t5align.demo --contrls', 't5align.demo refuses these flags'),
    ('sh', "pip install -e '.[seqoi]'", "setup.cfg has no extras \\['seqoi'\\]"),
    # lm-eval's own parser, the model's arguments, lm-eval's task names.
    ('sh', 'python -m t5align.lm_eval --model t5align --model_args pretrained=/c,tempreature=0.8 '
           '--tasks longbench_e', "unknown model argument 'tempreature'"),
    ('sh', 'python -m t5align.lm_eval --model t5align --model_args pretrained=/c '
           '--tasks longbench_ee', r"has no tasks \['longbench_ee'\]"),
    ('sh', 'python -m t5align.lm_eval --model t5align --taks x', 'lm-eval refuses these arguments'),
    ('sh', 'gcloud compute tpus tpu-vm ssh t --command="cd t5align && python -m t5align.eval '
           '--gin_file=gin/runs/eval.gin --gin.NUM_PARTITON=8"', 'no macro NUM_PARTITON'),
])
def test_check_only_blocks_catch_wrong_names(language, source, message):
  check = doc_blocks.check_python if language == 'python' else doc_blocks.check_shell
  with pytest.raises(AssertionError, match=message):
    check(source, 'README.md:1')
