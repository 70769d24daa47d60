#!/usr/bin/env bash
# The GPU checks, on one CUDA GPU (an H100/H200), under 10 minutes in all, most important first. Results go to $OUT
# (default runs/gpu): rows.jsonl gets each measured row as soon as it is measured, so a part cut short loses only
# itself; full logs go to $LOGS (default /tmp/gpu_check):
#   1. the CLI's training step beside a hand-built one (scripts/benchmark.py --only cli): GPT-2 small at context
#      1024 with configs/trainer/{bf16-mixed,compile}.yaml, batch 16; then the paper-base encoder-decoder on the
#      embedded English-Spanish Bible; tokens/s, MFU against the spec sheet, peak memory;
#   2. the gradient norm under FSDP (configs/trainer/fsdp.yaml) against a plain run: the same norms (fp32);
#   3. GPT-2 small at batch 32 and 8, CLI and hand-built.
#   bash scripts/gpu_check.sh          # PYTHON=... to choose the interpreter, ONLY="cli16 paper" for some parts only
# On a GPU machine without internet: carry this machine's ~/.cache/lit_transformer (tokenizers, token caches, the
# extracted Bible) and point LIT_TRANSFORMER_CACHE at it, SWORD_PATH at a copy of /usr/share/sword, and have
# jsonargparse[signatures], datasets and pysword importable (PYTHONPATH): then nothing is trained or fetched there.
set -uo pipefail
OUT=${OUT:-runs/gpu}
ONLY=${ONLY:-"cli16 paper norm cli32 cli8"}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)" | tee -a "$OUT/gpu.txt"
quiet() { grep -v -i -E "warning|warn\(|^ *$|litlogger"; }

LOGS=${LOGS:-/tmp/gpu_check}  # full logs; $OUT keeps a few files (rows.jsonl: every measured row, as it is measured)
mkdir -p "$LOGS"
bench() {  # bench NAME SECONDS FILTER
  [[ $ONLY == *$1* ]] || return 0
  echo "== $1: CLI vs hand-built ($3)"
  timeout "$2" $PY scripts/benchmark.py --device cuda --only cli --cli-filter "$3" > "$LOGS/$1.log" 2>&1
  echo "exit $?"
  grep -o '{"section".*}' "$LOGS/$1.log" | tee -a "$OUT/rows.jsonl"
  grep -E "host synchronisation|Error|error:|Traceback" "$LOGS/$1.log" | sort | uniq -c | head -8
  grep -v '{"section"' "$LOGS/$1.log" | quiet | tail -4
}

bench cli16 170 "batch 16"
bench paper 170 "paper-base"

if [[ $ONLY == *norm* ]]; then
echo "== norm: train/grad_norm under FSDP against a plain run (GPT-2 small, fp32, 4 steps)"
NORM=(--config configs/presets/gpt2-small.yaml --data.init_args.tokenizer byte_bpe --data.init_args.vocab_size 50257
  --data.init_args.batch_size 4 --trainer.accumulate_grad_batches 1 --trainer.max_steps 4 --trainer.log_every_n_steps 1
  --trainer.limit_val_batches 0 --trainer.num_sanity_val_steps 0 --trainer.enable_progress_bar false
  --trainer.logger false --checkpoint.save_last false --checkpoint.every_n_train_steps 0 --trainer.precision 32-true)
timeout 90 $PY scripts/check_grad_norm.py --out "$LOGS/norm_plain.json" -- "${NORM[@]}" 2>&1 | quiet | tail -3
timeout 120 $PY scripts/check_grad_norm.py --out "$LOGS/norm_fsdp.json" -- "${NORM[@]}" \
  --config configs/trainer/fsdp.yaml --trainer.devices 1 2>&1 | quiet | tail -3
$PY scripts/check_grad_norm.py --compare "$LOGS/norm_plain.json" "$LOGS/norm_fsdp.json" | tee "$OUT/norm.txt"
fi

bench cli32 150 "batch 32"
bench cli8 150 "batch 8"
