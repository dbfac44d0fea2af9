"""benchmarks/step_floor.py: the lower bound's arithmetic (attention's causal triangle, AdamW's bytes, the sum),
that rounds merge to each term's fastest, and that a worker measures every term in its own process."""
import json
import subprocess
import sys

import pytest

from bench_scripts import BENCH, load

TINY = {"model": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 160, "num_hidden_layers": 2},
        "arguments": {"per_device_train_batch_size": 2, "max_seq_length": 16}}


def _module():
    return load("step_floor")


def test_attention_counts_six_products_over_the_causal_triangle():
    sf = _module()
    # bench: 4 layers × batch 8 × 8 heads × 6 products × 2·32 FLOPs × 256·257/2 query-key pairs
    assert sf.attention_gflop(sf.load_config("bench")) == pytest.approx(4 * 8 * 8 * 6 * 64 * 32896 / 1e9)
    assert sf.attention_gflop(sf.load_config("bench")) == pytest.approx(3.2338, abs=1e-4)
    # small: 8 layers × 4 × 8 heads, head_dim 64, 512·513/2 pairs
    assert sf.attention_gflop(sf.load_config("small")) == pytest.approx(25.8201, abs=1e-4)
    # an explicit head_dim wins over hidden / heads (Qwen3 shapes)
    wide = {"model": dict(TINY["model"], head_dim=32), "arguments": TINY["arguments"]}
    assert sf.attention_gflop(wide) == pytest.approx(2 * sf.attention_gflop(TINY))


def test_adamw_moves_seven_fp32_words_per_parameter():
    sf = _module()
    # bench: 2 × 8192·256 (embedding, head) + 4 layers × (724,992 weights + two norms of 256) + the final norm
    assert sf.adamw_bytes(sf.load_config("bench")) == 28 * (2 * 8192 * 256 + 4 * (724_992 + 512) + 256)


def test_the_floor_is_the_sum_of_its_terms_at_their_rates():
    sf = _module()
    f = sf.floor_ms(gemm_ms=250.0, attn_gflop=3.0, peak_gflops=300.0, opt_bytes=200_000_000, gbps=40.0)
    assert f == {"gemm_ms": 250.0, "attention_ms": 10.0, "adamw_ms": 5.0, "floor_ms": 265.0}


def test_rounds_merge_to_each_terms_fastest():
    sf = _module()
    base = {"attention_gflop": 3.0, "adamw_bytes": 1, "tokens_per_step": 2048}
    rounds = [dict(base, gemm_ms=260.0, attention_ms=12.0, adamw_ms=4.0, floor_ms=276.0, matmul_peak_gflops=250.0,
                   stream_gbps=40.0),
              dict(base, gemm_ms=250.0, attention_ms=14.0, adamw_ms=5.0, floor_ms=269.0, matmul_peak_gflops=214.0,
                   stream_gbps=32.0)]
    m = sf.merge(rounds)
    assert (m["gemm_ms"], m["attention_ms"], m["adamw_ms"], m["floor_ms"]) == (250.0, 12.0, 4.0, 266.0)
    assert m["floor_tokens_per_s"] == round(2048 / 266.0 * 1e3, 1)
    assert (m["matmul_peak_gflops"], m["stream_gbps"], m["round_floor_ms"]) == (250.0, 40.0, [276.0, 269.0])
    assert "GEMMs 250.0 ms (MKL) + attention 12.0 ms" in sf.describe("bench", m)


def test_a_worker_measures_every_term(tmp_path):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    out = subprocess.run([sys.executable, str(BENCH / "step_floor.py"), "--config", str(cfg), "--worker",
                          "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    # the tiny model's attention and AdamW terms round to ~0 ms; their inputs are what must be measured
    assert all(row[k] > 0 for k in ("gemm_ms", "attention_gflop", "matmul_peak_gflops", "stream_gbps"))
    assert row["floor_ms"] == pytest.approx(row["gemm_ms"] + row["attention_ms"] + row["adamw_ms"], abs=0.02)
    assert row["tokens_per_step"] == 32 and row["adamw_bytes"] % 28 == 0


def test_the_command_merges_its_rounds_and_prints_each(monkeypatch, capsys):
    sf = _module()
    seen = []

    def worker(name, threads):
        seen.append((name, threads))
        g = 250.0 + 10 * len(seen)
        return {"gemm_ms": g, "attention_ms": 8.0, "adamw_ms": 2.0, "floor_ms": g + 10.0, "attention_gflop": 3.2,
                "adamw_bytes": 198_704_128, "tokens_per_step": 2048, "matmul_peak_gflops": 250.0, "stream_gbps": 40.0}

    monkeypatch.setattr(sf, "run_worker", worker)
    assert sf.main(["--config", "all", "--rounds", "2", "--threads", "2"]) == 0
    assert seen == [("bench", 2), ("bench", 2), ("small", 2), ("small", 2)]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("bench: floor 270.0 ms per step = 7585 tok/s: GEMMs 260.0 ms (MKL)")
    assert "AdamW 2.0 ms (199 MB at 40.0 GB/s)" in lines[0]
    assert lines[1] == "  per round: 270.0, 280.0 ms; median 275.0 ms"
    assert lines[2].startswith("small: floor 290.0 ms") and len(lines) == 4
