"""The log line's `eta` (training/metrics.py `Throughput.time_remaining`): the steps left at the recent step rate."""
from pretrain_cli.training import metrics


def test_eta_follows_the_recent_rate(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: now[0])
    tp = metrics.Throughput(32, 4, 1, 1, flops_per_token=1e9, hw_flops_per_token=1e9, peak_tflops=None)
    now[0] += 30.0  # a slow first step (kernels built, caches cold)
    tp.step()
    assert tp.time_remaining(9) == "0:04:30"  # one step seen: 30 s a step
    for _ in range(metrics.ETA_WINDOW):  # then 2 s a step: the first step leaves the window
        now[0] += 2.0
        tp.step()
    assert tp.time_remaining(1800) == "1:00:00"
    assert metrics.clock(0) == "0:00:00" and metrics.clock(3725.4) == "1:02:05"

