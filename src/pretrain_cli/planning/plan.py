"""The plan for one resolved run on a target device: memory, FLOPs, tokens, checkpoint size, time.

It reads the same `RunConfig` that `train` runs (the attention path, recompute granularity,
precision and sharding decided once by `config.resolve`), so the memory it models is the layout
`train` would build. No Paddle, no data, no tokenizer: planning happens before any of them exist.
Suggestions are key changes that the caller re-resolves and re-plans (`suggest(..., replan)`), so
each effect is computed, not guessed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from pretrain_cli.errors import UserError
from pretrain_cli.planning import hardware
from pretrain_cli.planning.memory import GIB, Setup, checkpoint_bytes, estimate
from pretrain_cli.run_config import RunConfig

SAVE_GB_PER_S = 1.0  # assumed: what one rank writes per second to the shared output_dir (plan's save-time line)

MFU_HALF, MFU_FP32 = 0.40, 0.30  # typical well-tuned dense training; override with --mfu


@dataclass(frozen=True)
class Device:
    """The device being planned for: a table entry, or this machine's CPU (`entry` None)."""

    entry: hardware.Device | None
    memory_gib: float

    @property
    def is_gpu(self) -> bool:
        return self.entry is not None

    @property
    def name(self) -> str:
        return self.entry.name if self.entry else "cpu"


def target_device(name: str) -> Device:
    """`--device`: a hardware-table entry (H100 -> H100-SXM), or `cpu` (this machine's memory)."""
    if name.lower() == "cpu":
        return Device(None, hardware.cpu_memory_gib())
    dev = hardware.lookup(name)
    if dev is None:
        raise UserError(f"--device: unknown device {name!r}; use one of "
                        f"{', '.join(d.name for d in hardware.DEVICES.values())} or cpu")
    return Device(dev, float(dev.memory_gib))


def device_note(name: str, dev: Device) -> list[str]:
    """A note when `--device` named a family and the table picked one variant of it (H100 -> H100-SXM)."""
    if dev.entry is None or name.lower() == dev.entry.name.lower():
        return []
    e = dev.entry
    others = [d.name for d in hardware.DEVICES.values() if d.name.split("-")[0] == e.name.split("-")[0] and d != e]
    peak = f"{e.bf16_tflops or e.fp16_tflops:g} TFLOPS half precision" if (e.bf16_tflops or e.fp16_tflops) else ""
    return [f"device: --device {name} is planned as {e.name} ({e.memory_gib:g} GiB{', ' + peak if peak else ''})"
            + (f"; name {' or '.join(others)} for another variant" if others else "")]


