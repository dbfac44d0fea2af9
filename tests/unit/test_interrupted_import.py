"""Ctrl-C while a command is still importing Paddle: Paddle re-raises the KeyboardInterrupt as an ImportError from
it, which printed a 40-line traceback and exit 1 (`runtime.import_paddle` turns it back): `error: interrupted`, 130."""
import signal
import subprocess
import sys
import time
from pathlib import Path


def test_a_ctrl_c_while_a_command_imports_paddle_is_error_interrupted_130(tmp_path):
    from data_helpers import write_tokens

    data = write_tokens(tmp_path / "d")
    proc = subprocess.Popen([sys.executable, "-m", "pretrain_cli", "eval", "--model", "micro-qwen2", "--data",
                             str(data), "--max_seq_length", "8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)

    def importing():
        try:
            return "libpaddle" in (Path("/proc") / str(proc.pid) / "maps").read_text()
        except OSError:
            return False

    deadline = time.monotonic() + 60
    while not importing():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "error: interrupted", err
