"""The planner's interleaved pipeline against fleet's own schedule: the order fleet's
`PipelineParallelWithInterleave` runs each stage's chunk forwards and backwards in (its `_get_virtual_pp_rank` and
`startup_steps`, Paddle 3.3.1) played with unit chunk times and the data dependencies between stages. Its makespan
gives the bubble `speed.pipeline_bubble` must equal, and its live chunks per stage the `memory.in_flight` counts."""
import pytest

from fleet_schedule import fleet_orders, play
from pretrain_cli.planning.memory import in_flight
from pretrain_cli.planning.speed import pipeline_bubble


def _play(pp: int, vpp: int, m: int, forward: float = 1.0, backward: float = 2.0):
    """(idle share of the step, per stage the most chunks live at once, the most of the last chunk on the last stage):
    the makespan of fleet's order (`fleet_schedule.play`), the live chunks counted along each stage's own order."""
    step = play(pp, vpp, m, lambda s, kind: (forward if kind == "F" else backward) / (pp * vpp))
    orders = fleet_orders(pp, vpp, m)
    most, last_live, last_most = [], 0, 0
    for s in range(pp):
        live = peak = 0
        for kind, v, _ in orders[s]:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
            if s == pp - 1 and v == vpp - 1:
                last_live += 1 if kind == "F" else -1
                last_most = max(last_most, last_live)
        most.append(peak)
    busy = m * (forward + backward) / pp
    return 1 - busy / step, most, last_most


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
