"""One resolved run configuration: the decisions `plan`, `check` and `train` share, made once (the attention path,
the kernels, the optimizer, document masking, the fused head + loss, the parallel degrees, every default). What
`plan` and the throughput figures read of it: test_run_config_plan.py; a resume: test_run_config_resume.py;
evaluation: test_run_config_eval.py."""
import pytest
from run_helpers import model_config, resolve_run

from pretrain_cli.distributed.layout.topology import Topology
from pretrain_cli.errors import UserError


@pytest.mark.parametrize("flash,device,precision,gpu_name,want", [
    (True, "cpu", [], None, "flash"),  # the fused block-causal kernel
    (False, "cpu", [], None, "math"),
    (True, "gpu", ["--bf16"], "A100-80GB", "flash"),
    (False, "gpu", ["--bf16"], "A100-80GB", "math"),  # the key now means what PaddleNLP users rely on
    (True, "gpu", [], "A100-80GB", "math"),  # flash-attn needs fp16/bf16
    (True, "gpu", ["--fp16"], "V100-16GB", "math"),  # no flash-attn-2 before Ampere
])
def test_use_flash_attention_decides_the_attention_path(flash, device, precision, gpu_name, want):
    run = resolve_run("--use_flash_attention", str(flash).lower(), "--device", device, *precision,
                      device=device, gpu_name=gpu_name)
    assert run.kernels.attention == want
    if flash and want == "math":
        assert any("use_flash_attention" in n for n in run.notes)  # never silently


def test_one_source_for_every_default():
    """An argument file that sets only what it must resolves (on CPU, one process) to every part's own defaults,
    and the kernel request `ops.kernels` defaults to is the run configuration's (one class)."""
    from dataclasses import fields, replace

    from pretrain_cli import run_config
    from pretrain_cli.ops import kernels

    run = resolve_run()
    assert run.kernels == run_config.KernelConfig()
    set_by_the_file = {"data": {"input_dir": "d"}, "loop": {"do_train": True, "max_steps": 5},
                       "schedule": {"decay_steps": 5}, "output": {"output_dir": "o"}}
    for f in fields(run):
        part = getattr(run, f.name)
        if f.name in ("device", "notes") or part is None:  # "cpu" here; no notes; recompute off
            continue
        assert part == replace(type(part)(), **set_by_the_file.get(f.name, {})), f.name
    assert resolve_run("--recompute").recompute == run_config.Recompute()


def test_kernels_run_what_the_run_config_asked_for():
    from pretrain_cli import runtime

    runtime.import_paddle()
    from pretrain_cli.ops import kernels

    math_path = kernels.select(resolve_run("--use_flash_attention", "false").kernels, "cpu")
    flash_path = kernels.select(resolve_run("--use_flash_attention", "true").kernels, "cpu")
    assert math_path.attention is kernels.attention_sdpa_mask  # materialises [b, heads, s, s]
    assert flash_path.attention is kernels.attention_cpu  # block-causal, never holds the scores


@pytest.mark.parametrize("flags,world,device,want", [
    ([], 1, "cpu", "fused"),  # one process, fp32, CPU: the multi-tensor AdamW
    ([], 2, "cpu", "fused"),  # plain data parallel: every rank holds whole gradients after the all-reduce
    (["--cpu_fused_optimizer", "false"], 1, "cpu", "paddle"),
    (["--cpu_fused_ops", "false"], 1, "cpu", "paddle"),  # the kernel is one of the fused CPU kernels
    (["--sharding", "stage1"], 2, "cpu", "paddle"),  # fleet's ZeRO-1 updates its own shard
    (["--sharding", "stage2"], 2, "cpu", "paddle"),  # semi-auto's shard_optimizer
    (["--tensor_parallel_degree", "2"], 2, "cpu", "paddle"),
    (["--bf16"], 1, "gpu", "paddle"),  # the GPU keeps Paddle's optimizer
    ([], 1, "gpu", "paddle"),
])
def test_the_fused_optimizer_runs_only_where_it_is_paddles_adamw(flags, world, device, want):
    run = resolve_run("--device", device, *flags, world=world, device=device, gpu_name="A100-80GB")
    assert run.kernels.optimizer == want


