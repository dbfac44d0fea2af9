"""fleet's pipeline schedule, for the tests that check the planner's pipeline against it (test_plan_interleaved,
test_plan_stage_speed, test_plan_virtual_chunks): the order fleet runs each stage's chunk forwards and backwards in
(its `_get_virtual_pp_rank` and `startup_steps`, Paddle 3.3.1; 1F1B's for one chunk a stage), and that order played
with the data dependencies between stages. One copy, so the tests cannot drift apart on what fleet does."""
import types
from typing import Callable

from pretrain_cli import runtime


def fleet_orders(pp: int, vpp: int, m: int) -> list[list[tuple]]:
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


def play(pp: int, vpp: int, m: int, seconds: Callable[[int, str], float]) -> float:
    """The makespan of `fleet_orders` with each op of stage s taking `seconds(s, "F" | "B")`: a forward waits for
    the previous stage's (chunk v's first stage for the last stage's chunk v - 1), a backward for the next stage's
    (the last chunk's on the last stage for its own forward). Asserts every stage runs all its ops (no deadlock)."""
    orders = fleet_orders(pp, vpp, m)
    done, free, pos, moved = {}, [0.0] * pp, [0] * pp, True
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
                free[s] = max(free[s], done[dep] if dep else 0.0) + seconds(s, kind)
                done[(s, v, j, kind)] = free[s]
                pos[s] += 1
                moved = True
    assert all(pos[s] == len(orders[s]) for s in range(pp))  # no stage waits forever
    return max(free)
