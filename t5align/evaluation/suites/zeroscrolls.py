"""ZeroSCROLLS' table, shaped like the suite's paper (Tables 3 and 4): its 10 tasks' columns in the
paper's order and abbreviations (their one place: `seqio_tasks.zeroscrolls.COLUMNS` reads them
here; the tasks' metrics.json name them as their 'column'), Avg after them, the published rows from
zeroscrolls_published.json."""
import os

from t5align.evaluation.suites import layout

LAYOUT = layout.TaskColumns(
    'zeroscrolls', 'ZeroSCROLLS',
    "ZeroSCROLLS (each task's score; Avg: their mean over the 10 tasks)",
    ('GvRp', 'SSFD', 'QMsm', 'SQAL', 'Qspr', 'Nrtv', 'QALT', 'MuSQ', 'SpDg', 'BkSS'),
    published=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           'zeroscrolls_published.json'),
    unscored=(" (the test split's gold is private: the leaderboard scores its predictions, "
              'python -m t5align.leaderboard writes the CSV)'))
