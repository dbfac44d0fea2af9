"""preprocess's integrity at its output prefix: one run at a time (a second is refused and touches nothing), a
published pair that is not what its sidecar says is redone (not "already complete"), and a Ctrl-C says what is
kept and how to resume."""
from __future__ import annotations

import errno
import json
import os
import socket
import struct

import pytest

from data_helpers import make_texts, make_tokenizer, preprocess_held, tree, write_jsonl
from pretrain_cli import cli
from pretrain_cli.data.indexed import HEADER_BYTES, open_token_file
from pretrain_cli.data import prefix_lock
from pretrain_cli.data.indexed_writer import sidecar_mismatch
from pretrain_cli.data.prefix_lock import _HELD, PrefixLock
from pretrain_cli.data.preprocess import Job, preprocess
from pretrain_cli.errors import UserError


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


def test_a_second_run_into_the_same_prefix_is_refused_and_the_first_finishes_intact(tmp_path, tok_dir, capsys):
    """Two runs into one prefix shared the in-progress files: the first published a .bin its .idx did not count
    and the second failed on a file the first had renamed. The second is now refused at once, naming the holder."""
    src = write_jsonl(tmp_path / "a.jsonl", make_texts(100, seed=7))
    assert preprocess(Job((str(src),), str(tmp_path / "ref" / "r"), str(tok_dir), append_eos=True)) == 0
    out = tmp_path / "out"
    with preprocess_held(src, out / "r", tok_dir) as before:
        assert "r.bin.tmp" in [n for n, _, _ in before] and "r.lock" in [n for n, _, _ in before]
        with pytest.raises(UserError) as e:
            preprocess(Job((str(src),), str(out / "r"), str(tok_dir), append_eos=True))
        assert str(e.value) == (f"{out / 'r'} is being written by another preprocess (pid {os.getpid()}); wait for it "
                                "or choose another --output_prefix")
        capsys.readouterr()
        assert cli.main(["preprocess", "--input_path", str(src), "--output_prefix", str(out / "r.bin"),
                         "--tokenizer", str(tok_dir)]) == 2  # the command line: one line, exit 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and "is being written by another preprocess" in err
        assert tree(out) == before  # nothing touched
    for ext in (".bin", ".idx"):
        assert (out / f"r{ext}").read_bytes() == (tmp_path / "ref" / f"r{ext}").read_bytes()
    assert sorted(p.name for p in out.iterdir()) == ["r.bin", "r.idx", "r.json"]  # the lock is gone with its run
    said = []
    assert preprocess(Job((str(src),), str(out / "r"), str(tok_dir), append_eos=True), say=said.append) == 0
    assert "already complete" in said[0]  # released: the next run gets the prefix


def test_a_lock_left_by_a_dead_run_does_not_block(tmp_path, tok_dir):
    """The kernel drops a flock with its holder; the file alone (a SIGKILLed run's) is no lock."""
    src = write_jsonl(tmp_path / "a.jsonl", make_texts(20, seed=8))
    (tmp_path / "r.lock").write_text("999999\n")
    assert preprocess(Job((str(src),), str(tmp_path / "r"), str(tok_dir))) == 0
    assert not (tmp_path / "r.lock").exists()


