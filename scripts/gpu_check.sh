#!/usr/bin/env bash
# The GPU checks on one CUDA GPU, in at most $BUDGET seconds (default 540) whatever happens: every part
# runs under `timeout -k $GRACE <its box>` (SIGTERM, then SIGKILL after the grace), no part starts past the budget,
# and each part's row is printed and appended to $OUT/rows.jsonl as soon as it is measured (a part cut short gets a
# "timeout" row). At the end (also after Ctrl-C) the rows become one run appended to $JSON (docs/gpu_check.json);
# `python -m lit_transformer bench gpu-table render docs/gpu_check.json --readme docs/scaling.md` writes the GPU table of docs/scaling.md from it.
#
#   bash scripts/gpu_check.sh /path/to/nanoGPT            # on the GPU machine (a nanoGPT checkout: bench.py, model.py)
#   bash scripts/gpu_check.sh /work/nanogpt --dry-run     # on a CPU: tiny sizes, every part's plumbing and time box
#   ONLY="cli8 nanogpt8" bash scripts/gpu_check.sh ...    # some parts only; PYTHON=... picks the interpreter
#
# Parts, most important first (box in seconds; *_BOX variables override):
#   cli8, nanogpt8, cli16, nanogpt16  GPT-2 small, bias, vocabulary padded to 50,304, bf16, compiled, context 1024:
#                                     the CLI's fit (bench speed --only cli --cli-only) beside nanoGPT's own
#                                     bench.py (--real_data=False --bias=True --compile=True); tokens/s, MFU of the
#                                     989 TFLOP/s spec, peak memory
#   paper-compiled, paper-eager       paper-base with configs/trainer/compile.yaml (bf16): time from the start of
#   en-es-compiled, en-es-eager       training to the first optimizer step, then tokens/s against the same preset eager
#   preset                            configs/presets/gpt2-small.yaml as shipped (micro-batch 8, accumulate 4, bf16,
#                                     compiled): the logged train/device/items_per_sec over 200 optimizer steps
#   fsdp, deepspeed                   configs/trainer/{fsdp,deepspeed}.yaml on one GPU, GPT-2 small: 10 steps, save at 5,
#                                     resume in a new process, the losses of steps 6-10 against the uninterrupted run's
# The levers, each the cli8 run with one switch (not in the default ONLY: a second call, e.g. ONLY="cli8 lever-fused-loss
# lever-cudagraphs lever-cudnn lever-foreach"): --model.task lit_transformer.tasks.LanguageModeling --model.task.init_args.fused_loss true (liger-kernel, the `gpu` extra),
# --model.compile_mode reduce-overhead (CUDA graphs), configs/trainer/attention_cudnn.yaml (cuDNN attention first),
# --model.fused false (foreach AdamW instead of the fused one, today's default on CUDA).
# On a GPU machine without internet: carry ~/.cache/lit_transformer (tokenizers and token caches; GPT-2's tokenizer
# is replaced by a byte-level BPE of the same size, as `bench speed` does) and point LIT_TRANSFORMER_CACHE at
# it; DeepSpeed needs its wheel installed (the part is skipped, with a row saying so, when it cannot be imported).
set -uo pipefail
NANOGPT=${1:?usage: bash scripts/gpu_check.sh NANOGPT_CHECKOUT [--dry-run]}
DRY=0; [[ ${2:-} == --dry-run ]] && DRY=1
[[ -f $NANOGPT/bench.py ]] || { echo "$NANOGPT has no bench.py: give a nanoGPT checkout" >&2; exit 2; }
PY=${PYTHON:-python3}
BENCH=("$PY" -m lit_transformer.bench)   # the package's benchmarks: `python -m lit_transformer bench NAME`
OUT=${OUT:-runs/gpu_check}
BUDGET=${BUDGET:-540}
GRACE=${GRACE:-10}
MIN_BOX=${MIN_BOX:-20}   # a part with less time than this left (or than its own box) is skipped
ONLY=${ONLY:-"cli8 nanogpt8 cli16 nanogpt16 paper-compiled paper-eager en-es-compiled en-es-eager preset fsdp deepspeed"}
if (( DRY )); then JSON=${JSON:-$OUT/gpu_check.json}; else JSON=${JSON:-docs/gpu_check.json}; fi
START=$SECONDS
mkdir -p "$OUT/logs"
ROWS=$OUT/rows.jsonl
: > "$ROWS"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true

