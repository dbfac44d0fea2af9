"""The expert-parallel key (`expert_parallel_degree`): which layouts `distributed.steps.expert_parallel` runs.

Expert parallelism spreads a Mixture-of-Experts model's routed experts over groups of `ep` data ranks (PaddleNLP's
`moe_group: data`, torchtitan's borrowing of the data ranks): each rank holds num_experts / ep of every sparse
layer's experts and the tokens routed to them are sent to it. It runs on the data ranks (of each pipeline stage), with
the rest of the model data-parallel or under fleet's ZeRO-1 (`sharding: stage1`; the experts' gradients reduced
over the ranks holding the same experts and their AdamW state kept whole, `distributed.strategies.expert_strategy`),
inside a pipeline, with tensor parallelism, or with both (the data ranks of each stage and tp position; the experts
also cut by the `tp` step), there also under fleet's ZeRO-2 (`sharding: stage2`: ZeRO-1 releasing the rest's gradients
a rank does not own), and with context parallelism (each cp position's data ranks one expert group, the experts'
holders at every cp position; ZeRO-1/2 fleet's); the products with the other engines, which place the weights
themselves, and with both a pipeline and cp, are `config.refusals`' ep rows.
"""
from __future__ import annotations

import math

from pretrain_cli.counts import count
from pretrain_cli.errors import Problems


def _more_ranks(ep: int, data_ranks: int, tp: int, pp: int, cp: int) -> str:
    """Both ways out of an `ep` the data ranks do not divide: more processes (the fewest whose data ranks it
    divides, the other axes kept), which is what a file written for more processes needs, or a smaller degree."""
    ranks = math.lcm(data_ranks, ep)
    world = ranks * tp * pp * cp
    axes = "".join(f" x {n} {d}" for n, d in (("tp", tp), ("pp", pp), ("cp", cp)) if d > 1)
    smaller = "remove the key (1: off)" if data_ranks == 1 else f"use a divisor of {data_ranks} (1: off)"
    return (f"does not divide the {count(data_ranks, 'data rank')} (dp x sharding) it is drawn from; run it on "
            f"{count(world, 'process')} ({count(ranks, 'data rank')}{axes}: `check --world_size {world}`, "
            f"`NPROC={world} scripts/launch.sh` on CPU), or {smaller}")


def expert_degree(args, model_cfg, data_ranks: int, tp: int, pp: int, cp: int, stage: int,
                  problems: Problems) -> int:
    """`expert_parallel_degree` as `distributed.steps.expert_parallel` runs it, for a layout of `data_ranks` (dp ×
    sharding) data ranks; 1 when off or refused (every problem named)."""
    ep = max(args.training.expert_parallel_degree, 1)  # -1, 0 and 1 all mean off
    if ep == 1:
        return 1
    experts = model_cfg.num_experts
    # whether any layer holds them (an MTP module's layer counts): a DeepSeek with first_k_dense_replace past its
    # layers has num_experts but none to split
    held = bool(model_cfg.expert_layers)
    for bad, why in ((not held, f"needs a Mixture-of-Experts model (num_experts in config.json); "
                      f"{model_cfg.model_type} has no experts" + (" in any layer (first_k_dense_replace, "
                      "decoder_sparse_step or mlp_only_layers make every layer dense)" if experts else "")
                      + ": remove the key"),
                     (experts and experts % ep, f"does not divide num_experts ({experts}); use a divisor of it"),
                     (data_ranks % ep, _more_ranks(ep, data_ranks, tp, pp, cp)),
                     (cp > 1 and tp > 1 or stage == 3 or stage == 2 and tp == pp == cp == 1,
                      ""),  # config.refusals' ep rows
                     (args.model.capacity_factor > 0, "runs dropless (each rank sees its expert group's tokens, not "
                      "the batch a capacity is counted over): set capacity_factor to 0")):
        if bad:
            if why:
                problems.add(f"expert_parallel_degree: {ep} {why}")
            return 1
    return ep
