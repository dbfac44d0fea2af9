"""The evaluation's peak `plan` models (`planning.eval_memory`) against Paddle's allocator over a real no_grad
forward after two training steps (benchmarks/plan_eval_memory.py), forked as tests/unit/test_plan_calibration.py's."""
import forkserver
from bench_scripts import load


def test_eval_peak_within_25_percent_over_and_never_under_the_measured():
    """llama-52m's eval of 8 x 256 tokens, unfused (the `[b·s, V]` logits and the softmax) and fused (a chunk), and a
    Qwen3's of 16: planned +0.3 %, +4.1 % and +22.4 % over the measured peak (an upper bound: a layer's tensors all
    counted). Counting the fp32 logits twice in fp32 planned the unfused one at +19.8 %."""
    rows = load("plan_eval_memory").calibrate(python=forkserver.run)
    assert len(rows) == 3
    bad = [f"{r['config']}: predicted {r['predicted_mib']:.1f} MiB, measured {r['measured_mib']:.1f} MiB"
           for r in rows if not -0.02 <= r["error"] <= 0.25]
    assert not bad, bad
    unfused = rows[0]
    assert abs(unfused["error"]) < 0.05  # the logits counted once in fp32
