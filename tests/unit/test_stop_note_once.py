"""STOP_TIMEOUT=0's line (`stopping.unlimited`) is said once a job: launch.sh starts Paddle's launcher again after a
failed rendezvous (up to 3 times) and for each MAX_RESTART restart, and each start said the same line again. The
first launcher says it; launch.sh marks the later ones (`stopping.SAID_ENV`), which do not (`stopping.start_note`)."""
import os
import subprocess
from pathlib import Path

from pretrain_cli.distributed.launcher import stopping

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "launch.sh"

# A stand-in PYTHON: '-c' probes answer "no GPU"; the launcher call (job.py ports -- PYTHON paddle_launch.py ...)
# records whether launch.sh marked the note as said, and fails; job.py's other commands run for real.
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = "-c" ]; then exit 1; fi
case "$1" in *job.py) if [ "$2" != "ports" ]; then exec "${REAL_PYTHON:-python3}" "$@"; fi;; esac
echo "${PRETRAIN_CLI_STOP_NOTE_SAID:-unset}" >> "$RECORD"
exit 1
"""


def test_launch_sh_marks_every_launcher_after_the_first(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    record = tmp_path / "starts.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC", "MASTER", "LOG_DIR", "MAX_RESTART",
                                                            stopping.SAID_ENV)}
    env.update(PYTHON=str(fake), RECORD=str(record), MAX_RESTART="2", STOP_TIMEOUT="0")
    p = subprocess.run(["bash", str(SCRIPT), "cfg.json"], env=env, capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert p.returncode == 1 and "restart 2 of 2" in p.stderr, p.stderr
    assert record.read_text().split() == ["unset", "1", "1"], p.stderr  # the first start, then two restarts


def test_only_a_launcher_not_marked_says_the_line():
    assert stopping.start_note(0, {}) == stopping.unlimited(0) is not None
    assert stopping.start_note(0, {stopping.SAID_ENV: "1"}) is None
    assert stopping.start_note(900, {}) is None
