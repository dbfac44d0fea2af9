"""The speed model per pipeline stage (`planning.speed`): each stage's FLOPs and its TP and EP traffic from its own
layers (`models.stages.stage_layers`, the split the pipeline runs: DeepSeek's first `first_k_dense_replace` layers
are dense, its MTP module runs on the last stage), and the step from the slowest stage with the others' fill and
drain (`speed.pipeline_seconds`), against fleet's own 1F1B and interleaved orders played with unequal stage times.
Before, every stage was an average one: the same FLOPs, the same all-to-all bytes, the step an average stage's
time / (1 − bubble)."""
import dataclasses

import pytest

from fleet_schedule import play
from pretrain_cli.config.presets import PRESET_DIR, resolve_model_dir
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.flops import flops_per_token
from pretrain_cli.planning.memory import Setup
from pretrain_cli.planning.speed import pipeline_bubble, pipeline_seconds, stage_flops_per_token
from test_plan_moe import LLAMA

# DeepSeek-V3's shape at 8 layers, the first 2 dense, its MTP module (layer 8, sparse) on the last stage
V3 = dataclasses.replace(ModelConfig.from_file(str(PRESET_DIR / "micro-deepseek-v3")), num_hidden_layers=8,
                         first_k_dense_replace=2)


@pytest.mark.parametrize("recompute,hardware", [(None, False), ("full", True), ("full_attn", True),
                                                ("core_attn", True)])
def test_each_stage_does_its_own_layers_flops(recompute, hardware):
    """pp 4 (layers 0-1, 2-3, 4-5, 6-7 and the MTP module): the stages sum to the model's FLOPs per token; the dense
    stage differs from a sparse one by two layers' difference (read off the model made all dense and all sparse), and
    the last stage does the middle ones' and the head, the final norm and the MTP module. Each was 1/4 before."""
    s = Setup(model=V3, micro_batch=1, seq_len=256, pp=4, recompute=recompute)
    per = stage_flops_per_token(s, hardware=hardware)
    assert sum(per) == pytest.approx(flops_per_token(V3, 256, recompute, hardware))
    dense, sparse = (flops_per_token(dataclasses.replace(V3, first_k_dense_replace=k), 256, recompute, hardware)
                     for k in (8, 0))  # (the MTP layer, index 8, is sparse in both)
    assert per[0] - per[1] == pytest.approx(2 * (dense - sparse) / 8)
    assert per[1] == pytest.approx(per[2]) and per[0] != pytest.approx(per[1])
    head = flops_per_token(V3, 256, recompute, hardware) - per[0] - 3 * per[1]  # the head, norm, MTP module
    assert per[3] - per[2] == pytest.approx(head) and head > 0
    assert stage_flops_per_token(dataclasses.replace(s, pp=1), hardware) == [pytest.approx(sum(per))]


def _v3_plan(pp: int):
    """The micro DeepSeek-V3 above on pp x ep 2 (bf16, 4 micro-batches of 256 tokens), planned on H100s: the `Plan`."""
    import json
    import tempfile
    from pathlib import Path

    from pretrain_cli.orchestration.planned import from_file

    d = Path(tempfile.mkdtemp()) / "v3"
    d.mkdir()
    conf = json.loads((PRESET_DIR / "micro-deepseek-v3" / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**conf, "num_hidden_layers": 8, "first_k_dense_replace": 2}))
    args = ["--model_name_or_path", str(d), "--tensor_parallel_degree", "1", "--sharding", "",
            "--pipeline_parallel_degree", str(pp), "--expert_parallel_degree", "2", "--max_seq_length", "256",
            "--gradient_accumulation_steps", "4", "--per_device_train_batch_size", "1"]
    return from_file(str(LLAMA), args, device="H100", gpus=2 * pp, suggest_changes=False)


def test_a_stage_of_dense_layers_sends_nothing_on_its_expert_group():
    """pp 4 x ep 2: stage 0 (layers 0-1, dense) dispatches no token to an expert; stages 1 and 2 their two sparse
    layers' and the last its two and the MTP module's (3/2 of theirs); every stage was charged (6 + 4)/4 = 2.5
    sparse layers' dispatch before. The step's traffic line is the slowest stage's: the last."""
    r = _v3_plan(4).to_json()
    ep = [st["traffic_gb_per_step"]["ep"] for st in r["stages"]]
    assert ep[0] == 0 and ep[1] > 0 and ep[1] == pytest.approx(ep[2]) and ep[3] == pytest.approx(1.5 * ep[1])
    assert [st["sparse_layers"] for st in r["stages"]] == [0, 2, 2, 2]
    assert r["slowest_stage"] == 3 and r["traffic_gb_per_step"] == r["stages"][3]["traffic_gb_per_step"]
    flops = [st["tflops_per_step"] for st in r["stages"]]
    assert flops[0] != pytest.approx(flops[1]) and flops[3] > flops[1]


