"""STOP_TIMEOUT=0's line (`stopping.unlimited`) is said once a job, though launch.sh starts Paddle's launcher again
after a failed rendezvous (up to 3 times) and for each MAX_RESTART restart: the first launcher says it; launch.sh
marks the later ones (`stopping.SAID_ENV`), which do not (`stopping.start_note`)."""
import os
import subprocess
import sys
from pathlib import Path

from pretrain_cli.distributed.launcher import stopping

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "launch.sh"

# A stand-in PYTHON: '-c' probes answer "no GPU"; the launcher call (job.py ports -- PYTHON paddle_launch.py ...)
# records whether launch.sh marked the note as said, and fails; job.py's other commands run for real (REAL_PYTHON),
# each recorded in RAN with its exit code and what it printed.
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = "-c" ]; then exit 1; fi
case "$1" in *job.py) if [ "$2" != "ports" ]; then
  out=$("$REAL_PYTHON" "$@"); rc=$?
  [ -n "$out" ] && printf '%s\\n' "$out"
  echo "$2 $rc ${out//$'\\n'/ }" >> "$RAN"
  exit $rc
fi;; esac
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
    ran = tmp_path / "ran.txt"
    env.update(PYTHON=str(fake), RECORD=str(record), RAN=str(ran), REAL_PYTHON=sys.executable, MAX_RESTART="2",
               STOP_TIMEOUT="0")
    p = subprocess.run(["bash", str(SCRIPT), "cfg.json"], env=env, capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert p.returncode == 1 and "restart 2 of 2" in p.stderr, p.stderr
    assert record.read_text().split() == ["unset", "1", "1"], p.stderr  # the first start, then two restarts
    # job.py ran for real: the verdict directory made, and each failed start decided "1 retry" from the ranks' records
    ran_lines = ran.read_text().splitlines()
    assert ran_lines[0].startswith("verdicts 0 /"), ran_lines
    assert [line for line in ran_lines if line.startswith("decide")] == ["decide 0 1 retry"] * 3, ran_lines


def test_only_a_launcher_not_marked_says_the_line():
    assert stopping.start_note(0, {}) == stopping.unlimited(0) is not None
    assert stopping.start_note(0, {stopping.SAID_ENV: "1"}) is None
    assert stopping.start_note(900, {}) is None
