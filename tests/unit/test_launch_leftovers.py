"""What a launch leaves in TMPDIR (`distributed.launcher.tempdirs`): launch.sh's verdict directory and a node's
launcher's join directory are named by the process they belong to, removed when it ends (a signal too), and what a
SIGKILL left (no trap, no exit function runs) is removed by the next launch on the host. Before, each SIGKILLed
launch.sh left a `pretrain-cli-verdicts.*` and each launcher killed or stopped by a signal after the nodes met a
`pretrain-cli-join-*` for ever (64 of them on one machine). launch.sh runs here with a stand-in launcher and a TMPDIR
of the test's own; the two-node launchers' own ends: tests/unit/test_joining.py."""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from pretrain_cli import processes
from pretrain_cli.distributed.launcher import tempdirs

REPO = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()
SRC = REPO / "src"
# '-c' probes (a GPU build?) answer "no"; job.py's other commands run for real; the launcher (after `job.py ports --
# PYTHON`) says which verdict directory it was given, then ends at once or waits to be killed (STALL)
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = "-c" ]; then exit 1; fi
case "$1" in *job.py) if [ "$2" = "ports" ]; then shift 4; else exec "$REAL_PYTHON" "$@"; fi;; esac
echo "$PRETRAIN_CLI_VERDICTS" > "$RECORD"
if [ -n "${STALL:-}" ]; then exec sleep 120; fi
"""


def _ours(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(("pretrain-cli-join", "pretrain-cli-verdicts")))


def _launch_sh(tmp_path, **env) -> subprocess.Popen:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    e = {k: v for k, v in os.environ.items() if k not in ("NPROC", "MASTER", "LOG_DIR", "MAX_RESTART", "STALL")}
    e.update(PYTHON=str(fake), REAL_PYTHON=sys.executable, RECORD=str(tmp_path / "record"),
             TMPDIR=str(tmp_path / "tmp"), **env)
    (tmp_path / "record").unlink(missing_ok=True)
    return subprocess.Popen(["bash", str(REPO / "scripts" / "launch.sh"), "cfg.json"], env=e, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _until_launched(tmp_path, proc) -> str:
    deadline = time.monotonic() + 60
    while not (tmp_path / "record").is_file() or not (tmp_path / "record").read_text().strip():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return (tmp_path / "record").read_text().strip()


def _killed_launcher(tmp: Path) -> str:
    """A node's launcher (its join directory made as scripts/paddle_launch.py makes it), killed with SIGKILL."""
    code = ("import os, signal\nfrom pretrain_cli.distributed.launcher import tempdirs\n"
            "print(tempdirs.create(tempdirs.JOIN), flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(SRC)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    return Path(out.stdout.strip()).name


def test_a_launch_sh_killed_leaves_its_directories_to_the_next_launch_which_removes_them(tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    old = tmp / "pretrain-cli-join-k2x_9q0a"  # named the older way: no owner to ask, left alone
    old.mkdir()
    sleeper = subprocess.Popen(["sleep", "120"])  # a live launch.sh's directory: kept
    try:
        live = tempdirs.create(tempdirs.VERDICTS, sleeper.pid).name
        joined = _killed_launcher(tmp)
        assert _ours(tmp) == sorted([old.name, live, joined])  # what its SIGKILL left
        proc = _launch_sh(tmp_path, STALL="1")
        try:
            verdicts = Path(_until_launched(tmp_path, proc))
            assert verdicts.parent == tmp and verdicts.name.startswith(f"pretrain-cli-verdicts-{HOST}-{proc.pid}-")
            assert _ours(tmp) == sorted([old.name, live, verdicts.name])  # the dead launcher's, removed
            os.killpg(proc.pid, signal.SIGKILL)  # launch.sh and its launcher: no EXIT trap runs
            proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert _ours(tmp) == sorted([old.name, live, verdicts.name])  # what that SIGKILL left
        proc = _launch_sh(tmp_path)  # the next launch: ends at once, exit 0
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert _ours(tmp) == sorted([old.name, live])  # the dead launch.sh's removed, its own too (the trap)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_launch_sh_stopped_by_a_signal_leaves_nothing(tmp_path):
    (tmp_path / "tmp").mkdir()
    proc = _launch_sh(tmp_path, STALL="1")
    try:
        _until_launched(tmp_path, proc)
        os.kill(proc.pid, signal.SIGTERM)  # to launch.sh alone: passed on to its launcher, then its EXIT trap
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, err
    assert _ours(tmp_path / "tmp") == []


def test_a_directory_is_its_owners_by_host_pid_and_start_time(tmp_path):
    """A pid reused since (another start time) is not the owner; the start time unknown (no /proc), the pid alone
    decides; another host's pid says nothing here (a TMPDIR shared between hosts): left alone."""
    me, ticks, gone = os.getpid(), processes.start_ticks(os.getpid()), 2 ** 22 + 1  # (above Linux's PID_MAX_LIMIT)
    kept = [f"pretrain-cli-join-{HOST}-{me}-{ticks}-abc", f"pretrain-cli-join-{HOST}-{me}-0-q_7",
            f"pretrain-cli-join-other-host-{gone}-5-x", "pretrain-cli-watch-0123-host"]
    swept = [f"pretrain-cli-join-{HOST}-{gone}-5-z", f"pretrain-cli-verdicts-{HOST}-{me}-{int(ticks) + 1}-x1"]
    for name in kept + swept:
        (tmp_path / name).mkdir()
    (tmp_path / f"pretrain-cli-join-{HOST}-{gone}-5-f").write_text("")  # not a directory: left alone
    assert sorted(p.name for p in tempdirs.sweep(tmp_path)) == swept
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, f"pretrain-cli-join-{HOST}-{gone}-5-f"])


