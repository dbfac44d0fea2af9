"""The planner's interleaved pipeline against fleet's own schedule: the order fleet's
`PipelineParallelWithInterleave` runs each stage's chunk forwards and backwards in (its `_get_virtual_pp_rank` and
`startup_steps`, Paddle 3.3.1) played with unit chunk times and the data dependencies between stages. Its makespan
gives the bubble `speed.pipeline_bubble` must equal, and its live chunks per stage the `memory.in_flight` counts."""
import types

import pytest

from pretrain_cli import runtime
from pretrain_cli.planning.memory import in_flight
from pretrain_cli.planning.speed import pipeline_bubble


def _fleet_orders(pp: int, vpp: int, m: int) -> list[list[tuple]]:
    """Per stage, fleet's op order: ("F" | "B", chunk, micro-batch) (not its 'best unbalanced' variant); 1F1B's for
    one chunk a stage."""
    runtime.import_paddle()
    from paddle.distributed.fleet.meta_parallel.pipeline_parallel import PipelineParallelWithInterleave as Fleet

    me = types.SimpleNamespace(accumulate_steps=m, num_stages=pp, num_model_chunks=vpp,
                               _best_unbalanced_scheduler=False)
    out = []
    for stage in range(pp):
        steps = m * vpp
        if vpp == 1:  # fleet's PipelineParallel (1F1B)
            warm = min(pp - stage - 1, m)
        else:  # PipelineParallelWithInterleave
            warm = min(2 * (pp - stage - 1) + (vpp - 1) * (m % pp + pp), steps)  # fleet's startup_steps
        seen = {"F": [0] * vpp, "B": [0] * vpp}
        ops = []

        def op(kind, i):
            chunk = Fleet._get_virtual_pp_rank(me, i, kind == "F") if vpp > 1 else 0
            ops.append((kind, chunk, seen[kind][chunk]))
            seen[kind][chunk] += 1

        for i in range(warm):
            op("F", i)
        for i in range(steps - warm):
            op("F", warm + i)
            op("B", i)
        for i in range(steps - warm, steps):
            op("B", i)
        out.append(ops)
    return out


def _play(pp: int, vpp: int, m: int, forward: float = 1.0, backward: float = 2.0):
    """(idle share of the step, per stage the most chunks live at once, the most of the last chunk on the last stage)."""
    orders = _fleet_orders(pp, vpp, m)
    done, free, pos = {}, [0.0] * pp, [0] * pp
    live, most, last_live, last_most = [0] * pp, [0] * pp, 0, 0
    moved = True
    while moved:
        moved = False
        for s in range(pp):
            while pos[s] < len(orders[s]):
                kind, v, j = orders[s][pos[s]]
                if kind == "F":
                    dep = None if s == v == 0 else (s - 1, v, j, "F") if s else (pp - 1, v - 1, j, "F")
                else:
                    dep = ((s, v, j, "F") if s == pp - 1 and v == vpp - 1 else (s + 1, v, j, "B") if s < pp - 1
                           else (0, v + 1, j, "B"))
                if dep is not None and dep not in done:
                    break
                free[s] = max(free[s], done[dep] if dep else 0.0) + (forward if kind == "F" else backward) / (pp * vpp)
                done[(s, v, j, kind)] = free[s]
                live[s] += 1 if kind == "F" else -1
                most[s] = max(most[s], live[s])
                if s == pp - 1 and v == vpp - 1:
                    last_live += 1 if kind == "F" else -1
                    last_most = max(last_most, last_live)
                pos[s] += 1
                moved = True
    assert all(pos[s] == len(orders[s]) for s in range(pp))  # no stage waits forever
    busy = m * (forward + backward) / pp
    return 1 - busy / max(free), most, last_most


@pytest.mark.parametrize("pp,vpp,m", [(3, 2, 6), (3, 2, 7), (4, 2, 8), (4, 2, 10), (4, 3, 9), (4, 4, 8),
                                      (8, 2, 16), (3, 1, 6), (4, 1, 5)])
def test_bubble_and_in_flight_are_fleets_schedule(pp, vpp, m):
    """Megatron's interleaved bubble (P-1)/(V·m+P-1) is fleet's too, also where m is not a multiple of P (fleet runs
    P + m mod P micro-batches through each chunk first); `plan` charged the 1F1B bubble (P-1)/(m+P-1) before."""
    idle, most, last_most = _play(pp, vpp, m)
    assert idle == pytest.approx(pipeline_bubble(pp, m, vpp), abs=1e-9)
    flights = [in_flight(pp, vpp, m, s) for s in range(pp)]
    assert [chunks for chunks, _ in flights] == most
    assert flights[-1][1] == last_most
