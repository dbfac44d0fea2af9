"""DeepSeek-V3's multi-token prediction (`models.mtp`): stored under the published names, trained alongside the main
loss with weight λ (training mode only), and each depth's loss equal to the module written out by hand on the
shifted sequence (no padding position involved: causal attention keeps the last, padded one out of the others)."""
import numpy as np

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import paddle.nn.functional as F  # noqa: E402

from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.run_config import MoeConfig  # noqa: E402

CFG = ModelConfig(model_type="deepseek_v3", vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=2, max_position_embeddings=64, q_lora_rank=16, kv_lora_rank=12,
                  qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, num_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                  routed_scaling_factor=2.5, norm_topk_prob=True, topk_method="noaux_tc", num_nextn_predict_layers=2)


def _ce(model, h, targets):
    logits = model.logits(h)  # [bsz, n, vocab]
    return float(F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), targets.reshape([-1, 1])).mean())


def test_mtp_modules_names_loss_and_weight():
    paddle.seed(0)
    model = build_model(CFG, None, MoeConfig(aux_loss_coef=0.0, mtp_loss_weight=0.25))
    names = {n for n, _ in model.named_parameters()}
    for k in (2, 3):  # layers num_hidden_layers + k, as DeepSeek-V3's checkpoint stores layer 61
        assert {f"model.layers.{k}.{p}" for p in ("enorm.weight", "hnorm.weight", "eh_proj.weight",
                                                   "shared_head.norm.weight", "self_attn.kv_b_proj.weight",
                                                   "mlp.gate.e_score_correction_bias")} <= names
    assert len(model.model.layers) == 2 and len(model.model.layers.mtp) == 2
    ids = paddle.to_tensor(np.random.default_rng(0).integers(0, 97, (2, 13)))
    x, labels = ids[:, :-1], ids[:, 1:]
    model.eval()
    with paddle.no_grad():
        total, count = model(x, labels=labels)
        main = float(total / count)
        # by hand: depth k sees positions 0 .. T-1-k, the embedding of token i+k and the previous depth's states
        h = model.model(x)  # [bsz, T, hidden]
        emb = model.model.embed_tokens.weight
        depth_losses, seq = [], x.shape[1]
        for k, module in enumerate(model.model.layers.mtp, start=1):
            n = seq - k
            cos, sin = model.model.rotary_emb(n)
            inp = module.eh_proj(paddle.concat([module.enorm(F.embedding(x[:, k:], emb)), module.hnorm(h[:, :n])], -1))
            h = module._block[0](inp, cos, sin)  # [bsz, n, hidden]
            depth_losses.append(_ce(model, module.shared_head.norm(h), labels[:, k:]))
    model.train()
    with paddle.no_grad():
        total, count = model(x, labels=labels)
    want = main + 0.25 * np.mean(depth_losses)
    assert abs(float(total / count) - want) < 1e-5, (float(total / count), want)
    logged, n = model.router_losses["mtp_loss"]
    assert n == 1 and abs(float(logged) - np.mean(depth_losses)) < 1e-5


def test_a_pipelines_stages_add_the_same_mtp_term_as_one_process():
    """The pipeline's items run in order in one process (`distributed.steps.pipeline_stages`: the ids carried last
    in the stream to the last stage's loss, which runs the MTP modules) give the model's own training loss and
    logged mtp_loss, with packed documents too; evaluation (the item's eval mode) leaves the MTP term out."""
    from pretrain_cli.distributed.strategies.pipeline import inputs_of
    from pretrain_cli.distributed.steps.pipeline_stages import Block, Embed, Final, MTPModules, StageLoss

    paddle.seed(0)
    model = build_model(CFG, None, MoeConfig(aux_loss_coef=0.0, mtp_loss_weight=0.25))
    dec, rng = model.model, np.random.default_rng(1)
    ids = paddle.to_tensor(rng.integers(0, 97, (2, 12)))
    labels = paddle.to_tensor(rng.integers(0, 97, (2, 12)))
    doc_start = paddle.to_tensor(np.array([[0] * 5 + [5] * 7, [0] * 12], dtype="int64"))  # [2, 12]
    mtp = MTPModules(dec.layers.mtp)
    loss = StageLoss(model, None, mtp)
    for extra in ({}, {"doc_start": doc_start}):
        with paddle.no_grad():
            total, count = model(ids, labels=labels, **extra)
            want, want_logged = float(total / count), float(model.router_losses.pop("mtp_loss")[0])
            x = Embed(dec.embed_tokens, carry_ids=True)(inputs_of(ids, extra))
            for layer in dec.layers:
                x = Block(layer, dec.rotary_emb, carry_ids=True)(x)
            got = float(loss(Final(dec.norm, carry=True)(x), labels))
            logged, n = model.router_losses.pop("mtp_loss")
            mtp.eval()
            main = float(loss(Final(dec.norm, carry=True)(x), labels))
            mtp.train()
        assert abs(got - want) < 1e-6 and abs(float(logged) - want_logged) < 1e-6 and n == 1, (extra, got, want)
        assert abs(main - (want - 0.25 * want_logged)) < 1e-5 and "mtp_loss" not in model.router_losses


