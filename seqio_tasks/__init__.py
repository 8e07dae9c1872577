"""SeqIO tasks for the paper's evaluations, registered as `t5align_*` on import.

Importing the package registers the tasks when seqio is installed (`pip install t5align[seqio]`);
without seqio the data readers, builders and metrics (`seqio_tasks.{data,retrieval,qa,code,lm,
metrics,catalog}`) still work, and `import seqio_tasks.tasks` raises the ImportError.

Gin (dynamic registration, `import seqio_tasks`): `seqio_tasks.options.*` (example counts, seed,
user files), `seqio_tasks.vocabulary_path.path`, `seqio_tasks.data.data_dir.path`,
`seqio_tasks.zeroscrolls_dir.path` (ZeroSCROLLS' files; else $T5ALIGN_ZEROSCROLLS_DIR),
`seqio_tasks.options.ruler_*` (RULER's examples, budget and files; else $T5ALIGN_RULER_*:
`seqio_tasks.ruler`).
"""
from seqio_tasks.catalog import options
from seqio_tasks import data

__all__ = ['data', 'options']

try:
  import seqio  # pylint: disable=unused-import
except ImportError:  # Readers and metrics do not need it.
  seqio = None

if seqio is not None:
  from seqio_tasks import tasks  # pylint: disable=g-import-not-at-top
  from seqio_tasks.tasks import vocabulary_path  # pylint: disable=g-import-not-at-top
  __all__ += ['tasks', 'vocabulary_path']
