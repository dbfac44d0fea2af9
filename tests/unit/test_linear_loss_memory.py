"""The fused LM head + loss's chunk loop on Paddle's ops (`ops.linear_loss._chunks`, the GPU's path, forced here on
CPU) holds at most two head-gradient-sized fp32 buffers, whatever the number of chunks: dW and the chunk's product
about to be added to it. Three were alive from the third chunk on (the previous chunk's product still bound while the
next was made): `vocab × hidden × 4` bytes more than needed, 2.3 GiB at Qwen's head. `planning.activations.
fused_dw_buffers` counts what this measures. Bytes are the host allocator's peak, read in a fresh interpreter: its
count is process-wide, and what other tests leave cached would move it.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

HIDDEN, VOCAB, ROWS = 256, 4096, 16
HEAD = 4 * VOCAB * HIDDEN  # one fp32 dW: 4 MiB
CHUNK = 4 * ROWS * VOCAB  # one chunk of fp32 logits: 256 KiB


def peak_above_start(chunks: int, vocab_major: bool) -> int:
    """Peak allocated bytes of one forward + backward of the chunked path at `chunks` chunks of `ROWS` rows, above
    what was allocated before it (the inputs): run by the test in a fresh interpreter."""
    from pretrain_cli import runtime

    paddle = runtime.import_paddle()
    from paddle.base import core

    from pretrain_cli.ops import linear_loss

    linear_loss.CHUNK_ELEMENTS = {"cpu": ROWS * VOCAB, "gpu": ROWS * VOCAB}
    assert linear_loss.chunk_rows(VOCAB) == ROWS
    paddle.seed(0)
    n = chunks * ROWS
    h = paddle.randn([n, HIDDEN])  # [tokens, hidden]
    w = paddle.randn([VOCAB, HIDDEN] if vocab_major else [HIDDEN, VOCAB]) * 0.05
    h.stop_gradient = w.stop_gradient = False
    labels = paddle.randint(0, VOCAB, [n], dtype="int64")
    start = core.host_memory_stat_current_value("Allocated", 0)
    core.host_memory_stat_reset_peak_value("Allocated", 0)
    linear_loss.linear_cross_entropy_chunked(h, w, labels, -100, vocab_major).backward()
    assert w.grad is not None and h.grad is not None
    return core.host_memory_stat_peak_value("Allocated", 0) - start


@pytest.mark.parametrize("vocab_major", [False, True], ids=["linear", "tied"])
def test_four_chunks_hold_at_most_two_head_sized_buffers(vocab_major):
    """At 4 chunks the peak is two dW-sized buffers, a chunk of logits and dh (+ its gradient), not three dW: the
    old loop's peak was 3 heads + that (~12.6 MiB here), the bound is 2.5 heads (10 MiB)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_linear_loss_memory as t; "
            f"print(json.dumps([t.peak_above_start(c, {vocab_major}) for c in (1, 4)]))")
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    one, four = json.loads(done.stdout.strip().splitlines()[-1])
    assert one >= HEAD  # the measure sees the dW it must hold
    assert four >= 2 * HEAD, four  # dW and the product being added to it
    assert four < 2 * HEAD + HEAD // 2, f"{four / HEAD:.2f} heads at the peak of 4 chunks"
