"""The fork server's own side (tests/forkserver.py starts it and is what the tests call): the process that has
imported Paddle, and what it forks.

`python tests/forkserver_server.py SOCKET` warms up (`_warm_up`: Paddle, the modules a run imports, matplotlib's
fonts; then `gc.freeze`), says `ready`, and serves SOCKET: each connection is one run, forked into a middle process
(`_middle`) that forks the run (`_child`: the run's working directory, environment, `sys.argv` and streams swapped in,
`-m MODULE`, `-c CODE` or a script run as the interpreter would, `_exit`) and reports its pid and then its exit
status, so runs may overlap. A launched rank (tests/distributed/rank_shim.py asks) is answered `fresh` when its
environment differs from the server's in what is read at start-up (`_STARTUP_VARS`, `_RANK_STARTUP`, but for what the
launcher sets per rank: `_RANK_VARS`), else forked in a session of its own and tied to its shim (`_rank_middle`).
The server ends when the process that started it (a pytest worker) is gone.
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import sys
import threading
import time

# variables read at interpreter start or at `import paddle`: a run that sets one of these starts afresh
_STARTUP_VARS = ("FLAGS_", "OMP_", "MKL_", "KMP_", "GLOG_", "PYTHON", "LD_", "MALLOC_", "CUDA_", "PADDLE_")


# What `paddle.distributed.launch` adds to each rank's environment (controllers/collective.py, job/container.py,
# measured with a dumping script): Paddle reads none of them at import (no module-level read in its Python; in its
# C++ only the global TCP store's constructor, at `init_parallel_env`), so a rank forked from a server started
# without them is the fresh rank. PADDLE_TRAINER_ID and PADDLE_LOCAL_SIZE are also what `runtime.setup_env` decides
# the threads from: the rank's child runs it again (`_child`). CUSTOM_DEVICE_ROOT is what `import paddle` sets
# itself when unset (paddle/base/core.py), and the launcher's ranks inherit its value.
_RANK_VARS = frozenset(("PADDLE_MASTER", "PADDLE_GLOBAL_SIZE", "PADDLE_LOCAL_SIZE", "PADDLE_GLOBAL_RANK",
                        "PADDLE_LOCAL_RANK", "PADDLE_NNODES", "PADDLE_CURRENT_ENDPOINT", "PADDLE_TRAINER_ID",
                        "PADDLE_TRAINERS_NUM", "PADDLE_RANK_IN_NODE", "PADDLE_AUTO_CLUSTER", "PADDLE_TRAINER_ENDPOINTS",
                        "PADDLE_DISTRI_BACKEND", "PADDLE_LOG_DIR", "PADDLE_BACKUP_ENV_PATH", "PADDLE_JOB_ID",
                        "POD_NAME"))
# a rank is forked only when these equal the server's too: glibc's malloc tuning and the custom-device path are
# set at the server's `setup_env` / `import paddle`
_RANK_STARTUP = _STARTUP_VARS + ("PRETRAIN_CLI_MALLOC", "CUSTOM_DEVICE_ROOT")


# ---------------------------------------------------------------------------------------------- server
def _warm_up() -> None:
    """What every child would otherwise pay for: Paddle, the modules a training run (a launched rank too) imports,
    matplotlib's fonts."""
    from pretrain_cli import runtime

    runtime.import_paddle()
    import numpy.random  # noqa: F401
    import pretrain_cli.cli  # noqa: F401
    import pretrain_cli.commands.train  # noqa: F401
    import pretrain_cli.distributed.layout.materialize  # noqa: F401
    import pretrain_cli.orchestration.prepare  # noqa: F401
    import pretrain_cli.training.export  # noqa: F401
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
    _, fds, _, _ = socket.recv_fds(conn, 1, 3)  # before any buffered read could swallow their byte
    request = json.loads(conn.makefile("rb").readline())
    if request.get("rank"):
        _rank_middle(conn, request, fds)  # never returns
    pid = os.fork()
    if pid == 0:
        conn.close()
        _child(request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    _reply(conn, pid)
    status = os.waitpid(pid, 0)[1]
    _reply(conn, -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    os._exit(0)


def _rank_middle(conn, request: dict, fds) -> None:
    """A launched rank (tests/distributed/rank_shim.py asks): answer `fresh` when its environment differs from the
    server's in anything read at start-up (the shim then becomes the fresh rank); else fork it in a session of its
    own (as the launcher starts a rank: setsid), pass on the signals the shim forwards to its process group,
    SIGKILL that group the moment the shim's end closes without a status asked for (the shim was SIGKILLed: the
    launcher's teardown, a test's kill -9), report how it ended, and leave it unreaped until the shim itself is
    reaped: a rank's dead peer is a zombie until its launcher reaps it (polling once a second), and the rank
    watchers read how it ended from /proc meanwhile (pretrain_cli.processes.exit_status)."""
    rank = request["rank"]
    request["env"].setdefault("CUSTOM_DEVICE_ROOT", _BASE["CUSTOM_DEVICE_ROOT"])  # as its `import paddle` would set it
    base = {k: v for k, v in _BASE.items() if k not in _RANK_VARS}
    env = {k: v for k, v in request["env"].items() if k not in _RANK_VARS}
    differ = sorted(k for k in set(env) | set(base) if env.get(k) != base.get(k) and k.startswith(_RANK_STARTUP))
    if differ or rank["unbuffered"] != sys.stdout.write_through:
        _reply(conn, f"fresh {differ or ['-u']}")  # (the reason for a reader of the protocol; the shim just execs)
        os._exit(0)
    ready, in_session = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.close(ready)
        os.close(in_session)
        conn.close()
        _child(request, fds)  # never returns
    os.close(in_session)
    os.read(ready, 1)  # end of file once the child has its session: signals reach its group from now on
    os.close(ready)
    for fd in fds:
        os.close(fd)
    _reply(conn, pid)
    ended, shim_open = os.pidfd_open(pid), True
    while True:
        readable = select.select([ended, conn] if shim_open else [ended], [], [])[0]
        if ended in readable:
            break
        data = conn.recv(256)
        shim_open = bool(data)
        for sig in data.split() if data else [str(signal.SIGKILL.value)]:
            with contextlib.suppress(OSError):
                os.killpg(pid, int(sig))
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    _reply(conn, info.si_status if info.si_code == os.CLD_EXITED else -info.si_status)
    deadline = time.monotonic() + 30
    while _alive_or_zombie(rank["pid"], rank["started"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.waitpid(pid, 0)
    os._exit(0)


def _alive_or_zombie(pid: int, started: str) -> bool:
    """Whether process `pid` (started at `started`, /proc/<pid>/stat field 22) exists, reaped or not."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode() == started
    except (OSError, IndexError):
        return False


def _reply(conn, value: int) -> None:
    try:
        conn.sendall(f"{value}\n".encode())
    except OSError:  # the test gave up waiting (a timeout): nobody to tell
        pass


def _child(request: dict, fds) -> None:
    """`fds`: the run's stdout and stderr, or its stdin, stdout and stderr (a rank's)."""
    import random
    import runpy

    sys.stdout.flush()
    sys.stderr.flush()
    fds = [os.open(os.devnull, os.O_RDONLY), *fds] if len(fds) == 2 else fds
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()  # a fresh interpreter's seed, not the server's
    if request.get("rank"):
        _as_before_paddle()
        # as the shim's fresh interpreter would have it, not as the server started (the suite in a background job)
        ignored = request["rank"].get("sigint_ignored", False)
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.default_int_handler)
        # and with nothing blocked, as a launcher's rank starts, whatever mask the server inherited from its starter
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
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
    except BaseException as e:
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1  # the interpreter ends by SIGINT then
    _exit(code)


def _as_before_paddle() -> None:
    """A fresh rank prepares its run (and may warn) before it imports Paddle: its threads are decided from its own
    environment then, and the root logger has no handler yet (a warning reaches stderr through logging's last
    resort), where `import paddle` gives the root logger a handler onto the stderr `runtime.import_paddle` swallows
    (paddle/distributed/auto_parallel/random.py). So the child undoes both until the rank imports Paddle."""
    import logging

    from pretrain_cli import runtime

    runtime._DONE, runtime._THREADS = False, None
    root, imported = logging.getLogger(), runtime.import_paddle
    handlers, level = root.handlers[:], root.level
    root.handlers, root.level = [], logging.WARNING

    def import_paddle():
        root.handlers, root.level = handlers, level
        runtime.import_paddle = imported
        return imported()

    runtime.import_paddle = import_paddle


def _exit(code: int) -> None:
    """The interpreter's exit without its last step: wait for non-daemon threads, run the atexit functions
    (logging's flush among them), flush the streams; then skip tearing down every module and object, which
    with Paddle loaded takes ~0.5 s and does nothing a test can see. `code` -N: killed by signal N.

    A forked child's exit functions can block for good on a lock that one of the server's threads held when it
    forked, state a fresh interpreter never has (a rank's end timed out in the full suite, ~1 run in 3, never
    alone). So once the run's own threads are done, the exit functions get EXIT_GRACE seconds; then a watchdog
    prints every thread's stack to stderr, naming where it hung, and ends the process as it was ending."""
    import atexit
    import faulthandler

    armed = threading.Event()

    def watchdog():
        armed.wait()
        time.sleep(EXIT_GRACE + 0.5)  # faulthandler has dumped the stacks by then
        _end(code)

    threading.Thread(target=watchdog, daemon=True).start()  # before the shutdown: newer Pythons refuse threads after
    threading._shutdown()  # the run's own threads (an async checkpoint save) end as they would: no time limit
    if code < 0:  # the watchdog's kill must act at once: no Python handler (the main thread may be stuck)
        signal.signal(-code, signal.SIG_DFL)
    faulthandler.dump_traceback_later(EXIT_GRACE, exit=False)
    armed.set()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    _end(code)


EXIT_GRACE = 10.0  # seconds a forked child's exit functions get (they take milliseconds)


def _end(code: int) -> None:
    if code < 0:
        os.kill(os.getpid(), -code)  # its default action, set by _exit
    os._exit(code)


if __name__ == "__main__":
    _BASE = dict(os.environ)  # what a rank's environment is compared with (`_rank_middle`)
    _warm_up()
    _BASE.setdefault("CUSTOM_DEVICE_ROOT", os.environ["CUSTOM_DEVICE_ROOT"])  # as `import paddle` set it
    # what the warm-up made is never collected by a child: its collections skip those objects (Paddle's import is
    # most of them), and touch none of their pages, which stay shared instead of copied into every child
    gc.collect()
    gc.freeze()
    _serve(sys.argv[1])
