#!/usr/bin/env bash
# pretrain-cli with Paddle's GPU build, in the virtual environment .venv/:
#   1. paddlepaddle-gpu from Paddle's own package index for the CUDA version named (PyPI has only the CPU build);
#   2. the project itself (`pip install -e . --no-deps`, so pip does not pull the CPU paddlepaddle back in),
#      then its other runtime dependencies, read from pyproject.toml;
#   3. checks that the Paddle now installed is a CUDA build, and prints the next command.
# Usage: scripts/install_gpu.sh [cu118|cu126|cu129]   (default cu126; the CUDA version of the build, which the
#        driver must support: `nvidia-smi` shows the newest it runs; Blackwell GPUs need cu129)
#   The variants are the ones Paddle's index publishes paddlepaddle-gpu 3.3.x for (its stable/cu123/ index holds
#   only 3.0 pre-releases, so cu123 is not offered); see PERFORMANCE.md §8.
#   env: PYTHON (the interpreter that creates the environment; default python3), VENV (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA=${1:-cu126}
PADDLE=paddlepaddle-gpu==3.3.1
case "$CUDA" in
  cu118|cu126|cu129) ;;
  *) echo "install_gpu: Paddle publishes $PADDLE for cu118, cu126 and cu129, not '$CUDA';" \
          "usage: scripts/install_gpu.sh [cu118|cu126|cu129]" >&2; exit 2 ;;
esac
INDEX=https://www.paddlepaddle.org.cn/packages/stable/$CUDA/
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating the virtual environment $VENV/"
  "$PY" -m venv "$VENV"
fi
VPY=$VENV/bin/python
pip() { "$VPY" -m pip --disable-pip-version-check "$@"; }
if pip show --quiet paddlepaddle >/dev/null 2>&1; then
  echo "== removing the CPU build paddlepaddle (both install the module \`paddle\`)"
  pip uninstall --yes paddlepaddle
fi
echo "== 1/3 $PADDLE for $CUDA from $INDEX"
pip install "$PADDLE" -i "$INDEX"
echo "== 2/3 pretrain-cli (--no-deps) and its other runtime dependencies"
pip install --no-deps -e .
# the [project] dependencies of pyproject.toml, without the CPU paddlepaddle
mapfile -t DEPS < <(sed -n '/^dependencies = \[/,/^\]/p' pyproject.toml | grep -o '"[^"]*"' | tr -d '"' \
                    | grep -v '^paddlepaddle')
pip install "${DEPS[@]}"
echo "== 3/3 checking the installed Paddle"
if ! "$VPY" -W ignore -c "import sys, paddle; sys.exit(0 if paddle.device.is_compiled_with_cuda() else 1)"; then
  echo "install_gpu: the Paddle in $VENV is not a CUDA build (paddle.device.is_compiled_with_cuda() is false);" \
       "see the messages above" >&2
  exit 1
fi
echo "Done: $PADDLE ($CUDA) and pretrain-cli are in $VENV/. Next, on the GPU machine:"
echo "  scripts/gpu_check.sh     # the GPU tests, then a 30-step bf16 run compared with \`pretrain-cli plan\`"
