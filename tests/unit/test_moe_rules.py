"""How a Mixture-of-Experts run's keys resolve against its model and layout (config/moe.py, config/parallel.py):
what is refused in one line before anything runs, and what only gets a note because it changes nothing."""
import dataclasses

import pytest

from pretrain_cli.config.parser import parse_config
from pretrain_cli.config.resolve import resolve
from pretrain_cli.errors import UserError
from pretrain_cli.run_config import Target
from run_helpers import BASE, model_config


def _resolve(model, *keys, world=1, **changes):
    cfg = dataclasses.replace(model_config(model), **changes) if changes else model_config(model)
    return resolve(parse_config(None, [*BASE, *keys]), cfg, Target("cpu", world, 0, 0, None))


@pytest.mark.parametrize("width", ["moe_intermediate_size", "shared_expert_intermediate_size"])
def test_an_expert_width_tensor_parallelism_does_not_divide_is_refused_in_one_line(width):
    """It passed `check`, trained, and died at the first save (its pieces did not cover the weight)."""
    with pytest.raises(UserError) as e:
        _resolve("micro-qwen2-moe", "--tensor_parallel_degree", "2", world=2, **{width: 33})
    assert f"tensor_parallel_degree: 2 does not divide the model's {width} (33)" in str(e.value)
    assert _resolve("micro-qwen2-moe", "--tensor_parallel_degree", "2", world=2).parallel.tp_degree == 2


def test_zero2_and_3_balance_over_the_global_batch_and_say_so():
    """Paddle's semi-auto engine computes the balance loss over the global batch: the micro_batch scope cannot be
    had there, so the scope is global (the same objective as dp with global), with a note unless the file chose it."""
    run = _resolve("micro-qwen3-moe", "--sharding", "stage3", world=2)
    assert run.moe.aux_loss_scope == "global"
    assert any(n.startswith("moe_aux_loss_scope: global: with sharding stage2/3") for n in run.notes)
    run = _resolve("micro-qwen3-moe", "--sharding", "stage2", "--moe_aux_loss_scope", "global", world=2)
    assert run.moe.aux_loss_scope == "global" and not any(n.startswith("moe_aux_loss_scope") for n in run.notes)
    assert _resolve("micro-qwen3-moe", world=2).moe.aux_loss_scope == "micro_batch"  # plain dp keeps the file's


def test_keys_a_model_cannot_use_get_a_note():
    run = _resolve("micro-deepseek-v3", "--moe_aux_loss_scope", "global", world=2)
    assert any("moe_aux_loss_scope: no effect on deepseek_v3" in n for n in run.notes)
    run = _resolve("micro-qwen3-moe", "--mtp_loss_weight", "0.5")
    assert any(n.startswith("mtp_loss_weight: the model has no multi-token prediction module") for n in run.notes)
    assert not any(n.startswith("mtp_loss_weight") for n in _resolve("micro-deepseek-v3", "--mtp_loss_weight",
                                                                      "0.5").notes)


def test_a_checkpoints_router_bias_routes_eval_and_a_frozen_resume(tmp_path):
    """A Qwen-MoE run trained with the auxiliary-loss-free bias: a model built for `eval`/`generate` (or a resume at
    rate 0) without the bias silently dropped the checkpoint's and routed otherwise than the run did."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    from pretrain_cli import runtime
    from pretrain_cli.models import build_model
    from pretrain_cli.run_config import MoeConfig
    from pretrain_cli.training.weight_source import holds_router_bias, load_for_inference

    paddle = runtime.import_paddle()
    cfg = model_config("micro-qwen3-moe")
    paddle.seed(1)
    trained = build_model(cfg, None, MoeConfig(bias_update_rate=0.01))
    biases = {n: p for n, p in trained.named_parameters() if n.endswith("e_score_correction_bias")}
    assert biases
    for i, p in enumerate(biases.values()):
        p.set_value(paddle.to_tensor(np.linspace(-1, 1, p.shape[0]).astype("float32") * (i + 1)))
    save_file({n: p.numpy() for n, p in trained.named_parameters()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    assert holds_router_bias(tmp_path, "resume")
    model, _ = load_for_inference(tmp_path, cfg, seed=0, device="cpu")
    loaded = dict(model.named_parameters())
    for name, p in biases.items():
        np.testing.assert_array_equal(loaded[name].numpy(), p.numpy())
    ids = paddle.to_tensor(np.arange(32, dtype="int64").reshape(2, 16) % cfg.vocab_size)
    trained.eval()
    model.eval()
    np.testing.assert_allclose(model(ids).numpy(), trained(ids).numpy(), rtol=1e-5, atol=1e-5)


def test_a_model_larger_than_the_machine_is_refused_before_it_is_built(tmp_path, monkeypatch, capsys):
    """A CPU run of a model whose fp32 weights alone exceed the machine grew until the OOM killer ended it (no error
    of ours); eval (as generate, through the same loader) and train/check now say so in one line first."""
    from data_helpers import write_tokens
    from pretrain_cli.cli import main as cli_main
    from pretrain_cli.planning import hardware

    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 20.0)
    data = write_tokens(tmp_path / "d")
    assert cli_main(["eval", "--model", "qwen3-30b-a3b", "--data", data, "--max_seq_length", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "running qwen3_moe with 30.53 B parameters on this CPU needs at least 114 GiB" in err[0]
    assert cli_main(["check", "--model_name_or_path", "qwen3-30b-a3b", "--output_dir", str(tmp_path / "o"),
                     "--input_dir", data, "--do_train", "--max_steps", "1", "--device", "cpu"]) == 2
    assert "training qwen3_moe with 30.53 B parameters on this CPU needs at least 455 GiB" in capsys.readouterr().err
    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 2000.0)  # a machine it fits: not refused for memory
    monkeypatch.setattr(hardware, "host_available_gib", lambda *a, **k: (2000.0, "MemAvailable"))  # nor its run
    rc = cli_main(["check", "--model_name_or_path", "qwen3-30b-a3b", "--output_dir", str(tmp_path / "o"),
                   "--input_dir", data, "--do_train", "--max_steps", "1", "--device", "cpu"])
    err = capsys.readouterr().err
    assert "needs at least" not in err and "planned to need" not in err and rc == 0, err
