"""benchmarks/train_throughput.py: which compile modes a run times, that the ratio is taken against the faster,
and the per-round ratios.

The workers themselves (Paddle, HF eager, HF under torch.compile) take minutes to compile and are run by hand
(docs/PERFORMANCE.md §1); this checks the driver's bookkeeping on synthetic worker results.
"""
import contextlib
import io
import json
import sys

from bench_scripts import load


def _module():
    return load("train_throughput")


def _worker(step_s: float, **extra) -> dict:
    """What a worker writes, for two rounds of 4 steps of 2048 tokens around `step_s` seconds."""
    rounds = []
    for r in range(2):
        times = [step_s * (1 + 0.01 * (i + r)) for i in range(4)]
        out = {"step_s_median": sorted(times)[2], "tokens_per_s": round(2048 / sorted(times)[2], 1),
               "tokens_per_s_best": round(2048 / min(times), 1), "step_times": times, "tokens_per_step": 2048,
               "matmul_peak_gflops": 200.0, "flops_per_token": 1e6, "losses": [9.0, 8.9], **extra}
        rounds.append(out)
    return rounds


def test_both_is_the_default_and_times_each_mode():
    tt = _module()
    assert tt.compile_modes("both") == ("default", "max-autotune")
    assert tt.compile_modes("max-autotune") == ("max-autotune",)
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
        tt.main(["--help"])
    assert "{both,max-autotune,default}" in out.getvalue()


def test_the_ratio_is_against_the_faster_compile_mode_and_both_are_reported():
    tt = _module()
    merge = tt.merge
    hf = {"hf_malloc": "keep", "attn_implementation": "sdpa", "torch": "2.13.0", "transformers": "5.24.0"}
    ours = {"processes": 1, "threads": 2, "to_static": False, "paddle": "3.3.1", "kernels": "cpu",
            "mkl_debug_cpu_type": "7"}
    raw = {"paddle": _worker(0.40, **ours),
           "torch": _worker(0.70, compile_mode=None, **hf),
           "torch_compile/default": _worker(0.55, compile_mode="default", **hf),
           "torch_compile/max-autotune": _worker(0.60, compile_mode="max-autotune", **hf)}
    runs = {k: merge(v) for k, v in raw.items()}
    cfg = {"arguments": {"per_device_train_batch_size": 8, "max_seq_length": 256}}
    row = tt._row("bench", cfg, runs)
    assert row["hf_compile_mode"] == "default"  # the faster of the two
    assert row["ratio_vs_hf_compile"] == round(runs["paddle"]["tokens_per_s"] / runs["torch_compile/default"]["tokens_per_s"], 3)
    assert row["ratio_vs_hf_compile"] < row["ratio_vs_hf_compile_max_autotune"]
    assert row["hf_compile_max_autotune_round_tokens_per_s"] == runs["torch_compile/max-autotune"]["round_tokens_per_s"]
    assert row["round_ratio_vs_hf_compile"] == [1.375, 1.375]  # 0.55 s / 0.40 s in each round, paired by round
    assert row["round_ratio_vs_hf"] == [1.75, 1.75]  # eager: 0.70 s / 0.40 s
    table = tt._table([row])
    assert "per round vs HF compiled (frameworks alternated): bench 1.38x, 1.38x" in table
    fast, slow = (runs[f"torch_compile/{m}"]["tokens_per_s"] for m in ("default", "max-autotune"))
    assert f"the faster mode of: bench default {fast:.0f} tok/s (used), max-autotune {slow:.0f} tok/s" in table

    # without the compiled workers (--no-compile) the table says so instead of naming modes
    eager = tt._table([tt._row("bench", cfg, {k: runs[k] for k in ("paddle", "torch")})])
    assert "(eager only: --no-compile)" in eager and "HFc =" not in eager

    # a run with one mode names it and marks nothing
    one = {k: v for k, v in runs.items() if k != "torch_compile/default"}
    row = tt._row("bench", cfg, one)
    assert row["hf_compile_mode"] == "max-autotune" and "hf_compile_default_tokens_per_s" not in row
    assert "(used)" not in tt._table([row])

    # one round: the ratio list has one entry and the table leaves the per-round line out
    single = {k: merge(v[:1]) for k, v in raw.items()}
    row = tt._row("bench", cfg, single)
    assert row["round_ratio_vs_hf_compile"] == [1.375] and "per round" not in tt._table([row])


