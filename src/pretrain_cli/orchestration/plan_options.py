"""`plan`'s own options (`--device`, `--gpus`, `--gpus_per_node`, `--cross_node_gbps`, `--mfu`, `--margin`, …),
checked once where the command takes them, and the number of processes planned when `--gpus` is not given.

They are checked apart from the planning (`orchestration.planned`) because they come in once per command while
the plan is re-made for every suggestion and `--fit` candidate; and the processes are checked against the nodes
only once the file's layout is known, so the counts an error offers are ones that layout runs on.
"""
from __future__ import annotations

import math

from pretrain_cli.config.parallel import degree
from pretrain_cli.config.parser import Arguments
from pretrain_cli.errors import UserError
from pretrain_cli.planning import hardware
from pretrain_cli.planning.layout import tp_inside_node
from pretrain_cli.planning.plan import target_device


def check_flags(device: str | None, gpus: int | None, mfu: float | None, peak_tflops: float | None, margin: float = 0.0,
                node: hardware.Node = hardware.Node(), measured_mfu: float | None = None) -> None:
    """`plan`'s own options, checked before the file is read (`gpus` None: the file's, checked once it is read:
    `file_gpus`, which also checks a given one against the nodes and the file's layout; `device` None: the file's,
    cpu or the default GPU, `planned.own_device`)."""
    if node.gpus < 1:
        raise UserError(f"--gpus_per_node: must be >= 1 (GPUs in one node), got {node.gpus}")
    if node.cross_node_gbps is not None and not 0 < node.cross_node_gbps < float("inf"):
        raise UserError(f"--cross_node_gbps: must be a number > 0 (GB/s per GPU between nodes), "
                        f"got {node.cross_node_gbps}")
    if not 0 <= margin < 1:
        raise UserError(f"--margin: must be in [0, 1) (a fraction of device memory), got {margin}")
    if gpus is not None and gpus < 1:
        raise UserError(f"--gpus: must be >= 1, got {gpus}")
    if mfu is not None and not 0 < mfu <= 1:
        raise UserError(f"--mfu: must be in (0, 1], got {mfu}")
    if measured_mfu is not None and not 0 < measured_mfu <= 1:
        raise UserError(f"--measured_mfu: must be in (0, 1] (the mfu `train` logged), got {measured_mfu}")
    if measured_mfu is not None and mfu is not None:
        raise UserError("--measured_mfu and --mfu: give one (--measured_mfu is train's logged mfu, which alone gives "
                        "the ETA; --mfu the kernels' share of peak the speed model adds traffic to)")
    if peak_tflops is not None and not (0 < peak_tflops < float("inf")):
        raise UserError(f"--peak_tflops: must be a number > 0 (dense TFLOPS per device), got {peak_tflops}")
    if device is not None and device.lower() != "gpu":  # (gpu: the default GPU, `planned.own_device`)
        target_device(device)


def check_gpus(gpus: int, node: hardware.Node, why: str = "", need: tuple[int, str, int] = (1, "", 1)) -> None:
    """`--gpus` (or, `why` saying so, the file's number of processes) against the nodes: the launcher starts as
    many processes on every node. `need`: (the fewest processes the file's layout runs on, which divides every world
    it runs on, the degrees that make it, its tensor-parallel degree): the counts and node sizes the error offers
    are ones the layout runs on, with its tensor-parallel groups inside a node (`layout.tp_inside_node`)."""
    if gpus < 1:
        raise UserError(f"--gpus: must be >= 1, got {gpus}")
    if gpus > node.gpus and gpus % node.gpus:
        unit, (least, degrees, tp) = math.lcm(node.gpus, need[0]), need
        fits = sorted(n for n in {gpus // unit * unit, -(-gpus // unit) * unit} - {0}
                      if tp_inside_node(tp, n, node.gpus))
        pers = [n for n in range(node.gpus - 1, 0, -1) if gpus % n == 0 and gpus % least == 0
                and tp_inside_node(tp, gpus, n)]
        layout = f": whole nodes of {node.gpus} that the {least} processes the file's layout needs ({degrees}) " \
                 f"divide" if least > 1 else ""
        per = f", or --gpus_per_node {pers[0]}" + (f" (whole tensor-parallel groups of {tp} in each node)"
                                                   if tp > 1 else "") if pers else ""
        head = (f"--gpus_per_node: --gpus {gpus}{why} is not a whole number of nodes of {node.gpus} (every node "
                f"runs the same number of processes)")
        if not fits:  # tp wider than a node and not a multiple of it: no count keeps its groups inside nodes
            how = per[2:].replace("or --gpus_per_node", "use --gpus_per_node") if per else \
                f"set tensor_parallel_degree to a divisor of {node.gpus}"
            raise UserError(f"{head}; no count of whole nodes of {node.gpus} keeps the file's tensor-parallel groups "
                            f"of {tp} inside a node: {how}")
        raise UserError(f"{head}; use --gpus {' or '.join(map(str, fits))}{layout}{per}")


def file_gpus(args: Arguments, gpus: int | None, node: hardware.Node) -> tuple[int, list[str]]:
    """(`--gpus` as given, else the fewest processes the file's parallel keys run on, `config.one_process`'s
    `fewest_processes`; the note saying so): `plan <file>` plans the layout the file was written for, where it
    planned one device, on which every parallel key has no effect. Either is checked against the nodes once the
    file's layout is known (`check_gpus`), so the counts offered are ones it runs on."""
    from pretrain_cli.config.one_process import fewest_processes

    need, why = fewest_processes(args)
    layout = (need, why, degree(args.get("tensor_parallel_degree")))
    if gpus is not None:
        check_gpus(gpus, node, need=layout)
        return gpus, []
    if need == 1:
        return 1, []
    check_gpus(need, node, f" (not given: the {need} processes the file's layout needs, {why})", layout)
    return need, [f"gpus: --gpus not given: planned on the {need} processes the file's layout needs ({why}); "
                  f"--gpus N plans it on N"]
