#!/bin/bash
# The runs behind ../golden and ../golden_synthetic (README.md beside this folder): NVIDIA/RULER's
# prepare.py, unmodified, with `python` on PATH being ruler_shim.py (SentencePiece tokenizer).
# Usage: gen.sh SEED LENGTH NUM_SAMPLES TASK...
#   writes $GOLDEN_DIR/seed{SEED}_L{LENGTH}/TASK/validation.jsonl and TASK.log.
# Environment: SCRATCH (the folder holding ruler-venv/, ruler-shim/bin/python, RULER/),
#   RULER_DIR (default $SCRATCH/RULER), GOLDEN_DIR (default $SCRATCH/ruler-golden),
#   NLTK_DATA (default $SCRATCH/nltk_data), TIMEOUT seconds (default 300), SPM (the .model).
set -u
seed=$1; len=$2; n=$3; shift 3
S=${SCRATCH:?set SCRATCH, a folder outside the repository}
out=${GOLDEN_DIR:-$S/ruler-golden}/seed${seed}_L${len}
mkdir -p "$out"
cd "${RULER_DIR:-$S/RULER}/scripts/data" || exit 1
for task in "$@"; do
  start=$(date +%s.%N)
  PATH=$S/ruler-shim/bin:$PATH RULER_SHIM_TIMEOUT=${TIMEOUT:-300} \
    NLTK_DATA=${NLTK_DATA:-$S/nltk_data} timeout "${TIMEOUT:-300}" \
    "$S/ruler-venv/bin/python" prepare.py --save_dir "$out" --benchmark synthetic --task "$task" \
    --tokenizer_path "${SPM:?set SPM to t5align/shipped/retrieval_t5/sentencepiece.model}" \
    --tokenizer_type nemo --max_seq_length "$len" --model_template_type base \
    --num_samples "$n" --random_seed "$seed" > "$out/$task.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  echo "$task seed=$seed L=$len rc=$rc $(echo "$end - $start" | bc)s" \
    "lines=$(wc -l < "$out/$task/validation.jsonl" 2>/dev/null)"
done
