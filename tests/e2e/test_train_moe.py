"""Qwen3-MoE and Qwen2-MoE through `train`: the loss falls, each log records the router losses and the experts'
load, the output loads in transformers with our eval loss, and `continue_training` from a directory transformers
saved starts at transformers' own loss (its load-balancing term included) on the first batch."""
import json

import numpy as np
import pytest

from e2e_helpers import train_losses, write_config
from pretrain_cli.cli import main as cli_main


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("model", ["micro-qwen3-moe", "micro-qwen2-moe"])
def test_micro_moe_trains_logs_expert_load_and_loads_in_transformers(corpus, tmp_path, model, capsys):
    import torch
    from transformers import AutoModelForCausalLM

    from pretrain_cli.data.indexed import open_token_file

    cfg = write_config(tmp_path, corpus, model_name_or_path=model, max_steps=16, logging_steps=4, save_steps=16,
                       learning_rate=0.01, router_z_loss_coef=0.001, report_to=["tensorboard"])
    assert cli_main(["train", cfg]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "global_step: 16" in x)
    assert "aux_loss: " in line and "moe_max_expert_share: " in line and "z_loss: " in line
    out = tmp_path / "out"
    losses = train_losses(out)
    assert losses[-1] < losses[0] - 0.5, losses
    train = [r for r in _records(out) if r["kind"] == "train"]
    for r in train:  # 8 experts, top-2: perfect balance is 1/8 of a layer's assignments, collapse is 1/2 or more
        assert 1.0 <= r["aux_loss"] < 4.0 and len(r["moe_expert_share_per_layer"]) == 2, r
        assert 1 / 8 <= r["moe_max_expert_share"] < 0.5 and r["moe_dropped_share"] == 0 and r["z_loss"] > 0
    # the per-layer load reaches the trackers as one series per layer
    from tracker_readers import tensorboard

    tags = tensorboard(out / "runs")[0]
    assert {"train/moe_expert_share_per_layer/0", "train/moe_expert_share_per_layer/1", "train/aux_loss"} <= set(tags)
    # the exported directory is transformers' per-expert layout: transformers' loss equals ours (eval: no aux term)
    assert cli_main(["eval", "--config", cfg, "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    hf = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert type(hf).__name__ == {"micro-qwen3-moe": "Qwen3MoeForCausalLM", "micro-qwen2-moe": "Qwen2MoeForCausalLM"}[model]
    assert ours["split"] == "valid" and np.isfinite(ours["loss"])
    tokens = open_token_file(str(corpus / "data" / "docs"))
    flat = np.asarray(tokens.tokens(0, 4 * 32 + 1), dtype=np.int64)
    windows = np.stack([flat[k * 32:k * 32 + 33] for k in range(4)])
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.training.weight_source import load_for_inference
    from pretrain_cli.training.evaluation import loss_sum

    mine, _ = load_for_inference(out, ModelConfig.from_file(str(out)), 0)
    total, count, _ = loss_sum(mine, [{"input_ids": windows[:, :-1], "labels": windows[:, 1:]}])
    with torch.no_grad():
        logits = hf(torch.from_numpy(windows[:, :-1])).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.from_numpy(windows[:, 1:]).reshape(-1))
    assert total / count == pytest.approx(float(loss), abs=1e-4)


def test_continue_training_from_a_transformers_saved_qwen3_moe_starts_at_its_loss(corpus, tmp_path):
    import torch
    import transformers

    from pretrain_cli.data import build_datasets
    from pretrain_cli.data.loader import micro_batch

    torch.manual_seed(0)
    conf = transformers.Qwen3MoeConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
                                       num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                                       max_position_embeddings=64, router_aux_loss_coef=0.01, bos_token_id=1,
                                       eos_token_id=2)
    hf = transformers.AutoModelForCausalLM.from_config(conf).float()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("gate.weight"):
                p.add_(torch.randn_like(p) * 0.3)
    hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    cfg = write_config(tmp_path, corpus, model_name_or_path=str(tmp_path / "hf"), continue_training=True,
                       max_steps=1, warmup_steps=0)
    assert cli_main(["train", cfg]) == 0
    first = train_losses(tmp_path / "out")[0]
    data = build_datasets(str(corpus / "data"), "90,5,5", 32, 7, need=("train",))
    batch = micro_batch(data.train, 0, 4)
    with torch.no_grad():
        out = hf.eval()(input_ids=torch.from_numpy(batch["input_ids"]), output_router_logits=True)
        ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 512), torch.from_numpy(batch["labels"]).reshape(-1))
    assert first == pytest.approx(float(ce + 0.01 * out.aux_loss), abs=1e-5)


