"""launch.sh's side of a job: the job's exit code from the ranks' own verdicts (`distributed.launcher.job`), the account
of a stop by signal or another node (`account`), and blocks of rendezvous ports two launches on one host never share
(`ports`)."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from pretrain_cli.distributed.launcher import account, job, ports

JOB = Path(__file__).resolve().parents[2] / "scripts" / "job.py"


def _verdicts(tmp_path, *records):
    tmp_path.mkdir(parents=True, exist_ok=True)
    for r in records:
        (tmp_path / f"rank-{r['rank']}.json").write_text(json.dumps(r))
    return tmp_path


def test_a_usage_error_anywhere_is_exit_2_and_stops(tmp_path):
    # rank 1's usage error came first; rank 0, stopped because of it, is what Paddle's launcher reports (247)
    d = _verdicts(tmp_path, {"rank": 1, "exit": 2, "kind": "usage", "time": 2.0},
                  {"rank": 0, "exit": 1, "kind": "peer", "time": 3.0})
    assert job.decide(d, 247) == (2, "stop")


def test_the_first_ranks_own_code_decides_and_is_retried(tmp_path):
    d = _verdicts(tmp_path, {"rank": 1, "exit": 137, "kind": "died", "time": 5.0},
                  {"rank": 0, "exit": 1, "kind": "system", "time": 6.0})
    assert job.decide(d, 247) == (137, "retry")
    assert job.decide(tmp_path / "none", 247) == (247, "retry")  # no record: the launcher's code
    assert job.decide(tmp_path / "none", 2) == (2, "stop")  # the launcher's own usage error
    assert job.decide(tmp_path / "none", 130) == (130, "stop")  # Ctrl-C


def test_ctrl_c_is_never_retried(tmp_path):
    d = _verdicts(tmp_path, {"rank": 0, "exit": 130, "kind": "interrupted", "time": 1.0},
                  {"rank": 1, "exit": 137, "kind": "died", "time": 0.5})
    assert job.decide(d, 1) == (130, "stop")


def test_ranks_that_stopped_on_a_signal_and_saved_end_the_job_with_0(tmp_path):
    """Paddle's launcher exits with the signal's number (2: a usage error's code, 15: a failure to retry); the
    ranks' own "stopped" records decide: a stop, exit 0. A rank that died beside them still fails the job."""
    d = _verdicts(tmp_path, {"rank": 0, "exit": 0, "kind": "stopped", "time": 1.0,
                             "line": "stopped at step 96 and saved; re-run the same command to resume from checkpoint-96"},
                  {"rank": 1, "exit": 0, "kind": "stopped", "time": 1.1, "line": "x"})
    assert job.decide(d, 2) == (0, "stop") and job.decide(d, 15) == (0, "stop")
    # no rank ended the job; the console says where it stopped (the line was only in workerlog.0)
    assert account.cause(d) == ("launch.sh: stopped at step 96 and saved; re-run the same command to resume "
                            "from checkpoint-96")
    (d / "rank-1.json").write_text(json.dumps({"rank": 1, "exit": 137, "kind": "died", "time": 1.2, "line": "x"}))
    assert job.decide(d, 15) == (137, "retry")
    assert job.decide(tmp_path / "none", 143) == (143, "stop")  # paddle_launch.py's SIGTERM: no rank recorded


def test_a_node_whose_ranks_were_stopped_by_another_nodes_failure_says_which_and_exits_1(tmp_path):
    """Each node has its own launch.sh: on the node whose ranks only stopped (their watchers' "peer" records) the job
    ended with the launcher's 247 and no line; a rank ended by gloo for a rank of another host ("lost") is named as
    such, not as the rank that ended the job."""
    line = ("[pretrain-cli] rank 0: rank 1 (pid 7 on vm) died: killed by SIGKILL; this rank stops too. See that "
            "rank's workerlog for its cause; re-run to resume from the newest complete checkpoint-N.")
    d = _verdicts(tmp_path / "peer", {"rank": 0, "exit": 1, "kind": "peer", "time": 1.0, "line": line})
    assert job.decide(d, 247) == (1, "retry")
    assert account.cause(d) == "launch.sh: " + line.removeprefix("[pretrain-cli] ")
    lost = ("[pretrain-cli] rank 0 (pid 8 on node1) was aborted by the collective library (killed by SIGABRT): it "
            "lost a rank on another host (rank 1 on node0), which died, failed or stopped answering; …")
    d = _verdicts(tmp_path / "lost", {"rank": 0, "exit": 1, "kind": "lost", "time": 1.0, "line": lost})
    assert job.decide(d, 250) == (1, "retry")
    assert account.cause(d) == "launch.sh: " + lost.removeprefix("[pretrain-cli] ")


def test_a_failed_rendezvous_is_its_own_action(tmp_path):
    d = _verdicts(tmp_path, {"rank": 1, "exit": 75, "kind": "transient", "time": 1.0})
    assert job.decide(d, 75) == (75, "rendezvous")


def test_a_rank_that_died_inside_the_join_is_a_failed_rendezvous(tmp_path):
    d = _verdicts(tmp_path, {"rank": 1, "exit": 75, "kind": "joining", "time": 1.0})
    assert job.decide(d, 134) == (75, "rendezvous")
    # ... but one killed there by its launcher's stop on SIGTERM / SIGINT (paddle_launch.py's 143 / 130) is that stop,
    # not retried: launch.sh exited 75 after a SIGTERM that landed while the ranks joined
    assert job.decide(d, 143) == (143, "stop") and job.decide(d, 130) == (130, "stop")
    # a rank still joining when another rank's usage error stopped the job: the usage error decides
    d = _verdicts(tmp_path, {"rank": 0, "exit": 2, "kind": "usage", "time": 2.0})
    assert job.decide(d, 2) == (2, "stop")


def test_record_writes_only_under_launch_sh_and_never_raises(tmp_path, monkeypatch):
    monkeypatch.delenv(job.VERDICTS_ENV, raising=False)
    job.record(0, 2, "usage", "x")  # no directory: nothing, no error
    monkeypatch.setenv(job.VERDICTS_ENV, str(tmp_path))
    job.record(3, 2, "usage", "bad key")
    assert json.loads((tmp_path / "rank-3.json").read_text())["line"] == "bad key"
    job.record(3, 137, "died", "killed", overwrite=False)  # the rank's own record stands
    assert json.loads((tmp_path / "rank-3.json").read_text())["exit"] == 2
    job.clear(3)
    assert not (tmp_path / "rank-3.json").exists()
    monkeypatch.setenv(job.VERDICTS_ENV, str(tmp_path / "missing" / "dir"))
    job.record(0, 2, "usage", "x")


def test_two_reservations_never_share_a_block_and_every_port_is_free(tmp_path, monkeypatch):
    monkeypatch.setattr(ports.tempfile, "gettempdir", lambda: str(tmp_path))
    a, b = ports.reserve(), ports.reserve()
    try:
        assert a.base != b.base and ports.LOW <= a.base < ports.HIGH and (a.base - ports.LOW) % ports.BLOCK == 0
        lo, hi = map(int, a.port_range.split(":"))
        assert (lo, hi) == (a.base + 1, a.base + ports.LAUNCHER_PORTS)
        with socket.socket() as s:
            s.bind(("", lo))  # free when reserved
        # the lock is held: another process cannot take the same block
        # (every unit of it: a launch locking blocks of another size sees it taken)
        for unit in (a.base, a.base + ports.BLOCK - ports.LOCK_UNIT):
            fd = os.open(tmp_path / "pretrain-cli-ports" / f"{unit}.lock", os.O_RDWR)
            probe = subprocess.run([sys.executable, "-c", "import fcntl, sys; fcntl.flock(int(sys.argv[1]), "
                                    "fcntl.LOCK_EX | fcntl.LOCK_NB)", str(fd)], pass_fds=(fd,), capture_output=True)
            os.close(fd)
            assert probe.returncode != 0, unit
    finally:
        a.release()
        b.release()
    c = ports.reserve()  # released blocks are taken again
    c.release()


def test_ports_runs_the_command_with_port_range_set_and_the_block_held(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    script = "import os; print(os.environ['PORT_RANGE'], os.environ['PRETRAIN_CLI_PORT_BLOCK'])"
    out = subprocess.run([sys.executable, str(JOB), "ports", "--", sys.executable, "-c",
                          script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    port_range, base = out.stdout.split()
    lo, hi = map(int, port_range.split(":"))
    assert hi - lo == ports.LAUNCHER_PORTS - 1 and ports.LOW < lo < ports.HIGH and lo == int(base) + 1


def test_a_block_with_a_unit_held_by_another_launch_is_passed_over(tmp_path, monkeypatch):
    monkeypatch.setattr(ports.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(ports.random, "randrange", lambda n: 0)  # the first block first
    other = ports._lock(ports.lock_dir() / f"{ports.LOW + ports.LOCK_UNIT}.lock")  # a 32-port launch inside block 0
    held = ports.reserve()
    try:
        assert other is not None and held.base != ports.LOW
    finally:
        held.release()
        os.close(other)


def test_group_store_ports_are_the_blocks_own_and_never_the_launchers(monkeypatch):
    monkeypatch.delenv(ports.BLOCK_ENV, raising=False)
    assert ports.group_store_port(1) is None  # a bare launcher: no block held
    base = ports.LOW + 5 * ports.BLOCK
    monkeypatch.setenv(ports.BLOCK_ENV, str(base))
    launcher = set(range(base + 1, base + ports.LAUNCHER_PORTS + 1))  # PORT_RANGE's ports
    stores = [ports.group_store_port(n) for n in range(1, ports.GROUP_STORES + 1)]
    assert stores[0] == base + ports.LAUNCHER_PORTS + 1 and stores[-1] == base + ports.BLOCK - 1
    assert len(set(stores)) == ports.GROUP_STORES and not launcher & set(stores) and base not in stores
    assert all(base <= p < base + ports.BLOCK for p in stores)
    assert ports.GROUP_STORES >= 20  # PP4 on 4 ranks makes 7 groups with more than one rank, 8-rank pipelines up to 20


def test_a_group_beyond_the_block_fails_with_one_line_naming_it(monkeypatch):
    from pretrain_cli.errors import UserError

    base = ports.LOW + 5 * ports.BLOCK
    monkeypatch.setenv(ports.BLOCK_ENV, str(base))
    for n in (0, ports.GROUP_STORES + 1):
        try:
            ports.group_store_port(n)
        except UserError as e:
            line = str(e)
        else:
            raise AssertionError(f"group {n} got a port")
        assert "\n" not in line and f"port block {base}-{base + ports.BLOCK - 1}" in line, line
        assert f"gloo process group {n} " in line and f"holds {ports.GROUP_STORES}" in line, line


def test_a_launch_that_cannot_start_says_one_line_and_exits_1(tmp_path):
    """`job.py ports -- CMD` whose CMD cannot be run (or with no free block on the host): one launch.sh line naming the
    command and what to free, exit 1, no traceback."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    out = subprocess.run([sys.executable, str(JOB), "ports", "--", str(tmp_path / "no-such-launcher")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("launch.sh: cannot start "), out.stderr
    assert "no-such-launcher" in out.stderr and "pretrain-cli-ports" in out.stderr, out.stderr
