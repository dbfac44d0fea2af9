"""One resolved run configuration: the decisions `plan`, `check` and `train` share, made once."""
import math

import pytest
from run_helpers import model_config, resolve_run

from plan_helpers import plan
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


def test_plan_models_the_attention_and_recompute_that_train_runs(tmp_path):
    import json

    cfg = tmp_path / "a.json"
    cfg.write_text(json.dumps({"model_name_or_path": "qwen2.5-0.5b", "output_dir": "o", "input_dir": "d",
                               "do_train": True, "max_steps": 10, "bf16": True, "max_seq_length": 2048,
                               "per_device_train_batch_size": 4}))
    reports = {}
    for flash in ("true", "false"):
        for recompute in ("true", "false"):
            over = ["--use_flash_attention", flash, "--recompute", recompute]
            r = plan(str(cfg), over, device="A100-80GB", suggest_changes=False)
            run = resolve_run(*over, "--bf16", "--max_seq_length", "2048", "--per_device_train_batch_size", "4",
                              device="gpu", gpu_name="A100-80GB", model="qwen2.5-0.5b")
            assert r["attention"] == run.kernels.attention
            assert r["recompute"] == run.recompute_granularity
            reports[flash, recompute] = r["memory_breakdown_gib"]["activations"]
    assert reports["true", "false"] < reports["false", "false"]  # flash drops the scores
    assert reports["false", "true"] < reports["false", "false"]
    # the flash suggestion exists because the run would materialise the scores
    r = plan(str(cfg), ["--use_flash_attention", "false", "--per_device_train_batch_size", "64"],
             device="A100-80GB")
    assert any(s["change"] == {"use_flash_attention": True} for s in r["suggestions"])


def test_hardware_flops_count_the_recomputed_forward():
    from pretrain_cli.models.flops import flops_per_token
    from pretrain_cli.training.metrics import Throughput

    cfg = model_config()
    plain = Throughput.for_run(resolve_run("--max_seq_length", "32"), cfg, None)
    full = Throughput.for_run(resolve_run("--max_seq_length", "32", "--recompute"), cfg, None)
    assert plain.hw_flops == plain.flops == full.flops
    assert full.hw_flops == flops_per_token(cfg, 32, recompute="full", hardware=True) > full.flops


ZEN4 = "processor\t: 0\ncpu MHz\t\t: 2596.150\nflags\t\t: fpu sse2 avx fma avx2 avx512f\n\nprocessor\t: 1\ncpu MHz\t\t: 2400.0\n"


def test_cpu_peak_is_the_cores_theoretical_bound_stated_as_an_assumption():
    """The same figure in every run on one machine (no timed matmul, which ranged 15.7-214.8 GFLOP/s on a
    shared machine): cores x the highest reported clock x FLOPs/cycle of the widest FMA flag."""
    from pretrain_cli.training.metrics import cpu_peak_tflops

    peak, why = cpu_peak_tflops(ZEN4, cores=2, max_khz=[])
    assert peak == pytest.approx(2 * 2.59615 * 64 / 1e3)
    assert "assumed fp32 peak of 332.3 GFLOP/s = 2 core(s) x 2.60 GHz x 64 FLOP/cycle (avx512f" in why
    assert "set peak_tflops" in why
    assert cpu_peak_tflops(ZEN4, cores=1, max_khz=[3_700_000, 3_500_000])[0] == pytest.approx(3.7 * 64 / 1e3)
    avx2 = ZEN4.replace(" avx512f", "")
    assert cpu_peak_tflops(avx2, cores=1, max_khz=[])[0] == pytest.approx(2.59615 * 32 / 1e3)
    assert cpu_peak_tflops("processor\t: 0\n", cores=1, max_khz=[]) == (
        None, "this CPU reports no clock or vector flags: no MFU (set peak_tflops to report one)")


def test_mfu_above_one_is_never_reported(caplog):
    from pretrain_cli.training.metrics import Throughput

    tp = Throughput(32, 4, 1, 1, flops_per_token=1e9, hw_flops_per_token=1e9, peak_tflops=1.0)
    assert tp._mfu(500.0) == 0.5  # 500 tokens/s x 1 GFLOP = 0.5 TFLOP/s of a 1 TFLOP/s peak
    with caplog.at_level("WARNING", logger="pretrain_cli"):
        assert tp._mfu(1500.0) == "unknown" and tp._mfu(2000.0) == "unknown"
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mfu:")]
    assert len(warned) == 1 and "1.50 of the 1000.0 GFLOP/s peak cannot be true" in warned[0]
    assert Throughput(32, 4, 1, 1, 1e9, 1e9, None)._mfu(1e9) == "unknown"