# The machine, once (lit_transformer.records); the run is appended to $JSON at exit, whatever ends the script.
META=(--nanogpt "$NANOGPT" --command "bash scripts/gpu_check.sh $*"); (( DRY )) && META+=(--dry-run)
"${BENCH[@]}" gpu-table meta "$OUT/meta.json" "${META[@]}"
finish() {
  "${BENCH[@]}" gpu-table collect "$ROWS" --meta "$OUT/meta.json" --json "$JSON"
  echo "== done after $((SECONDS - START)) s (budget $BUDGET s); table: python -m lit_transformer bench gpu-table render $JSON"
}
trap finish EXIT
CHILD=
trap '[[ -n $CHILD ]] && kill -TERM "$CHILD" 2> /dev/null; exit 130' INT TERM  # the running part ends with us

part() {  # part NAME BOX COMMAND...: time-boxed; its JSON rows tagged with the part and printed at once
  local name=$1 box=$2; shift 2
  [[ " $ONLY " == *" $name "* ]] || return 0
  local left=$(( BUDGET - (SECONDS - START) - GRACE ))
  if (( left < (box < MIN_BOX ? box : MIN_BOX) )); then
    echo "{\"part\": \"$name\", \"status\": \"skipped\", \"reason\": \"$left s of the budget left\"}" | tee -a "$ROWS"
    return 0
  fi
  (( box > left )) && box=$left
  echo "== $name (box $box s, at $((SECONDS - START)) s): $*"
  local t0=$SECONDS
  timeout -k "$GRACE" "$box" "$@" > "$OUT/logs/$name.log" 2>&1 &
  CHILD=$!
  wait "$CHILD"  # in the background and waited for, so a signal to this script is handled at once
  local rc=$?
  CHILD=
  "${BENCH[@]}" gpu-table tag "$OUT/logs/$name.log" --part "$name" --rc "$rc" --box "$box" \
    --seconds "$((SECONDS - t0))" | tee -a "$ROWS"
}

if (( DRY )); then  # tiny sizes on the CPU; compile with aot_eager (inductor's C++ build is minutes here)
  export LIT_TRANSFORMER_COMPILE_BACKEND=${LIT_TRANSFORMER_COMPILE_BACKEND:-aot_eager}
  SPEED=(--device cpu --only cli --cli-only --cli-warmup 2 --cli-steps 3)
  GPT=(--config configs/presets/tiny.yaml --trainer.precision 32-true)
  CLI8=(--cpu-batches 8 --cli-filter "tiny, batch 8"); CLI16=(--cpu-batches 16 --cli-filter "tiny, batch 16")
  PAPER=tiny-translate; EN_ES=tiny-translate; NANO=(--dry-run --block_size 64); STEPS=40
  PRESET=(--config configs/presets/tiny.yaml --trainer.accumulate_grad_batches 4 --model.compile true)
  STRATEGY_FSDP=(); STRATEGY_DS=()
else
  SPEED=(--device cuda --only cli --cli-only --cli-warmup 5 --cli-steps 20)
  BYTE_BPE=(--data.init_args.tokenizer byte_bpe --data.init_args.vocab_size 50257)  # GPT-2's own is on the hub
  GPT=(--config configs/presets/gpt2-small.yaml "${BYTE_BPE[@]}" --data.init_args.batch_size 4)
  CLI8=(--gpu-batches 8 --cli-filter "gpt2-small"); CLI16=(--gpu-batches 16 --cli-filter "gpt2-small")
  PAPER="paper-base, bf16"; EN_ES="translate-en-es, bf16"; NANO=(); STEPS=200
  PRESET=(--config configs/presets/gpt2-small.yaml "${BYTE_BPE[@]}" --config configs/trainer/bf16-mixed.yaml
    --config configs/trainer/compile.yaml)
  STRATEGY_FSDP=(--config configs/trainer/fsdp.yaml --trainer.devices 1)
  STRATEGY_DS=(--config configs/trainer/deepspeed.yaml --trainer.devices 1)
