"""What /proc says about a process: alive (a zombie or an exiting process is not), its start time, and how it
ended while its parent has not reaped it."""
import os
import signal
import time

from pretrain_cli import processes


def _zombie(how) -> int:
    pid = os.fork()
    if pid == 0:
        how()
        os._exit(3)
    while processes.alive(pid):
        time.sleep(0.01)
    while processes.exit_status(pid) is None:  # dead from its first exiting moment; a zombie a moment later
        time.sleep(0.01)
    return pid


def test_a_finished_child_is_dead_with_its_exit_code_until_reaped():
    pid = _zombie(lambda: None)
    try:
        assert not processes.alive(pid)
        assert processes.exit_status(pid) == 3 << 8
        assert processes.describe_status(processes.exit_status(pid)) == "exited with code 3"
        assert processes.exit_code(processes.exit_status(pid)) == 3
    finally:
        os.waitpid(pid, 0)
    assert processes.exit_status(pid) is None  # reaped: nothing to read


def test_a_killed_child_reports_its_signal():
    pid = _zombie(lambda: os.kill(os.getpid(), signal.SIGKILL))
    try:
        status = processes.exit_status(pid)
        assert processes.describe_status(status) == "killed by SIGKILL" and processes.exit_code(status) == 137
    finally:
        os.waitpid(pid, 0)
    assert processes.describe_status(None) == "exit status unknown"


def test_this_process_is_alive_and_a_reused_pid_is_not_the_same_process():
    me = os.getpid()
    assert processes.alive(me) and processes.alive(me, processes.start_ticks(me))
    assert not processes.alive(me, "1")  # another start time: the pid was reused
    assert not processes.alive(0) and not processes.alive(-5) and not processes.alive(10**30)
    assert processes.exit_status(me) is None  # running
