"""Where a real `train` run spends time outside `Trainer.train_step`: data, logging, metrics, progress bar, saves.

Why in-process: on a shared 2-core VM the wall-clock gap between `--through-cli` and the harness is mostly
other load; timing `train_step` inside the real loop gives the loop's own share, which load scales alike.
Runs `pretrain-cli train` (cli.main) on a token file of the benchmark's shape under cProfile, with
`train_step` timed, and prints the share outside it and the loop's own callees.

    python benchmarks/loop_profile.py --config bench|small [--steps N] [--top K]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="bench")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args(argv)
    from cli_throughput import write_run

    from pretrain_cli.cli import main as cli_main
    from pretrain_cli.training import trainer as T

    cfg = json.loads((HERE / "configs" / f"{a.config}.json").read_text())
    step_s, loop_s, prof = [], [], cProfile.Profile()
    train_step, train = T.Trainer.train_step, T.Trainer.train

    def timed_step(self, batches):
        t0 = time.perf_counter()
        out = train_step(self, batches)
        step_s.append(time.perf_counter() - t0)
        return out

    def profiled_train(self):
        t0 = time.perf_counter()
        prof.enable()
        try:
            return train(self)
        finally:
            prof.disable()
            loop_s.append(time.perf_counter() - t0)

    T.Trainer.train_step, T.Trainer.train = timed_step, profiled_train
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path = write_run(Path(tmp), cfg, a.steps, {})
        if cli_main(["train", str(cfg_path)]) != 0:
            return 1
    stats = pstats.Stats(prof, stream=(buf := io.StringIO()))
    stats.sort_stats("cumulative").print_callees(r"trainer.py:\d+\(train\)")
    loop_key = next(k for k in stats.stats if k[2] == "train" and k[0].endswith("trainer.py"))
    callees = {k[2]: v[4][loop_key][3] for k, v in stats.stats.items() if loop_key in v[4]}  # name -> cumtime
    save = callees.get("_save", 0.0)
    rest = sum(callees.values()) - callees["timed_step"] - save + stats.stats[loop_key][2]
    print(f"{a.config}: {len(step_s)} steps, loop {loop_s[0]:.2f} s, train_step {sum(step_s):.2f} s "
          f"(median {sorted(step_s)[len(step_s) // 2] * 1e3:.1f} ms); checkpoint + loss plot {save:.3f} s; the rest of "
          f"the loop (logging, metrics, progress bar, signals) {rest / len(step_s) * 1e3:.2f} ms/step = "
          f"{rest / sum(step_s):.2%} of train_step (cProfile timings)")
    print("\n".join(buf.getvalue().splitlines()[: a.top + 8]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
