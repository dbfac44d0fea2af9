"""DeepSeek-V3's multi-token prediction under context parallelism: each token's next token (`models.mtp`).

MTP depth k reads the input and the label k positions on. Under cp a rank holds chunks r and 2C−1−r of every
sequence (`context.chunks_of`), so the next token of a chunk's last position sits on another rank (or, for the
sequence's last chunk, nowhere). The token ids are small (int64 `[bsz, S]`, one value per token where the hidden
states hold `hidden` values), so the rank gathers the cp group's ids, puts the whole sequence together, shifts it
as one process does (`models.mtp.shift_left`: `fill` past the end) and keeps the positions it holds: the kernel
table's `next_tokens` (`context.context_kernels`). One small all-gather per depth and per field, no gradient (ids
and labels have none).
"""
from __future__ import annotations

import numpy as np
import paddle


class NextTokens:
    """`(t [bsz, S / C] int64, fill) ->` this rank's positions of the whole sequence shifted left by one, `fill` past
    its end: what `models.mtp.shift_left` gives one process, cut as the batch is. `exchange`: the rank's
    `RingExchange` (`ranks` in cp order, `group` the cp group, whose all-gather returns its members in ascending
    global rank: Paddle's `new_group` sorts them); `positions(seq_len, cp, cp_rank)`: the global positions a cp rank
    holds, in its order (`context.local_positions`, passed in: that module builds this one)."""

    def __init__(self, cp: int, cp_rank: int, exchange, positions):
        self.cp, self.cp_rank, self.group, self.positions = cp, cp_rank, exchange.group, positions
        self.coords = [exchange.ranks.index(g) for g in sorted(exchange.ranks)]  # gathered i -> its cp coordinate
        self._columns: dict = {}

    def columns(self, length: int):
        """int64 (`order` `[S]`: the gathered columns in sequence order, `nexts` `[length]`: the position after
        each of this rank's tokens, S meaning past the end), made once per length."""
        if length not in self._columns:
            from pretrain_cli.ops.tensors import from_numpy

            seq_len = length * self.cp
            held = np.concatenate([self.positions(seq_len, self.cp, c) for c in self.coords])  # [S]
            nexts = self.positions(seq_len, self.cp, self.cp_rank) + 1  # [length]
            self._columns[length] = (from_numpy(np.argsort(held).astype(np.int64)), from_numpy(nexts))
        return self._columns[length]

    def __call__(self, t, fill):
        import paddle.distributed as dist

        parts: list = []
        dist.all_gather(parts, t.contiguous(), group=self.group)  # C x [bsz, S / C]
        order, nexts = self.columns(t.shape[1])
        whole = paddle.index_select(paddle.concat(parts, axis=1), order, axis=1)  # [bsz, S] in sequence order
        pad = paddle.full([t.shape[0], 1], fill, dtype=t.dtype)
        return paddle.index_select(paddle.concat([whole, pad], axis=1), nexts, axis=1)  # [bsz, S + 1] -> [bsz, S / C]
