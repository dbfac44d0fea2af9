"""`pretrain-cli plan`: memory, FLOPs, tokens, checkpoint size and time for an argument file.

Reads the same file `train` reads and resolves it the same way, but for a *target* device
(`--device`, `--gpus`) rather than this machine, so GPU precision (fp16/bf16, O1/O2) and
sharding apply even when planning on a laptop. It never imports Paddle and never opens the
data or the tokenizer: planning happens before data preparation. Every suggestion is a JSON
key change that was re-run through the same estimator, so its effect is computed, not guessed.
"""
from __future__ import annotations

import argparse
import json

from pretrain_cli import hardware
from pretrain_cli.errors import UserError
from pretrain_cli.memory_model import GIB, Setup, checkpoint_bytes, estimate

DEFAULT_DEVICE = "A100-80GB"
MFU_HALF, MFU_FP32 = 0.40, 0.30  # typical well-tuned dense training; override with --mfu


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=DEFAULT_DEVICE,
                        help=f"target accelerator, e.g. A100-80GB, H100, V100-16GB, or cpu (default {DEFAULT_DEVICE}; "
                             f"known: {', '.join(d.name for d in hardware.DEVICES.values())})")
    parser.add_argument("--gpus", type=int, default=1, help="devices (processes) in the run (default 1)")
    parser.add_argument("--mfu", type=float, default=None,
                        help=f"assumed model-FLOPs utilisation for the ETA (default {MFU_HALF} with fp16/bf16, "
                             f"{MFU_FP32} in fp32)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")


def _target(name: str):
    """(hardware.Device or None for cpu, memory GiB, is_gpu)."""
    if name.lower() == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
            mem = kib / 2**20
        except (OSError, StopIteration, ValueError):
            mem = float("nan")
        return None, mem, False
    dev = hardware.lookup(name)
    if dev is None:
        raise UserError(f"--device: unknown device {name!r}; use one of "
                        f"{', '.join(d.name for d in hardware.DEVICES.values())} or cpu")
    return dev, float(dev.memory_gib), True


def _fmt(v) -> str:
    return "true" if v is True else "false" if v is False else str(v)


def _load(config, overrides, gpus: int, is_gpu: bool):
    """Arguments → (args, resolved, parallel, model_cfg, notes) with the trainer's own rules.

    Tensor parallelism is taken out before `resolve` (which rejects it, as `train` does today)
    and put back into the degrees so the estimate shows what it would buy.
    """
    from pretrain_cli.arg_parser import parse_config
    from pretrain_cli.config import derive_parallel
    from pretrain_cli.resolve import resolve
    from pretrain_cli.train import build_model_config

    if config is not None and not config.endswith(".json"):
        raise UserError(f"{config}: the argument file must be a .json file")
    if gpus < 1:
        raise UserError(f"--gpus: must be >= 1, got {gpus}")
    args = parse_config(config, overrides)
    notes = []
    want = "gpu" if is_gpu else "cpu"
    if args.training.device != want:
        notes.append(f"device: the file says {args.training.device!r}; planning for {want} as --device asks")
        args.training.device = want
    t = args.training
    if max(t.pipeline_parallel_degree, 1) > 1 and gpus > 1:
        raise UserError("pipeline_parallel_degree: plan does not model pipeline parallelism (train does not "
                        "support it either); set it to 1")
    tp = max(t.tensor_parallel_degree, 1) if gpus > 1 else 1
    if tp > 1:
        t.tensor_parallel_degree = -1
        notes.append(f"tensor_parallel_degree: {tp} is not supported by train yet; plan models Megatron-style TP "
                     f"(weights, optimizer, projections and logits split {tp} ways; norms and residuals whole, "
                     f"no sequence parallel)")
    resolved = resolve(args, world_size=gpus, gpu_available=is_gpu)
    resolved.tp_degree = tp
    parallel = derive_parallel(resolved, t, supported_only=False)
    if parallel.sharding_degree > 1 and parallel.sharding_stage in (2, 3):
        notes.append(f"sharding: stage{parallel.sharding_stage} is modelled here, but `train` supports only stage1 "
                     f"so far")
    _, cfg = build_model_config(args)
    return args, resolved, parallel, cfg, notes + list(resolved.notes)


def build_setup(args, resolved, parallel, cfg, dev, is_gpu: bool, notes: list) -> Setup:
    t = args.training
    half = resolved.amp_dtype is not None
    flash = t.use_flash_attention and is_gpu
    if flash and not half:
        notes.append("use_flash_attention: flash attention needs fp16/bf16; the estimate uses the math path")
        flash = False
    if flash and dev is not None and dev.bf16_tflops is None:
        notes.append(f"use_flash_attention: {dev.name} predates Ampere (no flash-attn-2); estimated with the "
                     f"math path")
        flash = False
    return Setup(
        model=cfg, micro_batch=t.per_device_train_batch_size, seq_len=args.data.max_seq_length,
        compute_bytes=2 if half else 4, amp_level=resolved.amp_level if half else None,
        master_grad=bool(t.amp_master_grad and half), sharding_stage=parallel.sharding_stage,
        sharding_degree=parallel.sharding_degree, tp=parallel.tp_degree,
        recompute=t.recompute_granularity if t.recompute else None,
        attention="flash" if flash else "math", fused_rms_norm=bool(t.use_fused_rms_norm and is_gpu),
        fused_rope=bool(t.use_fused_rope and is_gpu), device="gpu" if is_gpu else "cpu",
    )


