"""How often a MoE training step on one process (and under the manual tp step and fleet's pipeline, which run the
same `models.moe.dispatch_local`) waits for the GPU, executed on CPU with the device emulated as
tests/unit/test_expert_all_to_all_gpu.py does (its `on_gpu` fixture: host reads and data-sized ops the project's
code makes, counted; the experts on `grouped_mlp_gpu` with a `batched_gemm` reference).

A sparse layer needs one host read per micro-batch: its experts' row counts, which the grouped GEMM takes as host
ints. It made more: `dispatch_local` counted the assignments with `paddle.bincount` (a GPU `bincount` copies its
input's max to the host, blocking, to size its output: phi/kernels/gpu/bincount_kernel.cu) before reading them,
a capacity added `masked_select` (its output sized by the data), and transformers' balance loss counted the top-k
choices with another `bincount` per layer, a value nothing reads on the host. Now the counts are `index_add`s of
ones into `[experts]` and the kept rows are cut at their host-known number. DeepSeek's sequence-wise loss
(`one_hot`) and the balancing-bias update (`set_value` of a tensor) read nothing; the test holds them to that.
The values are the old code's bit for bit (tests/unit/test_moe_dispatch.py, tests/parity/test_hf_moe_parity.py,
tests/parity/test_deepseek_parity.py); here the counts are checked exactly against numpy's.
"""
from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

from gpu_emulation import paddle

from moe_helpers import moe_cfg  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.models.moe_loss import sparse_blocks, update_expert_bias  # noqa: E402
from pretrain_cli.ops import grouped, kernels  # noqa: E402
from pretrain_cli.run_config import KernelConfig, MoeConfig  # noqa: E402
from test_deepseek_moe import MICRO  # noqa: E402
from test_expert_all_to_all_gpu import _swiglu, on_gpu  # noqa: E402,F401  (on_gpu: the fixture)

SMALL = dict(num_experts=8, num_experts_per_tok=2, hidden_size=16, moe_intermediate_size=12,
             shared_expert_intermediate_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8)


def _model(family: str, moe: MoeConfig):
    """A tiny two-sparse-layer model of `family` whose experts run the GPU's grouped GEMM (its reference)."""
    table = replace(kernels.select(KernelConfig(cpu_ops=False), "cpu"), grouped_mlp=grouped.grouped_mlp_gpu,
                    swiglu_packed=_swiglu)
    cfg = ModelConfig(**{**MICRO, "num_hidden_layers": 3}) if family == "deepseek" else moe_cfg("micro-qwen2-moe",
                                                                                               **SMALL)
    paddle.seed(0)
    return build_model(cfg, table, moe), cfg


def _train_step(on_gpu, model, cfg):
    """One micro-batch's forward with the router losses, its backward and the bias update, as a training step runs
    them; the host reads and data-sized ops the project's code made."""
    ids = paddle.to_tensor(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 12)).astype("int64"))
    model.train()
    on_gpu["syncs"][threading.get_ident()] = []
    total, count = model(ids, labels=ids)
    (total / count).backward()
    update_expert_bias(model, 0.01)
    return on_gpu["syncs"][threading.get_ident()]


CASES = {  # every router term each family has, the balancing bias moved after the step
    "qwen2_moe_balance_z_bias": ("qwen2", MoeConfig(aux_loss_coef=0.01, z_loss_coef=0.001, bias_update_rate=0.01)),
    "qwen2_moe_capacity": ("qwen2", MoeConfig(aux_loss_coef=0.01, capacity_factor=0.5)),
    "deepseek_v3_sequence_loss_bias": ("deepseek", MoeConfig(aux_loss_coef=1e-4, z_loss_coef=0.001,
                                                             bias_update_rate=0.01)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_sparse_layer_reads_the_device_once_per_micro_batch_on_one_process(on_gpu, case):
    family, moe = CASES[case]
    model, cfg = _model(family, moe)
    syncs = _train_step(on_gpu, model, cfg)
    blocks = sparse_blocks(model)
    assert len(blocks) == 2
    # was per layer: bincount and numpy in the dispatch (+ masked_select under a capacity), and the qwen balance
    # loss's bincount
    assert syncs == ["numpy"] * len(blocks), syncs
    for b in blocks:  # the counts the device made are numpy's, exactly (a capacity: at most `cap` each)
        full = np.bincount(b.record.routing.indices.numpy().reshape(-1), minlength=cfg.num_experts)
        want = np.minimum(full, 3) if moe.capacity_factor else full  # ceil(0.5 · 24 · 2 / 8) = 3
        np.testing.assert_array_equal(b.record.counts.numpy(), want.astype("float32"))
        assert float(b.record.dropped) == full.sum() - want.sum()
        assert b.gate.e_score_correction_bias is None or b.gate.e_score_correction_bias.numpy().any()
