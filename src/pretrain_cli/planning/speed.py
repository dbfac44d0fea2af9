"""The speed model `plan` and `plan --fit` rank layouts by (docs/PLAN.md): per optimizer step, each pipeline
stage's compute and the bytes it sends on its tensor-parallel, pipeline, ZeRO-3, context-parallel and
expert-parallel groups, from the stage's own layers, each term over the link its group uses (in-node or cross-node:
`planning.hardware.links`); the step from the slowest stage with the pipeline's fill and drain (1F1B or
interleaved), then the data-parallel gradients. Each formula is written once here. No Paddle.
"""
from __future__ import annotations

from pretrain_cli.models.flops import experts, flops_per_token, layer_counts, param_counts
from pretrain_cli.models.stages import stage_layers
from pretrain_cli.planning import hardware
from pretrain_cli.planning.experts import dispatch_bytes, kept_share, mlp_reduce_rows
from pretrain_cli.planning.context import context_traffic_bytes, mtp_shift_bytes
from pretrain_cli.planning.memory import Setup, mtp_params, stage_experts
from pretrain_cli.planning.report import Plan, in_node, link_gbps, link_name
from pretrain_cli.run_layout import ENGINE_TRAITS, ParallelConfig, engine_for

NOMINAL_TFLOPS = 1.0  # ranks candidates when the device has no known peak (tokens/s is then not shown)


def pipeline_bubble(stages: int, micro_batches: int, virtual: int = 1) -> float:
    """The share of a step each stage idles: (P − 1)/(V·m + P − 1) with V model chunks per stage (1F1B: V = 1;
    interleaved 1F1B: each of the P − 1 idle slots at either end is one chunk's, 1/V of a stage's, Megatron's
    (P − 1)/(V·m) of the busy time). fleet's interleaved schedule (3.3.1) has exactly this bubble also when m is
    not a multiple of P (its order simulated with unit chunk times: docs/PLAN.md, Speed model)."""
    return (stages - 1) / (virtual * micro_batches + stages - 1)


def partial_sends(setup: Setup, par: ParallelConfig) -> bool:
    """Whether a pipeline stage sends each tensor-parallel rank's 1/tp of its activation (fleet's partial send:
    `enable_partial_send_recv`, which `strategies.pipeline.pipeline_configs` turns off under sequence parallelism and
    `comms.collectives.Collectives.pipeline_flags` on gloo, and which fleet applies when the tensor's element count
    divides by tp: pp_utils/p2p_communication.py 3.3.1)."""
    elements = setup.micro_batch * setup.seq_len * setup.model.hidden_size  # one [b, s, hidden]
    return (par.pp_degree > 1 and par.tp_degree > 1 and not par.sequence_parallel and setup.device != "cpu"
            and elements % par.tp_degree == 0)


