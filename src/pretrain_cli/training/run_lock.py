"""One run per `output_dir`: the lock file that refuses a second run (or a second launcher) in the same directory.

Two runs writing one directory interleave `metrics.jsonl` lines, both write run records and whichever
saves last owns the checkpoints, and both exit 0. The lock is `output_dir/run.lock`, holding the
holder's host, pid and process start time; it is created whole or not at all (a complete temporary
file hard-linked to the lock name: `link` fails if the name exists, on local disks and NFS alike).
Only global rank 0 takes it, so the ranks of one run never conflict, while rank 0 of a second launcher
on a shared directory is refused with one line naming the holder.

Whether the holder still runs: on this host, its pid (gone, or now another process: the lock is stale and
taken over). Another host's processes cannot be asked, so the holder beats: a thread rewrites the lock
every `BEAT_SECONDS` with its `beat` counter one higher (a whole file renamed over the name, so a reader
never sees half of one). A lock from another host is watched for `STALE_SECONDS`: a beat means its run is
alive (refused); none means that run is gone (a node that died, a job requeued elsewhere on shared storage)
and the lock is taken over. The watch compares the counter, not clocks, so hosts' clocks need not agree; it
costs up to `STALE_SECONDS` at start, and only when another host's lock is there. A lock without a counter
(written before the beat existed) cannot be judged: the line names the file to remove.

The lock is also how the next start learns that a run did not finish: every end of the run that runs Python's
`finally` (its last step, an error, Ctrl-C, a SIGTERM stop) releases it, so a lock whose holder is gone was left by a
process that ended without that (SIGKILL, the kernel's out-of-memory killer, a crash in native code, its host down,
its watcher's kill of a hung rank) or whose removal failed (a read-only output_dir). The next `train` (and `check`)
says so in one line, with the last step `metrics.jsonl` logged, the last checkpoint and what the run's launch wrote
down of its end in the workerlogs launch.sh keeps in output_dir (`launch_logs.recorded_end`), else which ends say
nothing (`unfinished`); under `scripts/launch.sh`'s restarts (`PRETRAIN_CLI_RESTART`), whose own line named the failure
just before, it says only where the previous attempt ended.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

from pretrain_cli import atomic, processes, run_dir
from pretrain_cli.errors import UserError
from pretrain_cli.training import launch_logs

LOCK_FILE = "run.lock"
BEAT_SECONDS = 10.0
STALE_SECONDS = 3 * BEAT_SECONDS  # three missed beats: a holder descheduled for a while is not taken over
_IDENTITY = ("host", "pid", "start_ticks", "started")
_watched: dict[Path, dict] = {}  # another host's lock a watch in this process found gone: {lock path: the lock read}


def same_holder(a: dict | None, b: dict | None) -> bool:
    """Whether two reads of a lock are the same run's (its beat aside)."""
    return a is not None and b is not None and all(a.get(k) == b.get(k) for k in _IDENTITY)


class RunLock:
    """A held lock, beating until `release()` removes it (only if it is still this process's)."""

    def __init__(self, path: Path, me: dict, created_dir: Path | None):
        self.path, self.me, self.created_dir = path, me, created_dir
        self._stop = threading.Event()
        self._beater = threading.Thread(target=self._beat_loop, name="run-lock-beat", daemon=True)
        self._beater.start()

    def _beat_loop(self) -> None:
        while not self._stop.wait(BEAT_SECONDS):
            holder = _read(self.path)
            if holder is not None and not same_holder(holder, self.me):  # (unreadable: no verdict, beat on)
                # taken over while this process could not beat (paused past the watch): the other run owns
                # output_dir now, and two runs writing it would break each other's saves (both died at the next
                # one): this one ends at once, without saving, as a kill -9 would (its checkpoints stay whole)
                print(f"error: {self.path} was taken over by {_who(holder)} while this run was paused; this run "
                      f"stops without saving (that run owns {self.path.parent} now)", file=sys.stderr, flush=True)
                os._exit(1)
            self.me["beat"] += 1
            try:
                atomic.write_json(self.path, self.me)  # a whole file renamed over the name
            except OSError:
                pass  # a full or unreachable disk: the next beat tries again

    def release(self) -> None:
        self._stop.set()
        self._beater.join()
        if same_holder(_read(self.path), self.me):
            try:
                self.path.unlink(missing_ok=True)
            except OSError as e:  # (a read-only output_dir): raised from `run`'s `finally`, it hid the run's own error
                print(f"warning: {self.path}: could not remove the run lock ({e.strerror or e}); the next start in "
                      f"{self.path.parent} takes it over", file=sys.stderr, flush=True)
        if self.created_dir is not None:  # a run that wrote nothing leaves no empty directory behind
            try:
                self.created_dir.rmdir()
            except OSError:
                pass


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def holder(output_dir) -> dict | None:
    """The run lock in `output_dir` as read now (None: none, or unreadable)."""
    return _read(Path(output_dir) / LOCK_FILE)


