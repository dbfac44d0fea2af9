"""Sequence parallelism with tensor parallelism in one process: the keys (config.resolve) and what `plan` models.
The multi-process training against one process: tests/distributed/test_sequence_parallel.py."""
import json

import pytest
from plan_helpers import plan
from run_helpers import model_config, resolve_run

from pretrain_cli.errors import UserError
from pretrain_cli.planning.activations import activation_parts
from pretrain_cli.planning.memory import Setup

LLAMA = {"model_name_or_path": "llama-3.1-8b", "input_dir": "./data", "output_dir": "./out",
         "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "max_seq_length": 8192,
         "bf16": True, "fp16_opt_level": "O2", "use_flash_attention": True, "max_steps": 1000, "do_train": True}


def _resolve(world: int, **keys):
    return resolve_run(*[tok for k, v in keys.items() for tok in (f"--{k}", str(v))], world=world)


def test_sequence_parallel_runs_on_the_tensor_parallel_engine_or_inside_pipeline_stages():
    tp = _resolve(2, tensor_parallel_degree=2, sequence_parallel="true").parallel
    assert (tp.engine, tp.sequence_parallel, tp.vocab_parallel) == ("tensor_parallel", True, False)  # head whole
    assert "tp 2 + sp" in tp.describe()
    zero1 = _resolve(4, tensor_parallel_degree=2, sequence_parallel="true", sharding="stage1").parallel
    assert (zero1.engine, zero1.sharding_stage, zero1.sharding_degree) == ("tensor_parallel", 1, 2)
    pp = _resolve(4, tensor_parallel_degree=2, pipeline_parallel_degree=2, sequence_parallel="true",
                  gradient_accumulation_steps=4).parallel
    assert (pp.engine, pp.sequence_parallel) == ("pipeline", True)
    plain = _resolve(2, tensor_parallel_degree=2).parallel
    assert (plain.engine, plain.sequence_parallel) == ("semi_auto", False)
    alone = _resolve(2, sequence_parallel="true")
    assert not alone.parallel.sequence_parallel
    assert any("only meaningful with tensor parallelism" in n for n in alone.notes)


def test_sequence_parallelism_with_zero2_runs_on_fleet_groups():
    """sp with ZeRO-2: fleet's sharding optimizer over the data ranks (the unowned gradients released after each
    update), not the semi-auto engine."""
    p = _resolve(4, tensor_parallel_degree=2, sequence_parallel="true", sharding="stage2").parallel
    assert (p.engine, p.sharding_stage, p.sharding_degree, p.sequence_parallel) == ("tensor_parallel", 2, 2, True)


@pytest.mark.parametrize("world,keys,message", [
    (4, dict(sharding="stage3"), "not supported with sharding: stage3"),
    (2, dict(max_seq_length=33), "max_seq_length 33 is not divisible by tensor_parallel_degree 2"),
])
def test_layouts_sequence_parallelism_does_not_run_are_refused_in_one_line(world, keys, message):
    with pytest.raises(UserError) as e:
        _resolve(world, tensor_parallel_degree=2, sequence_parallel="true", **keys)
    assert message in str(e.value) and "\n" not in str(e.value).strip()


def test_memory_model_cuts_norm_and_residual_activations_by_tp():
    cfg = model_config("micro-qwen2")
    base = dict(model=cfg, micro_batch=2, seq_len=64, tp=2)
    # full recompute keeps only each layer's input (the residual stream) and the final norm: exactly / tp
    kept, _ = activation_parts(Setup(**base, recompute="full"))
    kept_sp, _ = activation_parts(Setup(**base, recompute="full", sp=True))
    assert kept_sp == pytest.approx(kept / 2)
    # without recompute the projections' shares are / tp already; the norms' and residuals' now are too, but for the
    # norm outputs the projections keep (all-gathered to the whole sequence)
    whole, _ = activation_parts(Setup(**base))
    cut, _ = activation_parts(Setup(**base, sp=True))
    c, h, tokens, layers = 4, cfg.hidden_size, 2 * 64, cfg.num_hidden_layers
    assert kept / 2 < whole - cut < whole / 2
    assert whole - cut > tokens * layers * (c * h / 2)  # at least the residual stream's half


def test_plan_counts_sequence_parallel_activations(tmp_path):
    path = tmp_path / "l.json"
    path.write_text(json.dumps(LLAMA))
    tp = plan(str(path), ["--tensor_parallel_degree", "8"], device="H100", gpus=8, suggest_changes=False)
    sp = plan(str(path), ["--tensor_parallel_degree", "8", "--sequence_parallel", "true"], device="H100", gpus=8,
              suggest_changes=False)
    a_tp, a_sp = tp["memory_breakdown_gib"]["activations"], sp["memory_breakdown_gib"]["activations"]
    assert a_sp < 0.8 * a_tp, (a_tp, a_sp)
