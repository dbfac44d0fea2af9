"""Ctrl-C while a command is still importing Paddle: Paddle re-raises the KeyboardInterrupt as an ImportError from
it ("initialization failed"), which printed a 40-line traceback and exit 1 (`runtime.import_paddle` turns it back):
`error: interrupted`, 130. Deterministic: a stand-in `paddle` package ahead on the path raises exactly what Paddle's
import raises when the signal lands in it (a real signal's timing depends on the machine's load, and Paddle's own
handler swallows one in part of the import)."""
import os
import subprocess
import sys
from pathlib import Path

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