def setup_for(run: RunConfig, model_cfg, device: Device, baseline_bytes: float = 0.0) -> Setup:
    """The memory model's view of a resolved run on one device."""
    gpu, prec, p, k = device.is_gpu, run.precision, run.parallel, run.kernels
    return Setup(
        model=model_cfg, micro_batch=run.loop.micro_batch, seq_len=run.data.max_seq_length // p.cp_degree,
        compute_bytes=prec.compute_bytes, amp_level=prec.level if prec.enabled else None,
        master_grad=prec.master_grad, sharding_stage=p.sharding_stage,
        sharding_degree=p.sharding_degree * (p.cp_degree if p.sharding_stage else 1),  # ZeRO-1 under CP: cp x sharding
        tp=p.tp_degree, vocab_parallel=p.vocab_parallel, recompute=run.recompute_granularity, attention=k.attention,
        fused_rms_norm=gpu and k.rms_norm == "fused", fused_rope=gpu and k.rope == "fused",
        device="gpu" if gpu else "cpu", baseline_bytes=baseline_bytes, engine=p.engine,
        document_mask=run.data.document_mask, reset_positions=run.data.reset_position_ids,
        fused_loss=k.fused_loss, pp=p.pp_degree, micro_batches=run.loop.grad_accum, cp=p.cp_degree)


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
           config: str | None = None, peak_tflops: float | None = None) -> dict:
    """The whole plan as a JSON-ready dict (what `plan --json` prints)."""
    from pretrain_cli.models.flops import flops_per_token, paddlenlp_flops_per_token, param_counts

    setup = setup_for(run, model_cfg, device, baseline_bytes)
    s, lp, par, cfg = run.data.max_seq_length, run.loop, run.parallel, model_cfg
    parts = estimate(setup)
    total = sum(parts.values()) / GIB
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
    bubble = (par.pp_degree - 1) / (lp.grad_accum + par.pp_degree - 1)  # 1F1B: each stage idles this share of a step
    eta = None if eta is None else eta / (1 - bubble)
    ck = checkpoint_bytes(setup)
    per_ck = sum(ck.values())
    n_saves = -(-max(lp.max_steps, 0) // lp.save_steps)  # every save_steps, and at the last step
    kept = min(n_saves, lp.save_total_limit) if lp.save_total_limit else n_saves
    return {
        "config": config, "device": {"name": device.name, "memory_gib": device.memory_gib,
                                     "peak_tflops": peak_tflops, "peak_source": peak_source},
        "gpus": par.world_size,
        "model": {"model_type": cfg.model_type, "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
                  "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads, "vocab": cfg.vocab_size},
        "params": param_counts(cfg), "tied": bool(cfg.tie_word_embeddings),
        "flops_per_token": {"model": model_fpt,
                            "hardware": flops_per_token(cfg, s, recompute=setup.recompute, hardware=True),
                            "paddlenlp": paddlenlp_flops_per_token(cfg, s, setup.recompute)},
        "precision": {"amp_dtype": run.precision.amp_dtype or "float32", "amp_level": setup.amp_level},
        "parallel": {"world": par.world_size, "dp": par.dp_degree, "sharding_stage": par.sharding_stage,
                     "sharding_degree": par.sharding_degree, "tp": par.tp_degree, "data_ranks": par.data_world_size,
                     "pp": par.pp_degree, "pipeline_bubble": bubble, "cp": par.cp_degree},
        "micro_batch": lp.micro_batch, "gradient_accumulation_steps": lp.grad_accum,
        "max_seq_length": s, "recompute": setup.recompute, "attention": setup.attention,
        "attention_mask_type": run.data.attention_mask_type,
        "tokens_per_step": run.tokens_per_step, "total_tokens": total_tokens, "max_steps": lp.max_steps,
        "memory_breakdown_gib": {k: v / GIB for k, v in parts.items()},
        "memory_gib": total, "fits": bool(total <= device.memory_gib),
        "checkpoint": {"per_checkpoint_gib": per_ck / GIB, "parts_gib": {k: v / GIB for k, v in ck.items()},
                       "kept": kept, "final_weights_gib": ck["weights"] / GIB,
                       "total_gib": (kept * per_ck + ck["weights"]) / GIB,
                       # every rank writes its own pieces at once, replicas spread over their holders (docs/CHECKPOINTS.md)
                       "per_rank_gib": per_ck / par.world_size / GIB, "disk_gb_per_s_per_rank": SAVE_GB_PER_S,
                       "save_seconds": per_ck / par.world_size / (SAVE_GB_PER_S * 1e9)},
        "mfu": mfu, "eta_hours": eta, "notes": notes, "suggestions": [],
    }


def _first_fitting(changes: list[dict], replan):
    """The first change that fits, else the last one that could be planned (the strongest)."""
    last = None
    for change in changes:
        r = replan(change)
        if r is None:
            continue
        last = (change, r)
        if r["fits"]:
            break
    return last


def suggest(run: RunConfig, base: dict, replan) -> list[dict]:
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
    if base["parallel"]["data_ranks"] > 1 and run.parallel.sharding_stage < 3:
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
        saves = base["memory_gib"] - r["memory_gib"]
        if saves > 1e-6:
            out.append({"change": change, "memory_gib": r["memory_gib"], "saves_gib": saves, "fits": r["fits"],
                        "why": why})
    out.sort(key=lambda x: -x["saves_gib"])
    if out and not any(x["fits"] for x in out) and len(out) > 1:
        combined = {k: v for x in out if "max_seq_length" not in x["change"] for k, v in x["change"].items()}
        r = replan(combined)
        if r is not None and len(combined) > 1:
            out.append({"change": combined, "memory_gib": r["memory_gib"],
                        "saves_gib": base["memory_gib"] - r["memory_gib"], "fits": r["fits"],
                        "why": "all of the above except a shorter sequence"})
    return out


MAX_DEVICES = 4096


def more_devices(base: dict, singles: list[dict], replan) -> dict | None:
    """When no setting fits on the devices asked for: the fewest devices (powers of two) and the lowest
    sharding stage at which the run fits, re-planned with `replan(change, gpus)`; at each size stage3
    is also tried with the single-device savings (recompute, smaller micro-batch) added."""
    extra = {k: v for s in singles for k, v in s["change"].items() if k not in ("max_seq_length", "sharding")}
    world = 2
    while world <= base["gpus"]:
        world *= 2
    while world <= MAX_DEVICES:
        changes = [{"sharding": f"stage{k}"} for k in (1, 2, 3)] + ([{"sharding": "stage3", **extra}] if extra else [])
        for change in changes:
            r = replan(change, world)
            if r is None or not r["fits"]:
                continue
            why = (f"fewest devices that fit: the model's state does not fit {base['gpus']} x {base['device']['name']} "
                   f"at any setting; sharding spreads it over {world}")
            return {"gpus": world, "change": change, "memory_gib": r["memory_gib"],
                    "saves_gib": base["memory_gib"] - r["memory_gib"], "fits": True, "why": why}
        world *= 2
    return None


def _si(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return str(int(n))


def _data_ranks(par: dict) -> str:
    """"8 data ranks (one ZeRO stage-1 group of 8)": the data ranks first, then how they split (PaddleNLP's
    dp x sharding), so "dp 1" never reads as one data rank."""
    n, dp, deg, stage = par["data_ranks"], par["dp"], par["sharding_degree"], par["sharding_stage"]
    if not stage:
        return f"{n} data rank{'s' if n > 1 else ''}"
    groups = f"one ZeRO stage-{stage} group of {deg}" if dp == 1 else f"{dp} replicas of a ZeRO stage-{stage} group of {deg}"
    return f"{n} data ranks ({groups})"


def format_report(r: dict) -> str:
    d, p, par, m = r["device"], r["params"], r["parallel"], r["model"]
    peak_text = f"{d['peak_tflops']:g} TFLOPS" if d["peak_tflops"] else "unknown"
    lines = [f"plan: {r['config'] or 'command line'} on {r['gpus']} x {d['name']} ({d['memory_gib']:.1f} GiB each)"]
    lines += [f"  note: {n}" for n in r["notes"]]
    lines.append(f"model: {m['model_type']}, {m['layers']} layers, hidden {m['hidden']}, heads {m['heads']}/"
                 f"{m['kv_heads']} kv, vocab {m['vocab']}")
    lines.append(f"params: {_si(p['total'])} total = {_si(p['embedding'])} embedding + {_si(p['non_embedding'])} "
                 f"non-embedding{' (tied LM head counted once)' if r['tied'] else ''} [{p['total']:,}]")
    f = r["flops_per_token"]
    hardware_flops = f", {f['hardware']:.4g} hardware (with recompute)" if r["recompute"] else ""
    lines.append(f"FLOPs/token: {f['model']:.4g} model (6N + 12·L·H·d·S, GQA-aware){hardware_flops}, "
                 f"PaddleNLP formula {f['paddlenlp']:.4g}"
                 + ("; document masking does less attention than counted (MFU stays comparable with causal runs)"
                    if r["attention_mask_type"] == "document" else ""))
    lines.append(f"precision {r['precision']['amp_dtype']} {r['precision']['amp_level'] or ''}; world {par['world']} "
                 f"= {_data_ranks(par)} x tp {par['tp']}" + (f" x cp {par['cp']}" if par.get("cp", 1) > 1 else "")
                 + (f" x pp {par['pp']} (the fullest stage below, bubble {par['pipeline_bubble']:.1%})" if par["pp"] > 1
                    else "") + "; "
                 f"recompute {r['recompute'] or 'off'}; attention {r['attention']}, {r['attention_mask_type']} mask")
    lines.append(f"tokens: {r['micro_batch']} x acc {r['gradient_accumulation_steps']} x {par['data_ranks']} data "
                 f"ranks x {r['max_seq_length']} = {r['tokens_per_step']:,} tokens/step; {r['max_steps']} steps = "
                 f"{r['total_tokens']:,} tokens")
    lines.append("memory per device (GiB):")
    for k, v in r["memory_breakdown_gib"].items():
        lines.append(f"  {k:<16} {v:9.2f}")
    verdict = "fits" if r["fits"] else "DOES NOT FIT"
    lines.append(f"  {'total':<16} {r['memory_gib']:9.2f}  of {d['memory_gib']:.1f} -> {verdict}")
    c = r["checkpoint"]
    parts = " + ".join(f"{k} {v:.2f}" for k, v in c["parts_gib"].items() if v)
    lines.append(f"checkpoints: {c['per_checkpoint_gib']:.2f} GiB each ({parts}) x {c['kept']} kept + final weights "
                 f"{c['final_weights_gib']:.2f} = {c['total_gib']:.2f} GiB on disk")
    lines.append(f"  each save: {c['per_rank_gib']:.2f} GiB written by every rank at once, ~{c['save_seconds']:.1f} s at "
                 f"{c['disk_gb_per_s_per_rank']:g} GB/s per rank (an assumed write rate; nothing is gathered)")
    lines.append(f"peak: {peak_text} per device, from {d['peak_source']}" if d["peak_tflops"]
                 else f"peak: unknown ({d['peak_source']})")
    if r["eta_hours"] is not None:
        bubble = f" / (1 - bubble {par['pipeline_bubble']:.3f})" if par["pp"] > 1 else ""
        lines.append(f"ETA: {r['total_tokens'] * f['model']:.3g} FLOPs / ({r['gpus']} x {peak_text} x MFU "
                     f"{r['mfu']:.2f}){bubble} = {r['eta_hours']:.2f} h")
    else:
        lines.append("ETA: unknown: no peak for this device and precision; pass --peak_tflops N (dense TFLOPS per "
                     "device) or set peak_tflops in the argument file")
    if r["suggestions"]:
        lines.append("suggestions (each re-estimated; more devices first when no setting fits on these; then "
                     "ranked by memory saved):")
        for i, sg in enumerate(r["suggestions"], 1):
            change = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sg["change"].items())
            if "gpus" in sg:
                change = f"--gpus {sg['gpus']} with {change}"
            lines.append(f"  {i}. {change}  -> {sg['memory_gib']:.2f} GiB (saves {sg['saves_gib']:.2f})"
                         f"{'  fits' if sg['fits'] else ''}; {sg['why']}")
        lines.append("  --fit searches these together for the fastest layout that fits (same global batch); -o writes it")
    elif not r["fits"]:
        lines.append("suggestions: none of recompute, flash attention, sharding, smaller micro-batch or shorter "
                     "sequence reduces the estimate; use more or larger devices")
    return "\n".join(lines)
