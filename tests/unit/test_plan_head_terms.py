"""The LM head + loss terms of the memory model (`planning.activations`): the dW-sized buffers the fused head +
loss's chunk loop holds (`fused_dw_buffers`, min(chunks, 2)) and the head's backward (`head_backward_bytes`: a new
whole dW, with the logits' gradient unfused, and on CPU over data ranks the gloo all-reduce's copy), which is the
step's peak at a few tokens a micro-batch. Measured at llama-52m on 2 gloo ranks: docs/PLAN.md, the memory model's
layouts table (benchmarks/plan_calibration.py --layouts)."""
import dataclasses

from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.planning.activations import (fused_dw_buffers, fused_loss_bytes, head_backward_bytes,
                                               logits_live_bytes)
from pretrain_cli.planning.memory import Setup, estimate

MIB = 2**20
LLAMA_52M = {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 6, "num_attention_heads": 8,
             "num_key_value_heads": 4, "vocab_size": 32000}
HEAD = 4 * 32000 * 512  # the head's fp32 dW: 62.5 MiB


def _setup(**kw) -> Setup:
    cfg = dataclasses.replace(ModelConfig.from_file(str(PRESET_DIR / "tiny-llama")), **LLAMA_52M)
    base = dict(model=cfg, micro_batch=2, seq_len=256, device="cpu", attention="math")
    return Setup(**{**base, **kw})


def test_fused_loop_holds_one_dw_a_chunk_up_to_two():
    """262 rows a chunk at V 32,000 on CPU: 1, then (from two chunks on) 2 heads, as measured at 1, 2, 3, 4 chunks
    (the loop drops each chunk's product once added: tests/unit/test_linear_loss_memory.py)."""
    counts = [fused_dw_buffers(_setup(micro_batch=1, seq_len=n)) for n in (262, 512, 786, 1024, 2048)]
    assert counts == [1, 2, 2, 2, 2]
    two = _setup(fused_loss=True)  # b 2 x s 256: 2 chunks
    chunk = 262 * 32000 * 4
    assert fused_loss_bytes(two) == 2 * HEAD + 512 * 512 * 4 + chunk


def test_head_backward_counts_the_new_dw_and_on_cpu_the_gloo_copy():
    """Unfused at b 1 x s 64: a new dW beside the logits' gradient; on CPU over 2 data ranks the all-reduce's copy
    instead (the larger), 125 MiB where the logits term was 15.6 (ZeRO-2 measured 140.2 above what a rank holds,
    15.2 of it activations: the plan was 14.9 % under). One rank and a GPU's NCCL keep no copy."""
    few = dict(micro_batch=1, seq_len=64, fused_loss=False)
    grad = 64 * 32000 * 4
    one = _setup(**few)
    assert head_backward_bytes(one) == HEAD + grad
    cpu2 = _setup(**few, data_ranks=2, sharding_stage=2, sharding_degree=2, distributed_tensors=True)
    assert head_backward_bytes(cpu2) == 2 * HEAD
    assert logits_live_bytes(cpu2) == 2 * HEAD  # was the logits' 2 x 7.8 MiB
    gpu2 = dataclasses.replace(cpu2, device="gpu")
    assert head_backward_bytes(gpu2) == HEAD + HEAD / 2  # reduce-scattered: dW's 1/S shard (the grad freed)
    dp_gpu = dataclasses.replace(one, device="gpu", data_ranks=2, dp_buffers=True)
    assert head_backward_bytes(dp_gpu) == HEAD + grad  # NCCL reduces in place
    # fused: dh and the kept dW, and on CPU the copy: above the forward's one dW + a 64-row chunk
    fused = dataclasses.replace(cpu2, fused_loss=True)
    assert logits_live_bytes(fused) == head_backward_bytes(fused) == 2 * HEAD + 64 * 512 * 4


def test_logits_term_at_many_tokens_is_unchanged_unfused():
    """At b 2 x s 256 the end of the forward (logits + fp32 softmax, 125 MiB) ties with the head's backward, so the
    unfused layouts' plan stays (ZeRO-2 866.1 MiB planned, 847.6 measured)."""
    s = _setup(fused_loss=False, data_ranks=2, sharding_stage=2, sharding_degree=2, distributed_tensors=True)
    assert logits_live_bytes(s) == 2 * 512 * 32000 * 4 == 2 * HEAD
    assert estimate(s)["logits_loss"] == 2 * HEAD
