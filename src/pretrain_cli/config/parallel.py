"""The parallel keys (`tensor_parallel_degree`, `pipeline_parallel_degree`, `context_parallel_degree`,
`expert_parallel_degree`, `sharding`, `sharding_parallel_degree`, `sequence_parallel`, ...) of a run's world ->
its `ParallelConfig` (`resolve_parallel`), with every rule between them: which degrees divide the world and the
model, what stays refused (`config.refusals`' table), the notes on what a key changes. The pipeline's, context
parallelism's, expert parallelism's own arithmetic is theirs (`config.pipeline`, `config.context`,
`config.expert`); `config.resolve` calls this once.
"""
from __future__ import annotations

from dataclasses import replace

from pretrain_cli.config.context import context_degree, context_fits
from pretrain_cli.config.expert import expert_degree, paddlenlp_expert_parallel
from pretrain_cli.config.one_process import (least_data_ranks, one_process_notes, stated_data_parallel,
                                              stated_unmet)
from pretrain_cli.config.parser import Arguments
from pretrain_cli.config.pipeline import resolve_pipeline
from pretrain_cli.config.refusals import Degrees, refusals
from pretrain_cli.counts import count
from pretrain_cli.errors import Problems, UserError
from pretrain_cli.run_config import Target
from pretrain_cli.run_layout import ParallelConfig


def parse_sharding(text: str) -> tuple[int, bool]:
    stage, offload = 0, False
    for tok in text.replace(",", " ").split():
        if tok in ("stage1", "stage2", "stage3"):
            if stage:
                raise UserError(f"sharding: {text!r} names more than one stage; pick one of stage1, stage2, stage3")
            stage = int(tok[-1])
        elif tok == "offload":
            offload = True
        else:
            raise UserError(f"sharding: unknown option {tok!r}; use stage1, stage2 or stage3, optionally with offload")
    if offload and stage not in (2, 3):
        raise UserError(f"sharding: 'offload' needs stage2 or stage3, got {text!r}")
    return stage, offload


def degree(value: int) -> int:
    """A parallel degree as the file writes it (-1, 0 and 1 all mean off) -> the ways it splits the run."""
    return max(value, 1)


def _stated_data_ranks(args: Arguments, world: int, degrees: dict, runs, problems: Problems,
                       planned: bool = False) -> None:
    """A data-parallel degree the file states (PaddleNLP's `data_parallel_degree`, PaddleFormers' `data_parallel_size`:
    keys without effect here, the data ranks computed from the world and the other degrees) that this layout does not
    give is refused: the run would train on other data ranks, so on another global batch, than the file says. One rule,
    `one_process.stated_unmet`, which `fewest_processes` counts by too: given where it is PaddleNLP's dp, world //
    (sharding_parallel_degree x tp x sep x cp x pp), its sharding degree counted without a stage as well, or the data
    ranks where the sharding group is every data rank. The line names the axes the run has (a sharding group only
    under a stage) and only fixes that rule passes: under a stage, the sharding degree that leaves the stated dp;
    the fewest processes that give it (`least_data_ranks`); else removing the key, and only where `runs(sharding,
    data ranks)` (no `config.refusals` row refuses them). `degrees`: the layout's tp, pp and cp, none
    refused (a refused degree's reset would make the advice wrong: this is not asked then). `planned`: under `plan`,
    whose option for the processes is `--gpus` (`check`'s is `--world_size`)."""
    t = args.training
    others = degrees["tp"] * degrees["pp"] * degrees["cp"]
    ranks, least, stage = world // others, least_data_ranks(args), bool(t.sharding.strip())
    zero = (least if t.sharding_parallel_degree in (-1, 0) else max(t.sharding_parallel_degree, 1)) if stage else 1
    refused = least is not None and not runs(zero, least)  # (a count an engine limit refuses there is not named)
    for key, stated, dp in stated_unmet(args, ranks):
        # the axes the run has: a sharding group only under a stage (without one PaddleNLP's dp still counts the
        # sharding degree, named beside the data ranks, which are then the run's own)
        shards = ranks // dp if dp and stage else 1
        axes = " x ".join(f"{n} {d}" for n, d in {**degrees, "sharding": shards}.items() if d > 1)
        given = count(dp if stage and dp else ranks, 'data rank') + (
            f" (PaddleNLP's dp {dp} beside sharding_parallel_degree {t.sharding_parallel_degree})"
            if not stage and dp and dp != ranks else "")
        fixes = []
        sharding = ranks // stated
        if stage and ranks % stated == 0 and sharding > 1 and not stated_unmet(args, ranks, sharding) and runs(
                sharding, ranks):
            fixes.append(f"set sharding_parallel_degree: {sharding} (ZeRO over the rest)")
        if least is not None and not refused:
            option = "plan --gpus" if planned else "check --world_size"
            fixes.append(f"run it on {least * others} processes (`{option} {least * others}`)")
        if refused:
            why = f"on {least * others} processes, which give it, this layout is refused"
        else:  # (no count gives it: the keys it is held against)
            keys = [f"{k} {d}" for k, d in (("expert_parallel_degree", max(t.expert_parallel_degree, 1)),
                                            ("sharding_parallel_degree", max(t.sharding_parallel_degree, 1)
                                             if stage else 1)) if d > 1]  # (they divide the data ranks)
            keys += [f"{k} {d}" for k, d in stated_data_parallel(args) if k != key]
            why = f"no process count gives {stated}" + (f" with {' and '.join(keys)}" if keys else "")
        advice = f"{', '.join(fixes)}, or remove the key" if fixes else f"{why}: remove the key"
        problems.add(f"{key}: {stated}, but {count(world, 'process')}{f' / ({axes})' if axes else ''} give "
                     f"{given}; {advice} (the data ranks are computed from the world size "
                     f"and the other degrees)")