def test_parallel_degrees_follow_paddlenlp_arithmetic():
    p = resolve_run("--sharding", "stage1", world=8, rank=5).parallel
    assert (p.dp_degree, p.sharding_degree, p.sharding_stage, p.data_world_size, Topology.of(p).data_rank) == (1, 8, 1, 8, 5)
    p = resolve_run("--sharding", "stage1", "--sharding_parallel_degree", "2", world=8).parallel
    assert (p.dp_degree, p.sharding_degree) == (4, 2)
    p = resolve_run("--tensor_parallel_degree", "2", world=4, rank=3).parallel
    assert (p.dp_degree, p.tp_degree, Topology.of(p).data_rank, p.data_world_size) == (2, 2, 1, 2)
    with pytest.raises(UserError, match="sharding_parallel_degree: 3 does not divide"):
        resolve_run("--sharding", "stage1", "--sharding_parallel_degree", "3", world=8)


def test_attention_mask_type_and_reset_position_ids_are_resolved_once():
    plain = resolve_run()
    assert (plain.data.attention_mask_type, plain.data.reset_position_ids, plain.data.document_mask) == (
        "causal", False, False)
    doc = resolve_run("--attention_mask_type", "document")
    assert (doc.data.attention_mask_type, doc.data.reset_position_ids, doc.data.document_mask) == (
        "document", True, True)
    assert resolve_run("--attention_mask_type", "document", "--reset_position_ids", "false").data.reset_position_ids \
        is False
    padded = resolve_run("--attention_mask_type", "document", "--sample_mode", "padded")
    assert padded.data.attention_mask_type == "causal"
    assert any("sample_mode padded" in n for n in padded.notes)  # never silently
    ignored = resolve_run("--reset_position_ids", "true")
    assert not ignored.data.reset_position_ids and any("reset_position_ids" in n for n in ignored.notes)
    with pytest.raises(UserError, match="attention_mask_type"):
        resolve_run("--attention_mask_type", "segment")
    assert doc.to_dict()["data"]["attention_mask_type"] == "document"  # recorded in args.json


