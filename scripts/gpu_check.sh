#!/usr/bin/env bash
# The GPU checks, on one CUDA GPU (an H100/H200), a few minutes in all. Results go to $OUT (default runs/gpu):
#   1. scripts/benchmark.py --device cuda: GPT-2 small, context 1024, bf16 autocast, flash SDPA, fused AdamW,
#      torch.compile vs eager, with MFU against the spec sheet and a measured bf16 matmul;
#   2. the CLI on the same model: fit with configs/trainer/{bf16-mixed,compile}.yaml; MFU from the ThroughputMonitor;
#   3. FSDP (configs/trainer/fsdp.yaml) with bf16-mixed on a small model: fit, checkpoint, resume.
#   bash scripts/gpu_check.sh          # PYTHON=... to choose the interpreter, ONLY="fsdp" for some checks only
set -uo pipefail
OUT=${OUT:-runs/gpu}
ONLY=${ONLY:-"mfu cli fsdp"}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)" | tee -a "$OUT/gpu.txt"

if [[ $ONLY == *mfu* ]]; then
echo "== 1. benchmark: model MFU"
timeout 250 $PY scripts/benchmark.py --device cuda --reps 3 --json "$OUT/mfu.json" 2>&1 | tee "$OUT/mfu.log"

fi
if [[ $ONLY == *cli* ]]; then
echo "== 2. CLI fit: GPT-2 small, bf16-mixed, compile"
timeout 150 $PY -m lit_transformer fit --config configs/presets/gpt2-small.yaml \
  --config configs/trainer/bf16-mixed.yaml --config configs/trainer/compile.yaml \
  --data.init_args.tokenizer byte_bpe --data.init_args.vocab_size 50304 --data.init_args.batch_size 16 \
  --trainer.accumulate_grad_batches 1 --trainer.max_steps 100 --trainer.limit_val_batches 0 \
  --trainer.log_every_n_steps 10 --trainer.enable_progress_bar false \
  --trainer.default_root_dir "$OUT/gpt2" --trainer.logger.init_args.save_dir "$OUT/gpt2" \
  --checkpoint.dirpath "$OUT/gpt2/checkpoints" 2>&1 | tee "$OUT/cli.log" | grep -v Warning
$PY - "$OUT/gpt2" <<'PY' 2>&1 | tee "$OUT/cli_mfu.txt"
import glob, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
for path in glob.glob(f"{sys.argv[1]}/**/events.out.tfevents.*", recursive=True):
    acc = EventAccumulator(path); acc.Reload()
    for tag in acc.Tags()["scalars"]:
        if any(key in tag for key in ("mfu", "tokens_per_sec", "batches_per_sec", "train/loss")):
            values = acc.Scalars(tag)
            print(tag, [(v.step, round(v.value, 4)) for v in values[-4:]])
PY

fi
if [[ $ONLY == *fsdp* ]]; then
echo "== 3. FSDP: fit 20 steps, resume to 30"
FSDP_ARGS=(--config configs/presets/tiny.yaml --config configs/trainer/fsdp.yaml --config configs/trainer/bf16-mixed.yaml
  --trainer.accelerator gpu --trainer.devices 1 --trainer.default_root_dir "$OUT/fsdp" --trainer.logger false
  --checkpoint.dirpath "$OUT/fsdp/checkpoints" --checkpoint.every_n_train_steps 10 --trainer.enable_progress_bar false)
timeout 75 $PY -m lit_transformer fit "${FSDP_ARGS[@]}" --trainer.max_steps 20 2>&1 | tee "$OUT/fsdp.log" | tail -5
ls -la "$OUT/fsdp/checkpoints"
timeout 75 $PY -m lit_transformer fit "${FSDP_ARGS[@]}" --trainer.max_steps 30 \
  --ckpt_path "$OUT/fsdp/checkpoints/last.ckpt" 2>&1 | tee -a "$OUT/fsdp.log" | tail -5
$PY -c "import torch,sys; c=torch.load(sys.argv[1], weights_only=True); print('resumed to global_step', c['global_step'])" \
  "$OUT/fsdp/checkpoints/last.ckpt"
fi
