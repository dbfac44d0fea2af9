"""The plan for one resolved run on a target device: memory, FLOPs, tokens, checkpoint size, time.

It reads the same `RunConfig` that `train` runs (the attention path, recompute granularity,
precision and sharding decided once by `config.resolve`), so the memory it models is the layout
`train` would build. No Paddle, no data, no tokenizer: planning happens before any of them exist.
Suggestions are key changes that the caller re-resolves and re-plans (`suggest(..., replan)`), so
each effect is computed, not guessed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pretrain_cli.errors import UserError
from pretrain_cli.models.flops import _cached
from pretrain_cli.planning import hardware, layout
from pretrain_cli.planning.activations import head_loss_bytes
from pretrain_cli.planning.memory import GIB, Setup, checkpoint_bytes, estimate, pipeline_stages, startup_parts
from pretrain_cli.planning.report import (CheckpointPlan, FlopsPerToken, ModelShape, Plan, PlannedDevice,
                                          PlannedLayout, PlannedPrecision)
from pretrain_cli.planning.speed import pipeline_bubble, traffic
from pretrain_cli.run_config import RunConfig

SAVE_GB_PER_S = 1.0  # assumed: what one rank writes per second to the shared output_dir (plan's save-time line)

MFU_HALF, MFU_FP32 = 0.40, 0.30  # typical well-tuned dense training; override with --mfu
_BARE: dict = {}  # `mtp_share`'s model configs without the multi-token prediction modules


@dataclass(frozen=True)
class Device:
    """The device being planned for: a table entry, or this machine's CPU (`entry` None)."""

    entry: hardware.Device | None
    memory_gib: float
    node: hardware.Node = hardware.Node()
    sharing: int = 1  # cpu: the processes of one node that share its memory (each has memory_gib)

    @property
    def is_gpu(self) -> bool:
        return self.entry is not None

    @property
    def name(self) -> str:
        return self.entry.name if self.entry else "cpu"

    @property
    def links(self) -> hardware.Links:
        return hardware.links(self.entry, self.node)


def target_device(name: str, node: hardware.Node = hardware.Node(), gpus: int = 1) -> Device:
    """`--device`: a hardware-table entry (H100 -> H100-SXM), or `cpu`; `node`: its nodes. A GPU's memory is its
    own, but `cpu` processes share this machine's memory: each of the min(gpus, gpus_per_node) processes a node runs
    gets an equal part of it (one process per device is what `train` launches)."""
    if name.lower() == "cpu":
        sharing = max(min(gpus, node.gpus), 1)
        return Device(None, hardware.cpu_memory_gib() / sharing, node, sharing)
    dev = hardware.lookup(name)
    if dev is None:
        raise UserError(f"--device: unknown device {name!r}; use one of "
                        f"{', '.join(d.name for d in hardware.DEVICES.values())} or cpu")
    return Device(dev, float(dev.memory_gib), node)


def device_note(name: str, dev: Device) -> list[str]:
    """A note when `--device` named a family and the table picked one variant of it (H100 -> H100-SXM); on `cpu`,
    what each process's memory is (its part of this machine's) and what the memory model leaves out there."""
    if dev.entry is None:
        share = (f"{dev.memory_gib * dev.sharing:.1f} GiB of this machine's memory shared by the {dev.sharing} "
                 f"processes of a node (--gpus_per_node {dev.node.gpus}): {dev.memory_gib:.2f} GiB each"
                 if dev.sharing > 1 else f"this machine's memory, {dev.memory_gib:.1f} GiB")
        return [f"device: cpu: {share}; framework is 0 here: the memory model counts the tensors Paddle's host "
                f"allocator holds, not the ~0.3 GiB each process takes to load Paddle: leave that free per process"]
    if name.lower() == dev.entry.name.lower():
        return []
    e = dev.entry
    others = [d.name for d in hardware.DEVICES.values() if d.name.split("-")[0] == e.name.split("-")[0] and d != e]
    peak = f"{e.bf16_tflops or e.fp16_tflops:g} TFLOPS half precision" if (e.bf16_tflops or e.fp16_tflops) else ""
    return [f"device: --device {name} is planned as {e.name} ({e.memory_gib:g} GiB{', ' + peak if peak else ''})"
            + (f"; name {' or '.join(others)} for another variant" if others else "")]