def _checkpoint_of(tmp_path, run):
    """A checkpoint directory whose args.json records `run` (all `keep_global_batch` reads)."""
    import json

    ckpt = tmp_path / "checkpoint-5"
    ckpt.mkdir()
    (ckpt / "args.json").write_text(json.dumps({"run": run.to_dict()}))
    return ckpt


def test_resume_on_fewer_data_ranks_keeps_the_global_batch_or_says_which_keys(tmp_path):
    """2 ranks x 4 sequences resumed on 1 rank: accumulation 2 keeps 8 a step (and eval_iters doubles to keep
    the eval windows), with notes; a batch no accumulation makes is one line naming the keys."""
    from run_helpers import BASE

    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.orchestration.resumed import keep_global_batch
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.run_config import Target

    cfg = model_config()
    common = ["--per_device_train_batch_size", "4", "--do_eval", "true", "--eval_iters", "3"]
    ckpt = _checkpoint_of(tmp_path, resolve_run(*common, world=2))
    args = parse_config(None, [*BASE, *common])
    run = keep_global_batch(args, resolve(args, cfg, Target("cpu", 1)), cfg, Target("cpu", 1), ckpt)
    assert (run.loop.grad_accum, run.global_batch_size, run.loop.eval_iters) == (2, 8, 6)
    assert any("gradient_accumulation_steps 1 -> 2 keeps 8 sequences a step" in n for n in run.notes), run.notes
    assert any("eval_iters 3 -> 6 keeps the" in n for n in run.notes)
    # the same run resumed on 2 ranks again: nothing changes, nothing is said
    same = resolve_run(*common, world=2)
    assert keep_global_batch(parse_config(None, [*BASE, *common]), same, cfg, Target("cpu", 2), ckpt) == same
    # on the same 2 ranks with another micro-batch: the global batch changes, said once (it was silent)
    args = parse_config(None, [*BASE, *common, "--per_device_train_batch_size", "2"])
    run = keep_global_batch(args, resolve(args, cfg, Target("cpu", 2)), cfg, Target("cpu", 2), ckpt)
    assert [n for n in run.notes if n.startswith("batch:")] == [
        "batch: checkpoint-5 was trained on 8 sequences a step (4 x acc 1 x 2 data ranks); this run takes 4 "
        "from here on"]
    # the user changed the batch keys: their choice, named
    args = parse_config(None, [*BASE, *common, "--per_device_train_batch_size", "2"])
    run = keep_global_batch(args, resolve(args, cfg, Target("cpu", 1)), cfg, Target("cpu", 1), ckpt)
    assert run.global_batch_size == 2 and any("2 sequences a step from here on" in n for n in run.notes)
    # 2 ranks x 3 = 6 sequences on 4 ranks of 3: no accumulation makes 6
    odd = tmp_path / "odd"
    odd.mkdir()
    ckpt = _checkpoint_of(odd, resolve_run("--per_device_train_batch_size", "3", world=2))
    args = parse_config(None, [*BASE, "--per_device_train_batch_size", "3"])
    # in the batch: line's words and order (it said "2 data rank(s) x 3 x acc 1")
    with pytest.raises(UserError, match=r"gradient_accumulation_steps: checkpoint-5 was trained on 3 x acc 1 x 2 data "
                                        r"ranks = 6 sequences a step; this run has 4 data ranks, .* set "
                                        r"per_device_train_batch_size and "
                                        r"gradient_accumulation_steps so that their product x 4 = 6"):
        keep_global_batch(args, resolve(args, cfg, Target("cpu", 4)), cfg, Target("cpu", 4), ckpt)


