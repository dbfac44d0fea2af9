"""What a multi-process file's parallel keys mean when it runs as one process (`train` without the launcher,
`check` without `--world_size`, `plan --gpus 1`): every degree has no effect, each noted the way a launch notes a
setting it ignores, and the note names the launch the file was written for (`fewest_processes`), so `check` says
what to check it with and `plan` what to plan it on; `plan` without `--gpus` plans on that many."""
from __future__ import annotations

import math

from pretrain_cli.config.pipeline import resolve_pipeline
from pretrain_cli.errors import Problems

_AXES = ("tensor_parallel_degree", "pipeline_parallel_degree", "sep_parallel_degree", "context_parallel_degree")


def fewest_processes(args) -> tuple[int, str]:
    """(the fewest processes the file's parallel keys run on, the degrees that make it, e.g. "pipeline_parallel_degree
    2 x 4 data ranks for expert_parallel_degree 4 and sharding_parallel_degree 4"): tp x pp x sep x cp x the fewest
    data ranks that pass (`least_data_ranks`, the rule `config.parallel` refuses a world by, so the launch named is
    one that passes). A stated data-parallel degree no count gives with the other keys is left out (its refusal says
    to remove it). (1, "") for a file without them."""
    t = args.training
    axes = [(k, max(getattr(t, k), 1)) for k in _AXES]
    ranks = least_data_ranks(args)
    held = ranks is not None
    if not held:
        ranks = least_data_ranks(args, stated=False)
    sharding = max(t.sharding_parallel_degree, 1) if t.sharding.strip() else 1
    data = [("expert_parallel_degree", max(t.expert_parallel_degree, 1)), ("sharding_parallel_degree", sharding),
            *(stated_data_parallel(args) if held else [])]
    parts = [f"{k} {d}" for k, d in axes if d > 1]
    if ranks > 1:
        parts.append(f"{ranks} data ranks for {' and '.join(f'{k} {d}' for k, d in data if d > 1)}")
    return math.prod(d for _, d in axes) * ranks, " x ".join(parts)


def stated_data_parallel(args) -> list[tuple[str, int]]:
    """The data-parallel degrees the file states above 1 (PaddleNLP's `data_parallel_degree`, PaddleFormers'
    `data_parallel_size`: keys without effect, the data ranks computed as PaddleNLP computes them), as (key, degree);
    a value that is not a whole number is left to the key's note. `config.parallel` refuses a world that does not give
    one (`stated_unmet`), and `fewest_processes` counts it, so the launch it names is one that passes."""
    out = []
    for key in ("data_parallel_degree", "data_parallel_size"):
        try:
            stated = int(str(args.extra.get(key, 1)))
        except ValueError:
            continue
        if stated > 1:
            out.append((key, stated))
    return out


def data_parallel_degree(args, ranks: int, sharding_key: int | None = None) -> int | None:
    """PaddleNLP's data_parallel_degree for `ranks` data ranks (world / (tp x pp x sep x cp)), as its
    TrainingArguments computes it: world // (sharding_parallel_degree x tp x sep x cp x pp), so ranks / the sharding
    degree, which counts without a sharding stage too (its ranks then data-parallel ranks keeping the whole optimizer
    state) and under a stage with -1 is every data rank (here 0 too: `config.parallel` reads it so), leaving dp 1.
    None where that degree does not divide the ranks (fleet's topology would not fit the world). `sharding_key`: a
    sharding_parallel_degree to ask about in place of the file's."""
    t = args.training
    key = t.sharding_parallel_degree if sharding_key is None else sharding_key
    sharding = ranks if t.sharding.strip() and key in (-1, 0) else max(key, 1)
    return None if ranks % sharding else ranks // sharding


def stated_unmet(args, ranks: int, sharding_key: int | None = None) -> list[tuple[str, int, int | None]]:
    """(key, stated degree, PaddleNLP's dp) of each data-parallel degree the file states that `ranks` data ranks do
    not give: the one rule `config.parallel`'s refusal and `least_data_ranks` (the process counts named) share. A
    stated degree is given where it is the dp PaddleNLP (`data_parallel_degree`) and PaddleFormers
    (`data_parallel_size`, world // (sharding_parallel_size x tp x sep x pp) in its TrainingArguments) compute, the
    data ranks over the sharding degree; only under a stage sharding over every data rank (-1, 0: their dp is 1 on
    any world) is it the data ranks themselves. (Read as the data ranks beside an explicit sharding degree, a
    PaddleNLP file for dp 2 x sharding 2 passed on half its ranks, at half its global batch.)"""
    dp = data_parallel_degree(args, ranks, sharding_key)
    every = _shards_every_rank(args, sharding_key)
    return [(k, d, dp) for k, d in stated_data_parallel(args) if d != (ranks if every else dp)]


def _shards_every_rank(args, sharding_key: int | None = None) -> bool:
    """Whether the sharding group is every data rank: a stage with sharding_parallel_degree -1 or 0."""
    t = args.training
    key = t.sharding_parallel_degree if sharding_key is None else sharding_key
    return bool(t.sharding.strip()) and key in (-1, 0)


def least_data_ranks(args, stated: bool = True, of: int = 1) -> int | None:
    """The fewest data ranks the file's keys run on: a multiple of expert_parallel_degree and, under a sharding
    stage, of sharding_parallel_degree (`config.parallel` refuses a world they do not divide), giving (`stated`)
    every stated data-parallel degree (`stated_unmet`); None where no count gives them all (a stated 2 with
    expert_parallel_degree 4: the refusal then names the key to remove, not a count). `of`: a count the data ranks
    must also be a multiple of (`config.expert`'s fewest more processes, the layout's data ranks kept)."""
    given = _given_data_ranks(args, of) if stated and stated_data_parallel(args) else [_step(args, of)]
    return given[0] if given else None