def setup_for(run: RunConfig, model_cfg, device: Device, baseline_bytes: float = 0.0) -> Setup:
    """The memory model's view of a resolved run on one device."""
    return _setup(run, model_cfg, device.is_gpu, baseline_bytes)


def fused_loss_on_gpu(run: RunConfig, model_cfg) -> tuple[float, float]:
    """(with the fused head + loss, without) bytes of the `logits_loss` term `plan` gives the GPU holding the LM
    head of `run`: its tokens there (micro-batch x max_seq_length / cp), compute dtype, vocabulary, hidden size and
    recompute. `config.resolve` keeps the fused loss on a GPU, unless the file sets it, only where the first is
    the smaller, so the run `plan` models is the one `train` builds."""
    s = _setup(run, model_cfg, True, 0.0)
    return head_loss_bytes(dataclasses.replace(s, fused_loss=True)), head_loss_bytes(
        dataclasses.replace(s, fused_loss=False))


def _setup(run: RunConfig, model_cfg, gpu: bool, baseline_bytes: float) -> Setup:
    prec, p, k = run.precision, run.parallel, run.kernels
    return Setup(
        model=model_cfg, micro_batch=run.loop.micro_batch, seq_len=run.data.max_seq_length // p.cp_degree,
        compute_bytes=prec.compute_bytes, amp_level=prec.level if prec.enabled else None,
        master_grad=prec.master_grad, sharding_stage=p.sharding_stage,
        sharding_degree=p.sharding_degree * (p.cp_degree if p.sharding_stage else 1),  # ZeRO-1 under CP: cp x sharding
        tp=p.tp_degree, vocab_parallel=p.vocab_parallel, recompute=run.recompute_granularity, attention=k.attention,
        fused_rms_norm=gpu and k.rms_norm == "fused", fused_rope=gpu and k.rope == "fused",
        device="gpu" if gpu else "cpu", baseline_bytes=baseline_bytes, dp_buffers=p.traits.dp_buffers,
        distributed_tensors=p.traits.distributed_tensors,
        document_mask=run.data.document_mask, reset_positions=run.data.reset_position_ids,
        fused_loss=k.fused_loss, pp=p.pp_degree, vpp=p.virtual_pp_degree, micro_batches=run.loop.grad_accum, cp=p.cp_degree,
        sp=p.sequence_parallel, ep=p.ep_degree)


def peak(run: RunConfig, device: Device, peak_tflops: float | None = None) -> tuple[float | None, str]:
    """(peak TFLOPS per device, where it came from) for the ETA: --peak_tflops, else the file's
    peak_tflops, else the hardware table."""
    if peak_tflops is not None:
        return peak_tflops, "--peak_tflops on the command line"
    given = (run.loop.peak_tflops, "peak_tflops in the argument file") if run.loop.peak_tflops is not None else None
    return hardware.resolve_peak(device.entry, device.name, run.precision.amp_dtype, given)


# A GPU training step runs roughly this many eager ops per decoder layer (forward, backward, optimizer),
# each costing ~10 us of host dispatch and launch however little it computes; and matmuls narrower than
# SMALL_HIDDEN run far below a GPU's peak (too little work per tile to fill the device).
KERNELS_PER_LAYER, LAUNCH_SECONDS, SMALL_HIDDEN = 60, 10e-6, 512