def test_an_eval_split_smaller_than_its_batches_is_noted():
    from types import SimpleNamespace

    from pretrain_cli.orchestration.prepare import eval_repeats

    run = resolve_run("--do_eval", "true", "--do_predict", "true", "--eval_iters", "4",
                      "--per_device_eval_batch_size", "8")
    splits = SimpleNamespace(get={"valid": list(range(22)), "test": list(range(40))}.get)
    notes = eval_repeats(run, splits)
    # the test pass's factor 10 is named where it comes from (it read "10 x eval_iters 4", unexplained)
    assert notes == ["eval: the valid split holds 22 samples, fewer than eval_iters 4 x per_device_eval_batch_size 8 "
                     "x 1 data rank = 32, so evaluation repeats samples; eval_iters 2 reads each once",
                     "eval: the test split holds 40 samples, fewer than test_iters 40 (10 x eval_iters 4: the test pass "
                     "reads ten times as many batches, as PaddleNLP's run_pretrain.py) x per_device_eval_batch_size 8 "
                     "x 1 data rank = 320, so evaluation repeats samples; even eval_iters 1 reads 80 samples here "
                     "(test_iters 10 x per_device_eval_batch_size 8 x 1 data rank): give the test split a larger share "
                     "of `split`, or lower per_device_eval_batch_size"]
    on_two = resolve_run("--do_eval", "true", "--eval_iters", "4", "--per_device_eval_batch_size", "8", world=2)
    assert "x 2 data ranks = 64," in eval_repeats(on_two, splits)[0]
    assert run.loop.test_iters == 40  # PaddleNLP's run_pretrain.py: test_iters = eval_iters * 10
    # a resume that raised eval_iters to keep its checkpoint's eval windows is not told to lower it again
    import dataclasses

    kept = dataclasses.replace(run, notes=("eval: eval_iters 2 -> 4 keeps the 32 eval windows of checkpoint-5's run",))
    assert eval_repeats(kept, splits)[0].endswith("so evaluation repeats samples; as the checkpoint's run did (its "
                                                  "eval windows are kept, above, so the curve goes on comparable)")


def test_plan_of_a_cpu_file_says_which_device_it_plans_and_how_to_plan_this_machine():
    """`plan configs/demo_cpu.json` (no --device) said "planning for gpu as --device asks": no --device was given
    (plan's default, A100-80GB, was planned) and the device was named by its kind."""
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.run_config import Target
    from run_helpers import BASE

    args = parse_config(None, BASE)  # device cpu
    run = resolve(args, model_config(), Target("gpu", 1, gpu_name="A100-80GB", planned=True))
    note = [n for n in run.notes if n.startswith("device:")]
    assert note == ["device: the file says 'cpu'; planning for A100-80GB (plan's --device, or its default); "
                    "`plan --device cpu` plans this machine"]
    assert "as --device asks" not in " ".join(run.notes)


def test_parallel_degrees_follow_paddlenlp_arithmetic():
    p = resolve_run("--sharding", "stage1", world=8, rank=5).parallel
    assert (p.dp_degree, p.sharding_degree, p.sharding_stage, p.data_world_size, Topology.of(p).data_rank) == (1, 8, 1, 8, 5)
    p = resolve_run("--sharding", "stage1", "--sharding_parallel_degree", "2", world=8).parallel
    assert (p.dp_degree, p.sharding_degree) == (4, 2)
    p = resolve_run("--tensor_parallel_degree", "2", world=4, rank=3).parallel
    assert (p.dp_degree, p.tp_degree, Topology.of(p).data_rank, p.data_world_size) == (2, 2, 1, 2)
    with pytest.raises(UserError, match="sharding_parallel_degree: 3 does not divide"):
        resolve_run("--sharding", "stage1", "--sharding_parallel_degree", "3", world=8)


def test_one_perplexity_rule_for_every_evaluation():
    """The trainer capped perplexity at exp(50) and `eval` at exp(700): one rule now."""
    from pretrain_cli import runtime

    paddle = runtime.import_paddle()
    import numpy as np

    from pretrain_cli.distributed.comms.comm import NoComm
    from pretrain_cli.models import build_model
    from pretrain_cli.training.evaluation import perplexity
    from pretrain_cli.training.run import lay_out
    from pretrain_cli.training.trainer import Trainer

    assert perplexity(60.0) == math.exp(60.0) and perplexity(800.0) == math.exp(700.0)
    cfg = model_config("micro-llama")
    paddle.seed(0)
    model = build_model(cfg)
    with paddle.no_grad():
        model.lm_head.weight.set_value(model.lm_head.weight * 400.0)  # a confidently wrong model: loss > 50

    class Split:
        def __getitem__(self, i):
            t = np.random.default_rng(i).integers(0, cfg.vocab_size, 9)
            return {"input_ids": t[:-1], "labels": t[1:]}

    class Splits:
        def get(self, name):
            return Split()

    run = resolve_run("--eval_iters", "1", "--per_device_eval_batch_size", "2")
    trainer = Trainer(lay_out(run, model, NoComm()), Splits(), run, NoComm())
    values = trainer.evaluate("valid")
    assert values["eval_loss"] > 50
    assert values["eval_ppl"] == pytest.approx(math.exp(values["eval_loss"]), rel=1e-6)


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


