"""What tests/unit/test_zero3_expert_gather.py and test_zero3_expert_ranks.py share: the child's start (its imports,
and `LocalDispatch._weight` as it was before ZeRO-3's gather moved into the grouped GEMM, restored when the child's
second argument is "old"), and one forked launch of a child that prints a `RESULT {json}` line per rank and saves its
parameters' local values to `<its third argument>.<rank>.npz`."""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from launch_helpers import launch  # noqa: E402

START = r"""
import json, sys
import numpy as np
from pretrain_cli import runtime
paddle = runtime.import_paddle()
import paddle.distributed as dist
from pretrain_cli.config.parser import parse_config
from pretrain_cli.orchestration.opened import build_model_config
from pretrain_cli.orchestration.targets import launcher_target
from pretrain_cli.config.resolve import resolve
from pretrain_cli.distributed.comms.comm import build_comm
from pretrain_cli.distributed.setup import init_process_group
from pretrain_cli.distributed.layout.topology import Topology
from pretrain_cli.distributed.steps import moe_layouts
from pretrain_cli.models import moe
from pretrain_cli.training.run import build_model, lay_out
from pretrain_cli.training.step import Step
from pretrain_cli.training.trainer import Trainer


def old_weight(self, w, like):  # the path before: the gathered copy handed to the GEMM, which kept it
    from paddle.distributed.auto_parallel.api import dtensor_to_local
    from pretrain_cli.distributed.steps.local_kernels import gather_zero

    if not w.is_dist():
        return w
    w = gather_zero(w, self.hook)
    placements = [dist.Partial() if p.is_shard() else dist.Replicate() for p in like.placements[:1]]
    return dtensor_to_local(w, w.process_mesh, placements + list(w.placements[1:]))


if sys.argv[2] == "old":
    moe_layouts.LocalDispatch._weight = old_weight
"""


def run_child(body: str, tmp_path: Path, args_path: Path, name: str, path: str, nproc: int) -> tuple[dict, dict]:
    """{rank: its RESULT}, {rank: its parameters' local values} of `START + body` on `nproc` forked ranks, `path`
    ("old", "new") its second argument; every rank must end well and print its RESULT."""
    child, log_dir = tmp_path / "child.py", tmp_path / f"log_{name}"
    child.write_text(START + body)
    out = launch(args_path, log_dir, nproc=nproc, extra=[path, tmp_path / name], timeout=600, rank_script=child)
    results = {r["rank"]: r for f in sorted(log_dir.glob("workerlog.*"))
               for line in f.read_text(errors="replace").splitlines() if line.startswith("RESULT ")
               for r in [json.loads(line.split("RESULT ", 1)[1])]}
    assert out.returncode == 0 and sorted(results) == list(range(nproc)), out.explain()
    return results, {r: dict(np.load(tmp_path / f"{name}.{r}.npz")) for r in results}
