"""What a checkpoint costs under ZeRO-3 and tensor parallelism: the parallel sharded save against the old gather.

Why: the old save gathered the whole model and optimizer state onto rank 0, which alone wrote it, so rank 0's
host memory and the save time grew with the model; now every rank writes its own pieces at once and resume
reads only each rank's blocks (docs/CHECKPOINTS.md). For each layout this trains the same model through the
real launcher (`paddle.distributed.launch`, CPU processes) for 3 steps, saving at step 2, twice: with this
tree's code and with the last commit that gathered (`--old-rev`, default 8c9b93a, extracted with `git archive`;
or `--old-src`, any tree's src/), and reads rank 0's
metrics.jsonl: the `checkpoint` record's `stall_seconds` (the save's wall time: a synchronous save holds
every rank until it is published) and rank 0's peak RSS before the save (step 2's `host_memory_peak_gib`, the
training peak) and after it (the `checkpoint` record's; the old code's record has none: step 3's): the
difference is what the save added. Then it resumes each
new checkpoint under the other layout for one step and reads every rank's `resume_bytes_read` (the `layout`
record) against the checkpoint's size and what that rank holds.

    python benchmarks/checkpoint_save.py [--model llama-171m] [--layouts zero3:2,tp2:2,zero3:4,tp2:4]
                                         [--old-rev 8c9b93a | --old-src DIR/src] [--seq 128] [--json]

Not a test: numbers depend on the machine and its load (docs/CHECKPOINTS.md has a run's).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LAYOUTS = {"zero3": {"sharding": "stage3"}, "tp2": {"tensor_parallel_degree": 2}}
GATHER_REV = "8c9b93a"  # the last commit whose save gathered everything onto rank 0


def corpus(root: Path, vocab: int) -> Path:
    sys.path.insert(0, str(HERE))
    from async_save import write_corpus  # the same random corpus writer

    write_corpus(root / "data" / "c", vocab, n_tokens=100_000)
    return root / "data"


def launch(src: Path, cfg: dict, root: Path, name: str, nproc: int) -> Path:
    """One launcher run of `src`'s train script; returns its output_dir (raises with the log tail on failure)."""
    out, logs = root / name / "out", root / name / "log"
    (root / name).mkdir(parents=True, exist_ok=True)
    path = root / name / "cfg.json"
    path.write_text(json.dumps(dict(cfg, output_dir=str(out))))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(src))
    env.pop("PADDLE_TRAINER_ID", None)
    script = src.parent / "scripts" / "run_pretrain.py"
    p = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
                        "--log_dir", str(logs), str(script), str(path)], capture_output=True, text=True, env=env,
                       cwd=str(root))
    if p.returncode != 0:
        tail = (logs / "workerlog.0").read_text(errors="replace")[-3000:] if (logs / "workerlog.0").is_file() else ""
        raise SystemExit(f"{name}: exit {p.returncode}\n{p.stderr[-2000:]}\n{tail}")
    return out