def stated_process_counts(args) -> list[int] | None:
    """Every process count that gives the data-parallel degrees the file states, tp x pp x sep x cp x the data ranks
    `least_data_ranks` searches (at most one: a stated degree is given at one count of data ranks); None
    for a file that states none (then every multiple of `fewest_processes` runs), [] where no count gives them with
    the other keys. What `orchestration.host_fit` offers for N, where most multiples are refused."""
    if not stated_data_parallel(args):
        return None
    return [ranks * _axes_product(args) for ranks in _given_data_ranks(args, 1)]


def _step(args, of: int) -> int:
    """The least common multiple of what must divide the data ranks: expert_parallel_degree, under a sharding stage
    sharding_parallel_degree, and `of`."""
    t = args.training
    return math.lcm(max(t.expert_parallel_degree, 1), max(t.sharding_parallel_degree, 1) if t.sharding.strip() else 1,
                    of)


def _given_data_ranks(args, of: int) -> list[int]:
    """The multiples of `_step` that give every stated degree (`stated_unmet`), fewest first. A stated d is given at
    one count of data ranks only, d x the sharding degree (d where the sharding group is every data rank), so those
    are the candidates: bounded work, where a search up to the product of the degrees took 20 s for 1000 and 999."""
    step = _step(args, of)
    sharding = 1 if _shards_every_rank(args) else max(args.training.sharding_parallel_degree, 1)
    candidates = {d * sharding for _, d in stated_data_parallel(args)}
    return sorted(ranks for ranks in candidates if ranks % step == 0 and not stated_unmet(args, ranks))


def _axes_product(args) -> int:
    """tp x pp x sep x cp: the processes of one data rank."""
    return math.prod(max(getattr(args.training, k), 1) for k in _AXES)


def _no_count_gives(args) -> str:
    """The line for stated data-parallel degrees no process count gives with the other keys (`least_data_ranks`
    None), which `fewest_processes` leaves out: without it one process (`plan` without --gpus, `check`) said nothing
    of a file that every launch refuses. "" where a count gives them."""
    stated = stated_data_parallel(args)
    if not stated or least_data_ranks(args) is not None:
        return ""
    t = args.training
    held = [f"{k} {d}" for k, d in (("expert_parallel_degree", max(t.expert_parallel_degree, 1)),
                                    ("sharding_parallel_degree", max(t.sharding_parallel_degree, 1)
                                     if t.sharding.strip() else 1)) if d > 1]
    with_keys = f" with {' and '.join(held)}" if held else ""
    return (f"{' and '.join(f'{k}: {d}' for k, d in stated)}: no process count gives "
            f"{'it' if len(stated) == 1 else 'both'}{with_keys}, so every launch "
            f"of more than one process is refused: remove {'the key' if len(stated) == 1 else 'them'} (the data "
            f"ranks are computed from the world size and the other degrees)")


def _launch_words(need: int, device: str) -> str:
    """How to run `need` processes from here: under scripts/launch.sh (it exports `job.VERDICTS_ENV` to its ranks)
    its own setting, NPROC on CPU and DEVICES on GPUs, since the user is launching, not checking; else `check`'s."""
    from pretrain_cli.distributed.launcher.job import verdict_dir

    if verdict_dir() is None:
        return f"`check --world_size {need}` checks it as they run it"
    if device == "cpu":
        return f"`NPROC={need} scripts/launch.sh` starts them"
    return f"`DEVICES={','.join(map(str, range(need)))} scripts/launch.sh` starts them, one per GPU"


def one_process_notes(args, model_cfg, degrees: dict, stage: int, notes: list, problems: Problems,
                      planned: bool = False, device: str = "cpu") -> None:
    """Notes for `degrees` ({key: degree}: tensor, pipeline, sep, context, expert) and sharding `stage` on one
    process; `sequence_parallel` and `virtual_pp_degree` get the notes they get on many when they are without their
    axis. `planned`: for `plan`, whose option for the processes is `--gpus` (`check`'s is `--world_size`);
    `device`: the run's, which decides what starts more processes under scripts/launch.sh."""
    t = args.training
    dropped = [f"{k}={v}" for k, v in degrees.items() if v > 1]
    tp, pp = degrees["tensor_parallel_degree"], degrees["pipeline_parallel_degree"]
    if t.sequence_parallel and tp > 1:
        dropped.append("sequence_parallel=True")
    if t.virtual_pp_degree > 1 and pp > 1:
        dropped.append(f"virtual_pp_degree={t.virtual_pp_degree}")
    if stage:
        dropped.append(f"sharding={t.sharding!r}")
    need = fewest_processes(args)[0]
    if dropped:
        how = f"`plan --gpus {need}` plans it as they run it" if planned else _launch_words(need, device)
        launch = f"; the file's layout needs {need} processes: {how}" if need > 1 else ""
        notes.append(f"parallel: one process, so {', '.join(dropped)} has no effect{launch}")
    unmet = _no_count_gives(args)
    if unmet:
        notes.append(unmet)
    if t.sequence_parallel and tp == 1:
        notes.append("sequence_parallel: only meaningful with tensor parallelism; ignored")
    if pp == 1:  # virtual_pp_degree and pipeline_parallel_config without a pipeline: noted as on many processes
        resolve_pipeline(args, model_cfg, 1, notes, problems)
