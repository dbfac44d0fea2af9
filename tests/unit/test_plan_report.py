"""What `plan`'s report says about PaddleNLP's DeepSeek-V3 file (pp 2 x `sharding: stage1` x 4 x ep 4 on 8
processes, tests/e2e/paddlenlp_configs): the multi-token prediction module's memory where it runs, and the precision
word without a level."""
from pathlib import Path

import pytest

from pretrain_cli.orchestration import planned
from pretrain_cli.planning.memory import GIB, pipeline_stages
from pretrain_cli.planning.plan import setup_for, target_device
from pretrain_cli.planning.report import format_report

V3_FILE = str(Path(__file__).resolve().parents[1] / "e2e" / "paddlenlp_configs" / "deepseek_v3_pretrain_argument.json")


def test_the_mtp_line_gives_the_modules_memory_on_the_stage_that_runs_them():
    """At pp 2 with 2 sequences a micro-batch the plan's memory is stage 0's (the fullest), where the module costs
    nothing: the line said "0.00 GiB of the memory per device". It gives the last stage's cost now, and names both
    stages. The file as it is (1 sequence) is fullest on its last stage, the one that runs the module: the line names
    that stage alone (stage 0 was the fuller one while every stage was planned with an average layer's activations
    and MLA's at its padded head width)."""
    import dataclasses

    over = ["--per_device_train_batch_size", "2"]
    r = planned.from_file(V3_FILE, over, "H100", 8)
    args, cfg = planned.parse(V3_FILE, over)
    run = planned._resolved(args, cfg, target_device("H100", gpus=8), 8)
    s = setup_for(run, cfg, target_device("H100", gpus=8))
    bare = dataclasses.replace(s, model=dataclasses.replace(cfg, num_nextn_predict_layers=0))
    last = (sum(pipeline_stages(s)[-1].values()) - sum(pipeline_stages(bare)[-1].values())) / GIB
    assert r.mtp["stage"] == 1 and r.mtp["reported_stage"] == 0
    assert r.mtp["memory_gib"] == pytest.approx(last) and r.mtp["memory_gib"] > 50  # its experts ÷ 4, the rest whole
    line = next(x for x in format_report(r).splitlines() if "multi-token prediction" in x)
    assert f"{last:.2f} GiB of the memory per device on stage 1, the last of 2, which runs it" in line
    assert line.endswith("; the memory below is stage 0's, the fullest") and "0.00 GiB" not in line
    as_is = planned.from_file(V3_FILE, [], "H100", 8)  # the last stage is the fullest: named once
    assert as_is.mtp["stage"] == as_is.mtp["reported_stage"] == 1
    line = next(x for x in format_report(as_is).splitlines() if "multi-token prediction" in x)
    assert "on stage 1, the last of 2, which runs it" in line and "the memory below" not in line
    one = planned.from_file(V3_FILE, ["--pipeline_parallel_degree", "1"], "H100", 8)  # no pipeline: as before
    assert one.mtp["stage"] is None and "stage" not in next(
        x for x in format_report(one).splitlines() if "multi-token prediction" in x)


def test_precision_without_a_level_has_no_stray_space():
    text = format_report(planned.from_file(V3_FILE, [], "cpu", 8))
    assert "precision float32; world 8" in text and "float32 ;" not in text
    assert "precision bfloat16 O2; world 8" in format_report(planned.from_file(V3_FILE, [], "H100", 8))


def test_plan_without_gpus_plans_the_processes_the_file_was_written_for(capsys):
    """`plan <file>` planned one device, on which the file's pp 2 x ep 4 x ZeRO-1 over 4 has no effect, and its
    note named check's option (`check --world_size 8`). Without --gpus it plans the 8 processes the layout needs
    and says so; with --gpus 1 the note names plan's own option."""
    from pretrain_cli.cli import main as cli_main

    assert cli_main(["plan", V3_FILE, "--device", "H100"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan: ") and " on 8 x H100-SXM " in out.splitlines()[0]
    assert ("note: gpus: --gpus not given: planned on the 8 processes the file's layout needs (pipeline_parallel_degree "
            "2 x 4 data ranks for expert_parallel_degree 4 and sharding_parallel_degree 4); --gpus N plans it on N") in out
    assert "world 8 = 4 data ranks (one ZeRO stage-1 group of 4)" in out
    one = "\n".join(planned.from_file(V3_FILE, [], "H100", 1).notes)
    assert "the file's layout needs 8 processes: `plan --gpus 8` plans it as they run it" in one
    assert "check --world_size" not in one
    args, f = planned.fit_file(V3_FILE, [], "H100", None)  # --fit too: on the file's 8
    assert f["gpus"] == 8 and f["global_batch"] == 40  # 1 x acc 10 x the 4 data ranks
    assert f["notes"][0].startswith("gpus: --gpus not given: planned on the 8 processes")


@pytest.mark.parametrize("keys,need", [([], 1), (["--tensor_parallel_degree", "2"], 2),
                                       (["--sharding", "stage1", "--sharding_parallel_degree", "4",
                                         "--expert_parallel_degree", "8"], 8),  # data ranks: lcm(4, 8)
                                       (["--sharding", "", "--sharding_parallel_degree", "4"], 1)])
def test_the_fewest_processes_are_the_degrees_and_the_data_ranks_they_need(keys, need):
    from pretrain_cli.config.one_process import fewest_processes

    base = ["--tensor_parallel_degree", "1", "--pipeline_parallel_degree", "1", "--expert_parallel_degree", "1",
            "--sharding", "stage1", "--sharding_parallel_degree", "-1"]
    args, _ = planned.parse(V3_FILE, base + keys)
    assert fewest_processes(args)[0] == need
    if need > 1:  # and the world it names resolves
        assert planned.from_file(V3_FILE, base + keys, "H100", None).gpus == need


def test_counts_read_in_english_and_the_attention_is_the_kernel_the_run_runs(write_args):
    """One data rank, one step, one GPU per node are said as such ("1 data ranks", "1 steps", "1 GPUs per node"
    before: `counts.count`), and a CPU plan with `use_flash_attention` names the CPU kernel the run's `kernels:` line
    does (`config.compute.attention_words`), where it said "attention flash"; a GPU plan names flash-attn."""
    path = write_args(model_name_or_path="tiny-llama", max_steps=1, use_flash_attention=True, sharding="")
    cpu = format_report(planned.from_file(path, [], "cpu", 1, baseline_bytes=0))
    assert "x 1 data rank x" in cpu and "; 1 step = " in cpu, cpu
    assert "attention cpu (the fused block-causal CPU kernel" in cpu and "attention flash" not in cpu, cpu
    from pretrain_cli.planning.hardware import Node

    gpu = format_report(planned.from_file(path, [], "H100", 2, node=Node(gpus=1)))
    assert "; 1 GPU per node" in gpu and "attention sdpa_causal (flash-attn), causal mask" in gpu, gpu
