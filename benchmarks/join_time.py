"""How long a multi-process launch takes to make its process groups, layout by layout, with this tree's code and with
another tree's (docs/DISTRIBUTED.md, "How long joining the process groups takes").

Why: the seconds before a CPU launch's first step were mostly fixed waits of Paddle 3.3.1's TCP store client (a
connect refused sleeps 3 s; every request waits ~40 ms for a delayed acknowledgement), paid once per launch and
again for every gloo group (`distributed.comms.store`). For each layout this launches the same 2-step run of a micro
preset through the real launcher (fresh CPU processes, under `scripts/job.py ports` as scripts/launch.sh runs it, so
the gloo groups' stores take the job's ports), once with this tree's src/ and once with `--old-rev`'s (extracted with
`git archive`; or `--old-src`, any tree's src/). Every rank runs this file as its script (`--rank`), which times,
around the product's own code of either tree: the join (`training.run.init_process_group`), every process group
made (Paddle's `collective._new_process_group_impl`, and on gloo the group's own store, `gloo._group_store`) and the
moment its layout is in place (`training.startup.measure`, before the first step), then runs the training script.

Reported per layout, over its ranks (the ranks' interpreters start at different times, so both are counted from the
moment the last rank reached the join):
- join: until every rank has left the join (`init_process_group`: the global group, fleet's groups);
- to layout: until every rank's layout is in place (the groups the layout steps make after the join, and building
  and placing the micro model: ~0.2-0.5 s of it);
- groups: the process groups of more than one rank that rank 0 joined besides the global one (made inside
  `init_parallel_env`, counted in the join), and its seconds making them.

    python benchmarks/join_time.py [--layouts dp2,pp2,...] [--old-rev REV | --old-src DIR/src] [--reps 1] [--json]

Not a test: the seconds depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MOE = {"model_name_or_path": "micro-qwen2-moe"}
LAYOUTS = {  # name: (processes, keys over BASE)
    "dp2": (2, {}),
    "stage3": (2, {"sharding": "stage3"}),
    "tp2": (2, {"tensor_parallel_degree": 2}),
    "pp2": (2, {"pipeline_parallel_degree": 2, "gradient_accumulation_steps": 2}),
    "cp2": (2, {"context_parallel_degree": 2}),
    "ep2": (2, dict(MOE, expert_parallel_degree=2)),
    "dp2_tp2_stage3": (4, {"tensor_parallel_degree": 2, "sharding": "stage3"}),
    "tp2_pp2": (4, {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 2, "gradient_accumulation_steps": 2}),
    "pp4": (4, {"pipeline_parallel_degree": 4, "num_hidden_layers": 4, "gradient_accumulation_steps": 4}),
    "cp2_dp2": (4, {"context_parallel_degree": 2}),
    "ep2_pp2": (4, dict(MOE, expert_parallel_degree=2, pipeline_parallel_degree=2, gradient_accumulation_steps=2)),
}
BASE = {"model_name_or_path": "micro-qwen2", "device": "cpu", "split": "100,0,0", "max_seq_length": 32,
        "per_device_train_batch_size": 2, "max_steps": 2, "save_steps": 1000, "logging_steps": 1, "do_train": True,
        "report_to": ["none"], "disable_tqdm": True, "overwrite_output_dir": True, "learning_rate": 1e-4,
        "warmup_steps": 0}
BEFORE_REV = "e480c8a7"  # the last commit whose store clients waited (3 s after a refused connect, ~40 ms a request)


# ---------------------------------------------------------------------- in each rank (--rank)
def _timed(owner, name: str, what: str, out) -> None:
    plain = getattr(owner, name)

    @functools.wraps(plain)
    def timed(*args, **kwargs):
        start = time.time()
        try:
            return plain(*args, **kwargs)
        finally:
            out.write(json.dumps({"what": what, "start": start, "end": time.time()}) + "\n")

    setattr(owner, name, timed)


def rank_main(argv: list[str]) -> None:
    """This rank's events to $JOIN_PROBE_DIR/rank<N>.jsonl, then the training script with `argv`."""
    import runpy

    from paddle.distributed import collective

    from pretrain_cli.distributed.comms import gloo
    from pretrain_cli.training import run, startup

    rank = os.environ.get("PADDLE_TRAINER_ID", "0")
    out = open(Path(os.environ["JOIN_PROBE_DIR"]) / f"rank{rank}.jsonl", "a", buffering=1)
    _timed(run, "init_process_group", "join", out)
    _timed(startup, "measure", "layout", out)
    _timed(collective, "_new_process_group_impl", "group", out)
    _timed(gloo, "_group_store", "store", out)
    script = os.environ["JOIN_PROBE_SCRIPT"]
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


