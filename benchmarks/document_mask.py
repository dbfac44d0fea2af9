"""Step time of `attention_mask_type: document` vs `causal` on a corpus of short documents, side by side.

Why: document masking should cost nothing on CPU, and on short documents save time, because the
block-causal kernel skips every key block before a document's start (forward and backward). This times
OUR real training step (`Trainer(training.run.lay_out(...))` → `Trainer.train_step`: model, loss, AdamW, clipping)
on real packed samples (`data.samples.PackedDataset` over a token file whose document lengths are drawn
from an exponential distribution), alternating causal and document steps in one process so both see the
same machine load. It also times the attention kernel alone (forward + backward) and reports how much of
the causal triangle the document mask leaves visible.

    python benchmarks/document_mask.py [--mean_doc 128] [--seq 2048] [--batch 2] [--steps 6] [--warmup 2]
        [--attention flash|math] [--json]

`--attention flash` (default) is the CPU block kernel; `math` the materialising path (`use_flash_attention:
false`), which builds a per-sample mask and does the full s² work either way.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MODEL = {  # a small Qwen3: attention is a large share of the step at long sequences
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 8192, "hidden_size": 256,
    "intermediate_size": 704, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
    "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float32",
}


def write_corpus(prefix: Path, mean_doc: float, n_tokens: int, vocab: int, seed: int = 0) -> list[int]:
    """A token file of documents with exponentially distributed lengths (at least 2 tokens)."""
    from pretrain_cli.data.indexed_writer import IndexedDatasetWriter

    rng = np.random.default_rng(seed)
    sizes, total = [], 0
    while total < n_tokens:
        n = max(2, int(rng.exponential(mean_doc)))
        sizes.append(n)
        total += n
    with IndexedDatasetWriter(str(prefix), np.uint16) as w:
        w.add_documents(rng.integers(3, vocab, total), sizes)
        w.finalize()
    return sizes


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def visible_fraction(doc_start: np.ndarray) -> float:
    """Share of the causal triangle's (query, key) pairs a document mask keeps."""
    pos = np.arange(doc_start.shape[-1])
    return float((pos - doc_start + 1).sum() / ((pos + 1).sum() * doc_start.shape[0]))


def time_kernel(kernels, batch: dict, cfg: dict, reps: int = 5) -> dict:
    """Median fwd+bwd ms of the selected attention, causal and document-masked, on the batch's boundaries."""
    import paddle

    b, s = batch["input_ids"].shape
    h, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    rng = np.random.default_rng(0)
    q, k, v = (paddle.to_tensor(rng.standard_normal((b, s, n, d)).astype("float32"), stop_gradient=False)
               for n in (h, kv, kv))
    start = paddle.to_tensor(batch["doc_start"])
    out = {}
    for name, fn in (("causal", lambda: kernels.attention(q, k, v)),
                     ("document", lambda: kernels.attention_document(q, k, v, start))):
        times = []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            fn().sum().backward()
            q.grad.numpy()
            times.append(time.perf_counter() - t0)
            for t in (q, k, v):
                t.clear_gradient()
        out[name] = round(_median(times[1:]) * 1e3, 2)
    return out


def run(a) -> dict:
    from pretrain_cli import runtime

    paddle = runtime.import_paddle()
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.run_config import Target
    from pretrain_cli.data.indexed import open_token_file
    from pretrain_cli.data.loader import micro_batch
    from pretrain_cli.data.samples import PackedDataset
    from pretrain_cli.distributed.comms.comm import NoComm
    from pretrain_cli.models import ModelConfig
    from pretrain_cli.training.run import build_model, lay_out
    from pretrain_cli.training.trainer import Trainer

    cfg = dict(MODEL, max_position_embeddings=max(MODEL["max_position_embeddings"], a.seq))
    mcfg = ModelConfig.from_dict(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        n_tokens = a.seq * a.batch * (a.steps + a.warmup + 2)
        sizes = write_corpus(Path(tmp) / "short", a.mean_doc, n_tokens, mcfg.vocab_size)
        src = open_token_file(str(Path(tmp) / "short"))
        ds = PackedDataset(src, 0, len(src), a.seq, 1, "train", document_mask=True)
        batches = [micro_batch(ds, k * a.batch, a.batch) for k in range(a.steps + a.warmup)]
    args = ["--do_train", "--device", "cpu", "--output_dir", "unused", "--input_dir", "unused",
            "--max_steps", "1000", "--per_device_train_batch_size", str(a.batch), "--max_seq_length", str(a.seq),
            "--use_flash_attention", str(a.attention == "flash").lower(), "--learning_rate", "1e-4"]
    run_cfg = resolve(parse_config(None, args), mcfg, Target("cpu"))
    trainer = Trainer(lay_out(run_cfg, build_model(run_cfg, mcfg), NoComm()), None, run_cfg, NoComm())
    trainer.model.train()
    causal_only = [{k: b[k] for k in ("input_ids", "labels")} for b in batches]
    times = {"causal": [], "document": []}
    for i in range(a.warmup + a.steps):  # alternate, so both modes see the same background load
        for mode, data in (("causal", causal_only[i]), ("document", batches[i])):
            t0 = time.perf_counter()
            trainer.train_step(iter([data]))
            if i >= a.warmup:
                times[mode].append(time.perf_counter() - t0)
    step = {mode: round(_median(ts) * 1e3, 1) for mode, ts in times.items()}
    tokens = a.batch * a.seq
    return {"seq": a.seq, "batch": a.batch, "mean_doc_tokens": round(float(np.mean(sizes)), 1),
            "attention": trainer.raw_model.kernels.attention_name,
            "attention_document": trainer.raw_model.kernels.attention_document_name,
            "visible_fraction_of_causal": round(np.mean([visible_fraction(b["doc_start"]) for b in batches]), 4),
            "step_ms": step, "tokens_per_s": {m: round(tokens / (v / 1e3), 1) for m, v in step.items()},
            "speedup": round(step["causal"] / step["document"], 3),
            "attention_fwd_bwd_ms": time_kernel(trainer.raw_model.kernels, batches[0], cfg),
            "steps_timed": a.steps, "paddle": paddle.__version__}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mean_doc", type=float, default=128, help="mean document length in tokens (exponential)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6, help="timed steps per mode")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--attention", choices=("flash", "math"), default="flash")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    r = run(a)
    if a.json:
        print(json.dumps(r))
        return 0
    k = r["attention_fwd_bwd_ms"]
    print(f"documents: mean {r['mean_doc_tokens']} tokens; samples {r['batch']} x {r['seq']}; the document mask "
          f"keeps {r['visible_fraction_of_causal']:.1%} of the causal triangle")
    print(f"{'':10} {'step ms':>9} {'tok/s':>8} {'attention fwd+bwd ms':>21}")
    for mode in ("causal", "document"):
        print(f"{mode:10} {r['step_ms'][mode]:>9.1f} {r['tokens_per_s'][mode]:>8.0f} {k[mode]:>21.2f}")
    print(f"document vs causal: {r['speedup']:.2f}x step time ({r['attention']} / {r['attention_document']} "
          f"kernels, median of {r['steps_timed']} alternating steps, paddle {r['paddle']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
