"""The plan for one resolved run on a target device: memory, FLOPs, tokens, checkpoint size, time.

It reads the same `RunConfig` that `train` runs (the attention path, recompute granularity,
precision and sharding decided once by `config.resolve`), so the memory it models is the layout
`train` would build. No Paddle, no data, no tokenizer: planning happens before any of them exist.
The suggestions that lower its memory, each re-planned through `report`, are `planning.suggestions`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pretrain_cli.errors import UserError
from pretrain_cli.models.flops import _cached
from pretrain_cli.models.stages import stage_layers
from pretrain_cli.planning import device_names, hardware, layout
from pretrain_cli.planning.activations import head_loss_bytes
from pretrain_cli.planning.eta import TOO_SMALL
from pretrain_cli.planning.eval_memory import eval_parts
from pretrain_cli.planning.experts import capacity_plan, kept_share
from pretrain_cli.planning.memory import GIB, Setup, checkpoint_bytes, estimate, pipeline_stages, startup_parts
from pretrain_cli.planning.report import (CheckpointPlan, FlopsPerToken, ModelShape, Plan, PlannedDevice,
                                          PlannedLayout, PlannedPrecision)
from pretrain_cli.planning.speed import pipeline_bubble, speed, stage_flops_per_token, stage_traffic, traffic_parts
from pretrain_cli.run_config import RunConfig

SAVE_GB_PER_S = 1.0  # assumed: what one rank writes per second to the shared output_dir (plan's save-time line)

MFU_HALF, MFU_FP32 = 0.40, 0.30  # typical well-tuned dense training; override with --mfu
# a Mixture-of-Experts model on CPU: routing, the dispatch to the experts and their small GEMMs, not the active
# parameters' FLOPs, set its step; measured on configs/qwen3-moe-tiny_cpu.json (docs/PLAN.md: the default MFU)
MFU_MOE_CPU = 0.08
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
    if dev is None:  # another card of a listed model ("H100 NVL"), or a typo ("H10"): `device_names.unknown` tells
        raise UserError(device_names.unknown(name))
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
    if _bare(name) == _bare(dev.entry.name):  # ("A100 80GB", "a100_80gb": the table's name as typed)
        return []
    e = dev.entry
    others = device_names.variants(e)  # (A100 PCIe: the PCIe cards, not the SXM4 entries)
    peak = f"{e.bf16_tflops or e.fp16_tflops:g} TFLOPS half precision" if (e.bf16_tflops or e.fp16_tflops) else ""
    return [f"device: --device {name} is planned as {e.name} ({e.memory_gib:g} GiB{', ' + peak if peak else ''})"
            + (f"; name {' or '.join(others)} for another variant" if others else "")]


def _bare(name: str) -> str:
    """A device name without case, spaces or punctuation: what tells one table entry from another."""
    return "".join(c for c in name.lower() if c.isalnum())


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
        compute_bytes=prec.compute_bytes, amp_level=prec.level if prec.enabled else None, amp_dtype=prec.amp_dtype,
        master_grad=prec.master_grad, sharding_stage=p.sharding_stage,
        sharding_degree=p.sharding_degree * (p.cp_degree if p.sharding_stage else 1),  # ZeRO-1 under CP: cp x sharding
        tp=p.tp_degree, vocab_parallel=p.vocab_parallel, recompute=run.recompute_granularity,
        attention="flash" if k.light_attention("gpu" if gpu else "cpu") else "math",  # the kernel that runs
        fused_rms_norm=gpu and k.rms_norm == "fused", fused_rope=gpu and k.rope == "fused",
        device="gpu" if gpu else "cpu", baseline_bytes=baseline_bytes, dp_buffers=p.traits.dp_buffers,
        distributed_tensors=p.traits.distributed_tensors,
        document_mask=run.data.document_mask, reset_positions=run.data.reset_position_ids,
        fused_loss=k.fused_loss, pp=p.pp_degree, vpp=p.virtual_pp_degree, micro_batches=run.loop.grad_accum,
        cp=p.cp_degree, sp=p.sequence_parallel, ep=p.ep_degree, data_ranks=p.data_world_size,
        capacity_factor=run.moe.capacity_factor)


def peak(run: RunConfig, device: Device, peak_tflops: float | None = None) -> tuple[float | None, str]:
    """(peak TFLOPS per device, where it came from) for the ETA: --peak_tflops, else the file's
    peak_tflops, else the hardware table."""
    if peak_tflops is not None:
        return peak_tflops, "--peak_tflops on the command line"
    given = (run.loop.peak_tflops, "peak_tflops in the argument file") if run.loop.peak_tflops is not None else None
    return hardware.resolve_peak(device.entry, device.name, run.precision.amp_dtype, given, device.sharing)


# A training step runs roughly this many eager ops per decoder layer (forward, backward, optimizer),
# each costing ~10 us of host dispatch and launch however little it computes; and matmuls narrower than
# SMALL_HIDDEN run far below the peak (too little work per tile to fill a GPU; on 2 Xeon cores
# configs/tiny_cpu.json, 64 wide, logged mfu 0.012 against the 0.30 assumed: 5,400 tokens/s, not 135,000).
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
    return [f"{TOO_SMALL} ({'; '.join(why)}), so the ETA and tokens/s are "
            f"far too optimistic; time a few steps instead"]


def default_mfu(run: RunConfig, cfg, device: Device) -> float:
    """The MFU a plan assumes without --mfu: a half-precision run's, an fp32 one's, or on CPU a Mixture-of-Experts
    model's measured one (its dense MFU, 0.30, made the tiny MoE's 200 CPU steps 0.5 min; they take ~2)."""
    if not device.is_gpu and cfg.num_experts > 0:
        return MFU_MOE_CPU
    return MFU_HALF if run.precision.enabled else MFU_FP32


def report(run: RunConfig, model_cfg, device: Device, mfu: float | None = None, baseline_bytes: float = 0.0,
           config: str | None = None, peak_tflops: float | None = None, groups: dict | None = None,
           shown: bool = True, timed: bool = False) -> Plan:
    """The whole plan (`Plan.to_json` is what `plan --json` prints). `timed`: the user gave the mfu `train` logged
    (`--measured_mfu`), so the too-small note, which warns that the FLOPs model's time is too short, has no
    assumed MFU to qualify and is not said. `groups` ({"tp" | "pp" | "data": the groups
    of ranks along each axis}, from the run's rank rule) explains how the ranks fall onto nodes (`layout`).
    `shown` False: a candidate layout of a search, never printed, without the multi-token prediction modules' share
    (`mtp_share`, which plans the model again without them: a third of a DeepSeek-V3 candidate's time)."""
    from pretrain_cli.models.flops import flops_per_token, paddlenlp_flops_per_token, param_counts

    setup = setup_for(run, model_cfg, device, baseline_bytes)
    s, lp, par, cfg = run.data.max_seq_length, run.loop, run.parallel, model_cfg
    by_stage = pipeline_stages(setup) if setup.pp > 1 else [estimate(setup)]
    parts = max(by_stage, key=lambda p: sum(p.values()))  # (`estimate`'s pick: the fullest stage)
    evaluates = lp.do_eval or lp.do_predict
    evaluation = eval_parts(setup, lp.eval_batch, by_stage) if evaluates else {}
    total = sum(parts.values()) / GIB
    start = startup_parts(setup)
    startup = sum(start.values()) / GIB
    model_fpt = flops_per_token(cfg, s)
    total_tokens = run.tokens_per_step * max(lp.max_steps, 0)
    peak_tflops, peak_source = peak(run, device, peak_tflops)
    mfu_given = mfu is not None
    if mfu is None:
        mfu = default_mfu(run, cfg, device)
    tokens = lp.micro_batch * lp.grad_accum * setup.seq_len / par.tp_degree  # one device's share of its stage's
    notes = list(run.notes)
    measured = not (device.is_gpu or mfu_given) and cfg.num_experts > 0  # MFU_MOE_CPU: timed on a model this small
    if peak_tflops is not None and not measured and not timed:
        notes += too_small_note(cfg, lp.micro_batch * s * flops_per_token(cfg, s, recompute=setup.recompute,
                                                                          hardware=True) / par.tp_degree,
                                peak_tflops * 1e12 * mfu)
    bubble = pipeline_bubble(par.pp_degree, lp.grad_accum, par.virtual_pp_degree)
    stage_fpt = stage_flops_per_token(setup)
    hardware_fpt = flops_per_token(cfg, s, recompute=setup.recompute, hardware=True)
    if kept_share(setup) < 1:  # what a capacity below the balanced share leaves the experts computing (the stages')
        hardware_fpt = sum(stage_fpt)
    stages = tuple({"layers": len(layers), "sparse_layers": len(set(layers) & set(cfg.sparse_layers)),
                    "tflops_per_step": f * tokens / 1e12, "traffic_gb_per_step": {k: v / 1e9 for k, v in t.items()}}
                   for layers, f, t in zip(stage_layers(cfg.num_hidden_layers, par.pp_degree, par.virtual_pp_degree),
                                           stage_fpt, stage_traffic(setup, par, param_counts(cfg))))
    r = Plan(
        config=config, device=PlannedDevice(device.name, device.memory_gib, peak_tflops, peak_source,
                                                  device.links),
        gpus=par.world_size,
        model=ModelShape(cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
                         cfg.num_key_value_heads, cfg.vocab_size, cfg.num_experts,
                         cfg.num_experts_per_tok),
        params=param_counts(cfg), tied=bool(cfg.tie_word_embeddings),
        flops_per_token=FlopsPerToken(model_fpt, hardware_fpt,
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
        checkpoint=checkpoint_plan(run, cfg),
        mfu=mfu, mfu_given=mfu_given, eta_hours=None, notes=tuple(notes),
        layout=layout.explain(par, groups, device.node.gpus) if groups else None,
        mtp=mtp_share(setup, s, parts, model_fpt) if shown else {}, stages=stages,
        capacity=capacity_plan(setup, s),
        eval_batch=lp.eval_batch if evaluates else 0,
        eval_breakdown_gib={k: v / GIB for k, v in evaluation.items()},
        eval_memory_gib=sum(evaluation.values()) / GIB if evaluates else None,
        eval_least_gib=sum(eval_parts(setup, 1, by_stage).values()) / GIB if evaluates else None,
    )
    sp = speed(r)  # the speed `plan --fit` ranks by and times a layout with: one estimate per layout
    slowest, steps = sp["slowest_stage"], max(lp.max_steps, 0)  # the device whose traffic the report shows
    eta = traffic = logged = None
    if peak_tflops is not None and r.fits:  # a layout that does not fit cannot start: no time (`planning.eta`)
        eta, traffic = steps * sp["step_seconds"] / 3600, steps * sp["comm_seconds"] / 3600
        # the step as `train` logs mfu: a step's model FLOPs (no recompute) over the devices' peak for its time
        logged = run.tokens_per_step * model_fpt / (par.world_size * peak_tflops * 1e12 * sp["step_seconds"])
    return dataclasses.replace(r, traffic_gb_per_step=stages[slowest]["traffic_gb_per_step"], slowest_stage=slowest,
                               eta_hours=eta, eta_traffic_hours=traffic, logged_mfu=logged,
                               eta_traffic=traffic_parts(r, sp, steps) if eta is not None else {})


def checkpoint_plan(run: RunConfig, model_cfg) -> CheckpointPlan:
    """What `run` keeps in output_dir: one checkpoint-N (`checkpoint_bytes`) x the saves `save_total_limit` keeps,
    the final weights, and each rank's share and time to write. It depends on the model, precision and loop, not
    on the device planned, so `check` has it without a whole `report`."""
    lp = run.loop
    ck = checkpoint_bytes(_setup(run, model_cfg, False, 0.0))  # (the device changes no term of it)
    per_ck, world = sum(ck.values()), run.parallel.world_size
    final = export_bytes(model_cfg, run.output.export_dtype)
    n_saves = -(-max(lp.max_steps, 0) // lp.save_steps)  # every save_steps, and at the last step
    kept = min(n_saves, lp.save_total_limit) if lp.save_total_limit else n_saves
    # every rank writes its own pieces at once, replicas spread over their holders (docs/CHECKPOINTS.md)
    return CheckpointPlan(per_ck / GIB, {k: v / GIB for k, v in ck.items()}, kept, final / GIB,
                          (kept * per_ck + final) / GIB, per_ck / world / GIB, SAVE_GB_PER_S,
                          per_ck / world / (SAVE_GB_PER_S * 1e9))


def export_bytes(cfg, dtype: str) -> float:
    """The final export's bytes: every parameter trained (the multi-token prediction modules' too) in the resolved
    `export_dtype` (`auto`: a bf16/fp16 run's half dtype), but the tensors transformers keeps fp32 in every dtype
    (`Family.hf_fp32`, `models.convert.export_dtype`: the routers' weight, DeepSeek's correction bias too). Counted
    in fp32 whatever the run before: 113.74 GiB for bf16 Qwen3-30B-A3B, whose export is 56.87."""
    from pretrain_cli.models.families import FAMILIES
    from pretrain_cli.models.flops import param_counts

    counts = param_counts(cfg)
    n = counts["total"] + counts["mtp"]
    kept = FAMILIES[cfg.model_type].hf_fp32
    layers = [i for i in range(cfg.num_hidden_layers + (cfg.num_nextn_predict_layers or 0)) if cfg.is_sparse_layer(i)]
    router = cfg.num_experts * (cfg.hidden_size * any(k.endswith("gate.weight") for k in kept)
                                + any(k.endswith("correction_bias") for k in kept)) if cfg.num_experts > 0 else 0
    fp32 = len(layers) * router
    return (n - fp32) * {"bfloat16": 2, "float16": 2}.get(dtype, 4) + 4 * fp32


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
