"""How a resolved layout's ranks fall onto nodes: which parallel groups stay inside a node and which cross nodes.

`plan` explains a multi-dimensional layout (tensor × pipeline × data/ZeRO) before any GPU is rented. The rank of
each process on each axis is never computed here: every rank's coordinates come from `ParallelConfig` itself (its
`pp_rank` and `data_rank`, the one rank-to-axis rule the run uses), so this explanation follows the run's layout
wherever that rule goes. The groups are the ranks that differ on one axis only: a tensor-parallel group shares
(stage, data rank); a pipeline group shares (data rank, tensor-parallel position); a data (dp × ZeRO) group shares
(stage, tensor-parallel position). No Paddle.
"""
from __future__ import annotations

import dataclasses

from pretrain_cli.run_config import ParallelConfig

GPUS_PER_NODE = 8  # an HGX/DGX node: the launcher's `--devices 0,...,7` on every node (docs/DISTRIBUTED.md)
AXES = ("tp", "pp", "data")  # what each group carries: TP all-reduces, pipeline p2p, data/ZeRO collectives


def coordinates(par: ParallelConfig) -> list[tuple[int, int, int]]:
    """(stage, data rank, tensor-parallel position) of every rank 0 .. world-1, from `ParallelConfig`'s own rule."""
    out = []
    seen: dict[tuple[int, int], int] = {}
    for rank in range(par.world_size):
        p = dataclasses.replace(par, rank=rank)
        key = (p.pp_rank, p.data_rank)
        out.append((*key, seen.get(key, 0)))  # the tensor-parallel position: order within its (stage, data) group
        seen[key] = seen.get(key, 0) + 1
    return out


def groups(par: ParallelConfig) -> dict[str, list[list[int]]]:
    """Axis -> its groups of ranks (each sorted): the ranks that differ on that axis only."""
    keep = {"tp": (0, 1), "pp": (1, 2), "data": (0, 2)}  # the coordinates a group shares
    out: dict[str, list[list[int]]] = {}
    coords = coordinates(par)
    for axis, shared in keep.items():
        by: dict[tuple, list[int]] = {}
        for rank, c in enumerate(coords):
            by.setdefault(tuple(c[i] for i in shared), []).append(rank)
        out[axis] = sorted(by.values())
    return out


def explain(par: ParallelConfig, gpus_per_node: int = GPUS_PER_NODE) -> dict:
    """Per axis: its degree, the first group's ranks, and whether its groups stay inside a node of
    `gpus_per_node` devices or how many nodes one spans; JSON-ready (`plan --json`'s `layout`)."""
    nodes = -(-par.world_size // gpus_per_node)
    out = {"gpus_per_node": gpus_per_node, "nodes": nodes, "axes": {}}
    degree = {"tp": par.tp_degree, "pp": par.pp_degree, "data": par.data_world_size}
    for axis, gs in groups(par).items():
        spans = max(len({r // gpus_per_node for r in g}) for g in gs)
        out["axes"][axis] = {"degree": degree[axis], "groups": len(gs), "first_group": gs[0],
                             "stride": gs[0][1] - gs[0][0] if len(gs[0]) > 1 else 0,
                             "inside_node": spans == 1, "nodes_per_group": spans}
    return out


def format_layout(lay: dict) -> list[str]:
    """The `plan` lines for a layout over more than one axis or node: one per axis with more than one rank."""
    what = {"tp": "tensor-parallel groups (all-reduces every layer)",
            "pp": "pipeline groups (one activation per micro-batch between stages)",
            "data": "data/ZeRO groups (gradients, ZeRO shards)"}
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
