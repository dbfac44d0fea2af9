"""Qwen3-MoE and Qwen2-MoE against transformers (torch, CPU fp32) through convert.py: logits, the loss with HF's
load-balancing term, the auxiliary loss itself, gradients (experts and router included), an exported directory
read by transformers as it is.

Tiny random configs cover a dense layer among sparse ones (`mlp_only_layers`, `decoder_sparse_step`), both
`norm_topk_prob` values, Qwen2-MoE's shared expert with its sigmoid gate and q/k/v biases, tied and untied heads.
Weights are perturbed after HF init so the router is not uniform and the norms are not all one.
"""
import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import torch  # noqa: E402
import transformers  # noqa: E402

from parity_helpers import (HEADS, export_loads_in_transformers, hf_model, hf_per_expert_grads,  # noqa: E402
                            load, production_loss, token_ids)

from pretrain_cli.models.moe_loss import load_balancing_loss, sparse_blocks  # noqa: E402
from pretrain_cli.ops import kernels  # noqa: E402

COMMON = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
              moe_intermediate_size=24, router_aux_loss_coef=0.02, output_router_logits=True)
CASES = {
    # layer 1 dense (mlp_only_layers), layers 0 and 2 sparse; head_dim 16 != hidden / heads
    "qwen3_moe-untied": ("Qwen3MoeConfig", dict(num_hidden_layers=3, head_dim=16, num_experts=6, num_experts_per_tok=2,
                                                norm_topk_prob=True, mlp_only_layers=[1], tie_word_embeddings=False,
                                                rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # decoder_sparse_step 2: layers 1 and 3 sparse; top-3 of 5 without renormalisation
    "qwen3_moe-tied-step2": ("Qwen3MoeConfig", dict(num_hidden_layers=4, num_experts=5, num_experts_per_tok=3,
                                                    norm_topk_prob=False, decoder_sparse_step=2,
                                                    tie_word_embeddings=True,
                                                    rope_parameters={"rope_type": "default", "rope_theta": 5e4})),
    "qwen2_moe-untied": ("Qwen2MoeConfig", dict(num_hidden_layers=2, num_experts=6, num_experts_per_tok=2,
                                                shared_expert_intermediate_size=40, norm_topk_prob=False,
                                                tie_word_embeddings=False,
                                                rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen2_moe-tied-norm": ("Qwen2MoeConfig", dict(num_hidden_layers=3, num_experts=4, num_experts_per_tok=2,
                                                   shared_expert_intermediate_size=40, norm_topk_prob=True,
                                                   mlp_only_layers=[0], tie_word_embeddings=True,
                                                   rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
}
SEQ = 20


def _hf_model(case, seed=0):
    cls_name, kw = CASES[case]
    return hf_model(getattr(transformers, cls_name)(**{**COMMON, **kw}), seed, gate_scale=0.3)


def _ids(seed=1):
    return token_ids(COMMON["vocab_size"], SEQ, seed)


def _hf_forward_backward(model, ids):
    t = torch.from_numpy(ids)
    out = model(input_ids=t[:, :-1], output_router_logits=True)
    ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), t[:, 1:].reshape(-1))
    loss = ce + model.config.router_aux_loss_coef * out.aux_loss
    loss.backward()
    return out.logits.detach().numpy(), float(loss.detach()), float(out.aux_loss.detach()), dict(model.named_parameters())


@pytest.mark.parametrize("case", list(CASES))
def test_hf_to_ours_logits_loss_aux_grads(case, tmp_path):
    hf = _hf_model(case)
    hf.save_pretrained(str(tmp_path), safe_serialization=True)
    ids = _ids()
    h_logits, h_loss, h_aux, h_params = _hf_forward_backward(hf, ids)
    # both fused head + loss paths on one case (the head is the dense families' and tested there), the CPU one else
    heads = HEADS if case == "qwen2_moe-untied" else {"cpu": HEADS["cpu"]}
    for head, request in heads.items():
        ours, cfg = load(tmp_path, kernels.select(request, "cpu"))
        assert cfg.model_type == case.split("-")[0] and cfg.num_experts == CASES[case][1]["num_experts"]
        with paddle.no_grad():
            o_logits = ours(paddle.to_tensor(ids[:, :-1])).numpy()
        assert np.abs(o_logits - h_logits).max() <= 1e-4, head
        o_loss, _ = production_loss(ours, ids[:, :-1], ids[:, 1:])
        assert abs(o_loss - h_loss) <= 1e-5, head
        logits = [b.record.routing.logits for b in sparse_blocks(ours)]
        o_aux = float(load_balancing_loss(logits, cfg.num_experts, cfg.num_experts_per_tok))
        assert abs(o_aux - h_aux) <= 1e-5, head
        o_grads = {n: p.grad.numpy() for n, p in ours.named_parameters()}
        _assert_grads(o_grads, h_params, cfg, head)


def _assert_grads(o_grads, h_params, cfg, head):
    hf_grads = hf_per_expert_grads(h_params)
    sparse = cfg.sparse_layers[0]
    names = ["model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight", "model.norm.weight",
             f"model.layers.{sparse}.mlp.gate.weight", f"model.layers.{sparse}.mlp.experts.1.gate_proj.weight",
             f"model.layers.{sparse}.mlp.experts.0.down_proj.weight"]
    if cfg.model_type == "qwen2_moe":
        names += [f"model.layers.{sparse}.mlp.shared_expert.up_proj.weight",
                  f"model.layers.{sparse}.mlp.shared_expert_gate.weight", "model.layers.0.self_attn.v_proj.bias"]
    for name in names:
        g = o_grads[name]
        g = g.T if g.ndim == 2 and "embed" not in name else g
        np.testing.assert_allclose(g, hf_grads[name], atol=1e-4, err_msg=f"{head}: {name}")


@pytest.mark.parametrize("case", ["qwen3_moe-untied", "qwen2_moe-tied-norm"])
def test_ours_to_hf_from_pretrained(case, tmp_path):
    _hf_model(case, seed=3).save_pretrained(str(tmp_path / "src"), safe_serialization=True)
    ours, cfg, hf = export_loads_in_transformers(tmp_path / "src", tmp_path / "out", _ids(5))
    assert type(hf).__name__ == {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}[
        cfg.model_type]
    # the file holds HF's per-expert names, and reading it back gives our weights exactly
    again, _ = load(tmp_path / "out", None)
    sparse = cfg.sparse_layers[-1]
    name = f"model.layers.{sparse}.mlp.experts.{cfg.num_experts - 1}.down_proj.weight"
    np.testing.assert_array_equal(dict(again.named_parameters())[name].numpy(),
                                  dict(ours.named_parameters())[name].numpy())
