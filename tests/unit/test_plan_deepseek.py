"""`plan` for DeepSeek-V3's multi-token prediction module (`models/mtp.py`): its parameters outside the total, and its
share of every memory term, of the FLOPs and of a checkpoint, each equal to the plan with it less the plan without
it. (The worked examples of docs/PLAN.md, DeepSeek-V2-Lite's --fit among them: tests/unit/test_plan_doc.py.)"""
import dataclasses

import pytest

from pretrain_cli.config.presets import resolve_model_dir
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.flops import flops_per_token, param_counts
from pretrain_cli.planning.memory import Setup, checkpoint_bytes, estimate
from pretrain_cli.planning.plan import mtp_share

V3 = ModelConfig.from_file(str(resolve_model_dir("deepseek-ai/DeepSeek-V3")))
H, V, SEQ = V3.hidden_size, V3.vocab_size, 4096


def _setups(**kw):
    """(DeepSeek-V3, the same without its MTP module) under bf16 O2 with AdamW, one 4,096-token sequence."""
    s = Setup(model=V3, micro_batch=1, seq_len=SEQ, compute_bytes=2, amp_level="O2", attention="flash",
              fused_rms_norm=True, fused_rope=True, **kw)
    return s, dataclasses.replace(s, model=dataclasses.replace(V3, num_nextn_predict_layers=0))


def test_the_mtp_modules_parameters_are_counted_apart_from_the_total():
    """11.61 B of its own (DeepSeek-V3's README: 11.5 B of MTP module weights besides the 671 B main model), of
    which its sparse layer's 256 routed experts are 11.27 B; the embedding and LM head are the main model's."""
    c = param_counts(V3)
    assert c["total"] == 671_026_404_352 and c["mtp"] == 11_610_067_968
    assert c["mtp_experts"] == 256 * 3 * H * V3.moe_intermediate_size
    assert c["mtp_active"] == c["mtp"] - c["mtp_experts"] + 8 * 3 * H * V3.moe_intermediate_size


@pytest.mark.parametrize("ep,fused", [(64, True), (1, False)])
def test_every_memory_term_carries_the_mtp_module(ep, fused):
    c = param_counts(V3)
    with_mtp, bare = _setups(ep=ep, recompute="full", fused_loss=fused, dp_buffers=True)
    a, b = estimate(with_mtp), estimate(bare)
    # its parameters on this rank: the experts ÷ ep (whole without EP), the rest whole; 2 + 2 + 8 + 4 bytes each
    own = c["mtp"] - c["mtp_experts"] + c["mtp_experts"] / ep
    assert a["weights"] - b["weights"] == pytest.approx(2 * own)
    assert a["gradients"] - b["gradients"] == pytest.approx(2 * own)
    assert a["optimizer_state"] - b["optimizer_state"] == pytest.approx(8 * own)
    assert a["master_weights"] - b["master_weights"] == pytest.approx(4 * own)
    # DataParallel's buffers: all but the experts EP reduces over their own holders
    assert a["gradient_buffers"] - b["gradient_buffers"] == pytest.approx(2 * (own - (c["mtp_experts"] / ep
                                                                                       if ep > 1 else 0)))
    # its layer is not recomputed: at least a whole layer's working set, which full recompute redoes per layer
    from pretrain_cli.planning.activations import activation_parts
    from pretrain_cli.planning.experts import backward_bytes

    assert a["activations"] - b["activations"] > activation_parts(bare)[1] - backward_bytes(bare)
    # a second LM head + loss: the fused path's fp32 dW and dh, or the fp32 softmax its cross-entropy keeps (its
    # logits, their fp32 copy and the gradient's cast are live only as the main head's are: measured,
    # test_plan_calibration.py)
    head = 4 * V * H + SEQ * H * 2 if fused else SEQ * V * 4
    assert a["logits_loss"] - b["logits_loss"] == pytest.approx(head)
    assert checkpoint_bytes(with_mtp)["weights"] - checkpoint_bytes(bare)["weights"] == 2 * c["mtp"]


