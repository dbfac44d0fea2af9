"""The GPU-only Paddle calls, emulated on CPU with the real kernels' semantics (not the project's assumptions).

Each stand-in is written from Paddle 3.3.1's own source, cited beside the rule it reproduces, so a test through
it fails where the GPU would (docs/PERFORMANCE.md, "GPU-only call sites", lists every call and its test):

- `ref_flash_attn`: `paddle._C_ops.flash_attn` (Paddle's flash-attention fork, csrc/flash_attn/src/flash_fwd_kernel.h:
  causal `n_block_max = min(…, ceil_div((m_block + 1) * kBlockM, kBlockN))` and the row-index mask, no
  `seqlen_k − seqlen_q` offset: a non-square causal mask is aligned TOP-LEFT, query i sees keys 0..i); fp16/bf16
  only (the GPU kernel is registered for those two);
- `amp_cast`: the dtype an op's inputs get under `paddle.amp.auto_cast` (paddle/amp/amp_lists.py 3.3.1: the white
  list runs in the half dtype, the black list in fp32 (O1: FP16_BLACK_LIST | EXTRA_BLACK_LIST, O2: EXTRA_BLACK_LIST
  only); "gray" ops run in fp32 when any floating input is fp32 (type promotion: eager `GetAmpDestDtype` with
  `use_promote`, auto_cast's default, at O1 and O2 alike), else in the half dtype); `fake_auto_cast` stands for
  `paddle.amp.auto_cast` itself (on: these rules, `enable=False`: none, as on a GPU) and `ref_matmul` for a
  white-listed `paddle.matmul` under it;
- `sdpa_backend`: which path `F.scaled_dot_product_attention` takes (paddle/nn/functional/sdpa.py 3.3.1,
  `select_sdp_for_sdpa`): flash only for q, k, v of one half dtype, head_dim a multiple of 8 and ≤ 256, no scale,
  and causal only with equal lengths (`check_flash_causal_non_square_seqlens`); memory-efficient for one dtype
  whose head widths are multiples of `minimum_gemm_alignment` (8 for fp16/bf16); else the math path, which
  materialises `[b, h, s, s]`;
- `enabled_scaler`: `paddle.amp.GradScaler` enabled on CPU (its constructor disables itself off CUDA/XPU/custom
  places, paddle/amp/grad_scaler.py 3.3.1), everything else the real class: `unscale_`, `step` (which calls
  `optimizer.step()` once, after handing `found_inf` to the optimizer), `update`;
- `as_gpu_device`: `paddle.get_device()` a GPU, the expected place a CPU place standing in for it (the code's GPU
  branches run); `gpu_experts`: the routed experts' GPU path, Paddle's GPU-only `batched_gemm` behind
  `RefBatchedGemm` (its contract: segments, flags, fp32/bf16, no backward, a gray op under the emulated auto_cast)
  and autocast's queries answered from `Amp`; `ref_swiglu`: the packed SwiGLU in a half dtype the CPU lacks;
- `HybridOptimizerStandIn`: fleet's `HybridParallelOptimizer` with its real `step`/`_hybrid_sync_grad`/`_step`
  (paddle/distributed/fleet/meta_optimizers/dygraph_optimizer/hybrid_parallel_optimizer.py 3.3.1) over a
  one-process sharding stand-in that counts `reduce_gradients` calls (each one is a reduce of every gradient to
  its owner on a real sharding group).
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

HALF = (paddle.float16, paddle.bfloat16)
AMP_WHITE = {"matmul", "matmul_v2", "linear_v2", "einsum", "fused_rotary_position_embedding", "flash_attn",
             "fused_gemm_epilogue", "mul", "conv2d", "max_pool2d_with_index"}  # amp_lists.WHITE_LIST
AMP_BLACK_O1 = {"exp", "log", "rsqrt", "pow", "square", "reduce_sum", "mean", "reduce_mean", "softmax",
                "log_softmax", "layer_norm", "cross_entropy", "cross_entropy2", "softmax_with_cross_entropy",
                "c_softmax_with_cross_entropy", "lookup_table_v2"}  # a subset of FP16_BLACK_LIST | EXTRA_BLACK_LIST
AMP_BLACK_O2 = {"lookup_table_v2", "lookup_table", "scatter"}  # a subset of EXTRA_BLACK_LIST, O2's whole black list


def check_amp_lists():
    """The lists above are Paddle's own (a rename or move in a Paddle release fails this, not a GPU run)."""
    from paddle.amp import amp_lists

    assert AMP_WHITE <= amp_lists.WHITE_LIST, AMP_WHITE - amp_lists.WHITE_LIST
    assert AMP_BLACK_O1 <= amp_lists.black_list()["bfloat16"]["O1"], AMP_BLACK_O1 - amp_lists.black_list()["bfloat16"]["O1"]
    assert AMP_BLACK_O2 <= amp_lists.black_list()["bfloat16"]["O2"], AMP_BLACK_O2 - amp_lists.black_list()["bfloat16"]["O2"]
    assert not AMP_WHITE & amp_lists.black_list()["bfloat16"]["O2"]
    for op in ("flashmask_attention", "rms_norm", "fused_rms_norm", "scaled_dot_product_attention"):
        assert op not in amp_lists.WHITE_LIST and op not in amp_lists.black_list()["bfloat16"]["O1"], op


