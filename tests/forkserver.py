"""Python runs for the tests that start from a process which has already imported Paddle.

Most of a short CLI run in the suite is interpreter start-up: `import paddle` (~2.5 CPU-s) and
matplotlib's first drawing (~1 s) against ~1 s of training. A fork server does that once per pytest
worker: it imports them, then forks one child per run. The child swaps in the run's working directory,
environment, `sys.argv` and standard streams and runs `-m MODULE`, `-c CODE` or a script as the
interpreter would (`runpy`; an uncaught exception prints its traceback and exits 1; `_exit` says how it
ends), so the test sees the same exit code (`-9` for a SIGKILL), stdout and stderr as from `subprocess.run`.

What a fork cannot change is what was read when Paddle was imported: a run whose environment differs in
`FLAGS_*`, thread, allocator or interpreter variables, or that starts another interpreter, goes through
`subprocess.run` instead (`run`). A launcher is the exception (`spawns=True`): it computes nothing itself, and the
processes it starts read the run's environment themselves, so it is forked whatever that holds. Tests of the
installed console script and Python start-up itself keep real processes.

A launcher's ranks (the multi-process tests') are forked too, from two other servers started with the launcher's
environment and `-u` (`rank_servers`): the launcher starts tests/distributed/rank_shim.py, which hands the rank's
streams, directory, argv and environment here and stands for the rank (exit status, signals, SIGKILL) until it
ends. A rank's environment may differ from its server's only in what the launcher sets per rank (its `_RANK_VARS`,
which Paddle reads when the process group starts, not at import); otherwise the shim becomes a fresh rank.

Each server is one process per pytest worker, started on first use and stopped with the worker. Each run is
forked from a middle process that waits for it and reports its status, so runs may overlap (threads). This module is
the tests' side, the client; the server's, what runs in the server and in what it forks: tests/forkserver_server.py.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading

import forkserver_server
from forkserver_server import _RANK_STARTUP, _STARTUP_VARS, EXIT_GRACE  # noqa: F401  (EXIT_GRACE: the tests read it)


def run(args, cwd=None, env=None, timeout=None, inject: str | None = None,
        spawns: bool = False) -> subprocess.CompletedProcess:
    """`subprocess.run([sys.executable, *args], cwd, env, capture_output=True, text=True, timeout)`, forked from
    the server when `args` is `-m MODULE ...`, `-c CODE ...` or `SCRIPT ...` and `env` changes nothing read at
    start-up.
    `inject`: a Python file executed in the forked child before the run (the fault injector); a run that would
    need a fresh interpreter cannot take one.
    `spawns`: the run only starts other interpreters (a launcher), which read `env` themselves: forked whatever
    `env` holds.
    A forked run that outlives `timeout` is killed with every process it started (`process_tree.kill_tree`: a
    launcher's ranks and their watchers, in sessions of their own; with `spawns`, the ranks the rank servers forked
    for it too) before TimeoutExpired is raised: a caller that then releases the run's port block hands no port of it
    to the next run while a rank of this one still reads or serves it."""
    args = [str(a) for a in args]
    full = dict(os.environ if env is None else env)
    server = _server() if args and (args[0] in ("-m", "-c") or not args[0].startswith("-")) else None
    if server is None or not (spawns or _forkable(full, server.env)):
        if inject:  # no caller needs it (the fault runs change no start-up variable), so it is not offered
            raise ValueError(f"forkserver.run: `inject` needs a forked run, but {args[:2]} with this environment "
                             f"starts a fresh interpreter")
        return subprocess.run([sys.executable, *args], cwd=cwd, env=full, capture_output=True, text=True,
                              timeout=timeout)
    return server.run(args, str(cwd or os.getcwd()), full, timeout, inject, spawns)


def _forkable(env: dict, base: dict) -> bool:
    changed = {k for k in set(env) | set(base) if env.get(k) != base.get(k)}
    return not any(k.startswith(_STARTUP_VARS) for k in changed)


def rank_servers(env: dict) -> str:
    """The sockets (joined by os.pathsep) of the two servers that fork the ranks of launches started with `env`
    (the launcher's), started on first use with `env` and `-u` (the launcher starts its ranks as `python -u`).
    Two, even ranks from one and odd ranks from the other: fresh interpreters hash strings with different seeds,
    so a rank that depended on a set's order would disagree with its peer; forked from one server, every rank
    would share one seed and hide that."""
    key = tuple(sorted((k, v) for k, v in env.items() if k.startswith(_RANK_STARTUP)))
    with _lock:
        clients = _rank_clients.get(key)
        if clients is None or any(c.proc.poll() is not None for c in clients):
            clients = [_Client(env, ("-u",)) for _ in range(2)]  # both start at once
            _rank_clients[key] = [c.started() for c in clients]
        return os.pathsep.join(c.path for c in _rank_clients[key])


_lock = threading.Lock()
_instance = None
_rank_clients: dict = {}


def _forked_ranks() -> list[int]:
    """The processes the rank servers run for launches (each rank's middle process, whose child is the rank): not
    the launcher's descendants, so not found from it. Launches from one test process run one at a time, so these are
    the timed-out launch's (or leftovers of an earlier one)."""
    from process_tree import parents

    with _lock:
        servers = [c.proc.pid for clients in _rank_clients.values() for c in clients if c.proc.poll() is None]
    return [pid for pid, parent in parents().items() if parent in servers]


def _server() -> "_Client":
    global _instance
    with _lock:
        if _instance is None or _instance.proc.poll() is not None:
            _instance = _Client().started()
        return _instance


class _Client:
    def __init__(self, env: dict | None = None, flags: tuple = ()):
        """A server started with `env` (this process's by default) and interpreter `flags` (`-u`: a rank's)."""
        self.dir = tempfile.mkdtemp(prefix="pcli-fork-")
        self.path = os.path.join(self.dir, "sock")
        self.env = dict(os.environ if env is None else env)  # what the server read at start-up
        self.proc = subprocess.Popen([sys.executable, *flags, forkserver_server.__file__, self.path], env=self.env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        atexit.register(self.close)

    def started(self) -> "_Client":
        ready = self.proc.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"fork server did not start (said {ready!r}, exit {self.proc.poll()})")
        return self

    def run(self, args, cwd, env, timeout, inject, spawns=False) -> subprocess.CompletedProcess:
        out, err = (tempfile.TemporaryFile("w+b", dir=self.dir) for _ in range(2))
        with out, err, socket.socket(socket.AF_UNIX) as s:
            s.connect(self.path)
            # the streams go to the child as open files (SCM_RIGHTS): no names, nothing left behind
            socket.send_fds(s, [b"x"], [out.fileno(), err.fileno()])
            s.sendall(json.dumps({"args": args, "cwd": cwd, "env": env, "inject": inject}).encode() + b"\n")
            reply = s.makefile("r")
            pid = int(reply.readline())
            s.settimeout(timeout)
            try:
                status = reply.readline()
            except TimeoutError:
                from process_tree import kill_tree

                kill_tree([pid, *(_forked_ranks() if spawns else ())])
                raise subprocess.TimeoutExpired([sys.executable, *args], timeout) from None
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess([sys.executable, *args], int(status),
                                               out.read().decode(errors="replace"), err.read().decode(errors="replace"))

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if not os.path.isdir(self.dir):  # closed already
            return
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)
