"""The plan of one run as a frozen record (`Plan`), and `plan`'s printed report of it.

`planning.plan.report` builds a `Plan`; the suggestions, the `--fit` search and the speed model read its fields;
JSON exists only at the command's edge (`Plan.to_json`, the keys `plan --json` prints). The memory breakdowns, the
parameter counts, the traffic and the layout explanation stay name → value mappings: their keys are the parts.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from pretrain_cli.counts import count
from pretrain_cli.planning import hardware, layout
from pretrain_cli.planning.eta import TRAFFIC_NAMES, eta_lines
from pretrain_cli.planning.experts import assignments
from pretrain_cli.planning.hardware import Links


@dataclass(frozen=True)
class PlannedDevice:
    """The target device and the peak the ETA and speed use (`peak_source` says where the peak came from)."""

    name: str
    memory_gib: float
    peak_tflops: float | None
    peak_source: str
    links: Links  # in-node and cross-node GB/s per GPU (planning.hardware.links)


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    experts: int = 0  # routed experts per sparse layer (0: a dense model)
    experts_per_token: int = 0


@dataclass(frozen=True)
class FlopsPerToken:
    """`model`: the MFU basis; `hardware`: with the recomputed forward, less the routed assignments a MoE run's
    capacity drops at balance (`experts.kept_share`); `paddlenlp`: PaddleNLP's formula."""

    model: float
    hardware: float
    paddlenlp: float


@dataclass(frozen=True)
class PlannedPrecision:
    amp_dtype: str  # "float32" without mixed precision
    amp_level: str | None


@dataclass(frozen=True)
class PlannedLayout:
    """The resolved degrees as `plan --json` names them (`parallel`), and the pipeline's bubble."""

    world: int
    dp: int
    sharding_stage: int
    sharding_degree: int
    tp: int
    data_ranks: int
    pp: int
    pipeline_bubble: float
    cp: int = 1  # context-parallel ranks: each holds 1/cp of every sequence
    sequence_parallel: bool = False  # with tp: norms and residual stream cut over the tp ranks
    ep: int = 1  # expert-parallel ranks (drawn from the data ranks): each holds 1/ep of the routed experts
    vpp: int = 1  # virtual_pp_degree: model chunks per stage (fleet's interleaved 1F1B)


@dataclass(frozen=True)
class CheckpointPlan:
    per_checkpoint_gib: float
    parts_gib: dict
    kept: int
    final_weights_gib: float
    total_gib: float
    per_rank_gib: float
    disk_gb_per_s_per_rank: float
    save_seconds: float