def stage_traffic(setup: Setup, par: ParallelConfig, params: dict) -> list[dict[str, float]]:
    """Per pipeline stage (one entry without a pipeline), bytes one device of it sends per optimizer step on each
    group (the speed model's terms, docs/PLAN.md), from the stage's own layers (`models.stages.stage_layers`, the
    split the pipeline runs; DeepSeek-V3's multi-token prediction layers on the last stage, after the decoder's):

    tp    = acc × Σ over its layers (n_attn + n_mlp × r) × 2(t−1)/t × b·s·hidden·c  (all-reduces per layer of the
            attention and MLP outputs: n_attn = n_mlp = 2, forward and backward; + 1 each under `full`, + 1 attention
            under `full_attn` recompute; r = `experts.mlp_reduce_rows`: 1 for a dense layer, top_k (+1 shared) for a
            sparse one), + acc × 2V × (t−1)/t × b·s·hidden·c under a pipeline's partial sends (the receiver
            all-gathers the pieces of each activation and gradient over the tp group)
    pp    = acc × 2V × b·s·hidden·c / t  (one activation forward, its gradient back, per micro-batch and model chunk,
            V = virtual_pp_degree: what a middle stage sends, the end stages 2V − 1; the interleaved schedule's last
            stage sends its chunks' outputs back to the first stage's next chunk; on NCCL without sequence parallelism
            fleet's partial send, each tp rank 1/t of the activation they all hold (`partial_sends`); under
            sequence parallelism each rank's own 1/t of the sequence, whole; on gloo (CPU) the whole activation
            from every tp rank, without the /t)
    zero3 = acc × 3 × weight bytes of its stage and TP slice × (S−1)/S  (gathered for forward and backward, gradients
            reduce-scattered, per micro-batch)
    cp    = acc × `context.context_traffic_bytes` × the stage's layers (the MTP modules' too) ÷ the decoder's (per
            layer ring attention's K/V blocks, again under full/full_attn recompute, and its dK/dV blocks; every
            stage was charged every decoder layer's before); on the last stage + acc × `context.mtp_shift_bytes`
            (DeepSeek-V3's multi-token prediction: each depth's ids and labels all-gathered over the cp group)
    ep    = acc × `experts.dispatch_bytes` over the stage's sparse layers (a stage of dense layers sends nothing)
    dp    = 2(D−1)/D × gradient bytes of its stage and TP slice, once per step, D = data ranks × cp (the ranks
            holding the same slice): DP's all-reduce, ZeRO-1's reduce and broadcast, ZeRO-2's reduce-scatter and
            all-gather move the same bytes; under ZeRO-3 the gradients are in `zero3`; under expert parallelism
            a rank's routed experts are reduced over their D/ep holders instead; each stage its own experts
            (`memory.stage_experts`) and the last the multi-token prediction modules' gradients (`memory.mtp_params`:
            `_stage_gradient_bytes`)
    Every stage was charged an average layer's tp and ep traffic before (and every stage the MTP layers' dispatch),
    so a DeepSeek stage of dense layers was given all-to-all time it never spends. `params` is
    `models.flops.param_counts` of the model."""
    cfg = setup.model
    acc, tp, pp, deg = setup.micro_batches, par.tp_degree, par.pp_degree, par.sharding_degree
    vpp = par.virtual_pp_degree  # each micro-batch crosses every stage boundary once per model chunk
    act = setup.micro_batch * setup.seq_len * cfg.hidden_size * setup.compute_bytes  # one [b, s, hidden]
    partial = partial_sends(setup, par)
    n_attn, n_mlp = 2 + (setup.recompute in ("full", "full_attn")), 2 + (setup.recompute == "full")
    sparse = set(cfg.sparse_layers)
    mtp = tuple(range(cfg.num_hidden_layers, cfg.num_hidden_layers + (cfg.num_nextn_predict_layers or 0)))
    replicas = par.data_world_size * par.cp_degree
    out = []
    for stage, layers in enumerate(stage_layers(cfg.num_hidden_layers, pp, vpp)):
        ran = layers + (mtp if stage == pp - 1 else ())  # the decoder layers this stage runs, the MTP modules' too
        kinds = [i in sparse if i < cfg.num_hidden_layers else cfg.is_sparse_layer(i) for i in ran]
        t = {"tp": 0.0, "pp": 0.0, "zero3": 0.0, "cp": 0.0, "ep": 0.0, "dp": 0.0}
        if tp > 1:
            rows = sum(n_attn + n_mlp * mlp_reduce_rows(setup, kind) for kind in kinds)
            t["tp"] = acc * rows * 2 * (tp - 1) / tp * act
            t["tp"] += acc * 2 * vpp * (tp - 1) / tp * act if partial else 0.0  # the received pieces all-gathered
        if pp > 1:
            t["pp"] = acc * 2 * vpp * act / (tp if par.sequence_parallel or partial else 1)
        if par.sharding_stage == 3 and deg > 1:
            weight_bytes = params["total"] / tp / pp * (2 if setup.amp_level == "O2" else 4)
            t["zero3"] = acc * 3 * weight_bytes * (deg - 1) / deg
        if par.cp_degree > 1:  # `setup.seq_len` is one rank's share of the sequence; per decoder layer
            t["cp"] = acc * context_traffic_bytes(cfg, setup.micro_batch, setup.seq_len * par.cp_degree,
                                                  par.cp_degree, setup.compute_bytes, setup.recompute, tp) \
                * len(ran) / cfg.num_hidden_layers
            if stage == pp - 1:  # the MTP modules' next tokens, gathered where they run
                t["cp"] += acc * mtp_shift_bytes(cfg, setup.micro_batch, setup.seq_len * par.cp_degree, par.cp_degree)
        if setup.ep > 1:
            t["ep"] = acc * dispatch_bytes(setup, sum(kinds))
        if replicas > 1 and par.sharding_stage < 3:
            t["dp"] = _stage_gradient_bytes(setup, params, replicas, stage)
        out.append(t)
    return out


