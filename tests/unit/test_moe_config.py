"""The Mixture-of-Experts config rules: sparse layers by transformers' rule, transformers 5's key name, the MoE keys
resolved with one-line errors (and the layouts a MoE model resolves under or is refused), and PaddleNLP's saved
Qwen2-MoE loaded by its prefix and layout. (tests/unit/test_moe_rules.py: the rest of how a MoE run's keys resolve
against its model and layout.)"""
import json
import re

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from moe_helpers import moe_cfg  # noqa: E402
from pretrain_cli.config.presets import PRESET_DIR  # noqa: E402
from pretrain_cli.errors import UserError  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.ops import kernels  # noqa: E402
from pretrain_cli.run_config import MoeConfig  # noqa: E402


def test_sparse_layers_follow_transformers_rule_and_config_round_trips():
    cfg = moe_cfg(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])
    assert cfg.sparse_layers == [1, 5]
    model = build_model(cfg, kernels.select(None, "cpu"))
    assert [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")] == [1, 5]
    hf = cfg.to_hf_dict()
    assert hf["num_experts"] == 8 and hf["mlp_only_layers"] == [3] and "shared_expert_intermediate_size" not in hf
    again = ModelConfig.from_dict(hf)
    assert again.sparse_layers == [1, 5] and again.num_experts_per_tok == 2
    v5 = {k: v for k, v in hf.items() if k != "num_experts"} | {"num_local_experts": 8}  # transformers 5 writes it
    assert ModelConfig.from_dict(v5).num_experts == 8 and "num_local_experts" not in ModelConfig.from_dict(v5).extra
    dense = ModelConfig.from_file(str(PRESET_DIR / "micro-qwen2")).to_hf_dict()
    assert not {"num_experts", "router_aux_loss_coef", "mlp_only_layers"} & set(dense)
    q2 = moe_cfg("micro-qwen2-moe").to_hf_dict()
    assert q2["shared_expert_intermediate_size"] == 64 and "attention_bias" not in q2


@pytest.mark.parametrize("change, message", [
    (dict(num_experts_per_tok=9), "num_experts_per_tok (9) exceeds num_experts (8)"),
    (dict(moe_intermediate_size=0), "moe_intermediate_size must be a positive integer"),
    (dict(mlp_only_layers="0"), "mlp_only_layers must be a list of layer indices"),
])
def test_a_wrong_moe_config_is_one_line(change, message):
    with pytest.raises(UserError, match=re.escape(message)) as e:
        moe_cfg(**change)
    assert "\n" not in str(e.value)


def test_moe_keys_resolve_with_one_line_errors_and_a_note_on_a_dense_model(tmp_path):
    from pretrain_cli.config.moe import resolve_moe
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.errors import Problems
    from pretrain_cli.run_layout import ParallelConfig

    def resolved(model, parallel=ParallelConfig(), **keys):
        args = parse_config(None, ["--model_name_or_path", model, "--output_dir", str(tmp_path)]
                          + [x for k, v in keys.items() for x in (f"--{k}", str(v))])
        problems, notes = Problems(), []
        moe = resolve_moe(args, ModelConfig.from_file(str(PRESET_DIR / model)), parallel, notes, problems)
        return moe, notes, problems.items

    moe, notes, errors = resolved("micro-qwen3-moe", router_z_loss_coef=0.001, capacity_factor=1.25,
                                  moe_router_bias_update_rate=0.001)
    # the balance loss's weight decided here once: config.json's router_aux_loss_coef (0.001), DeepSeek's α
    assert moe == MoeConfig(0.001, "micro_batch", 0.001, 0.001, 1.25) and not notes and not errors
    assert resolved("micro-deepseek-v3")[0].aux_loss_coef == 1e-4  # no aux_loss_alpha: the V3 paper's α
    assert resolved("micro-deepseek-v3", router_aux_loss_coef=0.02)[0].aux_loss_coef == 0.02
    _, _, errors = resolved("micro-qwen3-moe", capacity_factor=-1)
    assert errors == ["capacity_factor: must be a finite number >= 0, got -1.0"]
    _, notes, _ = resolved("micro-qwen2", router_aux_loss_coef=0.01)
    assert notes == ["router_aux_loss_coef: the model (qwen2) has no experts; no effect"]
    pp2 = ParallelConfig(world_size=2, pp_degree=2)
    _, _, errors = resolved("micro-qwen3-moe", pp2, moe_aux_loss_scope="global")
    assert len(errors) == 1 and errors[0].startswith("moe_aux_loss_scope: global sums")
    assert errors[0].endswith("use micro_batch with pipeline_parallel_degree")
    # the semi-auto engine (tp alone or with ZeRO-2/3) counts over the global batch whatever the file says, and
    # DeepSeek's balance loss is per sequence (a note): neither is refused (both were, and the user who then set
    # micro_batch was told that micro_batch is not available there)
    for model, parallel in (("micro-qwen3-moe", ParallelConfig(world_size=2, tp_degree=2)),
                            ("micro-qwen3-moe", ParallelConfig(world_size=4, dp_degree=2, tp_degree=2,
                                                               sharding_stage=3)),
                            ("micro-deepseek-v3", ParallelConfig(world_size=2, tp_degree=2, manual_tp=True)),
                            ("micro-deepseek-v3", pp2)):
        assert not resolved(model, parallel, moe_aux_loss_scope="global")[2], (model, parallel)
    _, _, errors = resolved("micro-qwen3-moe", ParallelConfig(world_size=2, pp_degree=2))
    assert not errors  # the layouts a MoE model runs under: config.refusals' MoE rows (tests/unit/test_layout_steps.py)
    _, _, errors = resolved("micro-deepseek-v3", ParallelConfig(world_size=2, tp_degree=2))
    assert not errors  # the layouts multi-head latent attention runs under: config.refusals' MLA rows
    _, _, errors = resolved("micro-qwen3-moe", ParallelConfig(world_size=2, dp_degree=2), moe_aux_loss_scope="global")
    assert not errors
    # with expert parallelism the tp ranks are the tp step's, which route the same tokens: each counted tp times, the
    # shares unchanged (tests/distributed/test_expert_tp.py runs it against one process)
    ep_tp = ParallelConfig(world_size=4, dp_degree=2, tp_degree=2, ep_degree=2, manual_tp=True)
    assert not resolved("micro-qwen3-moe", ep_tp, moe_aux_loss_scope="global")[2]
    _, _, errors = resolved("micro-qwen3-moe", recompute="true", recompute_use_reentrant="true")
    assert len(errors) == 1 and errors[0].startswith("recompute_use_reentrant: true loses the router losses'")


def test_a_paddlenlp_saved_qwen2_moe_loads_by_its_prefix_and_layout(tmp_path):
    """PaddleNLP's Qwen2-MoE names its tensors `qwen2_moe.layers.N...` in Paddle's [in, out] layout (its
    `_get_name_mappings` transposes every Linear, the router and the experts included)."""
    from safetensors.numpy import save_file

    from pretrain_cli.training.weight_source import load_weights

    cfg = moe_cfg("micro-qwen2-moe", tie_word_embeddings=False)
    paddle.seed(3)
    src = build_model(cfg, kernels.select(None, "cpu"))
    tensors = {n.replace("model.", "qwen2_moe.", 1): p.numpy() for n, p in src.named_parameters()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    paddle.seed(4)
    ours = build_model(cfg, kernels.select(None, "cpu"))
    assert load_weights(ours, tmp_path, use="continue_training") == "paddlenlp"
    for (name, a), (_, b) in zip(src.named_parameters(), ours.named_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)


@pytest.mark.parametrize("keys,world,refused", [
    (["--tensor_parallel_degree", "2"], 2, None),
    (["--sharding", "stage3", "--tensor_parallel_degree", "2"], 4, None),
    (["--pipeline_parallel_degree", "2", "--gradient_accumulation_steps", "4", "--router_z_loss_coef", "0.001",
      "--moe_router_bias_update_rate", "0.001"], 2, None),  # config.json's balance loss, the z-loss and the bias
    (["--tensor_parallel_degree", "2", "--sequence_parallel", "true"], 2,
     "sequence_parallel: true with a Mixture-of-Experts model (qwen3_moe) is not supported"),
    # context parallelism runs (tests/distributed/test_moe_context.py), with expert parallelism and fleet's ZeRO-2 too;
    # with tp or with a capacity it is refused
    (["--context_parallel_degree", "2"], 2, None),
    (["--context_parallel_degree", "2", "--expert_parallel_degree", "2", "--sharding", "stage2"], 4, None),
    (["--context_parallel_degree", "2", "--moe_aux_loss_scope", "global"], 2, None),
    (["--context_parallel_degree", "2", "--tensor_parallel_degree", "2"], 4,
     "context_parallel_degree: 2 with tensor_parallel_degree: 2 and a Mixture-of-Experts model (qwen3_moe) is not "
     "supported"),
    (["--context_parallel_degree", "2", "--capacity_factor", "1.5"], 2,
     "capacity_factor: 1.5 with context_parallel_degree 2 is not supported"),
    # ep x cp x pp (tests/distributed/test_moe_context_pipeline.py, 8 processes): it was refused
    (["--context_parallel_degree", "2", "--expert_parallel_degree", "2", "--pipeline_parallel_degree", "2",
      "--gradient_accumulation_steps", "4"], 8, None),
])
def test_moe_layouts_resolve_or_are_refused_in_one_line(keys, world, refused):
    """tp, ZeRO-3, a pipeline with every router term on and context parallelism (also ep x cp x pp) resolve for a MoE
    model; sequence parallelism, tp x cp and a capacity under cp are refused by config.refusals' MoE row (or the
    capacity's line in config.moe), in one line each."""
    from run_helpers import resolve_run

    if refused is None:
        run = resolve_run(*keys, world=world, model="micro-qwen3-moe")
        assert run.parallel.world_size == world
        return
    with pytest.raises(UserError) as e:
        resolve_run(*keys, world=world, model="micro-qwen3-moe")
    lines = [line for line in str(e.value).splitlines() if refused in line]
    assert len(lines) == 1, str(e.value)


def test_context_parallelism_resolves_for_moe_and_mla_and_mtp():
    """cp2 x ep2 x ZeRO-2 keeps its expert degree (fleet's ZeRO-2 under cp: `ExpertZero1`), DeepSeek-V2's MLA and
    sequence-wise loss run under cp (tests/distributed/test_moe_context.py), and DeepSeek-V3's multi-token prediction
    module, whose next tokens cross the chunks (tests/distributed/test_mtp_context.py). All were refused before."""
    from run_helpers import resolve_run

    run = resolve_run("--context_parallel_degree", "2", "--expert_parallel_degree", "2", "--sharding", "stage2",
                      world=4, model="micro-qwen2-moe")
    assert (run.parallel.cp_degree, run.parallel.ep_degree, run.parallel.sharding_stage) == (2, 2, 2)
    assert resolve_run("--context_parallel_degree", "2", world=2, model="micro-deepseek-v2").parallel.cp_degree == 2
    run = resolve_run("--context_parallel_degree", "2", "--pipeline_parallel_degree", "2", world=4,
                      model="micro-deepseek-v3")
    assert (run.parallel.cp_degree, run.parallel.pp_degree) == (2, 2)