class Amp:
    """The active emulated `auto_cast` (None: off), set by tests; read by the stand-ins below."""

    level: str | None = None
    dtype = paddle.bfloat16


def amp_cast(op: str, *tensors):
    """`tensors` as `op` receives them under the emulated auto_cast (None entries pass through)."""
    if Amp.level is None:
        return tensors
    floats = [t for t in tensors if t is not None and t.dtype in (paddle.float32, *HALF)]
    if op in AMP_WHITE:
        dst = Amp.dtype
    elif op in (AMP_BLACK_O1 if Amp.level == "O1" else AMP_BLACK_O2):
        dst = paddle.float32
    else:  # gray: promoted to fp32 when any floating input is fp32 (O1 and O2: `use_promote`)
        dst = paddle.float32 if any(t.dtype == paddle.float32 for t in floats) else Amp.dtype
    return tuple(t.astype(dst) if t is not None and t.dtype != dst and t.dtype in (paddle.float32, *HALF) else t
                 for t in tensors)


@contextlib.contextmanager
def fake_auto_cast(enable=True, custom_white_list=None, custom_black_list=None, level="O1", dtype="float16",
                   use_promote=True):
    """`paddle.amp.auto_cast` as on a GPU, for the stand-ins: inside, `Amp` holds the level and dtype (`enable=False`:
    no autocast, also nested inside an enabled one, as amp_guard restores the outer state on exit). On CPU the
    real one is a no-op (ARCHITECTURE.md facts: AMP)."""
    saved = Amp.level, Amp.dtype
    Amp.level = level if enable else None
    if enable:
        Amp.dtype = paddle.bfloat16 if dtype == "bfloat16" else paddle.float16
    try:
        yield
    finally:
        Amp.level, Amp.dtype = saved


MATMULS: list = []  # the dtype each `ref_matmul` call computed in


def ref_matmul(x, y, transpose_x=False, transpose_y=False, name=None, _real=paddle.matmul, _held=True):
    """`paddle.matmul` (white list) under the emulated auto_cast: its inputs cast to the half dtype, the product's
    values those of the GPU's half GEMM (fp32 accumulation, the output rounded to half). Records the dtype it
    computed in; the result is held fp32, so the fp32-only CPU ops after it run (the GPU would hold it half;
    `ref_matmul_typed` returns it half, for code that casts it before anything the CPU lacks)."""
    x, y = amp_cast("matmul", x, y)
    assert x.dtype == y.dtype, f"a GEMM of mixed dtypes {x.dtype}, {y.dtype}"
    MATMULS.append(x.dtype)
    out = _real(x.astype("float32"), y.astype("float32"), transpose_x, transpose_y).astype(x.dtype)
    return out.astype("float32") if _held else out


def ref_matmul_typed(x, y, transpose_x=False, transpose_y=False, name=None):
    """`ref_matmul` returning the GPU's dtype."""
    return ref_matmul(x, y, transpose_x, transpose_y, _held=False)


def half_only(op: str, *tensors):
    """The GPU kernel's dtype registration: fp16/bf16, one dtype for all of q, k, v."""
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1 or not dtypes <= set(HALF):
        raise ValueError(f"{op}: the GPU kernel is registered for float16/bfloat16 only, q/k/v of one dtype; "
                         f"got {sorted(str(d) for d in dtypes)}")


