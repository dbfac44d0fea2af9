"""Context parallelism in one process: the per-block attention with its log-sum-exp (ops/block_attention.py), the
load-balanced split (distributed/steps/context.py), the keys (config/context.py) and what `plan` models for it.
The multi-process attention and training: tests/distributed/test_context.py."""
import json
from pathlib import Path

import numpy as np
import pytest

import gpu_emulation as emu
from plan_helpers import fit, plan
from pretrain_cli.distributed.steps.context import chunks_of, local_positions
from pretrain_cli.errors import UserError

REPO = Path(__file__).resolve().parents[2]
LLAMA_128K = {"model_name_or_path": "llama-3.1-8b", "input_dir": "./data", "output_dir": "./out",
              "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "max_seq_length": 131072,
              "bf16": True, "fp16_opt_level": "O2", "use_flash_attention": True, "max_steps": 1000, "do_train": True}


def _qkv(seed=0, b=2, s=12, nh=4, nkv=2, d=8):
    from pretrain_cli import runtime

    paddle = runtime.import_paddle()
    rng = np.random.default_rng(seed)
    q = paddle.to_tensor(rng.standard_normal((b, s, nh, d)).astype("float32"), stop_gradient=False)
    k = paddle.to_tensor(rng.standard_normal((b, s, nkv, d)).astype("float32"), stop_gradient=False)
    v = paddle.to_tensor(rng.standard_normal((b, s, nkv, d)).astype("float32"), stop_gradient=False)
    return paddle, q, k, v


