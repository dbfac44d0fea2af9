"""`to_static: true`: the model's forward compiled by Paddle's SOT (`compile_forward`), its failures, and those of
the backward that runs back through the compiled program (`CompiledBackward`), said in one line.

Kept apart from the kernel table (`ops.kernels`): compiling wraps a finished model, whatever kernels it was built
with (`training.run` calls it after the build and AMP, before the strategy wraps the model).
"""
from __future__ import annotations

import re

from pretrain_cli.runtime import collective_failure


def compile_forward(model):
    """Opt-in `paddle.jit.to_static` (SOT) of the model's forward; same parameters, same losses.

    SOT traces Python bytecode and falls back to eager on what it cannot capture, so the model code needs no
    changes (the caches keyed by a tensor's identity, which it cannot trace, ask for eager: `ops.rope`).
    Clipping and the optimizer stay eager; the loss's backward runs back through the compiled program, so
    `training.run` wraps the precision object's backward too (`CompiledBackward`). Returns the same Layer object,
    whose forward turns a failure of the compiled forward into one line naming to_static (`_CompiledForward`).
    """
    import paddle

    model = paddle.jit.to_static(model, full_graph=False)
    model.forward = _CompiledForward(model.forward)
    return model


class _CompiledForward:
    """The compiled forward; what fails inside it (SOT's own errors, or an op SOT handed wrong arguments: Paddle 3.3.1
    passed a closure's cells as values) becomes a `UserError` naming to_static, the traceback kept as its cause
    (`--debug`). Out of memory, the system's errors (an OSError with an errno) and a lost peer's pass unchanged: they
    are not to_static's."""

    def __init__(self, static_forward):
        self.static_forward = static_forward

    def __getattr__(self, name):  # the StaticFunction's own attributes (its program cache, rollback)
        if name == "static_forward":  # (not set yet: a copy being built)
            raise AttributeError(name)
        return getattr(self.static_forward, name)

    def __call__(self, *args, **kwargs):
        try:
            return self.static_forward(*args, **kwargs)
        except Exception as e:
            if (error := failure(e, "forward")) is None:
                raise
            raise error from e


class CompiledBackward:
    """The precision object (`training.precision`: `backward(loss)` and the rest) of a run whose forward is compiled:
    what fails in the loss's backward, which runs back through the compiled program, is said as the forward's is
    (`failure`), the traceback kept as its cause. Every other attribute is the precision object's."""

    def __init__(self, amp):
        self.amp = amp

    def __getattr__(self, name):
        if name == "amp":  # (not set yet: a copy being built)
            raise AttributeError(name)
        return getattr(self.amp, name)

    def backward(self, loss) -> None:
        try:
            self.amp.backward(loss)
        except Exception as e:
            if (error := failure(e, "backward")) is None:
                raise
            raise error from e


def failure(e: Exception, part: str):
    """The one-line `UserError` naming to_static for `e`, raised in the compiled `part` ("forward", "backward"); None
    for what is not to_static's: a `UserError` already, out of memory, the system's errors (an OSError with an errno;
    Paddle's own errors come as OSError without one: those are to_static's) and a lost peer's."""
    from pretrain_cli.errors import UserError, is_out_of_memory

    if isinstance(e, UserError) or (isinstance(e, OSError) and e.errno is not None):
        return None
    if is_out_of_memory(e) or collective_failure(e):
        return None
    # Paddle wraps an error raised in backward in a banner ("{ ===== Error message in backward of GradNode… =====",
    # then "RuntimeError: …", then "At:" and the stack) and C++ errors end in a summary ("InvalidArgumentError: …"):
    # that named line is the news, else the whole message
    said = next((line.strip() for line in str(e).splitlines() if re.match(r"\s*\w+(Error|Exception): ", line)), None)
    text = said or f"{type(e).__name__}: {' '.join(str(e).split())}"
    return UserError(f"to_static: Paddle's compiled {part} failed ({text[:200]}); set to_static false to train "
                     f"eagerly (same losses; --debug shows the traceback)")
