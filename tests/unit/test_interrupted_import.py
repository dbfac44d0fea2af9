"""Ctrl-C while a command is still importing Paddle, or has just imported it.

Paddle re-raises a KeyboardInterrupt inside its native module's initialisation as an ImportError from it
("initialization failed"), which printed a 40-line traceback and exit 1 (`runtime.import_paddle` turns it back): a
stand-in `paddle` package ahead on the path raises exactly that. And Paddle's import asks `which nvcc` and `which
ccache` under a bare `except:`, which swallowed a Ctrl-C pressed then: the run went on as if no key had been pressed
(`start_signals.interrupt_kept`). Those are real Ctrl-Cs at chosen moments of the real import: a stand-in program on PATH
(`which`, `ldd`, `g++`) says it started and waits, and the test sends SIGINT to the command's process group then, as
a terminal does. Every moment: `error: interrupted`, 130, nothing written."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
INTERRUPTED_IMPORT = (
    "try:\n"
    "    raise KeyboardInterrupt\n"
    "except KeyboardInterrupt as e:\n"
    "    raise ImportError('initialization failed') from e\n")


def interrupted_paddle(root: Path) -> dict:
    """An environment whose `import paddle` fails as a Ctrl-C inside Paddle's import makes it fail."""
    (root / "fake" / "paddle").mkdir(parents=True)
    (root / "fake" / "paddle" / "__init__.py").write_text(INTERRUPTED_IMPORT)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "fake"), str(SRC)])}


def test_a_ctrl_c_while_a_command_imports_paddle_is_error_interrupted_130(tmp_path):
    from data_helpers import write_tokens

    data = write_tokens(tmp_path / "d")
    proc = subprocess.run([sys.executable, "-m", "pretrain_cli", "eval", "--model", "micro-qwen2", "--data", data,
                           "--max_seq_length", "8"], env=interrupted_paddle(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 130 and proc.stderr.strip().splitlines()[-1] == "error: interrupted", proc.stderr


# A stand-in for `which`, `ldd` and `g++`: the call "$STALL" (name and arguments) says it started and waits until
# "$STALL_MARK.go" exists (or a signal ends it), then fails; every other call is the real program's.
STAND_IN = """#!/bin/sh
name=$(basename "$0")
if [ "$name $*" = "$STALL" ]; then
  : > "$STALL_MARK"
  while [ ! -e "$STALL_MARK.go" ]; do sleep 0.05; done
  exit 1
fi
PATH=$REAL_PATH exec "$name" "$@"
"""


@pytest.mark.parametrize("stall", [
    "ldd --version",  # early in Paddle's import (paddle/base/core.py): the interrupt propagates
    "which nvcc",  # late in it, under Paddle's bare `except:` (cpp_extension): the interrupt was swallowed
    "g++ --version",  # after it, before the first step (ops/cpu_build.library_path)
])
def test_a_ctrl_c_at_any_moment_of_paddles_import_ends_the_run_with_one_line_130(tmp_path, stall):
    from data_helpers import write_tokens

    (tmp_path / "data").mkdir()
    write_tokens(tmp_path / "data" / "t")
    out = tmp_path / "out"
    (tmp_path / "cfg.json").write_text(json.dumps({
        "model_name_or_path": "micro-qwen2", "device": "cpu", "input_dir": str(tmp_path / "data"),
        "output_dir": str(out), "max_seq_length": 16, "per_device_train_batch_size": 2, "max_steps": 2,
        "split": "100,0,0", "do_train": True, "report_to": ["none"]}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("which", "ldd", "g++"):
        (bin_dir / name).write_text(STAND_IN)
        (bin_dir / name).chmod(0o755)
    mark = tmp_path / "stalled"
    env = {**os.environ, "PYTHONPATH": str(SRC), "STALL": stall, "STALL_MARK": str(mark),
           "REAL_PATH": os.environ["PATH"], "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("CXX", None)
    proc = subprocess.Popen([sys.executable, "-m", "pretrain_cli", "train", str(tmp_path / "cfg.json")], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not mark.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)  # the command and its `stall` child, as a terminal's Ctrl-C
        (tmp_path / "stalled.go").touch()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "error: interrupted", err[-3000:]
    assert not out.exists()