def test_a_published_pair_that_is_not_what_its_sidecar_says_is_not_complete(tmp_path, tok_dir):
    """`already complete` looked at the sidecar's inputs hash and that both files exist: a cut or overwritten .bin
    was called complete, and `check` then said to re-create it: a loop."""
    src = write_jsonl(tmp_path / "a.jsonl", make_texts(60, seed=9))
    job = Job((str(src),), str(tmp_path / "r"), str(tok_dir), append_eos=True)
    assert preprocess(job) == 0
    good = {ext: (tmp_path / f"r{ext}").read_bytes() for ext in (".bin", ".idx")}
    meta = json.loads((tmp_path / "r.json").read_text())
    assert sidecar_mismatch(str(tmp_path / "r"), meta) is None
    n, last = len(good[".bin"]), HEADER_BYTES + 4 * (60 - 1)  # the last sequence's size in the .idx
    longer = good[".idx"][:last] + struct.pack("<i", struct.unpack_from("<i", good[".idx"], last)[0] + 1)
    for name, data, why in (
            ("r.bin", good[".bin"][:-6], f"r.bin is {n - 6} bytes, the sidecar's {meta['tokens']} tokens take {n}"),
            ("r.bin", good[".bin"] + b"\0\0", f"r.bin is {n + 2} bytes"),
            ("r.idx", good[".idx"][:-8], "r.idx is "),
            ("r.idx", longer + good[".idx"][last + 4:], f"r.idx's last sequence ends at byte {n + 2} of ")):
        (tmp_path / name).write_bytes(data)
        assert why in sidecar_mismatch(str(tmp_path / "r"), meta)
        said, noted = [], []
        assert preprocess(job, said.append, noted.append) == 0
        assert said[0].startswith("preprocess: wrote "), said
        assert any("are not what their sidecar describes (" in x and why in x and "re-creating them" in x
                   for x in noted), noted
        for ext in (".bin", ".idx"):
            assert (tmp_path / f"r{ext}").read_bytes() == good[ext]
    assert open_token_file(tmp_path / "r").num_documents == 60


def _interrupt_at_progress():
    """A `note` that raises KeyboardInterrupt at the first progress line (what Ctrl-C raises), and records all."""
    lines = []

    def note(line):
        lines.append(line)
        if " docs/s" in line and not any(" docs/s" in x for x in lines[:-1]):
            raise KeyboardInterrupt

    return note, lines


def test_ctrl_c_says_what_is_kept_and_that_a_re_run_resumes(tmp_path, tok_dir):
    for i in range(3):
        write_jsonl(tmp_path / "in" / f"f{i}.jsonl", make_texts(30, seed=10 + i))
    inp = (str(tmp_path / "in"),)
    assert preprocess(Job(inp, str(tmp_path / "ref" / "r"), str(tok_dir), append_eos=True)) == 0
    note, lines = _interrupt_at_progress()  # file 1 (30 documents) finished, file 2 in flight at 60 >= 40
    job = Job(inp, str(tmp_path / "out" / "r"), str(tok_dir), append_eos=True, log_interval=40)
    with pytest.raises(KeyboardInterrupt):
        preprocess(job, note=note)
    prefix = tmp_path / "out" / "r"
    assert lines[-1] == (f"preprocess: interrupted: 1 of 3 files kept in {prefix}.progress.json; re-run the same "
                         "command to resume")
    noted = []
    assert preprocess(job, note=noted.append) == 0
    assert any(x.startswith(f"preprocess: resuming {prefix} after 1 of 3 files") for x in noted)
    for ext in (".bin", ".idx"):
        assert (tmp_path / "out" / f"r{ext}").read_bytes() == (tmp_path / "ref" / f"r{ext}").read_bytes()


def test_ctrl_c_in_the_first_file_says_nothing_is_kept(tmp_path, tok_dir):
    for i in range(2):
        write_jsonl(tmp_path / "in" / f"f{i}.jsonl", make_texts(30, seed=20 + i))
    note, lines = _interrupt_at_progress()
    with pytest.raises(KeyboardInterrupt):
        preprocess(Job((str(tmp_path / "in"),), str(tmp_path / "out" / "r"), str(tok_dir), log_interval=10), note=note)
    assert lines[-1] == ("preprocess: interrupted before the first of 2 files was finished; nothing kept (a re-run "
                         "starts over)")
    assert not (tmp_path / "out").exists()  # no .tmp files, no lock, no directory it made


