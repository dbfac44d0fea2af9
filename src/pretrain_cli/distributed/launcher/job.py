"""A launch as scripts/launch.sh runs it: rendezvous ports held for the job, each rank's own verdict, the
job's exit code and whether to restart.

**Ports.** Paddle's launcher picks its ports (its KV master, the TCP store rank 0 hosts, one endpoint per
rank) by binding a port, closing it and handing the number on, starting at a random port of `PORT_RANGE`
(default 35100-64000, inside the kernel's ephemeral range 32768-60999). Two jobs started at once on one
host can be handed the same port, or a port the kernel then gives some outgoing connection; a rank then
joins the other job's store (`gloo/transport/tcp/address.cc:30 ... 136 vs 45`, `uv__finish_close:
Assertion`). `reserve()` takes a block of `BLOCK` ports below the ephemeral range for the job: an exclusive
`flock` on a file per block in a directory every user of this host shares (held by the launcher for its
whole life: the lock's descriptor is inherited through `exec`), every port of the block checked free, and
`PORT_RANGE` set to the block's launcher part, so two launches through launch.sh or the tests never share a
port. The block, from its first port `base`: `base` (left free: the tests' `--master`), `base + 1` ...
`base + LAUNCHER_PORTS` (the launcher's `PORT_RANGE`: its KV master, the global TCP store, one endpoint per
rank), then `GROUP_STORES` ports for the TCP stores of the gloo groups (`group_store_port`, used by
`distributed/comms/gloo.py`), which the launcher never picks.

**Verdicts.** Paddle's launcher exits with the code of the lowest-numbered rank that failed, which is
usually a rank stopped because another one died (rank 0 killed by its watcher after rank 1's usage error:
247). So each rank records its own end in `$PRETRAIN_CLI_VERDICTS/rank-R.json` (launch.sh's own directory, named by
it: `job.py verdicts`, `tempdirs`; the CLI: the exit code of a
usage error, a system error, a failed rendezvous; the rank watcher: the signal or code of a rank that died
first), and `decide()` reads them: a usage error on any rank is exit 2 and is not retried; a failed
rendezvous (exit 75, EX_TEMPFAIL) is retried with new ports without counting as a restart; otherwise the
first rank's own code (124 for a rank that made no progress, `distributed.launcher.watcher.HUNG`; 1 for a node whose
ranks were all stopped by another node's failure), retried while MAX_RESTART allows. The rank watchers write their records after the launcher may have exited, so `decide` first
waits for them (`wait_for_watchers`), and `cause` gives the console, once, on stderr, the record's line, where Paddle's
launcher named the lowest rank it saw stop, usually one stopped because another died (`failure_report`).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import socket
import sys
import tempfile
import time
from pathlib import Path

from pretrain_cli.distributed.launcher import rank_log

VERDICTS_ENV = "PRETRAIN_CLI_VERDICTS"
JOIN_ENV = "PRETRAIN_CLI_JOIN_DIR"  # where the ranks mark their join for their launcher (`launcher.joining`)
BLOCK_ENV = "PRETRAIN_CLI_PORT_BLOCK"  # the first port of the block the job holds (set by `exec_with_ports`)
BLOCK = 128
LOCK_UNIT = 32  # ports per lock file (a block is BLOCK // LOCK_UNIT of them)
LAUNCHER_PORTS = 31  # the launcher takes 2 + ranks of this node (one launch; launch.sh retries with a new block)
GROUP_STORES = BLOCK - 1 - LAUNCHER_PORTS  # 96: PP4 on 4 ranks makes 7 gloo groups, 8-rank pipelines up to 20
LOW, HIGH = 20000, 32000  # below Linux's default ephemeral range (32768-60999): the kernel never hands these out
USAGE, TRANSIENT = 2, 75
OOM = " (often the kernel's OOM killer: see dmesg)"  # after `killed by SIGKILL`, unless a stop's limit or a kill of
# the job's own (`killed_here`) explains it
RENDEZVOUS_TRIES = 3


# ------------------------------------------------------------------ verdicts
def verdict_dir() -> Path | None:
    value = os.environ.get(VERDICTS_ENV)
    return Path(value) if value else None


def record(rank: int, code: int | None, kind: str, line: str, directory: Path | None = None,
           overwrite: bool = True) -> None:
    """This rank's own end (`kind`: "usage", "system", "transient", "interrupted", "peer" (stopped because
    another rank failed), "crashed" (an unexpected exception: a bug), "died", "hung", "lost" (ended by gloo after a
    rank on another host failed), "stopped" (by a signal, after saving: exit 0); "joining" while it joins the
    process group, cleared once joined), when launched by launch.sh; best effort, never raises."""
    directory = directory or verdict_dir()
    if directory is None or code is None:
        return
    path = Path(directory) / f"rank-{rank}.json"
    with contextlib.suppress(OSError):
        if overwrite or not path.exists():
            from pretrain_cli import atomic

            atomic.write_json(path, {"rank": rank, "exit": int(code), "kind": kind, "line": line, "time": time.time(),
                                     "local": os.environ.get("PADDLE_LOCAL_RANK", "")})


def clear(rank: int) -> None:
    """Forget this rank's record: its join succeeded (marked for the launcher's join watch too)."""
    joined(rank, True)
    forget(rank)


def forget(rank: int) -> None:
    """Remove rank `rank`'s record, if any."""
    directory = verdict_dir()
    if directory is not None:
        with contextlib.suppress(OSError):
            (directory / f"rank-{rank}.json").unlink(missing_ok=True)


