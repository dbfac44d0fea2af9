"""The train script under a probe (`benchmarks/startup.py` launches this instead of scripts/run_pretrain.py): as
`Trainer.train` is entered — layout in place, no step taken — it writes this rank's VmHWM and seconds since launch
to $STARTUP_PROBE_DIR/probe_rank<N>.json, then the run continues unchanged (or, with STARTUP_PROBE_EXIT=1, every
rank leaves together right there). It reads /proc itself, so the code
before the `startup` record is measured exactly like the code after."""
from __future__ import annotations

import json
import os
import runpy
import sys
import time


def _probe() -> dict:
    with open("/proc/self/status", encoding="ascii") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 2**20
    with open("/proc/self/stat", "rb") as f:
        ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
    with open("/proc/stat", encoding="ascii") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return {"rank": int(os.environ.get("PADDLE_TRAINER_ID", "0")), "rss_peak_gib": round(hwm, 4),
            "seconds_since_launch": round(time.time() - boot - ticks / os.sysconf("SC_CLK_TCK"), 2)}


def main() -> None:
    from pretrain_cli.training import trainer

    train = trainer.Trainer.train

    def probed(self, *args, **kwargs):
        row = _probe()
        with open(os.path.join(os.environ["STARTUP_PROBE_DIR"], f"probe_rank{row['rank']}.json"), "w") as f:
            json.dump(row, f)
        if os.environ.get("STARTUP_PROBE_EXIT") != "1":
            return train(self, *args, **kwargs)
        if int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) > 1:
            import paddle.distributed as dist

            dist.barrier()  # every rank has written its record before any leaves
        os._exit(0)  # what the benchmark measures ends here: the step, its save and the export are not needed

    trainer.Trainer.train = probed
    script = os.environ["STARTUP_PROBE_SCRIPT"]
    sys.argv = [script, *sys.argv[1:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
