"""A disk that fills during a checkpoint save (W2: a 2 MB tmpfs as output_dir, 2 processes under launch.sh): the
write's OSError named no file (`f.write` gives `[Errno 28] No space left on device` alone), so the one line was
`error: system: No space left on device; ...` where RELIABILITY.md promises `error: <file>: <strerror>`; and rank 0,
ending with that OSError without leaving through `rank_exit.leave`, was named by its host's watchers as a death
(`rank 0 (pid P on vm) died: exited with code 1`), not by its own line. The limit here is a file size limit
(RLIMIT_FSIZE: `File too large`, EFBIG), the same write failing the same way, in a process of its own."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pretrain_cli.distributed.comms.comm import NoComm
from pretrain_cli.errors import os_error_line
from pretrain_cli.training import rank_exit, run_end

SRC = Path(__file__).resolve().parents[2] / "src"

FULL = r"""
import resource, sys
import numpy as np
from pretrain_cli.errors import os_error_line
from pretrain_cli.storage import shard_files

resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    shard_files.write(sys.argv[1], [("w", "F32", (64, 64), lambda: np.ones((64, 64), np.float32))])
except OSError as e:
    print(os_error_line(e))
"""


def test_a_checkpoint_file_the_disk_cannot_hold_is_named_in_the_line(tmp_path):
    path = tmp_path / "checkpoint-6.tmp" / "model-00001-of-00002.safetensors"
    path.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", FULL, str(path)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.stdout.startswith(f"{path}: File too large; "), out.stdout + out.stderr
    assert not list(path.parent.iterdir())  # its temporary removed


def test_a_disk_full_leaves_alone_with_its_line_not_as_a_death(monkeypatch):
    """`run_end.finish`: the OSError of a save (disk full) ends the rank as its own error (`End.ALONE`, its line for
    the other ranks' watchers: `rank 0 (...) left with an error: <file>: No space left on device; ...`), then is
    raised for the CLI's one line."""
    from run_helpers import resolve_run

    full = OSError(errno.ENOSPC, "No space left on device", "out/checkpoint-6.tmp/model-00001-of-00002.safetensors")

    class Trainer:
        state = SimpleNamespace(global_step=5)

        def train(self):
            raise full

    left = []
    monkeypatch.setattr(rank_exit, "leave", lambda comm, kind, error=None: left.append((kind, str(error))))
    collaborators = SimpleNamespace(saver=SimpleNamespace(wait=lambda: None, abandon=lambda e: None),
                                    close=lambda: None)
    with pytest.raises(OSError) as e:
        run_end.finish(resolve_run("--max_steps", "60"), Trainer(), NoComm(), collaborators)
    assert e.value is full
    assert left == [(rank_exit.End.ALONE, os_error_line(full))]
    assert left[0][1].startswith("out/checkpoint-6.tmp/model-00001-of-00002.safetensors: No space left on device; ")
