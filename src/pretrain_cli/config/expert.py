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

import re

from pretrain_cli.config.one_process import least_data_ranks, stated_data_parallel, stated_unmet
from pretrain_cli.config.paddlenlp_keys import FALSE, NOTED_BY_LAYOUT
from pretrain_cli.counts import count
from pretrain_cli.errors import Problems


def _more_ranks(args, data_ranks: int, tp: int, pp: int, cp: int, planned: bool) -> str:
    """Both ways out of an `ep` the data ranks do not divide: more processes, which is what a file written for more
    processes needs, or a smaller degree. The count is `one_process.least_data_ranks`' (the one formula the stated
    data-parallel degree's line and `check` on one process count by): the fewest data ranks, a multiple of these
    (the other axes kept), that also give a stated data_parallel_degree, else the fewest that give it; where none
    does (ep 4 beside a stated 2), the stated key to remove, as its own line says there. The smaller degree only
    where these data ranks give the stated one. `planned`: under `plan`, whose option is `--gpus`. The degree is
    the file's expert_parallel_degree, which `least_data_ranks` reads: the one `paddlenlp_expert_parallel` asks
    for, the dp degree, always divides the dp x sharding data ranks, so it never reaches here."""
    ranks = least_data_ranks(args, of=data_ranks) or least_data_ranks(args)
    stated = stated_data_parallel(args)
    held = ranks is not None
    if not held:
        ranks = least_data_ranks(args, stated=False, of=data_ranks)
    world = ranks * tp * pp * cp
    axes = "".join(f" x {n} {d}" for n, d in (("tp", tp), ("pp", pp), ("cp", cp)) if d > 1)
    how = (f"`plan --gpus {world}`" if planned else
           f"`check --world_size {world}`, `NPROC={world} scripts/launch.sh` on CPU")
    run = f"run it on {count(world, 'process')} ({count(ranks, 'data rank')}{axes}: {how})"
    if not held:
        run = f"remove {' and '.join(k for k, _ in stated)} and {run}"
    smaller = ("" if stated_unmet(args, data_ranks) else "remove the key (1: off)" if data_ranks == 1 else
               f"use a divisor of {data_ranks} (1: off)")
    unheld = "" if held else f", and no process count gives it with {' and '.join(f'{k} {d}' for k, d in stated)}"
    return (f"does not divide the {count(data_ranks, 'data rank')} (dp x sharding) it is drawn from{unheld}; "
            f"{run}{f', or {smaller}' if smaller else ''}")


