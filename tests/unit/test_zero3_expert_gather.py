"""A Mixture-of-Experts model under the semi-auto engine's ZeRO-3: the routed experts are kept from a sparse layer's
forward to its backward as this rank's shards, gathered whole inside the grouped GEMM in forward and again in
backward (`distributed.steps.local_kernels.ZeroGather`, `ops.grouped_gemm_layer.StackedGemm`), with the step's
results bit for bit those of the path that handed the GEMM the gathered copies (which it kept until backward).

Both paths run in the same child (`_CHILD` after tests/unit/zero3_expert_child.py's start, 2 gloo ranks forked as tests/unit/test_plan_zero3_experts.py's are), one
launch each: the old one is `LocalDispatch._weight` as it was, restored in the child. Bytes are each rank's host
allocator's (`host_memory_stat_current_value`), in its own process: what a forward leaves allocated when it returns,
before its backward, is what autograd keeps (with the loss)."""
import dataclasses
import json

import numpy as np
from bench_scripts import load
from zero3_expert_child import run_child

from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.planning.memory import Setup, stage_experts

# micro-qwen3-moe widened so its experts (48 MiB on a rank, whole) outweigh the rest: 4 sparse layers of 12 MiB
WIDE = {"hidden_size": 128, "intermediate_size": 512, "moe_intermediate_size": 1024, "num_hidden_layers": 4,
        "vocab_size": 2048, "head_dim": 32}

_CHILD = r"""core = paddle.base.core
kept = []
forward_loss = Step._forward_loss


def measured(self, layout, batch):
    before = core.host_memory_stat_current_value("Allocated", 0)
    loss = forward_loss(self, layout, batch)
    kept.append(core.host_memory_stat_current_value("Allocated", 0) - before)
    return loss


Step._forward_loss = measured
args = parse_config(sys.argv[1], [])
_, cfg = build_model_config(args)
run = resolve(args, cfg, launcher_target())
init_process_group(run.parallel, run.loop.seed, run.loop, run.device)
comm = build_comm(run.parallel)
trainer = Trainer(lay_out(run, build_model(run, cfg), comm), None, run, comm)
trainer.model.train()
rank = Topology.of(run.parallel).data_rank
rng = np.random.default_rng(rank)
def batches():
    while True:
        t = rng.integers(0, cfg.vocab_size, (run.loop.micro_batch, run.data.max_seq_length + 1))
        yield {"input_ids": t[:, :-1], "labels": t[:, 1:]}
it = batches()
steps = [trainer.train_step(it) for _ in range(2)]
np.savez(f"{sys.argv[3]}.{rank}.npz", **{n: p._local_value().numpy() for n, p in trainer.model.named_parameters()})
print("RESULT " + json.dumps({"rank": rank, "kept": kept, "steps": [[s.loss, s.grad_norm] for s in steps]}),
      flush=True)
"""


def _run(tmp_path, path: str) -> tuple[dict, dict]:
    """{rank: what it printed}, {rank: its parameters' local values after two steps} of `path` ("old", "new")."""
    bench = load("plan_calibration")
    _, args_path = bench._write(tmp_path / path, "moe", "micro-qwen3-moe", WIDE, 2, 128, None, {})
    args = json.loads(args_path.read_text())
    args.update(sharding="stage3", cpu_fused_ops=False, use_flash_attention=False, report_to=["none"])
    args_path.write_text(json.dumps(args))
    return run_child(_CHILD, tmp_path, args_path, path, path, 2)


def test_zero3_keeps_the_experts_shards_not_the_gathered_experts_with_the_same_step(tmp_path):
    """Each rank's forward of 4 sparse layers keeps 48 MiB less than the old path's (every layer's gathered experts,
    whole on the rank: the old path kept them to its backward), and two steps give the same losses, gradient norms
    and parameters bit for bit."""
    cfg = dataclasses.replace(ModelConfig.from_file(str(PRESET_DIR / "micro-qwen3-moe")), **WIDE)
    experts = 4 * stage_experts(Setup(model=cfg, micro_batch=2, seq_len=128))  # fp32 bytes, whole
    assert experts == 48 * 2**20
    (old, old_weights), (new, new_weights) = _run(tmp_path, "old"), _run(tmp_path, "new")
    for rank in (0, 1):
        saved = [o - n for o, n in zip(old[rank]["kept"], new[rank]["kept"])]
        assert len(saved) == 2 and all(0.95 * experts <= s <= 1.05 * experts for s in saved), (rank, saved)
        assert new[rank]["steps"] == old[rank]["steps"]  # losses and gradient norms, bit for bit
        assert sorted(new_weights[rank]) == sorted(old_weights[rank])
        for name, want in old_weights[rank].items():
            np.testing.assert_array_equal(new_weights[rank][name], want, err_msg=name)
