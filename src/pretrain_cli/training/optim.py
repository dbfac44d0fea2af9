"""AdamW with PaddleNLP's decay exclusions; the learning rate comes from `run_config.Schedule`.

Clipping is done by the trainer (it needs the global norm for logging and the NaN policy anyway),
so the optimizer gets no `grad_clip`; the trainer sets the rate each step from `schedule.lr_at`.
On CPU (`ops.kernels.select_step`) the same AdamW is stepped by one multi-tensor kernel (`FusedAdamW`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pretrain_cli.run_config import OptimizerConfig, Schedule


def no_decay(structured_name: str) -> bool:
    """PaddleNLP's rule: no weight decay for names containing 'bias' or 'norm'."""
    return "bias" in structured_name or "norm" in structured_name


def build_optimizer(model, optimizer_cfg: OptimizerConfig, schedule: Schedule, multi_precision: bool = False,
                    adamw=None):
    """AdamW over the trainable parameters. Paddle calls `apply_decay_param_fun` with the parameter's
    internal unique name (e.g. `linear_3.w_0`), so structured names are mapped first. `adamw`: a multi-tensor
    kernel (`StepKernels.adamw`) that steps it instead of Paddle's per-parameter kernels."""
    import paddle

    internal_to_struct = {p.name: n for n, p in model.named_parameters()}
    params = [p for p in model.parameters() if not p.stop_gradient]
    opt = paddle.optimizer.AdamW(
        learning_rate=schedule.lr_at(1),
        parameters=params,
        beta1=optimizer_cfg.beta1,
        beta2=optimizer_cfg.beta2,
        epsilon=optimizer_cfg.epsilon,
        weight_decay=optimizer_cfg.weight_decay,
        apply_decay_param_fun=lambda internal: not no_decay(internal_to_struct.get(internal, internal)),
        multi_precision=multi_precision,
    )
    return FusedAdamW(opt, adamw) if adamw is not None else opt


class FusedAdamW:
    """Paddle's AdamW stepped by one multi-tensor kernel: its accumulators, their names and the checkpoint
    code stay Paddle's (the AdamW is `_inner_opt`, as under fleet's wrappers); `step` is the same arithmetic
    with the clipping coefficient applied inside (`grad_scale`) instead of a pass of its own, and
    `clear_grad` drops the gradients. Everything else (`set_lr`, state) is the inner optimizer's."""

    def __init__(self, inner, kernel):
        self._inner_opt, self._kernel = inner, kernel
        self._decays: dict = {}  # parameter name -> whether AdamW decays it (Paddle's `with_decay`)

    def __getattr__(self, name):
        return getattr(self._inner_opt, name)

    def clear_grad(self, set_to_zero: bool = False) -> None:
        """Drop the gradients instead of zero-filling them: Paddle's next backward replaces a zero-filled
        gradient with a new tensor anyway, so the fill was a wasted pass over every gradient. (A parameter
        that then gets no gradient is skipped by `step`; every parameter of our models gets one each step, an
        expert no token reached a zero one: `models.moe.Experts.idle`.)"""
        self._inner_opt.clear_grad(set_to_zero=set_to_zero)

    def step(self, grad_scale: float = 1.0) -> None:
        import paddle

        opt = self._inner_opt
        params = [p for p in opt._parameter_list if not p.stop_gradient and p.grad is not None]
        if not params:
            return
        # what Paddle's first `step` does: moments and beta powers per parameter (no-op once they exist)
        opt._create_accumulators(paddle.static.default_main_program().global_block(), params)
        fun = opt._apply_decay_param_fun
        for p in params:
            if p.name not in self._decays:
                self._decays[p.name] = fun is None or bool(fun(p.name))
        keys = (opt._moment1_acc_str, opt._moment2_acc_str, opt._beta1_pow_acc_str, opt._beta2_pow_acc_str)
        state = [[opt._get_accumulator_master(key, p) for p in params] for key in keys]
        with paddle.no_grad():
            self._kernel(params, [p.grad for p in params], *state, [self._decays[p.name] for p in params],
                         opt.get_lr(), opt._beta1, opt._beta2, opt._epsilon, opt._weight_decay, grad_scale)