def _peak(args, resolved, dev):
    if args.training.peak_tflops is not None:
        return args.training.peak_tflops, "peak_tflops in the argument file"
    if dev is None:
        return None, "none: cpu has no table entry; set peak_tflops (measure a matmul) for an ETA"
    peak = hardware.peak_tflops(dev, resolved.amp_dtype)
    kind = {"float16": "fp16", "bfloat16": "bf16"}.get(resolved.amp_dtype, "fp32 (non-tensor-core)")
    if peak is None:
        return None, f"none: {dev.name} has no {kind} peak in pretrain_cli.hardware"
    return peak, f"pretrain_cli.hardware table {hardware.TABLE_VERSION}: {dev.name} dense {kind}"


def plan(config: str | None, overrides: list[str] | None = None, device: str = DEFAULT_DEVICE, gpus: int = 1,
         mfu: float | None = None, suggest: bool = True, baseline_bytes: float = 0.0) -> dict:
    """The whole report as a JSON-ready dict (what `--json` prints)."""
    from pretrain_cli.models.flops import flops_per_token, paddlenlp_flops_per_token, param_counts

    overrides = list(overrides or [])
    dev, mem_gib, is_gpu = _target(device)
    args, resolved, parallel, cfg, notes = _load(config, overrides, gpus, is_gpu)
    setup = build_setup(args, resolved, parallel, cfg, dev, is_gpu, notes).with_(baseline_bytes=baseline_bytes)
    t, s = args.training, args.data.max_seq_length
    parts = estimate(setup)
    total = sum(parts.values()) / GIB
    counts = param_counts(cfg)
    model_fpt = flops_per_token(cfg, s)
    hw_fpt = flops_per_token(cfg, s, recompute=setup.recompute, hardware=True)
    tokens_step = t.per_device_train_batch_size * t.gradient_accumulation_steps * parallel.data_world_size * s
    total_tokens = tokens_step * max(t.max_steps, 0)
    peak, peak_source = _peak(args, resolved, dev)
    if mfu is None:
        mfu = MFU_HALF if resolved.amp_dtype else MFU_FP32
    if not 0 < mfu <= 1:
        raise UserError(f"--mfu: must be in (0, 1], got {mfu}")
    eta = None if peak is None else total_tokens * model_fpt / (gpus * peak * 1e12 * mfu) / 3600
    ck = checkpoint_bytes(setup)
    per_ck = sum(ck.values())
    n_saves = max(t.max_steps, 0) // t.save_steps
    kept = min(n_saves, t.save_total_limit) if t.save_total_limit else n_saves
    report = {
        "config": config, "device": {"name": dev.name if dev else "cpu", "memory_gib": mem_gib,
                                     "peak_tflops": peak, "peak_source": peak_source},
        "gpus": gpus,
        "model": {"model_type": cfg.model_type, "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
                  "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads, "vocab": cfg.vocab_size},
        "params": counts, "tied": bool(cfg.tie_word_embeddings),
        "flops_per_token": {"model": model_fpt, "hardware": hw_fpt,
                            "paddlenlp": paddlenlp_flops_per_token(cfg, s, setup.recompute)},
        "precision": {"amp_dtype": resolved.amp_dtype or "float32", "amp_level": setup.amp_level},
        "parallel": {"world": parallel.world_size, "dp": parallel.dp_degree, "sharding_stage": parallel.sharding_stage,
                     "sharding_degree": parallel.sharding_degree, "tp": parallel.tp_degree,
                     "data_ranks": parallel.data_world_size},
        "micro_batch": t.per_device_train_batch_size, "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "max_seq_length": s, "recompute": setup.recompute, "attention": setup.attention,
        "tokens_per_step": tokens_step, "total_tokens": total_tokens, "max_steps": t.max_steps,
        "memory_breakdown_gib": {k: v / GIB for k, v in parts.items()},
        "memory_gib": total, "fits": bool(total <= mem_gib),
        "checkpoint": {"per_checkpoint_gib": per_ck / GIB, "parts_gib": {k: v / GIB for k, v in ck.items()},
                       "kept": kept, "final_weights_gib": ck["weights"] / GIB,
                       "total_gib": (kept * per_ck + ck["weights"]) / GIB},
        "mfu": mfu, "eta_hours": eta, "notes": notes, "suggestions": [],
    }
    if suggest and not report["fits"]:
        report["suggestions"] = _suggestions(config, overrides, device, gpus, mfu, args, setup, report,
                                             baseline_bytes)
    return report


def _try(config, overrides, device, gpus, mfu, change: dict, baseline: float) -> dict | None:
    extra = [tok for k, v in change.items() for tok in (f"--{k}", _fmt(v))]
    try:
        return plan(config, overrides + extra, device, gpus, mfu, suggest=False, baseline_bytes=baseline)
    except UserError:
        return None


def _first_fitting(config, overrides, device, gpus, mfu, changes: list[dict], baseline: float):
    """The first change in `changes` that fits, else the last one that ran (the strongest)."""
    last = None
    for change in changes:
        r = _try(config, overrides, device, gpus, mfu, change, baseline)
        if r is None:
            continue
        last = (change, r)
        if r["fits"]:
            break
    return last


def _suggestions(config, overrides, device, gpus, mfu, args, setup: Setup, base: dict, baseline: float) -> list:
    t = args.training
    b, acc, s = t.per_device_train_batch_size, t.gradient_accumulation_steps, args.data.max_seq_length
    groups: list[tuple[list[dict], str]] = []
    if not t.recompute:
        groups.append(([{"recompute": True}], "recomputes each decoder layer in backward (~+33% compute)"))
    elif t.recompute_granularity != "full":
        groups.append(([{"recompute_granularity": "full"}], "recomputes whole decoder layers"))
    if setup.device == "gpu" and setup.attention == "math" and not t.use_flash_attention:
        groups.append(([{"use_flash_attention": True}], "no [b, heads, s, s] scores (needs Ampere+ and fp16/bf16)"))
    if base["parallel"]["data_ranks"] > 1 and setup.sharding_stage < 3:
        stages = [{"sharding": f"stage{k}"} for k in range(setup.sharding_stage + 1, 4)]
        groups.append((stages, "shards optimizer state (stage1), + gradients (stage2), + weights (stage3); "
                               "train supports stage1 so far"))
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
        got = _first_fitting(config, overrides, device, gpus, mfu, changes, baseline)
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
        r = _try(config, overrides, device, gpus, mfu, combined, baseline)
        if r is not None and len(combined) > 1:
            out.append({"change": combined, "memory_gib": r["memory_gib"],
                        "saves_gib": base["memory_gib"] - r["memory_gib"], "fits": r["fits"],
                        "why": "all of the above except a shorter sequence"})
    return out


def _si(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return str(int(n))


def format_report(r: dict) -> str:
    d, p, par, m = r["device"], r["params"], r["parallel"], r["model"]
    peak = f"{d['peak_tflops']:g} TFLOPS" if d["peak_tflops"] else "no peak"
    lines = [f"plan: {r['config'] or 'command line'} on {r['gpus']} x {d['name']} ({d['memory_gib']:.1f} GiB each)"]
    lines += [f"  note: {n}" for n in r["notes"]]
    lines.append(f"model: {m['model_type']}, {m['layers']} layers, hidden {m['hidden']}, heads {m['heads']}/"
                 f"{m['kv_heads']} kv, vocab {m['vocab']}")
    lines.append(f"params: {_si(p['total'])} total = {_si(p['embedding'])} embedding + {_si(p['non_embedding'])} "
                 f"non-embedding"
                 f"{' (tied LM head counted once)' if r['tied'] else ''} [{p['total']:,}]")
    f = r["flops_per_token"]
    lines.append(f"FLOPs/token: {f['model']:.4g} model (6N + 12·L·H·d·S, GQA-aware), {f['hardware']:.4g} hardware "
                 f"(with recompute), PaddleNLP formula {f['paddlenlp']:.4g}")
    lines.append(f"precision {r['precision']['amp_dtype']} {r['precision']['amp_level'] or ''}; world {par['world']} "
                 f"(dp {par['dp']}, sharding stage {par['sharding_stage']} x{par['sharding_degree']}, tp {par['tp']}); "
                 f"recompute {r['recompute'] or 'off'}; attention {r['attention']}")
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
    lines.append(f"peak: {peak} per device, from {d['peak_source']}")
    if r["eta_hours"] is not None:
        lines.append(f"ETA: {r['total_tokens'] * f['model']:.3g} FLOPs / ({r['gpus']} x {peak} x MFU {r['mfu']:.2f}) "
                     f"= {r['eta_hours']:.2f} h")
    else:
        lines.append("ETA: unknown (no peak; set peak_tflops)")
    if r["suggestions"]:
        lines.append("suggestions (each re-estimated; ranked by memory saved):")
        for i, sg in enumerate(r["suggestions"], 1):
            change = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sg["change"].items())
            lines.append(f"  {i}. {change}  -> {sg['memory_gib']:.2f} GiB (saves {sg['saves_gib']:.2f})"
                         f"{'  fits' if sg['fits'] else ''}; {sg['why']}")
    elif not r["fits"]:
        lines.append("suggestions: none of recompute, flash attention, sharding, smaller micro-batch or shorter "
                     "sequence reduces the estimate; use more or larger devices")
    return "\n".join(lines)


def main(ns: argparse.Namespace) -> int:
    report = plan(ns.config, ns.overrides, ns.device, ns.gpus, ns.mfu)
    if ns.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
    return 0