def expert_degree(args, model_cfg, data_ranks: int, tp: int, pp: int, cp: int, stage: int,
                  problems: Problems, asked: int | None = None, planned: bool = False) -> int:
    """`expert_parallel_degree` as `distributed.steps.expert_parallel` runs it, for a layout of `data_ranks` (dp ×
    sharding) data ranks; 1 when off or refused (every problem named). `asked`: the degree asked for where the key
    does not state it (`paddlenlp_expert_parallel`'s); `planned`: under `plan` (the option its count is named by)."""
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
                     (data_ranks % ep, _more_ranks(args, data_ranks, tp, pp, cp, planned)),
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
    `expert_parallel_degree` (or PaddleNLP's unset default, -1), or 1, with one note either way. Which of PaddleNLP's
    behaviours: its older MoELayer (default `moe_group: data`) spreads the experts over fleet's data-parallel group,
    expert parallelism of the dp degree (world / (tp x pp x sharding x sep)), whatever use_expert_parallel says; its
    newer DeepseekV2MoE uses the `expert` group, sized by `expert_parallel_degree` (its deepseek-v3
    pretrain_argument.json states 4). So a stated degree decides (`expert_degree`), and without one the dp degree is
    MoELayer's; the key was a note that it has no effect, and the run held every expert on every rank. Here the dp
    degree, `dp` (of `data_ranks`, dp x sharding), where this layout runs it (`refused(ep)`: the line of a
    `config.refusals` row an expert degree adds, or None); else the note says why, and which degree or key runs."""
    value = args.extra.get("use_expert_parallel")
    if value is None or str(value).strip().lower() in FALSE:
        return 1
    key, experts = "use_expert_parallel: true", model_cfg.num_experts
    if not model_cfg.expert_layers:
        notes.append(f"{key} has no effect: {model_cfg.model_type} has no experts")
        return 1
    stated = args.training.expert_parallel_degree
    if "expert_parallel_degree" in args.explicit and stated != -1:  # the file's degree decides (`expert_degree`)
        if max(stated, 1) == 1:  # (-1: PaddleNLP's unset default, as if not written)
            notes.append(f"{key} has no effect: the file's expert_parallel_degree: {stated} keeps every expert on "
                         f"every rank (a stated degree decides, as it sizes PaddleNLP's DeepseekV2MoE expert group); "
                         f"remove that key to spread them over the data-parallel ranks")
        return 1
    if world == 1:
        notes.append(f"{key} has no effect on one process; on more, the experts are spread over the data-parallel "
                     f"ranks, as PaddleNLP's MoELayer (moe_group 'data') spreads them (expert_parallel_degree = the "
                     f"dp degree)")
        return 1
    dropping = args.model.capacity_factor > 0
    blocked = refused(dp) if data_ranks > 1 and dp > 1 and not experts % dp and not dropping else None
    why = (": tp x pp x cp take every process" if data_ranks == 1 else
           f": the sharding group takes the {data_ranks} data ranks" if dp == 1 else
           f", which does not divide num_experts ({experts})" if experts % dp else
           f", while capacity_factor {args.model.capacity_factor} drops tokens and expert parallelism here runs "
           f"dropless" if dropping else f", which {_blocker(blocked)[0]} does not run here" if blocked else "")
    if not why:
        notes.append(f"{key}: the experts are spread over the {dp} data-parallel ranks (expert_parallel_degree {dp}), "
                     f"as PaddleNLP's MoELayer spreads them over its data-parallel group (its default moe_group "
                     f"'data'); a stated expert_parallel_degree decides, as it sizes PaddleNLP's DeepseekV2MoE "
                     f"expert group")
        return dp
    runs = [e for e in range(data_ranks, 1, -1) if data_ranks % e == 0 and experts % e == 0 and not refused(e)]
    what = ("set capacity_factor: 0 to spread them so" if dropping else f"{_blocker(blocked)[1]} to spread them"
            if blocked else
            f"set expert_parallel_degree: {runs[0]} (a divisor of num_experts {experts} and the {data_ranks} data "
            f"ranks) to spread them here" if runs else
            f"no expert_parallel_degree runs with this layout's sharding: stage{stage} here (`check` with one says "
            f"why)" if stage else f"no degree above 1 divides both num_experts ({experts}) and the "
            f"{count(data_ranks, 'data rank')}")
    notes.append(f"{key} has no effect here: PaddleNLP's MoELayer (moe_group 'data') spreads the experts over its "
                 f"data-parallel group (expert_parallel_degree = its dp degree, {dp} here{why}); {what}")
    return 1


def _blocker(line: str) -> tuple[str, str]:
    """(what blocks it, what to set) of a `config.refusals` line an expert degree adds ("expert_parallel_degree: 2
    with sharding: stage3 is not supported (why); use sharding: stage1 (...) or ''"): a note for a key the user did
    not set names the other key and its fix in a few words, without the refusal's reasons."""
    head, _, tail = line.partition(" is not supported")
    what = head.split(" with ", 1)[-1]
    fix = re.sub(r" \([^()]*\)", "", tail.rpartition("); ")[2]).strip()
    return what, re.sub(r"^use ", "set ", fix)


def recorded(args) -> dict:
    """The keys args.json records of `args` (`arguments`, `user_arguments`): its fields, and PaddleNLP's keys set aside
    that take effect through the layout (`use_expert_parallel`), with expert_parallel_degree -1 (PaddleNLP's unset
    default) where the file did not state it. The fields alone held the default 1, which a run from the record read
    as a stated degree that decides, and no use_expert_parallel: every expert on every rank, not the record's run."""
    out = args.to_dict()
    taken = {k: v for k, v in args.extra.items() if k in NOTED_BY_LAYOUT}
    if taken and "expert_parallel_degree" not in args.explicit:
        out["expert_parallel_degree"] = -1
    return {**out, **taken}
