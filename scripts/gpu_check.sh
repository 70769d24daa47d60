#!/usr/bin/env bash
# The GPU checks, on one CUDA GPU (an H100/H200), under 10 minutes in all, most important first. Results go to $OUT
# (default runs/gpu): rows.jsonl gets each measured row as soon as it is measured, so a part cut short loses only
# itself; full logs go to $LOGS (default /tmp/gpu_check):
#   1. the CLI's training step beside a hand-built one (scripts/benchmark.py --only cli): GPT-2 small at context
#      1024 with configs/trainer/{bf16-mixed,compile}.yaml, batch 16; then the paper-base encoder-decoder on the
#      embedded English-Spanish Bible; tokens/s, MFU against the spec sheet, peak memory;
#   2. the gradient norm under FSDP (configs/trainer/fsdp.yaml) against a plain run: the same norms (fp32);
#   3. GPT-2 small at batch 32 and 8, CLI and hand-built;
#   recipe (issue 17, in the background from the start): the paper's recipe on the embedded Bible, on the GPU:
#      translate-en-es trained until its validation BLEU stops improving (time-boxed by $TIME_BOX), and paper-base
#      (bf16-mixed) time-boxed the same, both at once; then each run's last 5 checkpoints averaged and tested beside
#      the last one and the EMA, greedy and with the paper's decoding (scripts/translation_recipe.py);
#   modern (issue 18, in the background, on the machine's CPU cores only): configs/ablations/modern.yaml, 6 runs of
#      the main job's budget, 2 threads each.
#   bash scripts/gpu_check.sh          # PYTHON=... to choose the interpreter, ONLY="cli16 paper" for some parts only
# On a GPU machine without internet: carry this machine's ~/.cache/lit_transformer (tokenizers, token caches, the
# extracted Bible) and point LIT_TRANSFORMER_CACHE at it, SWORD_PATH at a copy of /usr/share/sword, and have
# jsonargparse[signatures], datasets and pysword importable (PYTHONPATH): then nothing is trained or fetched there.
set -uo pipefail
OUT=${OUT:-runs/gpu}
ONLY=${ONLY:-"cli16 paper norm cli32 cli8"}
START=$SECONDS
DEADLINE=${DEADLINE:-0}  # seconds: no benchmark starts that would end later, and the background parts are packed
left() { echo $(( DEADLINE > 0 ? DEADLINE - (SECONDS - START) : 100000 )); }
wait_for() {  # wait_for PID...: until they end or 20 s before the deadline
  while (( $(left) > 20 )); do
    local alive=0; for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    (( alive )) || return 0; sleep 3
  done
}
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
  local seconds=$(( $2 < $(left) - 25 ? $2 : $(left) - 25 ))
  (( seconds >= 120 )) || { echo "== $1: skipped, $(left) s left"; return 0; }
  echo "== $1: CLI vs hand-built ($3), at $((SECONDS - START)) s"
  timeout "$seconds" $PY scripts/benchmark.py --device cuda --only cli --cli-filter "$3" > "$LOGS/$1.log" 2>&1
  echo "exit $?"
  grep -o '{"section".*}' "$LOGS/$1.log" | tee -a "$OUT/rows.jsonl"
  grep -E "host synchronisation|Error|error:|Traceback" "$LOGS/$1.log" | sort | uniq -c | head -8
  grep -v '{"section"' "$LOGS/$1.log" | quiet | tail -4
}

