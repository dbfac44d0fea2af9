"""Paddle's launcher run directly (`python -m paddle.distributed.launch`, 2 ranks) dies mid-training: of a hang-up (a
closed terminal, a dropped ssh session: it does not handle SIGHUP) or of SIGKILL. Its ranks, in sessions of their own,
get the kernel's SIGTERM at its death (`distributed.launcher.launch.end_with_launcher`): they finish the step, agree
the stop, save, release the run lock and exit. Before, the kernel SIGKILLed them: the work since the last checkpoint
was lost and run.lock left behind. On two nodes the other node's rank agrees the stop and saves with it, names the
node whose launcher died and ends 1, its launcher too (`training.node_loss`). (The deadline for a rank that cannot
stop: tests/unit/test_launcher_deadline.py.)"""
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from launch_helpers import REPO, SCRIPT, child_env, launch_cmd, read_checkpoint, write_config
from launched_jobs import default_hangup, read_log, started, wait_until


@pytest.mark.parametrize("kill", [signal.SIGHUP, signal.SIGKILL], ids=["hang-up", "SIGKILL"])
def test_ranks_whose_launcher_dies_stop_save_and_end(corpus, tmp_path, kill):
    cfg = write_config(tmp_path / "cfg.json", corpus, tmp_path / "out", max_steps=100000, save_steps=100000)
    log = tmp_path / "log"
    logs = lambda: read_log(log / "workerlog.0")[-3000:] + read_log(log / "workerlog.1")[-3000:]  # noqa: E731
    with started(launch_cmd(cfg, log, 2), tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                 preexec_fn=default_hangup) as job:  # (a runner under nohup passes SIGHUP on ignored)
        job.wait_for(log / "workerlog.0", "global_step: 3,")
        assert sum(r is not None for r, _, _ in job.pids().values()) == 4  # 2 ranks and their 2 watchers
        os.killpg(job.proc.pid, kill)  # the launcher's group: the ranks, in sessions of their own, are not in it
        job.proc.wait(timeout=60)
        assert job.proc.returncode == -kill
        # (a stop takes seconds here; the ranks' own deadline is Paddle's 30 s: a bound, not a measurement)
        wait_until([], lambda: not job.pids(), 120, lambda: f"{job.pids()}\n{logs()}", poll=0.5)
    log0, log1 = read_log(log / "workerlog.0"), read_log(log / "workerlog.1")
    ckpt = sorted((tmp_path / "out").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    step = json.loads((ckpt / "trainer_state.json").read_text())["global_step"]
    assert step >= 3 and f"stopped at step {step} and saved" in log0, logs()
    for text in (log0, log1):
        assert "received SIGTERM (its launcher died: this rank ends itself 30 s after that" in text, logs()
    assert not (tmp_path / "out" / "run.lock").exists()
    assert "Traceback" not in log0 + log1 and ") died: " not in log0 + log1, logs()  # no watcher saw a death
    weights, optimizer = read_checkpoint(ckpt, "weights"), read_checkpoint(ckpt)
    assert weights and optimizer and all(v.size for v in weights.values())


def test_the_other_nodes_rank_agrees_the_stop_when_one_nodes_launcher_dies(corpus, tmp_path):
    """Two nodes on loopback (`PCLI_HOSTNAME`: two hosts to the watchers), one rank each; node 0's launcher
    SIGKILLed. Node 1's rank stops and saves with node 0's, then names node 0 as lost and ends 1: it ended 0, and
    Paddle's launcher with it, so a scheduler recorded success with a node gone (launch.sh's own watch, `after_join`,
    does not run under Paddle's launcher run directly; the ranks know it themselves: `training.node_loss`)."""
    from pretrain_cli.distributed.launcher.ports import reserve

    cfg = write_config(tmp_path / "cfg.json", corpus, tmp_path / "out", max_steps=100000, save_steps=100000)
    faults = REPO / "tests" / "robustness" / "fault_inject"
    logs = [tmp_path / f"log{node}" / "workerlog.0" for node in (0, 1)]
    held = reserve()
    try:
        with contextlib.ExitStack() as stack:
            jobs = []
            for node in (0, 1):  # one job: the nodes share its marker
                cmd = [sys.executable, "-m", "paddle.distributed.launch", "--master", f"127.0.0.1:{held.base}",
                       "--nnodes", "2", "--nproc_per_node", "1", "--log_dir", str(logs[node].parent), str(SCRIPT),
                       str(cfg)]
                jobs.append(stack.enter_context(started(
                    cmd, tmp_path, marker=jobs[0].marker if jobs else None, pass_fds=held.fds,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, PCLI_HOSTNAME=f"host{node}",
                    PYTHONPATH=f"{faults}{os.pathsep}{child_env()['PYTHONPATH']}")))
            said = lambda: "\n".join(read_log(log)[-3000:] for log in logs)  # noqa: E731
            wait_until(jobs, lambda: any("global_step: 3," in read_log(log) for log in logs), 300, said)  # rank 0's
            os.killpg(jobs[0].proc.pid, signal.SIGKILL)
            assert jobs[1].proc.wait(timeout=120) == 1, said()  # its rank stopped and saved, for a node lost
            wait_until([], lambda: not jobs[0].pids(), 120, lambda: f"{jobs[0].pids()}\n{said()}", poll=0.5)
    finally:
        held.release()
    ckpt = sorted((tmp_path / "out").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    step = json.loads((ckpt / "trainer_state.json").read_text())["global_step"]
    assert all(f"stopped at step {step} and saved" in read_log(log) for log in logs), said()
    assert "received SIGTERM (its launcher died" in read_log(logs[0]), said()
    ranks = [int(re.search(r"rank (\d) of 2 started", read_log(log)).group(1)) for log in logs]  # (the meeting's order)
    lost = (f"error: rank {ranks[1]}: lost the node of rank {ranks[0]} (host {socket.gethostname()}, 127.0.0.1) while "
            f"the ranks ran: its launcher died (killed, or its terminal or session closed), and its ranks stopped at "
            f"their launcher's death; this node's rank {ranks[1]} stopped too: stopped at step {step} and saved")
    assert lost in read_log(logs[1]) and "lost the node" not in read_log(logs[0]), said()
    assert "Traceback" not in read_log(logs[1]), said()
    assert not (tmp_path / "out" / "run.lock").exists() and read_checkpoint(ckpt, "weights")
