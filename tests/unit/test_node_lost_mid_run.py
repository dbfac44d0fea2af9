"""Two nodes on this machine (scripts/paddle_launch.py twice on loopback, one process each, as tests/unit/
test_joining.py runs them): both ranks join the process group, then node 1's launcher is killed with its process
group (kill -9) and node 0's rank stops and saves, as the ranks' agreement has it, ending 0. Node 0's launcher ended
0 and launch.sh said only the stop (a scheduler recorded success); now it names node 1 as lost (its beat at MASTER
stopped and it never said how it ended) and ends 1, and launch.sh's decision is 1 (`after_join`)."""
import contextlib
import os
import signal
import socket
import time
import uuid

from test_joining import JOINS, _node, _two_nodes

from pretrain_cli import processes
from pretrain_cli.distributed.launcher import account, job
from pretrain_cli.distributed.launcher.ports import reserve

STOPPED = "stopped at step 32 and saved; re-run the same command to resume from checkpoint-32"
STOPS = JOINS + f"""
import time
from pretrain_cli.distributed.launcher import job
while not os.path.exists(sys.argv[3]):  # until node 1 is gone
    time.sleep(0.1)
job.record(rank, 0, "stopped", {STOPPED!r})  # its stop by the ranks' agreement, saved
sys.stdout.flush()
os._exit(0)
"""
SLEEPS = JOINS + "import time\nopen(sys.argv[3], 'w').write(str(os.getpid()))\ntime.sleep(300)\n"


def test_a_node_killed_after_the_join_is_named_and_the_other_does_not_end_0(tmp_path):
    held, job_id = reserve(), uuid.uuid4().hex
    master, verdicts = f"127.0.0.1:{held.base}", tmp_path / "verdicts"
    verdicts.mkdir()

    def kill(procs):
        deadline = time.monotonic() + 120
        while not ((tmp_path / "in0").exists() and (tmp_path / "pid").exists()):
            assert procs[1].poll() is None and time.monotonic() < deadline, procs[1].stderr.read()
            time.sleep(0.1)
        time.sleep(2.0)  # a few beats after the join
        rank = int((tmp_path / "pid").read_text())
        # node 1's rank and launcher alive when killed: a rank dead before (its script failing after the join) has
        # its launcher say `ended`, and node 0 rightly ends 0: that is no test of a lost node
        logs = [p.read_text() for p in (tmp_path / "log-dies").glob("*")]
        assert processes.alive(rank) and procs[1].poll() is None, logs
        os.killpg(procs[1].pid, signal.SIGKILL)  # node 1's launcher, nothing said
        with contextlib.suppress(ProcessLookupError):  # and its rank (its own session), if its launcher's death has not
            os.kill(rank, signal.SIGKILL)
        (tmp_path / "gone").write_text("")

    ends = _two_nodes(tmp_path, _node(tmp_path, "stops", master, job_id, STOPS, tmp_path / "going", tmp_path / "in0",
                                      tmp_path / "gone", short=True),  # (node 1's silence: 3 s, not 30)
                      _node(tmp_path, "dies", master, job_id, SLEEPS, tmp_path / "going1", tmp_path / "in1",
                            tmp_path / "pid"),
                      held, kill, envs=({job.VERDICTS_ENV: str(verdicts)}, {}), killed=(1,))
    code, err = ends[0]
    assert code == 1 and "Traceback" not in err, err
    line = (f"node 0: lost node 1 (host {socket.gethostname()}, 127.0.0.1; rank 1) while the ranks ran: it stopped "
            f"beating at MASTER and it never said how it ended (its launcher killed, or its host down or unreachable); "
            f"this node's rank 0 stopped too: {STOPPED}. Exit 1: start that node again and re-run on every node "
            f"(MAX_RESTART restarts this one)")
    assert job.decide(verdicts, code) == (1, "retry")  # launch.sh: not the stop's 0
    assert account.cause(verdicts) == f"launch.sh: {line}"
    assert "launch.sh:" not in err  # (said once, by launch.sh's account: _line finds none here)