def test_loss_free_balancing_bias_is_checkpointed_resumed_and_left_out_of_the_export(corpus, tmp_path):
    """moe_router_bias_update_rate: the bias moves every step, lives in the checkpoints (a resumed run continues
    on the same curve) and is not in the HF export (transformers' Qwen3-MoE has no such tensor); capacity_factor
    drops tokens and says how many."""
    from safetensors.numpy import load_file

    keys = dict(model_name_or_path="micro-qwen3-moe", lr_scheduler_type="constant", warmup_steps=0,
                moe_router_bias_update_rate=0.01, capacity_factor=1.0, save_steps=3)
    whole = write_config(tmp_path, corpus, max_steps=6, output_dir=str(tmp_path / "whole"), **keys)
    assert cli_main(["train", whole]) == 0
    halves = write_config(tmp_path, corpus, max_steps=3, output_dir=str(tmp_path / "halves"), **keys)
    assert cli_main(["train", halves]) == 0
    assert cli_main(["train", halves, "--max_steps", "6"]) == 0
    assert train_losses(tmp_path / "halves")[-3:] == train_losses(tmp_path / "whole")[-3:]
    name = "model.layers.1.mlp.gate.e_score_correction_bias"
    biases = [load_file(str(tmp_path / d / "checkpoint-6" / "model.safetensors"))[name] for d in ("whole", "halves")]
    np.testing.assert_array_equal(biases[0], biases[1])
    # after 3 moves of ±0.01 (an odd number: never back at 0) the bias is in the checkpoint, in float32
    moved = load_file(str(tmp_path / "whole" / "checkpoint-3" / "model.safetensors"))[name]
    assert moved.dtype == np.float32 and np.abs(moved).min() > 0
    assert name not in load_file(str(tmp_path / "whole" / "model.safetensors"))
    train = [r for r in _records(tmp_path / "whole") if r["kind"] == "train"]
    assert any(r["moe_dropped_share"] > 0 for r in train) and all(r["moe_dropped_share"] < 0.5 for r in train)


def test_a_resume_at_bias_rate_0_keeps_the_checkpoints_bias_frozen(corpus, tmp_path, capsys):
    """Resumed with moe_router_bias_update_rate 0, a run trained with the bias routes with it (frozen, said in a
    note) instead of dropping it: its next step's loss is the continued run's (the update comes after the step)."""
    import shutil

    from safetensors.numpy import load_file

    cfg = write_config(tmp_path, corpus, model_name_or_path="micro-qwen3-moe", max_steps=4, save_steps=4,
                       learning_rate=0.01, moe_router_bias_update_rate=0.05)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    shutil.copytree(out / "checkpoint-4", tmp_path / "frozen" / "checkpoint-4")
    assert cli_main(["train", cfg, "--max_steps", "5"]) == 0  # the bias moving on
    capsys.readouterr()
    assert cli_main(["train", cfg, "--max_steps", "5", "--output_dir", str(tmp_path / "frozen"),
                     "--moe_router_bias_update_rate", "0"]) == 0
    assert "freezes checkpoint-4's e_score_correction_bias" in capsys.readouterr().out
    assert train_losses(tmp_path / "frozen")[-1] == pytest.approx(train_losses(out)[-1], abs=1e-6)
    frozen = load_file(str(tmp_path / "frozen" / "checkpoint-5" / "model.safetensors"))
    saved = load_file(str(out / "checkpoint-4" / "model.safetensors"))
    bias = [n for n in saved if n.endswith("e_score_correction_bias")]
    assert bias and all(np.array_equal(frozen[n], saved[n]) for n in bias)  # kept, not updated


def test_deepseek_v3_with_mtp_logs_the_lm_loss_its_eval_loss_compares_to(corpus, tmp_path):
    """The logged `loss` is the loss optimized: the LM loss + 0.3 x mtp_loss + the router terms, which eval_loss
    leaves out, so the loss curve sat well above the eval points. Each record carries the LM part too, `lm_loss`, and
    the terms add up to `loss` (every step applied, logged every 2 steps of 2 micro-batches)."""
    cfg = write_config(tmp_path, corpus, model_name_or_path="micro-deepseek-v3", max_steps=4, logging_steps=2,
                       save_steps=4, gradient_accumulation_steps=2, router_aux_loss_coef=0.01,
                       router_z_loss_coef=0.001)
    assert cli_main(["train", cfg]) == 0
    train = [r for r in _records(tmp_path / "out") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 4]
    for r in train:
        weighted = r["lm_loss"] + 0.3 * r["mtp_loss"] + 0.01 * r["aux_loss"] + 0.001 * r["z_loss"]
        assert r["loss"] == pytest.approx(weighted, abs=1e-5), r
        assert r["loss"] - r["lm_loss"] > 1.0  # ~0.3 x mtp_loss: ~ln(512) untrained


def test_a_dense_model_with_mtp_logs_its_mtp_and_lm_loss(corpus, tmp_path):
    """A model whose decoder layers are all dense (DeepSeek-V3's first_k_dense_replace = every layer) with an MTP
    module adds 0.3 x mtp_loss to its loss as well: its records carry mtp_loss and lm_loss too (they were logged only
    for decoders with sparse layers, so its loss sat above its eval points unexplained); the module's layer, sparse as
    DeepSeek's published one, adds its balance loss."""
    import json
    import shutil

    from pretrain_cli.config.presets import resolve_model_dir

    model = tmp_path / "dense-mtp"
    shutil.copytree(resolve_model_dir("micro-deepseek-v3"), model)
    hf = json.loads((model / "config.json").read_text())
    hf["first_k_dense_replace"] = hf["num_hidden_layers"]
    (model / "config.json").write_text(json.dumps(hf))
    cfg = write_config(tmp_path, corpus, model_name_or_path=str(model), max_steps=2, logging_steps=1, save_steps=2)
    assert cli_main(["train", cfg]) == 0
    train = [r for r in _records(tmp_path / "out") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        # the MTP module's layer is the model's one sparse layer (`ModelConfig.expert_layers`): its balance loss
        # counts (x DeepSeek-V3's aux_loss_alpha, 1e-4)
        assert r["loss"] == pytest.approx(r["lm_loss"] + 0.3 * r["mtp_loss"] + 1e-4 * r["aux_loss"], abs=1e-6), r
        assert r["aux_loss"] > 0
        assert len(r["moe_expert_share_per_layer"]) == 1  # only the MTP module's own layer routes (DeepSeek's)
