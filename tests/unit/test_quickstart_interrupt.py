"""Ctrl-C during scripts/quickstart.sh's training: the terminal signals the script and `train` alike; `train` saves
and exits 0, and the script went on to "5/6 evaluate" and "6/6 generate" from the model demo/output held before
(an earlier run's, reported as "trained weights"). Run here with stand-ins for .venv's python and pretrain-cli, the
`train` one signalling its whole process group as a terminal's Ctrl-C does and exiting 0 as `train` does."""
import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_PYTHON = "#!/bin/sh\nexit 0\n"  # pip install, make_demo_corpus.py: nothing to do here
_CLI = """#!/bin/bash
if [ "$1" = train ]; then
  trap 'echo "stopped at step 87 and saved"; exit 0' INT
  kill -INT 0   # the terminal's Ctrl-C: to the foreground process group, the script included
  sleep 30 & wait
fi
echo "ran $1"
"""


def _quickstart(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "quickstart.sh", tmp_path / "scripts" / "quickstart.sh")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("python", _PYTHON), ("pretrain-cli", _CLI)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return subprocess.run(["bash", str(tmp_path / "scripts" / "quickstart.sh"), *args], capture_output=True,
                          text=True, timeout=60, start_new_session=True, env={**os.environ, "PYTHON": "false"})


def test_ctrl_c_during_training_stops_the_script_with_how_to_continue(tmp_path):
    done = _quickstart(tmp_path, "--max_steps", "100")
    assert done.returncode == 130, done
    assert "stopped at step 87 and saved" in done.stdout
    assert "ran eval" not in done.stdout and "5/6" not in done.stdout and "ran generate" not in done.stdout
    assert done.stdout.rstrip().splitlines()[-1] == (
        "== interrupted: `.venv/bin/pretrain-cli train configs/demo_cpu.json --max_steps 100` continues the training "
        "from its newest checkpoint in demo/output, if it saved one (quickstart.sh starts over)")