def joined(rank: int, done: bool, allowance: float | None = None) -> None:
    """Mark this rank inside the join of the process group (`joining.R`: its pid, and `allowance`, the seconds its
    run lets the other nodes' ranks take to come there, `none` for no limit) or through it (`joined.R`) in the
    directory its launcher's join watch reads (`JOIN_ENV`, set by scripts/paddle_launch.py on several nodes:
    `launcher.joining`). Without one, the rank limits its own wait to `allowance` (`join_deadline`). Best effort."""
    value = os.environ.get(JOIN_ENV)
    if not value:
        from pretrain_cli.distributed.launcher import join_deadline

        join_deadline.disarm() if done else join_deadline.arm(rank, allowance, _world_size(), record)
    if value:
        from pretrain_cli import atomic

        mark = str(os.getpid()) if done else f"{os.getpid()} {'none' if allowance is None else allowance}"
        with contextlib.suppress(OSError):
            atomic.write_text(Path(value) / f"{'joined' if done else 'joining'}.{rank}", mark)


def _world_size() -> int | None:
    value = os.environ.get("PADDLE_TRAINERS_NUM", "")
    return int(value) if value.isdigit() else None


def wait_for_watchers(directory, seconds: float = 15.0) -> None:
    """The rank watchers of this node (`watcher-R.pid` while each runs) write the job's verdict and their naming
    line after the launcher may have exited (it reaps the ranks, not them): wait for them, up to `seconds`."""
    from pretrain_cli import processes

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pids = []
        for path in Path(directory).glob("watcher-*.pid") if directory else ():
            with contextlib.suppress(OSError, ValueError):
                pids.append(int(path.read_text()))
        if not any(processes.alive(pid) for pid in pids):
            return
        time.sleep(0.05)


def read_records(directory) -> list[dict]:
    """The ranks' records in `directory` (`record`), those that can be read."""
    records = []
    for path in sorted(Path(directory).glob("rank-*.json")) if directory else ():
        with contextlib.suppress(OSError, ValueError):
            records.append(json.loads(path.read_text(encoding="utf-8")))
    return records


def _own(records: list[dict]) -> list[dict]:
    """The records of ranks that ended by themselves (not stopped by another's failure, a signal, a join), first
    first."""
    return sorted((r for r in records if r.get("kind") not in ("peer", "joining", "stopped")),
                  key=lambda r: r.get("time", 0))


# the fatal signals that leave Python's fatal-error stack in the rank's log (faulthandler's: SIGILL, SIGABRT, SIGBUS,
# SIGFPE, SIGSEGV); a death by another (SIGTERM, SIGHUP, SIGPIPE, SIGXCPU, SIGKILL) leaves none to quote
STACKED = {128 + s for s in (4, 6, 7, 8, 11)}


