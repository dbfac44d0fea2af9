"""Under virtual stages (`virtual_pp_degree` V > 1) each chunk a stage holds at its peak is counted as its own layers
(`memory.pipeline_stages`, `schedule.live_chunks`): fleet's interleaved schedule runs its first pp + m mod pp
micro-batches through chunk 0 before chunk 1, so at the first stage's peak more of chunk 0's activations are live
than of the others'. Counted before as (live chunks) × (the stage's layers) / V: right where the chunks are alike,
not for DeepSeek, whose first `first_k_dense_replace` layers (dense) are all in the first stage's chunk 0."""
import dataclasses

import pytest

from fleet_schedule import fleet_orders
from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.planning.activations import layer_bytes
from pretrain_cli.planning.memory import Setup, pipeline_stages
from pretrain_cli.planning.schedule import live_chunks

WIDE = {"hidden_size": 128, "intermediate_size": 512, "moe_intermediate_size": 256, "vocab_size": 2048}
V3 = dataclasses.replace(ModelConfig.from_file(str(PRESET_DIR / "micro-deepseek-v3")), **WIDE, num_hidden_layers=8,
                         first_k_dense_replace=2)


def _fleets_live(pp: int, vpp: int, m: int, stage: int) -> list[tuple[int, ...]]:
    """Per chunk, the micro-batches live on `stage` after each forward of fleet's own order (its
    `_get_virtual_pp_rank` and `startup_steps`, `fleet_schedule.fleet_orders`)."""
    live, out = [0] * vpp, []
    for kind, chunk, _ in fleet_orders(pp, vpp, m)[stage]:
        live[chunk] += 1 if kind == "F" else -1
        if kind == "F":
            out.append(tuple(live))
    return out


@pytest.mark.parametrize("pp,vpp,m", [(4, 2, 8), (4, 2, 10), (3, 2, 7), (4, 4, 8), (2, 2, 4), (4, 1, 8)])
def test_the_chunks_live_at_a_stages_peak_are_fleets(pp, vpp, m):
    """Equal chunks: the peak is the first moment the most are live, and which they are is fleet's (the first stage at
    pp 4 x 2 virtual, m 8: chunk 0 x 7 and chunk 1 x 4, not 5.5 of each); with chunk 0 the larger, the moment fleet
    holds the most of it weighted by the sizes."""
    for stage in range(pp):
        seen = _fleets_live(pp, vpp, m, stage)
        most = max(sum(x) for x in seen)
        assert live_chunks(pp, vpp, m, stage) == next(x for x in seen if sum(x) == most)
        sizes = (3.0,) + (1.0,) * (vpp - 1)
        assert live_chunks(pp, vpp, m, stage, sizes) == max(seen, key=lambda x: sum(n * w for n, w in zip(x, sizes)))
    if (pp, vpp, m) == (4, 2, 8):
        assert live_chunks(pp, vpp, m, 0) == (7, 4)


def test_deepseeks_first_stage_holds_more_of_its_dense_chunk():
    """pp 2 x 2 virtual, 4 micro-batches: stage 0 runs chunks 0 (layers 0-1, dense) and 2 (layers 4-5, sparse); fleet
    runs micro-batches 0-1 through chunk 0, then through chunk 1, then micro-batch 2 through chunk 0 before its first
    backward: 3 of the dense chunk and 2 of the sparse one live, which the plan counts (it counted 2.5 of each);
    stage 1 (chunks 1 and 3: layers 2-3, 6-7, all sparse) is unchanged."""
    s = Setup(model=V3, micro_batch=2, seq_len=128, device="cpu", attention="math", pp=2, vpp=2, micro_batches=4)
    dense, _ = layer_bytes(s, (0, 1))
    sparse, redo = layer_bytes(s, (4, 5))
    assert live_chunks(2, 2, 4, 0, (dense, sparse)) == (3, 2) and dense != pytest.approx(sparse)
    acts = pipeline_stages(s)[0]["activations"]
    assert acts == pytest.approx(3 * dense + 2 * sparse + max(redo, layer_bytes(s, (0, 1))[1]))
    assert acts != pytest.approx(5 * (dense + sparse) / 2 + redo)  # (the count before)
    one_kind = dataclasses.replace(V3, first_k_dense_replace=0)  # every layer sparse: the chunks alike
    alike = dataclasses.replace(s, model=one_kind)
    kept, redo = layer_bytes(alike, (0, 1, 4, 5))
    assert pipeline_stages(alike)[0]["activations"] == pytest.approx(5 * kept / 2 + redo)


def test_1f1b_answers_without_walking_the_order(monkeypatch):
    """`plan --fit` plans tens of thousands of 1F1B candidates with hundreds of micro-batches on up to 64 stages:
    walking fleet's order for each made DeepSeek-V3's --fit on 256 GPUs 8x slower (160 CPU-s for 20). 1F1B's one
    chunk is answered by its formula, min(pp - stage, m), the walk's answer."""
    from pretrain_cli.planning import schedule

    def walk(pp: int, m: int, stage: int) -> int:  # the most forwards live at once in fleet's 1F1B order
        live = most = 0
        for forward, _ in schedule.order(pp, 1, m, stage):
            live += 1 if forward else -1
            most = max(most, live)
        return most

    walked = {(pp, m, s): (walk(pp, m, s),) for pp in (2, 4) for m in (1, 3, 8) for s in range(pp)}
    monkeypatch.setattr(schedule, "order", lambda *a: pytest.fail("walked fleet's order for 1F1B"))
    assert all(schedule.live_chunks(pp, 1, m, s) == (min(pp - s, m),) == want for (pp, m, s), want in walked.items())
    assert schedule.in_flight(4, 1, 512, 0) == (4, 1)