fi
QUIET=(--trainer.limit_val_batches 0 --trainer.num_sanity_val_steps 0 --trainer.enable_progress_bar false
  --trainer.enable_model_summary false)
TRANSLATION=(--cli-warmup 3 --cli-steps 10 --gpu-batches 8)

# selftest (only when ONLY names it): a command that ignores SIGTERM, so its box ends in the kill after the grace.
part selftest "${SELFTEST_BOX:-2}" bash -c 'trap "" TERM; sleep 60'
part cli8 "${CLI8_BOX:-80}" "${BENCH[@]}" speed "${SPEED[@]}" "${CLI8[@]}"
part nanogpt8 "${NANOGPT8_BOX:-70}" "${BENCH[@]}" nanogpt bench "$NANOGPT" --batch_size 8 "${NANO[@]}"
part cli16 "${CLI16_BOX:-70}" "${BENCH[@]}" speed "${SPEED[@]}" "${CLI16[@]}"
part nanogpt16 "${NANOGPT16_BOX:-60}" "${BENCH[@]}" nanogpt bench "$NANOGPT" --batch_size 16 "${NANO[@]}"
part paper-compiled "${PAPER_BOX:-130}" "${BENCH[@]}" speed "${SPEED[@]}" "${TRANSLATION[@]}" --cli-filter "$PAPER, compiled"
part paper-eager "${EAGER_BOX:-40}" "${BENCH[@]}" speed "${SPEED[@]}" "${TRANSLATION[@]}" --cli-filter "$PAPER, eager"
# As a user runs it: progress bar and TensorBoard on; only validation and checkpoints are left out of the 200 steps.
part preset "${PRESET_BOX:-90}" "${BENCH[@]}" gpu-parts preset-rate -- "${PRESET[@]}" --trainer.limit_val_batches 0 \
  --trainer.num_sanity_val_steps 0 --trainer.max_steps "$STEPS" --trainer.log_every_n_steps 5 \
  --checkpoint.save_last false --checkpoint.every_n_train_steps 0 --trainer.default_root_dir "$OUT/preset" \
  --trainer.logger.init_args.save_dir "$OUT/preset"
part en-es-compiled "${EN_ES_BOX:-70}" "${BENCH[@]}" speed "${SPEED[@]}" "${TRANSLATION[@]}" --cli-filter "$EN_ES, compiled"
part en-es-eager "${EAGER_BOX:-40}" "${BENCH[@]}" speed "${SPEED[@]}" "${TRANSLATION[@]}" --cli-filter "$EN_ES, eager"
part fsdp "${FSDP_BOX:-70}" "${BENCH[@]}" gpu-parts resume --steps 10 -- "${GPT[@]}" "${STRATEGY_FSDP[@]}" "${QUIET[@]}" \
  --trainer.accumulate_grad_batches 1 --trainer.logger false --trainer.default_root_dir "$OUT/fsdp"
lever() {  # lever NAME FIT_ARGS: the cli8 run with one switch more
  local name=$1; shift
  part "lever-$name" "${LEVER_BOX:-70}" "${BENCH[@]}" speed "${SPEED[@]}" "${CLI8[@]}" --cli-extra "$*"
}
lever fused-loss --model.task lit_transformer.tasks.LanguageModeling --model.task.init_args.fused_loss true
lever cudagraphs --model.compile_mode reduce-overhead
lever cudnn --config configs/trainer/attention_cudnn.yaml
lever foreach --model.fused false
if (( DRY )) || $PY -c "import deepspeed" > /dev/null 2>&1; then
  part deepspeed "${DEEPSPEED_BOX:-80}" "${BENCH[@]}" gpu-parts resume --steps 10 -- "${GPT[@]}" "${STRATEGY_DS[@]}" \
    "${QUIET[@]}" --trainer.accumulate_grad_batches 1 --trainer.logger false --trainer.default_root_dir "$OUT/deepspeed"
elif [[ " $ONLY " == *" deepspeed "* ]]; then
  echo '{"part": "deepspeed", "status": "skipped", "reason": "deepspeed cannot be imported: install its wheel"}' \
    | tee -a "$ROWS"
fi