def _stage_gradient_bytes(setup: Setup, params: dict, replicas: int, stage: int) -> float:
    """`stage_traffic`'s dp term for pipeline stage `stage`: a 1/pp share of all but the routed experts (and on the last
    stage the multi-token prediction modules' other parameters) over the `replicas`, and the stage's own routed
    experts (`memory.stage_experts`: its sparse layers', the modules' on the last stage) over their replicas / ep
    holders, or with the rest without expert parallelism. Every stage reduces at the step's end; `speed` takes
    the most. Counting every stage's experts (and the modules') on each planned DeepSeek-V3 at pp 16 x ep 8 on 256
    ranks at 171.57 GB a step; its fullest stage sends 16.55."""
    grad_bytes = 2 if setup.amp_level == "O2" and not setup.master_grad else 4
    tp, pp = setup.tp, setup.pp
    own = stage_experts(setup, stage)  # ÷ ep · tp
    rest = (params["total"] - params["experts"]) / tp / pp + (mtp_params(setup)[0] if stage == pp - 1 else 0.0)
    if setup.ep > 1:
        routed, holders = own, replicas // setup.ep
    else:
        routed, holders, rest = 0.0, replicas, rest + own
    return (2 * (replicas - 1) / replicas * rest + 2 * (holders - 1) / holders * routed) * grad_bytes


def stage_flops_per_token(s: Setup, hardware: bool = True) -> list[float]:
    """Per pipeline stage (one entry without a pipeline), the training FLOPs per token of the model's tokens that
    its layers do (`models.flops.flops_per_token`'s terms, layer by layer): each decoder layer 6 × its active
    parameters (a dense layer its MLP, a sparse one its router, shared experts and top_k routed experts) + its
    attention, and with `hardware` the forward `recompute` reruns; the last stage also the final norm, the LM head
    and the multi-token prediction modules (what `flops_per_token` counts beyond the decoder layers). The stages
    sum to `flops_per_token`; with `hardware`, less the routed assignments `capacity_factor` drops at balanced
    routing (`experts.kept_share`: the training forward computes no more, so neither does the backward nor the
    recompute), in the decoder's sparse layers and the modules'. Each stage was given 1/pp of it before:
    DeepSeek-V3's first stage at pp 16 (3 dense layers) as much as one of 4 sparse layers."""
    cfg, seq = s.model, s.seq_len * s.cp
    recompute = s.recompute if hardware else None
    plain = flops_per_token(cfg, seq)
    n_layers = cfg.num_hidden_layers
    attn = (flops_per_token(cfg, seq, "core_attn", hardware=True) - plain) / n_layers  # one layer's QKᵀ and PV
    again = {"full_attn": (flops_per_token(cfg, seq, "full_attn", hardware=True) - plain) / n_layers,
             "core_attn": attn}.get(recompute, 0.0)  # a layer's recomputed forward, the same in every layer
    e = experts(cfg)
    kept = kept_share(s) if hardware else 1.0

    def layer(counts: tuple, kept: float = 1.0) -> float:
        total, _, routed = counts
        active = total - routed + (routed * e.top_k / e.routed * kept if e else 0)  # its top_k routed experts of all
        return 6 * active + 3 * attn + (2 * active + attn if recompute == "full" else again)

    counts = layer_counts(cfg)
    per_layer = [layer(c, kept) for c in counts]
    out = [sum(per_layer[i] for i in layers) for layers in stage_layers(n_layers, s.pp, s.vpp)]
    # the head, norm and MTP modules (less the modules' routed assignments the capacity drops: not recomputed)
    out[-1] += flops_per_token(cfg, seq, recompute, hardware) - sum(layer(c) for c in counts)
    if e and kept < 1:
        out[-1] -= 6 * param_counts(cfg)["mtp_experts"] * e.top_k / e.routed * (1 - kept)
    return out


def pipeline_seconds(stages: list[float], micro_batches: int, virtual: int = 1) -> float:
    """A step's time from each stage's busy time `stages` (all its micro-batches and chunks): the slowest stage
    runs its V·m chunks back to back, and the others' one chunk of a micro-batch each fills and drains the pipeline
    around it: max + (Σ − max)/(V·m). With equal stages T, T·(V·m + P − 1)/(V·m) = T/(1 − `pipeline_bubble`);
    one stage: its time. An average stage's T/(1 − bubble) before, whatever the stages' layers."""
    slowest = max(stages)
    return slowest + (sum(stages) - slowest) / (virtual * max(micro_batches, 1))