# The background parts. Each packs what it made into $OUT/NAME.tar.gz when it ends (no checkpoints).
RUNS=${RUNS:-runs/gpu}
ACCEL=${ACCEL:-gpu}              # ACCEL=cpu with small TIME_BOX, CKPT_* and MODERN_GRID: the dry run of this script
TIME_BOX=${TIME_BOX:-00:00:03:20}
pack() {  # pack NAME DIR: the run's results, curves and logs, without checkpoints
  tar -czf "$OUT/$1.tar.gz" --exclude='*.ckpt' --exclude='*.pt' -C "$(dirname "$2")" "$(basename "$2")" "${@:3}" 2>/dev/null
}
recipe() {  # recipe NAME CONFIG CKPT_EVERY EMA_START VAL_EVERY [FIT FLAGS...]: fit time-boxed, then the recipe
  local name=$1 config=$2 every=$3 ema=$4 val=$5 run=$RUNS/$1; shift 5
  local device=(--trainer.accelerator "$ACCEL" --trainer.devices 1)
  echo "== recipe $name: fit ($TIME_BOX), then average and test" >&2
  $PY -m lit_transformer fit --config "$config" "${device[@]}" "$@" --trainer.max_steps 1000000 \
    --trainer.max_time "$TIME_BOX" --trainer.val_check_interval "$val" --trainer.enable_progress_bar false \
    --trainer.default_root_dir "$run" --trainer.logger.init_args.save_dir "$run" --checkpoint.dirpath "$run/checkpoints" \
    --checkpoint.every_n_train_steps "$every" --checkpoint.save_top_k 5 --checkpoint.monitor step --checkpoint.mode max \
    --checkpoint.filename 'step{step:06d}' --checkpoint.auto_insert_metric_name false \
    --best_checkpoint.monitor val/bleu --best_checkpoint.mode max \
    --best_checkpoint.filename 'best-step{step:06d}-bleu{val/bleu:.2f}' \
    --trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging --trainer.callbacks.decay 0.998 \
    --trainer.callbacks.update_starting_at_step "$ema" > "$run.fit.log" 2>&1
  echo "== recipe $name: fit exit $? after $((SECONDS - START)) s" >&2
  $PY scripts/translation_recipe.py --run "$run" --config "$config" --last "${LAST:-5}" --jobs 6 --plot "$run/val-bleu.png" \
    --title "$name on the GPU, time-boxed $TIME_BOX" --flags "${device[*]} ${RECIPE_FLAGS:-}" > "$run.recipe.log" 2>&1
  echo "== recipe $name: recipe exit $? after $((SECONDS - START)) s" >&2
  grep -E "BLEU|Error|error:" "$run.recipe.log" | tail -8 >&2
  pack "$name" "$run" "$name.fit.log" "$name.recipe.log"
}
BACKGROUND=()
if [[ $ONLY == *recipe* ]]; then
  mkdir -p "$RUNS"
  recipe en-es configs/presets/translate-en-es.yaml "${CKPT_EN_ES:-200}" 400 "${VAL_EN_ES:-500}" ${EN_ES_FLAGS:-} &
  BACKGROUND+=($!)
  recipe paper-base configs/presets/paper-base.yaml "${CKPT_PAPER:-250}" 1000 "${VAL_PAPER:-500}" \
    --config configs/trainer/bf16-mixed.yaml --trainer.limit_val_batches 20 --data.init_args.bleu_samples 100 \
    ${PAPER_FLAGS:-} &
  BACKGROUND+=($!)
fi
if [[ $ONLY == *modern* ]]; then  # on the CPU alone
  MODERN_GRID=${MODERN_GRID:-configs/ablations/modern.yaml}
  ( echo "== modern: $MODERN_GRID on the CPU, $(nproc) cores" >&2
    CUDA_VISIBLE_DEVICES= $PY scripts/ablate.py "$MODERN_GRID" --jobs "${MODERN_JOBS:-6}" --threads 2 \
      --out "$RUNS/modern" > "$RUNS/modern.log" 2>&1
    echo "== modern: exit $? after $((SECONDS - START)) s" >&2
    tail -30 "$RUNS/modern.log" | quiet >&2
    pack modern "$RUNS/modern" "modern.log" ) &
  BACKGROUND+=($!)
fi
if [[ $ONLY == *recipe* ]]; then  # the GPU benchmarks wait for the recipe runs to leave the GPU
  wait_for "${BACKGROUND[0]}" "${BACKGROUND[1]}"
fi

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

wait_for "${BACKGROUND[@]}"  # the background parts; at the deadline, pack what they have
for name in en-es paper-base modern; do
  [[ -d $RUNS/$name && ! -f $OUT/$name.tar.gz ]] && echo "== $name: packed unfinished" && pack "$name" "$RUNS/$name" \
    $(cd "$RUNS" && ls "$name".*.log 2>/dev/null)
done
echo "== done after $((SECONDS - START)) s"
