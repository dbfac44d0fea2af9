"""A launched rank that is forked rather than started: `python -u rank_shim.py SOCKETS SCRIPT ARGS...`.

`paddle.distributed.launch` starts each rank as a fresh interpreter, and `import paddle` plus the package is ~4 CPU-s
of each (~9 s wall for a 2-rank launch of the micro model, about half of it start-up). The multi-process tests hand
the launcher this script in place of scripts/run_pretrain.py (launch_helpers.launch): it imports only the standard
library, passes its stdin, stdout and stderr (the workerlog the launcher opened), working directory, argv and whole
environment to a server that has imported Paddle (tests/forkserver.py, `rank_servers`; one of two, by the parity
of the rank), and the server forks the rank, which runs SCRIPT as the fresh interpreter would. So what the tests
compare is computed by the product's own rank code (set-up, gloo, its watcher, its end), only not started afresh.

This process stands for the rank towards the launcher and the tests:
- it ends as the rank did: the same exit code, or killed by the same signal (raised on itself);
- the signals a launcher or a user sends to stop a rank (SIGTERM, SIGINT, ...) are passed on to the rank's process
  group; a SIGKILL of this process closes its connection, and the server SIGKILLs the rank's group at once; when its
  launcher dies (a test's timeout kills it) it leaves, and the rank goes with it;
- its command line names SCRIPT and its environment is the rank's, so launch_helpers.rank_pid finds it: killing it
  with SIGKILL kills the rank. What it cannot stand for is a stopped rank (SIGSTOP reaches only this process) and the
  pid the product itself reports (the forked rank's): the tests that need those start fresh ranks.

When the server answers `fresh` (the environment differs in what Paddle reads at import), this process becomes the
fresh rank (exec, same pid).
"""
import json
import os
import select
import signal
import socket
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def main() -> None:
    sockets, script = sys.argv[1].split(os.pathsep), sys.argv[2:]
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # held until the rank exists, then passed on
    launcher = os.getppid()
    rank = os.environ.get("PADDLE_TRAINER_ID", "0")
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(sockets[int(rank) % len(sockets) if rank.isdigit() else 0])
    socket.send_fds(conn, [b"x"], [0, 1, 2])
    with open("/proc/self/stat", "rb") as f:
        started = f.read().rsplit(b")", 1)[1].split()[19].decode()
    # SIGINT ignored when this process started (a launcher run in the background: a shell starts background jobs
    # so): a fresh rank's interpreter would then leave it ignored rather than raise KeyboardInterrupt, and so does
    # the forked one (forkserver_server._child), whatever the server's own start left it
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    request = {"args": script, "cwd": os.getcwd(), "env": dict(os.environ), "inject": None,
               "rank": {"pid": os.getpid(), "started": started, "unbuffered": sys.stdout.write_through,
                        "sigint_ignored": ignored}}
    conn.sendall(json.dumps(request).encode() + b"\n")
    lines = _lines(conn, launcher)
    pid = next(lines)
    if pid.startswith("fresh"):
        conn.close()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        os.execv(sys.executable, [sys.executable, "-u", *script])
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _: conn.sendall(f"{signum}\n".encode()))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    _end_as(int(next(lines)))


def _lines(conn, launcher: int):
    """The server's reply lines; ends this process (and so the rank) when the launcher is gone."""
    buf = b""
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode()
        if select.select([conn], [], [], 1.0)[0]:
            data = conn.recv(256)
            if not data:  # the server side died: nothing will say how the rank ended
                os._exit(1)
            buf += data
        elif os.getppid() != launcher:  # orphaned: nobody waits for this rank any more
            os._exit(1)


def _end_as(status: int) -> None:
    """Exit with `status` as forkserver reports it: a code, or -N for killed by signal N."""
    if status >= 0:
        os._exit(status)
    sig = -status
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    if sig != signal.SIGKILL:
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default is not to end the process


if __name__ == "__main__":
    main()
