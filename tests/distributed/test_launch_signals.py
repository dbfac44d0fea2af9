"""scripts/launch.sh stopped by SIGTERM as a scheduler sends it: to the job's whole process group (Slurm's preemption,
`kill -TERM -PGID`) or to launch.sh alone (a container's PID 1, `kill PID`). Either way every rank finishes its step
and saves, and launch.sh ends only after the ranks (a scheduler takes the main process's end for the job's and kills
the rest), exit 0, not restarted under MAX_RESTART. Before, launch.sh died at once of the signal (-15): in the group
the ranks were still saving; signalled alone, the launcher never heard of it and the job trained on, orphaned.
(Ctrl-C, SIGINT to the group: tests/distributed/test_resilience.py.)"""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launch_helpers import write_config
from launched_jobs import default_hangup, launch_sh, read_log


@pytest.mark.parametrize("to, nproc", [("process group", 2), ("launch.sh alone", 1)])
def test_sigterm_to_launch_sh_saves_and_launch_sh_ends_after_its_ranks(corpus, tmp_path, to, nproc):
    cfg = write_config(tmp_path / "cfg.json", corpus, tmp_path / "out", max_steps=100000, save_steps=100000)
    with launch_sh(cfg, tmp_path, NPROC=str(nproc), MAX_RESTART="1", LOG_DIR=str(tmp_path / "log")) as job:
        proc = job.proc
        job.wait_for(tmp_path / "log" / "workerlog.0", "global_step: 3,")
        if to == "process group":
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        left = job.pids()  # the moment launch.sh has ended: nothing of its job may still run
        _, err = proc.communicate(timeout=60)
    log0, log1 = read_log(tmp_path / "log" / "workerlog.0"), read_log(tmp_path / "log" / "workerlog.1")
    assert not left, (left, err[-2000:])
    assert proc.returncode == 0, err[-3000:] + log0[-3000:]
    assert "restart" not in err and "ended the job" not in err, err[-3000:]
    step = json.loads((sorted((tmp_path / "out").glob("checkpoint-*"))[-1] / "trainer_state.json").read_text())
    assert "received SIGTERM" in log0 and f"stopped at step {step['global_step']} and saved" in log0, log0[-3000:]
    assert f"launch.sh: stopped at step {step['global_step']} and saved" in err
    assert not (tmp_path / "out" / "run.lock").exists()
    assert "Traceback" not in log0 + log1 + err and "died" not in log0 + log1, (log0 + log1)[-3000:]


def test_a_hang_up_of_launch_shs_process_group_is_one_stop_that_saves(corpus, tmp_path):
    """SIGHUP to launch.sh's process group, twice (a closed terminal: bash's copy to its jobs, then the kernel's to
    the foreground group once bash is gone): one SIGTERM stop, saved, exit 0. Before, launch.sh and the launcher
    died of it at once (-1), the rank with them at step 5, unsaved, its run.lock left behind."""
    cfg = write_config(tmp_path / "cfg.json", corpus, tmp_path / "out", max_steps=100000, save_steps=100000)
    with launch_sh(cfg, tmp_path, NPROC="1", MAX_RESTART="1", LOG_DIR=str(tmp_path / "log"),
                   preexec_fn=default_hangup) as job:  # (a runner under nohup passes SIGHUP on ignored)
        proc = job.proc
        job.wait_for(tmp_path / "log" / "workerlog.0", "global_step: 3,")
        os.killpg(proc.pid, signal.SIGHUP)
        job.wait_for(tmp_path / "log" / "workerlog.0", "received SIGTERM")
        os.killpg(proc.pid, signal.SIGHUP)  # no second signal: Paddle would kill the ranks 10 s after one
        proc.wait(timeout=120)
        left = job.pids()
        _, err = proc.communicate(timeout=60)
    log0 = read_log(tmp_path / "log" / "workerlog.0")
    assert proc.returncode == 0 and not left, (proc.returncode, left, err[-3000:] + log0[-3000:])
    step = json.loads((sorted((tmp_path / "out").glob("checkpoint-*"))[-1] / "trainer_state.json").read_text())
    assert f"launch.sh: stopped at step {step['global_step']} and saved" in err, err[-3000:]
    assert log0.count("received SIGTERM") == 1 and "Traceback" not in log0 + err, log0[-3000:]
    assert not (tmp_path / "out" / "run.lock").exists()


def test_sigterm_while_a_node_waits_at_master_for_the_others_ends_it_at_once(corpus, tmp_path):
    """One node of two started (MASTER on loopback): it waits at MASTER (said after 10 s); SIGTERM to its group: exit
    143 at once, no traceback, nothing left running. Before, launch.sh died of it at once with the launcher still
    there; and the launcher's own exit, raised inside a request of its KV client, is swallowed by that client's bare
    `except:` (by hand, 1 signal in 5: `AssertionError: No container in the pod`, exit 1, a failure MAX_RESTART
    retries; once the wait went on to RENDEZVOUS_TIMEOUT), which `scripts/paddle_launch.py` now rules out by ending the
    process where Paddle's handler exits. Where the signal lands is not chosen here: that part is not pinned."""
    from launch_helpers import free_port

    cfg = write_config(tmp_path / "cfg.json", corpus, tmp_path / "out", max_steps=3)
    err_file = tmp_path / "stderr"
    with open(err_file, "w") as err_out, launch_sh(
            cfg, tmp_path, stdout=subprocess.DEVNULL, stderr=err_out, NPROC="1", MASTER=f"127.0.0.1:{free_port()}",
            NNODES="2", NODE_RANK="0", RENDEZVOUS_TIMEOUT="600") as job:
        proc = job.proc
        job.wait_for(err_file, "waits for the other nodes at MASTER")
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        left = job.pids()
    err = read_log(err_file)
    assert proc.returncode == 143 and not left, (left, err[-2000:])
    assert "Traceback" not in err and "nodes joined" not in err, err[-2000:]


