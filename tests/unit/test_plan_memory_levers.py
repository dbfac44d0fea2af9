"""`pretrain-cli plan`'s memory model: every memory lever (sharding, recompute, flash attention, precision, tensor
parallelism, document masking, the fused head + loss, more devices) moves the estimate the right way, and the
suggestions built from them are ranked and each reduces it (the command itself: test_plan.py)."""
import dataclasses
import json
import subprocess
import sys

import pytest

from pretrain_cli.cli import main as cli_main
from plan_helpers import fit, plan


def test_suggestions_ranked_and_each_reduces(write_args):
    # the logits path: ZeRO-2/3 run on the semi-auto engine, which keeps the logits, so with the fused loss in the
    # base plan, sharding would trade its saving for the logits here and is rightly not suggested
    cfg = write_args(per_device_train_batch_size=8, sharding="", use_fused_linear_cross_entropy=False)
    r = plan(cfg, device="T4", gpus=2)
    assert not r["fits"]
    sugg = r["suggestions"]
    assert len(sugg) >= 3
    saves = [s["saves_gib"] for s in sugg if "all of the above" not in s["why"]]
    assert saves == sorted(saves, reverse=True)
    keys = {k for s in sugg for k in s["change"]}
    assert {"recompute", "per_device_train_batch_size", "sharding", "max_seq_length"} <= keys
    for s in sugg:
        extra = [tok for k, v in s["change"].items() for tok in (f"--{k}", json.dumps(v) if isinstance(v, bool) else str(v))]
        again = plan(cfg, extra, device="T4", gpus=2, suggest_changes=False)
        assert again["memory_gib"] == pytest.approx(s["memory_gib"])
        assert again["memory_gib"] < r["memory_gib"]
    mb = next(s for s in sugg if "per_device_train_batch_size" in s["change"])["change"]
    assert mb["per_device_train_batch_size"] * mb["gradient_accumulation_steps"] == 8  # global batch kept


def test_flash_suggested_on_ampere_only(write_args):
    cfg = write_args(per_device_train_batch_size=16, max_seq_length=4096)
    on_a10 = plan(cfg, device="A10")
    assert any("use_flash_attention" in s["change"] for s in on_a10["suggestions"])
    on_t4 = plan(cfg, device="T4")
    assert not any("use_flash_attention" in s["change"] for s in on_t4["suggestions"])


def test_sharding_divides_optimizer_state(write_args):
    plain = plan(write_args(sharding=""), device="A100-80GB", gpus=4)["memory_breakdown_gib"]
    s1 = plan(write_args(sharding="stage1"), device="A100-80GB", gpus=4)["memory_breakdown_gib"]
    s3 = plan(write_args(sharding="stage3"), device="A100-80GB", gpus=4)["memory_breakdown_gib"]
    assert s1["optimizer_state"] == pytest.approx(plain["optimizer_state"] / 4)
    assert s1["master_weights"] == pytest.approx(plain["master_weights"] / 4)
    assert s1["gradients"] == pytest.approx(plain["gradients"])
    assert s3["gradients"] == pytest.approx(plain["gradients"] / 4)
    assert s3["weights"] == pytest.approx(plain["weights"] / 4)
    one_gpu = plan(write_args(sharding="stage1"), device="A100-80GB", gpus=1)["memory_breakdown_gib"]
    assert one_gpu["optimizer_state"] == pytest.approx(plain["optimizer_state"])  # dropped on one process


@pytest.mark.parametrize("granularity", ["full", "full_attn", "core_attn"])
def test_recompute_lowers_activations(write_args, granularity):
    off = plan(write_args(), device="A100-80GB")
    on = plan(write_args(recompute=True, recompute_granularity=granularity), device="A100-80GB")
    assert on["memory_breakdown_gib"]["activations"] < off["memory_breakdown_gib"]["activations"]
    assert on["memory_gib"] < off["memory_gib"]
    assert on["flops_per_token"]["hardware"] > on["flops_per_token"]["model"] == off["flops_per_token"]["model"]