def test_a_directory_without_mtp_weights_is_said_to_start_them_from_init(tmp_path, caplog, monkeypatch):
    """transformers saves no multi-token prediction module: loading such a directory says the modules start from
    init (else a first loss above transformers' own looks like a wrong load)."""
    import logging

    from safetensors.numpy import load_file, save_file

    from pretrain_cli.models import convert
    from pretrain_cli.models.convert import is_mtp
    from pretrain_cli.training.weight_source import load_weights

    paddle.seed(0)
    model = build_model(CFG, None, MoeConfig(aux_loss_coef=0.0))
    convert.save_hf(model, CFG, str(tmp_path / "hf"))
    weights = tmp_path / "hf" / "model.safetensors"
    save_file({n: t for n, t in load_file(weights).items() if not is_mtp(n, CFG)}, str(weights))
    monkeypatch.setattr(logging.getLogger("pretrain_cli"), "propagate", True)  # (a run's setup_logging: off)
    with caplog.at_level(logging.INFO, logger="pretrain_cli"):
        load_weights(build_model(CFG, None, MoeConfig(aux_loss_coef=0.0)), tmp_path / "hf", use="continue_training")
        assert "no multi-token prediction weights (transformers does not save them): the modules of layer 2, 3 " \
               "start from init" in caplog.text
        caplog.clear()
        convert.save_hf(model, CFG, str(tmp_path / "whole"))
        load_weights(build_model(CFG, None, MoeConfig(aux_loss_coef=0.0)), tmp_path / "whole", use="continue_training")
        assert "multi-token prediction" not in caplog.text


def test_a_continued_runs_routers_from_init_are_the_ones_its_directory_lacks(tmp_path):
    """The routing grace per layer: continuing from a directory without MTP weights, the load knows which parameters
    it took from init (`WeightSource.initialised`), the trainer keeps the MoE layers whose router is among them in
    its state (a resume's state brings them back), and a whole directory leaves none."""
    import dataclasses
    from types import SimpleNamespace

    from run_helpers import resolve_run
    from safetensors.numpy import load_file, save_file

    from pretrain_cli.distributed.comms.comm import NoComm
    from pretrain_cli.models import convert
    from pretrain_cli.models.convert import is_mtp
    from pretrain_cli.training.routing_watch import routers_from_init
    from pretrain_cli.training.run import lay_out, open_weights
    from pretrain_cli.training.trainer import Trainer

    paddle.seed(0)
    model = build_model(CFG, None, MoeConfig(aux_loss_coef=0.0))
    for name in ("hf", "whole"):
        convert.save_hf(model, CFG, str(tmp_path / name))
    weights = tmp_path / "hf" / "model.safetensors"
    save_file({n: t for n, t in load_file(weights).items() if not is_mtp(n, CFG)}, str(weights))
    seed = SimpleNamespace(loop=SimpleNamespace(seed=0))
    for name, fresh in (("hf", [2, 3]), ("whole", [])):
        source = open_weights(seed, build_model(CFG, None, MoeConfig(aux_loss_coef=0.0)), pretrained=tmp_path / name)
        source.close()
        assert CFG.expert_layers == [1, 2, 3] and routers_from_init(source.initialised, CFG.expert_layers) == fresh
    continued_run = resolve_run("--max_steps", "4", "--continue_training", "true", model=str(tmp_path / "hf"))
    with paddle.LazyGuard():
        lazy = build_model(CFG, None, MoeConfig(aux_loss_coef=0.0))
    laid = lay_out(continued_run, lazy, NoComm(), pretrained=tmp_path / "hf")  # the run's own path to the Trainer
    assert Trainer(laid, None, continued_run, NoComm()).state.routers_from_init == [2, 3]
    run = resolve_run("--max_steps", "4")
    layout = dataclasses.replace(lay_out(run, model, NoComm()), initialised=source.initialised | {
        "model.layers.3.mlp.gate.weight"})
    continued = dataclasses.replace(run, model=dataclasses.replace(run.model, continue_training=True))
    assert Trainer(layout, None, continued, NoComm()).state.routers_from_init == [3]
    assert Trainer(layout, None, run, NoComm()).state.routers_from_init == [1, 2, 3]  # from init: every router
    resumed = Trainer(dataclasses.replace(layout, initialised=frozenset()), None, continued, NoComm(),
                      resumed={"global_step": 2, "routers_from_init": [3]})
    assert resumed.state.routers_from_init == [3] and resumed.state_dict()["routers_from_init"] == [3]