def test_plan_reports_the_mtp_share_of_flops_and_memory():
    s, bare = _setups(ep=64, recompute="full", fused_loss=True)
    parts, model_fpt = estimate(s), flops_per_token(V3, SEQ)
    share = mtp_share(s, SEQ, parts, model_fpt)
    c = param_counts(V3)
    # 6 x (its active parameters + the shared head's matmul) + one layer's attention, forward and backward
    flops = 6 * (c["mtp_active"] + V * H) + 6 * V3.num_attention_heads * (V3.qk_head_dim + V3.v_head_dim) * SEQ
    assert share["flops_per_token"] == pytest.approx(flops)
    assert share["flops_share"] == pytest.approx(flops / model_fpt) and 0.03 < share["flops_share"] < 0.04
    assert share["memory_gib"] * 2**30 == pytest.approx(sum(parts.values()) - sum(estimate(bare).values()))
    assert (share["modules"], share["first_layer"], share["params"]) == (1, 61, c["mtp"])
    no_mtp = dataclasses.replace(s, model=bare.model)
    assert mtp_share(no_mtp, SEQ, estimate(no_mtp), flops_per_token(bare.model, SEQ)) == {}


def test_a_pipelines_last_stage_holds_the_mtp_module_and_an_embedding_copy():
    """At pp 4 the last stage holds the MTP module's parameters (÷ ep for its experts) and a copy of the embedding
    its lookups read (`models.stages.last_stage_embeds`); the other stages hold what they held without it."""
    from pretrain_cli.planning.memory import mtp_params, stage_params

    with_mtp, bare = _setups(ep=8, pp=4)
    extra = [stage_params(with_mtp, st) - stage_params(bare, st) for st in range(4)]
    assert extra[:3] == [0, 0, 0]
    assert extra[3] == pytest.approx(sum(mtp_params(with_mtp)) + V * H)


@pytest.mark.parametrize("fused,recompute", [(True, "full"), (False, "full"), (False, None)])
def test_a_pipelines_last_stage_carries_the_mtp_modules_share_of_every_term(fused, recompute):
    """At pp 2 the last stage runs the MTP module in its loss (`pipeline_stages.StageLoss`): its bytes less the same
    stage's without the module are the one-process plan's MTP share term by term (one micro-batch in flight there, so
    the same activations and head + loss), its parameters' terms plus the embedding's copy; the first stage's are
    unchanged."""
    from pretrain_cli.planning.activations import mtp_activation_bytes, mtp_head_bytes
    from pretrain_cli.planning.memory import pipeline_stages

    kw = dict(ep=1, recompute=recompute, fused_loss=fused, micro_batches=8)
    with_mtp, bare = _setups(pp=2, **kw)
    one, one_bare = _setups(pp=1, **kw)
    first, last = [{k: a[k] - b[k] for k in a} for a, b in zip(pipeline_stages(with_mtp), pipeline_stages(bare))]
    share = {k: v - estimate(one_bare)[k] for k, v in estimate(one).items()}
    assert first == {k: 0 for k in first}
    assert last["activations"] == pytest.approx(share["activations"]) == pytest.approx(mtp_activation_bytes(one))
    assert last["logits_loss"] == pytest.approx(share["logits_loss"]) == pytest.approx(mtp_head_bytes(one))
    assert mtp_head_bytes(one) > 0 and mtp_activation_bytes(one) > 0
    copy = V * H  # the embedding's table on the last stage, for the MTP lookups (untied)
    for part, b in (("weights", 2), ("gradients", 2), ("optimizer_state", 8), ("master_weights", 4)):
        assert last[part] == pytest.approx(share[part] + b * copy)


def test_the_gpu_fused_loss_default_weighs_the_mtp_heads_under_a_pipeline_too():
    """`config.resolve`'s GPU default of the fused head + loss compares `head_loss_bytes` fused and unfused; the
    last stage of a pipeline holds the MTP heads as one process does, so the term is the same at pp 1 and pp 4."""
    from pretrain_cli.planning.activations import head_loss_bytes

    for fused in (True, False):
        s, _ = _setups(pp=4, fused_loss=fused, recompute="full", micro_batches=8)
        assert head_loss_bytes(s) == pytest.approx(head_loss_bytes(dataclasses.replace(s, pp=1)))