@dataclass(frozen=True)
class Plan:
    """One resolved run planned on a target; field names and order are `plan --json`'s keys."""

    config: str | None
    device: PlannedDevice
    gpus: int
    model: ModelShape
    params: dict  # total / embedding / non_embedding (models.flops.param_counts)
    tied: bool
    flops_per_token: FlopsPerToken
    precision: PlannedPrecision
    parallel: PlannedLayout
    micro_batch: int
    gradient_accumulation_steps: int
    max_seq_length: int
    recompute: str | None
    attention: str
    attention_mask_type: str
    tokens_per_step: int
    total_tokens: int
    max_steps: int
    memory_breakdown_gib: dict
    memory_gib: float
    startup_breakdown_gib: dict
    startup_gib: float
    fits: bool
    checkpoint: CheckpointPlan
    mfu: float
    # the run's time at `speed.speed`'s step (what `plan --fit` ranks and times by), None without a peak or where
    # the layout does not fit (it cannot start); `eta_traffic_hours`: its part the step's traffic takes
    eta_hours: float | None
    eta_traffic_hours: float | None = None
    # that time as the mfu `train` logs (model FLOPs, no recompute, over the wall time: traffic and bubble inside it),
    # None where there is no time; `measured_mfu`: `--measured_mfu`, which then alone gives the ETA (`planning.eta`)
    logged_mfu: float | None = None
    measured_mfu: float | None = None
    mfu_given: bool = False  # --mfu gave `mfu` (else the default for the run's precision and device: `default_mfu`)
    # what the ETA's traffic part is (`speed.traffic_parts`): its largest term, that term's hours and link, whether
    # the link's figure is assumed, how many terms, and the hours DataParallel's reducer overlaps with the backward
    eta_traffic: dict = dataclasses.field(default_factory=dict)
    notes: tuple = ()
    suggestions: tuple = ()  # JSON-ready dicts: each an argument-file key change and its effect
    traffic_gb_per_step: dict = dataclasses.field(default_factory=dict)
    layout: dict | None = None  # planning.layout.explain
    schedule: str = ""  # warmup_stable_decay's phases (`Schedule.describe`); other schedules are not printed
    mtp: dict = dataclasses.field(default_factory=dict)  # the multi-token prediction modules' share (`plan.mtp_share`)
    capacity: dict = dataclasses.field(default_factory=dict)  # a MoE run's, per expert (`experts.capacity_plan`)
    # per pipeline stage (one without a pipeline): its decoder layers, sparse ones, TFLOPs and traffic per device per
    # step, from its own layers (`speed.stage_flops_per_token`, `speed.stage_traffic`); the speed model reads them
    stages: tuple = ()
    slowest_stage: int = 0  # the stage that sets the step (`speed.speed`): `traffic_gb_per_step` is its traffic
    # the attention kernel the run's `kernels:` line names (`config.compute.attention_words`, which the caller above
    # planning fills in: `orchestration.planned.plan`); `attention` is the path ("flash" on CPU is the CPU kernel)
    attention_words: str = ""
    # the evaluation (do_eval / do_predict; else eval_batch 0 and no memory): a forward of per_device_eval_batch_size
    # samples beside what the step leaves allocated (`planning.eval_memory`), against the device's memory too
    eval_batch: int = 0
    eval_breakdown_gib: dict = dataclasses.field(default_factory=dict)
    eval_memory_gib: float | None = None
    eval_least_gib: float | None = None  # the evaluation's peak at an eval batch of 1: no eval batch needs less

    @property
    def peak_gib(self) -> float:
        """The peak per device at any moment: the steady-state step or start-up, whichever is larger."""
        return max(self.memory_gib, self.startup_gib)

    @property
    def least_gib(self) -> float:
        """What the layout needs whatever its eval batch: the step, start-up and an evaluation of one sample a
        device (`plan --fit` lowers the eval batch, so a layout fits only where an eval of 1 fits too)."""
        return max(self.peak_gib, self.eval_least_gib or 0.0)

    @property
    def global_batch(self) -> int:
        return self.tokens_per_step // self.max_seq_length

    def to_json(self) -> dict:
        """`plan --json`'s object."""
        out = dataclasses.asdict(self)
        out["notes"], out["suggestions"] = list(self.notes), list(self.suggestions)
        return out


# traffic term -> the axis whose groups carry it (its name in the traffic and ETA lines: `eta.TRAFFIC_NAMES`)
TERM_AXIS = {"tp": "tp", "pp": "pp", "zero3": "data", "cp": "cp", "ep": "ep", "dp": "data"}


def in_node(r: Plan, term: str) -> bool:
    """Whether the group carrying traffic `term` stays inside a node: the plan's layout says so per axis (a ZeRO-3
    group lies within its data group); without a layout, whether the whole world fits in one node."""
    axes = (r.layout or {}).get("axes", {})
    axis = TERM_AXIS[term]
    return axes[axis]["inside_node"] if axis in axes else r.gpus <= r.device.links.gpus_per_node


def link_gbps(r: Plan, term: str) -> float:
    """GB/s per GPU of the link traffic `term` crosses: the in-node link or the cross-node one."""
    return r.device.links.in_node_gbps if in_node(r, term) else r.device.links.cross_node_gbps