def ref_flash_attn(query, key, value, fixed_seed_offset, attn_mask, dropout, causal, return_softmax, is_test,
                   rng_name):
    """`paddle._C_ops.flash_attn`: q `[b, sq, heads, d]`, k/v `[b, sk, kv_heads, d]` fp16/bf16 → (out like q, None,
    softmax_lse fp32 `[b, heads, sq rounded up to 128]`, None); `causal` aligned top-left (query i sees keys ≤ i,
    whatever sk − sq), GQA by repeating K/V heads."""
    query, key, value = amp_cast("flash_attn", query, key, value)
    half_only("flash_attn", query, key, value)
    assert attn_mask is None and dropout == 0.0
    q, k, v = (t.astype("float32").transpose([0, 2, 1, 3]) for t in (query, key, value))  # [b, heads, s, d]
    rep = q.shape[1] // k.shape[1]
    k, v = paddle.repeat_interleave(k, rep, axis=1), paddle.repeat_interleave(v, rep, axis=1)
    s = paddle.matmul(q, k, transpose_y=True) / math.sqrt(q.shape[-1])  # [b, heads, sq, sk]
    sq, sk = s.shape[2], s.shape[3]
    if causal:  # flash_fwd_kernel.h: the mask by row index, no seqlen_k - seqlen_q offset
        s = s + paddle.triu(paddle.full([sq, sk], float("-inf")), 1)
    lse = paddle.logsumexp(s, axis=-1)  # [b, heads, sq]
    out = paddle.matmul(paddle.nn.functional.softmax(s, axis=-1), v).transpose([0, 2, 1, 3]).astype(query.dtype)
    pad = -sq % 128
    lse = paddle.concat([lse, paddle.zeros([lse.shape[0], lse.shape[1], pad])], axis=-1) if pad else lse
    return out, None, lse, None


def sdpa_backend(query, key, value, attn_mask=None, is_causal=False, scale=None, capability=(8, 0)) -> str:
    """`select_sdp_for_sdpa` on a GPU of compute capability `capability` with both of a GPU build's kernels
    (sdpa.py 3.3.1, flash, then memory-efficient, then math): flash (`can_use_flash_attention`) for q, k, v of one
    half dtype and one head width, a multiple of 8 and ≤ 256, no scale, causal only with equal lengths, on SM
    8.0-12.1; memory-efficient (`can_use_mem_efficient_attention`) for one dtype of fp16/bf16/fp32 whose widths are
    multiples of `minimum_gemm_alignment` (8 for half on tensor cores, 4 for fp32 on SM 8.x, ...), a non-causal
    mask's last dimension a multiple of 8, on SM 5.0-12.1; else math, which materialises `[b, h, s, s]`."""
    dtypes = (query.dtype, key.dtype, value.dtype)
    widths = (query.shape[-1], key.shape[-1], value.shape[-1])
    same, half, cap = len(set(dtypes)) == 1, dtypes[0] in HALF, tuple(capability)
    square = not is_causal or query.shape[1] == key.shape[1]
    if (same and half and len(set(widths)) == 1 and widths[0] % 8 == 0 and widths[0] <= 256 and scale is None
            and square and (8, 0) <= cap <= (12, 1)):
        return "flash_attn"
    tensor_cores = cap[0] >= 8 or (cap[0] == 7 and half)  # use_tensor_cores
    alignment = max(4 if cap[0] > 8 else 1, 128 // (16 if half else 32) if tensor_cores else 1)
    mask_aligned = is_causal or attn_mask is None or attn_mask.shape[-1] % 8 == 0  # check_attn_mask_alignment
    if (same and dtypes[0] in (*HALF, paddle.float32) and all(w % alignment == 0 for w in widths) and mask_aligned
            and (5, 0) <= cap <= (12, 1)):
        return "mem_efficient"
    return "math"


def as_gpu_device(monkeypatch, place=None):
    """The current device a GPU: `paddle.get_device()` answers "gpu:0" and the expected place is `place` (a CPU place
    standing in for the GPU's; a new one each call when None), so the code's GPU branches run."""
    monkeypatch.setattr(paddle, "get_device", lambda: "gpu:0")
    monkeypatch.setattr(paddle.framework, "_current_expected_place",
                        (lambda: place) if place is not None else (lambda: paddle.CPUPlace()))


class RefBatchedGemm:
    """`paddle.incubate.nn.functional.batched_gemm` (GPU only, phi/kernels/legacy/gpu/batched_gemm.cu): row segment e
    of lhs (cut by `batch_sizes`) times rhs[e] (`trans_rhs`: rhs[e] transposed); `trans_lhs`: segment e of lhs
    transposed times segment e of rhs, out `[experts, in, out]`, where a segment without rows is a k = 0 GEMM whose
    output the kernel does not promise: `idle` there (NaN catches code that reads it). fp32 and bf16 only, one
    dtype; a gray op under the emulated auto_cast (`amp_cast`), its product in its inputs' dtype (fp32 values
    rounded, as a half GEMM with fp32 accumulation); no backward (no grad node in Paddle 3.3.1: its outputs are
    constants to autograd). Made by `paddle.assign`, which leaks nothing, so a leak count through it is the code's.
    `calls`: (trans_lhs, trans_rhs, the dtype it computed in) of each call."""

    def __init__(self, idle: float = 0.0):
        self.idle, self.calls = idle, []

    def __call__(self, lhs, rhs, batch_sizes, trans_lhs=False, trans_rhs=False):
        lhs, rhs = amp_cast("batched_gemm", lhs, rhs)
        assert lhs.dtype == rhs.dtype and lhs.dtype in (paddle.float32, paddle.bfloat16), (lhs.dtype, rhs.dtype)
        assert sum(batch_sizes) == lhs.shape[0] and rhs.shape[0] == (lhs.shape[0] if trans_lhs else len(batch_sizes))
        self.calls.append((trans_lhs, trans_rhs, lhs.dtype))
        a, b, out, at = lhs.astype("float32").numpy(), rhs.astype("float32").numpy(), [], 0
        for e, n in enumerate(batch_sizes):
            if trans_lhs:  # [in, out] per segment
                idle = np.full((a.shape[1], b.shape[1]), self.idle, a.dtype)
                out.append(a[at:at + n].T @ b[at:at + n] if n else idle)
            else:
                out.append(a[at:at + n] @ (b[e].T if trans_rhs else b[e]))
            at += n
        return paddle.assign(np.stack(out) if trans_lhs else np.concatenate(out)).astype(lhs.dtype)


def ref_swiglu(h):
    """The packed SwiGLU (`[..., 2f]` gate | up -> `[..., f]`) in h's dtype, computed in fp32: the CPU has no bf16
    kernel of it."""
    gate, up = paddle.chunk(h.astype("float32"), 2, axis=-1)
    return (paddle.nn.functional.silu(gate) * up).astype(h.dtype)


def gpu_experts(monkeypatch, idle: float = 0.0) -> RefBatchedGemm:
    """The routed experts' GPU path (`ops.grouped.grouped_mlp_gpu`) on CPU: `batched_gemm` a `RefBatchedGemm`
    (returned: its `calls`), and autocast's queries (`paddle.amp.is_autocast_enabled`, `get_autocast_dtype`)
    answered from the emulated auto_cast (`Amp`; off, as on CPU, outside `fake_auto_cast`)."""
    import paddle.incubate.nn.functional as incubate

    gemm = RefBatchedGemm(idle)
    monkeypatch.setattr(incubate, "batched_gemm", gemm, raising=False)
    monkeypatch.setattr(paddle.amp, "is_autocast_enabled", lambda *a: Amp.level is not None)
    monkeypatch.setattr(paddle.amp, "get_autocast_dtype",
                        lambda *a: "bfloat16" if Amp.dtype == paddle.bfloat16 else "float16")
    return gemm


@contextlib.contextmanager
def scaler_enabled_on_cpu():
    """`paddle.amp.GradScaler`s built inside are enabled although the place is the CPU: their constructor's place
    check is the one thing answered as on a GPU; everything else is the real class."""
    import paddle.amp.grad_scaler as gs

    class GpuPlace:
        def is_gpu_place(self):
            return True

    class Tracer:
        _expected_place = GpuPlace()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gs, "_dygraph_tracer", lambda: Tracer())
        yield


