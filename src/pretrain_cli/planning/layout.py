"""How a resolved layout's ranks fall onto nodes: which parallel groups stay inside a node and which cross nodes.

`plan` explains a multi-dimensional layout (tensor × pipeline × data/ZeRO) before any GPU is rented. The explanation
computes no rank: the groups of each axis are handed in by the caller (`orchestration.planned.rank_groups`, the run's
own rank-to-axis rule), so it follows the run's layout wherever that rule goes. One rule does assume the rank order:
`tp_inside_node`, which the searches ask before any group exists, takes tensor parallelism innermost, as
`distributed.layout.topology`'s `AXES` (pp, dp, sharding, cp, mp) places it (tests/unit/test_plan_nodes.py checks
it against that rule). No Paddle.
"""
from __future__ import annotations

from pretrain_cli.planning.hardware import GPUS_PER_NODE
from pretrain_cli.run_layout import ParallelConfig

AXES = ("tp", "pp", "cp", "data", "ep")  # what each group carries: TP collectives, pipeline p2p, CP K/V, data/ZeRO,
# the experts' dispatch (ep groups are drawn from the data ranks)


_EXPLAINED: dict = {}  # `explain`'s answers by the groups object they read (see `explain`)


def explain(par: ParallelConfig, groups: dict[str, list], gpus_per_node: int = GPUS_PER_NODE) -> dict:
    """Per axis of `groups` ({"tp" | "pp" | "cp" | "data": every group of ranks along it}): its degree, the first
    group's ranks, and whether its groups stay inside a node of `gpus_per_node` devices or how many nodes one spans;
    JSON-ready (`plan --json`'s `layout`; the speed model's links read `inside_node`).

    Answered once per groups object (kept alive in the entry, so its id is not reused) and layout: `plan --fit`
    asks this of thousands of candidates that share a few dozen layouts, each one a sort of every group (on 64
    ranks, a third of the search's time), and the groups come from one cache (`Topology.all_groups`). Each caller
    gets its own copy of the answer."""
    key = (id(groups), gpus_per_node, par.world_size, par.tp_degree, par.pp_degree, par.cp_degree,
           par.data_world_size, par.ep_degree)
    hit = _EXPLAINED.get(key)
    if hit is None or hit[0] is not groups:
        if len(_EXPLAINED) > 256:
            _EXPLAINED.clear()
        hit = _EXPLAINED[key] = (groups, _explain(par, groups, gpus_per_node))
    out = hit[1]
    return {**out, "axes": {axis: {**a, "first_group": list(a["first_group"])} for axis, a in out["axes"].items()}}


def _explain(par: ParallelConfig, groups: dict[str, list], gpus_per_node: int) -> dict:
    nodes = -(-par.world_size // gpus_per_node)
    out = {"gpus_per_node": gpus_per_node, "nodes": nodes, "axes": {}}
    degree = {"tp": par.tp_degree, "pp": par.pp_degree, "cp": par.cp_degree, "data": par.data_world_size,
              "ep": par.ep_degree}
    for axis in AXES:
        if axis not in groups:
            continue
        gs = sorted(sorted(g) for g in groups[axis])
        spans = max(len({r // gpus_per_node for r in g}) for g in gs)
        out["axes"][axis] = {"degree": degree[axis], "groups": len(gs), "first_group": gs[0],
                             "stride": gs[0][1] - gs[0][0] if len(gs[0]) > 1 else 0,
                             "inside_node": spans == 1, "nodes_per_group": spans}
    return out


def tp_inside_node(tp: int, world: int, per_node: int) -> bool:
    """Whether tensor-parallel groups of `tp` ranks in a world of `world` stay inside nodes of `per_node`, assuming
    the rank rule's order: tp (fleet's mp) innermost in `Topology`'s `AXES`, so a tp group is consecutive ranks, and
    the groups stay inside nodes where the world is one node or `tp` divides `per_node`. The searches
    (`fit_candidates._splits`, `suggestions.more_devices`) propose only such layouts: tp all-reduces every layer, and
    over the cross-node link it is never the layout to suggest while another fits."""
    return world <= per_node or per_node % tp == 0


def format_layout(lay: dict, vpp: int = 1) -> list[str]:
    """The `plan` lines for a layout over more than one axis or node: one per axis with more than one rank; `vpp`:
    the model chunks per pipeline stage (an activation crosses each stage boundary once per chunk)."""
    sends = ("one activation per micro-batch" if vpp == 1
             else f"one activation per micro-batch and chunk, {vpp} chunks a stage,")
    what = {"tp": "tensor-parallel groups (all-reduces every layer)",
            "pp": f"pipeline groups ({sends} between stages)",
            "cp": "context-parallel groups (K/V gathered every layer)",
            "data": "data/ZeRO groups (gradients, ZeRO shards)",
            "ep": "expert groups (tokens to their experts and back, every sparse layer)"}
    lines = [f"ranks on {lay['nodes']} node(s) of {lay['gpus_per_node']} (consecutive ranks share a node):"]
    for axis, a in lay["axes"].items():
        if a["degree"] == 1:
            continue
        where = "inside a node" if a["inside_node"] else f"across {a['nodes_per_group']} nodes"
        first = a["first_group"]
        shown = ", ".join(map(str, first)) if len(first) <= 8 else f"{first[0]}, {first[1]}, ..., {first[-1]}"
        lines.append(f"  {axis} {a['degree']}: {a['groups']} {what[axis]} of ranks {a['stride']} apart "
                     f"({shown}): {where}")
    return lines