def test_launch_sh_killed_with_its_process_group_leaves_no_rank_behind(corpus, tmp_path):
    """SIGKILL to launch.sh's process group (`kill -9 -PGID`, a test's clean-up, a scheduler's kill after its grace
    period) mid-training: the ranks, told by the kernel's SIGTERM at their launcher's death, stop, save and end
    (`distributed.launcher.launch.end_with_launcher`). Paddle's launcher starts each rank in a session of its own, so
    the group's SIGKILL missed them: the ranks and their watchers went on with PPID 1 (two of a test's were found 30
    minutes later), training on or waiting for a peer until hang_timeout. launch.sh's verdict directory, which
    its EXIT trap cannot remove then, is named by it, and the next launch removes it (`tempdirs.sweep`: before, one
    `pretrain-cli-verdicts.*` stayed in TMPDIR per run of this test)."""
    import socket
    import tempfile
    from pathlib import Path

    from pretrain_cli.distributed.launcher import tempdirs

    cfg = write_config(tmp_path / "cfg.json", corpus, tmp_path / "out", max_steps=100000, save_steps=100000)
    with launch_sh(cfg, tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, NPROC="2",
                   LOG_DIR=str(tmp_path / "log"), STOP_TIMEOUT="900") as job:  # (the default, whatever CI's is)
        proc = job.proc
        job.wait_for(tmp_path / "log" / "workerlog.0", "global_step: 3,")
        assert sum(r is not None for r, _, _ in job.pids().values()) == 4  # 2 ranks and their 2 watchers
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        verdicts = list(Path(tempfile.gettempdir()).glob(f"pretrain-cli-verdicts-{socket.gethostname()}-{proc.pid}-*"))
        deadline = time.monotonic() + 60  # (they stop and save within seconds: a bound, not a measurement)
        while job.pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = job.pids()
    assert not left, left
    log0 = read_log(tmp_path / "log" / "workerlog.0")
    saved = sorted((tmp_path / "out").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert saved, log0[-3000:]  # (before: the kernel SIGKILLed the ranks at their launcher's death, unsaved)
    step = json.loads((saved[-1] / "trainer_state.json").read_text())["global_step"]
    assert step >= 3 and f"stopped at step {step} and saved" in log0, log0[-3000:]
    assert "received SIGTERM (its launcher died: this rank ends itself 900 s after that" in log0, log0[-3000:]
    assert not (tmp_path / "out" / "run.lock").exists()
    assert len(verdicts) == 1  # left by the SIGKILL ...
    tempdirs.sweep()  # ... until the next launch's first step
    assert not verdicts[0].exists()


def test_sigterm_while_the_ranks_join_is_a_stop_143_not_a_failed_join(corpus, tmp_path):
    """SIGTERM to launch.sh's group while rank 0 waits inside the join of the process group (rank 1 held before it:
    `PCLI_FAULT=join_stall`): Paddle's launcher stops the ranks, and rank 0's `joining` record read as a rank that died
    in the join, a failed rendezvous: launch.sh exited 75 (EX_TEMPFAIL, a retry), 1 of 8 signals at random moments of
    a start-up. A stop by signal before any rank trained is 143 (130 for Ctrl-C), as at MASTER."""
    import glob

    from launch_helpers import REPO, child_env

    cfg = write_config(tmp_path / "cfg.json", corpus, tmp_path / "out", max_steps=3)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    faults = REPO / "tests" / "robustness" / "fault_inject"
    with launch_sh(cfg, tmp_path, NPROC="2", LOG_DIR=str(tmp_path / "log"), TMPDIR=str(tmp), PCLI_FAULT="join_stall:1",
                   PCLI_FAULT_RANK="1", PYTHONPATH=f"{faults}{os.pathsep}{child_env()['PYTHONPATH']}") as job:
        proc = job.proc

        def joining() -> bool:  # rank 0's record: inside the join (launch.sh's verdict directory, in its TMPDIR)
            return any('"joining"' in read_log(Path(p)) for p in glob.glob(str(tmp / "pretrain-cli-verdicts-*" /
                                                                                 Path("rank-0.json"))))

        from launched_jobs import wait_until

        wait_until([job], joining, 120, lambda: read_log(tmp_path / "log" / "workerlog.0")[-3000:])
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        left = job.pids()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and not left, (proc.returncode, left, err[-3000:])
    assert "trying again with new ports" not in err and "Traceback" not in err, err[-3000:]
