"""A Mixture-of-Experts model's router terms inside fleet's pipeline, without a launch: the pipeline's items
(`distributed.steps.pipeline_stages`) run in one process as two stages, the cut between them emulating fleet's
sends (each tensor of the stream received as a new leaf with the sender's `stop_gradient`; the first stage's
backward fed the gradients the second computed for the tensors that do not stop gradient, as
`PipelineParallel._backward_step` does). The router-loss sums travel with the hidden states (`RouterStream`), so
the loss, every parameter's gradient and the logged aux/z losses equal one process's, and the counts the
balancing bias is updated from are the same. The multi-process launches: tests/distributed/test_moe_layouts.py
(Qwen2-MoE) and tests/distributed/test_mtp_pipeline.py (DeepSeek-V3)."""
import json

import numpy as np

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.config.presets import PRESET_DIR  # noqa: E402
from pretrain_cli.distributed.steps.pipeline_stages import (Block, Embed, Final, MTPModules, RouterStream,  # noqa: E402
                                                          StageLoss)
from pretrain_cli.distributed.strategies.pipeline import inputs_of  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.models.moe_loss import sparse_blocks, update_expert_bias  # noqa: E402
from pretrain_cli.ops import kernels  # noqa: E402
from pretrain_cli.run_config import MoeConfig  # noqa: E402


def _model(preset: str, moe: MoeConfig, **over):
    cfg = ModelConfig.from_dict({**json.loads((PRESET_DIR / preset / "config.json").read_text()), **over})
    paddle.seed(0)
    return build_model(cfg, kernels.select(None, "cpu"), moe)


def _sent(out):
    """What the next stage receives of `out`: new leaves, `stop_gradient` as sent (fleet's meta)."""
    got = []
    for t in out:
        r = t.detach()
        r.stop_gradient = t.stop_gradient
        got.append(r)
    return tuple(got)


def _two_stages(model, ids, labels, cut: int, extra: dict):
    """The loss through the pipeline's items as stages [embedding, layers < cut] and [layers >= cut, norm, MTP,
    loss], with fleet's backward across the cut; returns (loss, the logged router losses)."""
    dec, mtp = model.model, bool(model.mtp_depth)
    router = RouterStream(model)
    modules = MTPModules(dec.layers.mtp) if mtp else None
    final = Final(dec.norm, True)
    loss = StageLoss(model, None, modules, router, final)
    x = Embed(dec.embed_tokens, mtp, router)(inputs_of(ids, extra))
    blocks = [Block(layer, dec.rotary_emb, carry_ids=mtp, router=router) for layer in dec.layers]
    for b in blocks[:cut]:
        x = b(x)
    received = _sent(x)
    y = received
    for b in blocks[cut:]:
        y = b(y)
    out = loss(final(y), labels)
    out.backward()
    sent = [t for t in x if not t.stop_gradient]
    paddle.autograd.backward(sent, [r.grad for r in received if not r.stop_gradient])
    return float(out), {k: float(v[0]) for k, v in model.router_losses.items()}


def _compare(model, cut: int, extra: dict | None = None):
    extra = extra or {}
    rng = np.random.default_rng(1)
    ids = paddle.to_tensor(rng.integers(0, 512, (2, 12)))
    labels = paddle.to_tensor(rng.integers(0, 512, (2, 12)))
    params = [(n, p) for n, p in model.named_parameters() if not p.stop_gradient]

    def run(fn):
        for b in sparse_blocks(model):
            b.reset_load()
        model.router_losses.clear()
        value, logged = fn()
        grads = {n: p.grad.numpy().copy() for n, p in params if p.grad is not None}
        model.clear_gradients()
        return value, logged, grads, [b.step_load.numpy() for b in sparse_blocks(model)]

    def one():
        total, count = model(ids, labels=labels, **extra)
        out = total / count
        out.backward()
        return float(out), {k: float(v[0]) for k, v in model.router_losses.items()}

    want = run(one)
    got = run(lambda: _two_stages(model, ids, labels, cut, extra))
    assert abs(got[0] - want[0]) < 1e-6, (got[0], want[0])
    assert got[1].keys() == want[1].keys() and all(abs(got[1][k] - want[1][k]) < 1e-6 for k in want[1]), got[1]
    assert sorted(got[2]) == sorted(want[2]) and any("mlp.gate.weight" in n for n in want[2])
    for name, g in want[2].items():
        np.testing.assert_allclose(got[2][name], g, atol=1e-7, err_msg=name)
    for a, b in zip(got[3], want[3]):  # the counts each stage's bias moves by
        np.testing.assert_array_equal(a, b)
    return want[1]


