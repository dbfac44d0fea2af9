"""ZeRO-3 on the semi-auto engine with every parameter created as its shard (`CreatedSharded`), so no rank ever
holds a whole one. Imported by `semi_auto.SemiAuto.wrap` only, after the environment is set (Paddle at the top)."""
from __future__ import annotations

import paddle.distributed as dist
from paddle.distributed.auto_parallel.sharding import get_placement_with_sharding

from pretrain_cli.distributed.layout.materialize import fill_placed, pending


class CreatedSharded(dist.ShardingStage3):
    """`dist.ShardingStage3` over `axis` of `mesh` whose parameter sharding creates a lazily built parameter directly
    as this rank's dp shard (the placements its own rule, `get_placement_with_sharding`, gives), its values read from
    `source` under the parameter's name (`names`: id -> HF name, taken at `place`); a parameter with storage is
    sharded as Paddle does."""

    def __init__(self, axis, mesh, source, names: dict, rank: int):
        super().__init__(axis, mesh)
        self._created_from, self._created_names, self._created_rank = source, names, rank

    def _shard_parameter(self, param):
        if not (param.is_dist() and pending(param)):
            return super()._shard_parameter(param)
        placements = get_placement_with_sharding(param, self._sharding_axis)
        fill_placed(self._created_names[id(param)], param, self._created_from, param.process_mesh, placements,
                    self._created_rank)