def describe(lock: dict | None) -> str:
    """`pid P on host H`: who holds `lock` (a read of it)."""
    return _who(lock)


def whose(output_dir) -> str | None:
    """Who holds `output_dir`'s lock now, in words, without waiting: a live process of this host, or another
    host's run (which cannot be asked); None when no run holds it (no lock, or a dead holder's)."""
    holder, here = _read(Path(output_dir) / LOCK_FILE), socket.gethostname()
    if holder is None:
        return None
    if holder.get("host") == here:
        return f"pid {holder.get('pid')}" if processes.alive(holder.get("pid"), holder.get("start_ticks")) else None
    return f"host {holder.get('host')}"


def _who(holder: dict | None) -> str:
    holder = holder or {}
    return f"pid {holder.get('pid')} on host {holder.get('host')}"


def _judge(path: Path, holder: dict | None, here: str) -> str:
    """'free' (no lock now), 'stale' (its run is gone: take it over), 'alive', or 'unknown' (another host's
    lock without a beat). Another host's lock with a beat is watched for up to STALE_SECONDS."""
    if holder is None:  # unreadable: a lock is written whole, so not a run's, unless the read itself failed
        for _ in range(5):  # (NFS can fail a read around the holder's rename: ESTALE; so ask a few more times)
            if not path.exists():
                return "free"
            time.sleep(0.2)
            holder = _read(path)
            if holder is not None:
                return _judge(path, holder, here)
        return "stale"
    if holder.get("host") == here:
        return "alive" if processes.alive(holder.get("pid"), holder.get("start_ticks")) else "stale"
    if not isinstance(holder.get("beat"), int):
        return "unknown"
    if same_holder(_watched.get(path), holder) and _watched[path].get("beat") == holder.get("beat"):
        return "stale"  # watched in this process already (`refusal`, before the resume) and not beaten since
    print(f"{path} is held by {_who(holder)}; watching its heartbeat for up to {STALE_SECONDS:.0f} s",
          file=sys.stderr, flush=True)
    deadline = time.monotonic() + STALE_SECONDS
    while time.monotonic() < deadline:
        time.sleep(min(1.0, STALE_SECONDS / 10))
        now = _read(path)
        if now is None:  # gone, or a read that failed (no information: keep watching)
            if not path.exists():
                return "free"
            continue
        if not same_holder(now, holder):
            return _judge(path, now, here)  # another run took it meanwhile: judge that one
        if now.get("beat") != holder.get("beat"):
            return "alive"
    _watched[path] = holder
    return "stale"


def _unlink_if(path: Path, holder: dict | None) -> None:
    """Remove the stale lock only if it is still the one judged stale (not a lock taken meanwhile): an unreadable
    one only while it stays unreadable."""
    if same_holder(_read(path), holder) or (holder is None and _read(path) is None):
        path.unlink(missing_ok=True)


