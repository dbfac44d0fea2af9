"""The all-to-all dispatcher (distributed/steps/expert_all_to_all.py) over the collectives backend's gloo form of
`all_to_all_single` (padded rows all-gathered, then sliced) equals `GatherDispatch` and one process: outputs, the
tokens', combine weights' and experts' gradients, the counts — for an expert group of 2 ranks run as two threads of
this process (the backend's all-gather between them: no launch), with skewed routing so the split sizes are
uneven, and with every token of one rank going to the other rank's experts (a rank that receives no row).

Threads, not processes: Paddle's eager autograd runs per thread, and the two "ranks" meet only in the fake
backend's all-gather (a barrier), so this checks the routing and split arithmetic, the reverse all-to-all of
the backward, and that both ranks run the same collectives; NCCL's `alltoall_single` itself runs on a GPU only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.config.presets import PRESET_DIR  # noqa: E402
from pretrain_cli.distributed.comms.collectives import Collectives  # noqa: E402
from pretrain_cli.distributed.steps.expert_all_to_all import AllToAllDispatch  # noqa: E402
from pretrain_cli.distributed.steps.expert_parallel import GatherDispatch, held_range, keep_held  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from thread_ranks import Hub  # noqa: E402
from pretrain_cli.models.moe import Routing, dispatch_local  # noqa: E402
from pretrain_cli.models.moe_loss import sparse_blocks  # noqa: E402
from pretrain_cli.ops import kernels  # noqa: E402
from pretrain_cli.run_config import MoeConfig  # noqa: E402

EXPERTS, TOP_K, TOKENS, HIDDEN = 6, 2, 8, 8  # TOKENS: each rank's


@dataclass(frozen=True)
class ThreadRanks(Collectives):
    """The gloo backend (its emulated all-to-all and all other code as in a run) with the group's all-gather and
    reduce-scatter between threads of this process instead of gloo's processes."""

    hub: object = None

    def all_gather(self, x, group, axis: int):
        return paddle.concat([paddle.to_tensor(p) for p in self.hub.exchange(x)], axis=axis)

    def reduce_scatter(self, x, group, parts: int, index: int, axis: int):
        total = paddle.to_tensor(np.sum(self.hub.exchange(x), axis=0))
        size = total.shape[axis] // parts
        return paddle.slice(total, axes=[axis], starts=[index * size], ends=[(index + 1) * size])


def _block():
    """A micro Qwen3-MoE sparse block of EXPERTS experts, the same weights every call."""
    preset = json.loads((PRESET_DIR / "micro-qwen3-moe" / "config.json").read_text())
    cfg = ModelConfig.from_dict({**preset, "num_experts": EXPERTS, "num_experts_per_tok": TOP_K, "hidden_size": HIDDEN,
                                 "moe_intermediate_size": 6, "num_attention_heads": 2, "num_key_value_heads": 1,
                                 "head_dim": 4})
    block = sparse_blocks(build_model(cfg, kernels.select(None, "cpu"), MoeConfig()))[0]
    rng = np.random.default_rng(1)  # weights of order 1 (the init's 0.02 would leave outputs near the tolerance)
    for p in block.experts.parameters():
        p.set_value(rng.standard_normal(p.shape).astype("float32") * 0.5)
    return block


def _grads(block) -> dict:
    return {n: p.grad.numpy() for n, p in block.experts.named_parameters()}


def _one_process(x, indices, weights):
    """Both ranks' tokens on one device: (out, dx, dweights, expert gradients by name)."""
    block = _block()
    xt, wt = paddle.to_tensor(x, stop_gradient=False), paddle.to_tensor(weights, stop_gradient=False)
    out, _, _ = dispatch_local(xt, Routing(None, None, paddle.to_tensor(indices), wt), block.experts, EXPERTS)
    (out * paddle.to_tensor(_probe(out.shape))).sum().backward()
    return out.numpy(), xt.grad.numpy(), wt.grad.numpy(), _grads(block)


def _probe(shape):
    return np.random.default_rng(5).standard_normal(shape).astype("float32")  # a loss that weighs every output