def test_a_resumed_schedule_stretches_keeps_or_restarts_and_says_which(tmp_path):
    import json
    from dataclasses import asdict

    from pretrain_cli.orchestration.resumed import resume_schedule

    sched = ["--lr_scheduler_type", "cosine", "--warmup_steps", "10", "--learning_rate", "3e-4",
             "--min_learning_rate", "3e-5"]
    old = resolve_run(*sched, "--max_steps", "100")
    ckpt = tmp_path / "checkpoint-100"
    ckpt.mkdir()
    (ckpt / "args.json").write_text(json.dumps({"run": {"schedule": asdict(old.schedule)}}))
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 100, "consumed_samples": 800}))
    new = resolve_run(*sched, "--max_steps", "150")
    stretched = resume_schedule(new, ckpt, "stretch")
    assert stretched.schedule == new.schedule and stretched.schedule.lr_at(101) > 3 * old.schedule.lr_at(100)
    [note] = [n for n in stretched.notes if n.startswith("schedule:")]
    assert "trained on cosine, warmup 10, decay to 3e-05 by step 100; stretched to this run's: cosine, warmup 10, " \
           "decay to 3e-05 by step 150" in note and "lr_schedule_on_resume: keep or restart" in note
    kept = resume_schedule(new, ckpt, "keep").schedule
    assert kept == old.schedule and kept.lr_at(120) == pytest.approx(3e-5)
    restarted = resume_schedule(new, ckpt, "restart").schedule
    assert restarted.lr_at(101) == pytest.approx(3e-4 / 10) and restarted.lr_at(110) == pytest.approx(3e-4)
    assert restarted.lr_at(150) == pytest.approx(3e-5) and restarted.describe().endswith("by step 150")
    assert resume_schedule(old, ckpt, "stretch") is old  # the same schedule: nothing to say


def test_plan_and_train_apply_one_hardware_rule(monkeypatch):
    """On a GPU that predates Ampere (no bf16 tensor cores: no flash-attn-2), `train`'s target, named by the
    driver, resolves the attention `plan --device V100` models, and the trainer's MFU peak is the plan's."""
    from run_helpers import BASE

    from pretrain_cli import runtime
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.orchestration import targets
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.run_config import Target
    from pretrain_cli.training import metrics

    monkeypatch.setattr(runtime, "gpu_build_installed", lambda: True)
    monkeypatch.setattr(runtime, "gpu_name", lambda: "Tesla V100-SXM2-32GB")
    train_target = targets.launcher_target()
    assert train_target.device == "gpu" and train_target.gpu_name == "Tesla V100-SXM2-32GB"
    args = parse_config(None, [*BASE, "--use_flash_attention", "true", "--fp16", "--device", "gpu"])
    trained = resolve(args, model_config(), train_target)
    planned = resolve(args, model_config(), Target("gpu", 1, 0, 0, "V100-32GB", planned=True))
    assert trained.kernels.attention == planned.kernels.attention == "math"
    assert any("predates Ampere" in n for n in trained.notes)
    assert metrics.resolve_peak("gpu", "float16", None)[0] == 125.0  # the table's V100 fp16 peak, as `plan` reads it


def test_the_gpu_default_runs_the_fused_loss_only_where_it_saves_memory_at_the_head():
    """On a GPU the fused head + loss only buys memory, and keeps the head's fp32 dW (3·4·V·hidden) instead of the
    logits: PaddleNLP's Llama-3.1-70B shape (tp 8 x pp 4, 4,096 tokens a micro-batch under hidden 8,192) holds less
    unfused, so the default is off there, with a note giving both terms; at 32,768 tokens it is on, unless context
    parallelism leaves each rank 4,096 again. The file's true is obeyed; on CPU (the faster kernel) it stays on."""
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
        "(hidden 8,192, vocab 128,256) the fused head + loss would hold 11.99 GiB (the head's fp32 dW) against the "
        "logits' 5.49 GiB; set it true to run it anyway"])
    assert run("--max_seq_length", "32768") == (True, [])
    off, [note] = run("--max_seq_length", "32768", "--context_parallel_degree", "8", "--tensor_parallel_degree", "2")
    assert not off and "at 4,096 tokens a micro-batch" in note  # 32,768 / cp 8 at the head of each rank
    assert run("--use_fused_linear_cross_entropy", "true") == (True, [])
    assert run("--max_seq_length", "32768", "--use_fused_linear_cross_entropy", "false") == (False, [])
    assert run(device="cpu") == (True, [])