def test_the_floor_gives_how_close_ours_is_and_the_ceiling_against_hf_compiled():
    tt = _module()
    hf = {"hf_malloc": "keep", "attn_implementation": "sdpa", "torch": "2.13.0", "transformers": "5.24.0"}
    ours = {"processes": 1, "threads": 2, "to_static": False, "paddle": "3.3.1", "kernels": "cpu",
            "mkl_debug_cpu_type": "unset"}
    floor = [{"gemm_ms": g, "attention_ms": 12.0, "adamw_ms": 4.0, "floor_ms": g + 16.0, "attention_gflop": 3.2,
              "adamw_bytes": 1, "tokens_per_step": 2048, "matmul_peak_gflops": 250.0, "stream_gbps": 40.0,
              "floor_tokens_per_s": round(2048 / (g + 16.0) * 1e3, 1)} for g in (264.0, 284.0)]
    runs = {"paddle": tt._merge_kind("paddle", _worker(0.40, **ours)),
            "torch_compile/default": tt._merge_kind("torch_compile/default",
                                                    _worker(0.35, compile_mode="default", **hf)),
            "floor": tt._merge_kind("floor", floor)}
    row = tt._row("bench", {"arguments": {"per_device_train_batch_size": 8, "max_seq_length": 256}}, runs)
    assert row["floor_ms"] == 280.0 and row["gemm_ms"] == 264.0  # each term's fastest round
    assert row["ratio_vs_floor"] == round(runs["paddle"]["tokens_per_s"] / row["floor_tokens_per_s"], 3)
    # no step that uses these GEMMs can be further ahead of HF compiled than the floor is
    assert row["ceiling_vs_hf_compile"] == round(row["floor_tokens_per_s"] / row["hf_compile_tokens_per_s"], 3)
    assert 1.27 < row["ceiling_vs_hf_compile"] < 1.29  # HF's median step 0.35 s × 1.025 (`_worker`'s spread) / 0.28 s
    # each round's step against the same round's floor (280 and 300 ms): drift between rounds cancels
    assert row["round_ratio_vs_floor"] == [round(o / (2048 / f * 1e3), 3) for o, f in zip(
        runs["paddle"]["round_tokens_per_s"], (280.0, 300.0))]
    per_round = ", ".join(f"{x:.2f}" for x in row["round_ratio_vs_floor"])
    assert (f"bench 280.0 ms = {row['floor_tokens_per_s']:.0f} tok/s (GEMMs 264.0, attention 12.0, AdamW 4.0), "
            f"ours at {row['ratio_vs_floor']:.2f} of it (per round, against the same round's floor: {per_round}), "
            f"ceiling vs HF compiled {row['ceiling_vs_hf_compile']:.2f}x") in tt._table([row])
    # without HF there is a floor but no ceiling
    alone = tt._row("bench", {"arguments": {"per_device_train_batch_size": 8, "max_seq_length": 256}},
                    {k: runs[k] for k in ("paddle", "floor")})
    assert "ceiling_vs_hf_compile" not in alone and "ours at" in tt._table([alone])


