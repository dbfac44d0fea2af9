"""`plan`'s ETA line, and the ETA at a measured mfu.

Two efficiencies must not be confused, so each is named where it is printed. `--mfu` (`Plan.mfu`) is what the
speed model assumes of the kernels: their share of the peak on the FLOPs the devices run, the recomputed forward
included; the step adds the pipeline's bubble and the traffic to that compute (`speed.speed`). The `mfu` that
`train` logs (training/metrics.py) is the model FLOPs, without recompute, over the wall time: compute, bubble,
recompute and traffic are all inside it. Re-planning with `--mfu` set to train's figure would count those twice
(Llama-3.1-8B at 8K with recompute on 8 H100: 1.37x the planned time), so `plan` prints the speed model's
prediction as train logs it (`Plan.logged_mfu`) to compare like with like, and `--measured_mfu M` times the run at
train's measured figure alone: model FLOPs / (devices x peak x M), nothing added.
"""
from __future__ import annotations

import dataclasses

# (no import of the planner's modules: `report.format_report` prints these lines, and `Plan` reaches here filled in,
# its `eta_traffic` by `speed.traffic_parts`)
TRAFFIC_NAMES = {"tp": "TP collectives", "pp": "pipeline p2p", "zero3": "ZeRO-3 gathers and reduce-scatters",
                 "cp": "CP K/V gathers", "ep": "expert dispatch", "dp": "data-parallel gradients"}
SMALL_TRAFFIC = 0.005  # a traffic part under this share of the ETA is left out of the line (a CPU try-out's 0.00)
# `plan.too_small_note`'s head, which `plan --fit` repeats and the fp32 note (`speed.fp32_on_gpu_note`) reads: the
# ETA is no guide for such a model (here, not in `plan`, which imports `speed`: one place both can read)
TOO_SMALL = "speed: this model is too small for the FLOPs model"


def at_measured_mfu(r, measured: float):
    """`r` timed at the mfu `train` logged for this layout (`--measured_mfu`): the model FLOPs over devices x peak x
    `measured`, the run's whole time by train's own definition, so no traffic or bubble is added. No time where the
    plan has none (no peak, or it does not fit)."""
    if r.eta_hours is None:
        return dataclasses.replace(r, measured_mfu=measured)
    hours = r.total_tokens * r.flops_per_token.model / (r.gpus * r.device.peak_tflops * 1e12 * measured) / 3600
    return dataclasses.replace(r, eta_hours=hours, eta_traffic_hours=None, eta_traffic={}, measured_mfu=measured)


def unit(hours: float) -> str:
    """The unit a time of `hours` reads in: seconds under a minute (a tiny model's 200 steps on an H100 read
    "0.00 min", "0.00 h" in the fp32 note), minutes under an hour, else hours."""
    return "s" if hours < 1 / 60 else "min" if hours < 1 else "h"


def duration(hours: float, in_unit: str | None = None) -> str:
    """`hours` in `in_unit` (`unit`'s; by default its own), so the parts of one sum are in the sum's."""
    u = in_unit or unit(hours)
    return f"{hours * 3600:.2f} s" if u == "s" else f"{hours * 60:.2f} min" if u == "min" else f"{hours:.2f} h"


def _traffic(r, u: str) -> str:
    """What the traffic part is: its largest term over its link (an assumed cross-node figure said so), and the
    overlap the speed model assumes: none but DataParallel's gradients with the last backward."""
    t = r.eta_traffic
    link = t["link"] + (", an assumed figure: --cross_node_gbps" if t["link_assumed"] else "")
    name = TRAFFIC_NAMES[t["largest"]]
    most = f"{name} {duration(t['largest_hours'], u)} over {link}" if t["terms"] > 1 else f"{name} over {link}"
    hidden = t["overlapped_hours"]
    hidden = (f", but for the {duration(hidden, u)} of data-parallel gradients the last micro-batch's backward "
              f"hides (DataParallel's reducer)" if hidden else "")
    return f"{most}; not overlapped with compute{hidden}"


