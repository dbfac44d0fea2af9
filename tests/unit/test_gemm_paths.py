"""benchmarks/gemm_paths.py: the GEMM set it times is the step's, and a run names and times the runtime's MKL path
and what those GEMMs cost in one step."""
import json
import re
import subprocess
import sys

from bench_scripts import BENCH, load

SCRIPT = BENCH / "gemm_paths.py"
TINY = {"model": {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "vocab_size": 160, "num_hidden_layers": 2},
        "arguments": {"per_device_train_batch_size": 2, "max_seq_length": 16}}


def _module():
    return load("gemm_paths")


def test_the_gemm_set_is_every_linear_forward_and_both_gradients():
    calls = _module().gemm_set(TINY)
    tokens, h, i, v, kv = 32, 64, 96, 160, 2 * 16  # kv heads × head_dim
    linears = [(h, h), (h, kv), (h, kv), (h, h), (h, 2 * i), (i, h), (h, v)]  # q k v o gate|up down head
    assert len(calls) == 3 * len(linears)
    assert sum(m * n * k for _, _, m, n, k in calls) == 3 * sum(tokens * a * b for a, b in linears)
    # per Linear: y = x·W, dx = dy·Wᵀ, dW = xᵀ·dy
    assert calls[:3] == [(0, 0, tokens, h, h), (0, 1, tokens, h, h), (1, 0, h, h, tokens)]
    # the head's three come last: the worker times them apart from the layer's (its per-step total)
    assert calls[-3:] == [(0, 0, tokens, v, h), (0, 1, tokens, h, v), (1, 0, h, v, tokens)]


def test_a_run_names_the_runtimes_path_and_times_it(tmp_path):
    """The MKL and OpenBLAS workers (torch's are the next test's: importing torch in this run would double its time)."""
    from pretrain_cli import runtime

    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    out = subprocess.run([sys.executable, str(SCRIPT), "--config", str(cfg), "--paths", "auto,openblas", "--rounds", "1",
                          "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    chosen = runtime.mkl_cpu_type() or "unset"
    assert f"runtime.mkl_cpu_type() here = {chosen}" in out.stdout
    mine = re.search(rf"paddle MKL type {chosen} +([0-9.]+) GFLOP/s .*1\.000x the runtime's choice", out.stdout)
    assert mine and float(mine.group(1)) > 0, out.stdout
    theirs = re.search(r"numpy OpenBLAS +([0-9.]+) GFLOP/s .*x the runtime's choice", out.stdout)
    assert theirs and float(theirs.group(1)) > 0, out.stdout
    step = re.search(r"one step's 2 layers \+ head: ([0-9.]+) ms of these GEMMs", out.stdout)
    assert step and float(step.group(1)) > 0, out.stdout


def test_the_torch_paths_run_and_the_bf16_row_is_named(tmp_path):
    """`torch` and `torch-bf16` (the same GEMMs in bf16, AMX where the CPU has it): each worker ran its products and
    timed them, each row under its own name; neither is the runtime's path, so no ratio is printed against one."""
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    out = subprocess.run([sys.executable, str(SCRIPT), "--config", str(cfg), "--paths", "torch,torch-bf16", "--rounds",
                          "1", "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = re.findall(r"^  (torch matmul(?:, bf16)?) +([0-9.]+) GFLOP/s \(rounds: [0-9.]+\)$", out.stdout, re.M)
    assert [name for name, _ in rows] == ["torch matmul", "torch matmul, bf16"], out.stdout
    assert all(float(gflops) > 0 for _, gflops in rows), out.stdout
    # each row's step time (printed to 0.1 ms: the tiny shapes' fp32 one may round to 0.0)
    assert len(re.findall(r"one step's 2 layers \+ head: [0-9.]+ ms of these GEMMs", out.stdout)) == 2, out.stdout
    assert "paddle MKL" not in out.stdout and "runtime's choice" not in out.stdout
