"""The layout matrix: every product of parallel degrees within 8 processes, each a few steps of micro-qwen2 against
one process; one row per layout: ran (max |Δloss| and max |Δweight| against one process) or refused (the line of
`config.refusals`' table, or of the degree arithmetic, that `pretrain-cli check` prints). No row may end any
other way: a failed launch is printed as FAILED with the tail of rank 0's log, and the script exits 1.

Axes: tp, pp, cp and the data ranks d (dp, or the ZeRO ranks) each in {1, 2}; ZeRO off, stage1, stage2, stage3
where something can be sharded (d = 2, or cp = 2 for stage1); sequence parallelism off/on with tp = 2. The
global batch is 8 sequences of 32 tokens in every layout (per-device batch 8 / (d x micro-batches); a pipeline
runs 2 micro-batches). Each row compares every step's loss rank 0 logs (the global batch's) and the final
weights with one process's: over the whole batch for a dense model; for a Mixture-of-Experts one in the micro-batches
its balance loss is computed over (`reference_batch`: its default scope, `micro_batch`, is a loss per micro-batch
of each rank, so two ranks of 4 sequences equal one process's two micro-batches of 4, not one of 8).

    python benchmarks/layout_matrix.py [--steps 3] [--max_procs 8] [--only tp2,cp2] [--layouts tp2_pp2_cp2,...]
                                       [--model micro-deepseek-v3] [--ep 2] [--check_only] [--json]

`--model` runs another preset than micro-qwen2 (a Mixture-of-Experts one with its router terms at their defaults);
`--ep E` adds `expert_parallel_degree: E` to the layouts whose data ranks E divides (names end in `_epE`), the others
left out.

`--only` keeps the layouts whose name contains every listed part; `--check_only` classifies every row with
`pretrain-cli check --world_size N` (ran/refused by the rules) without launching. Not a test: a full run is 55
launches (32 minutes on 2 CPU cores at load 6-11).
"""
from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# the launcher helpers the multi-process tests use, and the fork server their one-process runs start from
sys.path[:0] = [str(REPO / "tests" / "distributed"), str(REPO / "tests")]

from pretrain_cli import runtime  # noqa: E402

runtime.setup_env()  # the CPU math environment the suite's runs get (tests/conftest.py), before Paddle is imported

from launch_helpers import child_env, launch_joined, read_weights, single, write_config, write_corpus  # noqa: E402

ZERO = {0: "", 1: "stage1", 2: "stage2", 3: "stage3"}


