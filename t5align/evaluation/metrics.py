"""A finished task's metrics.json: its records scored by the task's own seqio metric functions,
with what the report reads (model, label, table, group, column, primary metric) and the
temperatures the records were made at."""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from t5align.runtime import fileio


def model_name(checkpoint_path: str) -> str:
  """A model's name in reports from its checkpoint path: the folder holding checkpoint_N/, else
  the last part."""
  parts = [p for p in str(checkpoint_path).rstrip('/').split('/') if p]
  if len(parts) > 1 and parts[-1].startswith('checkpoint'):
    return parts[-2]
  return parts[-1] if parts else str(checkpoint_path)


def plain(value: Any) -> Any:
  """Metric values as JSON numbers (seqio may return Scalar objects or numpy values)."""
  value = getattr(value, 'value', value)
  if isinstance(value, (np.generic, np.ndarray)):
    return value.tolist()
  return value


def write_metrics(task: Any, spec: Any, total: int, log: Any, folder: str, scored: bool, *,
                  model_name: str, temp: Any, checkpoint_path: str) -> dict[str, Any]:
  """Metrics of a finished task from its log, with the task's own seqio metric functions.

  Records carry the postprocessed target (and prediction), made where the example was read,
  so the writing process needs no example of another process's share.

  Args:
    task: the seqio task (its name and score or predict metric functions).
    spec: its `seqio_tasks.catalog.TaskSpec`, or None for a task outside the catalog.
    total: examples of the task; `log.records` holds records 0..total-1.
    log: the task's `runtime.records.RecordLog`.
    folder: the task's folder; metrics.json is written there atomically.
    scored: records hold log-likelihoods (else predictions).
    model_name, checkpoint_path: what the report names.
    temp: the run's `temperature.Temperature`; a constant one must be every record's.

  Returns:
    metrics.json's content.
  """
  from seqio_tasks import metrics as task_metrics  # pylint: disable=g-import-not-at-top
  records = [log.records[i] for i in range(total)]
  taus = sorted({tuple(np.ravel(r['tau']).tolist()) for r in records})
  constant = temp.describe().get('temperature')
  if constant is not None and taus != [tuple(np.ravel(np.float32(constant)).tolist())]:
    raise ValueError(f'{folder}: the records were made at temperatures {taus[:8]}, not this '
                     f'run\'s {constant}: the folder mixes runs; evaluate into a new folder.')
  targets = [r['postprocessed_target'] for r in records]
  values: dict[str, Any] = {}
  if scored:
    scores = np.array([r['log_likelihood'] for r in records])
    for fn in task.score_metric_fns:
      values.update(fn(targets, scores))
  else:
    predicted = [r.get('postprocessed_prediction', r['prediction']) for r in records]
    for fn in task.predict_metric_fns:
      values.update(fn(targets, predicted))
  result = {
      'task': task.name, 'model': model_name, 'label': temp.label,
      'checkpoint': str(checkpoint_path), 'num_examples': total,
      'metrics': {k: plain(v) for k, v in values.items()},
      'family': spec.family if spec else None, 'table': spec.table if spec else 'other',
      'group': spec.group if spec else task.name, 'column': spec.column if spec else 'all',
      # The family's `primary` (seqio_tasks.metrics.FAMILIES); outside the catalog: its mode's.
      'primary_metric': (task_metrics.primary_metric(spec.family) if spec
                         else 'perplexity' if scored else 'accuracy'),
      **{k: v for k, v in temp.describe().items() if k != 'schedule'},
      # From the records: the temperatures the metrics' predictions were made at.
      'record_temperatures': {'distinct': len(taus), 'min': [min(t) for t in zip(*taus)],
                              'max': [max(t) for t in zip(*taus)],
                              **({'values': [list(t) for t in taus]} if len(taus) <= 8 else {})},
  }
  fileio.write_json_atomic(os.path.join(folder, 'metrics.json'), result)
  return result