def test_a_forked_worker_does_not_keep_a_dead_runs_lock(tmp_path):
    """`--workers N` forks tokenizer processes; orphaned by a killed run they had held its lock for seconds, and
    the re-run was refused naming the dead pid. A forked child closes its copy: the holder's end ends the lock."""
    lock = PrefixLock(str(tmp_path / "r"))
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: says it runs (past the fork's hooks), then waits until the test is done with it
        os.write(ready_w, b"x")
        os.read(r, 1)
        os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"x"
        _HELD.discard(lock._fd)  # (else this process's next fork would close a number reused since)
        os.close(lock._fd)  # the holder dies (its descriptor closed by the kernel, no unlock, no cleanup)
        again = PrefixLock(str(tmp_path / "r"))  # refused if the child still held the lock
        again.release()
    finally:
        os.write(w, b"x")
        os.waitpid(pid, 0)
    assert not (tmp_path / "r.lock").exists()


def _open_paths() -> list[str]:
    """What this process's descriptors point at."""
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # (the descriptor listdir itself used, closed since)
            pass
    return paths


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP])
def test_a_file_system_without_flock_is_said_once_and_the_run_goes_on(tmp_path, tok_dir, monkeypatch, capsys, code):
    """NFS without lockd (ENOLCK), Lustre without -o flock (ENOSYS): preprocess had failed with 'error: system: No
    locks available', naming no file, leaving an empty .lock and its descriptor open. Now one warning, the run
    goes on, and nothing of the lock is left."""
    def no_flock(fd, op):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(prefix_lock.fcntl, "flock", no_flock)
    src = write_jsonl(tmp_path / "a.jsonl", make_texts(20, seed=9))
    held = set(_HELD)
    out = tmp_path / "new" / "r"
    assert cli.main(["preprocess", "--input_path", str(src), "--output_prefix", str(out), "--tokenizer",
                     str(tok_dir)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "lock" in line]
    assert err == [f"preprocess: warning: this file system cannot lock {out} ({os.strerror(code)}): two runs into "
                   "it are not refused"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["r.bin", "r.idx", "r.json"]
    # no descriptor of the lock kept (named, not counted: other tests in this worker close theirs meanwhile)
    assert _HELD == held and not [fd for fd in _open_paths() if fd.startswith(str(out))]
    lock = PrefixLock(str(tmp_path / "empty" / "r"), note=lambda line: None)
    assert not (tmp_path / "empty" / "r.lock").exists()
    lock.release()
    assert not (tmp_path / "empty").exists()  # the directory it made, removed as a held lock's is


def test_another_flock_error_names_the_lock_file(tmp_path, monkeypatch):
    """Any other failure to lock is one line naming the file, with nothing of it left (was: 'error: system: ...')."""
    def bad(fd, op):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(prefix_lock.fcntl, "flock", bad)
    with pytest.raises(UserError) as e:
        PrefixLock(str(tmp_path / "r"))
    assert str(e.value) == (f"{tmp_path / 'r'}.lock: cannot lock it ({os.strerror(errno.EIO)}); choose another "
                            "--output_prefix")
    assert list(tmp_path.iterdir()) == []


def test_the_lock_file_names_its_host_and_a_refusal_from_another_host_says_it(tmp_path):
    """On a shared file system the holder can run on another machine, where its pid alone names nothing."""
    lock = PrefixLock(str(tmp_path / "r"), command="merge-data")
    try:
        assert (tmp_path / "r.lock").read_text() == f"{os.getpid()}@{socket.gethostname()} merge-data\n"
        with pytest.raises(UserError, match=rf"another merge-data \(pid {os.getpid()}\); wait"):
            PrefixLock(str(tmp_path / "r"))
        (tmp_path / "r.lock").write_text("4242@node-17 preprocess\n")  # (as that host's run wrote it)
        with pytest.raises(UserError) as e:
            PrefixLock(str(tmp_path / "r"))
        assert str(e.value) == (f"{tmp_path / 'r'} is being written by another preprocess (pid 4242 on host "
                                "node-17); wait for it or choose another --output_prefix")
    finally:
        lock.release()
