"""What a new MoE user met in `plan --fit` (docs/MOE.md's walk): O2 where the file trains in bf16 at O1, a line
saying what bounds a layout whose traffic outweighs its compute, the evaluation's own peak (and a lower eval batch
where it does not fit), and the CPU ETA of a Mixture-of-Experts model at its measured MFU."""
import dataclasses
from pathlib import Path

from plan_helpers import fit, plan
from pretrain_cli.planning.fit_report import format_fit
from pretrain_cli.orchestration.planned import from_file
from pretrain_cli.planning.eval_memory import eval_parts, forward_bytes
from pretrain_cli.planning.memory import GIB, estimate
from pretrain_cli.planning.plan import MFU_FP32, MFU_HALF, MFU_MOE_CPU, setup_for, target_device

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "qwen3-moe-tiny_cpu.json")
DENSE_TINY = str(REPO / "configs" / "tiny_cpu.json")
QWEN3_30B = ["--model_name_or_path", "Qwen/Qwen3-30B-A3B", "--vocab_size", "151936", "--max_seq_length", "4096",
             "--bf16", "true"]
DSV3 = ["--model_name_or_path", "deepseek-ai/DeepSeek-V3", "--vocab_size", "129280", "--max_seq_length", "4096",
        "--bf16", "true"]


def test_fit_offers_o2_where_the_file_trains_bf16_at_o1():
    """Qwen3-30B-A3B on 8 H100, bf16 by the command line (O1 by default): O1's fastest layout is a pipeline of 2 at
    66,788 tokens/s; O2 fits with EP 8 + ZeRO-1, no pipeline, at 71,925. --fit names O2 among the changes, says what
    it is; a file naming O1 keeps it, with O2's figure in a note."""
    f = fit(TINY, QWEN3_30B, device="H100", gpus=8)
    assert f["diff"][0] == ("fp16_opt_level", "O1", "O2") and f["change"]["fp16_opt_level"] == "O2"
    assert round(f["after"]["speed"]["tokens_per_sec"]) == 71925
    assert f["change"]["expert_parallel_degree"] == 8 and "pipeline_parallel_degree" not in f["change"]
    (note,) = [n for n in f["notes"] if n.startswith("precision: fp16_opt_level O2")]
    assert "runs at 71,925 tokens/s, O1 (the file's, by default) runs at 66,788 tokens/s" in note
    kept = fit(TINY, [*QWEN3_30B, "--fp16_opt_level", "O1"], device="H100", gpus=8)
    assert "fp16_opt_level" not in kept["change"] and kept["change"]["pipeline_parallel_degree"] == 2
    assert round(kept["after"]["speed"]["tokens_per_sec"]) == 66788
    assert any("the file sets fp16_opt_level O1, so --fit keeps it" in n for n in kept["notes"])


def test_fit_needs_fewer_devices_for_deepseek_v3_at_o2():
    """DeepSeek-V3 at 4,096 tokens on 8 H100 fits nowhere: O1 needs 224 devices, O2 192, so --fit says 192 and that
    the count is O2's."""
    o1 = fit(TINY, [*DSV3, "--fp16_opt_level", "O1"], device="H100", gpus=8)
    f = fit(TINY, DSV3, device="H100", gpus=8)
    assert o1["after"] is None and o1["more_devices"]["gpus"] == 224
    assert f["after"] is None and f["more_devices"]["gpus"] == 192
    assert any("needs --gpus 192, O1 (the file's, by default) needs --gpus 224" in n for n in f["notes"])


def test_a_traffic_bound_layout_says_what_bounds_it():
    """DeepSeek-V3 on 256 H100: --fit's pick (tp 4 x ZeRO-3, O2) spends 91 % of its step sending, most of it the
    ZeRO-3 gathers and reduce-scatters over the cross-node link; the line says so with the mfu train would log. A
    layout whose compute outweighs its traffic gets no such line."""
    f = fit(TINY, DSV3, device="H100", gpus=256)
    (line,) = [x for x in format_fit(f).splitlines() if x.startswith("  speed bound:")]
    assert line.startswith("  speed bound: traffic, 91% of a 359 s step (ZeRO-3 gathers and reduce-scatters 317 s over "
                           "cross-node 50 GB/s, other traffic 10.1 s; compute 31.8 s): mfu as train logs it 0.027")
    assert len(line) < 240
    b = f["after"]["bound"]
    assert f"{b['logged_mfu']:.3f}" == "0.027"
    sp = f["after"]["speed"]
    assert b["traffic_share"] == sp["comm_seconds"] / sp["step_seconds"] > 0.5
    assert [t["term"] for t in b["terms"]][:2] == ["zero3", "tp"]
    assert fit(TINY, QWEN3_30B, device="H100", gpus=8)["after"]["bound"] is None  # compute-bound


