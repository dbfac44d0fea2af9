"""The evaluation's peak `plan` models (`planning.eval_memory`) against Paddle's host allocator on CPU.

For each config: a fresh process builds the model (Paddle's ops, math attention, fp32: the path
benchmarks/plan_calibration.py calibrates the step on), runs two training steps (gradients and AdamW moments
exist), then one forward under `paddle.no_grad` of an eval batch with its loss, as `training.evaluation.loss_sum`
does; the allocator's peak over that forward, above what it held before the model, against `plan --device cpu`'s
`eval_memory_gib` less its framework part (the CPU baseline, 0 here). What the step leaves allocated ("held") is
printed beside it.

    python benchmarks/plan_eval_memory.py
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plan_calibration as bench  # noqa: E402  (its child script and argument files)

_CHILD = bench._CHILD.replace('''core.host_memory_stat_reset_peak_value("Allocated", 0)
step()
peak = core.host_memory_stat_peak_value("Allocated", 0)''', '''step()
model.eval()
ev = paddle.randint(0, cfg.vocab_size, [spec["e"], spec["s"] + 1], dtype="int64")
held = core.host_memory_stat_current_value("Allocated", 0) - base
core.host_memory_stat_reset_peak_value("Allocated", 0)
with paddle.no_grad():
    total, count = model(ev[:, :-1], labels=ev[:, 1:])
    float(total)
peak = core.host_memory_stat_peak_value("Allocated", 0)
print(json.dumps({"held": held}))''')
assert _CHILD != bench._CHILD, "plan_calibration's child script changed: re-read its step"

# name, preset, model overrides, training micro-batch, seq, eval batch, fused head + loss
CONFIGS = [("llama-52m b2 s256 eval 8", "tiny-llama", bench.LLAMA_52M, 2, 256, 8, False),
           ("llama-52m b2 s256 eval 8 fused loss", "tiny-llama", bench.LLAMA_52M, 2, 256, 8, True),
           ("qwen3 b4 s256 eval 16", "tiny-qwen2", bench.QWEN3, 4, 256, 16, False)]


def _fresh_interpreter(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)


def calibrate(configs=CONFIGS, python=_fresh_interpreter) -> list[dict]:
    """A row per config: the eval's predicted and measured peak (MiB), and what the step leaves allocated."""
    from pretrain_cli.orchestration.planned import from_file

    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name, preset, over, b, s, e, fused in configs:
            extra = {"do_eval": True, "per_device_eval_batch_size": e, "use_flash_attention": False,
                     "use_fused_linear_cross_entropy": fused}
            model_dir, args_path = bench._write(Path(d), name, preset, over, b, s, None, extra)
            spec = json.dumps({"model_dir": str(model_dir), "b": b, "s": s, "recompute": None, "document": False,
                               "fused": fused, "e": e})
            out = python(["-c", _CHILD, spec])
            if out.returncode:
                raise RuntimeError(f"measurement failed ({out.returncode}): {out.stderr[-2000:]}")
            lines = out.stdout.strip().splitlines()
            measured, held = json.loads(lines[-1])["peak"], json.loads(lines[-2])["held"]
            parts = from_file(str(args_path), [], device="cpu", suggest_changes=False).eval_breakdown_gib
            predicted = (parts["held"] + parts["forward"]) * 2**30
            rows.append({"config": name, "predicted_mib": predicted / 2**20, "measured_mib": measured / 2**20,
                         "held_predicted_mib": parts["held"] * 1024, "held_measured_mib": held / 2**20,
                         "error": predicted / measured - 1})
    return rows


if __name__ == "__main__":
    for r in calibrate():
        print(f"{r['config']}: predicted {r['predicted_mib']:.1f} MiB, measured {r['measured_mib']:.1f} MiB "
              f"({r['error']:+.1%}); held between steps {r['held_predicted_mib']:.1f} / {r['held_measured_mib']:.1f}")
