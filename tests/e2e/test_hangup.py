"""A run whose terminal closes (SIGHUP: a closed window, a dropped ssh session) stops as a SIGTERM stops it: the
step finishes, a checkpoint is saved, the lock is released, exit 0. It was killed mid-step by SIGHUP's default
action, nothing saved, and the next start blamed a SIGKILL or a crash. Here in a real pty whose master is closed,
as a terminal emulator's exit closes it: the run's writes to the terminal fail (EIO) from then on."""
import json
import os
import pty
import select
import signal
import sys
import time

from pretrain_cli.cli import main as cli_main

from e2e_helpers import write_config


def _train_steps(out) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    return [r["step"] for r in map(json.loads, path.read_text().splitlines()[:-1]) if r.get("kind") == "train"]


def _wait(pid: int, limit: float) -> int:
    """The child's exit code; SIGKILLed (and -9) when it outlives `limit` seconds (a hung stop, not a timing check)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_closed_terminal_stops_the_run_after_its_step_and_saves(corpus, tmp_path, capsys):
    cfg = write_config(tmp_path, corpus, max_steps=100000, save_steps=100000)
    out = tmp_path / "out"
    pid, master = pty.fork()
    if pid == 0:  # the child: a session of its own whose controlling terminal is the pty, as a login shell's job
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a terminal job's default (a runner under nohup ignores it)
        os.execv(sys.executable, [sys.executable, "-m", "pretrain_cli", "train", cfg])
    seen = b""
    try:
        while len(_train_steps(out)) < 3:  # training, its progress bar and log lines on the terminal
            if select.select([master], [], [], 0.5)[0]:
                try:
                    seen += os.read(master, 65536)
                except OSError:  # the child ended before training (its output says why)
                    break
            done, status = os.waitpid(pid, os.WNOHANG)
            assert not done, seen.decode(errors="replace")[-3000:]
    finally:
        os.close(master)  # the terminal goes: the kernel hangs the pty up and sends the run SIGHUP
    code = _wait(pid, 600)
    steps = _train_steps(out)
    assert code == 0, (code, steps)
    last = steps[-1]
    assert (out / f"checkpoint-{last}").is_dir(), sorted(p.name for p in out.iterdir())
    assert not (out / "run.lock").exists()
    capsys.readouterr()
    assert cli_main(["train", cfg, "--max_steps", str(last + 1)]) == 0
    logged = capsys.readouterr()
    assert f"resumed from {out / f'checkpoint-{last}'} at step {last}" in logged.out, logged.out
    assert "did not finish" not in logged.out + logged.err


def test_a_run_started_ignoring_sighup_keeps_ignoring_it():
    """`nohup` (SIGHUP ignored at the start): left ignored, not made a stop."""
    from pretrain_cli.training.stop_signals import StopSignals

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        stops = StopSignals()
        stops.listen()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGHUP)
        assert not stops.requested
        stops.restore()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


def test_sighup_with_its_default_action_is_a_stop_request_and_a_second_does_not_kill():
    """In a child process (SIGHUP's default action ends a process that does not handle it), its stdout a terminal:
    pointed at /dev/null by the hang-up, so no later write fails; its stderr, a pipe, left alone."""
    import subprocess
    import textwrap

    code = textwrap.dedent("""
        import os, signal, sys, threading
        from pretrain_cli.training.stop_signals import StopSignals
        master, terminal = os.openpty()
        os.dup2(terminal, 1)  # stdout a terminal; stderr the test's pipe
        stops = StopSignals()
        stops.listen()
        signal.pthread_kill(threading.get_ident(), signal.SIGHUP)  # handled before the next line
        assert stops.requested
        signal.pthread_kill(threading.get_ident(), signal.SIGHUP)  # during the stop: detaches only
        stops.hold()
        signal.pthread_kill(threading.get_ident(), signal.SIGHUP)
        stops.restore()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
        print(os.readlink("/proc/self/fd/1"), os.readlink("/proc/self/fd/2").split(":")[0], file=sys.stderr)
        print("stopped, alive", file=sys.stderr)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    assert (done.returncode, done.stderr.splitlines()[-2:]) == (0, ["/dev/null pipe", "stopped, alive"]), \
        done.stderr[-2000:]  # the terminal's fd detached, the pipe's left alone
    assert "received SIGHUP (the terminal hung up: its output goes to /dev/null): finishing the current step, " \
           "then saving" in done.stderr