def _heads(x, n_kv):
    b, s, h, d = x.shape
    return x.transpose([0, 2, 1, 3]).reshape([b, n_kv, h // n_kv, s, d])


def test_blocks_merged_by_log_sum_exp_equal_attention_over_all_keys_and_the_backward_is_autograds():
    from pretrain_cli.ops.attention import attention_math
    from pretrain_cli.ops.block_attention import block_backward, block_forward, merge

    paddle, q, k, v = _qkv()
    ref = attention_math(q, k, v)  # [2, 12, 4, 8], causal
    dout = paddle.to_tensor(np.random.default_rng(1).standard_normal(ref.shape).astype("float32"))
    (ref * dout).sum().backward()
    qh, kh, vh = _heads(q, 2), _heads(k, 2), _heads(v, 2)
    # queries 6..11 against keys 0..5 (all visible) and keys 6..11 (the causal diagonal), merged
    tri = paddle.tril(paddle.ones([6, 6], dtype="bool")).reshape([1, 1, 1, 6, 6])
    qs = qh[:, :, :, 6:]
    parts = [(kh[:, :, :, :6], vh[:, :, :, :6], None), (kh[:, :, :, 6:], vh[:, :, :, 6:], tri)]
    out = lse = None
    for kb, vb, vis in parts:
        out, lse = merge(out, lse, *block_forward(qs, kb, vb, vis, vis is not None))
    want = _heads(ref, 2)[:, :, :, 6:]
    assert float((out - want).abs().max()) < 1e-6
    # the backward of each block from the merged output and lse: dQ is autograd's; dK/dV are each block's share
    dq = 0
    doh = _heads(dout, 2)[:, :, :, 6:]
    for kb, vb, vis in parts:
        g_q, _, _ = block_backward(qs, kb, vb, out, lse, doh, vis)
        dq = dq + g_q
    assert float((dq - _heads(q.grad, 2)[:, :, :, 6:]).abs().max()) < 1e-5


def test_a_row_that_sees_no_key_of_a_block_weighs_nothing_in_the_merge():
    from pretrain_cli.ops.block_attention import block_forward, merge

    paddle, q, k, v = _qkv()
    qh, kh, vh = _heads(q, 2), _heads(k, 2), _heads(v, 2)
    hidden = paddle.zeros([1, 1, 1, 12, 12], dtype="bool")  # another document: nothing visible
    out_h, lse_h = block_forward(qh, kh, vh, hidden)
    assert bool(paddle.isinf(lse_h).all()) and float(out_h.abs().max()) == 0.0
    out_a, lse_a = block_forward(qh, kh, vh)
    out, lse = merge(out_h, lse_h, out_a, lse_a)
    assert float((out - out_a).abs().max()) == 0.0 and not bool(paddle.isnan(out).any())


def test_half_precision_blocks_score_in_fp32_as_flash_attention_does():
    """bf16 q and k (scores of 16-32, where bf16's spacing is 0.125): the block's scores are the fp32 product of
    the bf16 values, the precision of the fp32 lse a flash block returns, not a bf16 product cast afterwards."""
    from pretrain_cli.ops.block_attention import _scores

    paddle, q, k, _ = _qkv(d=32)
    qh, kh = _heads(q * 5, 2).astype("bfloat16"), _heads(k * 5, 2)[:, :, :1].astype("bfloat16")
    got = _scores(qh, kh, None)
    want = np.matmul(qh.astype("float32").numpy(), np.swapaxes(kh.astype("float32").numpy(), -1, -2)) / np.sqrt(32)
    assert got.dtype == paddle.float32 and float(np.abs(want).max()) > 16
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-5)


def test_ring_attention_runs_flash_blocks_only_where_the_run_chose_flash(monkeypatch):
    """A GPU before Ampere (or an fp32 run) resolves `attention: math`; the flash-attn kernel refuses to run there,
    so the context-parallel blocks take the materialised path too."""
    from pretrain_cli.ops import gpu_attention, kernels
    from pretrain_cli.run_config import KernelConfig

    monkeypatch.setattr(kernels, "_gpu_available", lambda device: True)
    flash = kernels.select(KernelConfig(attention="flash", rms_norm="reference", rope="reference"), "gpu")
    math_ = kernels.select(KernelConfig(attention="math", rms_norm="reference", rope="reference"), "gpu")
    assert (flash.attention_block_name, flash.attention_block) == ("flash", gpu_attention.block_forward_flash)
    assert (math_.attention_block_name, math_.attention_block) == ("reference", kernels.block_forward)


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_load_balanced_split_covers_the_sequence_once_with_equal_causal_work(cp):
    seq = 64
    held = [local_positions(seq, cp, r) for r in range(cp)]
    assert sorted(np.concatenate(held).tolist()) == list(range(seq))
    assert [chunks_of(cp, r) for r in range(cp)] == [(r, 2 * cp - 1 - r) for r in range(cp)]
    work = [int((pos + 1).sum()) for pos in held]  # keys each rank's queries see under the causal mask
    assert len(set(work)) == 1, work


def _resolve(world, **keys):
    from run_helpers import resolve_run

    return resolve_run(*[tok for k, v in keys.items() for tok in (f"--{k}", str(v))], world=world)


def test_context_parallelism_resolves_with_tensor_and_pipeline_parallelism_as_layout_steps():
    """cp x tp runs: the layout steps tp -> cp on fleet's groups (engine "tensor_parallel"), the embedding and
    LM head whole on every tp rank (the steps' Megatron split), with or without sequence parallelism; cp x pp:
    cp -> pp on the pipeline's engine."""
    from pretrain_cli.distributed.steps.order import steps_for

    def describe(parallel) -> str:
        return " -> ".join(s.name for s in steps_for(parallel))

    for sp in (False, True):
        p = _resolve(4, context_parallel_degree=2, tensor_parallel_degree=2, sequence_parallel=sp,
                     max_seq_length=128).parallel
        assert (p.cp_degree, p.tp_degree, p.dp_degree, p.engine, p.vocab_parallel) == (2, 2, 1, "tensor_parallel",
                                                                                        False)
        assert describe(p).startswith("tp -> cp")
    p = _resolve(4, context_parallel_degree=2, pipeline_parallel_degree=2, max_seq_length=128).parallel
    assert (p.cp_degree, p.pp_degree, p.engine) == (2, 2, "pipeline") and describe(p) == "cp -> recompute -> pp"


def test_context_parallel_degree_resolves_with_data_parallelism_and_zero1():
    run = _resolve(4, context_parallel_degree=2, max_seq_length=128)
    p = run.parallel
    assert (p.cp_degree, p.dp_degree, p.data_world_size, p.engine) == (2, 2, 2, "context_parallel")
    z = _resolve(2, context_parallel_degree=2, sharding="stage1", max_seq_length=128).parallel
    assert (z.sharding_stage, z.sharding_degree, z.data_world_size) == (1, 1, 1)  # ZeRO-1 over the 2 cp ranks
    z2 = _resolve(2, context_parallel_degree=2, sharding="stage2", max_seq_length=128).parallel
    assert (z2.engine, z2.sharding_stage) == ("context_parallel", 2)  # fleet's ZeRO-2 over the 2 cp ranks


@pytest.mark.parametrize("keys,message", [
    (dict(context_parallel_degree=2, tensor_parallel_degree=2, sharding="stage3"), "with ZeRO-3 is not supported"),
    (dict(context_parallel_degree=2, sharding="stage3"), "with ZeRO-3 is not supported"),
    (dict(context_parallel_degree=3), "does not divide the world size 4"),
    (dict(context_parallel_degree=4, max_seq_length=100), "divisible by 2 x 4"),
    (dict(sep_parallel_degree=2), "use context_parallel_degree: 2"),
])
def test_layouts_context_parallelism_does_not_run_are_refused_in_one_line(keys, message):
    with pytest.raises(UserError) as e:
        _resolve(4, **{"max_seq_length": 128, **keys})
    assert message in str(e.value) and "Traceback" not in str(e.value)


@pytest.mark.parametrize("world,keys,message", [
    (4, dict(context_parallel_degree=4, tensor_parallel_degree=2),
     "context_parallel_degree: 4 x tensor_parallel_degree 2 = 8 does not divide the world size 4"),
    (8, dict(context_parallel_degree=8, tensor_parallel_degree=2, pipeline_parallel_degree=2),
     "context_parallel_degree: 8 x tensor_parallel_degree 2 x pipeline_parallel_degree 2 = 32 does not divide"),
    (6, dict(context_parallel_degree=2, tensor_parallel_degree=2), "= 4 does not divide the world size 6"),
])
def test_a_context_degree_whose_product_with_tp_and_pp_does_not_divide_the_world_is_refused(world, keys, message):
    """cp divides the world, but not world / (pp x tp): once resolved to dp 0 (or dp 1 over 4 of 6 ranks) and
    died in Topology.of; now one line, for train, check and plan alike."""
    with pytest.raises(UserError) as e:
        _resolve(world, max_seq_length=128, **keys)
    assert message in str(e.value) and "Traceback" not in str(e.value)


def test_plan_models_each_rank_holding_a_share_of_the_sequence(tmp_path):
    path = tmp_path / "l.json"
    path.write_text(json.dumps(dict(LLAMA_128K, sharding="stage1", recompute=True)))
    one = plan(str(path), ["--max_seq_length", "16384"], device="H100", gpus=1, suggest_changes=False)
    cp8 = plan(str(path), ["--context_parallel_degree", "8"], device="H100", gpus=8, suggest_changes=False)
    assert cp8["parallel"]["cp"] == 8 and one["parallel"]["cp"] == 1
    # the same 16k tokens per device: activations alike but for ring attention's kept q, output and own K/V
    a1, a8 = one["memory_breakdown_gib"]["activations"], cp8["memory_breakdown_gib"]["activations"]
    assert a1 < a8 < 1.5 * a1
    assert cp8["memory_breakdown_gib"]["context_attention"] > 0 and "context_attention" not in one["memory_breakdown_gib"]
    # ZeRO-1 shards the optimizer state over the 8 cp ranks
    assert cp8["memory_breakdown_gib"]["optimizer_state"] == pytest.approx(8.03e9 * 8 / 8 / 2**30, rel=0.01)


def test_fit_recommends_context_parallelism_for_llama_8b_at_128k_over_tp_with_sequence_parallelism(tmp_path):
    """A context-parallel layout is the fastest that fits (tp 2 × cp 2 with sequence parallelism, a hair ahead of cp
    8 alone). Without context parallelism the layouts that fit are tensor parallel with sequence parallelism (tp 4, tp 8,
    tp 2/4 × pp 2, tp 2 × pp 4: the fused head + loss runs on the `tp` step's whole head, so no [131,072, 128,256]
    logits), all slower; with the loss unfused, no layout without CP fits (docs/DISTRIBUTED.md, "CP, SP or TP?")."""
    from pretrain_cli.planning import fit as fit_search

    path = tmp_path / "l.json"
    path.write_text(json.dumps(LLAMA_128K))
    f = fit(str(path), [], device="H100", gpus=8)
    assert f["after"] is not None and f["change"]["context_parallel_degree"] > 1, f["diff"]
    assert f["after"]["memory_gib"] <= f["budget_gib"]
    again = plan(str(path), [tok for k, val in f["change"].items() for tok in (f"--{k}", json.dumps(val)
                 if isinstance(val, bool) else str(val))], device="H100", gpus=8, suggest_changes=False)
    assert again["memory_gib"] == pytest.approx(f["after"]["memory_gib"])
    assert again["parallel"]["cp"] == f["change"]["context_parallel_degree"]
    from pretrain_cli.orchestration import planned
    from pretrain_cli.orchestration.opened import build_model_config
    from pretrain_cli.orchestration.prepare import load_arguments

    current = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "recompute": False,
               "recompute_granularity": "full", "use_flash_attention": True, "sharding": "",
               "tensor_parallel_degree": 1, "pipeline_parallel_degree": 1, "context_parallel_degree": 1}
    found = {}
    for fused in ("true", "false"):
        args = load_arguments(str(path), ["--use_fused_linear_cross_entropy", fused])
        cfg = build_model_config(args)[1]
        base = planned.plan(args, cfg, "H100", 8, suggest_changes=False)

        def replan(change, args=args, cfg=cfg):
            if change.get("context_parallel_degree", 1) > 1:
                return None
            try:
                return planned.plan(planned.with_changes(args, change), cfg, "H100", 8, suggest_changes=False)
            except UserError:  # a layout resolve refuses (as `fit`'s own replanner drops it)
                return None

        found[fused] = fit_search.search(current, base, replan, f["budget_gib"])
    best = found["true"]["best"]
    assert best is not None and best["report"].memory_gib <= f["budget_gib"]
    assert (best["change"]["tensor_parallel_degree"], best["change"]["sequence_parallel"]) == (4, True)
    assert best["report"].memory_breakdown_gib["logits_loss"] < 8  # dh, the fp32 dW, a chunk: not 188 GiB of logits
    assert best["speed"]["tokens_per_sec"] < f["after"]["speed"]["tokens_per_sec"]  # cp8 is faster
    unfused = found["false"]
    assert unfused["best"] is None and unfused["smallest"]["report"].memory_gib > f["budget_gib"]