def test_flash_and_precision_levers(write_args):
    math = plan(write_args(bf16=True, fp16=False), device="A100-80GB")
    flash = plan(write_args(bf16=True, fp16=False, use_flash_attention=True), device="A100-80GB")
    assert flash["memory_breakdown_gib"]["activations"] < math["memory_breakdown_gib"]["activations"]
    fp32 = plan(write_args(fp16=False), device="A100-80GB")
    assert fp32["precision"]["amp_dtype"] == "float32" and fp32["memory_breakdown_gib"]["master_weights"] == 0
    assert fp32["mfu"] == 0.30 and fp32["device"]["peak_tflops"] == 19.5


def test_llama_8gpu_tensor_parallel(tmp_path):
    args = {"model_name_or_path": "meta-llama/Meta-Llama-3-8B", "input_dir": str(tmp_path / "d"),
            "output_dir": str(tmp_path / "o"), "do_train": True, "max_steps": 10000,
            "per_device_train_batch_size": 1, "gradient_accumulation_steps": 16, "tensor_parallel_degree": 2,
            "sharding": "stage2", "bf16": True, "fp16_opt_level": "O2", "use_flash_attention": True,
            "use_fused_rms_norm": True, "use_fused_rope": True, "max_seq_length": 4096}
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(args))
    r = plan(str(path), device="A100-80GB", gpus=8)
    assert r["parallel"] == {"world": 8, "dp": 1, "sharding_stage": 2, "sharding_degree": 4, "tp": 2,
                             "data_ranks": 4, "pp": 1, "pipeline_bubble": 0.0, "cp": 1, "sequence_parallel": False,
                             "ep": 1, "vpp": 1}
    assert r["tokens_per_step"] == 262_144
    assert r["flops_per_token"]["model"] == pytest.approx(5.147e10, rel=1e-3)
    assert not any("not supported" in n for n in r["notes"])  # train runs this layout: nothing to warn about
    whole = (32 * 2 + 1) * 4096  # the RMSNorms, whole on each tp rank (`models.tp_plan`); the rest ÷ tp 2
    n = ((r["params"]["total"] - whole) / 2 + whole) / 2**30
    assert r["memory_breakdown_gib"]["weights"] == pytest.approx(2 * n)
    assert r["fits"]


def test_a_model_no_single_device_holds_gets_more_devices_first(write_args, capsys):
    """Llama-3-8B at 2,048 tokens without sharding needs 147 GiB on one A100-80GB: the first suggestion is the fewest
    devices that fit within `plan --fit`'s budget (80 GiB less its 10 % margin) and the keys needed there, the
    answer --fit gives too; each key is needed there."""
    cfg = write_args(model_name_or_path="meta-llama/Meta-Llama-3-8B", bf16=True, fp16=False, sharding="",
                     max_seq_length=2048, use_flash_attention=True)
    r = plan(cfg, device="A100-80GB")
    assert not r["fits"] and not any(s["fits"] for s in r["suggestions"][1:])
    first = r["suggestions"][0]
    assert first["fits"] and first["gpus"] >= 2 and first["change"]
    more = fit(cfg, device="A100-80GB")["more_devices"]
    assert (more["gpus"], more["change"]) == (first["gpus"], first["change"])

    def within(change: dict, gpus: int) -> bool:
        extra = [t for k, v in change.items() for t in (f"--{k}", json.dumps(v) if isinstance(v, bool) else str(v))]
        p = plan(cfg, extra, device="A100-80GB", gpus=gpus, suggest_changes=False)
        return max(p["memory_gib"], p["startup_gib"], p["eval_least_gib"] or 0.0) <= 72.0

    assert within(first["change"], first["gpus"])
    assert not any(within({k: v for k, v in first["change"].items() if k != key}, first["gpus"])
                   for key in first["change"])
    assert cli_main(["plan", cfg]) == 0
    assert f"  1. --gpus {first['gpus']} with " in capsys.readouterr().out
    assert "--peak_tflops" in subprocess.run([sys.executable, "-m", "pretrain_cli", "plan", "--help"],
                                             capture_output=True, text=True, timeout=60).stdout


