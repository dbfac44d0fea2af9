"""Where in a training step a parallel layout's allocator peak is, to attribute a plan's error to tensors.

The layout child of `plan_calibration.py --layouts` (the same model, build order and second `train_step`), with the
allocator read at checkpoints and its peak reset after each: every sublayer's forward (pre and post), the fused
head + loss's start, each chunk (before and after its gradient GEMMs) and end, each gradient hook of the gloo
all-reduce (`comms.collectives.to_replicated`, before and after) and each parameter's gradient. Printed per rank:
what it holds between steps, then the checkpoints around the largest peaks (MiB above that, `cur` when the checkpoint
ran, `peak` since the one before). `--chunks` measures the fused head + loss alone (Paddle's ops, the GPU path) at
llama-52m's head for 1, 2, 3 and 4 chunks of rows: the dW-sized buffers its loop holds.

    python benchmarks/plan_phases.py '{"sharding": "stage2", "use_fused_linear_cross_entropy": false,
                                       "per_device_train_batch_size": 1, "max_seq_length": 64}'
    python benchmarks/plan_phases.py '{"nproc": 4, "sharding": "stage3"}'
    python benchmarks/plan_phases.py --chunks
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plan_calibration as calibration  # noqa: E402

_HOOKS = r"""
import pretrain_cli.distributed.comms.collectives as coll
import pretrain_cli.distributed.steps.local_kernels as lk
import pretrain_cli.ops.linear_loss as ll
REC, ON, B0 = [], [False], [0]
def cp(label):
    if ON[0]:
        cur, pk = core.host_memory_stat_current_value("Allocated", 0), core.host_memory_stat_peak_value("Allocated", 0)
        REC.append((label, (cur - B0[0]) / 2**20, (pk - B0[0]) / 2**20))
        core.host_memory_stat_reset_peak_value("Allocated", 0)
def wrap(f, before, after):
    def run(*a, **k):
        cp(before(*a))
        out = f(*a, **k)
        cp(after(*a))
        return out
    return run
lk.to_replicated = coll.to_replicated = wrap(coll.to_replicated, lambda g: f"hook.before {list(g.shape)}",
                                             lambda g: f"hook.after {list(g.shape)}")
ll._grad_gemms = wrap(ll._grad_gemms, lambda *a: "lce.chunk.pre", lambda *a: "lce.chunk.gemms")
ll._chunks = wrap(ll._chunks, lambda *a: "lce.start", lambda *a: "lce.end")
"""
_INSTRUMENT = r"""
for name, layer in trainer.model.named_sublayers():
    if name.count(".") <= 3:
        layer.register_forward_pre_hook(lambda l, i, n=name: cp("fwd.pre " + n))
        layer.register_forward_post_hook(lambda l, i, o, n=name: cp("fwd.post " + n))
for name, p in trainer.model.named_parameters():
    if not p.stop_gradient:
        p.register_hook(lambda g, n=name: cp("grad " + n))
"""


def _child() -> str:
    """The calibration's layout child with the checkpoints: hooks installed before the run is built, the second
    step recorded above what a rank holds after the first."""
    c = calibration._LAYOUT_CHILD
    c = c.replace("args = parse_config(", "core = paddle.base.core\n" + _HOOKS + "args = parse_config(", 1)
    c = c.replace("trainer.model.train()\n", "trainer.model.train()\n" + _INSTRUMENT, 1)
    c = c.replace('core.host_memory_stat_reset_peak_value("Allocated", 0)\ntrainer.train_step(it)\n',
                  'B0[0] = core.host_memory_stat_current_value("Allocated", 0)\n'
                  'core.host_memory_stat_reset_peak_value("Allocated", 0)\nON[0] = True\ntrainer.train_step(it)\n'
                  'cp("end")\nON[0] = False\n', 1)
    c = c.replace('"stage": Topology.of(run.parallel).stage}', '"stage": Topology.of(run.parallel).stage, '
                  '"held": (B0[0] - base) / 2**20, "rec": REC}', 1)
    assert c.count("cp(") >= 3 and '"rec": REC' in c, "plan_calibration's layout child changed: update the hooks"
    return c


def phases(keys: dict, model: dict = calibration.LLAMA_52M, show: int = 6) -> list[dict]:
    nproc = keys.pop("nproc", 2)
    with tempfile.TemporaryDirectory() as d:
        _, args_path = calibration._write(Path(d), "m", "tiny-llama", model, 2, 256, None, {})
        args = json.loads(args_path.read_text())
        args.update(keys, cpu_fused_ops=False, use_flash_attention=False, report_to=["none"])
        args_path.write_text(json.dumps(args))
        (Path(d) / "child.py").write_text(_child())
        saved, calibration._LAYOUT_CHILD = calibration._LAYOUT_CHILD, _child()
        try:
            ranks = calibration.measure_ranks(args_path, nproc, Path(d) / "log")
        finally:
            calibration._LAYOUT_CHILD = saved
    for r in ranks:
        rec = r["rec"]
        top = max(peak for _, _, peak in rec)  # (the child's own peak reads the last checkpoint's)
        print(f"rank peak {r['held'] + top:.1f} MiB: held between steps {r['held']:.1f}, the step {top:.1f} above")
        for i in sorted(sorted(range(len(rec)), key=lambda i: -rec[i][2])[:show]):
            print(f"  {rec[i - 1][0] if i else 'start'} -> {rec[i][0]}: cur {rec[i][1]:.1f} peak {rec[i][2]:.1f}")
    return ranks


def chunks(hidden: int = 512, vocab: int = 32000) -> None:
    from pretrain_cli import runtime

    paddle = runtime.import_paddle()
    from pretrain_cli.ops.linear_loss import chunk_rows, linear_cross_entropy_chunked

    core, rows = paddle.base.core, chunk_rows(vocab)
    w = paddle.randn([hidden, vocab])
    w.stop_gradient = False
    for n in (1, 2, 3, 4):
        h = paddle.randn([n * rows, hidden])  # [tokens, hidden]
        h.stop_gradient = False
        labels = paddle.randint(0, vocab, [n * rows], dtype="int64")
        start = core.host_memory_stat_current_value("Allocated", 0)
        core.host_memory_stat_reset_peak_value("Allocated", 0)
        loss = linear_cross_entropy_chunked(h, w, labels, -100, False)
        above = core.host_memory_stat_peak_value("Allocated", 0) - start
        heads = (above - rows * vocab * 4 - n * rows * hidden * 4) / (4 * hidden * vocab)
        print(f"{n} chunks of {rows} rows: peak {above / 2**20:.1f} MiB = {heads:.2f} dW + a chunk + dh")
        del loss, h


if __name__ == "__main__":
    if sys.argv[1:] == ["--chunks"]:
        chunks()
    else:
        phases(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
