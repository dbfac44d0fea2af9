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
    """At pp 2 the plan's memory is stage 0's (the fullest), where the module costs nothing: the line said
    "0.00 GiB of the memory per device". It gives the last stage's cost now, and names both stages."""
    import dataclasses

    r = planned.from_file(V3_FILE, [], "H100", 8)
    args, cfg = planned.parse(V3_FILE, [])
    run = planned._resolved(args, cfg, target_device("H100", gpus=8), 8)
    s = setup_for(run, cfg, target_device("H100", gpus=8))
    bare = dataclasses.replace(s, model=dataclasses.replace(cfg, num_nextn_predict_layers=0))
    last = (sum(pipeline_stages(s)[-1].values()) - sum(pipeline_stages(bare)[-1].values())) / GIB
    assert r.mtp["stage"] == 1 and r.mtp["reported_stage"] == 0
    assert r.mtp["memory_gib"] == pytest.approx(last) and r.mtp["memory_gib"] > 50  # its experts ÷ 4, the rest whole
    line = next(x for x in format_report(r).splitlines() if "multi-token prediction" in x)
    assert f"{last:.2f} GiB of the memory per device on stage 1, the last of 2, which runs it" in line
    assert line.endswith("; the memory below is stage 0's, the fullest") and "0.00 GiB" not in line
    one = planned.from_file(V3_FILE, ["--pipeline_parallel_degree", "1"], "H100", 8)  # no pipeline: as before
    assert one.mtp["stage"] is None and "stage" not in next(
        x for x in format_report(one).splitlines() if "multi-token prediction" in x)


def test_precision_without_a_level_has_no_stray_space():
    text = format_report(planned.from_file(V3_FILE, [], "cpu", 8))
    assert "precision float32; world 8" in text and "float32 ;" not in text
    assert "precision bfloat16 O2; world 8" in format_report(planned.from_file(V3_FILE, [], "H100", 8))

