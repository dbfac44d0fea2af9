"""flash-attn's head-width rule, pure (no Paddle, no device probe), so `config.compute` judges `plan`'s GPU by it
and `ops.gpu_attention` this process's GPU: one definition of what a GPU run's memory-light attention computes at a
width.

The library Paddle's flash_attn and flashmask_attention kernels call (PaddlePaddle/flash-attention
csrc/flash_attn/flash_attn.cu): CHECK_FWD_EXECTUABLE asserts head_size % 8 == 0 and <= 256 (and sm8x or sm90),
CHECK_BWD_EXECTUABLE adds is_sm80 || is_sm90 above 192. Paddle's sdpa (nn/functional/sdpa.py 3.3.1,
check_head_dim_size_flash, check_flash_attention_hardware_support: SM 8.0-12.1) checks neither the 192 rule nor,
for flashmask_attention (nn/functional/flash_attention.py), anything: a run stopped mid-step where they failed.
Where sdpa's flash check refuses, it tries its memory-efficient kernel, which wants every width a multiple of
`minimum_gemm_alignment` (8 for fp16/bf16 on a tensor-core GPU) and holds no scores; else its math path.
"""
from __future__ import annotations

BACKWARD_WIDE = ((8, 0), (9, 0))  # the compute capabilities with flash-attn's backward above ANY_GPU_WIDTH
ANY_GPU_WIDTH = 192  # the widest head flash-attn runs forward and backward on every GPU it runs on
WIDEST = 256  # its forward's widest head (a multiple of 8)
HALF_ALIGNMENT = 8  # sdpa.py `minimum_gemm_alignment` for fp16/bf16: its memory-efficient kernel's width rule
PATHS = ("flash", "mem_efficient", "math")  # what `path` answers
WIDE_NAMES = " / ".join(f"{major}.{minor}" for major, minor in BACKWARD_WIDE)  # "8.0 / 9.0", as `fix` says them


def width_refused(head_dim: int) -> bool:
    """Whether flash-attn's forward refuses `head_dim` on every GPU (`CHECK_FWD_EXECTUABLE`): not a multiple of 8,
    or over 256. Sdpa checks the same (`check_head_dim_size_flash`), so there it picks another kernel itself."""
    return bool(head_dim % 8) or head_dim > WIDEST


def capability_decides(head_dim: int, backward: bool = True) -> bool:
    """Whether `refusal` at `head_dim` turns on the GPU's compute capability (193-256 with a backward): only then
    need a caller ask the device (`ops.gpu_attention`)."""
    return backward and not width_refused(head_dim) and head_dim > ANY_GPU_WIDTH


def refusal(head_dim: int, capability: tuple[int, int] | None, backward: bool = True) -> tuple[str, str] | None:
    """(where, why) flash attention cannot run `head_dim` on a GPU of compute capability `capability` (forward and,
    with `backward`, backward), or None where it can: `where` is "" for a width no GPU takes, else the
    capability's words ("compute capability 8.9"). `capability` None: unknown, which counts as able (the width
    alone is judged). Without a backward only the forward's width check counts: a forward alone (eval, generate,
    context parallelism's blocks, whose backward is `ops.block_attention`'s) runs 193-256 on every such GPU."""
    if width_refused(head_dim):
        return "", f"flash-attn takes multiples of 8 up to {WIDEST}"
    if not capability_decides(head_dim, backward) or capability is None or tuple(capability) in BACKWARD_WIDE:
        return None
    return (f"compute capability {capability[0]}.{capability[1]}",
            f"flash-attn's backward above {ANY_GPU_WIDTH} runs on {WIDE_NAMES.replace(' / ', ' and ')} only")


def judge(head_dim: int, capability: tuple[int, int] | None, sdpa: bool,
          backward: bool = True) -> tuple[str, tuple[str, str] | None]:
    """(`path`, `refusal`): what runs and why flash-attn does not (None where it does), asked once. A refusal with
    a `where` (the GPU's backward) is one sdpa, which checks no capability, would run into: the caller takes the
    math path itself; one without (a width no GPU takes) sdpa turns from flash-attn itself."""
    why = refusal(head_dim, capability, backward)
    if why is None:
        return "flash", None
    if sdpa and head_dim > WIDEST and head_dim % HALF_ALIGNMENT == 0:
        return "mem_efficient", why
    return "math", why


def path(head_dim: int, capability: tuple[int, int] | None, sdpa: bool, backward: bool = True) -> str:
    """What a GPU run that asks for flash attention (fp16/bf16) computes at `head_dim` (one of `PATHS`): flash-attn
    where `refusal` lets it; else, on the causal path through Paddle's sdpa (`sdpa`: a causal mask without context
    parallelism, `gpu_attention.attention_sdpa_causal`), sdpa's memory-efficient kernel where the width is a multiple of
    8 (over 256: sdpa.py 3.3.1 `check_head_dim_size_mem_efficient`), holding no scores like flash; else the
    `[b, heads, s, s]` scores materialised ("math": sdpa's own math path for a width not a multiple of 8, and for
    193-256 off 8.0 / 9.0, where sdpa would still pick flash-attn, `kernels.attention_sdpa_mask`). `judge`'s first."""
    return judge(head_dim, capability, sdpa, backward)[0]


def fix(where: str, mla: bool | None = None, capability: tuple[int, int] | None = None, backward: bool = True) -> str:
    """How to get flash attention back, naming the keys that set the width (`mla` None: both kinds of model's) and
    the widest head the GPU named takes: a multiple of 8 of at most 192 runs on every GPU flash-attn runs on; the
    193-256 a `where` names, on `BACKWARD_WIDE`'s compute capabilities (A100, H100). At a width no GPU takes (`where`
    "") the bound is `capability`'s, asked of `refusal` at 256 (so where 256 runs is said once, there): 256 where it
    lets 256 run (8.0 / 9.0, a forward alone), else 192 with where 256 runs (`capability` None, unknown: both)."""
    keys = {True: "max(qk_nope_head_dim + qk_rope_head_dim, v_head_dim)", False: "head_dim"}.get(
        mla, "head_dim (under MLA max(qk_nope_head_dim + qk_rope_head_dim, v_head_dim))")
    if where:
        bound = f"{ANY_GPU_WIDTH}, or run on a GPU of compute capability {WIDE_NAMES} (A100, H100)"
    elif refusal(WIDEST, capability or (0, 0), backward) is None:  # (unknown: judged as a GPU not in BACKWARD_WIDE)
        bound = f"{WIDEST}"
    else:
        bound = f"{ANY_GPU_WIDTH} ({WIDEST} on compute capability {WIDE_NAMES})"
    return f"for flash attention {keys} must be a multiple of 8 of at most {bound}"