def test_short_sequences_are_not_offered_context_parallelism():
    from pretrain_cli.planning.fit_candidates import CONTEXT_MIN_SEQ, candidates

    current = {"use_flash_attention": True, "sharding": "", "tensor_parallel_degree": 1,
               "pipeline_parallel_degree": 1, "context_parallel_degree": 1}
    assert not any("context_parallel_degree" in c for c in candidates(current, 8, 8, 4096))
    assert any(c.get("context_parallel_degree") == 8 for c in candidates(current, 8, 8, CONTEXT_MIN_SEQ))


def test_fit_tries_cp_with_tp_and_pp_for_a_dense_model_and_only_with_pp_for_moe():
    """`config.refusals` runs a dense model's cp with tp and a pipeline, a Mixture-of-Experts model's cp with a
    pipeline but not tp: the search proposes those products (it tried cp alone for a dense model before)."""
    from pretrain_cli.planning.fit_candidates import CONTEXT_MIN_SEQ, candidates

    current = {"use_flash_attention": True, "sharding": "", "tensor_parallel_degree": 1,
               "pipeline_parallel_degree": 1, "context_parallel_degree": 1}

    def products(experts):
        return {(c.get("tensor_parallel_degree", 1), c.get("pipeline_parallel_degree", 1), c["context_parallel_degree"])
                for c in candidates(current, 8, 8, CONTEXT_MIN_SEQ, experts) if "context_parallel_degree" in c}
    dense, moe = products(0), products(64)
    assert {(2, 1, 2), (1, 2, 2), (2, 2, 2), (4, 1, 2), (1, 4, 2), (2, 1, 4), (1, 2, 4), (1, 1, 8)} <= dense
    assert all(tp * pp * cp <= 8 for tp, pp, cp in dense)
    assert moe == {(1, pp, cp) for cp in (2, 4, 8) for pp in (1, 2, 4, 8) if pp * cp <= 8}


