"""`to_static: true`: the model's forward compiled by Paddle's SOT (`compile_forward`), its failures said in one
line.

Kept apart from the kernel table (`ops.kernels`): compiling wraps a finished model, whatever kernels it was built
with (`training.run` calls it after the build and AMP, before the strategy wraps the model).
"""
from __future__ import annotations

from pretrain_cli.runtime import collective_failure


def compile_forward(model):
    """Opt-in `paddle.jit.to_static` (SOT) of the model's forward; same parameters, same losses.

    SOT traces Python bytecode and falls back to eager on what it cannot capture, so the model code needs no
    changes (the caches keyed by a tensor's identity, which it cannot trace, ask for eager: `ops.rope`).
    Backward, clipping and the optimizer stay eager. Returns the same Layer object, whose forward turns a failure
    of the compiled forward into one line naming to_static (`_CompiledForward`).
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
            from pretrain_cli.errors import UserError, is_out_of_memory

            if isinstance(e, UserError) or (isinstance(e, OSError) and e.errno is not None):  # (Paddle's own errors
                raise  # come as OSError without an errno: those are to_static's)
            text = " ".join(str(e).split())
            if is_out_of_memory(e) or collective_failure(e):
                raise
            raise UserError(f"to_static: Paddle's compiled forward failed ({type(e).__name__}: {text[:200]}); set "
                            f"to_static false to train eagerly (same losses; --debug shows the traceback)") from e
