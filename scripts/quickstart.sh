#!/usr/bin/env bash
# The embedded end-to-end demo, on a fresh machine, with no downloads:
#   corpus from Python's own documentation -> tokenizer -> .bin/.idx -> train a tiny Qwen2 on CPU
#   (with eval, a falling loss and checkpoints) -> evaluate on the test split -> generate a sample.
# Usage: scripts/quickstart.sh [--key value ...]   (overrides for configs/demo_cpu.json)
set -euo pipefail
cd "$(dirname "$0")/.."
# Ctrl-C reaches the running command too: `train` stops after its step, saves and exits 0, and the script would
# then go on to evaluate and generate from whatever model demo/output held before. Stop here instead.
stage=set-up
interrupted() {
  echo
  if [ "$stage" = train ]; then
    echo "== interrupted: \`.venv/bin/pretrain-cli train configs/demo_cpu.json${*:+ $*}\` continues the training" \
         "from its newest checkpoint in demo/output, if it saved one (quickstart.sh starts over)"
  else
    echo "== interrupted"
  fi
  exit 130
}
trap 'interrupted "$@"' INT
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== set-up: creating the virtual environment .venv/"
  "$PY" -m venv .venv
fi
echo "== set-up: pip install -e . into .venv/ (CPU Paddle, tokenizers, VisualDL, matplotlib):" \
     "35-60 s the first time (idle to loaded cores), ~5 s after"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e . 2>&1 | grep -v "^WARNING: Location" || true
CLI=.venv/bin/pretrain-cli
mkdir -p demo
echo "== 1/6 corpus: pydoc topics + standard-library docstrings"
.venv/bin/python scripts/make_demo_corpus.py demo/corpus.jsonl --max_mb 4
echo "== 2/6 tokenizer: byte-level BPE, 2048 tokens"
$CLI train-tokenizer --input_path demo/corpus.jsonl --output_dir demo/tokenizer --vocab_size 2048
echo "== 3/6 preprocess: jsonl -> demo/data/pydoc.bin/.idx"
$CLI preprocess --input_path demo/corpus.jsonl --output_prefix demo/data/pydoc --tokenizer demo/tokenizer --append_eos
$CLI inspect-data demo/data/pydoc --tokenizer demo/tokenizer
echo "== 4/6 train (configs/demo_cpu.json): tiny-qwen2 on CPU, eval every 100 steps"
$CLI check configs/demo_cpu.json --overwrite_output_dir true "$@" >/dev/null
python_args=(configs/demo_cpu.json --overwrite_output_dir true "$@")
stage=train
$CLI train "${python_args[@]}"
stage=after
echo "== 5/6 evaluate the trained model on the held-out test split (documents training never read), each window once"
$CLI eval --model demo/output --split test --max_batches 4
echo "== 6/6 generate (sampled: temperature 0.8, top-p 0.9; greedy decoding of so small a model repeats one line)"
$CLI generate --model demo/output --prompt "The with statement" --max_new_tokens 60 --temperature 0.8 --top_p 0.9 --seed 1
echo
echo "Done. Outputs in demo/output: model.safetensors (loads in transformers), checkpoint-*/, metrics.jsonl,"
echo "loss_curve.png, runs/. To use pretrain-cli (and python -m paddle...) in this shell, enter the environment:"
echo "  source .venv/bin/activate"
echo "then e.g.: pretrain-cli eval --model demo/output --data demo/data/pydoc --max_seq_length 256"
echo "           visualdl --logdir demo/output/runs --language en     (dashboard at http://localhost:8040)"
