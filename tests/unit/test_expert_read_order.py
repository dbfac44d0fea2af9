"""Under the semi-auto engine every data rank runs the grouped experts on its own tokens (`moe_layouts.LocalDispatch`),
so its counts differ from the other ranks'; the experts' GEMMs must still read every expert's weights in the same
calls and order on every rank (`local_kernels._same_graph`). Under ZeRO-3 each weight a GEMM reads is gathered
there, in forward and again in backward (`grouped_gemm_layer.Gathered`): a rank that skipped an expert without
rows, or took the per-expert segments where another took the padded GEMMs, would issue other collectives than the
others and hang them. Both kernel tables' grouped path, in fp32 and in fp16 (the GPU's grouped GEMM has no fp16
kernel and falls back to a CPU path), with `stacked_gemm` recorded instead of run (no GPU here)."""
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.distributed.steps.local_kernels import _same_graph  # noqa: E402
from pretrain_cli.ops import grouped_gemm_layer  # noqa: E402
from pretrain_cli.ops.grouped import grouped_mlp_cpu, grouped_mlp_gpu  # noqa: E402

HIDDEN, INTER, EXPERTS = 8, 4, 4
# rank 0's tokens reach no row of expert 0 (the segments' choice on one process), rank 1's every expert
COUNTS = ([0, 4, 2, 2], [3, 1, 2, 2], [2, 2, 2, 2])


def _reads(grouped_mlp, counts, dtype, monkeypatch) -> list[list[str]]:
    """The weights each `stacked_gemm` call of one layer reads, in order ("0g": expert 0's gate)."""
    ws = [(paddle.zeros([HIDDEN, INTER]), paddle.zeros([HIDDEN, INTER]), paddle.zeros([INTER, HIDDEN]))
          for _ in range(EXPERTS)]
    label = {id(t): f"{e}{role}" for e, trip in enumerate(ws) for role, t in zip("gud", trip)}
    calls = []

    def recorded(x, product, weights, pieces, stack=True):
        calls.append([label[id(w)] for w in weights])
        return paddle.zeros([*x.shape[:-1], pieces * weights[0].shape[-1]], dtype=x.dtype)  # [..., Σ out_p]

    monkeypatch.setattr(grouped_gemm_layer, "stacked_gemm", recorded)
    # (no fp16 scatter or gather kernel on CPU: the padded path's row moves run in fp32)
    scatter, gather = paddle.scatter, paddle.gather
    monkeypatch.setattr(paddle, "scatter", lambda a, i, u, overwrite=True: scatter(
        a.astype("float32"), i, u.astype("float32"), overwrite=overwrite).astype(a.dtype))
    monkeypatch.setattr(paddle, "gather", lambda a, i: gather(a.astype("float32"), i).astype(a.dtype))
    x = paddle.ones([sum(counts), HIDDEN], dtype=dtype)  # [rows, hidden]
    _same_graph(grouped_mlp)(x, counts, ws, lambda h: h[..., :h.shape[-1] // 2])  # [..., inter]
    return calls


@pytest.mark.parametrize("grouped_mlp,dtype", [(grouped_mlp_cpu, "float32"), (grouped_mlp_gpu, "float32"),
                                                (grouped_mlp_gpu, "float16")])
def test_every_rank_reads_every_expert_in_the_same_calls(grouped_mlp, dtype, monkeypatch):
    reads = [_reads(grouped_mlp, counts, dtype, monkeypatch) for counts in COUNTS]
    every = sorted(f"{e}{role}" for e in range(EXPERTS) for role in "gud")
    assert sorted(w for call in reads[0] for w in call) == every, reads[0]
    assert reads[1] == reads[0] and reads[2] == reads[0], reads