def test_document_masking_is_planned_per_attention_path(write_args, capsys):
    """The math path adds the shared [b, 1, s, s] mask (growing with s²); the CPU kernel keeps the same
    probabilities as causal; flashmask adds only per-token inputs. FLOPs (and so MFU) stay those of causal."""
    def parts(mask, target="A100-80GB", **kw):
        r = plan(write_args(attention_mask_type=mask, fp16=False, bf16=True, **kw), device=target,
                 suggest_changes=False)
        return r, r["memory_breakdown_gib"]

    causal, c = parts("causal", use_flash_attention=False)
    doc, d = parts("document", use_flash_attention=False)
    assert "document_mask" not in c and doc["attention_mask_type"] == "document"
    assert d["document_mask"] * 2**30 >= 4 * 1024 * 1024  # the fp32 mask of one 1024-token sample
    assert doc["memory_gib"] - causal["memory_gib"] == pytest.approx(d["document_mask"] * 1.05)  # + fragmentation
    assert doc["flops_per_token"] == causal["flops_per_token"]
    _, flash = parts("document", use_flash_attention=True, use_fused_rope=True)
    assert flash["document_mask"] * 2**30 < 64 * 1024  # int64 doc_start/position_ids, int32 bounds
    _, cpu_doc = parts("document", "cpu", use_flash_attention=True)
    _, cpu_causal = parts("causal", "cpu", use_flash_attention=True)
    assert cpu_doc["activations"] == cpu_causal["activations"]  # the CPU kernel saves time, not memory
    assert cpu_doc["document_mask"] * 2**30 < 1024 * 1024  # no s² term: doc_start, position_ids, RoPE rows
    assert cli_main(["plan", write_args(attention_mask_type="document"), "--device", "A100-80GB"]) == 0
    text = capsys.readouterr().out
    assert "document mask" in text and "document masking does less attention than counted" in text


def test_qwen3_q_k_norms_add_parameters_and_activations(write_args):
    qwen3 = plan(write_args(model_name_or_path="Qwen/Qwen3-0.6B"), device="A100-80GB", suggest_changes=False)
    assert qwen3["model"]["model_type"] == "qwen3" and qwen3["params"]["total"] == 596_049_920
    from pretrain_cli.config.presets import PRESET_DIR
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.planning.activations import activation_bytes
    from pretrain_cli.planning.memory import Setup

    cfg = ModelConfig.from_file(str(PRESET_DIR / "qwen3-0.6b"))
    as_llama = ModelConfig(**{**cfg.__dict__, "model_type": "llama", "extra": {}})  # same shape, no q/k norms
    assert activation_bytes(Setup(cfg, 1, 1024)) > activation_bytes(Setup(as_llama, 1, 1024))


def test_the_cpu_attention_kernels_probabilities_are_planned_at_their_size():
    """On CPU, `use_flash_attention` (the block kernel) keeps per layer head-major q, k, v and the probabilities of
    each 64-row query block's keys: 4·heads·attention_probs_per_head(s, s) bytes per sample (docs/PLAN.md),
    about half of the [heads, s, s] scores at 4096 tokens."""
    from pretrain_cli.config.presets import PRESET_DIR
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.ops.cpu_ops import attention_probs_per_head
    from pretrain_cli.planning.activations import _parts_per_token, attention_widths
    from pretrain_cli.planning.memory import Setup

    cfg = ModelConfig.from_file(str(PRESET_DIR / "qwen3-0.6b"))
    h, kv = attention_widths(cfg)
    for s in (256, 4096):
        core = _parts_per_token(Setup(cfg, 1, s, attention="flash", device="cpu"))["core"]
        probs = 4 * cfg.num_attention_heads * attention_probs_per_head(s, s)
        assert core * s == pytest.approx(4 * (h + 2 * kv) * s + probs)
    assert 0.71 < attention_probs_per_head(256, 256) / 256**2 < 0.72  # docs/PERFORMANCE.md §3.3: 72 % and 52 %
    assert 0.51 < attention_probs_per_head(4096, 4096) / 4096**2 < 0.52


