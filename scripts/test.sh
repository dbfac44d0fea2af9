#!/usr/bin/env bash
# Set up a virtual environment with the test extra (CPU Paddle, CPU torch, transformers, the optional trackers) and run the whole suite.
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== set-up: creating the virtual environment .venv/"
  "$PY" -m venv .venv
fi
echo "== set-up: pip install -e '.[test]' into .venv/ (CPU Paddle, CPU torch, transformers, tensorboardX, wandb):" \
     "~1.5 min the first time, ~5 s after"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -W "ignore:No ccache found" -c "import paddle, torch, transformers, pretrain_cli" >/dev/null
# tests/gpu needs a GPU build of Paddle and a GPU; run it there with `pytest tests/gpu`.
echo "== running the test suite on 2 workers (its budget: ~15 min on 2 idle cores; longer on slower cores or when other work shares them)"
# Two workers, one per core (tests/conftest.py groups the tests so the multi-process ones share one worker).
exec .venv/bin/python -m pytest tests -q -p no:cacheprovider --ignore=tests/gpu -n 2 "$@"
