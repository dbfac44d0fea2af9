"""The jobs a test starts and signals itself (scripts/launch.sh, or the launcher's own command line): each started in a
session of its own and marked `PCLI_JOB=<marker>` in its environment, waited on until a log line or a file shows it
where the test wants it, and on the way out, however the test ended, killed with everything it started.

Why one place: the launcher starts each rank (and its watcher) in a session of its own, so SIGKILL to the job's
process group alone could leave ranks training or waiting for a peer, and a rank a test stopped (SIGSTOP) stays
stopped. The clean-up kills the group, reaps the job's first process, then SIGKILLs every process whose environment
carries the marker (`launch_helpers.job_pids`). A job whose ranks are forked (`launch_helpers.launch`) is not for
this: /proc shows a forked rank with its server's environment.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from launch_helpers import REPO, child_env, job_pids


def read_log(path: Path) -> str:
    """A log as far as it is written ("" before it exists)."""
    return path.read_text(errors="replace") if path.is_file() else ""


class Job:
    """A started job: its first process (`proc`: launch.sh's bash, or the command) and its marker."""

    def __init__(self, proc: subprocess.Popen, marker: str):
        self.proc, self.marker = proc, marker

    def pids(self) -> dict:
        """`launch_helpers.job_pids` of this job: its ranks and their watchers still running."""
        return job_pids(self.marker)

    def wait_for(self, path: Path, text: str, seconds: float = 120, poll: float = 0.1) -> None:
        """Until `text` is in the log `path` (a workerlog, launch.sh's stderr file); fails with the log so far."""
        wait_until([self], lambda: text in read_log(path), seconds, lambda: read_log(path), poll)


def wait_until(jobs: list[Job], done, seconds: float, why, poll: float = 0.1) -> None:
    """Until `done()`; fails with `why()` if one of `jobs` ends first or `seconds` pass (a bound, not a measurement)."""
    deadline = time.monotonic() + seconds
    while not done():
        assert all(job.proc.poll() is None for job in jobs) and time.monotonic() < deadline, why()
        time.sleep(poll)


def end(proc: subprocess.Popen, marker: str) -> None:
    """Kill what is left of a job: its process group if its first process still runs, then every process of it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid in job_pids(marker):  # the ranks and their watchers sit in sessions of their own
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def default_hangup() -> None:
    """SIGHUP's default action in a child: a test runner started under `nohup` (or any that ignores SIGHUP) passes the
    ignored disposition on to every process it starts, and a process started ignoring SIGHUP keeps ignoring it (bash
    cannot even trap it), as the product means it to; a test of what a hang-up does needs the terminal's default."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@contextlib.contextmanager
def started(cmd: list[str], cwd: Path, marker: str | None = None, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(), preexec_fn=None, **env: str):
    """`cmd` in a session of its own, with `child_env()` + `env` + `PCLI_JOB=<marker>` (a fresh one unless given:
    the nodes of one job share theirs); yields its `Job` and ends it (`end`) on the way out. `preexec_fn`: run in the
    child before `cmd` (`default_hangup`: a test of SIGHUP under a runner that ignores it, as `nohup` does)."""
    marker = marker or uuid.uuid4().hex
    full_env = dict(child_env(), PCLI_JOB=marker, **env)
    proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=stdout, stderr=stderr, text=True, pass_fds=pass_fds,
                            start_new_session=True, preexec_fn=preexec_fn)
    try:
        yield Job(proc, marker)
    finally:
        end(proc, marker)


def launch_sh(cfg: Path, cwd: Path, *extra: str, **kw):
    """`started` for `bash scripts/launch.sh CFG EXTRA...` with PYTHON set to this interpreter; `kw` as `started`'s
    (launch.sh's variables among them: NPROC, MAX_RESTART, LOG_DIR, MASTER, ...)."""
    return started(["bash", str(REPO / "scripts" / "launch.sh"), str(cfg), *extra], cwd, **{"PYTHON": sys.executable,
                                                                                           **kw})
