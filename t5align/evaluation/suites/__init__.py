"""The long-context suites' report layouts, one module per suite beside this facade (no JAX, no
seqio): `zeroscrolls`, `scrolls` (`layout.TaskColumns`: a column per task) and `ruler`
(`layout.LengthColumns`: a column per input length). Each is keyed by the catalog's table name
(`seqio_tasks.suite.Suite.name`), which a suite task's metrics.json names as its 'table'."""
from t5align.evaluation.suites import ruler
from t5align.evaluation.suites import scrolls
from t5align.evaluation.suites import zeroscrolls
from t5align.evaluation.suites.layout import published_results

# table -> its layout, in the report's order.
LAYOUTS = {m.LAYOUT.table: m.LAYOUT for m in (zeroscrolls, scrolls, ruler)}
# Suites with published rows (`t5align.report --published SUITE`) -> their data file.
PUBLISHED = {t: l.published for t, l in LAYOUTS.items() if l.published is not None}

__all__ = ['LAYOUTS', 'PUBLISHED', 'published_results']
