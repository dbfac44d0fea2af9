"""The rendezvous ports a launch through scripts/launch.sh holds for its whole life.

**Ports.** Paddle's launcher picks its ports (its KV master, the TCP store rank 0 hosts, one endpoint per
rank) by binding a port, closing it and handing the number on, starting at a random port of `PORT_RANGE`
(default 35100-64000, inside the kernel's ephemeral range 32768-60999). Two jobs started at once on one
host can be handed the same port, or a port the kernel then gives some outgoing connection; a rank then
joins the other job's store (`gloo/transport/tcp/address.cc:30 ... 136 vs 45`, `uv__finish_close:
Assertion`). `reserve()` takes a block of `BLOCK` ports below the ephemeral range for the job: an exclusive
`flock` on a file per `LOCK_UNIT` ports of the block, in a directory every user of this host shares (held by the
launcher for its whole life: the lock's descriptor is inherited through `exec`), every port of the block checked free,
and `PORT_RANGE` set to the block's launcher part, so two launches through launch.sh or the tests never share a
port. The block, from its first port `base`: `base` (left free: the tests' `--master`), `base + 1` ...
`base + LAUNCHER_PORTS` (the launcher's `PORT_RANGE`: its KV master, the global TCP store, one endpoint per
rank), then `GROUP_STORES` ports for the TCP stores of the gloo groups (`group_store_port`, used by
`distributed/comms/gloo.py`), which the launcher never picks.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

BLOCK_ENV = "PRETRAIN_CLI_PORT_BLOCK"  # the first port of the block the job holds (set by `exec_with_ports`)
BLOCK = 128
LOCK_UNIT = 32  # ports per lock file (a block is BLOCK // LOCK_UNIT of them)
LAUNCHER_PORTS = 31  # the launcher takes 2 + ranks of this node (one launch; launch.sh retries with a new block)
GROUP_STORES = BLOCK - 1 - LAUNCHER_PORTS  # 96: PP4 on 4 ranks makes 7 gloo groups, 8-rank pipelines up to 20
LOW, HIGH = 20000, 32000  # below Linux's default ephemeral range (32768-60999): the kernel never hands these out


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


def lock_dir() -> Path:
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
    where, blocks = lock_dir(), (HIGH - LOW) // BLOCK
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
                        f"{base + BLOCK - 1} holds {GROUP_STORES} (distributed/launcher/ports.py GROUP_STORES); run "
                        f"fewer processes or pipeline stages on CPU (each pipeline rebuild of a spike rollback adds "
                        f"groups)")
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
