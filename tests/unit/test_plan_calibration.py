"""The planner's CPU memory model against measured training steps (benchmarks/plan_calibration.py).

One fresh subprocess per config keeps each allocator peak isolated (~4 s each).
"""
import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "plan_calibration.py"


def _bench():
    spec = importlib.util.spec_from_file_location("plan_calibration", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_prediction_within_20_percent_of_measured_peak():
    bench = _bench()
    rows = bench.calibrate()
    assert len(rows) >= 4
    assert {r["recompute"] for r in rows} >= {"off", "full"}
    assert max(r["params"] for r in rows) > 40e6
    bad = [f"{r['config']}: predicted {r['predicted_mib']:.1f} MiB, measured {r['measured_mib']:.1f} MiB"
           for r in rows if abs(r["error"]) > 0.20]
    assert not bad, "\n" + bench.table(rows)


def test_parallel_layouts_within_20_percent_of_measured_peak():
    """DP, ZeRO-2, ZeRO-3 and TP on 2 processes (the whole table: benchmarks/plan_calibration.py --layouts): the largest
    rank's allocator peak over a real `train_step` of the product's own build order."""
    bench = _bench()
    rows = bench.calibrate_layouts([x for x in bench.LAYOUTS if x[0] in ("data parallel b2", "ZeRO-2 b2", "ZeRO-3 b2",
                                                                         "TP2 b8")])
    assert len(rows) == 4
    bad = [f"{r['config']}: predicted {r['predicted_mib']:.1f} MiB, measured {r['measured_mib']:.1f} MiB"
           for r in rows if abs(r["error"]) > 0.20]
    assert not bad, "\n" + bench.table(rows)
