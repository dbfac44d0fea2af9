"""The TCP stores Paddle's process groups meet through (`core.TCPStore`, Paddle 3.3.1), without two fixed waits of
its client that every multi-process start paid for nothing, on either backend.

1. **A connect before the server listens sleeps 3 s.** The client retries a refused connection after a fixed 3 s
   (`kDelay`, phi/core/distributed/store/tcp_utils.h). Every rank but 0 connects to rank 0's global store, and the
   ranks start together: one that gets there before rank 0 listens waits 3 s, and so does every rank, as rank 0's
   store waits for all of them (measured: 3.0 s more in about two of three CPU launches, 2 and 4 ranks). `join_global`
   has those ranks try the port themselves, every few milliseconds, before Paddle connects; a gloo group's own store
   is published only once it listens (`distributed.comms.gloo`).
2. **Every request waits ~40 ms for an acknowledgement.** The client keeps Nagle's algorithm on (it never sets
   TCP_NODELAY; the server does on its side), and writes a request in three or four small sends (command, key
   length, key, value) before it reads the reply: the second send waits for the server to acknowledge the first,
   which Linux delays ~40 ms (measured with strace: 42-44 ms a request). Joining a gloo group takes about ten
   requests: 0.45 s a two-rank group, 0.85 s a four-rank one. `no_delay` turns Nagle off on the client's socket.
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import time

FIRST_PAUSE, LAST_PAUSE = 0.002, 0.1  # seconds between two tries of a port not listening yet (doubling)
SAY_AFTER = 10.0  # seconds of tries before a rank says where it waits (then at doubling intervals)


def master() -> tuple[str, int] | None:
    """(host, port) of the global store, read as Paddle's C++ reads it: PADDLE_MASTER when set (empty too: then
    Paddle's join refuses it, where the first trainer endpoint would be probed for ever), else the first trainer
    endpoint; None when neither is set or readable."""
    endpoint = os.environ.get("PADDLE_MASTER", os.environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")[0])
    host, _, port = endpoint.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def join_global(rank: int) -> None:
    """The process's global TCP store, made before Paddle's join makes it (Paddle keeps one per process: the join
    finds this one): on ranks other than 0 only once rank 0's port listens, and its requests sent without delay.
    Without an address of it nothing is done: Paddle's join reports what is missing."""
    address = master()
    if address is None:
        return
    from paddle.base import core

    host, port = address
    if rank != 0:
        await_listening(host, port)
    core.create_or_get_global_tcp_store()
    no_delay(host, port)


def await_listening(host: str, port: int) -> None:
    """Returns once `host:port` accepts a connection (closed again at once), trying every 2 ms at first, then less
    often up to every 0.1 s; as long as it takes, as Paddle's own connect would (the join's own deadline stops a
    rank whose store never comes, `distributed.launcher.join_deadline`, or on several nodes the launchers' join watch,
    `distributed.launcher.joining`). Paddle's client says where it waits at each of its tries, every 3 s ("Retry to
    connect to ..."), the one word in a rank's log of a store it cannot reach (a firewall, a wrong address): so this
    says so `SAY_AFTER` s in, then at doubling intervals (`waiting_line`; a try that a firewall drops lasts the
    kernel's ~2 min SYN retries first, as Paddle's does). A host that does not resolve returns at once: Paddle's
    connect reports it."""
    try:
        addresses = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return
    pause, start, say_at = FIRST_PAUSE, time.monotonic(), SAY_AFTER
    while True:
        for family, kind, proto, _, address in addresses:
            with socket.socket(family, kind, proto) as probe:
                error = probe.connect_ex(address)
                if error == 0:
                    return
        waited = time.monotonic() - start
        if waited >= say_at:
            with contextlib.suppress(OSError):  # (a log gone, a pipe without reader: the wait goes on, as Paddle's)
                print(waiting_line(host, port, waited, error), file=sys.stderr, flush=True)
            say_at = 2 * waited
        time.sleep(pause)
        pause = min(2 * pause, LAST_PAUSE)


def waiting_line(host: str, port: int, waited: float, error: int) -> str:
    return (f"[pretrain-cli] waiting for rank 0's TCP store at {host}:{port} to accept a connection ({waited:.0f} s so "
            f"far; the last try: {os.strerror(error)}): rank 0 has not started serving it yet, or this host cannot "
            f"reach it there (a firewall, the wrong address)")


def no_delay(host: str, port: int) -> int:
    """TCP_NODELAY on every socket of this process connected to `host:port` (the TCP store clients made so far: their
    sockets are Paddle's, found by their peer in /proc/self/fd); how many. None found (no /proc) changes nothing.
    Every socket of the process is looked at through a second descriptor, which shares its file status flags: one
    made with its family and type given and SOCK_NONBLOCK in the type leaves them alone, where Python otherwise sets
    O_NONBLOCK under a `socket.setdefaulttimeout` (Paddle's blocking client then fails, "Resource temporarily
    unavailable"), and the real family and type are read from the socket before its peer."""
    try:
        peers = {a[4][0] for a in socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)}
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    found = 0
    for fd in fds:
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            copy = os.dup(int(fd))  # a second descriptor of the same socket: closed below
        except (OSError, ValueError):  # closed meanwhile
            continue
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK, 0, copy)
        except OSError:  # reused meanwhile for something else
            os.close(copy)
            continue
        with sock:
            try:
                if (sock.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN) == socket.AF_INET
                        and sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_STREAM):
                    peer_host, peer_port = sock.getpeername()
                    if peer_port == port and peer_host in peers:
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        found += 1
            except OSError:  # not connected (a listening socket)
                pass
    return found