def _no_time(r) -> str:
    d = r.device
    if d.name == "cpu":  # `check`/`train` on this machine refuse a clear excess and note a marginal one
        return (f"ETA: no time: as written the run does not fit {d.memory_gib:.1f} GiB per process (above): check "
                f"and train will refuse or note it; a suggestion that fits, planned, gives a time")
    return (f"ETA: no time: as written the run does not fit {d.memory_gib:.1f} GiB per device (above), so it "
            f"cannot start; a suggestion that fits, planned, or --fit (whose layouts keep --margin, 10% by default, "
            f"free) gives a layout's time")


def eta_lines(r, cpu_note: str = "") -> list[str]:
    """The ETA: the FLOPs with recompute over the peak x MFU (under a pipeline the bubble and the slowest stage),
    plus the time the step's traffic takes over its links: `speed.speed`'s step, the one `plan --fit`'s time line
    gives the same layout; then that time as the mfu `train` would log (`Plan.logged_mfu`). At `--measured_mfu`
    (`at_measured_mfu`) the model FLOPs at it alone. No time for a layout that does not fit device memory: it
    cannot start, as --fit says of such a file. Every part is in the total's unit (`unit`): seconds under a minute,
    minutes under an hour, else hours."""
    d, par, f = r.device, r.parallel, r.flops_per_token
    if not r.fits:
        return [_no_time(r)]
    if r.eta_hours is None:
        return ["ETA: unknown: no peak for this device and precision; pass --peak_tflops N (dense TFLOPS per "
                "device) or set peak_tflops in the argument file"]
    u = unit(r.eta_hours)  # (a try-out's in minutes, a tiny model's on a GPU in seconds)
    days = f" ({r.eta_hours / 24:.1f} days)" if r.eta_hours >= 48 else ""  # a long run's, readable
    if r.measured_mfu is not None:
        return [f"ETA: {r.total_tokens * f.model:.3g} model FLOPs / ({r.gpus} x {d.peak_tflops:g} TFLOPS x measured "
                f"mfu {r.measured_mfu:.3g}) = {duration(r.eta_hours, u)}{days}: train's logged mfu holds the "
                f"traffic, bubble and recompute, so nothing is added",
                f"  the speed model predicts mfu {r.logged_mfu:.3f} as train logs it (MFU {r.mfu:.2f} of the "
                f"kernels, --mfu, + traffic)"]
    traffic = r.eta_traffic_hours or 0.0
    compute = r.eta_hours - traffic
    flops = r.total_tokens * f.hardware  # f.hardware is f.model plus the recomputed forward
    bubble = f" / (1 - bubble {par.pipeline_bubble:.3f})" if par.pp > 1 else ""
    even = flops / (r.gpus * d.peak_tflops * 1e12 * r.mfu) / (1 - par.pipeline_bubble) / 3600
    uneven = compute / even if even else 1.0  # the slowest stage over an average one (`speed.pipeline_seconds`)
    bubble += f" x slowest stage {uneven:.3f}" if abs(uneven - 1) > 5e-4 else ""
    text = (f"ETA: {flops:.3g} FLOPs{' with recompute' if r.recompute else ''} / ({r.gpus} x {d.peak_tflops:g} "
            f"TFLOPS x MFU {r.mfu:.2f}, the kernels' share of peak: --mfu){bubble}")
    if traffic > SMALL_TRAFFIC * r.eta_hours:
        text += f" = {duration(compute, u)} + traffic {duration(traffic, u)} ({_traffic(r, u)})"
    text += f" = {duration(r.eta_hours, u)}{days}" + cpu_note
    return [text, f"  mfu as train logs it: {r.logged_mfu:.3f} predicted (model FLOPs over this time: traffic, "
                  f"bubble and recompute inside it); train's logged mfu for this layout, as --measured_mfu, gives "
                  f"the ETA at it"]
