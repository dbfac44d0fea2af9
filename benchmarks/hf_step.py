"""The same training step in HF transformers + PyTorch, eager or under `torch.compile`.

Eager is HF as it ships (the config's class, `LlamaForCausalLM` or `Qwen3MoeForCausalLM`; sdpa attention,
`torch.optim.AdamW`, `clip_grad_norm_`).
Compiled is what a performance-minded PyTorch user runs on CPU: the forward + loss compiled as one
graph by inductor (C++ code generation, `fullgraph=True`, backward compiled by AOTAutograd; in the
`max-autotune` mode inductor also benchmarks its own C++ GEMM templates against MKL; the driver times the
default mode and `max-autotune` and compares against the faster, `--hf-compile-mode both`), the fused
C++ AdamW kernel, foreach gradient clipping, and glibc told to keep freed memory (the setting our
runtime applies, `runtime.keep_freed_memory`). Compilation happens in the warm-up steps, never timed.
"""
from __future__ import annotations

import os

from step_timing import SyntheticDataset, batches, matmul_peak_gflops, summary, timed


def worker_torch(cfg: dict, a, compiled: bool = False) -> dict:
    """Time `a.steps` HF steps after `a.warmup` (eager: `a.hf_malloc` decides glibc's setting)."""
    import torch
    import torch.nn.functional as F
    import transformers

    threads = a.threads or (len(os.sched_getaffinity(0)))
    torch.set_num_threads(threads)
    malloc = "keep" if compiled else a.hf_malloc
    if malloc == "keep":  # the same glibc setting our runtime applies
        from pretrain_cli import runtime

        runtime.keep_freed_memory()
    peak = matmul_peak_gflops("torch")
    from pretrain_cli.models import ModelConfig
    from pretrain_cli.models.flops import flops_per_token

    ar, mcfg = cfg["arguments"], ModelConfig.from_dict(cfg["model"])
    seq, bs = ar["max_seq_length"], ar["per_device_train_batch_size"]
    torch.manual_seed(ar.get("seed", 0))
    fields = {k: v for k, v in cfg["model"].items() if k not in ("architectures", "model_type")}
    hf_cfg = transformers.AutoConfig.for_model(cfg["model"].get("model_type", "llama"), **fields)  # Llama, Qwen3-MoE
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=ar["learning_rate"], betas=(ar["adam_beta1"], ar["adam_beta2"]),
                            eps=ar["adam_epsilon"], weight_decay=ar["weight_decay"], fused=compiled or None)
    data = batches(SyntheticDataset(mcfg.vocab_size, seq), bs)

    def forward_loss(ids, labels):
        logits = model(input_ids=ids).logits  # [bs, seq_len, vocab]
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))

    mode = None if a.hf_compile_mode == "default" else a.hf_compile_mode  # max-autotune: inductor's own GEMMs too
    fwd = torch.compile(forward_loss, fullgraph=True, mode=mode) if compiled else forward_loss
    params = list(model.parameters())

    def step() -> float:
        b = next(data)
        loss = fwd(torch.from_numpy(b["input_ids"]), torch.from_numpy(b["labels"]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, ar["max_grad_norm"], foreach=compiled or None)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    losses, times = timed(step, a.warmup, a.steps)
    out = summary(times, bs * seq)
    fpt = flops_per_token(mcfg, seq)
    achieved = out["tokens_per_s"] * fpt / 1e9
    out.update({"framework": "torch_compile" if compiled else "torch", "torch": torch.__version__,
                "transformers": transformers.__version__, "threads": threads,
                "attn_implementation": model.config._attn_implementation, "hf_malloc": malloc,
                "compile_mode": a.hf_compile_mode if compiled else None,
                "flops_per_token": fpt, "achieved_gflops": round(achieved, 1), "matmul_peak_gflops": round(peak, 1),
                "mfu": round(achieved / peak, 4), "losses": [round(x, 6) for x in losses]})
    return out