def link_name(r: Plan, term: str) -> str:
    return f"{'in-node' if in_node(r, term) else 'cross-node'} {link_gbps(r, term):g} GB/s"


def _si(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return str(int(n))


def _data_ranks(par: PlannedLayout) -> str:
    """"8 data ranks (one ZeRO stage-1 group of 8)": the data ranks first, then how they split (PaddleNLP's
    dp x sharding), so "dp 1" never reads as one data rank."""
    n, dp, deg, stage = par.data_ranks, par.dp, par.sharding_degree, par.sharding_stage
    if not stage:
        return count(n, "data rank")
    group = f"ZeRO stage-{stage} group of {deg}"
    groups = f"one {group}" if dp == 1 else f"{dp} replicas of a {group}"
    return f"{count(n, 'data rank')} ({groups})"


def _mtp_stage(mtp: dict, pp: int) -> str:
    """Where the multi-token prediction modules' memory is counted: a pipeline's last stage runs them."""
    return "" if mtp.get("stage") is None else f" on stage {mtp['stage']}, the last of {pp}, which runs it"


def _reported_stage(mtp: dict) -> str:
    """Which stage the memory lines below are, when a pipeline's fullest stage is not the one running the modules."""
    seen = mtp.get("reported_stage")
    return "" if seen is None or seen == mtp.get("stage") else f"; the memory below is stage {seen}'s, the fullest"


def cpu_eta_note(r: Plan) -> str:
    """What a CPU plan's ETA (`planning.eta`) rests on: the cores' theoretical peak (the one `train` logs its CPU MFU
    against, unless a peak was given), and the MFU, the fp32 default unless --mfu gave one. No bound either way: a
    small model's GEMMs reach 0.74-0.82 of that peak on 2 Xeon cores, under half the time the default's ETA says."""
    tell = "train's logged mfu as --measured_mfu times it"
    # (a peak given: --peak_tflops, the file's peak_tflops)
    if not r.device.peak_source.startswith(hardware.ASSUMED_PEAK):
        return f"; cpu: MFU {r.mfu:.2f} is an assumption: {tell}"
    moe = ", a MoE's CPU default: docs/PLAN.md" if r.model.experts and not r.mfu_given else ""
    return f"; cpu: an estimate, not a bound (peak and MFU assumed{moe}): {tell}"


def eval_line(r: Plan) -> str:
    """The evaluation's peak (`planning.eval_memory`): its own batch, a forward without gradients, beside what the
    step leaves allocated; a batch that does not fit is named with the key that lowers it."""
    e, d = r.eval_breakdown_gib, r.device
    if r.eval_memory_gib <= d.memory_gib:
        verdict = "fits"
    elif not r.fits:  # (what the step holds does not fit either: the verdict above is the one to act on)
        verdict = "does not fit, as the step does not"
    else:
        verdict = ("DOES NOT FIT: the first evaluation runs out of memory; lower per_device_eval_batch_size "
                   "(`plan --fit` lowers it to what fits)")
    return (f"eval per device: {r.eval_memory_gib:.2f} GiB = held between steps {e['held']:.2f} + the forward of "
            f"per_device_eval_batch_size {r.eval_batch} x {r.max_seq_length} tokens {e['forward']:.2f} (no gradients) "
            f"+ framework {e['framework']:.2f}  of {d.memory_gib:.1f} -> {verdict}")


def format_report(r: Plan) -> str:
    """`plan`'s printed report."""
    d, p, par, m = r.device, r.params, r.parallel, r.model
    peak_text = f"{d.peak_tflops:g} TFLOPS" if d.peak_tflops else "unknown"
    lines = [f"plan: {r.config or 'command line'} on {r.gpus} x {d.name} ({d.memory_gib:.1f} GiB each)"]
    lines += [f"  note: {n}" for n in r.notes]
    lines.append(f"model: {m.model_type}, {count(m.layers, 'layer')}, hidden {m.hidden}, heads {m.heads}/"
                 f"{m.kv_heads} kv, vocab {m.vocab}"
                 + (f", {m.experts} experts ({m.experts_per_token} per token)" if m.experts else ""))
    lines.append(f"params: {_si(p['total'])} total = {_si(p['embedding'])} embedding + {_si(p['non_embedding'])} "
                 f"non-embedding{' (tied LM head counted once)' if r.tied else ''} [{p['total']:,}]")
    if p["experts"]:  # a Mixture-of-Experts model: what one token uses, and what expert parallelism divides
        lines.append(f"  active per token: {_si(p['active'])} [{p['active']:,}] (the top-k routed experts, the router "
                     f"and any shared expert: what FLOPs count); routed experts {_si(p['experts'])}"
                     + (f", 1/{par.ep} on each rank (expert parallelism)" if par.ep > 1 else ""))
    if r.capacity:  # what a micro-batch's experts compute, as the run's experts line says it, and what is planned
        c = r.capacity
        kept = ("its balanced share (balanced routing" + (", within the capacity)" if c["capacity_factor"] else ")")
                if c["kept_share"] >= 1 else f"the capacity, {c['kept_share']:.0%} of its balanced share")
        lines.append(f"  capacity: {c['words']}; memory and time plan {assignments(c['per_expert'])} assignments a "
                     f"micro-batch per expert, {kept}")
    if r.mtp:  # DeepSeek-V3's multi-token prediction modules: trained and checkpointed, outside the total
        t = r.mtp
        first, last = t["first_layer"], t["first_layer"] + t["modules"] - 1
        lines.append(f"  multi-token prediction: {t['modules']} module{'s' if last > first else ''} (layer "
                     f"{first}{f'-{last}' if last > first else ''}), {_si(t['params'])} parameters of its own "
                     f"[{t['params']:,}] ({_si(t['active'])} active per token), outside the total as transformers "
                     f"loads none: {t['flops_share']:.1%} of the model FLOPs/token, {t['memory_gib']:.2f} GiB of the "
                     f"memory per device{_mtp_stage(t, par.pp)} (weights, gradients, optimizer state, activations, "
                     f"its LM head + loss){_reported_stage(t)}")
    f = r.flops_per_token
    hardware_flops = f", {f.hardware:.4g} hardware (with recompute)" if r.recompute else ""
    lines.append(f"FLOPs/token: {f.model:.4g} model (6N{'_active' if p['experts'] else ''} + 12·L·H·d·S, "
                 f"GQA-aware){hardware_flops}, "
                 f"PaddleNLP formula {f.paddlenlp:.4g}"
                 + ("; document masking does less attention than counted (MFU stays comparable with causal runs)"
                    if r.attention_mask_type == "document" else ""))
    level = f" {r.precision.amp_level}" if r.precision.amp_level else ""  # (none in float32)
    lines.append(f"precision {r.precision.amp_dtype}{level}; world {par.world} "
                 f"= {_data_ranks(par)} x tp {par.tp}" + (f" x cp {par.cp}" if par.cp > 1 else "")
                 + (f" (ep {par.ep}: experts split over groups of {par.ep} data ranks)" if par.ep > 1 else "")
                 + (f" x pp {par.pp}{f' x {par.vpp} virtual' if par.vpp > 1 else ''} (the fullest stage below, "
                    f"bubble {par.pipeline_bubble:.1%})" if par.pp > 1
                    else "") + "; "
                 f"recompute {r.recompute or 'off'}; attention {r.attention_words or r.attention}, "
                 f"{r.attention_mask_type} mask")
    lines.append(f"tokens: {r.micro_batch} x acc {r.gradient_accumulation_steps} x {count(par.data_ranks, 'data rank')}"
                 f" x {r.max_seq_length} = {r.tokens_per_step:,} tokens/step; "
                 f"{count(r.max_steps, 'step', grouped=True)} = {r.total_tokens:,} tokens")
    if r.schedule:
        lines.append(f"schedule: {r.schedule}")
    if r.layout and (par.tp > 1 or par.pp > 1 or par.ep > 1):
        lines += layout.format_layout(r.layout, par.vpp)
    if r.gpus > 1:
        ln = d.links
        lines.append(f"links per GPU: in-node {ln.in_node_gbps:g} GB/s ({ln.source}), cross-node "
                     f"{ln.cross_node_gbps:g} GB/s; {count(ln.gpus_per_node, 'GPU')} per node")
    traffic_text = ", ".join(f"{name} {r.traffic_gb_per_step[k]:.3g} GB ({link_name(r, k)})"
                             for k, name in TRAFFIC_NAMES.items() if r.traffic_gb_per_step.get(k))
    if traffic_text:
        which = f" (stage {r.slowest_stage}, the slowest)" if par.pp > 1 else ""
        lines.append(f"traffic per device per step{which}: {traffic_text}")
    lines.append("memory per device (GiB):")
    for k, v in r.memory_breakdown_gib.items():
        lines.append(f"  {k:<16} {v:9.2f}")
    verdict = "fits" if r.memory_gib <= d.memory_gib else "DOES NOT FIT"
    lines.append(f"  {'total':<16} {r.memory_gib:9.2f}  of {d.memory_gib:.1f} -> {verdict}")
    s = r.startup_breakdown_gib
    verdict = "fits" if r.startup_gib <= d.memory_gib else "DOES NOT FIT: train cannot start"
    lines.append(f"start-up per device: {r.startup_gib:.2f} GiB = weights {s['weights']:.2f} (what this rank "
                 f"builds) + transient {s['transient']:.2f} (the block being created, fp32) + "
                 f"framework {s['framework']:.2f}  of {d.memory_gib:.1f} -> {verdict}")
    if r.eval_memory_gib is not None:
        lines.append(eval_line(r))
    c = r.checkpoint
    parts = " + ".join(f"{k} {v:.2f}" for k, v in c.parts_gib.items() if v)
    lines.append(f"checkpoints: {c.per_checkpoint_gib:.2f} GiB each ({parts}) x {c.kept} kept + final weights "
                 f"{c.final_weights_gib:.2f} = {c.total_gib:.2f} GiB on disk")
    lines.append(f"  each save: {c.per_rank_gib:.2f} GiB written by every rank at once, ~{c.save_seconds:.1f} s at "
                 f"{c.disk_gb_per_s_per_rank:g} GB/s per rank (an assumed write rate; nothing is gathered)")
    lines.append(f"peak: {peak_text} per device, from {d.peak_source}" if d.peak_tflops
                 else f"peak: unknown ({d.peak_source})")
    lines += eta_lines(r, cpu_eta_note(r) if d.name == "cpu" and r.eta_hours is not None else "")
    if r.suggestions:
        lines.append("suggestions (each re-estimated; when no one key fits, first the fewest keys or devices that "
                     "do; then ranked by memory saved):")
        for i, sg in enumerate(r.suggestions, 1):
            if sg.get("machine"):  # (`suggestions.machine_too_small`: no change fits, the line says what does)
                lines.append(f"  {i}. {sg['why']}")
                continue
            change = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sg["change"].items())
            if "gpus" in sg:
                change = f"--gpus {sg['gpus']} with {change}" if change else f"--gpus {sg['gpus']}, no key changed"
            lines.append(f"  {i}. {change}  -> {sg['memory_gib']:.2f} GiB (saves {sg['saves_gib']:.2f})"
                         f"{'  fits' if sg['fits'] else ''}; {sg['why']}")
        if not any(sg.get("machine") for sg in r.suggestions):
            lines.append("  --fit searches these together for the fastest layout that fits (same global batch); "
                         "-o writes it")
    elif not r.fits:
        lines.append("suggestions: none of recompute, flash attention, sharding, smaller micro-batch or shorter "
                     "sequence reduces the estimate; use more or larger devices")
    return "\n".join(lines)