def test_evaluation_peak_is_planned_with_its_own_batch():
    """The fitted Qwen3-30B-A3B file (pp 2, EP 4, ZeRO-1, micro-batch 1) keeps per_device_eval_batch_size 8 at
    4,096 tokens: its evaluation holds what the step leaves (O1's half casts gone: no backward) and one eval batch's
    forward, 76.36 GiB where the step needs 70.81. The forward grows with the eval batch, the held part does not;
    a run that does not evaluate plans none."""
    fitted = ["--pipeline_parallel_degree", "2", "--expert_parallel_degree", "4", "--sharding", "stage1",
              "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "16", "--recompute", "true"]
    r = from_file(TINY, [*QWEN3_30B, *fitted], device="H100", gpus=8, suggest_changes=False)
    assert round(r.memory_gib, 2) == 70.81 and r.eval_batch == 8 and round(r.eval_memory_gib, 2) == 76.36
    e = r.eval_breakdown_gib
    assert e["held"] < r.memory_gib - r.memory_breakdown_gib["activations"] - r.memory_breakdown_gib["logits_loss"]
    smaller = from_file(TINY, [*QWEN3_30B, *fitted, "--per_device_eval_batch_size", "4"], device="H100", gpus=8,
                        suggest_changes=False).eval_breakdown_gib
    assert smaller["held"] == e["held"] and abs(smaller["forward"] * 2 - e["forward"]) < 1e-6 * e["forward"]
    none = from_file(TINY, [*QWEN3_30B, *fitted, "--do_eval", "false"], device="H100", gpus=8, suggest_changes=False)
    assert none.eval_memory_gib is None and none.eval_batch == 0


def test_eval_forward_holds_the_unfused_logits_or_one_fused_chunk():
    """Without gradients the unfused head + loss holds the logits in the compute dtype, their fp32 copy and the
    softmax, [b, s, V] each; the fused one a chunk. On one process the eval's peak is what the step holds but its
    activations and loss, plus that forward."""
    run_args = [*QWEN3_30B, "--use_fused_linear_cross_entropy", "false"]
    r = from_file(TINY, run_args, device="H100", gpus=8, suggest_changes=False)
    from pretrain_cli.orchestration.planned import _resolved, parse

    args, cfg = parse(TINY, run_args)
    dev = target_device("H100", gpus=8)
    s = setup_for(_resolved(args, cfg, dev, 8), cfg, dev)
    e = dataclasses.replace(s, micro_batch=8, recompute=None, micro_batches=1)
    logits = 8 * 4096 * 151936 * (2 + 4 + 4)
    assert not s.fused_loss and forward_bytes(e) >= logits
    parts = eval_parts(s, 8, [estimate(s)])
    assert parts["forward"] == forward_bytes(e) and r.eval_memory_gib == sum(parts.values()) / GIB


def test_fit_lowers_the_eval_batch_that_does_not_fit():
    """--fit's pick for Qwen3-30B-A3B on 8 H100 leaves 8 eval samples over the 72 GiB budget: it lowers
    per_device_eval_batch_size to the largest under it (4) and raises eval_iters so an evaluation reads the file's
    192 samples (24 on each of its 8 data ranks, as the pick's); where the eval fits (do_eval off: none planned) no
    eval key changes."""
    f = fit(TINY, QWEN3_30B, device="H100", gpus=8)
    assert ("per_device_eval_batch_size", 8, 4) in f["diff"] and ("eval_iters", 3, 6) in f["diff"]
    assert f["eval"]["was"]["memory_gib"] > f["budget_gib"] >= f["eval"]["memory_gib"] and f["eval"]["fits"]
    quiet = fit(TINY, [*QWEN3_30B, "--do_eval", "false"], device="H100", gpus=8)
    assert quiet["eval"] is None and "per_device_eval_batch_size" not in quiet["change"]


def test_cpu_eta_of_a_moe_model_uses_its_measured_mfu():
    """On CPU a Mixture-of-Experts model is planned at its measured MFU (0.08: routing and the experts' small GEMMs
    set its step), a dense one at fp32's 0.30; --mfu wins; on a GPU the half-precision default stays."""
    moe = plan(TINY, device="cpu")
    assert moe["mfu"] == MFU_MOE_CPU == 0.08
    assert plan(DENSE_TINY, device="cpu")["mfu"] == MFU_FP32
    assert plan(TINY, device="cpu", mfu=0.2)["mfu"] == 0.2
    assert plan(TINY, QWEN3_30B, device="H100", gpus=8)["mfu"] == MFU_HALF
    assert moe["eta_hours"] * 60 > 1.5  # 200 steps: 1.7 min (they took 1.9 at this load), 0.5 at the dense MFU
