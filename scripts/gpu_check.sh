#!/usr/bin/env bash
# The GPU path in one command, for a machine with a GPU build of Paddle (CI has no GPU, so this is where the
# fused/flash kernels, bf16 and the memory model meet real hardware), on 1, 2, 4 or 8 GPUs:
#   1. pytest tests/gpu: the fused and flash kernels vs their references, and the parallel layouts that fit this
#      machine's GPUs (tests/gpu/layouts.py); the ones that need more are named, not run;
#   2. a 30-step bf16 `pretrain-cli train` (fp16 on a GPU without bf16) at the Qwen2.5-0.5B shape on a
#      synthetic token file made here;
#   3. its steady-state tokens/s, MFU and peak memory printed next to what `pretrain-cli plan` predicts
#      for the same argument file.
# Every part runs even when an earlier one fails; the exit code is 1 if any did, naming them.
# Usage: scripts/gpu_check.sh [--dry-run]
#   --dry-run        print the commands without running them (works anywhere; as for 8 GPUs unless GPUS is set)
#   env: PYTHON (default .venv/bin/python, else python3), GPU_CHECK_DIR (default a new temporary directory),
#        BATCH (default 2), SEQ (default 2048), STEPS (default 30), DEVICE (plan's --device; default the
#        name nvidia-smi reports), GPUS (the GPUs to plan the layout tests for; default Paddle's device count)
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

FAILED=()
run() {  # print a command, then run it unless --dry-run; a failure is recorded and the check goes on
  printf '+'; printf ' %q' "$@"; printf '\n'
  if [ "$DRY" = 0 ] && ! "$@"; then FAILED+=("$PART"); fi
}

if [ "$DRY" = 0 ]; then
  # refuse before any work: the CPU wheel would fail later, in the middle of a run, with a worse message
  if ! "$PY" -c "import sys; from pretrain_cli import runtime; sys.exit(0 if runtime.gpu_build_installed() else 1)"; then
    echo "gpu_check: this Python ($PY) has no GPU build of Paddle (paddlepaddle-gpu); run this on a GPU machine" >&2
    exit 2
  fi
  GPUS=${GPUS:-$("$PY" -W ignore -c "import paddle; print(paddle.device.cuda.device_count())" 2>/dev/null || echo 0)}
  if [ "${GPUS:-0}" -lt 1 ]; then
    echo "gpu_check: Paddle's GPU build sees no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)" >&2
    exit 2
  fi
fi
GPUS=${GPUS:-8}
# bf16 where the GPU has it, else fp16 (config.resolve refuses bf16 below compute capability 8.0: V100, T4)
AMP=$("$PY" -W ignore -c "from pretrain_cli import runtime; from pretrain_cli.planning.hardware import pre_ampere
print('fp16' if pre_ampere(runtime.gpu_capability()) else 'bf16')" 2>/dev/null || echo bf16)
WORK=${WORK:-$(mktemp -d -t gpu_check.XXXXXX)}
DEVICE=${DEVICE:-$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true) | head -n1)}
DEVICE=${DEVICE:-A100-80GB}

CFG="$WORK/qwen2.5-0.5b_$AMP.json"  # written in --dry-run too, so it can be checked with `plan`
mkdir -p "$WORK/data"
cat >"$CFG" <<EOF
{"model_name_or_path": "qwen2.5-0.5b", "input_dir": "$WORK/data", "output_dir": "$WORK/out", "device": "gpu",
 "$AMP": true, "fp16_opt_level": "O2", "use_flash_attention": true, "use_fused_rms_norm": true,
 "use_fused_rope": true, "per_device_train_batch_size": $BATCH, "max_seq_length": $SEQ, "max_steps": $STEPS,
 "learning_rate": 3e-4, "warmup_steps": $(( STEPS / 6 )), "logging_steps": 1, "save_steps": 100000, "split": "100,0,0",
 "do_train": true, "report_to": ["none"], "disable_tqdm": true, "seed": 42}
EOF
echo "argument file: $CFG"

PART="1/3 GPU tests"
SELECTED=() LEFT=()
while read -r kind item; do
  if [ "$kind" = run ]; then SELECTED+=("$item"); else LEFT+=("$item"); fi
done < <("$PY" tests/gpu/layouts.py "$GPUS")
echo "== 1/3 GPU kernel tests and the ${#SELECTED[@]} layout tests that fit $GPUS GPU(s)"
for item in ${LEFT[@]+"${LEFT[@]}"}; do echo "left out: $item"; done
run "$PY" -m pytest tests/gpu/test_kernels_gpu.py ${SELECTED[@]+"${SELECTED[@]}"} -q -p no:cacheprovider
PART="2/3 the $AMP run"
echo "== 2/3 synthetic token file, plan, and a $STEPS-step $AMP run at the Qwen2.5-0.5B shape ($BATCH x $SEQ)"
run "$PY" -c "import sys, numpy as np
from pretrain_cli.data.indexed import dtype_for_vocab
from pretrain_cli.data.indexed_writer import IndexedDatasetWriter
docs, dt = ($STEPS + 5) * $BATCH * ($SEQ + 1) * 2 // 4096 + 1, dtype_for_vocab(151936)
with IndexedDatasetWriter(sys.argv[1], dtype=dt) as w:  # random ids in documents of 4096 tokens
    w.add_documents(np.random.default_rng(0).integers(0, 151936, docs * 4096).astype(dt), [4096] * docs)
    w.finalize()" \
  "$WORK/data/synthetic"
printf '+ %q -m pretrain_cli plan %q --device %q --json > %q\n' "$PY" "$CFG" "$DEVICE" "$WORK/plan.json"
if [ "$DRY" = 0 ] && ! "$PY" -m pretrain_cli plan "$CFG" --device "$DEVICE" --json >"$WORK/plan.json"; then
  FAILED+=("$PART")
fi
run "$PY" -m pretrain_cli train "$CFG"
PART="3/3 measured vs planned"
echo "== 3/3 measured vs planned"
run "$PY" scripts/gpu_check_report.py "$WORK/plan.json" "$WORK/out/metrics.jsonl"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "gpu_check: failed: $(printf '%s\n' "${FAILED[@]}" | sort -u | paste -sd ';' | sed 's/;/; /g')" >&2
  exit 1
fi
