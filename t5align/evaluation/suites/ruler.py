"""RULER's table, shaped like RULER's README: a row per model and temperature, a column per input
length, a cell the mean over its 13 tasks (in its README's order; their one place:
`seqio_tasks.ruler.TASKS` reads them here; the tasks' metrics.json name them as their 'column');
per task on request."""
from t5align.evaluation.suites import layout

LAYOUT = layout.LengthColumns(
    'ruler', 'RULER',
    "RULER (the mean of the tasks' scores at each input length; Avg.: over the lengths)",
    ('niah_single_1', 'niah_single_2', 'niah_single_3', 'niah_multikey_1', 'niah_multikey_2',
     'niah_multikey_3', 'niah_multivalue', 'niah_multiquery', 'vt', 'cwe', 'fwe', 'qa_1', 'qa_2'))
