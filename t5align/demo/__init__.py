"""The demo: the shipped retrieval T5 calibrated and evaluated past its training length.

`python -m t5align.demo` runs `command.main` (its docstring is the usage). The library, each
module importing only those listed before it: inputs (held-out prompts and their seeds), planning
(`DemoSettings`, the modes, `make_plan`), timing (phase seconds, the ETA), store (the output
folder: results.json, predictions, what a rerun resumes), temperatures (the per-task calibration
and the temperature of a report row), reporting (tables, figure, report.md), job (`run`: the
whole run over a `DemoSettings`, resumable). Import the modules themselves; nothing of the
library imports the command.
"""
