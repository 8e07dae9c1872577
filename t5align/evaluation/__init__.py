"""Evaluation on a mesh: scoring and greedy decoding of batches (scoring), per-example records
with progress and resume (predictions), the run's encoder temperatures (temperature). Import the
modules themselves; `t5align.eval` is the command line."""
