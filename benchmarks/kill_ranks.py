"""Fault drill, run by hand (not part of the suite): kill -9 (or kill -STOP) of a random rank of a multi-process run
under `scripts/launch.sh`, N times, and count the runs where every rank's workerlog and the console name that rank
and only it (docs/RELIABILITY.md, "Failure table"); `--signal SLOW` makes the rank a straggler instead (stopped
0.4 s of every 0.5 s until the run ends) and counts the runs where every log names it once as one.

    python benchmarks/kill_ranks.py --dir /tmp/drill --runs 20                    # PP4, kill -9 (the default)
    python benchmarks/kill_ranks.py --dir /tmp/drill --runs 3 --nproc 4 --layout dp --signal STOP
    python benchmarks/kill_ranks.py --dir /tmp/drill --runs 1 --nproc 2 --layout dp --signal SLOW

Each run trains `micro-qwen2` with 4 layers (PP4: one per stage; `dp`: data parallel), saving every 3 steps, and
the chosen rank gets the signal after a random number (2-8) of logged steps plus up to half a second, so a step or
a save is under way. Printed per run: the rank, RIGHT or WRONG (with every log's naming line and the console's);
at the end `named right R of N`.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "distributed"))

from launch_helpers import child_env, job_pids, rank_pid, write_config, write_corpus  # noqa: E402

LAYOUTS = {"pp": dict(num_hidden_layers=4, gradient_accumulation_steps=4, per_device_train_batch_size=2),
           "dp": dict(num_hidden_layers=4)}
SLOW = dict(max_steps=40, max_seq_length=128, per_device_train_batch_size=16)  # steps long enough to straggle in


def straggle(proc, pid: int) -> None:
    """Stop rank `pid` 0.9 s of every second until the job ends: a host whose CPU another job takes. (Each stop
    that lands in the rank's own work adds ~0.9 s to it: above the 0.5 s gap `progress.stragglers` asks for
    however short the micro model's forward passes are.)"""
    while proc.poll() is None:
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.9)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.1)
        except ProcessLookupError:
            return


def drill(root: Path, i: int, args, rng: random.Random) -> bool:
    d = root / f"run{i}"
    d.mkdir(parents=True, exist_ok=True)
    over = dict(LAYOUTS[args.layout], max_steps=400, save_steps=3)
    if args.layout == "pp":
        over["pipeline_parallel_degree"] = args.nproc
    if args.signal == "STOP":
        over["hang_timeout"] = args.hang_timeout
    if args.signal == "SLOW":
        over.update(SLOW)
    cfg = write_config(d / "cfg.json", root / "data", d / "out", **over)
    marker = uuid.uuid4().hex
    env = child_env()
    env.update(NPROC=str(args.nproc), PYTHON=sys.executable, LOG_DIR=str(d / "log"), PCLI_JOB=marker)
    proc = subprocess.Popen(["bash", str(REPO / "scripts" / "launch.sh"), str(cfg)], cwd=d, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics, after = d / "out" / "metrics.jsonl", rng.randint(2, 8)
    while not (metrics.exists() and metrics.read_text().count('"train"') >= after) and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(rng.random() * 0.5)
    victim = rng.randrange(args.nproc)
    pid = rank_pid(marker, victim)
    if args.signal == "SLOW":
        straggle(proc, pid)
    else:
        os.kill(pid, signal.SIGKILL if args.signal == "KILL" else signal.SIGSTOP)
    _, err = proc.communicate(timeout=600)
    what = {"KILL": "died: killed by SIGKILL", "STOP": "made no progress for", "SLOW": "is a straggler"}[args.signal]
    named = re.compile(rf"rank {victim} \(pid {pid} on \S+\) {what}")
    logs = [[line for line in (d / "log" / f"workerlog.{n}").read_text(errors="replace").splitlines()
             if line.startswith("[pretrain-cli]") and ("straggler" in line) == (args.signal == "SLOW")]
            for n in range(args.nproc)]
    console = [line for line in err.splitlines() if line.startswith("launch.sh: rank")]
    right = all(len(lines) == 1 and named.search(lines[0]) and lines[0].count(" (pid ") == 1 for lines in logs)
    if args.signal == "SLOW":
        right = right and proc.returncode == 0
    else:
        right = (right and len(console) == 1 and named.search(console[0]) is not None
                 and proc.returncode == (137 if args.signal == "KILL" else 124))
    time.sleep(1)
    remaining = sorted(job_pids(marker))  # ranks or watchers left behind
    right = right and not remaining
    print(f"run {i}: kill -{args.signal} of rank {victim} after step {after}: {'RIGHT' if right else 'WRONG'} "
          f"(exit {proc.returncode})", flush=True)
    if not right:
        for n, lines in enumerate(logs):
            print(f"    workerlog.{n}: {lines}")
        print(f"    console: {console or err[-500:]}; left: {remaining}")
        for pid in remaining:
            os.kill(pid, signal.SIGKILL)
    return right


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="pp")
    ap.add_argument("--signal", choices=("KILL", "STOP", "SLOW"), default="KILL")
    ap.add_argument("--hang_timeout", type=float, default=8.0, help="with --signal STOP")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    if not (args.dir / "data" / "walk.idx").exists():
        write_corpus(args.dir / "data" / "walk")
    rng = random.Random(args.seed)
    right = sum(drill(args.dir, i, args, rng) for i in range(args.runs))
    print(f"named right {right} of {args.runs}")
    return 0 if right == args.runs else 1


if __name__ == "__main__":
    raise SystemExit(main())
