"""A Mixture-of-Experts model under the semi-auto engine's ZeRO-3: the routed experts are kept from a sparse layer's
forward to its backward as this rank's shards, gathered whole inside the grouped GEMM in forward and again in
backward (`distributed.steps.local_kernels.ZeroGather`, `ops.grouped_gemm_layer.StackedGemm`), with the step's
results bit for bit those of the path that handed the GEMM the gathered copies (which it kept until backward).

Both paths run in the same child (`_CHILD`, 2 gloo ranks forked as tests/unit/test_plan_zero3_experts.py's are), one
launch each: the old one is `LocalDispatch._weight` as it was, restored in the child. Bytes are each rank's host
allocator's (`host_memory_stat_current_value`), in its own process: what a forward leaves allocated when it returns,
before its backward, is what autograd keeps (with the loss)."""
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
from bench_scripts import load

from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.planning.memory import Setup, stage_experts

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from launch_helpers import launch  # noqa: E402

# micro-qwen3-moe widened so its experts (48 MiB on a rank, whole) outweigh the rest: 4 sparse layers of 12 MiB
WIDE = {"hidden_size": 128, "intermediate_size": 512, "moe_intermediate_size": 1024, "num_hidden_layers": 4,
        "vocab_size": 2048, "head_dim": 32}

_CHILD = r"""
import json, sys
import numpy as np
from pretrain_cli import runtime
paddle = runtime.import_paddle()
from pretrain_cli.config.parser import parse_config
from pretrain_cli.orchestration.opened import build_model_config
from pretrain_cli.orchestration.targets import launcher_target
from pretrain_cli.config.resolve import resolve
from pretrain_cli.distributed.comms.comm import build_comm
from pretrain_cli.distributed.setup import init_process_group
from pretrain_cli.distributed.layout.topology import Topology
from pretrain_cli.distributed.steps import moe_layouts
from pretrain_cli.training.run import build_model, lay_out
from pretrain_cli.training.step import Step
from pretrain_cli.training.trainer import Trainer


def old_weight(self, w, like):  # the path before: the gathered copy handed to the GEMM, which kept it
    import paddle.distributed as dist
    from paddle.distributed.auto_parallel.api import dtensor_to_local
    from pretrain_cli.distributed.steps.local_kernels import gather_zero

    if not w.is_dist():
        return w
    w = gather_zero(w, self.hook)
    placements = [dist.Partial() if p.is_shard() else dist.Replicate() for p in like.placements[:1]]
    return dtensor_to_local(w, w.process_mesh, placements + list(w.placements[1:]))


if sys.argv[2] == "old":
    moe_layouts.LocalDispatch._weight = old_weight
core = paddle.base.core
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


def _forked_ranks(script, args_path, log_dir, nproc, extra):
    return launch(args_path, log_dir, nproc=nproc, extra=extra, timeout=600, rank_script=script)


def _run(tmp_path, path: str) -> tuple[dict, dict]:
    """{rank: what it printed}, {rank: its parameters' local values after two steps} of `path` ("old", "new")."""
    bench = load("plan_calibration")
    _, args_path = bench._write(tmp_path / path, "moe", "micro-qwen3-moe", WIDE, 2, 128, None, {})
    args = json.loads(args_path.read_text())
    args.update(sharding="stage3", cpu_fused_ops=False, use_flash_attention=False, report_to=["none"])
    args_path.write_text(json.dumps(args))
    child, log_dir = tmp_path / "child.py", tmp_path / f"log_{path}"
    child.write_text(_CHILD)
    out = _forked_ranks(child, args_path, log_dir, 2, [path, tmp_path / path])
    results = {r["rank"]: r for f in sorted(log_dir.glob("workerlog.*"))
               for line in f.read_text(errors="replace").splitlines() if line.startswith("RESULT ")
               for r in [json.loads(line.split("RESULT ", 1)[1])]}
    assert out.returncode == 0 and sorted(results) == [0, 1], out.explain()
    return results, {r: dict(np.load(tmp_path / f"{path}.{r}.npz")) for r in results}


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
