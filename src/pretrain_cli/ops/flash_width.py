"""flash-attn's head-width rule, pure (no Paddle, no device probe), so `config.compute` judges `plan`'s GPU by it
and `ops.kernels.flash_refuses` this process's GPU: one definition of what the GPU attention paths cannot run.

The library Paddle's flash_attn and flashmask_attention kernels call (PaddlePaddle/flash-attention
csrc/flash_attn/flash_attn.cu): CHECK_FWD_EXECTUABLE asserts head_size % 8 == 0 and <= 256, CHECK_BWD_EXECTUABLE
adds is_sm80 || is_sm90 above 192. Paddle's sdpa (nn/functional/sdpa.py 3.3.1, check_head_dim_size_flash,
check_flash_attention_hardware_support: SM 8.0-12.1) checks neither the 192 rule nor, for flashmask_attention
(nn/functional/flash_attention.py), anything: a run stopped mid-step where they failed.
"""
from __future__ import annotations

BACKWARD_WIDE = ((8, 0), (9, 0))  # the compute capabilities with flash-attn's backward above ANY_GPU_WIDTH
ANY_GPU_WIDTH = 192  # the widest head flash-attn runs forward and backward on every GPU it runs on
WIDEST = 256  # its forward's widest head (a multiple of 8)


def refusal(head_dim: int, capability: tuple[int, int] | None) -> tuple[str, str] | None:
    """(where, why) flash attention cannot run `head_dim` (forward and backward) on a GPU of compute capability
    `capability`, or None where it can: `where` is "" for a width no GPU takes, else the capability's words
    ("compute capability 8.9"). `capability` None: unknown, which counts as able (the width alone is judged)."""
    if head_dim % 8 or head_dim > WIDEST:
        return "", f"flash-attn takes multiples of 8 up to {WIDEST}"
    if head_dim <= ANY_GPU_WIDTH or capability is None or tuple(capability) in BACKWARD_WIDE:
        return None
    return (f"compute capability {capability[0]}.{capability[1]}",
            f"flash-attn's backward above {ANY_GPU_WIDTH} runs on 8.0 and 9.0 only")