def _two_ranks(kind, x, indices, weights):
    """The same tokens split over an expert group of 2 thread-ranks (rank r: tokens r·T/2 …, experts r·E/2 …), each
    dispatching with `kind`; the results joined as one process's."""
    hub, half = Hub(2), TOKENS
    results = {}

    blocks = [_block() for _ in range(2)]  # built here: the threads would share Paddle's one random generator
    for r, block in enumerate(blocks):
        keep_held(paddle.nn.LayerList([block]), held_range(EXPERTS, 2, r))

    def rank(r):
        block = blocks[r]
        rows = slice(r * half, (r + 1) * half)
        xt = paddle.to_tensor(x[rows], stop_gradient=False)
        wt = paddle.to_tensor(weights[rows], stop_gradient=False)
        dispatch = kind(None, 2, r, ThreadRanks(gloo=True, hub=hub))
        out, counts, _ = dispatch(xt, Routing(None, None, paddle.to_tensor(indices[rows]), wt), block.experts,
                                  EXPERTS)
        (out * paddle.to_tensor(_probe((2 * half, HIDDEN))[rows])).sum().backward()
        results[r] = out.numpy(), xt.grad.numpy(), wt.grad.numpy(), _grads(block), counts.numpy()

    hub.run(rank)
    joined = [np.concatenate([results[r][i] for r in range(2)]) for i in range(3)]
    return (*joined, {**results[0][3], **results[1][3]}, [results[r][4] for r in range(2)])


def _routing(skewed_to_rank1: bool):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2 * TOKENS, HIDDEN)).astype("float32")
    indices = np.stack([rng.permutation(EXPERTS)[:TOP_K] for _ in range(2 * TOKENS)])  # [2T, top_k]
    indices[:5, 0] = 0  # uneven split sizes: expert 0 (rank 0's) busy
    if skewed_to_rank1:  # every assignment of rank 0's tokens to rank 1's experts (3-5): rank 0 receives none
        indices[:TOKENS] = np.stack([rng.permutation([3, 4, 5])[:TOP_K] for _ in range(TOKENS)])
        indices[TOKENS:] = np.stack([rng.permutation([3, 4, 5])[:TOP_K] for _ in range(TOKENS)])
    weights = rng.random((2 * TOKENS, TOP_K)).astype("float32")
    return x, indices, weights


@pytest.mark.parametrize("skewed", [False, True], ids=["uneven", "a_rank_receives_nothing"])
def test_all_to_all_dispatch_equals_the_all_gather_dispatch_and_one_process(skewed):
    x, indices, weights = _routing(skewed)
    want = _one_process(x, indices, weights)
    gathered = _two_ranks(GatherDispatch, x, indices, weights)
    got = _two_ranks(AllToAllDispatch, x, indices, weights)
    for name, a, b, c in zip(("out", "dx", "dweights"), got[:3], gathered[:3], want[:3]):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)
    assert sorted(got[3]) == sorted(want[3])  # every expert's parameters, each held by one rank
    for name, g in want[3].items():
        np.testing.assert_allclose(got[3][name], g, rtol=1e-5, atol=1e-6, err_msg=name)
    for r, counts in enumerate(got[4]):  # each rank's own tokens' counts, as GatherDispatch reports them
        np.testing.assert_array_equal(counts, np.bincount(indices[r * TOKENS:(r + 1) * TOKENS].reshape(-1),
                                                          minlength=EXPERTS))
    if skewed:  # rank 0's experts got no row: their gradients are zeros, not missing
        assert all(not got[3][n].any() for n in got[3] if ".0." in n or ".1." in n or ".2." in n)


def test_the_emulated_all_to_all_single_sends_each_block_to_its_rank():
    """Uneven split sizes, an empty block, a rank sending nothing: rank me gets matrix[j][me] rows from each j."""
    hub, out = Hub(2), {}
    matrix = [[1, 3], [0, 0]]  # rank 0 keeps 1 row and sends 3 to rank 1; rank 1 sends none
    data = {0: np.arange(8, dtype="float32").reshape(4, 2), 1: np.zeros((0, 2), "float32")}

    def rank(r):
        out[r] = ThreadRanks(gloo=True, hub=hub).all_to_all_single(paddle.to_tensor(data[r]), matrix, r, None).numpy()

    hub.run(rank)
    np.testing.assert_array_equal(out[0], data[0][:1])
    np.testing.assert_array_equal(out[1], data[0][1:])
    assert not ThreadRanks(gloo=True).all_to_all_dispatch and Collectives(gloo=False).all_to_all_dispatch