def layouts(max_procs: int, ep: int = 1) -> list[tuple[str, dict, int]]:
    """(name, config keys, processes) for every product within `max_procs` processes (with `ep` > 1: those whose
    data ranks it divides, expert-parallel over them)."""
    out = []
    for tp, pp, cp, d in itertools.product((1, 2), repeat=4):
        world = tp * pp * cp * d
        if world > max_procs or world == 1 or d % ep:
            continue
        stages = (0, 1, 2, 3) if d > 1 else ((0, 1, 2, 3) if cp > 1 else (0,))
        for stage, sp in itertools.product(stages, (False, True) if tp > 1 else (False,)):
            micro = 2 if pp > 1 else 1
            keys = dict(tensor_parallel_degree=tp, pipeline_parallel_degree=pp, context_parallel_degree=cp,
                        sharding=ZERO[stage], sequence_parallel=sp, gradient_accumulation_steps=micro,
                        per_device_train_batch_size=8 // (d * micro))
            name = "_".join(p for p in (f"tp{tp}" if tp > 1 else "", f"pp{pp}" if pp > 1 else "",
                                        f"cp{cp}" if cp > 1 else "", f"d{d}" if d > 1 else "",
                                        f"zero{stage}" if stage else "", "sp" if sp else "",
                                        f"ep{ep}" if ep > 1 else "") if p)
            if ep > 1:
                keys["expert_parallel_degree"] = ep
            out.append((name, keys, world))
    return out


def reference_batch(keys: dict, world: int, model: str) -> tuple[int, int]:
    """(per_device_train_batch_size, gradient_accumulation_steps) of the one-process run a row of `keys` on `world`
    processes of `model` is compared with: the global batch of 8 in micro-batches of the size a Mixture-of-Experts
    model's balance loss is computed over. In the default scope that is each rank's micro-batch (the pipeline tests'
    rule); the semi-auto engine (tp alone, ZeRO-2/3) computes it over the global batch, every data rank's micro-batch
    together. Which engine runs the row is `config.resolve`'s decision, asked here: tp alone runs on fleet's groups,
    per rank, for multi-head latent attention (except under ZeRO-3) and with expert parallelism, which the degrees
    alone do not say (their tp rows were compared with one batch of 8: micro-qwen2-moe's tp2_d2_ep2 printed max
    |dloss| 2.3e-5 and |dweight| 4.1e-3 where it equals one process). A dense model's loss is a token mean, the same
    in any micro-batches: its reference is one batch of 8."""
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.presets import resolve_model_dir
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.run_config import Target

    if not is_moe(model):
        return 8, 1
    given = [arg for key, value in keys.items() for arg in (f"--{key}", str(value))]
    args = parse_config(None, ["--output_dir", "o", "--input_dir", "d", "--do_train", "--max_steps", "3",
                               "--device", "cpu", *given])  # (a row `main` launches: one `config.refusals` passes)
    parallel = resolve(args, ModelConfig.from_file(str(resolve_model_dir(model))), Target("cpu", world)).parallel
    micro = keys["per_device_train_batch_size"]
    if parallel.traits.global_batch:
        micro *= parallel.data_world_size  # every data rank's micro-batch
    return micro, 8 // micro


def is_moe(preset: str) -> bool:
    """Whether `preset` (a name or a model directory) is a Mixture-of-Experts model (`num_experts`, DeepSeek's
    `n_routed_experts`)."""
    from pretrain_cli.config.presets import resolve_model_dir

    cfg = json.loads((resolve_model_dir(preset) / "config.json").read_text())
    return bool(cfg.get("num_experts") or cfg.get("n_routed_experts"))


def refusal(cfg: Path, world: int) -> str | None:
    """The line `pretrain-cli check --world_size N` refuses the layout with, or None when it runs."""
    p = subprocess.run([sys.executable, "-m", "pretrain_cli", "check", str(cfg), "--world_size", str(world)],
                       capture_output=True, text=True, env=child_env(), cwd=str(cfg.parent))
    if p.returncode == 0:
        return None
    lines = [line.strip() for line in p.stderr.splitlines() if line.strip()]
    return " | ".join(lines[-3:]) if lines else f"exit {p.returncode}"


def max_diff(got: dict, want: dict) -> float:
    import numpy as np

    return max(float(np.max(np.abs(np.asarray(got[k], np.float64) - np.asarray(want[k], np.float64)))) for k in want)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max_procs", type=int, default=8)
    ap.add_argument("--only", default="", help="comma-separated parts every chosen layout's name contains")
    ap.add_argument("--layouts", default="", help="comma-separated exact layout names (e.g. tp2_pp2_cp2)")
    ap.add_argument("--model", default="micro-qwen2", help="the preset every row and the reference run")
    ap.add_argument("--ep", type=int, default=1, help="expert_parallel_degree for every row (a MoE --model)")
    ap.add_argument("--check_only", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="layout_matrix_"))
    corpus = root / "data"
    write_corpus(corpus / "walk")
    common = dict(max_steps=args.steps, save_steps=1000, warmup_steps=1, model_name_or_path=args.model)
    refs = {}

    def reference(batch: tuple[int, int]):
        """(Run, output dir) of one process in micro-batches `batch` (`reference_batch`), run once."""
        if batch not in refs:
            d = root / f"ref_{batch[0]}x{batch[1]}"
            d.mkdir()
            refs[batch] = single(write_config(d / "c.json", corpus, d / "out", per_device_train_batch_size=batch[0],
                                              gradient_accumulation_steps=batch[1], **common),
                                 d / "log", timeout=600), d / "out"
        return refs[batch]

    rows, failed = [], 0
    wanted = [part for part in args.only.split(",") if part]
    exact = {name for name in args.layouts.split(",") if name}
    for name, keys, world in layouts(args.max_procs, args.ep):
        if not all(part in name for part in wanted) or (exact and name not in exact):
            continue
        d = root / name
        d.mkdir()
        cfg = write_config(d / "c.json", corpus, d / "out", **common, **keys)
        line = refusal(cfg, world)
        row = {"layout": name, "processes": world}
        if line is not None:
            row.update(result="refused", line=line)
        elif args.check_only:
            row.update(result="runs")
        else:
            run = launch_joined(cfg, d / "log", world, timeout=900)
            ref, ref_out = reference(reference_batch(keys, world, args.model))
            if ref.returncode != 0:
                print(ref.explain())
                return 1
            if run.returncode != 0:
                failed += 1
                row.update(result="FAILED", line=run.explain()[-1500:])
            else:
                want, got = ref.losses(0), run.losses(0)
                dloss = max(abs(got[s] - want[s]) if s in got else float("inf") for s in want)
                row.update(result="ran", max_dloss=dloss, max_dweight=max_diff(read_weights(d / "out"),
                                                                             read_weights(ref_out)),
                           seconds=round(run.seconds, 1))
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            detail = (f"max |dloss| {row['max_dloss']:.2e}, " if row.get("max_dloss") is not None else "") + \
                (f"max |dweight| {row['max_dweight']:.2e}" if "max_dweight" in row else row.get("line", ""))
            print(f"| {name} | {world} | {row['result']} | {detail} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
