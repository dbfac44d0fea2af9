"""A model's and an optimizer's tensors as whole host arrays keyed by their checkpoint names, for tests that
compare two runs' state (the product never gathers them: every rank writes its own pieces)."""
import numpy as np

from pretrain_cli.distributed.layout.pieces import host_view, state_tensors
from pretrain_cli.models.convert import hf_params


def optimizer_tensors(model, optimizer) -> dict[str, np.ndarray]:
    """This process's AdamW state keyed `<hf name>/<slot>`, HF layout, whole host copies."""
    return {name: np.ascontiguousarray(host_view(t, tr)) for name, kind, t, tr in state_tensors(model, optimizer) if kind == "optimizer"}


def hf_state_dict(model) -> dict:
    """HF-named, HF-layout Paddle tensors (contiguous copies); no `lm_head.weight` when tied."""
    import paddle

    out = {}
    for name, p, transpose in hf_params(model):
        t = paddle.transpose(p.detach(), [1, 0]) if transpose else p.detach()  # [out, in]
        out[name] = t.contiguous() if hasattr(t, "contiguous") else t
    return out
