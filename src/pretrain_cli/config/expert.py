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
                  problems: Problems, asked: int | None = None) -> int:
    """`expert_parallel_degree` as `distributed.steps.expert_parallel` runs it, for a layout of `data_ranks` (dp ×
    sharding) data ranks; 1 when off or refused (every problem named). `asked`: the degree asked for where the key
    does not state it (`paddlenlp_expert_parallel`'s)."""
    ep = max(args.training.expert_parallel_degree if asked is None else asked, 1)  # -1, 0 and 1 all mean off
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


def paddlenlp_expert_parallel(args, model_cfg, world: int, data_ranks: int, dp: int, stage: int, refused,
                              notes: list) -> int:
    """The expert-parallel degree PaddleNLP's `use_expert_parallel: true` asks for where the file states no
    `expert_parallel_degree`, or 1, with one note either way. PaddleNLP's MoELayer (its default `moe_group: data`)
    spreads the experts over fleet's data-parallel group, expert parallelism of the dp degree (world / (tp x pp x
    sharding x sep)); the key was a note that it has no effect, and the run held every expert on every rank. Here
    the same degree, `dp` (of `data_ranks`, dp x sharding), where this layout runs it (`refused(ep)`: the line of a
    `config.refusals` row an expert degree adds, or None); else the note says why, and which degree or key runs."""
    value = args.extra.get("use_expert_parallel")
    if value is None or str(value).strip().lower() in ("false", "f", "no", "n", "0", "off"):
        return 1
    key, experts = "use_expert_parallel: true", model_cfg.num_experts
    if not model_cfg.expert_layers:
        notes.append(f"{key} has no effect: {model_cfg.model_type} has no experts")
        return 1
    if "expert_parallel_degree" in args.explicit:  # the file's degree decides (`expert_degree`)
        if max(args.training.expert_parallel_degree, 1) == 1:
            notes.append(f"{key} has no effect: expert_parallel_degree: {args.training.expert_parallel_degree} keeps "
                         f"every expert on every rank (PaddleNLP spreads them over its data-parallel group; remove "
                         f"that key to do so here)")
        return 1
    if world == 1:
        notes.append(f"{key} has no effect on one process; on more, the experts are spread over the data-parallel "
                     f"ranks, as PaddleNLP spreads them (expert_parallel_degree = the dp degree)")
        return 1
    dropping = args.model.capacity_factor > 0
    why = (": tp x pp x cp take every process" if data_ranks == 1 else
           f": the sharding group takes the {data_ranks} data ranks" if dp == 1 else
           f", which does not divide num_experts ({experts})" if experts % dp else
           f", while capacity_factor {args.model.capacity_factor} drops tokens and expert parallelism here runs "
           f"dropless" if dropping else f", which this layout does not run: {refused(dp)}" if refused(dp) else "")
    if not why:
        notes.append(f"{key}: the experts are spread over the {dp} data-parallel ranks (expert_parallel_degree {dp}), "
                     f"as PaddleNLP's MoELayer spreads them over its data-parallel group (moe_group 'data'); set "
                     f"expert_parallel_degree to choose another degree")
        return dp
    runs = [e for e in range(data_ranks, 1, -1) if data_ranks % e == 0 and experts % e == 0 and not refused(e)]
    what = ("set capacity_factor: 0 to spread them so" if dropping else
            f"set expert_parallel_degree: {runs[0]} (a divisor of num_experts {experts} and the {data_ranks} data "
            f"ranks) to spread them here" if runs else
            f"no expert_parallel_degree runs with this layout's sharding: stage{stage} here (`check` with one says "
            f"why)" if stage else f"no degree above 1 divides both num_experts ({experts}) and the "
            f"{count(data_ranks, 'data rank')}")
    notes.append(f"{key} has no effect here: PaddleNLP spreads the experts over its data-parallel group "
                 f"(expert_parallel_degree = its dp degree, {dp} here{why}); {what}")
    return 1