@pytest.mark.parametrize("preset", ["micro-deepseek-v3", "micro-qwen2-moe", "micro-qwen3-moe", "micro-qwen2"])
def test_what_tp_leaves_whole_is_what_the_tp_plan_leaves_whole_in_the_built_model(preset):
    """`param_counts`' "tp_whole" and "mtp_tp_whole" (what `plan` keeps whole on a tp rank: norms, routers, the
    shared-expert gate, MLA's latent down-projections) equal the built model's parameters the one TP plan does not
    split (`models.tp_plan.split_dim`), outside the embedding, LM head and final norm; DeepSeek's balancing bias is
    left out as `param_counts` leaves it (a buffer in transformers). A tp rank's whole model is then exactly the
    split parameters ÷ tp plus those."""
    from pretrain_cli import runtime

    runtime.import_paddle()
    from pretrain_cli.models import build_model
    from pretrain_cli.models.tp_plan import split_dim
    from pretrain_cli.run_config import MoeConfig

    cfg = ModelConfig.from_file(str(resolve_model_dir(preset)))
    model = build_model(cfg, None, MoeConfig())
    L = cfg.num_hidden_layers
    decoder = mtp = 0
    for name, p in model.named_parameters():
        if not name.startswith("model.layers.") or name.endswith("e_score_correction_bias") or split_dim(name) is not None:
            continue
        if int(name.split(".")[2]) < L:
            decoder += p.size
        else:
            mtp += p.size
    c = param_counts(cfg)
    assert (c["tp_whole"], c["mtp_tp_whole"]) == (decoder, mtp)
    # beyond the two RMSNorms a layer: a MoE model's routers (and Qwen2-MoE's shared-expert gate), MLA's latents
    assert decoder > 2 * L * cfg.hidden_size if cfg.num_experts else decoder == 2 * L * cfg.hidden_size
    if cfg.mla:  # the latents' down-projections, whole: q_a_proj and kv_a_proj_with_mqa on each layer
        assert decoder > L * cfg.hidden_size * (cfg.q_lora_rank + cfg.kv_lora_rank) and mtp > 0


@pytest.mark.parametrize("ep,fused,pp", [(1, False, 1), (1, True, 1), (64, False, 1), (1, False, 2), (1, True, 2)])
def test_o1_keeps_a_half_cast_of_every_weight_a_matmul_reads_the_mtp_modules_too(ep, fused, pp):
    """O1 autocast casts each weight a matmul reads and keeps the cast for backward (Paddle caches no casts): on
    the rank (or the pipeline's last stage) running the MTP module, its own weights' casts, and unfused the LM
    head's again per depth; never an untied embedding's (looked up) or the fused head + loss's head, nor a routed
    expert's (their GEMMs keep the parameters and cast again in backward: `ops.grouped_gemm_layer.StackedGemm`), nor
    a dense MLP's or shared expert's gate and up (`PackedGemm` likewise: `memory.packed_gate_up`, the MTP layer's
    shared experts too). Before, the MTP module's weights were left out and every routed expert of the model counted
    on each rank; and the gate|up casts counted after the packed GEMM stopped keeping them (d60dd5e)."""
    from pretrain_cli.planning.memory import (_device_params, mtp_params, packed_gate_up, pipeline_stages,
                                              stage_experts, stage_params)

    def o1(s):
        return dataclasses.replace(s, compute_bytes=2, amp_level="O1")

    with_mtp, bare = (o1(x) for x in _setups(ep=ep, fused_loss=fused, pp=pp, recompute="full", micro_batches=8))
    parts = (lambda s: pipeline_stages(s)[-1]) if pp > 1 else estimate
    own, routed = sum(mtp_params(with_mtp)), mtp_params(with_mtp)[1]
    head = 0 if fused else 2 * V * H  # its head's cast of the LM head weight
    copy = 4 * V * H if pp > 1 else 0  # the last stage's fp32 copy of the embedding (untied: looked up, no cast)
    gate_up = packed_gate_up(with_mtp, pp - 1) - packed_gate_up(bare, pp - 1)  # the MTP layer's shared experts'
    assert gate_up > 0
    assert parts(with_mtp)["weights"] - parts(bare)["weights"] == pytest.approx(4 * own + 2 * (own - routed - gate_up)
                                                                                + head + copy)
    # the whole: fp32 weights and a half cast of all but the looked-up table (the embedding or, at pp 2, the last
    # stage's copy of it), a fused head and the routed experts
    held = stage_params(with_mtp, pp - 1) if pp > 1 else _device_params(with_mtp)
    looked_up = V * H * (1 + fused)
    experts = stage_experts(with_mtp, pp - 1)
    gate_up = packed_gate_up(with_mtp, pp - 1)
    assert parts(with_mtp)["weights"] == pytest.approx(4 * held + 2 * (held - looked_up - experts - gate_up) + head)