def test_fit_offers_tp_x_pp_x_cp_for_llama_70b_at_32k_on_32_h100():
    """Llama-3.1-70B at 32K tokens on 32 H100 (the file's tp 8 × pp 4): tp 4 × pp 4 × cp 2 with sequence parallelism
    is the fastest layout that fits (12,069 tokens/s planned); trying cp alone, the search's best was tp 8 × pp 2 ×
    2 data ranks with sequence parallelism (11,886)."""
    f = fit(str(REPO / "configs" / "llama-3.1-70b_pretrain.json"),
            ["--max_seq_length", "32768"], device="H100", gpus=32)
    assert f["after"]["memory_gib"] <= f["budget_gib"]
    assert f["change"] == {"tensor_parallel_degree": 4, "context_parallel_degree": 2, "sequence_parallel": True}
    assert f["after"]["speed"]["tokens_per_sec"] == pytest.approx(12069, rel=0.01)


def test_the_cp_axis_of_the_topology_holds_neighbours_that_read_one_batch():
    from pretrain_cli.distributed.layout.topology import Topology
    from pretrain_cli.run_layout import ParallelConfig

    ranks = [Topology.of(ParallelConfig(world_size=8, rank=r, dp_degree=2, sharding_degree=2, sharding_stage=1,
                                        cp_degree=2)) for r in range(8)]
    assert ranks[5].group("cp") == (4, 5) and ranks[0].groups("cp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [t.data_rank for t in ranks] == [0, 0, 1, 1, 2, 2, 3, 3] and ranks[0].data_world_size == 4
    # fleet's ZeRO-1 axis spans sharding x cp: 4 consecutive ranks inside each of the 2 data-parallel replicas
    assert ranks[0].fleet_hybrid_configs()["sharding_degree"] == 4
    assert ranks[5].replicas("sharding", "cp") == (1, 5)  # the owners of the same optimizer-state shard


def test_the_gpu_block_kernel_is_flash_attentions_output_and_log_sum_exp(monkeypatch):
    """`gpu_attention.block_forward_flash` (GPU only) against `block_forward`, with flash attention's op emulated in
    its place (tests/gpu_emulation.py: top-left causal alignment, fp16/bf16 only): full and causal blocks, a row tile's
    two pieces (the keys before it, full; its square diagonal, causal), bf16 in, fp32 lse out; a non-square causal
    block is refused, since the kernel would align it top-left."""
    import paddle

    from pretrain_cli.ops import gpu_attention
    from pretrain_cli.ops.block_attention import block_forward

    calls = []
    monkeypatch.setattr(paddle._C_ops, "flash_attn", lambda *a: calls.append(a[6]) or emu.ref_flash_attn(*a),
                        raising=False)
    _, q, k, v = _qkv(s=12)
    qh, kh, vh = (_heads(t, 2).astype("bfloat16") for t in (q, k, v))  # [2, 2, 2|1, 12, 8]
    tri = paddle.tril(paddle.ones([12, 12], dtype="bool")).reshape([1, 1, 1, 12, 12])
    # (query rows, keys, visible, causal): the whole block, the causal diagonal, rows 4..8 against keys 0..3 and 4..8
    for (r0, r1), (k0, k1), visible, causal in (((0, 12), (0, 12), None, False), ((0, 12), (0, 12), tri, True),
                                                ((4, 9), (0, 4), None, False), ((4, 9), (4, 9), tri[..., 4:9, 4:9], True)):
        qs, ks, vs = qh[:, :, :, r0:r1], kh[:, :, :, k0:k1], vh[:, :, :, k0:k1]
        got_out, got_lse = gpu_attention.block_forward_flash(qs, ks, vs, visible, causal)
        want_out, want_lse = block_forward(qs.astype("float32"), ks.astype("float32"), vs.astype("float32"), visible,
                                           causal)
        assert got_out.dtype == paddle.bfloat16 and got_lse.dtype == paddle.float32 and got_lse.shape == want_lse.shape
        assert float((got_out.astype("float32") - want_out).abs().max()) < 3e-2
        assert float((got_lse - want_lse).abs().max()) < 3e-2
    assert calls == [False, True, False, True]  # flash attention ran each block (causal where it is the diagonal)
    with pytest.raises(ValueError, match="must be square"):
        gpu_attention.block_forward_flash(qh[:, :, :, 4:9], kh[:, :, :, :9], vh[:, :, :, :9], tri[..., 4:9, :9], True)


def test_plan_ring_traffic_is_one_ranks_block_per_neighbour_exchange():
    """Ring attention's bytes per rank (`planning.context.context_traffic_bytes`): a forward passes (C-1)/C of the
    sequence's K/V (what full recompute adds), and C fp32 dK/dV blocks of one rank's tokens ride the backward."""
    from types import SimpleNamespace

    from pretrain_cli.planning.context import context_traffic_bytes

    model = SimpleNamespace(num_hidden_layers=3, num_key_value_heads=2, head_dim=8)
    kv = 1 * 4096 * 2 * 2 * 8  # the sequence's K and V elements, micro-batch 1
    for cp in (2, 4, 8):
        plain, again = (context_traffic_bytes(model, 1, 4096, cp, 2, r) for r in ("none", "full"))
        assert again - plain == pytest.approx(3 * (cp - 1) / cp * kv * 2)  # one more forward: bf16 K/V blocks
        assert plain == pytest.approx(3 * (2 * (cp - 1) / cp * kv * 2 + kv * 4))  # fwd + bwd K/V, fp32 dK/dV
        assert context_traffic_bytes(model, 1, 4096, cp, 2, "none", tp=2) == pytest.approx(plain / 2)  # its heads


def test_materialised_blocks_score_and_backpropagate_in_fp32_under_gpu_autocast(monkeypatch):
    """A block flash attention does not run (a document mask) under bf16 autocast, emulated (tests/gpu_emulation.py):
    the ring's forward runs inside the step's autocast, and a pipeline's schedule runs the backward there too, where
    a matmul is on AMP's white list. The scores' product and the backward's GEMMs must stay fp32 (autocast off, as
    flash keeps its lse fp32): before, the forward's lse came from bf16-rounded scores and the backward's GEMMs ran
    in bf16."""
    import paddle

    from pretrain_cli.ops.block_attention import block_backward, block_forward

    _, q, k, v = _qkv(s=12)
    qh, kh, vh = (_heads(t, 2).astype("bfloat16") for t in (q, k, v))  # [2, 2, 2|1, 12, 8]
    tri = paddle.tril(paddle.ones([12, 12], dtype="bool"))
    visible = paddle.logical_and(tri, paddle.arange(12).reshape([1, 12]) >= 5).reshape([1, 1, 1, 12, 12])
    visible = paddle.logical_or(visible, paddle.eye(12).astype("bool").reshape([1, 1, 1, 12, 12]))  # rows < 5: self
    f32 = [t.astype("float32") for t in (qh, kh, vh)]
    want_out, want_lse = block_forward(*f32, visible)
    dout = paddle.to_tensor(np.random.default_rng(4).standard_normal(want_out.shape).astype("float32"))
    want_grads = block_backward(*f32, want_out, want_lse, dout, visible)
    monkeypatch.setattr(paddle.amp, "auto_cast", emu.fake_auto_cast)
    monkeypatch.setattr(paddle, "matmul", emu.ref_matmul)
    emu.MATMULS.clear()
    with emu.fake_auto_cast(True, level="O2", dtype="bfloat16"):
        out, lse = block_forward(qh, kh, vh, visible)
        assert emu.MATMULS == [paddle.float32, paddle.bfloat16], emu.MATMULS  # the scores; p·V in bf16 as flash
        assert float((lse - want_lse).abs().max()) < 1e-5
        emu.MATMULS.clear()
        grads = block_backward(qh, kh, vh, want_out.astype("bfloat16"), want_lse, dout.astype("bfloat16"), visible)
    assert emu.MATMULS == [paddle.float32] * 5, emu.MATMULS
    for g, w in zip(grads, want_grads):
        assert float((g.astype("float32") - w).abs().max()) < 5e-2 * float(w.abs().max())  # inputs rounded to bf16
