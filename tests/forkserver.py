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
processes it starts are fresh interpreters that read the run's environment, so it is forked whatever that holds
(the multi-process tests start `paddle.distributed.launch` so: its ranks stay real processes). Tests of the
installed console script and Python start-up itself keep real processes.

The server is one process per pytest worker, started on first use and stopped with the worker. Each run is
forked from a middle process that waits for it and reports its status, so runs may overlap (threads).
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading

# variables read at interpreter start or at `import paddle`: a run that sets one of these starts afresh
_STARTUP_VARS = ("FLAGS_", "OMP_", "MKL_", "KMP_", "GLOG_", "PYTHON", "LD_", "MALLOC_", "CUDA_", "PADDLE_")


def run(args, cwd=None, env=None, timeout=None, inject: str | None = None,
        spawns: bool = False) -> subprocess.CompletedProcess:
    """`subprocess.run([sys.executable, *args], cwd, env, capture_output=True, text=True, timeout)`, forked from
    the server when `args` is `-m MODULE ...`, `-c CODE ...` or `SCRIPT ...` and `env` changes nothing read at
    start-up.
    `inject`: a Python file executed in the forked child before the run (the fault injector); a run that would
    need a fresh interpreter cannot take one.
    `spawns`: the run only starts other interpreters (a launcher), which read `env` themselves: forked whatever
    `env` holds."""
    args = [str(a) for a in args]
    full = dict(os.environ if env is None else env)
    server = _server() if args and (args[0] in ("-m", "-c") or not args[0].startswith("-")) else None
    if server is None or not (spawns or _forkable(full, server.env)):
        if inject:  # no caller needs it (the fault runs change no start-up variable), so it is not offered
            raise ValueError(f"forkserver.run: `inject` needs a forked run, but {args[:2]} with this environment "
                             f"starts a fresh interpreter")
        return subprocess.run([sys.executable, *args], cwd=cwd, env=full, capture_output=True, text=True,
                              timeout=timeout)
    return server.run(args, str(cwd or os.getcwd()), full, timeout, inject)


def _forkable(env: dict, base: dict) -> bool:
    changed = {k for k in set(env) | set(base) if env.get(k) != base.get(k)}
    return not any(k.startswith(_STARTUP_VARS) for k in changed)


_lock = threading.Lock()
_instance = None


def _server() -> "_Client":
    global _instance
    with _lock:
        if _instance is None or _instance.proc.poll() is not None:
            _instance = _Client()
        return _instance


class _Client:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="pcli-fork-")
        self.path = os.path.join(self.dir, "sock")
        self.env = dict(os.environ)  # what the server read at start-up
        self.proc = subprocess.Popen([sys.executable, __file__, self.path], env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"fork server did not start (said {ready!r}, exit {self.proc.poll()})")
        atexit.register(self.close)

    def run(self, args, cwd, env, timeout, inject) -> subprocess.CompletedProcess:
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
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired([sys.executable, *args], timeout) from None
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess([sys.executable, *args], int(status),
                                               out.read().decode(errors="replace"), err.read().decode(errors="replace"))

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


# ---------------------------------------------------------------------------------------------- server
def _warm_up() -> None:
    """What every child would otherwise pay for: Paddle, the CLI's modules, matplotlib's fonts."""
    from pretrain_cli import runtime

    runtime.import_paddle()
    import pretrain_cli.cli  # noqa: F401
    import pretrain_cli.training.run  # noqa: F401
    from pretrain_cli.training.plot import render_png

    render_png([], "warm-up")


def _serve(path: str) -> None:
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(1.0)
    print("ready", flush=True)
    while os.getppid() == parent:
        while True:  # reap finished middle processes
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        if os.fork() == 0:
            listener.close()
            _middle(conn)  # never returns
        conn.close()


def _middle(conn) -> None:
    """Fork the run, report its pid, wait for it, report its exit status as subprocess does."""
    _, fds, _, _ = socket.recv_fds(conn, 1, 2)  # before any buffered read could swallow their byte
    request = json.loads(conn.makefile("rb").readline())
    pid = os.fork()
    if pid == 0:
        conn.close()
        _child(request, *fds)  # never returns
    for fd in fds:
        os.close(fd)
    _reply(conn, pid)
    status = os.waitpid(pid, 0)[1]
    _reply(conn, -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    os._exit(0)


def _reply(conn, value: int) -> None:
    try:
        conn.sendall(f"{value}\n".encode())
    except OSError:  # the test gave up waiting (a timeout): nobody to tell
        pass


def _child(request: dict, out_fd: int, err_fd: int) -> None:
    import random
    import runpy

    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.close(out_fd)
    os.close(err_fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()  # a fresh interpreter's seed, not the server's
    try:
        if request["inject"]:
            runpy.run_path(request["inject"], run_name="sitecustomize")
        first, *rest = request["args"]
        if first == "-m":
            sys.argv = rest  # runpy sets argv[0] to the module's file
            sys.path[0] = os.getcwd()
            runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
        elif first == "-c":
            sys.argv = ["-c", *rest[1:]]
            sys.path[0] = ""
            exec(compile(rest[0], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:  # a script
            sys.argv = [first, *rest]
            sys.path[0] = os.path.dirname(os.path.abspath(first))
            runpy.run_path(first, run_name="__main__")
        code = 0
    except SystemExit as e:  # as the interpreter reads it
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _exit(code)


def _exit(code: int) -> None:
    """The interpreter's exit without its last step: wait for non-daemon threads, run the atexit functions
    (logging's flush among them), flush the streams; then skip tearing down every module and object, which
    with Paddle loaded takes ~0.5 s and does nothing a test can see."""
    import atexit

    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    _warm_up()
    _serve(sys.argv[1])