def cause(directory, log_dir=None) -> str | None:
    """The console's account of why the job ended, from the ranks' records in `directory` (`log_dir`: the launcher's
    workerlog.N directory, named so the user finds the full log), or None when no rank recorded one: the first rank's
    own end, or where a signal stopped it and saved (rank 0's line), or the line of a rank stopped by another node.
    Below the first rank's line, what its log says of it since this launch began (`rank_log`): its other `error:`
    lines, or the end of its traceback (an uncaught exception, or a death with an exit code: one before the CLI's
    handler ran) or of its stack (a fatal signal that leaves one). A rank the launcher killed once a stop by signal
    had outlasted STOP_TIMEOUT is named without the re-run advice: the launcher's own line has said the stop and
    what to do."""
    records = read_records(directory)
    own = _own(records)
    stopped = sorted((r for r in records if r.get("kind") == "stopped" and r.get("line")),
                     key=lambda r: r.get("rank", 0))
    peers = sorted((r for r in records if r.get("kind") == "peer" and r.get("line")), key=lambda r: r.get("time", 0))
    if not own and stopped:  # a signal stopped it and the ranks saved: where, and how to go on (else only in the logs)
        return f"launch.sh: {str(stopped[0]['line']).removeprefix(rank_log.PREFIX).strip()}"
    if not own and peers:  # every rank of this node stopped because a rank of another node failed: which, and how
        return f"launch.sh: {str(peers[0]['line']).removeprefix(rank_log.PREFIX).strip()}"
    if not own or not own[0].get("line"):
        return None
    first = own[0]
    line = str(first["line"]).removeprefix(rank_log.PREFIX).strip()
    if first.get("kind") == "lost":  # this node's rank was ended by another host's failure: not "ended the job"
        return f"launch.sh: {line}"
    log = Path(log_dir) / f"workerlog.{first.get('local') or first.get('rank')}" if log_dir else None
    where = f" Its full log: {log}" if log is not None else ""
    if all(r.get("kind") == "usage" and r.get("line") == first["line"] for r in records):
        said = rank_log.read(log, rank_log.start(directory, log)) if log is not None else ()
        return "\n".join(rank_log.errors(said, line))  # every rank found it (a typo'd key): as one process says it
    how, more, code = "", [], int(first.get("exit") or 0)
    if first.get("kind") in ("died", "hung"):  # the line says how: `died: killed by SIGKILL`, `made no progress`
        if code == 137:
            killed = _killed(directory, first.get("rank"), line)
            if killed and killed.get("stop"):  # the launcher's kill after a stop's limit: said by it already
                named = line.split("; the other ranks stop too", 1)[0]
                if "into its stop" not in named:
                    named = named.replace("killed by SIGKILL", f"killed by SIGKILL ({killed['why']})", 1)
                return f"launch.sh: {_sentence(named)}{where}"
            if "into its stop" not in line:  # (else the stop's limit is named already)
                why = f" ({killed['why']})" if killed else OOM
                line = line.replace("killed by SIGKILL", "killed by SIGKILL" + why, 1)
        if first.get("kind") == "died" and log is not None and (code in STACKED or 0 < code < 128):
            more = rank_log.crash(rank_log.since(directory, log), fatal=code in STACKED)
    else:
        how = f" (exit {first.get('exit')})"
        if first.get("kind") == "crashed" and log is not None:  # an uncaught exception: its traceback's end
            more = rank_log.crash(rank_log.since(directory, log))
        elif first.get("kind") in ("usage", "system") and log is not None:  # its other `error:` lines
            said = rank_log.read(log, rank_log.start(directory, log))
            more = [x for x in rank_log.errors(said, line) if x != f"error: {line}"]
    return "\n".join([f"launch.sh: rank {first.get('rank')} ended the job{how}: {_sentence(line)}{where}", *more])


