"""t5align as an lm-evaluation-harness model: importing this package registers `T5AlignLM` in
lm-eval's registry as 't5align' (`--model t5align`).

  python -m t5align.lm_eval --model t5align --model_args pretrained=CKPT,schedule=s.json \
      --tasks longbench_e --output_path out/     # lm-eval's command line, every flag as it is

  from t5align.lm_eval import T5AlignLM
  lm_eval.simple_evaluate(model=T5AlignLM(pretrained=CKPT, temperature=0.8), tasks=[...])

By level: `settings` (the model arguments, checked before anything loads), `sources` (a path
or a hub id; the checkpoint's own tokenizer), `tokenizer` (HF or SentencePiece, as lm-eval's hf
backend calls it), `temperatures` (each request's tau: constant, scheduled or calibrated),
`engine` (token arrays on the mesh: shared encodings, scoring, greedy decoding, few shapes),
`model` (`T5AlignLM`: lm-eval's request kinds), `local_tasks` (offline task folders of
t5align's own retrieval prompts), `__main__` (the command). lm-eval is the optional extra
`pip install 't5align[lm_eval]'`: this package needs it (it registers the model on import),
though only `model` and `__main__` call it.
"""
try:
  import lm_eval as _lm_eval  # noqa: F401  # pylint: disable=unused-import
except ImportError as e:
  raise ImportError("t5align.lm_eval needs lm-evaluation-harness: pip install "
                    "'t5align[lm_eval]'.") from e

from t5align.lm_eval.model import NAME
from t5align.lm_eval.model import T5AlignLM
from t5align.lm_eval.settings import ModelArgs

__all__ = ['ModelArgs', 'NAME', 'T5AlignLM']