def too_small_note(cfg, flops_per_micro_step: float, flops_per_second: float) -> list[str]:
    """A note when the FLOPs model (time = FLOPs / (peak x MFU)) cannot hold for this model: its matmuls are
    too narrow to run near peak, or a micro-step's FLOPs take less time than launching its kernels."""
    compute = flops_per_micro_step / flops_per_second
    kernels = cfg.num_hidden_layers * KERNELS_PER_LAYER
    why = []
    if cfg.hidden_size < SMALL_HIDDEN:
        why.append(f"its matmuls are {cfg.hidden_size} wide, under {SMALL_HIDDEN}: far too narrow to run near peak")
    if compute < kernels * LAUNCH_SECONDS:
        why.append(f"a micro-step's FLOPs take {compute * 1e3:.2g} ms at peak x MFU, less than launching its "
                   f"~{kernels} kernels (~{kernels * LAUNCH_SECONDS * 1e3:.2g} ms)")
    if not why:
        return []
    return [f"speed: this model is too small for the FLOPs model ({'; '.join(why)}), so the ETA and tokens/s are "
            f"far too optimistic; time a few steps instead"]


def report(run: RunConfig, model_cfg, device: Device, mfu: float | None = None, baseline_bytes: float = 0.0,
           config: str | None = None, peak_tflops: float | None = None, groups: dict | None = None) -> Plan:
    """The whole plan (`Plan.to_json` is what `plan --json` prints). `groups` ({"tp" | "pp" | "data": the groups
    of ranks along each axis}, from the run's rank rule) explains how the ranks fall onto nodes (`layout`)."""
    from pretrain_cli.models.flops import flops_per_token, paddlenlp_flops_per_token, param_counts

    setup = setup_for(run, model_cfg, device, baseline_bytes)
    s, lp, par, cfg = run.data.max_seq_length, run.loop, run.parallel, model_cfg
    parts = estimate(setup)
    total = sum(parts.values()) / GIB
    start = startup_parts(setup)
    startup = sum(start.values()) / GIB
    model_fpt = flops_per_token(cfg, s)
    total_tokens = run.tokens_per_step * max(lp.max_steps, 0)
    peak_tflops, peak_source = peak(run, device, peak_tflops)
    if mfu is None:
        mfu = MFU_HALF if run.precision.enabled else MFU_FP32
    eta = None if peak_tflops is None else total_tokens * model_fpt / (par.world_size * peak_tflops * 1e12 * mfu) / 3600
    notes = list(run.notes)
    if peak_tflops is not None and device.is_gpu:
        notes += too_small_note(cfg, lp.micro_batch * s * flops_per_token(cfg, s, recompute=setup.recompute,
                                                                          hardware=True) / par.tp_degree,
                                peak_tflops * 1e12 * mfu)
    bubble = pipeline_bubble(par.pp_degree, lp.grad_accum, par.virtual_pp_degree)
    eta = None if eta is None else eta / (1 - bubble)
    ck = checkpoint_bytes(setup)
    per_ck = sum(ck.values())
    n_saves = -(-max(lp.max_steps, 0) // lp.save_steps)  # every save_steps, and at the last step
    kept = min(n_saves, lp.save_total_limit) if lp.save_total_limit else n_saves
    return Plan(
        config=config, device=PlannedDevice(device.name, device.memory_gib, peak_tflops, peak_source,
                                                  device.links),
        gpus=par.world_size,
        model=ModelShape(cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
                         cfg.num_key_value_heads, cfg.vocab_size, cfg.num_experts,
                         cfg.num_experts_per_tok),
        params=param_counts(cfg), tied=bool(cfg.tie_word_embeddings),
        flops_per_token=FlopsPerToken(model_fpt, flops_per_token(cfg, s, recompute=setup.recompute, hardware=True),
                                      paddlenlp_flops_per_token(cfg, s, setup.recompute)),
        precision=PlannedPrecision(run.precision.amp_dtype or "float32", setup.amp_level),
        parallel=PlannedLayout(par.world_size, par.dp_degree, par.sharding_stage, par.sharding_degree, par.tp_degree,
                               par.data_world_size, par.pp_degree, bubble, par.cp_degree,
                               par.sequence_parallel, par.ep_degree, par.virtual_pp_degree),
        micro_batch=lp.micro_batch, gradient_accumulation_steps=lp.grad_accum,
        max_seq_length=s, recompute=setup.recompute, attention=setup.attention,
        attention_mask_type=run.data.attention_mask_type,
        tokens_per_step=run.tokens_per_step, total_tokens=total_tokens, max_steps=lp.max_steps,
        schedule=run.schedule.describe() if run.schedule.phase(1) else "",
        memory_breakdown_gib={k: v / GIB for k, v in parts.items()},
        memory_gib=total, startup_breakdown_gib={k: v / GIB for k, v in start.items()},
        startup_gib=startup, fits=bool(max(total, startup) <= device.memory_gib),
        # every rank writes its own pieces at once, replicas spread over their holders (docs/CHECKPOINTS.md)
        checkpoint=CheckpointPlan(per_ck / GIB, {k: v / GIB for k, v in ck.items()}, kept, ck["weights"] / GIB,
                                  (kept * per_ck + ck["weights"]) / GIB, per_ck / par.world_size / GIB,
                                  SAVE_GB_PER_S, per_ck / par.world_size / (SAVE_GB_PER_S * 1e9)),
        mfu=mfu, eta_hours=eta, notes=tuple(notes),
        traffic_gb_per_step={k: v / 1e9 for k, v in traffic(setup, par, param_counts(cfg)).items()},
        layout=layout.explain(par, groups, device.node.gpus) if groups else None,
        mtp=mtp_share(setup, s, parts, model_fpt),
    )


def mtp_share(setup: Setup, seq_len: int, parts: dict, model_fpt: float) -> dict:
    """What the multi-token prediction modules (`models.mtp`) add to a plan: their own parameters, the model FLOPs
    per token, and the memory of the device that runs them less the same device's without them (so every term the
    models give them counts: weights, gradients, optimizer state, activations, their head + loss); {} for a model
    without them. Under a pipeline that device is the last stage's (`stage`), while the plan's memory is the
    fullest stage's (`reported_stage`): the difference of the two plans' peaks would be the fullest stage's, which
    for DeepSeek-V3 at pp 2 is the first stage's, where the modules cost nothing (it printed 0.00 GiB)."""
    from pretrain_cli.models.flops import flops_per_token, param_counts

    cfg = setup.model
    if not cfg.num_nextn_predict_layers:
        return {}  # (the model without them once per config: its counts are cached by the config, `_cached`)
    bare = dataclasses.replace(setup, model=_cached(_BARE, cfg, lambda c: dataclasses.replace(
        c, num_nextn_predict_layers=0)))
    counts = param_counts(cfg)
    flops = model_fpt - flops_per_token(bare.model, seq_len)
    out = {"modules": cfg.num_nextn_predict_layers, "first_layer": cfg.num_hidden_layers, "params": counts["mtp"],
           "active": counts["mtp_active"], "flops_per_token": flops, "flops_share": flops / model_fpt}
    if setup.pp == 1:
        return {**out, "memory_gib": (sum(parts.values()) - sum(estimate(bare).values())) / GIB,
                "stage": None, "reported_stage": None}
    stages = [sum(p.values()) for p in pipeline_stages(setup)]
    return {**out, "memory_gib": (stages[-1] - sum(pipeline_stages(bare)[-1].values())) / GIB,
            "stage": setup.pp - 1, "reported_stage": stages.index(max(stages))}  # (`estimate`'s pick: the first max)


def _first_fitting(changes: list[dict], replan):
    """The first change that fits, else the last one that could be planned (the strongest)."""
    last = None
    for change in changes:
        r = replan(change)
        if r is None:
            continue
        last = (change, r)
        if r.fits:
            break
    return last


def suggest(run: RunConfig, base: Plan, replan) -> list[dict]:
    """Ranked key changes that lower memory; `replan(change) -> report | None` re-resolves the file with them."""
    lp, s = run.loop, run.data.max_seq_length
    b, acc = lp.micro_batch, lp.grad_accum
    groups: list[tuple[list[dict], str]] = []
    if run.recompute is None:
        groups.append(([{"recompute": True}], "recomputes each decoder layer in backward (~+33% compute)"))
    elif run.recompute.granularity != "full":
        groups.append(([{"recompute_granularity": "full"}], "recomputes whole decoder layers"))
    if run.kernels.attention == "math":
        groups.append(([{"use_flash_attention": True}], "no [b, heads, s, s] scores (on GPU: Ampere+ and fp16/bf16)"))
    if base.parallel.data_ranks > 1 and run.parallel.sharding_stage < 3:
        stages = [{"sharding": f"stage{k}"} for k in range(run.parallel.sharding_stage + 1, 4)]
        groups.append((stages, "shards optimizer state (stage1), + gradients (stage2), + weights (stage3)"))
    if b > 1:
        mbs = [m for m in (b // 2 ** i for i in range(1, b.bit_length())) if m >= 1 and b % m == 0]
        groups.append(([{"per_device_train_batch_size": m, "gradient_accumulation_steps": acc * b // m}
                        for m in mbs], "same global batch, more accumulation steps"))
    if s >= 256:
        seqs = [s // 2 ** i for i in range(1, 5) if s // 2 ** i >= 128]
        groups.append(([{"max_seq_length": x} for x in seqs],
                       "shorter context: changes what the model learns; fewer tokens per step"))
    out = []
    for changes, why in groups:
        got = _first_fitting(changes, replan)
        if got is None:
            continue
        change, r = got
        saves = base.peak_gib - r.peak_gib
        if saves > 1e-6:
            out.append({"change": change, "memory_gib": r.peak_gib, "saves_gib": saves, "fits": r.fits,
                        "why": why})
    out.sort(key=lambda x: -x["saves_gib"])
    if out and not any(x["fits"] for x in out) and len(out) > 1:
        combined = {k: v for x in out if "max_seq_length" not in x["change"] for k, v in x["change"].items()}
        r = replan(combined)  # (not when it is one of the above: the union of a single group is that group)
        if r is not None and len(combined) > 1 and _key(combined) not in {_key(x["change"]) for x in out}:
            out.append({"change": combined, "memory_gib": r.peak_gib,
                        "saves_gib": base.peak_gib - r.peak_gib, "fits": r.fits,
                        "why": "all of the above except a shorter sequence"})
    return out


MAX_DEVICES = 4096

# The order `minimal` tries dropping the keys of a change that fits in: the dearest lever first (recompute costs
# about a third more compute), the sharding stage last (it is then lowered instead). Keys in one tuple go together:
# micro-batch and accumulation keep the global batch only as a pair.
_DROP_ORDER = (("recompute", "recompute_granularity"), ("per_device_train_batch_size", "gradient_accumulation_steps"),
               ("use_flash_attention",))


def _key_groups(change: dict) -> list[tuple]:
    groups = [tuple(k for k in g if k in change) for g in _DROP_ORDER]
    grouped = {k for g in groups for k in g} | {"sharding"}
    groups += [(k,) for k in change if k not in grouped] + [("sharding",) if "sharding" in change else ()]
    return [g for g in groups if g]


def minimal(change: dict, world: int, replan) -> tuple[dict, Plan]:
    """`change` (which fits on `world` devices) without each group of keys it still fits without, then with the
    lowest sharding stage that still fits: a suggestion names no key the fit does not need, so none whose effect is
    nil (a sharding stage over one data rank re-plans to the same memory, and is dropped)."""
    dropped = True
    while dropped:  # until no group can go: then none of the keys left can go alone
        dropped = False
        for group in _key_groups(change):
            fewer = {k: v for k, v in change.items() if k not in group}
            r = replan(fewer, world)
            if r is not None and r.fits:
                change, dropped = fewer, True
                break
    stage = str(change.get("sharding", ""))
    for k in range(1, int(stage[-1]) if stage.startswith("stage") else 1):
        r = replan({**change, "sharding": f"stage{k}"}, world)
        if r is not None and r.fits:
            change = {**change, "sharding": f"stage{k}"}
            break
    return change, replan(change, world)


def device_counts(gpus: int, per_node: int) -> list[int]:
    """The device counts above `gpus` the fewest-devices search tries first, fewest first: powers of two within a
    node, then whole nodes (a power of two of them), since the launcher runs as many processes on every node; the
    counts between the last that does not fit and the first that does are tried after (`more_devices`)."""
    within = [2 ** i for i in range(1, 13) if 2 ** i < per_node]
    nodes = [per_node * 2 ** i for i in range(13)]
    return [w for w in sorted(set(within + nodes)) if gpus < w <= MAX_DEVICES]


def _key(change: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in change.items()))


def more_devices(base: Plan, singles: list[dict], replan, layouts: list[dict] = (), lean=None,
                 budget_gib: float | None = None) -> dict | None:
    """When no setting fits on the devices asked for: the fewest devices at which the run fits within `budget_gib`
    (device memory), re-planned with `replan(change, gpus)`, and the fewest keys it needs there (`minimal`).

    None fits on fewer devices than the model's state needs, every parameter's weights, gradients and AdamW state
    held once over them all (a checkpoint and the weights again: `Plan.checkpoint`), so the search starts there. At
    each of `device_counts` the file as it is, each sharding stage, the single-device savings (recompute, smaller
    micro-batch, …) alone and with stage3, each of `layouts` (the `--fit` search's smallest layout at `--gpus`),
    and `lean(gpus)`'s layouts (`fit.lean_layouts`: every tensor, pipeline, expert degree and sharding stage at its
    least memory). Then each whole number of nodes (within a node, each count) between the last count that did not
    fit and the first that did, fewest first, with the layouts that fit there: one that fits on fewer devices also
    fits on more (its state split over more ranks), not the other way round."""
    # (the axes `config.refusals` refuses with ZeRO-3 are left out of the savings: pipeline, sequence and context
    # parallelism; a layout of `layouts` keeps them, as it was resolved with them)
    extra = {k: v for s in singles for k, v in s["change"].items() if k not in (
        "max_seq_length", "sharding", "pipeline_parallel_degree", "virtual_pp_degree", "sequence_parallel",
        "context_parallel_degree")}
    tries = [{}] + [{"sharding": f"stage{k}"} for k in (1, 2, 3)]
    tries += [extra, {"sharding": "stage3", **extra}] if extra else []
    tries += [dict(x) for x in layouts if x]
    per_node, budget = base.device.links.gpus_per_node, base.device.memory_gib if budget_gib is None else budget_gib
    least = (base.checkpoint.per_checkpoint_gib + base.checkpoint.final_weights_gib) / budget  # (+ the gradients)

    def fitting(changes: list[dict], world: int) -> list[dict]:
        seen, out = set(), []
        for change in list({_key(c): c for c in changes}.values()):  # each once, in order
            r = replan(change, world, layout=False)  # (memory only: no groups of ranks)
            if r is not None and r.fits and (r.parallel, r.micro_batch, r.recompute, r.attention) not in seen:
                seen.add((r.parallel, r.micro_batch, r.recompute, r.attention))
                out.append(change)
        return out

    below, found = base.gpus, []
    for world in device_counts(base.gpus, per_node):
        found = fitting(tries + (lean(world) if lean else []), world) if world >= least else []
        if found:
            break
        below = world
    if not found:
        return None
    for fewer in range(below + 1, world):  # what fits at `world`, on whole nodes fewer
        if fewer >= least and (fewer < per_node or fewer % per_node == 0) and (here := fitting(found, fewer)):
            world, found = fewer, here
            break
    change, r = minimal(min(found, key=len), world, replan)
    nodes = f" ({world // per_node} nodes of {per_node})" if world > per_node else ""
    why = f"fewest devices that fit{nodes}: no setting fits {base.gpus} x {base.device.name}"
    if "sharding" in change and r.parallel.sharding_stage:
        why += f"; {change['sharding']} shards over the {r.parallel.sharding_degree} data ranks of {world}"
    why += "; without any one of these keys it does not fit there" if change else "; the file as written fits there"
    return {"gpus": world, "change": change, "memory_gib": r.peak_gib, "saves_gib": base.peak_gib - r.peak_gib,
            "fits": True, "why": why}