def _sentence(line: str) -> str:
    """`line` ended as a sentence: its own `?` or `!` kept (a did-you-mean question), else one full stop."""
    line = line.rstrip()
    return line if line.endswith(("?", "!")) else line.rstrip(".") + "."


def killed_here(rank, why: str, pid: int, stop: bool = False) -> None:
    """Before a SIGKILL of rank `rank` (process `pid`) by this job itself (the launcher once a stop's STOP_TIMEOUT has
    passed, `stop`: `stopping.stop_ranks`; the rank on its own once its launcher is gone, `launch.end_with_launcher`):
    `why`, left in launch.sh's verdict directory (`killed-R`), so that `cause` names that and not the kernel's OOM
    killer (the rank's own note of its stop, `into its stop`, is missing when its handler never ran: stuck in a native
    call). `cause` believes it only for a record naming that pid: a rank that kills itself long after its launcher
    died may leave it in the verdict directory of launch.sh's next launch. Best effort: without launch.sh, nothing."""
    directory = verdict_dir()
    if directory is not None:
        with contextlib.suppress(OSError):
            (directory / f"killed-{rank}").write_text(json.dumps({"pid": int(pid), "why": why, "stop": stop}))


def _killed(directory, rank, line: str) -> dict | None:
    """`killed_here`'s mark for rank `rank`, when the record's `line` names its process."""
    try:
        mark = json.loads((Path(directory) / f"killed-{rank}").read_text())
        return mark if f"(pid {int(mark['pid'])} on " in line and mark.get("why") else None
    except (OSError, TypeError, ValueError, KeyError):
        return None


def killed_status(rank, pid: int) -> int | None:
    """SIGKILL's wait status when this job's own kill of rank `rank` (`killed_here`) was of process `pid`, else None:
    for a watcher whose read of that death's status lost to the launcher's reap (Paddle's reaps once a second), so
    the death is named and recorded as the SIGKILL it was, not as `exit status unknown` without a record."""
    directory = verdict_dir()
    with contextlib.suppress(OSError, TypeError, ValueError, KeyError):
        if directory is not None and int(json.loads((directory / f"killed-{rank}").read_text())["pid"]) == pid:
            return 9  # (as waitpid reports a death by signal 9)
    return None


def decide(directory, launcher_rc: int) -> tuple[int, str]:
    """(the job's exit code, "stop" / "retry" / "rendezvous") from the ranks' records and the launcher's code."""
    records = read_records(directory)
    own = _own(records)
    if any(r.get("exit") == USAGE and r.get("kind") == "usage" for r in own):
        return USAGE, "stop"
    if any(r.get("kind") == "interrupted" for r in own):  # Ctrl-C: the user stopped it
        return 130, "stop"
    if not own and any(r.get("kind") == "joining" for r in records):  # a rank died inside the join, nothing else
        return TRANSIENT, "rendezvous"
    if own and own[0].get("exit") == TRANSIENT:
        return TRANSIENT, "rendezvous"
    if own:
        return int(own[0]["exit"]), "retry"
    if any(r.get("kind") == "stopped" for r in records):  # a signal stopped it and every rank saved: done
        return 0, "stop"
    if any(r.get("kind") == "peer" for r in records):  # stopped because a rank of another node failed
        return 1, "retry"
    if launcher_rc in (USAGE, 130, 143):  # a usage error (the launcher's own), interrupted, terminated: not retried
        return launcher_rc, "stop"
    return launcher_rc, "retry"


