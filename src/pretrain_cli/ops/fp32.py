"""Regions that compute in the dtypes their code names, whatever GPU autocast would choose.

Under `paddle.amp.auto_cast` (a GPU run's O1 and O2, `training.precision.Amp.autocast`) a matmul is on AMP's white
list (amp/amp_lists.py 3.3.1), so the eager API casts its inputs to the half dtype even when the code cast them to
fp32 on purpose; and a `PyLayer` forward, or its backward inside fleet's pipeline schedule (which the strategy, as
PaddleNLP's trainer, calls under autocast), runs under whatever autocast is active (eager `pylayer_method_apply`
leaves the AMP state alone). The places that need an fp32 product therefore run with autocast off:

- a MoE router (`models.moe`): logits, scores and combine weights fp32, as transformers' routers;
- the fused LM head + loss under fp16 (`ops.linear_loss`): the two gradient GEMMs of the loss sum, before the
  loss scale (fp16 would flush the small probabilities to 0);
- context parallelism's materialised blocks (`ops.block_attention`): their scores and the backward's GEMMs, against
  flash attention's fp32 log-sum-exp.

Inside, every dtype is the code's own (a half GEMM where both inputs are half); on CPU and in fp32 runs, where
autocast is off anyway, it changes nothing.
"""
from __future__ import annotations


def autocast_off():
    """A context with autocast off (nested inside an enabled one, which it restores on exit)."""
    import paddle

    return paddle.amp.auto_cast(enable=False)