def test_a_launcher_removes_at_its_start_what_launchers_killed_before_it_left(tmp_path):
    """scripts/paddle_launch.py run without launch.sh (one node here): its start removes a killed launcher's join
    directory too."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    _killed_launcher(tmp)
    (tmp_path / "rank.py").write_text("")
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "job.py"), "ports", "--", "env", f"TMPDIR={tmp}",
                          sys.executable, str(REPO / "scripts" / "paddle_launch.py"), "--nproc_per_node", "1",
                          "--log_dir", str(tmp_path / "log"), str(tmp_path / "rank.py")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert _ours(tmp) == []


def test_a_node_stopped_by_a_signal_before_its_ranks_joined_leaves_no_join_directory(tmp_path):
    """Two nodes (tests/unit/test_joining.py's): node 1's launcher SIGTERMed while node 0's rank goes for the join.
    It stops its rank and ends 143 through scripts/paddle_launch.py's `end` (`os._exit`: no exit function ran, and its
    join directory stayed in TMPDIR); node 0 ends the same way. `_two_nodes` finds no join directory left."""
    from test_joining import JOINS, SLEEPS, _line, _node, _two_nodes

    from pretrain_cli.distributed.launcher.ports import reserve

    held, job_id = reserve(), uuid.uuid4().hex
    master = f"127.0.0.1:{held.base}"

    def stop(procs):
        deadline = time.monotonic() + 120
        while not ((tmp_path / "going").exists() and (tmp_path / "pid").exists()):
            assert procs[1].poll() is None and time.monotonic() < deadline, procs[1].stderr.read()
            time.sleep(0.1)
        os.kill(procs[1].pid, signal.SIGTERM)  # node 1's launcher alone (its rank sits in a session of its own)

    (code, err), (other, other_err) = _two_nodes(
        tmp_path, _node(tmp_path, "waits", master, job_id, JOINS, tmp_path / "going", tmp_path / "in"),
        _node(tmp_path, "stopped", master, job_id, SLEEPS, tmp_path / "pid"), held, stop)
    assert other == 143 and "Traceback" not in other_err, other_err
    assert code == 143 and "it was stopped (exit 143" in _line(err), err
    assert _ours(tmp_path / "tmp") == []
