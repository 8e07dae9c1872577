r"""Requests per second of t5align's lm-eval model beside lm-eval's own hf backend (seq2seq).

    python -m benchmarks.lm_eval_bench \
        [--lengths 2048 8192] [--docs 8 4] [--output benchmarks/results/lm_eval_cpu.json]
    python -m benchmarks.lm_eval_bench --smoke     # 384 tokens, 4 prompts: what the test runs

The same checkpoint on both sides: the shipped retrieval T5, exported to a HuggingFace folder
(`checkpoints.save_hf_checkpoint`, with its SentencePiece model as a T5 tokenizer), float32 on
the CPU, batch size 1 (lm-eval's default). The work: the shipped model's passkey prompts filled
to each length (`t5align.lm_eval.local_tasks`), as a 4-way multiple-choice task (4
loglikelihood requests per prompt) and as greedy generation of at most 16 tokens.

Each row runs in its own worker process (`harness.run_worker`), through
`lm_eval.simple_evaluate`; `seconds` is the time spent inside the model's request methods
(`loglikelihood`, `generate_until`: what a backend does), `evaluate_s` the whole call (lm-eval's
own task building included). A t5align row times its second call (the first, which compiles,
is `first_s`); an hf row runs once (it compiles nothing). Two settings make the hf rows compute
what t5align computes:
- lm-eval's HFLM calls the model's `tie_weights()`, which in transformers >= 5 ties T5's output
  head to its embedding; the shipped model, like T5 1.1 and Flan-T5, has its own head, so the
  hf rows disable `tie_weights` on the loaded model;
- lm-eval's seq2seq path lets the decoder run to len(context) + max_gen_toks tokens; the hf
  generation rows bound it to 16 new tokens (`max_length: 17` in their generation settings).
Every row records the sha256 of its responses: rows of the same task and length with equal
hashes gave the same answers.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks import harness

OUTPUT = harness.REPO / 'benchmarks' / 'results' / 'lm_eval_cpu.json'
GEN_TOKS = 16
TASK = 'passkey'


def _prepare(folder: pathlib.Path, lengths: list[int], docs: list[int]) -> dict[str, str]:
  """The HF export of the shipped model and the task folders (t5align's, and hf's with the
  generation bounded) of `docs[i]` prompts at `lengths[i]`; returns their paths."""
  from t5align import checkpoints  # pylint: disable=g-import-not-at-top
  from t5align.lm_eval import local_tasks  # pylint: disable=g-import-not-at-top
  from t5align.shipped import assets  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  params, config, vocab = assets.load_shipped()
  hf_dir = folder / 'shipped_hf'
  checkpoints.save_hf_checkpoint(str(hf_dir), params, config)
  shutil.copy(vocab.path, hf_dir / 'spiece.model')
  (hf_dir / 'tokenizer_config.json').write_text(
      json.dumps({'tokenizer_class': 'T5Tokenizer', 'extra_ids': 0}))
  transformers.AutoTokenizer.from_pretrained(str(hf_dir)).save_pretrained(str(hf_dir))
  ours, hf = folder / 'tasks', folder / 'tasks_hf'
  for length, n in zip(lengths, docs):
    local_tasks.write_tasks(str(ours), vocab, [length], n, tasks=(TASK,),
                            max_gen_toks=GEN_TOKS)
  shutil.copytree(ours, hf)
  for path in hf.glob(f't5align_local_{TASK}_*.yaml'):
    text = path.read_text()
    if 'generate_until' in text:
      path.write_text(text.replace('"do_sample": false', f'"do_sample": false, "max_length": '
                                                          f'{GEN_TOKS + 1}'))
  return {'hf_dir': str(hf_dir), 'tasks': str(ours), 'tasks_hf': str(hf)}


def _lm(spec: dict):
  if spec['impl'] == 't5align':
    from t5align.lm_eval import T5AlignLM  # pylint: disable=g-import-not-at-top
    return T5AlignLM(pretrained=spec['hf_dir'], batch_size=1)
  import transformers  # pylint: disable=g-import-not-at-top
  from lm_eval.models import huggingface  # pylint: disable=g-import-not-at-top
  model = transformers.T5ForConditionalGeneration.from_pretrained(spec['hf_dir']).eval()
  model.tie_weights = lambda *args, **kwargs: None  # Keep the checkpoint's own head.
  return huggingface.HFLM(pretrained=model, backend='seq2seq', batch_size=1, device='cpu',
                          tokenizer=transformers.AutoTokenizer.from_pretrained(spec['hf_dir']),
                          max_length=10**6)  # Nothing cut, as t5align's default.


def worker(spec: dict) -> dict:
  """One row: the task run through `simple_evaluate` with its backend."""
  import lm_eval  # pylint: disable=g-import-not-at-top
  from lm_eval import tasks as lm_tasks  # pylint: disable=g-import-not-at-top
  lm = _lm(spec)
  folder = spec['tasks'] if spec['impl'] == 't5align' else spec['tasks_hf']
  name = f"t5align_local_{TASK}_{spec['length']}" + ('_mc' if spec['kind'] == 'mc' else '')

  spent = []  # Seconds inside the model's request methods, call by call.
  for kind in ('loglikelihood', 'generate_until'):
    def timed(requests, *args, method=getattr(lm, kind), **kwargs):
      start = time.perf_counter()
      out = method(requests, *args, **kwargs)
      spent.append(time.perf_counter() - start)
      return out
    setattr(lm, kind, timed)

  def run():
    start, before = time.perf_counter(), len(spent)
    results = lm_eval.simple_evaluate(model=lm, tasks=[name], log_samples=True,
                                      task_manager=lm_tasks.TaskManager(include_path=folder))
    return sum(spent[before:]), time.perf_counter() - start, results

  first, _, results = run()
  seconds, evaluate_s, results = (first, None, results)
  if spec['impl'] == 't5align':
    seconds, evaluate_s, results = run()
  samples = results['samples'][name]
  requests = sum(len(s['resps']) for s in samples)
  responses = [s['resps'] for s in sorted(samples, key=lambda s: s['doc_id'])]
  if spec['kind'] == 'mc':  # Rounded: the two backends' float32 sums differ in the last bits.
    responses = [[[round(float(r[0][0]), 3), r[0][1]] for r in doc] for doc in responses]
  row = {**spec, 'requests': requests, 'seconds': round(seconds, 3), 'first_s': round(first, 3),
         'evaluate_s': None if evaluate_s is None else round(evaluate_s, 3),
         'requests_per_s': round(requests / seconds, 3),
         'metric': next(v for k, v in results['results'][name].items()
                        if k.endswith(',none') and 'stderr' not in k),
         'responses_sha256': hashlib.sha256(json.dumps(responses).encode()).hexdigest()[:16],
         'peak_rss_bytes': harness.peak_memory_bytes('jax' if spec['impl'] == 't5align'
                                                     else 'torch')}
  if spec['impl'] == 't5align':
    info = results['config']['t5align']
    row['programs'] = info['programs']['count']
  return row


def _commit() -> str | None:
  try:
    return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=harness.REPO,
                          capture_output=True, text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--lengths', type=int, nargs='+', default=[2048, 8192])
  parser.add_argument('--docs', type=int, nargs='+', default=[8, 4],
                      help='prompts per length (one number, or one per length)')
  parser.add_argument('--smoke', action='store_true', help='384 tokens, 4 prompts')
  parser.add_argument('--output', type=pathlib.Path, default=None,
                      help=f'results JSON (default {OUTPUT.relative_to(harness.REPO)}; none '
                           'with --smoke)')
  parser.add_argument('--timeout', type=int, default=3600, help='seconds per row')
  parser.add_argument('--worker', default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if harness.answer_worker(args.worker, worker):
    return {}
  lengths, docs = ([384], [4]) if args.smoke else (args.lengths, args.docs)
  docs = docs * len(lengths) if len(docs) == 1 else docs
  if len(docs) != len(lengths):
    parser.error(f'--docs gives {len(docs)} counts for {len(lengths)} lengths.')
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    paths = _prepare(pathlib.Path(tmp), lengths, docs)
    for length, n in zip(lengths, docs):
      for kind in ('mc', 'gen'):
        for impl in ('t5align', 'hf'):
          spec = dict(impl=impl, kind=kind, length=length, docs=n, max_gen_toks=GEN_TOKS,
                      **paths)
          row = harness.run_worker('benchmarks.lm_eval_bench', spec, args.timeout)
          rows.append({k: v for k, v in row.items() if k not in ('hf_dir', 'tasks', 'tasks_hf')})
          print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  harness.add_ratios(rows, harness.hf_base(rows, ('kind', 'length')), field='speedup')
  for row in rows:
    if row['impl'] == 't5align' and 'speedup' in row:
      hf = next(r for r in rows if r['impl'] == 'hf' and r['kind'] == row['kind']
                and r['length'] == row['length'])
      row['same_responses_as_hf'] = row.get('responses_sha256') == hf.get('responses_sha256')
  document = {
      'benchmark': 'lm_eval', 'provenance': {
          'date': time.strftime('%Y-%m-%d'), 'commit': _commit(),
          'machine': os.environ.get('T5ALIGN_BENCH_MACHINE', "this project's 2-core CPU machine"),
          'timing': 'seconds inside the model\'s request methods; t5align: its second '
                    'simple_evaluate call (first_s: the first, compiling); hf: one call',
          'command': ' '.join(['python -m benchmarks.lm_eval_bench', *(argv or sys.argv[1:])]),
          'versions': harness.versions('t5align', 'jax', 'jaxlib', 'lm-eval', 'torch',
                                       'transformers')},
      'rows': rows}
  output = args.output if args.output is not None else (None if args.smoke else OUTPUT)
  if output is not None:
    harness.write_json(output, document)
  print(json.dumps(document, indent=1))
  return document


if __name__ == '__main__':
  main()
