"""Run by test_context.py under the launcher (2, 3 or 4 processes): context-parallel attention on each rank's chunks
against `attention_math` on the whole sequence, forward and backward (dQ, dK, dV), causal and document-masked,
GQA, with one query tile per chunk and with tiles of 5 rows (a diagonal tile: the keys before it as a full block,
its square diagonal causal). Prints one JSON line per case: the largest differences, the shapes of the tensors the
attention sent and how many collectives it ran."""
import json

import numpy as np

from pretrain_cli import runtime

paddle = runtime.import_paddle()
import paddle.distributed as dist  # noqa: E402

from pretrain_cli.distributed.steps.context import context_attention, cp_group, shard_sequence  # noqa: E402
from pretrain_cli.ops.attention import attention_math  # noqa: E402
from pretrain_cli.ops.block_attention import block_forward  # noqa: E402
from pretrain_cli.run_layout import ParallelConfig  # noqa: E402

dist.init_parallel_env()
rank, world = dist.get_rank(), dist.get_world_size()
ring = cp_group(ParallelConfig(world_size=world, rank=rank, cp_degree=world))  # gloo: the CPU exchange
rng = np.random.default_rng(0)
b, S, nh, nkv, d = 2, 36 if world == 3 else 32, 4, 2, 8  # S divisible by 2 x world (2, 3 or 4 ranks)
q, do = (rng.standard_normal((b, S, nh, d)).astype("float32") for _ in range(2))
k, v = (rng.standard_normal((b, S, nkv, d)).astype("float32") for _ in range(2))
doc_start = np.zeros((b, S), np.int64)
for row, starts in enumerate([[0, 5, 17, 30], [0, 11, 12]]):  # documents crossing chunk boundaries
    for s0 in starts:
        doc_start[row, s0:] = s0


def mine(t):
    return shard_sequence(paddle.to_tensor(t) if isinstance(t, np.ndarray) else t, world, rank).numpy()


traffic: dict = {"sends": [], "collectives": 0}  # what the attention calls exchange, per case


def _counted(name, real):
    def call(tensor, *args, **kwargs):
        if name == "send":
            traffic["sends"].append(list(tensor.shape))
        else:
            traffic["collectives"] += 1
        return real(tensor, *args, **kwargs)
    return call


for _name in ("send", "all_gather", "all_reduce", "broadcast", "reduce_scatter", "alltoall"):
    setattr(dist, _name, _counted(_name, getattr(dist, _name)))

for tile in (1024, 5):
    causal, document = context_attention(ring, world, rank, block_forward, tile)
    for masked in (False, True):
        whole = [paddle.to_tensor(a, stop_gradient=False) for a in (q, k, v)]
        ref = attention_math(*whole, paddle.to_tensor(doc_start) if masked else None)
        (ref * paddle.to_tensor(do)).sum().backward()
        local = [paddle.to_tensor(mine(a), stop_gradient=False) for a in (q, k, v)]
        traffic["sends"], traffic["collectives"] = [], 0
        out = document(*local, paddle.to_tensor(mine(doc_start))) if masked else causal(*local)
        (out * paddle.to_tensor(mine(do))).sum().backward()
        diffs = [float(np.abs(out.numpy() - mine(ref)).max())]
        diffs += [float(np.abs(lo.grad.numpy() - mine(wh.grad)).max()) for lo, wh in zip(local, whole)]
        print(json.dumps({"rank": rank, "tile": tile, "document": masked, "out_dq_dk_dv": diffs, **traffic}),
              flush=True)

# the collectives backend's gloo reduce-scatter (distributed/comms/collectives.py) on the same ranks: an all-reduce
# and a slice
from pretrain_cli.distributed.comms.collectives import for_device  # noqa: E402

backend = for_device("cpu")
send = [np.arange(world * 2 * 3, dtype="float32").reshape(world * 2, 3) + 1000 * r for r in range(world)]  # [2w, 3]
scattered = backend.reduce_scatter(paddle.to_tensor(send[rank]), ring.group, world, rank, 0).numpy()
print(json.dumps({"rank": rank, "reduce_scatter": float(np.abs(scattered - sum(send)[rank * 2:(rank + 1) * 2]).max())}),
      flush=True)

# leave as a launched rank of the product does (`runtime.end_process`, what `cli.main` calls): gloo's native
# teardown at interpreter exit can die with SIGSEGV after everything above was printed (a fresh-clone run's cp4
# failure, exit -11 with every rank's lines complete)
runtime.end_process(0)