def _sharding_base():
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (
        DygraphShardingOptimizer)

    return DygraphShardingOptimizer


class ShardingStandIn(_sharding_base()):
    """fleet's `DygraphShardingOptimizer` in one process: the owner of every parameter is this rank, so a reduce
    is the identity; `reduce_gradients` calls are counted (on a real group each reduces every gradient to its
    owner: a second call averages an already averaged gradient into the local ones)."""

    tensor_fusion = False  # fleet's default (`sharding_configs.tensor_fusion`)

    def __init__(self, optimizer):
        self._inner_opt = optimizer
        self._parameter_list = optimizer._parameter_list
        self.reductions = 0
        self.steps = 0

    def reduce_gradients(self, parameter_list, hcg):
        self.reductions += 1

    def filter_parameters(self, parameter_list, hcg):
        return list(parameter_list)

    def step(self):
        self.steps += 1
        self._inner_opt.step()

    def __getattr__(self, item):
        return getattr(self._inner_opt, item)


class _Hcg:
    def get_model_parallel_world_size(self):
        return 1

    def get_pipe_parallel_world_size(self):
        return 1


def hybrid_optimizer(optimizer):
    """fleet's real `HybridParallelOptimizer` class (its `step`, `_hybrid_sync_grad`, `_step`) over
    `ShardingStandIn(optimizer)`, built without its constructor (which needs a live hybrid group)."""
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.hybrid_parallel_optimizer import (
        HybridParallelOptimizer)
    hpo = object.__new__(HybridParallelOptimizer)
    hpo._inner_opt, hpo._hcg, hpo.processed_steps = ShardingStandIn(optimizer), _Hcg(), 0
    hpo._sharding_enable, hpo._dp_enable, hpo._sep_enable, hpo._timers = True, False, False, None
    hpo._get_mp_sync_params = lambda params: ([], None)
    hpo._get_pp_sync_params = lambda params: ([], None)
    hpo._sync_mp_grads = hpo._sync_mp_params_and_moments = hpo._sync_pp_params_and_moments = lambda *a: None
    return hpo
