"""Data parallel, ZeRO-1, two "nodes", cross-topology resume and failure handling, through the real launcher.

Every run is a `python -m paddle.distributed.launch --nproc_per_node N --log_dir <tmp> scripts/run_pretrain.py`
subprocess with a timeout; the reference is one process without the launcher at the same global batch.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from launch_helpers import (SCRIPT, STEPS, assert_close_losses, assert_close_tensors, child_env, launch,
                            launch_cmd, parse_losses, read_checkpoint, read_weights, single, write_config)
from launched_jobs import read_log, started


@pytest.fixture(scope="module")
def dp(corpus, tmp_path_factory):
    """Two processes, per-device batch 4 = global batch 8, with recompute; saves checkpoint-5."""
    root = tmp_path_factory.mktemp("dp")
    cfg = write_config(root / "dp.json", corpus, root / "out", save_steps=5, recompute=True)
    run = launch(cfg, root / "log")
    assert run.returncode == 0, run.explain()
    return run, root / "out"


def test_dp_with_recompute_matches_single_process(ref, dp):
    """Recompute + DataParallel (the reentrant variant fails there: 'parameter has been ready before') follows one
    process without recompute step by step. (Data parallelism without recompute: test_resilience.py's restarted
    jobs against an uninterrupted one, test_layouts.py's resume under dp2.)"""
    (r, rout), (d, dout) = ref, dp
    assert "recompute full" in d.log(0)
    assert_close_losses(d.losses(0), r.losses(0), range(1, STEPS + 1))
    assert_close_tensors(read_weights(dout), read_weights(rout))
    assert_close_tensors(read_checkpoint(dout / "checkpoint-5"), read_checkpoint(rout / "checkpoint-5"))
    # rank-0 effects only: rank 1 logs no INFO lines; one metrics.jsonl
    assert "global_step: 1," not in d.log(1)
    assert (dout / "metrics.jsonl").is_file()


def test_stage1_resumed_from_one_process_matches_dp(corpus, tmp_path, ref, dp):
    """fleet's ZeRO-1 over 2 ranks, 2 micro-batches a step, resumed from one process's checkpoint-5 (each rank reads
    its own half of the AdamW state): steps 6-10 on the one-process curve, and its checkpoint-10 (each rank wrote the half it holds) assembles
    to data parallelism's, weights and optimizer state alike. (ZeRO-1 from step 1: the layout matrix; plain data
    parallelism reading a checkpoint: test_layouts.py's dp2_tp2_stage3-to-dp2.)"""
    (r, rout), (_, dout) = ref, dp
    cfg = write_config(tmp_path / "s1.json", corpus, tmp_path / "out", sharding="stage1", save_steps=5,
                       per_device_train_batch_size=2, gradient_accumulation_steps=2,  # fleet's wrapper: no no_sync
                       resume_from_checkpoint=str(rout / "checkpoint-5"), overwrite_output_dir=False)
    run = launch(cfg, tmp_path / "log")
    assert run.returncode == 0, run.explain()
    assert "sharding stage1 x2" in run.log(0) and "resumed from" in run.log(0)
    assert_close_losses(run.losses(0), r.losses(0), range(6, STEPS + 1))
    assert_close_tensors(read_checkpoint(tmp_path / "out" / "checkpoint-10"), read_checkpoint(dout / "checkpoint-10"))
    assert_close_tensors(read_weights(tmp_path / "out"), read_weights(dout))


def test_resume_two_to_one(corpus, tmp_path, ref, dp):
    r, _ = ref
    _, dout = dp
    cfg = write_config(tmp_path / "c.json", corpus, tmp_path / "out", per_device_train_batch_size=8,
                       resume_from_checkpoint=str(dout / "checkpoint-5"), overwrite_output_dir=False)
    run = single(cfg, tmp_path / "log")
    assert run.returncode == 0, run.explain()
    assert "resumed from" in run.log(0)
    assert_close_losses(run.losses(0), r.losses(0), range(6, STEPS + 1))


def test_resume_two_to_one_keeps_the_global_batch(corpus, tmp_path, ref, dp):
    """The same file resumed on one process (2 x 4 sequences became 1 x 4): accumulation 2 keeps the global
    batch of 8, the log says so, and the curve is the one-process reference's."""
    r, _ = ref
    _, dout = dp
    cfg = write_config(tmp_path / "c.json", corpus, tmp_path / "out",
                       resume_from_checkpoint=str(dout / "checkpoint-5"), overwrite_output_dir=False)
    run = single(cfg, tmp_path / "log")
    assert run.returncode == 0, run.explain()
    assert "gradient_accumulation_steps 1 -> 2 keeps 8 sequences a step" in run.log(0)
    assert_close_losses(run.losses(0), r.losses(0), range(6, STEPS + 1))
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert state["consumed_samples"] == 8 * STEPS


@contextlib.contextmanager
def _job_at_step(cfg, log_dir, step: int):
    """A 2-rank launch, yielded once rank 0 has logged `step`; killed with its ranks if still alive afterwards."""
    with started(launch_cmd(cfg, log_dir), log_dir.parent, stderr=subprocess.STDOUT) as job:
        job.wait_for(log_dir / "workerlog.0", f"global_step: {step},", seconds=90, poll=0.2)
        yield job.proc


PP2 = {"pipeline_parallel_degree": 2, "gradient_accumulation_steps": 2}


# The watchers, not the engine, see a rank die: the same code under every layout. What differs is where the survivor
# waits when its peer dies: a collective (data parallelism here; ZeRO-2 and TP2 wait in the same gloo collectives) or
# a pipeline's send/recv between stages (PP2: test_the_killed_rank_is_the_one_every_rank_names, rank 0 killed).
@pytest.mark.parametrize("layout", [{}], ids=["dp"])
def test_killed_rank_is_named_and_job_ends(corpus, tmp_path, layout):
    cfg = write_config(tmp_path / "k.json", corpus, tmp_path / "out", max_steps=100000, logging_steps=20,
                       save_steps=100000, **layout)
    log_dir = tmp_path / "log"
    with _job_at_step(cfg, log_dir, 40) as proc:
        victim = _worker_pid(proc.pid, log_dir, rank=1)
        os.kill(victim, signal.SIGKILL)  # a real kill: no Python code of the victim runs
        killed = time.monotonic()
        out = _communicate(proc, 60)
        elapsed = time.monotonic() - killed
        assert proc.returncode != 0, out
        assert elapsed < 30, elapsed
        _assert_blamed(log_dir, victim, dead=1)  # before the clean-up, which kills the watchers too


@pytest.mark.parametrize("dead", [0])
def test_the_killed_rank_is_the_one_every_rank_names(corpus, tmp_path, dead):
    """kill -9 of rank 0 (stage 0) under PP2: both workerlogs name that rank (its host, pid and SIGKILL), neither
    names the other rank, no survivor's log holds gloo's abort traceback, and the job ends soon, though the survivor
    waits in a stage's send/recv rather than a collective. (Rank 1 killed under data parallelism, the same
    assertions: test_killed_rank_is_named_and_job_ends[dp].)"""
    cfg = write_config(tmp_path / "k.json", corpus, tmp_path / "out", max_steps=100000, logging_steps=20,
                       save_steps=100000, **PP2)
    log_dir = tmp_path / "log"
    with _job_at_step(cfg, log_dir, 40) as proc:
        victim = _worker_pid(proc.pid, log_dir, rank=dead)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        out = _communicate(proc, 60)
        elapsed = time.monotonic() - killed
        assert proc.returncode != 0, out
        assert elapsed < 30, elapsed
        _assert_blamed(log_dir, victim, dead)  # before the clean-up, which kills the watchers too


def _assert_blamed(log_dir, victim: int, dead: int) -> None:
    """Each rank's log ends with the one line naming `dead` (its own line on the dead rank's log), and no log
    blames the other rank or carries gloo's C++ abort."""
    host, other = socket.gethostname(), 1 - dead
    named = f"rank {dead} (pid {victim} on {host}) died: killed by SIGKILL"
    want = {dead: f"[pretrain-cli] {named}; the other ranks stop too", other: f"[pretrain-cli] rank {other}: {named}"}
    # the watchers run in their own sessions: a survivor's waits for the lines before its rank exits, but past Paddle's
    # launcher's 3 s stop (it then kills the rank) they may finish writing just after the launcher has exited
    deadline = time.monotonic() + 10
    while not all(want[r] in read_log(log_dir / f"workerlog.{r}") for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for r in (0, 1):
        log = read_log(log_dir / f"workerlog.{r}")
        assert want[r] in log, log[-3000:]
        assert f"rank {other} (pid" not in log, log[-3000:]
        assert "C++ Traceback" not in log and "FatalError" not in log and "terminate called" not in log, log[-3000:]


# The agreement (`comm.any`) is one code path; the unscheduled save is each engine's own: the semi-auto engine's
# pieces (stage3: each rank its shard) and the pipeline's stages (pp2). Data parallelism's and ZeRO-1's saves at a
# SIGTERM are their scheduled saves' code (test_dp_with_recompute_matches_single_process, test_stage1_...).
@pytest.mark.parametrize("layout", [{"sharding": "stage3"}, PP2], ids=["stage3", "pp2"])
def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(corpus, tmp_path, layout):
    """Only rank 1 gets SIGTERM (as when a scheduler signals one process); the ranks agree on the step
    (`comm.any` after every step), rank 0 saves that checkpoint (ZeRO-3: gathered from both ranks), and the
    job ends cleanly with exit 0."""
    cfg = write_config(tmp_path / "t.json", corpus, tmp_path / "out", max_steps=100000, logging_steps=1,
                       save_steps=100000, **layout)
    log_dir = tmp_path / "log"
    with _job_at_step(cfg, log_dir, 5) as proc:
        os.kill(_worker_pid(proc.pid, log_dir, rank=1), signal.SIGTERM)
        out = _communicate(proc, 90)
    log0, log1 = read_log(log_dir / "workerlog.0"), read_log(log_dir / "workerlog.1")
    assert proc.returncode == 0, out + log0 + log1
    assert "received SIGTERM" in log1 and "received SIGTERM" not in log0
    ckpts = sorted((tmp_path / "out").glob("checkpoint-*"))
    assert len(ckpts) == 1, ckpts
    step = json.loads((ckpts[0] / "trainer_state.json").read_text())["global_step"]
    assert 5 <= step < 100000
    assert f"stopped at step {step} and saved" in log0  # rank 0 stopped at the step it saved
    assert max(parse_losses(log0)) == step  # and trained no step beyond it
    assert "Traceback" not in log0 + log1


def test_unsupported_layout_is_refused_on_every_rank_before_any_work(corpus, tmp_path):
    cfg = write_config(tmp_path / "pp.json", corpus, tmp_path / "out", pipeline_parallel_degree=2, virtual_pp_degree=2)
    run = launch(cfg, tmp_path / "log", timeout=60)
    assert run.returncode != 0
    for n in range(2):
        assert "virtual_pp_degree: 2 needs more than 2 pipeline stages" in run.log(n), run.explain()
        assert "Traceback" not in run.log(n)
    assert not (tmp_path / "out").exists(), "refused before any work"


def test_a_loss_non_finite_on_every_rank_ends_each_with_its_line_and_leaves_no_lock(corpus, tmp_path):
    """nan_policy stop at step 1, decided on both ranks (rms_norm_eps < 0 in the model's config.json: the norms take
    the square root of a negative): each rank's log ends with the error, the job exits 2. The ranks leave together
    (training.rank_exit): a rank that left first had the other's watcher kill it, with a false 'rank N (...) died:
    exited with code 2' in its log and, when the one killed was rank 0, run.lock left in output_dir."""
    from pretrain_cli.config.presets import PRESET_DIR

    (tmp_path / "model").mkdir()
    config = json.loads((PRESET_DIR / "micro-qwen2" / "config.json").read_text())
    (tmp_path / "model" / "config.json").write_text(json.dumps(dict(config, rms_norm_eps=-1000.0)))
    cfg = write_config(tmp_path / "nan.json", corpus, tmp_path / "out", model_name_or_path=str(tmp_path / "model"))
    run = launch(cfg, tmp_path / "log", timeout=120)
    assert run.returncode == 2, run.explain()
    for n in range(2):
        log = run.log(n)
        assert "error: step 1: loss nan / gradient norm nan is not finite" in log, run.explain()
        assert "died" not in log and "Traceback" not in log, run.explain()
    assert not (tmp_path / "out" / "run.lock").exists(), run.explain()
    assert not list((tmp_path / "out").glob("checkpoint-*"))


def test_master_port_in_use(corpus, tmp_path):
    """Paddle's launcher takes a foreign listener on --master's port for its master and waits forever;
    scripts/launch.sh refuses that port up front on the master node."""
    cfg = write_config(tmp_path / "p.json", corpus, tmp_path / "out", max_steps=2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        env = dict(child_env(), MASTER=f"127.0.0.1:{port}", NNODES="2", NODE_RANK="0", LOG_DIR=str(tmp_path / "log"),
                   PYTHON=sys.executable)
        proc = subprocess.run(["bash", str(SCRIPT.parent / "launch.sh"), str(cfg)], env=env, capture_output=True,
                              text=True, timeout=30)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"port {port} is already in use" in proc.stderr


# ---------------------------------------------------------------------------------------- helpers
def _communicate(proc, timeout: float) -> str:
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        raise


def _worker_pid(launcher_pid: int, log_dir, rank: int) -> int:
    """The launcher's child process for `rank` (not that rank's watcher, which is a grandchild)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        except (OSError, ValueError, IndexError):
            continue
        if env.get(b"PADDLE_TRAINER_ID") == str(rank).encode():
            return int(d)
    raise AssertionError(f"no worker for rank {rank} under launcher {launcher_pid}")