def reducer_overlap_seconds(r: Plan, compute_seconds: float) -> float:
    """The backward time the data-parallel gradients' all-reduce hides behind: where `paddle.DataParallel` runs them
    (no sharding, tensor, pipeline or expert parallelism: `run_layout`'s engines with its buffers), its reducer
    all-reduces each bucket as the backward of the step's last micro-batch makes it (the others under `no_sync`),
    so up to that backward's compute: 1/m of the step's, less its forward (a third of the model FLOPs; recompute's
    forward is backward time). 0 elsewhere: fleet's ZeRO and the semi-auto engine reduce after the backward, and
    Paddle 3.3.1's ShardingStage3 gathers each weight as it is used, without prefetch, so no traffic term but this
    one is taken as overlapped with compute."""
    par, f = r.parallel, r.flops_per_token
    engine = engine_for(par.world, par.tp, par.sharding_stage, par.pp, par.cp, par.sequence_parallel)
    if not ENGINE_TRAITS[engine].dp_buffers or par.sharding_stage or par.ep > 1 or not f.hardware:
        return 0.0
    return compute_seconds / max(r.gradient_accumulation_steps, 1) * (1 - f.model / 3 / f.hardware)


def speed(r: Plan) -> dict:
    """Predicted seconds per optimizer step and tokens/s (whole run) for one planned layout: each pipeline stage's
    busy time from its own layers (`Plan.stages`: its FLOPs with recompute / (peak × MFU), plus its TP, PP, ZeRO-3,
    CP and EP traffic, each term over the link its group uses, `report.link_gbps`, none overlapped with compute),
    the step from the slowest stage and the fill and drain of the others (`pipeline_seconds`), then the data-parallel
    gradients' exchange once per step (the most any stage sends), less what `paddle.DataParallel` overlaps with the
    last backward (`reducer_overlap_seconds`). `slowest_stage`: the stage that sets the step; `traffic_seconds`:
    its traffic terms and the gradients' exposed part, seconds a step (what the ETA line names the largest of)."""
    par, peak = r.parallel, r.device.peak_tflops
    rate = (peak or NOMINAL_TFLOPS) * 1e12 * r.mfu
    compute = [st["tflops_per_step"] * 1e12 / rate for st in r.stages]
    sends = [{term: gb / link_gbps(r, term) for term, gb in st["traffic_gb_per_step"].items() if term != "dp" and gb}
             for st in r.stages]
    busy = [c + sum(s.values()) for c, s in zip(compute, sends)]
    m, v = r.gradient_accumulation_steps, par.vpp
    flops = pipeline_seconds(compute, m, v)
    sent = max(st["traffic_gb_per_step"].get("dp", 0.0) for st in r.stages) / link_gbps(r, "dp")
    dp = sent - min(sent, reducer_overlap_seconds(r, flops))
    step = pipeline_seconds(busy, m, v) + dp
    known, slowest = peak is not None, busy.index(max(busy))
    return {"step_seconds": step if known else None, "compute_seconds": flops if known else None,
            "comm_seconds": step - flops if known else None,
            "tokens_per_sec": r.tokens_per_step / step if known else None,
            "rank_seconds": step, "slowest_stage": slowest, "dp_overlapped_seconds": sent - dp,
            "traffic_seconds": {**sends[slowest], **({"dp": dp} if dp else {})}}


def traffic_bound(r: Plan, sp: dict) -> dict | None:
    """What bounds a layout whose predicted step (`speed`'s `sp`) is more traffic than compute, i.e. whose model
    FLOPs reach under half the MFU assumed: its mfu as train logs it (`Plan.logged_mfu`), the step's share spent
    on traffic, and each of its traffic terms (`sp["traffic_seconds"]`: the slowest stage's and the gradients'
    exposed part) in seconds a step over the link its group uses, largest first. None when the compute is the
    larger, or without a peak. DeepSeek-V3's tp 16 x ZeRO-3 on 208 H100 was --fit's pick at 4,069 tokens/s (0.6 %
    of peak) with nothing saying why."""
    from pretrain_cli.planning.eta import TRAFFIC_NAMES
    from pretrain_cli.planning.report import TERM_AXIS

    if sp["step_seconds"] is None or sp["comm_seconds"] <= sp["compute_seconds"]:
        return None
    terms = [{"term": t, "axis": TERM_AXIS[t], "name": TRAFFIC_NAMES[t], "seconds": x, "link": link_name(r, t)}
             for t, x in sorted(sp["traffic_seconds"].items(), key=lambda kv: -kv[1])]
    return {"logged_mfu": r.logged_mfu, "traffic_share": sp["comm_seconds"] /
            sp["step_seconds"], "compute_seconds": sp["compute_seconds"], "step_seconds": sp["step_seconds"],
            "terms": terms}