def test_pipeline_stages_carry_transformers_balance_loss_and_z_loss():
    """Qwen2-MoE, one sparse layer a stage: transformers' balance loss (means over layers x tokens, not a sum of
    per-layer losses) and the z-loss; the router's gradient on the first stage comes back through the second's."""
    model = _model("micro-qwen2-moe", MoeConfig(aux_loss_coef=0.3, z_loss_coef=0.1))
    logged = _compare(model, cut=1)
    assert set(logged) == {"aux_loss", "z_loss", "lm_loss"} and logged["aux_loss"] > 1.0  # ~top_k at balance


def test_pipeline_stages_carry_deepseeks_sequence_loss_bias_and_mtp():
    """DeepSeek-V3 (first layer dense) cut after its sparse layer 1 of 3, the MTP module's sparse layer on the last
    stage: the sequence-wise loss, the z-loss and the MTP loss, packed documents too; then a bias update from the
    same counts gives the same biases."""
    model = _model("micro-deepseek-v3", MoeConfig(aux_loss_coef=0.2, z_loss_coef=0.05, bias_update_rate=0.01,
                                                  mtp_loss_weight=0.3), num_hidden_layers=3)
    doc_start = paddle.to_tensor(np.array([[0] * 5 + [5] * 7, [0] * 12], dtype="int64"))  # [2, 12]
    for extra in ({}, {"doc_start": doc_start}):
        logged = _compare(model, cut=2, extra=extra)
        assert set(logged) == {"aux_loss", "z_loss", "mtp_loss", "lm_loss"}
    update_expert_bias(model, 0.01)
    biases = [b.gate.e_score_correction_bias.numpy() for b in sparse_blocks(model)]
    assert len(biases) == 3 and all(np.abs(x).max() == 0.01 for x in biases)


def test_the_logged_lm_loss_is_the_loss_less_its_weighted_terms():
    """The training loss of DeepSeek-V3 with MTP is the language-model loss + λ x mtp_loss + the router terms; the
    LM part is logged apart as lm_loss (equal on a pipeline's last stage: `_compare`), which the loss curve draws
    beside the eval curve. A dense model logs none (its loss is the LM loss)."""
    model = _model("micro-deepseek-v3", MoeConfig(aux_loss_coef=0.2, z_loss_coef=0.05, mtp_loss_weight=0.3))
    rng = np.random.default_rng(1)
    ids, labels = (paddle.to_tensor(rng.integers(0, 512, (2, 12))) for _ in range(2))
    model.router_losses.clear()
    total, count = model(ids, labels=labels)
    logged = {k: float(v[0]) / v[1] for k, v in model.router_losses.items()}
    terms = 0.3 * logged["mtp_loss"] + 0.2 * logged["aux_loss"] + 0.05 * logged["z_loss"]
    assert logged["lm_loss"] > 5 and logged["mtp_loss"] > 5  # ~ln(512) each, untrained
    assert abs(float(total / count) - (logged["lm_loss"] + terms)) < 1e-5
    model.eval()  # evaluation: the LM loss alone, nothing logged
    model.router_losses.clear()
    model(ids, labels=labels)
    assert model.router_losses == {}
    dense = _model("micro-qwen2", None)
    dense(ids, labels=labels)
    assert dense.router_losses == {}


def test_a_first_stage_without_sparse_layers_passes_the_sums_on():
    """DeepSeek-V3's dense first layer alone on the first stage: the sums reach the second stage as zeros (with
    gradient, which reaches nothing on the first stage); the loss and gradients still equal one process's."""
    model = _model("micro-deepseek-v3", MoeConfig(aux_loss_coef=0.2, z_loss_coef=0.05, mtp_loss_weight=0.3))
    _compare(model, cut=1)


def test_a_dense_and_a_sparse_chunk_send_the_stream_with_the_same_gradient_pattern():
    """Under `virtual_pp_degree` a stage sends from several chunks each step, and fleet's interleaved schedule
    checks every send against the step's first by the shapes of the tensors with gradient: DeepSeek-V3's dense
    layer 0 sent the sums without gradient and its sparse layer 1 with, and pp 4 x 2 virtual stages of an 8-layer
    DeepSeek-V3 stopped at step 1 (`send_shape_message: ([1, 32, 64],), actual_shape: ([1, 32, 64], [10])`)."""
    model = _model("micro-deepseek-v3", MoeConfig(aux_loss_coef=0.2, bias_update_rate=0.01, mtp_loss_weight=0.3))
    dec, router = model.model, RouterStream(model)
    ids = paddle.to_tensor(np.random.default_rng(1).integers(0, 512, (2, 12)))
    x = Embed(dec.embed_tokens, True, router)(ids)
    dense, sparse = (Block(layer, dec.rotary_emb, carry_ids=True, router=router) for layer in dec.layers[:2])
    assert not sparse_blocks(dec.layers[0]) and sparse_blocks(dec.layers[1])
    after_dense = dense(x)
    after_sparse = sparse(_sent(after_dense))
    assert [t.stop_gradient for t in after_dense] == [t.stop_gradient for t in after_sparse]
    assert [t.shape for t in after_dense] == [t.shape for t in after_sparse]
