"""SCROLLS' table, shaped like its leaderboard: Avg first, its 7 tasks' columns in the
leaderboard's order and abbreviations (their one place: `seqio_tasks.scrolls.COLUMNS` reads them
here; the tasks' metrics.json name them as their 'column'), ROUGE-1/2/L for the summaries, the
published rows from scrolls_published.json (QuALITY's published cell: EM on the whole test set /
its hard subset; ours: the whole split)."""
import os

from t5align.evaluation.suites import layout

_COLUMNS = ('GovRep', 'SumScr', 'QMSum', 'Qspr', 'Nrtv', 'QALT', 'CNLI')
_SUMMARIES = _COLUMNS[:3]

LAYOUT = layout.TaskColumns(
    'scrolls', 'SCROLLS',
    ("SCROLLS (ROUGE-1/2/L, F1 or exact match, as its leaderboard shows them; Avg: the mean over "
     "the 7 tasks' scores, ROUGE's geometric mean for the summaries)"),
    _COLUMNS, parts=dict.fromkeys(_SUMMARIES, ('rouge1', 'rouge2', 'rougeL')),
    published=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           'scrolls_published.json'),
    published_parts={**dict.fromkeys(_SUMMARIES, 3), 'QALT': 2}, average_first=True,
    unscored=" (the test split's gold is private: SCROLLS' leaderboard scores its predictions)")
