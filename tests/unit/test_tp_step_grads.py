"""The `tp` layout step (distributed/steps/order.py `_split_tp`, distributed/steps/tensor_parallel.py) on two ranks
run as two threads of this process, against one process: after the step's backward and the strategy's sum of the
gradients the step lists (`Placement.tp_summed`, `tensor_parallel.sum_grads`), every whole weight's gradient is one
process's and every slice's is its block of one process's. Qwen3 (q_norm / k_norm: one `[head_dim]` weight shared
by all heads, inside the attention region) with and without sequence parallelism: each tp rank's q/k norms saw only
its heads, so their gradients were that rank's part, and the tp ranks' copies drifted apart (Qwen3 and Qwen3-MoE under
tp x pp, tp + sp, tp x cp and ep x tp left one process by 2.8e-5 to 7.8e-5 in 6 steps of a launch).

Threads, not processes: the two ranks meet only in `paddle.distributed.all_reduce` (replaced by a sum between the
threads), so this checks which gradients the step leaves partial and that the strategy's sum makes them whole; the
launches (tests/distributed/test_sequence_parallel.py, test_tp_pipeline.py) run the real groups on micro-qwen2.
"""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from thread_ranks import Hub  # noqa: E402
from pretrain_cli.config.presets import PRESET_DIR  # noqa: E402
from pretrain_cli.distributed.comms.collectives import for_device  # noqa: E402
from pretrain_cli.distributed.layout.topology import Topology  # noqa: E402
from pretrain_cli.distributed.steps import order  # noqa: E402
from pretrain_cli.distributed.steps.tensor_parallel import sum_grads  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.ops import kernels  # noqa: E402
from pretrain_cli.run_layout import ParallelConfig  # noqa: E402

TP = 2
MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
            "mlp_only_layers", "router_aux_loss_coef", "output_router_logits")


class TpHub(Hub):
    """The tp group's all-reduce and all-gather between the thread-ranks (`paddle.distributed`'s, patched in)."""

    def all_reduce(self, tensor, op=None, group=None, sync_op=True):
        tensor.set_value(paddle.to_tensor(np.sum(self.exchange(tensor), axis=0), dtype=tensor.dtype))

    def all_gather(self, tensor_list, tensor, group=None, sync_op=True):
        tensor_list.extend(paddle.to_tensor(p, dtype=tensor.dtype) for p in self.exchange(tensor))


def _qwen3():
    """micro-qwen3-moe's attention (4 heads / 2 KV heads of 16, q/k norms) as a dense Qwen3."""
    preset = json.loads((PRESET_DIR / "micro-qwen3-moe" / "config.json").read_text())
    cfg = {k: v for k, v in preset.items() if k not in MOE_KEYS}
    return ModelConfig.from_dict({**cfg, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})


def _model(cfg, fused_loss: bool = True):
    # the tp step's kernel table (`order._tp_kernels`): the row-parallel outputs summed before the residual add;
    # the fused head + loss by default, as `config.resolve` leaves it under the step (the LM head whole on each rank)
    table = kernels.select(kernels.KernelConfig(fused_loss=fused_loss), "cpu")
    table = replace(table, linear_residual=None, linear_add_rms_norm=None)
    paddle.seed(0)
    return build_model(cfg, table)


def _grads(model, ids, labels) -> dict:
    total, count = model(ids, labels=labels)
    (total / count).backward()
    return {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("sequence_parallel,fused_loss", [(False, True), (True, True), (True, False)])
def test_the_tp_steps_gradients_after_its_sum_are_one_process(monkeypatch, sequence_parallel, fused_loss):
    """One process runs the fused head + loss; the tp ranks run it too, or (with sequence parallelism: the head's
    input gathered whole) the logits and the unfused loss, which give the same gradients."""
    cfg = _qwen3()
    rng = np.random.default_rng(3)
    ids = paddle.to_tensor(rng.integers(3, 512, (2, 16)))
    labels = paddle.to_tensor(rng.integers(3, 512, (2, 16)))
    want = _grads(_model(cfg), ids, labels)

    hub = TpHub(TP)
    monkeypatch.setattr(paddle.distributed, "all_reduce", hub.all_reduce)
    monkeypatch.setattr(paddle.distributed, "all_gather", hub.all_gather)  # sequence parallelism's
    monkeypatch.setattr(order.Placement, "group", lambda self, axis: None)
    got = {}
    models = [_model(cfg, fused_loss) for _ in range(TP)]  # here: the weights are drawn from Paddle's one generator

    def rank(r: int):
        parallel = ParallelConfig(world_size=TP, rank=r, tp_degree=TP, manual_tp=True,
                                  sequence_parallel=sequence_parallel)
        placement = order.Placement(parallel, Topology.of(parallel), for_device("cpu"))
        model = order._split_tp(models[r], placement)
        _grads(model, ids, labels)  # (this rank's backward)
        sum_grads(placement.tp_summed, None)  # what `Hybrid.sync_grads` does first
        grads = {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}
        got[r] = grads, placement.tp_dims

    hub.run(rank)
    assert any(".self_attn.q_norm." in n for n in want) and any(".self_attn.k_norm." in n for n in want)
    for r, (grads, dims) in got.items():
        assert sorted(grads) == sorted(want), r
        for name, g in grads.items():
            ref = want[name]
            if name in dims:  # this rank's block of the tensor
                size = ref.shape[dims[name]] // TP
                ref = np.take(ref, range(r * size, (r + 1) * size), axis=dims[name])
            np.testing.assert_allclose(g, ref, atol=1e-7, rtol=1e-4, err_msg=f"rank {r}: {name}")