def test_fused_loss_is_the_default_and_off_only_where_tp_splits_the_vocabulary():
    """The fused head + loss reads the whole head weight: it runs wherever tensor parallelism leaves the head whole
    (the layout steps' split: inside pipeline stages, with sequence, context or expert parallelism, multi-head latent
    attention; the semi-auto engine over a vocabulary tp does not divide) and only a vocabulary-split head keeps
    the logits, with a note when the file asked for the fused loss."""
    import dataclasses

    assert resolve_run().kernels.fused_loss
    assert not resolve_run("--use_fused_linear_cross_entropy", "false").kernels.fused_loss
    tp = resolve_run("--tensor_parallel_degree", "2", "--use_fused_linear_cross_entropy", "true", world=2)
    assert tp.parallel.engine == "semi_auto" and tp.parallel.vocab_parallel and not tp.kernels.fused_loss
    assert [n for n in tp.notes if n.startswith("use_fused_linear_cross_entropy:")] == [
        "use_fused_linear_cross_entropy: tensor_parallel_degree 2 splits the LM head over the vocabulary (it divides "
        "vocab_size 512); the run keeps the logits and the unfused loss"]
    assert not any(n.startswith("use_fused_linear_cross_entropy:") for n in resolve_run(
        "--tensor_parallel_degree", "2", world=2).notes)  # the default is not the file's request: no note
    for stage in ("stage2", "stage3"):  # the semi-auto engine without TP: each rank's rows, the whole head
        zero = resolve_run("--sharding", stage, "--use_fused_linear_cross_entropy", "true", world=2)
        assert zero.parallel.engine == "semi_auto" and zero.kernels.fused_loss
        assert not any(n.startswith("use_fused_linear_cross_entropy:") for n in zero.notes)
    whole = [  # (engine, world, model, keys): the layout steps' tp, the embedding and LM head whole on each tp rank
        ("pipeline", 4, "micro-qwen2", ["--pipeline_parallel_degree", "2"]),
        ("tensor_parallel", 2, "micro-qwen2", ["--sequence_parallel", "true"]),
        ("tensor_parallel", 4, "micro-qwen2", ["--context_parallel_degree", "2"]),
        ("tensor_parallel", 4, "micro-qwen3-moe", ["--expert_parallel_degree", "2"]),
        ("tensor_parallel", 2, "micro-deepseek-v3", []),  # multi-head latent attention
    ]
    for engine, world, model, keys in whole:
        run = resolve_run("--tensor_parallel_degree", "2", "--use_fused_linear_cross_entropy", "true", *keys,
                          world=world, model=model)
        assert (run.parallel.engine, run.parallel.vocab_parallel, run.kernels.fused_loss) == (engine, False, True)
        assert not any(n.startswith("use_fused_linear_cross_entropy:") for n in run.notes)
    from run_helpers import BASE

    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.run_config import Target

    cfg = model_config()
    odd = dataclasses.replace(cfg, vocab_size=cfg.vocab_size + 1)  # 513: semi-auto keeps the head whole
    args = parse_config(None, [*BASE, "--tensor_parallel_degree", "2", "--use_fused_linear_cross_entropy", "true"])
    run = resolve(args, odd, Target("cpu", 2))
    assert (run.parallel.engine, run.parallel.vocab_parallel, run.kernels.fused_loss) == ("semi_auto", False, True)


def test_the_gpu_default_runs_the_fused_loss_only_where_it_saves_memory_at_the_head():
    """On a GPU the fused head + loss only buys memory, and keeps the head's fp32 dW (2·4·V·hidden from two chunks
    of rows on) instead of the logits: PaddleNLP's Llama-3.1-70B shape (tp 8 x pp 4, 4,096 tokens a micro-batch
    under hidden 8,192) holds less unfused, so the default is off there, with a note giving both terms; at 32,768
    tokens it is on, unless context parallelism leaves each rank 4,096 again. The file's true is obeyed; on CPU (the
    faster kernel) it stays on."""
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.orchestration.opened import build_model_config
    from pretrain_cli.orchestration.prepare import load_arguments
    from pretrain_cli.run_config import Target

    def run(*overrides, device="gpu"):
        args = load_arguments("configs/llama-3.1-70b_pretrain.json", list(overrides))
        target = Target(device, 64, gpu_name="H100-SXM" if device == "gpu" else None, planned=True)
        out = resolve(args, build_model_config(args)[1], target)
        return out.kernels.fused_loss, [n for n in out.notes if n.startswith("use_fused_linear_cross_entropy:")]

    assert run() == (False, [
        "use_fused_linear_cross_entropy: off (the file does not set it): at 4,096 tokens a micro-batch at the LM head "
        "(hidden 8,192, vocab 128,256) the fused head + loss would hold 8.08 GiB (the head's fp32 dW) against the "
        "logits' 5.51 GiB; set it true to run it anyway"])
    assert run("--max_seq_length", "32768") == (True, [])
    off, [note] = run("--max_seq_length", "32768", "--context_parallel_degree", "8", "--tensor_parallel_degree", "2")
    assert not off and "at 4,096 tokens a micro-batch" in note  # 32,768 / cp 8 at the head of each rank
    assert run("--use_fused_linear_cross_entropy", "true") == (True, [])
    assert run("--max_seq_length", "32768", "--use_fused_linear_cross_entropy", "false") == (False, [])
    assert run(device="cpu") == (True, [])