def test_fused_loss_replaces_the_logits_term_wherever_the_lm_head_is_whole(write_args):
    """Qwen's 151,936-token vocabulary at 4 x 2048 tokens: the [b, s, V] logits (fp16 + fp32 copy + fp32 grad +
    fp16 grad) are ~11.6 GiB; the fused head + loss keeps dh, the fp32 dW buffers and one chunk instead, on one
    device, under ZeRO-2/3 and under the layout steps' tensor parallelism (the head whole on each tp rank: inside
    pipeline stages, with sequence or context parallelism) alike. Only a vocabulary-split head (semi-auto tp, which
    divides the vocabulary) keeps the logits, ÷ tp."""
    shape = dict(per_device_train_batch_size=4, max_seq_length=2048)
    fused = plan(write_args(**shape), device="A100-80GB")["memory_breakdown_gib"]["logits_loss"]
    unfused = plan(write_args(**shape, use_fused_linear_cross_entropy=False),
                   device="A100-80GB")["memory_breakdown_gib"]["logits_loss"]
    assert unfused == pytest.approx(8192 * 151936 * (2 + 4 + 4 + 2) / 2**30, rel=1e-3)
    assert fused < 2.0 < 11.0 < unfused
    tp = [plan(write_args(**shape, tensor_parallel_degree=2, use_fused_linear_cross_entropy=f), device="A100-80GB",
               gpus=2)["memory_breakdown_gib"]["logits_loss"] for f in (True, False)]
    assert tp[0] == tp[1] == pytest.approx(unfused / 2, rel=1e-3)
    zero3 = plan(write_args(**shape, sharding="stage3"), device="A100-80GB", gpus=2)["memory_breakdown_gib"]
    assert zero3["logits_loss"] == pytest.approx(fused, rel=1e-3)  # the same per-device term as one device
    # (gpus, keys, tokens per rank as a share of the sequence): the whole head on each tp rank; cp's tokens ÷ 2
    whole = [(4, dict(pipeline_parallel_degree=2), 1), (2, dict(sequence_parallel=True), 1),
             (4, dict(context_parallel_degree=2), 2)]
    for gpus, keys, cp in whole:
        got = [plan(write_args(**shape, **keys, tensor_parallel_degree=2, use_fused_linear_cross_entropy=f),
                    device="A100-80GB", gpus=gpus)["memory_breakdown_gib"]["logits_loss"] for f in (True, False)]
        assert got[0] < 2.0 and got[0] == pytest.approx(fused, rel=0.01), keys  # dW dominates: (almost) as one device
        assert got[1] == pytest.approx(unfused / cp, rel=1e-3), keys  # unfused: every rank's whole logits


def test_a_vocabulary_tp_does_not_divide_stays_whole_in_plan_and_train():
    """`config.resolve` decides whether tensor parallelism splits the vocabulary; the semi-auto layout `train`
    builds and the memory model `plan` reports both read that one decision (513 = 2 x 256 + 1 stays whole)."""
    import dataclasses

    from run_helpers import model_config, resolve_run

    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.run_config import Target
    from pretrain_cli.distributed.strategies.semi_auto import SemiAuto
    from pretrain_cli.models.flops import param_counts
    from pretrain_cli.planning.memory import estimate
    from pretrain_cli.planning.plan import Device, setup_for

    even = model_config()
    odd = dataclasses.replace(even, vocab_size=even.vocab_size + 1)
    args = parse_config(None, ["--output_dir", "o", "--input_dir", "d", "--do_train", "--max_steps", "5",
                               "--device", "cpu", "--tensor_parallel_degree", "2"])
    held = {}
    for cfg in (even, odd):
        run = resolve(args, cfg, Target("cpu", 2))
        split = cfg is even
        assert run.parallel.vocab_parallel is split and SemiAuto(run.parallel, "cpu").vocab is split
        assert any("does not divide vocab_size 513" in n for n in run.notes) is not split
        setup = setup_for(run, cfg, Device(None, 64.0))
        assert setup.vocab_parallel is split
        held[split] = estimate(setup)["weights"] / 4  # fp32 parameters on one rank
        counts = param_counts(cfg)  # micro-qwen2 ties its head: the embedding is the only vocabulary weight
        whole = (2 * cfg.num_hidden_layers + 1) * cfg.hidden_size  # the RMSNorms, whole on each tp rank
        body = (counts["total"] - counts["embedding"] - whole) / 2 + whole
        assert held[split] == pytest.approx(body + counts["embedding"] / (2 if split else 1))
    assert resolve_run().parallel.vocab_parallel is False  # one process: nothing to split


