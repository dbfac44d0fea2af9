"""Every file pretrain-cli writes is published atomically: old or complete new, never half, no temporaries left."""
import os

import pytest

from pretrain_cli import atomic


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "state.json"
    atomic.write_json(target, {"step": 1})
    with pytest.raises(RuntimeError):
        with atomic.publishing(target, "w", encoding="utf-8") as f:
            f.write('{"step": ')
            raise RuntimeError("killed mid-write")
    assert target.read_text() == '{\n  "step": 1\n}\n'
    assert os.listdir(tmp_path) == ["state.json"]


def test_publish_file_removes_the_temporary_when_the_rename_fails(tmp_path):
    tmp = atomic.tmp_path(tmp_path / "x.bin")
    tmp.write_bytes(b"data")
    with pytest.raises(OSError):
        atomic.publish_file(tmp, tmp_path / "missing-dir" / "x.bin")
    assert not tmp.exists()


def test_publish_dir_replaces_a_complete_directory_in_one_rename(tmp_path):
    final = tmp_path / "checkpoint-5"
    final.mkdir()
    (final / "old.txt").write_text("old")
    tmp = tmp_path / "checkpoint-5.tmp"
    tmp.mkdir()
    (tmp / "new.txt").write_text("new")
    assert atomic.publish_dir(tmp, final) == final
    assert sorted(os.listdir(final)) == ["new.txt"] and sorted(os.listdir(tmp_path)) == ["checkpoint-5"]


def test_a_killed_writers_temporary_is_removed_at_the_next_start_and_a_live_ones_kept(tmp_path):
    """kill -9 between a temporary's open and its rename (the loss curve's drawing thread, say) leaves
    `<name>.tmp<pid>`; the next run's `clean_leftovers` removes it, but not a live process's temporary."""
    import subprocess
    import sys

    from pretrain_cli.training.checkpoint import clean_leftovers

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead = tmp_path / f"loss_curve.png.tmp{int(gone.stdout)}"  # that process has exited
    live = atomic.tmp_path(tmp_path / "metrics.jsonl")  # this process's: its rename may still come
    for p in (dead, live, tmp_path / "model.safetensors", tmp_path / "notes.tmp"):
        p.write_bytes(b"x")
    assert atomic.stale_temporaries(tmp_path) == [dead]
    clean_leftovers(tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, "model.safetensors", "notes.tmp"])


def test_no_module_renames_by_hand():
    """`atomic` is the one place that renames a temporary into place."""
    from pathlib import Path

    import pretrain_cli

    root = Path(pretrain_cli.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.name != "atomic.py" and "os.replace(" in p.read_text(encoding="utf-8")]
    assert not offenders, offenders


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o002, 0o664)])
def test_published_files_get_the_mode_the_umask_gives_like_open(tmp_path, mask, mode):
    """safetensors writes its file 0600; published, it must be as readable as a file open() made (a teammate's
    `eval` on a shared cluster), for a single file and for every file of a published directory."""
    import numpy as np
    from safetensors.numpy import save_file

    old = os.umask(mask)
    try:
        assert atomic.umask() == mask
        tmp = atomic.tmp_path(tmp_path / "model.safetensors")
        save_file({"w": np.zeros(2, np.float32)}, str(tmp))
        atomic.publish_file(tmp, tmp_path / "model.safetensors")
        atomic.write_json(tmp_path / "args.json", {})
        ckpt = tmp_path / "checkpoint-1.tmp"
        ckpt.mkdir()
        save_file({"m": np.zeros(2, np.float32)}, str(ckpt / "optimizer.safetensors"))
        os.chmod(ckpt / "optimizer.safetensors", 0o600)  # whatever the library chose
        (ckpt / "trainer_state.json").write_text("{}")
        final = atomic.publish_dir(ckpt, tmp_path / "checkpoint-1")
        tool = tmp_path / "tool.tmp"
        tool.write_text("#!/bin/sh\n")
        os.chmod(tool, 0o700)
        atomic.publish_file(tool, tmp_path / "tool")
    finally:
        os.umask(old)
    modes = {p.relative_to(tmp_path).as_posix(): p.stat().st_mode & 0o777
             for p in [tmp_path / "model.safetensors", tmp_path / "args.json", *sorted(final.iterdir())]}
    assert modes == {"model.safetensors": mode, "args.json": mode, "checkpoint-1/optimizer.safetensors": mode,
                     "checkpoint-1/trainer_state.json": mode}
    assert (tmp_path / "tool").stat().st_mode & 0o777 == mode | 0o111  # executable stays executable, as cc makes it