# ---------------------------------------------------------------------- the launches
def launched(src: Path, cfg: dict, root: Path, nproc: int, tries: int = 3) -> dict:
    """`launch`, again when it failed (Paddle 3.3.1's gloo joins fail now and then, the older code's more often), up
    to `tries` in all; how many failed is counted in "failed"."""
    for n in range(tries):
        got = launch(src, cfg, root / f"try{n}", nproc)
        if got is not None:
            return dict(got, failed=n)
    raise SystemExit(f"{root.name}: {tries} launches failed")


def launch(src: Path, cfg: dict, root: Path, nproc: int) -> dict | None:
    """One launch of `src`'s training script under the probe: {"join", "to_layout", "groups", "group_s"}; None when
    it failed (its log tail printed)."""
    root.mkdir(parents=True)
    (root / "cfg.json").write_text(json.dumps(dict(cfg, output_dir=str(root / "out"))))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(src), JOIN_PROBE_DIR=str(root),
               JOIN_PROBE_SCRIPT=str(src.parent / "scripts" / "run_pretrain.py"))
    env.pop("PADDLE_TRAINER_ID", None)
    cmd = [sys.executable, str(src.parent / "scripts" / "job.py"), "ports", "--", sys.executable, "-m",
           "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir", str(root / "log"), __file__,
           "--rank", str(root / "cfg.json")]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(root), timeout=900)
    events = {r: [json.loads(line) for line in (root / f"rank{r}.jsonl").read_text().splitlines()]
              for r in range(nproc) if (root / f"rank{r}.jsonl").is_file()}
    if p.returncode != 0 or len(events) != nproc:
        log = root / "log" / "workerlog.0"
        tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
        print(f"{root.name}: exit {p.returncode}, {len(events)} of {nproc} ranks probed\n{p.stderr[-2000:]}\n{tail}",
              file=sys.stderr)
        return None

    def first(r: int, what: str) -> dict:
        return next(e for e in events[r] if e["what"] == what)

    arrived = max(first(r, "join")["start"] for r in events)
    mine = [e for e in events[0] if e["what"] in ("group", "store")]
    return {"join": max(first(r, "join")["end"] for r in events) - arrived,
            "to_layout": max(first(r, "layout")["start"] for r in events) - arrived,
            "groups": sum(e["what"] == "group" for e in mine), "group_s": sum(e["end"] - e["start"] for e in mine)}


def old_src(rev: str, dest: Path) -> Path:
    """`src/` and `scripts/` of commit `rev`, extracted with `git archive` (no checkout); its src/."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "src", "scripts"], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--old-rev {rev}: not in this repository's history ({archive.stderr.decode().strip()}); "
                         f"use a full clone, or --old-src with that commit's src/")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "src"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--old-rev", default=BEFORE_REV)
    ap.add_argument("--old-src", default=None)
    ap.add_argument("--reps", type=int, default=1, help="launches per layout and tree (the median is reported)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    sys.path.insert(0, str(HERE))
    from async_save import write_corpus  # the same random corpus writer

    report = {"old": a.old_src or a.old_rev, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="join_time_") as tmp:
        root = Path(tmp)
        trees = {"before": Path(a.old_src) if a.old_src else old_src(a.old_rev, root / "old"), "after": REPO / "src"}
        write_corpus(root / "data" / "c", 512, n_tokens=100_000)
        if not a.json:
            print(f"{'layout':15} {'ranks':>5} | {'join s before':>13} {'after':>6} | {'to layout s before':>18} "
                  f"{'after':>6} | {'groups':>6} {'s before':>8} {'after':>6}")
        for name in a.layouts.split(","):
            nproc, keys = LAYOUTS[name]
            cfg = dict(BASE, input_dir=str(root / "data"), **keys)
            row = {}
            for which, src in trees.items():
                runs = [launched(src, cfg, root / f"{name}_{which}_{i}", nproc) for i in range(a.reps)]
                row[which] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            report["runs"][name] = row
            if not a.json:
                b, n = row["before"], row["after"]
                print(f"{name:15} {nproc:>5} | {b['join']:>13.2f} {n['join']:>6.2f} | {b['to_layout']:>18.2f} "
                      f"{n['to_layout']:>6.2f} | {n['groups']:>6.0f} {b['group_s']:>8.2f} {n['group_s']:>6.2f}"
                      + (f"  (failed launches: {b['failed']:.0f} before, {n['failed']:.0f} after)"
                         if b["failed"] or n["failed"] else ""),
                      flush=True)
    if a.json:
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        rank_main(sys.argv[2:])
    else:
        sys.exit(main())
