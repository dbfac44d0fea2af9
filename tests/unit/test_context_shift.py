"""Multi-token prediction's next tokens under context parallelism (distributed/steps/context_shift.py) in one
process: every cp rank's `NextTokens` over the other ranks' chunks (the all-gather answered from the whole batch)
gives that rank's chunks of the whole sequence shifted as `models.mtp.shift_left` shifts it, for any cp degree,
any depth and cp groups whose global ranks are not in cp order. Training under cp: tests/distributed/test_mtp_context.py."""
import numpy as np
import pytest


class _Exchange:
    def __init__(self, ranks):
        self.ranks, self.group = ranks, object()


@pytest.mark.parametrize("cp,ranks", [(2, [0, 1]), (2, [3, 1]), (4, [0, 1, 2, 3]), (4, [6, 2, 7, 0])])
def test_each_rank_gets_its_chunks_of_the_whole_sequences_shift(monkeypatch, cp, ranks):
    from pretrain_cli import runtime

    paddle = runtime.import_paddle()
    import paddle.distributed as dist

    from pretrain_cli.distributed.steps.context import local_positions, shard_sequence
    from pretrain_cli.distributed.steps.context_shift import NextTokens
    from pretrain_cli.models.mtp import shift_left

    seq_len = 8 * cp
    whole = paddle.to_tensor(np.random.default_rng(cp).integers(0, 500, (3, seq_len)).astype(np.int64))  # [3, S]
    ids = {}  # global rank -> what that cp rank holds at the current depth

    def all_gather(out, tensor, group=None):  # the cp group's members in ascending global rank, as Paddle's
        out.extend(ids[g] for g in sorted(ranks))

    monkeypatch.setattr(dist, "all_gather", all_gather)
    shifts = [NextTokens(cp, r, _Exchange(ranks), local_positions) for r in range(cp)]
    want = whole
    ids = {g: shard_sequence(whole, cp, r) for r, g in enumerate(ranks)}
    for depth in range(3):  # depth k reads the token k positions on: each depth shifts the previous one's
        want = shift_left(want, -100)
        got = [shift(ids[g], -100) for shift, g in zip(shifts, ranks)]
        for r, g in enumerate(ranks):
            np.testing.assert_array_equal(got[r].numpy(), shard_sequence(want, cp, r).numpy(), err_msg=f"depth {depth}")
        ids = dict(zip(ranks, got))
    assert (want.numpy()[:, -3:] == -100).all()  # past the end: the fill
