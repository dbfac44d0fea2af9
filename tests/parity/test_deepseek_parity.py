"""DeepSeek-V2/V3 against HF transformers' DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (torch, CPU fp32):
full logits, the product's loss per token (the fused CPU head + loss; the chunked path too in one case) and
gradients, on micro models.

The cases cover multi-head latent attention with a low-rank query (`q_lora_rank`) and with one `q_proj`
(DeepSeek-V2-Lite), value heads narrower than query heads, DeepSeek's interleaved RoPE (V2 always, V3 by
`rope_interleave`) and the plain one, YaRN with the `mscale_all_dim` softmax correction and an
`attention_factor` other than 1, and `attention_bias`.
"""
import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import transformers  # noqa: E402

from parity_helpers import (HEADS, export_loads_in_transformers, hf_loss_backward, hf_model,  # noqa: E402
                            hf_per_expert_grads, production_loss, token_ids)

from pretrain_cli.models import build_model, convert  # noqa: E402
from pretrain_cli.training.weight_source import load_weights  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.run_config import MoeConfig  # noqa: E402
from pretrain_cli.models.flops import param_counts  # noqa: E402
from pretrain_cli.ops import kernels  # noqa: E402

MICRO = dict(vocab_size=251, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
             kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, first_k_dense_replace=2)
YARN = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32, "beta_slow": 1}
MOE = dict(first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=12,
           n_shared_experts=2)
CASES = {
    "v3-lowrank-q-yarn": ("DeepseekV3Config", dict(q_lora_rank=10, rope_parameters={
        **YARN, "mscale": 1.0, "mscale_all_dim": 0.5})),
    "v3-plain-rope-bias": ("DeepseekV3Config", dict(q_lora_rank=10, rope_interleave=False, attention_bias=True,
                                                    rope_parameters={"rope_type": "default", "rope_theta": 5e4})),
    "v2-lite-q-proj-yarn": ("DeepseekV2Config", dict(q_lora_rank=None, rope_parameters={
        **YARN, "mscale": 0.707, "mscale_all_dim": 0.707})),
    # layer 0 dense, layer 1 sparse: V3's sigmoid group-limited routing with a non-zero balancing bias (4 groups of
    # 2, 2 kept), normalised weights x 2.5, two shared experts; V2's softmax greedy and group-limited routing
    "v3-moe-noaux-tc": ("DeepseekV3Config", dict(q_lora_rank=10, **MOE, n_group=4, topk_group=2,
                                                 routed_scaling_factor=2.5, norm_topk_prob=True,
                                                 rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
    # top-1 with norm_topk_prob: transformers normalises even one weight (to exactly 1, then x 2.5); no shared
    # experts: transformers saves a zero-width shared MLP, which the load reads as no weights
    "v3-moe-top1-norm-no-shared": ("DeepseekV3Config", dict(q_lora_rank=10, **{**MOE, "num_experts_per_tok": 1,
                                                                              "n_shared_experts": 0},
                                                            n_group=4, topk_group=2, routed_scaling_factor=2.5,
                                                            norm_topk_prob=True, rope_parameters={
                                                                "rope_type": "default", "rope_theta": 1e4})),
    "v2-moe-greedy": ("DeepseekV2Config", dict(q_lora_rank=None, **MOE, topk_method="greedy",
                                               routed_scaling_factor=1.5, rope_parameters={
                                                   "rope_type": "default", "rope_theta": 1e4})),
    "v2-moe-group-limited": ("DeepseekV2Config", dict(q_lora_rank=None, **MOE, topk_method="group_limited_greedy",
                                                      n_group=4, topk_group=2, rope_parameters={
                                                          "rope_type": "default", "rope_theta": 1e4})),
}
SEQ = 24


def _hf_model(cls, kw, seed=0):
    """With a non-zero balancing bias (one that changes which experts win)."""
    return hf_model(getattr(transformers, cls)(**{**MICRO, **kw}), seed, bias_buffer=0.05)


def _ids(seed=1):
    return token_ids(MICRO["vocab_size"], SEQ, seed)


@pytest.mark.parametrize("case", list(CASES))
def test_deepseek_logits_loss_grads_equal_transformers(case, tmp_path):
    cls, kw = CASES[case]
    hf = _hf_model(cls, kw)
    hf.save_pretrained(str(tmp_path), safe_serialization=True)
    ids = _ids()
    h_logits, h_loss, h_per_token, h_params = hf_loss_backward(hf, ids)
    h_grads = hf_per_expert_grads(h_params)
    heads = HEADS if case == "v3-lowrank-q-yarn" else {"cpu": HEADS["cpu"]}  # both head + loss paths once
    for head, request in heads.items():
        cfg = ModelConfig.from_file(str(tmp_path))
        ours = build_model(cfg, kernels.select(request, "cpu"), MoeConfig(aux_loss_coef=0.0))  # HF: no aux loss
        load_weights(ours, tmp_path, use="inference")
        assert cfg.mla and cfg.q_lora_rank == kw["q_lora_rank"]
        # transformers' DeepseekV3Config defaults to one MTP module, which its model neither builds nor saves:
        # ours builds it (from init) and uses it only in training, so the main model is compared in eval mode
        assert cfg.num_nextn_predict_layers == (1 if cls == "DeepseekV3Config" else 0)
        ours.eval()
        assert param_counts(cfg)["total"] == hf.num_parameters()
        with paddle.no_grad():
            logits = ours(paddle.to_tensor(ids[:, :-1])).numpy()
        assert np.abs(logits - h_logits).max() <= 1e-4, head
        loss, tokens = production_loss(ours, ids[:, :-1], ids[:, 1:])
        assert abs(loss - h_loss) <= 1e-5, head
        np.testing.assert_allclose(tokens, h_per_token, atol=2e-5, rtol=0)
        for name, p in ours.named_parameters():
            if convert.is_mtp(name, cfg) or p.stop_gradient:  # MTP: unused in eval; the balancing bias: no grad
                assert p.grad is None, name
                continue
            g = p.grad.numpy()
            g = g.T if g.ndim == 2 and "embed" not in name else g
            np.testing.assert_allclose(g, h_grads[name], atol=1e-4, err_msg=f"{head}: {name}")


@pytest.mark.parametrize("case", ["v3-lowrank-q-yarn", "v2-lite-q-proj-yarn"])
def test_deepseek_export_loads_in_transformers(case, tmp_path):
    cls, kw = CASES[case]
    _hf_model(cls, kw, seed=3).save_pretrained(str(tmp_path / "src"), safe_serialization=True)
    _, _, hf = export_loads_in_transformers(tmp_path / "src", tmp_path / "out", _ids(5))
    assert type(hf).__name__ == cls.replace("Config", "ForCausalLM")