@pytest.mark.parametrize("fused_loss", [True, False])
def test_zero3_on_cpu_shards_the_gradients_no_matmul_reads_its_weight_for(write_args, fused_loss):
    """On CPU (gloo) ZeRO-3 keeps whole the gradients of the weights a matmul reads as they are (attention, down
    projection, the unfused LM head: all-reduced whole) and dp shards of the embedding's, the packed gate|up's and
    the fused head + loss's head (measured: benchmarks/plan_calibration.py --layouts, docs/PLAN.md)."""
    keys = dict(model_name_or_path="tiny-llama", fp16=False, fp16_opt_level="O1", sharding="stage3",
                use_fused_linear_cross_entropy=fused_loss)
    r = plan(write_args(**keys), device="cpu", gpus=2, baseline_bytes=0)
    h, inter, layers, vocab = 128, 352, 4, 2048  # the preset's config.json
    sharded = vocab * h * (2 if fused_loss else 1) + layers * 2 * h * inter
    whole = r["params"]["total"] - sharded
    assert r["memory_breakdown_gib"]["gradients"] * 2**30 == pytest.approx(4 * (whole + sharded / 2))
    gpu = plan(write_args(**keys), device="A100-80GB", gpus=2)  # NCCL reduce-scatters every gradient
    assert gpu["memory_breakdown_gib"]["gradients"] * 2**30 == pytest.approx(4 * r["params"]["total"] / 2)


def test_o1_keeps_no_half_cast_of_the_packed_gate_up_but_semi_auto_zero3_keeps_the_concatenation():
    """The dense MLP's gate|up GEMM (`ops.grouped_gemm_layer.PackedGemm`) keeps x and its two fp32 weights, not the
    half cast of their concatenation O1's matmul kept: widening the MLP by dI adds, per layer, 3·h·dI parameters
    (fp32: 12 bytes each) and the half casts only of the down projection (2·h·dI: 2 bytes of h·dI), 14·h·dI in
    all; planned 18·h·dI before (the gate and up casts too). Under the semi-auto engine's ZeRO-3 the gate_up kernel
    keeps the gathered `[hidden, 2·inter]` concatenation instead (`distributed.steps.local_kernels`), in the
    weights' dtype at O2 (2·2·h·dI a layer more in `gathered_weights`), and at O1 its half cast (every weight's)."""
    from pretrain_cli.config.presets import resolve_model_dir
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.planning.memory import Setup, estimate

    cfg = ModelConfig.from_file(str(resolve_model_dir("tiny-llama")))
    h, layers, d_inter = cfg.hidden_size, cfg.num_hidden_layers, 64
    wide = dataclasses.replace(cfg, intermediate_size=cfg.intermediate_size + d_inter)

    def delta(part, **kw):
        s = Setup(model=cfg, micro_batch=1, seq_len=64, compute_bytes=2, **kw)
        return estimate(dataclasses.replace(s, model=wide))[part] - estimate(s)[part]

    assert delta("weights", amp_level="O1") == 14 * h * d_inter * layers
    zero3 = dict(sharding_stage=3, sharding_degree=2, distributed_tensors=True)
    assert delta("gathered_weights", amp_level="O2", **zero3) == 2 * 2 * h * d_inter * layers
    assert delta("weights", amp_level="O1", **zero3) == (4 * 3 / 2 + 2 * 3) * h * d_inter * layers
