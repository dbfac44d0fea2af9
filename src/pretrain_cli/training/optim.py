"""AdamW with PaddleNLP's decay exclusions; the learning rate comes from `config.run_config.Schedule`.

Clipping is done by the trainer (it needs the global norm for logging and the NaN policy anyway),
so the optimizer gets no `grad_clip`; the trainer sets the rate each step from `schedule.lr_at`.
"""
from __future__ import annotations


def no_decay(structured_name: str) -> bool:
    """PaddleNLP's rule: no weight decay for names containing 'bias' or 'norm'."""
    return "bias" in structured_name or "norm" in structured_name


def build_optimizer(model, optimizer_cfg, schedule, multi_precision: bool = False):
    """AdamW over the trainable parameters. Paddle calls `apply_decay_param_fun` with the parameter's
    internal unique name (e.g. `linear_3.w_0`), so structured names are mapped first."""
    import paddle

    internal_to_struct = {p.name: n for n, p in model.named_parameters()}
    params = [p for p in model.parameters() if not p.stop_gradient]
    return paddle.optimizer.AdamW(
        learning_rate=schedule.lr_at(1),
        parameters=params,
        beta1=optimizer_cfg.beta1,
        beta2=optimizer_cfg.beta2,
        epsilon=optimizer_cfg.epsilon,
        weight_decay=optimizer_cfg.weight_decay,
        apply_decay_param_fun=lambda internal: not no_decay(internal_to_struct.get(internal, internal)),
        multi_precision=multi_precision,
    )