# ------------------------------------------------------------------ ports
class Reservation:
    """A block of ports held by this process (and whatever it execs) until `release()` or its exit."""

    def __init__(self, base: int, fds: list[int]):
        self.base, self.fds = base, fds  # the locks of the block's units

    @property
    def port_range(self) -> str:
        return f"{self.base + 1}:{self.base + LAUNCHER_PORTS}"  # `base` itself stays free for a --master

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def _lock_dir() -> Path:
    path = Path(tempfile.gettempdir()) / "pretrain-cli-ports"
    with contextlib.suppress(OSError):
        path.mkdir(exist_ok=True)
        path.chmod(0o1777)  # every user of the host shares it, as /tmp itself
    return path


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _lock(path: Path) -> int | None:
    """An exclusive lock on `path` (its descriptor), or None when another process holds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)  # another user's launch can lock it too, once this one is done
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def reserve(tries: int = 200) -> Reservation:
    """A block of BLOCK free ports no other launch on this host holds (OSError when none is found). A block is
    locked as its units of LOCK_UNIT ports (a file each), so a launch holding blocks of another size (an older
    checkout on the same host) and this one exclude each other."""
    where, blocks = _lock_dir(), (HIGH - LOW) // BLOCK
    first = random.randrange(blocks)
    for i in range(min(tries, blocks)):
        base = LOW + ((first + i) % blocks) * BLOCK
        fds = []
        for unit in range(base, base + BLOCK, LOCK_UNIT):
            fd = _lock(where / f"{unit}.lock")
            if fd is None:
                break
            fds.append(fd)
        if len(fds) == BLOCK // LOCK_UNIT and all(_free(p) for p in range(base, base + BLOCK)):
            return Reservation(base, fds)
        Reservation(base, fds).release()  # a unit held by another launch, or a port used outside these locks
    raise OSError(f"no free block of {BLOCK} ports in {LOW}-{HIGH} on this host")


def group_store_port(n: int) -> int | None:
    """The port of the n-th (from 1) gloo group's own TCP store that a rank of this host serves
    (`distributed/comms/gloo.py`): a port of the block this job holds that the launcher never picks, the same on
    every rank for the same n. None when the job holds no block (a bare `paddle.distributed.launch`)."""
    value = os.environ.get(BLOCK_ENV)
    if not value:
        return None
    base = int(value)
    if not 1 <= n <= GROUP_STORES:
        from pretrain_cli.errors import UserError

        raise UserError(f"gloo process group {n} needs a TCP store port, but the job's port block {base}-"
                        f"{base + BLOCK - 1} holds {GROUP_STORES} (distributed/launcher/job.py GROUP_STORES); run fewer "
                        f"processes or pipeline stages on CPU (each pipeline rebuild of a spike rollback adds groups)")
    return base + LAUNCHER_PORTS + n


def exec_with_ports(cmd: list[str]) -> None:
    """Reserve a block, then become `cmd` with PORT_RANGE set to its launcher part and BLOCK_ENV to its first
    port (the lock stays held by `cmd`)."""
    held = reserve()
    for fd in held.fds:
        os.set_inheritable(fd, True)
    os.environ["PORT_RANGE"] = held.port_range
    os.environ[BLOCK_ENV] = str(held.base)
    os.execvp(cmd[0], cmd)


def main(argv: list[str]) -> int:
    """`ports -- CMD...` (exec CMD holding a block of ports) | `decide DIR LAUNCHER_RC` (prints `CODE ACTION`) |
    `verdicts PID` (prints a new verdict directory for launch.sh, process PID: `tempdirs`)."""
    if argv[:2] == ["ports", "--"] and len(argv) > 2:
        exec_with_ports(argv[2:])
    if len(argv) == 2 and argv[0] == "verdicts" and argv[1].isdigit():
        from pretrain_cli.distributed.launcher import tempdirs

        try:
            print(tempdirs.create(tempdirs.VERDICTS, int(argv[1])))
        except OSError as e:
            print(f"launch.sh: cannot make the job's verdict directory in TMPDIR ({tempfile.gettempdir()}): "
                  f"{e.strerror or e}; set TMPDIR to a writable directory", file=sys.stderr)
            return 1
        return 0
    if len(argv) == 3 and argv[0] == "decide":
        wait_for_watchers(argv[1])
        code, action = decide(argv[1], int(argv[2]))
        print(code, action)
        return 0
    if len(argv) in (2, 3) and argv[0] == "cause":
        line = cause(argv[1], argv[2] if len(argv) == 3 else None)
        if line:
            print(line)
        return 0
    print("usage: job.py ports -- CMD... | decide DIR LAUNCHER_RC | cause DIR [LOG_DIR] | verdicts PID",
          file=sys.stderr)
    return 2
