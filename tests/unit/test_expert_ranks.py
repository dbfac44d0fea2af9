"""An expert_parallel_degree the data ranks do not divide: the line names both ways out, the processes that run it
(the fewest whose data ranks it divides, the other axes kept) and a smaller degree; it said 'use a divisor of them'
of 1 data rank, where the fix for a file written for more processes is more processes."""
import pytest

from run_helpers import resolve_run
from pretrain_cli.errors import UserError


def test_tp_2_on_2_processes_needs_4():
    with pytest.raises(UserError) as e:
        resolve_run("--expert_parallel_degree", "2", "--tensor_parallel_degree", "2", world=2, model="micro-qwen3-moe")
    assert ("expert_parallel_degree: 2 does not divide the 1 data rank (dp x sharding) it is drawn from; run it on 4 "
            "processes (2 data ranks x tp 2: `check --world_size 4`, `NPROC=4 scripts/launch.sh` on CPU), or remove "
            "the key (1: off)") in str(e.value), str(e.value)


def test_ep_4_on_6_data_ranks_needs_12_or_a_divisor():
    with pytest.raises(UserError, match=r"does not divide the 6 data ranks .* run it on 12 processes \(12 data ranks: "
                                        r"`check --world_size 12`.*or use a divisor of 6 \(1: off\)"):
        resolve_run("--expert_parallel_degree", "4", world=6, model="micro-qwen3-moe")