def test_floor_runs_in_every_round_beside_the_frameworks(monkeypatch):
    tt, sf = _module(), load("step_floor")
    calls = []
    ours = {"processes": 1, "threads": 2, "to_static": False, "paddle": "3.3.1", "kernels": "cpu",
            "mkl_debug_cpu_type": "7"}

    def floor_worker(name, threads):
        calls.append(("floor", name, threads))
        return {"gemm_ms": 250.0, "attention_ms": 8.0, "adamw_ms": 2.0, "floor_ms": 260.0, "attention_gflop": 3.2,
                "adamw_bytes": 1, "tokens_per_step": 2048, "matmul_peak_gflops": 250.0, "stream_gbps": 40.0,
                "floor_tokens_per_s": 7876.9}

    def run_worker(kind, name, a):
        calls.append((kind, name))
        return _worker(0.40, **ours)[0]

    monkeypatch.setattr(sf, "run_worker", floor_worker)
    monkeypatch.setitem(sys.modules, "step_floor", sf)
    monkeypatch.setattr(tt, "_run_worker", run_worker)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert tt.main(["--config", "bench", "--floor", "--rounds", "2", "--threads", "2", "--json"]) == 0
    assert calls == [("paddle", "bench"), ("floor", "bench", 2)] * 2  # alternated, the floor in each round
    row = json.loads(out.getvalue().strip().splitlines()[-1])
    assert row["floor_ms"] == 260.0 and row["round_floor_ms"] == [260.0, 260.0]
    assert row["ratio_vs_floor"] == round(row["tokens_per_s"] / 7876.9, 3) and "ceiling_vs_hf_compile" not in row


def test_profile_asks_our_worker_only_and_prints_under_the_table(monkeypatch):
    """`--profile` (what benchmarks/step_profile.py did on its own): passed to our worker, not to HF's; its op
    table is printed after the throughput table."""
    tt = _module()
    cmds = []

    class Done(Exception):
        pass

    def fake_run(cmd, **kw):
        cmds.append(cmd)
        raise Done

    monkeypatch.setattr(tt.subprocess, "run", fake_run)
    a = tt.argparse.Namespace(warmup=3, steps=2, to_static=False, mkl_cpu_type="auto", cpu_ops="on", hf_malloc="default",
                              set_json=None, profile=True, top=7, procs=1, threads=None)
    for kind in ("paddle", "torch"):
        with contextlib.suppress(Done):
            tt._run_worker(kind, "bench", a)
    assert cmds[0][cmds[0].index("--profile") + 1:][:2] == ["--top", "7"] and "--profile" not in cmds[1]
    ours = {"processes": 1, "threads": 2, "to_static": False, "paddle": "3.3.1", "kernels": "cpu",
            "mkl_debug_cpu_type": "7", "profile": "step 400.0 ms unprofiled\nForward CausalLM 120.00"}
    row = tt._row("bench", {"arguments": {"per_device_train_batch_size": 8, "max_seq_length": 256}},
                  {"paddle": tt.merge(_worker(0.40, **ours))})
    assert tt._table([row]).endswith("where our bench step goes (own time per event, first round):\n" + ours["profile"])


def test_the_train_run_is_measured_as_the_harness_worker(monkeypatch):
    """`--through-cli` (cli_throughput.py): the `train` process gets the worker's `--threads` (it once kept the
    product's default whatever --threads said) and its log records carry each step's process CPU seconds, so
    the two compare per CPU-second under load (docs/PERFORMANCE.md §4)."""
    ct = load("cli_throughput")
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert ct.train_env(1)["PRETRAIN_CLI_THREADS"] == "1" and "OMP_NUM_THREADS" not in ct.train_env(1)
    assert "PRETRAIN_CLI_THREADS" not in ct.train_env(None)  # the product's default, as the worker's

    from pretrain_cli import cli
    from pretrain_cli.training.metrics import Throughput

    monkeypatch.setattr(Throughput, "interval", Throughput.interval)  # restored after the hook replaces it
    records = []

    def fake_main(argv):  # stands for `train`: one interval of some CPU work
        t = Throughput(256, 8, 1, 1, 1e6, 1e6, None)
        sum(i * i for i in range(300_000))
        records.append({"kind": "train", "step": 1, "loss": 9.0, **t.interval()})
        return 0

    monkeypatch.setattr(cli, "main", fake_main)
    with contextlib.suppress(SystemExit):
        exec(ct.TIMED_TRAIN, {})
    assert 0 < records[0]["interval_cpu_seconds"] and "interval_runtime" in records[0]
    records.insert(0, {**records[0], "step": 0, "interval_cpu_seconds": 99.0})  # a warm-up step: dropped
    assert ct.steady_steps(records, warmup=0) == ([records[1]["interval_runtime"]],
                                                  [records[1]["interval_cpu_seconds"]], [9.0])
