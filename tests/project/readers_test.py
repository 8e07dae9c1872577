"""One door for input files: every read in t5align/ goes through `fileio.read_input` (a regular
file of bounded size: a fifo, a device or an endless file is refused before it is read) unless
the call site is below, with the reason it may read directly.

The sites are found in the code (calls of the builtin `open` in a read mode, and of any
`.read_bytes` / `.read_text`), so a new reader that bypasses the door fails here until it uses
`read_input` or is listed with its reason. (seqio_tasks/ streams datasets of any size and may
import nothing of t5align's runtime: its readers are outside this test.)
"""
from __future__ import annotations

import ast
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

# (file, enclosing function, the call): why it may read without `read_input`.
DIRECT_READS = {
    ('t5align/runtime/fileio.py', 'read_bytes', '_epath(path).read_bytes'): 'the door itself',
    ('t5align/runtime/fileio.py', 'read_bytes', 'open'): 'the door itself',
    ('t5align/runtime/fileio.py', 'read_input', 'open'): 'the door itself',
    ('t5align/checkpoints/t5x.py', 'lazy_orbax_arrays', 'store.read_bytes'):
        "a checkpoint's _METADATA through tensorstore's key-value store (the checkpoint's door: "
        'store.read_bytes), whose arrays are sized before they are read (memory)',
    ('t5align/demo/store.py', 'copy_predictions.write', 'fileio.read_bytes'):
        'predictions the demo wrote itself',
    ('t5align/jobs/calibration_job.py', 'tables', 'fileio.read_bytes'):
        'dispersion.txt, which the job wrote itself',
    ('t5align/memory.py', 'host_available_bytes', 'open'): '/proc/meminfo',
    ('t5align/run_identity.py', '_hash_file', 'open'):
        'a checkpoint file or vocabulary hashed in blocks (any size), after an isfile check',
    ('t5align/run_identity.py', '_stored_digest', 'open'):
        "the last bytes of a checkpoint file (its gzip member's CRC-32), after an isfile check",
    ('t5align/run_identity.py', 'file_fingerprint', 'fileio.read_bytes'):
        'a gs:// file (local ones are hashed by _hash_file)',
    ('t5align/run_identity.py', 'checkpoint_fingerprint', 'fileio.read_bytes'):
        "a gs:// checkpoint's small metadata files",
    ('t5align/run_identity.py', 'check_run', 'fileio.read_bytes'):
        "the run's own predictions file",
    ('t5align/runtime/outputs.py', '_holder', 'open'): "a lock file's holder line",
    ('t5align/runtime/outputs.py', '_probe', 'open'): "a lock file's holder line",
    ('t5align/runtime/outputs.py', 'repair_jsonl', 'fileio.read_bytes'):
        "a run's own record log, repaired in place",
    ('t5align/shipped/assets.py', 'training_length', 'open'): "the package's own model record",
    ('t5align/training/export.py', 'export', 'fileio.read_bytes'):
        "the run's own files, copied into the export",
    ('t5align/training/state.py', 'restore_checkpoint', 'open'): "the run's own train state",
    ('t5align/training/train_log.py', 'drop_steps_after', 'open'): "the run's own train log",
    ('t5align/training/train_log.py', 'logged_training', 'open'): "the run's own train log",
    ('t5align/training/train_log.py', 'logged_trimming', 'open'): "the run's own train log",
}


def _reads(path: pathlib.Path, root: pathlib.Path = REPO_ROOT) -> set[tuple[str, str, str]]:
  """(file relative to `root`, enclosing function, the call) of each read in `path`."""
  found = set()
  rel = str(path.relative_to(root))

  class Visitor(ast.NodeVisitor):
    def __init__(self):
      self.stack = []

    def visit_FunctionDef(self, node):  # pylint: disable=invalid-name
      self.stack.append(node.name)
      self.generic_visit(node)
      self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node):  # pylint: disable=invalid-name
      f = node.func
      where = '.'.join(self.stack) or '<module>'
      if isinstance(f, ast.Name) and f.id == 'open':
        mode = node.args[1] if len(node.args) > 1 else next(
            (k.value for k in node.keywords if k.arg == 'mode'), None)
        text = mode.value if isinstance(mode, ast.Constant) else 'r' if mode is None else '?'
        if 'r' in text and '+' not in text or text == '?':
          found.add((rel, where, 'open'))
      elif isinstance(f, ast.Attribute) and f.attr in ('read_bytes', 'read_text'):
        found.add((rel, where, ast.unparse(f)))
      self.generic_visit(node)

  Visitor().visit(ast.parse(path.read_text()))
  return found


def test_every_direct_read_is_listed_with_its_reason():
  sites = set().union(*map(_reads, sorted((REPO_ROOT / 't5align').rglob('*.py'))))
  assert sorted(sites - set(DIRECT_READS)) == [], (
      'reads that bypass fileio.read_input: use it, or list the site with its reason')
  assert sorted(set(DIRECT_READS) - sites) == [], 'listed sites that read no more: remove them'


def test_the_scan_finds_a_reader(tmp_path):
  """The scan itself: reads are found, writes are not (so the test above can fail)."""
  module = tmp_path / 'm.py'
  module.write_text('def f(p):\n  with open(p) as g:\n    return g.read()\n\n\n'
                    'def g(p, q):\n  open(p, "w").write(q.read_bytes())\n')
  assert _reads(module, tmp_path) == {('m.py', 'f', 'open'), ('m.py', 'g', 'q.read_bytes')}