def traffic_parts(r: Plan, sp: dict, steps: int) -> dict:
    """What the ETA line says of its traffic part (`Plan.eta_traffic`), from `speed`'s `sp` over `steps` steps: the
    largest term, its hours and link (and whether that figure is an assumption: a cross-node link not given by
    --cross_node_gbps), how many terms there are, and the hours DataParallel's reducer hides behind the backward."""
    if not sp["traffic_seconds"]:
        return {}
    term, seconds = max(sp["traffic_seconds"].items(), key=lambda kv: kv[1])
    assumed = not in_node(r, term) and r.device.links.cross_node_source != "--cross_node_gbps"
    return {"largest": term, "largest_hours": seconds * steps / 3600, "link": link_name(r, term),
            "link_assumed": assumed, "terms": len(sp["traffic_seconds"]),
            "overlapped_hours": sp["dp_overlapped_seconds"] * steps / 3600}


def fp32_on_gpu_note(entry, r: Plan, mfu: float | None, peak_given: bool, mfu_half: float) -> list[str]:
    """One line when a GPU plan (`entry`: its hardware-table device) is fp32 because the file asks for neither bf16
    nor fp16 (the caller's test: a CPU try-out's file planned for a GPU): `train` there would run fp32 too, so the
    plan stays fp32, but its speed is the non-tensor-core peak's; the line gives the half-precision key and its peak
    and ETA (the same FLOPs at that peak and, without --mfu, MFU `mfu_half`, and the same traffic time). Without bf16
    (pre-Ampere) the key is fp16. A peak the user gave (`peak_given`), or an ETA at --measured_mfu (fp32's, which
    says nothing of the half run's), is not scaled: the key alone. Where the plan's notes say the FLOPs model does
    not hold for the model (`plan.too_small_note`: the tiny MoE on an H100 was "ETA 0.00 h ... 19.7x sooner" beside
    it), neither time nor their ratio is given: a launch-bound step is not sped up by the peak. Both times read in
    the fp32 one's `eta.unit`."""
    from pretrain_cli.planning.eta import TOO_SMALL, duration, unit

    fp16 = hardware.no_bf16(entry.name, entry.capability) is not None
    key, kind = ("fp16: true", "fp16") if fp16 else ("bf16: true", "bf16")
    half = hardware.peak_tflops(entry, "float16" if fp16 else "bfloat16")
    head = (f"precision: WARNING: the file sets neither bf16 nor fp16, so `train` on {entry.name} runs fp32 as "
            f"planned here")
    if peak_given or half is None or r.eta_hours is None or not r.device.peak_tflops or r.measured_mfu is not None:
        return [f"{head}; set `{key}` (with `fp16_opt_level: O2` for half-precision weights) to train on its "
                f"{kind} tensor cores, and plan again"]
    cores = f"`{key}` (with `fp16_opt_level: O2` for half-precision weights) trains on its {half:g} TFLOPS {kind} " \
        f"tensor cores"
    if any(n.startswith(TOO_SMALL) for n in r.notes):
        return [f"{head} ({r.device.peak_tflops:g} TFLOPS non-tensor-core); {cores}; how much sooner is not said: "
                f"the speed model does not hold for this model (the speed note): time a few steps of each"]
    half_mfu = mfu if mfu is not None else mfu_half
    traffic = r.eta_traffic_hours or 0.0  # (the fp32 run's traffic, unscaled: the half run's sends no more)
    eta = (r.eta_hours - traffic) / (half * half_mfu / (r.device.peak_tflops * r.mfu)) + traffic
    u = unit(r.eta_hours)  # (both in the fp32 time's unit, as the ETA line's parts are in its total's)
    return [f"{head} ({r.device.peak_tflops:g} TFLOPS non-tensor-core, ETA {duration(r.eta_hours, u)}); {cores}: "
            f"ETA {duration(eta, u)} at MFU {half_mfu:.2f}, {r.eta_hours / eta:.3g}x sooner (plan it with "
            f"--{key.replace(': ', ' ')} for its memory and time)"]