def acquire(output_dir, ranks: int = 1, say=None) -> RunLock:
    """Take `output_dir`'s lock for this process, or raise a one-line UserError naming the run that holds it. A lock
    left by a run that did not finish is taken over with one line saying so (`unfinished`), handed to `say` (default:
    printed on stderr; `training.run` holds it as the context of what the run meets next). `ranks`: the launch's
    processes, recorded for that line."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    out = Path(output_dir)
    created = None if out.exists() else out
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    here = socket.gethostname()
    me = {"host": here, "pid": os.getpid(), "start_ticks": processes.start_ticks(os.getpid()),
          "started": time.strftime("%Y-%m-%d %H:%M:%S"), "beat": 0, "ranks": ranks}
    candidate = atomic.tmp_path(path)  # complete before it gets the lock's name; cleaned up if we die
    atomic.write_json(candidate, me)
    try:
        for _ in range(3):
            try:
                os.link(candidate, path)
                return RunLock(path, me, created)
            except FileExistsError:
                holder = _read(path)
                verdict = _judge(path, holder, here)
                if verdict == "stale":
                    if holder is not None and holder.get("host") != here:
                        say(f"{path}: {_who(holder)} has not beaten for {STALE_SECONDS:.0f} s: its run is gone; "
                            f"taking the lock over")
                    if holder is not None:
                        say(unfinished(out, holder, here))
                    _unlink_if(path, holder)
                if verdict in ("stale", "free"):
                    continue
                raise UserError(_refusal(out, path, _read(path) or holder, here)) from None
        raise UserError(f"{path}: could not take the run lock (another run keeps taking it); "
                        f"make sure only one run uses {out}")
    finally:
        candidate.unlink(missing_ok=True)


def refusal(output_dir, watch: bool = False) -> str | None:
    """The line `acquire` would refuse `output_dir` with now (a live run holds its lock), or None; nothing is
    taken. launch.sh asks before it starts the launcher, whose logs would otherwise go into the running job's.
    Another host's beating lock is judged only with `watch` (rank 0's `prepare`, before it reads a checkpoint there):
    its heartbeat watched once, a lock found gone is not watched again by this process's `acquire`; without `watch`
    (launch.sh's `held`: rank 0 watches it after) None."""
    out = Path(output_dir)
    path = out / LOCK_FILE
    holder, here = _read(path), socket.gethostname()
    if not watch and holder is not None and holder.get("host") != here and isinstance(holder.get("beat"), int):
        return None
    if _judge(path, holder, here) in ("free", "stale"):
        return None
    return _refusal(out, path, _read(path) or holder, here)


def previous_end(output_dir) -> str | None:
    """`check`'s word on the run before: `unfinished`'s line when `output_dir` holds the lock of a run of this host
    that is gone, else None (no lock; a live run, which `refusal` names; another host's lock, which only `train`'s
    watch of its heartbeat can judge)."""
    out = Path(output_dir)
    holder, here = _read(out / LOCK_FILE), socket.gethostname()
    if holder is None or holder.get("host") != here or processes.alive(holder.get("pid"), holder.get("start_ticks")):
        return None
    return unfinished(out, holder, here)


def unfinished(out: Path, holder: dict, here: str) -> str:
    """The one line for a lock its run left behind (`holder`, gone): when it started, the last step it logged and
    its last checkpoint, and how it ended as its launch's logs say (`launch_logs.recorded_end`), else what ends a run
    without a word. Under launch.sh's restart the failure was named by launch.sh's line before: only where the previous
    attempt ended."""
    step = last_logged_step(out)
    ckpt = run_dir.latest_checkpoint(out)
    where = (f"last step logged {step if step is not None else 'none'} ({run_dir.METRICS_FILE}), last checkpoint "
             f"{ckpt.name if ckpt is not None else 'none'}")
    restart = os.environ.get("PRETRAIN_CLI_RESTART", "")
    if restart.isdigit() and int(restart) > 0:
        return (f"note: launch.sh's restart {restart}: the previous attempt in {out} (started "
                f"{holder.get('started', '?')}) ended at: {where}")
    who = f"pid {holder.get('pid')}" + ("" if holder.get("host") == here else f" on host {holder.get('host')}")
    how = ("it was killed (SIGKILL; the kernel's out-of-memory killer: see `dmesg`; a scheduler's limit: see its log) "
           "or crashed without a word of its own")
    if (said := launch_logs.recorded_end(out, holder)) is not None:
        how = f"{said[0]} says: {said[1]}"
    elif holder.get("host") != here:
        how = "its lock stopped beating: it was killed, or its host went down"
    elif int(holder.get("ranks") or 1) > 1:
        how += f"; with its {holder.get('ranks')} ranks: the workerlogs name the rank that ended first"
    return (f"note: the previous run in {out} ({who}, started {holder.get('started', '?')}) did not finish: {where}; "
            f"{how}")


def last_logged_step(out: Path) -> int | None:
    """The step of the last training record in `out`'s metrics.jsonl, or None: its last 64 KiB read first, the whole
    file line by line only when they hold none (all eval and checkpoint lines)."""
    path = Path(out) / run_dir.METRICS_FILE
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - 65536))
            step = _train_step(f.read().splitlines())
            if step is None and size > 65536:
                f.seek(0)
                step = _train_step(f)
            return step
    except OSError:
        return None


def _train_step(lines) -> int | None:
    step = None
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # a line cut by the kill, or the tail's first, partial line
            continue
        if isinstance(record, dict) and record.get("kind") == "train" and isinstance(record.get("step"), int):
            step = record["step"]
    return step


def _refusal(out: Path, path: Path, holder: dict, here: str) -> str:
    where = "this host" if holder.get("host") == here else f"host {holder.get('host')}"
    gone = ("" if holder.get("host") == here or isinstance(holder.get("beat"), int) else
            f"; if that run is gone, delete {path} (its lock has no heartbeat, so its host cannot be judged "
            f"from here)")
    return (f"output_dir: {out} is in use by another run (pid {holder.get('pid')} on {where}, started "
            f"{holder.get('started', '?')}); wait for it to finish, stop it, or choose another output_dir{gone}")