def test_the_step_is_the_slowest_stages_with_the_others_fill_and_drain():
    """`speed`: each stage busy for its FLOPs and its traffic (here the pipeline's and the dispatch's, both on
    NVLink), the step max + (Σ − max)/(V·m); the average stage's time / (1 − bubble) was the step before. The ETA
    is that step's (what --fit's time line gives), its compute part above the average stage's by the factor the
    report prints, then its traffic."""
    from pretrain_cli.planning.report import format_report
    from pretrain_cli.planning.speed import speed

    r = _v3_plan(4)
    rate = 989e12 * r.mfu
    busy = [st["tflops_per_step"] * 1e12 / rate + (st["traffic_gb_per_step"]["ep"]
                                                   + st["traffic_gb_per_step"]["pp"]) / 450 for st in r.stages]
    dp = max(st["traffic_gb_per_step"]["dp"] for st in r.stages) / 450  # once a step, after the pipeline
    step = max(busy) + (sum(busy) - max(busy)) / 4 + dp
    assert speed(r)["step_seconds"] == pytest.approx(step, rel=1e-9)
    assert speed(r)["step_seconds"] > 1.01 * (sum(busy) / 4 / (1 - pipeline_bubble(4, 4)) + dp)
    setup = Setup(model=V3, micro_batch=1, seq_len=256, pp=4)
    model = [f * 4 * 256 for f in stage_flops_per_token(setup, hardware=False)]  # per device per step
    compute = r.max_steps * (max(model) + (sum(model) - max(model)) / 4) / rate / 3600
    assert r.eta_hours == pytest.approx(r.max_steps * step / 3600, rel=1e-9)
    assert r.eta_traffic_hours == pytest.approx(r.eta_hours - compute, rel=1e-9) and r.eta_traffic_hours > 0
    even = r.total_tokens * r.flops_per_token.model / (8 * rate) / (1 - r.parallel.pipeline_bubble) / 3600
    assert r.eta_hours < 1 / 60  # (a run under a minute: in seconds, `eta.unit`)
    assert (f"x slowest stage {compute / even:.3f} = {compute * 3600:.2f} s + traffic "
            f"{r.eta_traffic_hours * 3600:.2f} s (") in format_report(r)
    assert f"not overlapped with compute) = {r.eta_hours * 3600:.2f} s\n" in format_report(r)  # (the parts' unit)


def _play(pp: int, vpp: int, m: int, times: list[float]) -> float:
    """The makespan of fleet's order (`fleet_schedule.play`) with stage s busy `times[s]` per micro-batch (its chunks
    alike, backward twice the forward)."""
    return play(pp, vpp, m, lambda s, kind: times[s] / vpp * (1 / 3 if kind == "F" else 2 / 3))


@pytest.mark.parametrize("pp,vpp,m,times", [
    (2, 1, 8, [1.0, 1.6]), (4, 1, 8, [1.0, 1.3, 1.1, 1.9]), (4, 1, 16, [1.9, 1.0, 1.2, 1.0]),
    (4, 2, 8, [1.0, 1.2, 1.0, 1.7]), (4, 2, 16, [1.4, 1.0, 1.6, 1.1]), (8, 1, 32, [1.0] * 7 + [1.5]),
    (3, 2, 7, [1.2, 1.0, 1.5]), (4, 1, 8, [1.0] * 4)])
def test_the_step_of_unequal_stages_is_fleets_schedules(pp, vpp, m, times):
    """fleet's order played with unequal stages: `pipeline_seconds` (max + (Σ − max)/(V·m)) is its step to within
    +6 % (an upper bound; exact for equal stages and in most cases here); the average stage / (1 − bubble), the
    model before, is 15-25 % below it here (-15 % at 1 : 1.6)."""
    played = _play(pp, vpp, m, times)
    busy = [t * m for t in times]
    assert played <= pipeline_seconds(busy, m, vpp) * (1 + 1e-9) <= played * 1.065
    before = sum(busy) / pp / (1 - pipeline_bubble(pp, m, vpp))
    if len(set(times)) > 1:
        assert before < played * 0.9
    else:
        assert before == pytest.approx(played) == pytest.approx(pipeline_seconds(busy, m, vpp))


def test_the_full_size_models_stage_split():
    """DeepSeek-V3 at pp 16 (layers 0-2 dense on stage 0; 3 sparse layers, the head and the MTP module on stage 15):
    stage 0 does 0.75 of a middle stage's FLOPs (4 sparse layers), the last 1.65 of it (before: every stage 1/16 of
    the model, 0.99 of a middle one)."""
    v3 = ModelConfig.from_file(str(resolve_model_dir("deepseek-ai/DeepSeek-V3")))
    per = stage_flops_per_token(Setup(model=v3, micro_batch=1, seq_len=4096, pp=16), hardware=False)
    assert per[0] / per[1] == pytest.approx(0.75, abs=0.01) and per[-1] / per[1] == pytest.approx(1.65, abs=0.01)