def old_tree(rev: str, dest: Path) -> Path:
    """`src/` and `scripts/` of commit `rev`, extracted (no checkout, no change to the repository); its src/.
    The benchmark needs the repository's history (a test must not): it says so when the commit is missing, and
    checks that the extracted code is the save it compares against (the one that gathered onto rank 0)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "src", "scripts"], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--old-rev {rev}: not in this repository's history ({archive.stderr.decode().strip()}); "
                         f"use a full clone, or --old-src with that commit's src/")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    strategy = dest / "src" / "pretrain_cli" / "distributed" / "strategy.py"
    if not (dest / "scripts" / "run_pretrain.py").is_file() or "def gather_optimizer_state" not in strategy.read_text():
        raise SystemExit(f"--old-rev {rev}: not the code that gathered the checkpoint onto rank 0")
    return dest / "src"


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def save_numbers(out: Path) -> dict:
    recs = records(out)
    peak = {r["step"]: r["host_memory_peak_gib"] for r in recs if r["kind"] == "train"}
    save = next(r for r in recs if r["kind"] == "checkpoint" and r["step"] == 2)
    # right after the save where the record carries it (this code), else after step 3 (the old code)
    after = save.get("host_memory_peak_gib", peak[3])
    size = sum(f.stat().st_size for f in (out / "checkpoint-2").iterdir())
    return {"save_seconds": save["stall_seconds"], "rank0_training_peak_gib": peak[2],
            "rank0_peak_after_save_gib": after, "rank0_save_rss_gib": round(after - peak[2], 3),
            "checkpoint_gib": round(size / 2**30, 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-171m")
    ap.add_argument("--layouts", default="zero3:2,tp2:2,zero3:4,tp2:4", help="name:processes, name in zero3, tp2")
    ap.add_argument("--old-rev", default=GATHER_REV,
                    help="the commit whose gathering save is compared (default: %(default)s)")
    ap.add_argument("--old-src", default=None, help="instead of --old-rev: a tree with the gathering save (its src/)")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from pretrain_cli.config.presets import resolve_model_dir
    from pretrain_cli.models.config import ModelConfig

    vocab = ModelConfig.from_file(str(resolve_model_dir(a.model, key="--model"))).vocab_size
    report = {"model": a.model, "seq": a.seq, "old": a.old_src or a.old_rev, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="ckpt_bench_") as tmp:
        root = Path(tmp)
        old_src = Path(a.old_src) if a.old_src else old_tree(a.old_rev, root / "old")
        base = {"model_name_or_path": a.model, "input_dir": str(corpus(root, vocab)), "device": "cpu",
                "split": "100,0,0", "max_seq_length": a.seq, "do_train": True, "per_device_train_batch_size": 1,
                "max_steps": 3, "save_steps": 2, "logging_steps": 1, "report_to": ["none"], "disable_tqdm": True,
                "overwrite_output_dir": True, "learning_rate": 1e-4, "warmup_steps": 0}
        for item in a.layouts.split(","):
            name, nproc = item.split(":")
            nproc, keys = int(nproc), LAYOUTS[name]
            tag = f"{name}_x{nproc}"
            row = {}
            for which, src in (("sharded", REPO / "src"), ("gather", old_src)):
                start = time.perf_counter()
                out = launch(src, dict(base, **keys), root, f"{tag}_{which}", nproc)
                row[which] = dict(save_numbers(out), run_seconds=round(time.perf_counter() - start, 1))
            # resume the sharded checkpoint under the other layout, one step
            other = "tp2" if name == "zero3" else "zero3"
            ckpt = root / f"{tag}_sharded" / "out" / "checkpoint-2"
            out = launch(REPO / "src", dict(base, resume_from_checkpoint=str(ckpt), overwrite_output_dir=False,
                                            **LAYOUTS[other]), root, f"{tag}_resume_{other}", nproc)
            layout = next(r for r in records(out) if r["kind"] == "layout")
            total = sum(f.stat().st_size for f in ckpt.iterdir() if f.suffix == ".safetensors")
            row["resume"] = {"under": other, "checkpoint_tensor_bytes": total,
                             "per_rank": [{"read": x["resume_bytes_read"],
                                           "holds": x["parameters"] + x["optimizer_state"],
                                           "read_fraction_of_checkpoint": round(x["resume_bytes_read"] / total, 3)}
                                          for x in layout["per_rank"]]}
            report["runs"][tag] = row
            if not a.json:
                s, g = row["sharded"], row["gather"]
                print(f"{tag}: checkpoint {s['checkpoint_gib']} GiB; save {s['save_seconds']:.2f} s (gather: "
                      f"{g['save_seconds']:.2f} s); rank 0 RSS added by the save {s['rank0_save_rss_gib']:.3f} GiB "
                      f"(gather: {g['rank0_save_rss_gib']:.3f}) over a training peak of "
                      f"{s['rank0_training_peak_gib']:.2f}")
                for r, x in enumerate(row["resume"]["per_rank"]):
                    print(f"  resume under {other}: rank {r} read {x['read'] / 2**20:.1f} MiB = "
                          f"{x['read_fraction_of_checkpoint']:.0%} of the checkpoint, holds "
                          f"{x['holds'] / 2**20:.1f} MiB")
                sys.stdout.flush()
    if a.json:
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
