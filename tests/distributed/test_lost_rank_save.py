"""A rank on another host that dies while it writes its part of a checkpoint: rank 0 ends at once, naming it.

Rank 0 waits for the other ranks' completion records by polling the checkpoint's directory, in no collective, so gloo
never tells it that a rank elsewhere died, and its own host's watchers see only its own ranks: it waited until
`hang_timeout`, then was named hung itself. The dead rank's watcher now writes a death notice in place of the record
its rank owed (`distributed.launcher.watchdog.owing`), which rank 0 reads (`training.shard_writer.collect`).

Two nodes on this machine, each its own scripts/launch.sh with one process, two hosts to the watchers
(`PCLI_HOSTNAME`, tests/robustness/fault_inject), rank 1 SIGKILLed half-way through a safetensors file of its first
save (`PCLI_FAULT`, only in rank 1: the nodes deal out their ranks in arrival order). `hang_timeout` is an hour: on the
old code the job outlives this test's wait.
"""
import contextlib
import os
import re
import signal

from launch_helpers import REPO, child_env, write_config
from launched_jobs import launch_sh

from pretrain_cli.distributed.launcher.ports import reserve

FAULTS = REPO / "tests" / "robustness" / "fault_inject"


def test_a_rank_elsewhere_dying_mid_save_ends_rank_0_at_once_naming_it(corpus, tmp_path):
    cfg = write_config(tmp_path / "cfg.json", corpus, tmp_path / "out", max_steps=4, save_steps=2, hang_timeout=3600)
    held = reserve()
    try:
        with contextlib.ExitStack() as stack:
            jobs = []
            for node in (0, 1):  # one job: the nodes share its marker
                jobs.append(stack.enter_context(launch_sh(
                    cfg, tmp_path, marker=jobs[0].marker if jobs else None, pass_fds=held.fds, NPROC="1",
                    MASTER=f"127.0.0.1:{held.base}", NNODES="2", NODE_RANK=str(node), PCLI_HOSTNAME=f"host{node}",
                    PCLI_FAULT="save_weights:1,save_optimizer:1", PCLI_FAULT_RANK="1",
                    PYTHONPATH=f"{FAULTS}{os.pathsep}{child_env()['PYTHONPATH']}")))
            procs = [job.proc for job in jobs]
            ends = [p.communicate(timeout=300) for p in procs]
    finally:
        held.release()
    errs = [err for _, err in ends]
    first = [n for n in (0, 1) if "launch.sh: rank 0:" in errs[n]]
    assert len(first) == 1, errs  # the node of rank 0
    node0, node1 = first[0], 1 - first[0]
    line = [x for x in errs[node0].splitlines() if x.startswith("launch.sh:")][-1]
    assert re.fullmatch(rf"launch\.sh: rank 0: rank 1 \(pid \d+ on host{node1}\) died: killed by SIGKILL, while "
                        r"writing its part of checkpoint-2; this rank stops too\. .*", line), errs[node0]
    assert procs[node0].returncode == 1, errs[node0]  # a rank lost elsewhere: retried under MAX_RESTART
    assert procs[node1].returncode == 128 + signal.SIGKILL, errs[node1]  # rank 1's own death, named on its node
    assert re.search(rf"launch\.sh: rank 1 ended the job: rank 1 \(pid \d+ on host{node1}\) died: killed by SIGKILL",
                     errs[node1]), errs[node1]
    out = tmp_path / "out"
    assert not (out / "checkpoint-2").exists() and not (out / "checkpoint-2.tmp").exists()  # rank 0 dropped it