def resolve_parallel(args: Arguments, model_cfg, target: Target, notes: list, problems: Problems) -> ParallelConfig:
    """The parallel keys of `args` on `target`'s world -> the run's `ParallelConfig`: the degrees (tp, pp and
    virtual pp, cp, ep, the data ranks and the sharding group), the ZeRO stage, sequence parallelism and whether
    the vocabulary is split; on one process the notes on what its parallel keys do there (`one_process`)."""
    t, world = args.training, target.world_size
    before = len(problems.items)  # (a stated data-parallel degree is judged only on a layout without refusals)
    stage, offload = problems.run(parse_sharding, t.sharding) or (0, False)
    tp, pp = degree(t.tensor_parallel_degree), degree(t.pipeline_parallel_degree)
    sep, cp = degree(t.sep_parallel_degree), degree(t.context_parallel_degree)
    if world == 1:
        paddlenlp_expert_parallel(args, model_cfg, 1, 1, 1, stage, lambda ep: None, notes)
        one_process_notes(args, model_cfg, {"tensor_parallel_degree": tp, "pipeline_parallel_degree": pp,
                                            "sep_parallel_degree": sep, "context_parallel_degree": cp,
                                            "expert_parallel_degree": degree(t.expert_parallel_degree)}, stage,
                          notes, problems, target.planned, target.device)
        return ParallelConfig(world_size=1, rank=target.rank, local_rank=target.local_rank)
    cp = context_degree(args, world, problems)
    sp = bool(t.sequence_parallel) and tp > 1
    if t.sequence_parallel and tp == 1:
        notes.append("sequence_parallel: only meaningful with tensor parallelism; ignored")
    pp, vpp = resolve_pipeline(args, model_cfg, world, notes, problems)
    world //= pp  # what follows lays out one pipeline stage's ranks
    if world % tp:  # (named with the whole world: `pp x tp` must divide it)
        with_pp = f" x pipeline_parallel_degree {pp} = {tp * pp}" if pp > 1 else ""
        problems.add(f"tensor_parallel_degree: {tp}{with_pp} does not divide the world size {world * pp}; use a "
                     f"divisor of it")
        tp = 1
    sliced = ["num_attention_heads", "num_key_value_heads", "intermediate_size"]
    if model_cfg.expert_layers:  # the experts' and shared experts' SwiGLU widths are cut over tp too
        sliced += [n for n in ("moe_intermediate_size", "shared_expert_intermediate_size") if getattr(model_cfg, n)]
    for name in sliced:
        if tp > 1 and getattr(model_cfg, name) % tp:
            problems.add(f"tensor_parallel_degree: {tp} does not divide the model's {name} "
                         f"({getattr(model_cfg, name)}); use a divisor of it")
    cp = context_fits(cp, tp, pp, world * pp, problems)  # (context_degree checked cp against the whole world)
    rest = world // (tp * cp)
    sharding = 1
    if stage:
        sharding = rest if t.sharding_parallel_degree in (-1, 0) else t.sharding_parallel_degree
        if sharding < 1 or rest % sharding:
            axes = " x ".join(f"{n} {d}" for n, d in (("tp", tp), ("pp", pp), ("cp", cp)) if d > 1 or n == "tp")
            problems.add(f"sharding_parallel_degree: {sharding} does not divide the {rest} data-parallel processes "
                         f"(world {world * pp} / ({axes})); use a divisor or -1")
            sharding = 1
        elif sharding * cp == 1:
            notes.append(f"sharding: {t.sharding!r} over 1 process shards nothing; it has no effect")
    elif degree(t.sharding_parallel_degree) > 1:  # PaddleNLP warns the same and makes them data-parallel ranks
        notes.append(f"sharding_parallel_degree: {t.sharding_parallel_degree} has no effect without a sharding stage "
                     f"(sharding is {t.sharding!r}): its ranks are data-parallel ranks, each holding the whole "
                     f"optimizer state")
    moe = model_cfg.model_type if model_cfg.expert_layers else ""  # (an MTP module's experts count)
    layout = Degrees(tp=tp, pp=pp, cp=cp, sep=sep, stage=stage, sharding=sharding, data=rest, sp=sp, moe=moe,
                     mla=model_cfg.model_type if model_cfg.mla else "", device=target.device)
    refused = set(refusals(layout))  # an expert degree's own refusal: a row its degree adds (PaddleNLP's EP)
    implied = paddlenlp_expert_parallel(args, model_cfg, world * pp, rest, rest // sharding, stage, lambda ep: next(
        iter(set(refusals(replace(layout, ep=ep))) - refused), None), notes)
    asked = implied if implied > 1 else max(t.expert_parallel_degree, 1)
    for line in refusals(replace(layout, ep=asked)):
        problems.add(line)  # what no engine here runs: config.refusals' table
    quiet = len(problems.items) > before  # a degree refused (or reset to 1) before the sequence check
    if sp and args.data.max_seq_length % (tp * cp):
        each = f" (each of the {cp} cp ranks holds {args.data.max_seq_length // cp})" if cp > 1 else ""
        problems.add(f"sequence_parallel: max_seq_length {args.data.max_seq_length}{each} is not divisible by "
                     f"tensor_parallel_degree {tp}; use a multiple of {tp * cp}")
    mark = len(problems.items)
    if offload and target.device == "cpu":
        notes.append("sharding: offload moves optimizer state to host memory, which is where it already is on cpu; "
                     "no effect")
    elif offload:
        notes.append("sharding: offload is not available with Paddle's sharded optimizer (dist.shard_optimizer / "
                     "fleet); ignored, and plan does not count it")
    ep = expert_degree(args, model_cfg, rest, tp, pp, cp, stage if sharding * cp > 1 else 0, problems,
                       implied if implied > 1 else None, target.planned)
    if not quiet and len(problems.items) == mark:  # (nor after expert_parallel_degree's refusal)
        _stated_data_ranks(args, world * pp, dict(tp=tp, pp=pp, cp=cp), lambda shards, data: not refusals(
            replace(layout, sharding=shards, data=data, ep=ep)), problems, target.planned)
    # routed experts over expert groups, or multi-head latent attention without ZeRO-3: the `tp` step's split, not
    # semi-auto's (MLA's tp with ZeRO-3 runs on the semi-auto engine, whose placements shard the parameters)
    zero3 = stage == 3 and sharding * cp > 1
    manual_tp = tp > 1 and (bool(model_cfg.mla) and not zero3 or ep > 1)
    layered = pp > 1 or sp or cp > 1 or manual_tp  # tp is the layout steps' Megatron split (distributed.steps.order)
    vocab_split = tp > 1 and model_cfg.vocab_size % tp == 0 and not layered  # the steps' split keeps it whole
    if tp > 1 and layered:
        where = (f"inside {pp} pipeline stages" if pp > 1 else "with sequence_parallel" if sp
                 else "with context_parallel_degree" if cp > 1 else "with expert_parallel_degree" if ep > 1
                 else "with multi-head latent attention")
        notes.append(f"tensor_parallel_degree: {tp} {where} splits the decoder layers; the embedding and LM head "
                     f"stay whole on every tensor-parallel rank{' of their stage' if pp > 1 else ''}")
    elif tp > 1 and not vocab_split:
        notes.append(f"tensor_parallel_degree: {tp} does not divide vocab_size {model_cfg.vocab_size}, so every "
                     f"tensor-parallel rank holds the whole embedding and LM head (a multiple of {tp} splits them)")
    return ParallelConfig(world_size=world * pp, rank=target.rank, local_rank=target.local_rank,
                          dp_degree=rest // sharding, sharding_degree=sharding,
                          sharding_stage=stage if sharding * cp > 1 else 0,
                          tp_degree=tp, pp_degree=pp, virtual_pp_degree=vpp, vocab_parallel=vocab_split, cp_degree=cp,
                          sequence_parallel=sp, ep_degree=ep, manual_tp=manual_tp)
