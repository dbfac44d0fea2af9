#!/usr/bin/env bash
# The GPU path in one command, for a machine with a GPU build of Paddle (CI has no GPU, so this is where the
# fused/flash kernels, bf16 and the memory model meet real hardware):
#   1. pytest tests/gpu (fused and flash kernels vs their references, the parallel layouts);
#   2. a 30-step bf16 `pretrain-cli train` at the Qwen2.5-0.5B shape on a synthetic token file made here;
#   3. its steady-state tokens/s, MFU and peak memory printed next to what `pretrain-cli plan` predicts
#      for the same argument file.
# Usage: scripts/gpu_check.sh [--dry-run]
#   --dry-run        print the commands without running them (works anywhere)
#   env: PYTHON (default .venv/bin/python, else python3), GPU_CHECK_DIR (default a new temporary directory),
#        BATCH (default 2), SEQ (default 2048), STEPS (default 30), DEVICE (plan's --device; default the
#        name nvidia-smi reports)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "gpu_check: unknown option '$1'; usage: scripts/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac
BATCH=${BATCH:-2}
SEQ=${SEQ:-2048}
STEPS=${STEPS:-30}
WORK=${GPU_CHECK_DIR:-}

run() {  # print a command, then run it unless --dry-run
  printf '+'; printf ' %q' "$@"; printf '\n'
  if [ "$DRY" = 0 ]; then "$@"; fi
}

if [ "$DRY" = 0 ]; then
  # refuse before any work: the CPU wheel would fail later, in the middle of a run, with a worse message
  if ! "$PY" -c "import sys; from pretrain_cli import runtime; sys.exit(0 if runtime.gpu_build_installed() else 1)"; then
    echo "gpu_check: this Python ($PY) has no GPU build of Paddle (paddlepaddle-gpu); run this on a GPU machine" >&2
    exit 2
  fi
  if ! "$PY" -W ignore -c "import paddle, sys; sys.exit(0 if paddle.device.cuda.device_count() > 0 else 1)" 2>/dev/null; then
    echo "gpu_check: Paddle's GPU build sees no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)" >&2
    exit 2
  fi
fi
WORK=${WORK:-$(mktemp -d -t gpu_check.XXXXXX)}
DEVICE=${DEVICE:-$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true) | head -n1)}
DEVICE=${DEVICE:-A100-80GB}

CFG="$WORK/qwen2.5-0.5b_bf16.json"  # written in --dry-run too, so it can be checked with `plan`
mkdir -p "$WORK/data"
cat >"$CFG" <<EOF
{"model_name_or_path": "qwen2.5-0.5b", "input_dir": "$WORK/data", "output_dir": "$WORK/out", "device": "gpu",
 "bf16": true, "fp16_opt_level": "O2", "use_flash_attention": true, "use_fused_rms_norm": true,
 "use_fused_rope": true, "per_device_train_batch_size": $BATCH, "max_seq_length": $SEQ, "max_steps": $STEPS,
 "learning_rate": 3e-4, "warmup_steps": $(( STEPS / 6 )), "logging_steps": 1, "save_steps": 100000, "split": "100,0,0",
 "do_train": true, "report_to": ["none"], "disable_tqdm": true, "seed": 42}
EOF
echo "argument file: $CFG"

echo "== 1/3 GPU kernel and layout tests"
run "$PY" -m pytest tests/gpu -q -p no:cacheprovider
echo "== 2/3 synthetic token file, plan, and a $STEPS-step bf16 run at the Qwen2.5-0.5B shape ($BATCH x $SEQ)"
run "$PY" -c "import sys, numpy as np
from pretrain_cli.data.indexed import IndexedDatasetWriter, dtype_for_vocab
docs, dt = ($STEPS + 5) * $BATCH * ($SEQ + 1) * 2 // 4096 + 1, dtype_for_vocab(151936)
with IndexedDatasetWriter(sys.argv[1], dtype=dt) as w:  # random ids in documents of 4096 tokens
    w.add_documents(np.random.default_rng(0).integers(0, 151936, docs * 4096).astype(dt), [4096] * docs)
    w.finalize()" \
  "$WORK/data/synthetic"
printf '+ %q -m pretrain_cli plan %q --device %q --json > %q\n' "$PY" "$CFG" "$DEVICE" "$WORK/plan.json"
if [ "$DRY" = 0 ]; then "$PY" -m pretrain_cli plan "$CFG" --device "$DEVICE" --json >"$WORK/plan.json"; fi
run "$PY" -m pretrain_cli train "$CFG"
echo "== 3/3 measured vs planned"
run "$PY" scripts/gpu_check_report.py "$WORK/plan.json" "$WORK/out/metrics.jsonl"
