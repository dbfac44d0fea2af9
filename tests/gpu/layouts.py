"""The parallel layouts tests/gpu/test_layouts_gpu.py trains on GPUs, with the GPUs each needs: a plain table (no
Paddle import), so scripts/gpu_check.sh can run the layouts that fit the machine and name those it leaves out,
on 1, 2, 4 or 8 GPUs (`python tests/gpu/layouts.py N` prints both)."""
from __future__ import annotations

import sys

LAYOUT_TEST = "tests/gpu/test_layouts_gpu.py::test_layout_matches_one_gpu"
HALF_TEST = "tests/gpu/test_layouts_gpu.py::test_half_precision_layouts_train_and_save"

# the keys that choose the model a layout is compared on (one GPU runs them too); the rest are the layout's
MODEL_KEYS = ("model_name_or_path", "moe_aux_loss_scope", "router_aux_loss_coef")
MOE = {"model_name_or_path": "micro-qwen3-moe", "moe_aux_loss_scope": "global", "router_aux_loss_coef": 0.05}

# name -> (GPUs, argument-file keys): each trains the same 10 steps as one GPU at the same global batch, in fp32
LAYOUTS = {
    "dp2": (2, {}),
    "stage1": (2, {"sharding": "stage1"}),
    "stage2": (2, {"sharding": "stage2"}),
    "stage3": (2, {"sharding": "stage3"}),
    "tp2": (2, {"tensor_parallel_degree": 2, "per_device_train_batch_size": 8}),
    "dp2_tp2_stage3": (4, {"tensor_parallel_degree": 2, "sharding": "stage3"}),
    "pp2": (2, {"pipeline_parallel_degree": 2, "gradient_accumulation_steps": 2, "per_device_train_batch_size": 4}),
    "pp2_dp2": (4, {"pipeline_parallel_degree": 2, "gradient_accumulation_steps": 2, "per_device_train_batch_size": 2}),
    "pp2_stage2": (4, {"pipeline_parallel_degree": 2, "gradient_accumulation_steps": 2,
                       "per_device_train_batch_size": 2, "sharding": "stage2"}),  # ZeRO-2 in each stage (distributed/strategies/pipeline.py)
    # tensor parallelism inside the stages (distributed/steps/tensor_parallel.py); 8 GPUs for the three-axis layouts
    "tp2_pp2": (4, {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 2, "gradient_accumulation_steps": 4,
                    "per_device_train_batch_size": 2}),
    "tp2_pp2_dp2": (8, {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 2, "gradient_accumulation_steps": 4,
                        "per_device_train_batch_size": 1}),
    "cp2": (2, {"context_parallel_degree": 2, "per_device_train_batch_size": 8}),  # distributed/steps/context.py
    # sequence parallelism (distributed/steps/sequence_parallel.py): paddle.distributed.reduce_scatter on NCCL
    "tp2_sp": (2, {"tensor_parallel_degree": 2, "sequence_parallel": True, "per_device_train_batch_size": 8}),
    "tp2_pp2_sp": (4, {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 2, "sequence_parallel": True,
                       "gradient_accumulation_steps": 4, "per_device_train_batch_size": 2}),
    "tp2_pp2_stage1": (8, {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 2, "sharding": "stage1",
                           "gradient_accumulation_steps": 4, "per_device_train_batch_size": 1}),
    # expert parallelism's all-to-all dispatch on NCCL (distributed/steps/expert_all_to_all.py; CPU runs the
    # all-gather one), against one GPU on the same Mixture-of-Experts model (`MODEL_KEYS`), the balance loss over
    # the global batch so the data ranks' mean loss is one GPU's; with tp each held expert cut in two as well
    "moe_ep2": (2, {**MOE, "expert_parallel_degree": 2}),
    "moe_ep2_tp2": (4, {**MOE, "expert_parallel_degree": 2, "tensor_parallel_degree": 2}),
}

# bf16 O2 under TP + ZeRO-3, PaddleNLP's fp16 O2 + stage2 (the loss scaler wrapped by dist.shard_scaler), bf16 under
# context parallelism (flash attention's per-block output and log-sum-exp, `kernels.attention_block`), fp16's loss
# scaler with fleet's hybrid optimizer (ZeRO-1; a pipeline's ZeRO-2): gradients reduced once (issue #60), and bf16 O2
# with amp_master_grad on the semi-auto ZeRO-2/3 (fp32 gradients in `main_grad`, accumulated over 2 micro-batches,
# clipped at max_grad_norm; `strategy.step_grad`)
HALF = {
    "bf16_tp2_stage3": (2, {"bf16": True, "fp16_opt_level": "O2", "tensor_parallel_degree": 2, "sharding": "stage3",
                            "per_device_train_batch_size": 8}),
    "fp16_stage2": (2, {"fp16": True, "fp16_opt_level": "O2", "sharding": "stage2"}),
    "bf16_cp2": (2, {"bf16": True, "fp16_opt_level": "O2", "context_parallel_degree": 2}),
    "fp16_stage1": (2, {"fp16": True, "fp16_opt_level": "O2", "sharding": "stage1"}),
    "fp16_pp2_stage2": (4, {"fp16": True, "fp16_opt_level": "O2", "pipeline_parallel_degree": 2,
                            "gradient_accumulation_steps": 2, "per_device_train_batch_size": 2, "sharding": "stage2"}),
    **{f"bf16_o2_master_grad_stage{n}": (2, {"bf16": True, "fp16_opt_level": "O2", "amp_master_grad": True,
                                            "sharding": f"stage{n}", "gradient_accumulation_steps": 2,
                                            "per_device_train_batch_size": 2}) for n in (2, 3)},
}


def selection(gpus: int) -> tuple[list[str], list[str]]:
    """(the pytest node ids that fit `gpus`, one line per layout left out)."""
    run, left = [], []
    for test, table in ((LAYOUT_TEST, LAYOUTS), (HALF_TEST, HALF)):
        for name in sorted(table):
            need = table[name][0]
            if need <= gpus:
                run.append(f"{test}[{name}]")
            else:
                left.append(f"{name} (needs {need} GPUs)")
    return run, left


if __name__ == "__main__":  # `run <node id>` / `left <layout>` lines for scripts/gpu_check.sh
    ids, out = selection(int(sys.argv[1]))
    print("\n".join([*(f"run {i}" for i in ids), *(f"left {x}" for x in out)]))
