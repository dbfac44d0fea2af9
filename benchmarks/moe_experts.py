"""One MoE layer's expert compute, forward + backward on CPU: the grouped paths of `ops.grouped` against
transformers' form (a loop over the experts, each scanning all tokens for the ones routed to it).

Why: the experts of a layer must run as one computation over the tokens sorted by expert, not a Python loop of
small matmuls over all tokens. This times, alternated in one run and reported as ratios to the first:
`hf_loop` (transformers' MixtralExperts/Qwen3MoeExperts algorithm on Paddle's ops: per expert `where` over all
assignments, gather, SwiGLU, scale, `index_add`), `segments` (sorted rows, one GEMM per expert over its own
rows), `padded_bmm` (sorted rows scattered into [experts, max_count, hidden], one batched GEMM per
projection) and `cpu_default` (`grouped_mlp_cpu`: the padded path unless padding wastes > 30 %); `gemm_floor`
is only the experts' GEMMs and SwiGLU on pre-sorted rows and pre-packed weights: what a fused kernel could at
best reach. Routing is the same random top-k for all three.

    python benchmarks/moe_experts.py [--tokens 2048] [--hidden 512] [--inter 192] [--experts 64] [--top_k 8]
                                     [--repeats 5] [--skew 0] [--json]

`--skew s` routes the first choice of a fraction s of the tokens to expert 0 (an unbalanced router).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _hf_loop(x, indices, weights, ws, swiglu_packed):
    import paddle

    out = paddle.zeros_like(x)
    flat_tokens = paddle.arange(x.shape[0], dtype="int64").unsqueeze(-1).expand(indices.shape)  # [tokens, k]
    for e, (g, u, d) in enumerate(ws):
        hit = indices == e  # [tokens, k]: every assignment scanned for every expert
        tok = paddle.masked_select(flat_tokens, hit)
        if tok.shape[0] == 0:
            continue
        w = paddle.masked_select(weights, hit).unsqueeze(-1)
        h = swiglu_packed(paddle.matmul(paddle.gather(x, tok), paddle.concat([g, u], axis=1)))
        out = paddle.index_add(out, tok, 0, paddle.matmul(h, d) * w)
    return out


def _gemm_floor(x, indices, weights, ws, swiglu_packed):
    """The floor any fused kernel could reach: only the experts' GEMMs and SwiGLU, on rows already sorted and
    weights already packed (no routing, sort, gather, concat, stack or combine; same row counts)."""
    import paddle

    k = indices.shape[1]
    counts = [int(c) for c in paddle.bincount(indices.reshape([-1]), minlength=len(ws)).numpy()]
    rows = paddle.expand(x, [k, *x.shape]).reshape([-1, x.shape[1]])  # [tokens*k, hidden]: same work
    parts = paddle.split(rows.detach(), counts, axis=0)
    outs = []
    packed = _PACKED.setdefault(id(ws), [(paddle.create_parameter(g.shape[:1] + [2 * g.shape[1]], "float32"), d)
                                         for g, u, d in ws])  # a [hidden, 2*inter] parameter: weight grads too
    for part, (gate_up, down), n in zip(parts, packed, counts):
        if n:
            part.stop_gradient = False
            outs.append(paddle.matmul(swiglu_packed(paddle.matmul(part, gate_up)), down))
    return paddle.add_n([o.sum() for o in outs]) + 0 * x.sum()


_PACKED: dict = {}


def _grouped(fn):
    def run(x, indices, weights, ws, swiglu_packed):
        import paddle

        k = indices.shape[1]
        flat = indices.reshape([-1])
        order = paddle.argsort(flat, stable=True)
        counts = [int(c) for c in paddle.bincount(flat, minlength=len(ws)).numpy()]
        rows = fn(paddle.gather(x, order // k), counts, ws, swiglu_packed)
        w = paddle.gather(weights.reshape([-1]), order).unsqueeze(-1)
        return paddle.index_add(paddle.zeros_like(x), order // k, 0, rows * w)
    return run


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--inter", type=int, default=192)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top_k", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skew", type=float, default=0.0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    from pretrain_cli import runtime

    paddle = runtime.import_paddle()
    from pretrain_cli.ops import kernels
    from pretrain_cli.ops.grouped import grouped_mlp_cpu, grouped_mlp_padded, grouped_mlp_segments

    sel = kernels.select(None, "cpu")
    rng = np.random.default_rng(0)
    ws = [tuple(paddle.create_parameter(s, "float32", default_initializer=paddle.nn.initializer.Normal(0, 0.02))
                for s in ((a.hidden, a.inter), (a.hidden, a.inter), (a.inter, a.hidden))) for _ in range(a.experts)]
    idx = np.stack([rng.permutation(a.experts)[:a.top_k] for _ in range(a.tokens)])
    for t in np.nonzero(rng.random(a.tokens) < a.skew)[0]:
        if 0 not in idx[t]:  # expert 0 becomes one of this token's choices (no duplicates)
            idx[t, 0] = 0
    indices = paddle.to_tensor(idx)
    weights = paddle.to_tensor(rng.random((a.tokens, a.top_k)).astype("float32"))
    x0 = rng.standard_normal((a.tokens, a.hidden)).astype("float32")
    paths = {"hf_loop": _hf_loop, "gemm_floor": _gemm_floor, "segments": _grouped(grouped_mlp_segments),
             "padded_bmm": _grouped(grouped_mlp_padded), "cpu_default": _grouped(grouped_mlp_cpu)}
    times = {n: [] for n in paths}
    ref = None
    for r in range(a.repeats + 1):  # the first round warms up
        for name, fn in paths.items():
            x = paddle.to_tensor(x0, stop_gradient=False)
            t0 = time.perf_counter()
            out = fn(x, indices, weights, ws, sel.swiglu_packed)
            out.sum().backward()
            elapsed = time.perf_counter() - t0
            for w in ws + [p for pair in _PACKED.values() for p in pair]:
                for t in (w if isinstance(w, tuple) else (w,)):
                    t.clear_gradient()
            if r:
                times[name].append(elapsed)
            if name == "gemm_floor":
                continue
            if ref is None:
                ref = out.numpy()
            else:
                assert np.abs(out.numpy() - ref).max() < 1e-4, name
    med = {n: float(np.median(v)) for n, v in times.items()}
    result = {"shape": vars(a), "seconds": med, "speedup_vs_hf_loop": {n: med["hf_loop"] / v for n, v in med.items()}}
    if a.json:
        print(json.dumps(result))
    else:
        for n, v in med.items():
            print(f"{n:>11}: {v * 1e3:8.1f} ms fwd+bwd  ({med['hf_loop'] / v:.2f}x hf_loop)")
    return result


if __name__ == "__main__":
    main()
