"""Evaluation on a mesh: scoring and greedy decoding of batches (scoring), a task's examples and
records with progress, resume and the log every process shares (predictions), a finished task's
metrics.json (metrics), the run's encoder temperatures (temperature), the results' Markdown
tables (tables, no JAX) and paired tests of rows scored on the same examples (paired, no JAX).
Import the modules themselves; the job is `t5align.jobs.EvalJob`, the command lines
`t5align.eval` and `t5align.report`."""
