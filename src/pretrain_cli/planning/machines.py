"""How many cpu processes a machine: where no number of processes up to `suggestions.MAX_DEVICES` fits with the
processes a machine planned (`--gpus_per_node`), fewer a machine may, as each then gets a larger part of the
machine's memory while the state stays split over every process (Qwen3-30B-A3B on 23.5 GiB machines: no count of
8 a machine fits, 51 machines of 1 do). `plan` and `plan --fit` name that count in their machine line
(`suggestions.machine_too_small`) rather than saying no machine of this one's memory fits."""
from __future__ import annotations

from pretrain_cli.planning.report import Plan


def fewer_a_machine(current: dict, base: Plan, budget_gib: float, lean: Plan | None, on_node,
                    fewest_devices) -> tuple[int, int] | None:
    """(processes a machine, processes) of the fewest machines, with fewer processes a machine than `base`'s
    `--gpus_per_node`, on which some count up to MAX_DEVICES fits within `budget_gib` (`base`'s process's budget;
    `fewest_devices`: `fit.fewest_devices`, the count search `plan` makes), the most processes a machine of those;
    or None. The fewest machines, not the most processes: Llama-3-8B on 23.5 GiB machines fits on 320 machines of 2
    and on 16 of 1. `on_node(n) -> (plan of the file on base's processes with n a machine, its replan)`. `lean`: the
    leanest layout on MAX_DEVICES with `base`'s processes a machine (`fit.leanest`): a process needs at least that
    on any count (the least need does not grow with the count: docs/PLAN.md), and fewer a machine allow no more
    layouts (tensor-parallel groups stay inside a machine), so no n whose machine budget holds fewer than n of it is
    searched; an n where none fits costs the count search's probe of the most processes."""
    per_node = base.device.links.gpus_per_node
    machine = budget_gib * max(min(base.gpus, per_node), 1)  # (a process's budget x the processes sharing it:
    most = per_node - 1                                      # `plan.target_device`)
    if lean is not None and lean.least_gib > 0:
        most = min(most, int(machine // lean.least_gib))
    best = None
    for n in range(most, 0, -1):
        there, replan = on_node(n)
        if there is None:
            continue
        found = fewest_devices(current, there, replan, budget_gib * there.device.memory_gib / base.device.memory_gib,
                               None)
        if found is not None and (best is None or -(-found["gpus"] // n) < -(-best[1] // best[0])):
            best = (n, found["gpus"])
    return best
