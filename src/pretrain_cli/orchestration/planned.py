"""A parsed run planned for a target device, and re-planned with key changes: `plan` and `plan --fit`, which
`train`'s out-of-memory hint (`orchestration.out_of_memory_hint`) runs too.

`plan` resolves the arguments exactly as `train` does, but for a target (`--device`, `--gpus`) instead of this
machine, so GPU precision (fp16/bf16, O1/O2), flash attention and sharding apply even when planning on a laptop.
A candidate layout (a suggestion, a `--fit` candidate) is a dict of key changes applied to the already-parsed
`Arguments` (`with_changes`) and resolved again by `config.resolve`: no `--key value` text, no second read of
the file, and a layout `train` refuses is refused here the same way. The search and ranking are `planning.fit`'s;
this module only supplies them `replan(change) -> report | None`. Never imports Paddle, never opens the data.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING

from pretrain_cli.config import resolve as resolve_rules
from pretrain_cli.config.compute import attention_words
from pretrain_cli.config.one_process import stated_data_parallel, stated_unmet
from pretrain_cli.config.parallel import degree
from pretrain_cli.config.keys import KEYS, coerce
from pretrain_cli.config.parser import Arguments
from pretrain_cli.run_config import Target
from pretrain_cli.run_layout import ParallelConfig
from pretrain_cli.errors import UserError
from pretrain_cli.orchestration import plan_options
from pretrain_cli.planning import fit as fit_search
from pretrain_cli.planning import hardware
from pretrain_cli.planning.fit_precision import pick_precision
from pretrain_cli.planning.eta import at_measured_mfu
from pretrain_cli.planning.machines import fewer_a_machine
from pretrain_cli.planning.plan import MFU_HALF, Device, device_note, report, target_device
from pretrain_cli.planning.speed import fp32_on_gpu_note, speed, traffic_bound
from pretrain_cli.planning.suggestions import checkpoint_disk_note, machine_too_small, suggest, within_budget
from pretrain_cli.planning.report import CheckpointPlan, Plan

if TYPE_CHECKING:
    from pretrain_cli.models.config import ModelConfig

DEFAULT_DEVICE = "A100-80GB"  # `plan --device` when none is given and the file's device is gpu (its default)
# `--fit` keeps the file's layout where the fastest is predicted less than this much faster: a stated policy, not the
# planner's measured error on GPUs (its times are not measured against GPUs here; docs/PLAN.md's +6 % bounds only the
# pipeline step's formula): a smaller predicted gain does not change the file's degrees, which costs a new layout to
# validate (`fit_report._kept`'s line calls it a policy)
KEEP_WITHIN = 0.06
SEARCHED = ("per_device_train_batch_size", "gradient_accumulation_steps", "recompute", "recompute_granularity",
            "use_flash_attention", "sharding", "sharding_parallel_degree", "tensor_parallel_degree",
            "pipeline_parallel_degree", "context_parallel_degree", "sequence_parallel", "expert_parallel_degree")


def with_changes(args: Arguments, change: dict, where: str = "command line") -> Arguments:
    """A copy of `args` with `change` ({key: value}) applied as if given on the command line (type-checked).
    The sections are copied one level deep (their values are replaced, never mutated): `--fit` makes thousands."""
    out = copy.copy(args)
    out.explicit = dict(args.explicit)
    for section in {KEYS[key].section for key in change}:
        setattr(out, section, copy.copy(getattr(args, section)))
    for key, value in change.items():
        out.set(key, coerce(KEYS[key], value, where))
        out.explicit[key] = where
    return out


def rank_groups(par: ParallelConfig) -> dict[str, list[tuple[int, ...]]]:
    """{"tp" | "pp" | "cp" | "data" | "ep" | …: every group of ranks of that kind} for `plan`'s layout lines and the
    speed model's links: the run's own rank layout's (`distributed.layout.topology.Topology.all_groups`, which
    `train` asks; never re-derived)."""
    from pretrain_cli.distributed.layout.topology import Topology

    return Topology.of(par).all_groups()


def _resolved(args: Arguments, model_cfg, device: Device, gpus: int, candidate: bool = False):
    target = Target(device="gpu" if device.is_gpu else "cpu", world_size=gpus,
                    gpu_name=device.entry.name if device.entry else None, planned=True, candidate=candidate)
    return resolve_rules.resolve(args, model_cfg, target)


def plan(args: Arguments, model_cfg, device: str, gpus: int = 1, mfu: float | None = None,
         suggest_changes: bool = True, baseline_bytes: float = 0.0, peak_tflops: float | None = None,
         node: hardware.Node = hardware.Node(), candidate: bool = False, layout: bool = True,
         measured_mfu: float | None = None, progress=None) -> Plan:
    """The plan (`Plan.to_json` is what `plan --json` prints), with suggestions (each re-resolved) when the run
    does not fit. The command's flags were checked where they came in (`plan_options.check_flags`): not again per
    candidate. `candidate`: a layout the search tries (`Target.candidate`); `layout`: with the groups of ranks
    (`Plan.layout`, which the speed model's links read; the memory does not); `measured_mfu`: the ETA at it
    (`eta.at_measured_mfu`), before the notes that quote it; `progress`: the search's (`fit.search`), where no one
    key fits."""
    dev = target_device(device, node, gpus)
    run = _resolved(args, model_cfg, dev, gpus, candidate)
    out = report(run, model_cfg, dev, mfu, baseline_bytes, args.config_path, peak_tflops,
                 rank_groups(run.parallel) if layout else None, shown=not candidate, timed=measured_mfu is not None)
    out = at_measured_mfu(out, measured_mfu) if measured_mfu is not None else out
    words = attention_words(run.kernels, run.device, run.data.attention_mask_type, run.parallel.cp_degree)
    advice = () if candidate else _advice(args, run, out, dev, mfu, peak_tflops)  # (a candidate's are never shown)
    out = dataclasses.replace(out, notes=(*device_note(device, dev), *out.notes, *advice), attention_words=words)
    if suggest_changes and not out.fits:
        replan = fit_search.remembered(_replanner(args, model_cfg, device, gpus, mfu, baseline_bytes, peak_tflops,
                                                  node))
        budget = out.device.memory_gib * (1 - fit_search.DEFAULT_MARGIN)  # `--fit`'s: one budget, one answer
        found = suggest(run, out, within_budget(out, replan, budget))
        if not any(s["fits"] for s in found):  # no one key fits (or the machine line): several together, else
            first = _layout_or_more_devices(args, out, replan, budget, progress)  # more devices, first
            if not first and found and found[0].get("machine"):  # no count of machines fits either: not offered
                lean = fit_search.leanest(_current(args), out, replan)
                fewer = fewer_a_machine(_current(args), out, budget, lean, _on_node(
                    args, model_cfg, device, gpus, mfu, baseline_bytes, peak_tflops, node), fit_search.fewest_devices)
                found[0] = {**found[0], "why": machine_too_small(out, (lean, budget), fewer)}
            found[:0] = first
        out = dataclasses.replace(out, suggestions=tuple(found))
    return out


def _advice(args: Arguments, run, out: Plan, dev: Device, mfu, peak_tflops) -> list[str]:
    """The warnings of what the file leaves to defaults that `train` on the target would regret: fp32 on a GPU
    (neither bf16 nor fp16 set) and checkpoints the disk will not hold (output_dir's disk is known only when the
    target is this machine: `--device cpu`)."""
    given = peak_tflops is not None or run.loop.peak_tflops is not None
    fp32 = dev.is_gpu and not (args.training.bf16 or args.training.fp16)
    disk = checkpoint_advice(out.checkpoint, run.loop.save_total_limit, None if dev.is_gpu else run.output.output_dir)
    return [*(fp32_on_gpu_note(dev.entry, out, mfu, given, MFU_HALF) if fp32 else []),
            *([f"checkpoints: WARNING: {disk}"] if disk else [])]


def checkpoint_advice(c: CheckpointPlan, limit: int | None, output_dir: str | None) -> str | None:
    """Why the checkpoints `c` (`planning.plan.checkpoint_plan`) of a run whose save_total_limit is `limit` will not
    be kept on disk, and the limit that fits (`planning.suggestions.checkpoint_disk_note`), or None: `plan`'s note
    and `check`'s warning. `output_dir`: the run's when this machine writes it (its disk is compared); None when
    another does (a GPU plan, `check --world_size`), where only the count of saves kept is known."""
    free = hardware.disk_free_gib(output_dir) if output_dir is not None else None
    return checkpoint_disk_note(c, limit, free)


def fit(args: Arguments, model_cfg, device: str, gpus: int = 1, mfu: float | None = None,
        margin: float = fit_search.DEFAULT_MARGIN, peak_tflops: float | None = None, budget_gib: float | None = None,
        baseline_bytes: float = 0.0, node: hardware.Node = hardware.Node(), levels: bool = True,
        progress=None) -> dict:
    """The fastest layout that fits (`planning.fit.fit`), every candidate re-resolved by `train`'s rules.

    `budget_gib` replaces device memory × (1 − margin) (the out-of-memory hint of `train` passes a lower one).
    `levels` False: the file's precision level only, no O2 search (`train`'s out-of-memory hint, whose "re-run to
    resume" must not switch O1 to O2: the resume would build O2's master weights from half weights).
    """
    stated = stated_data_parallel(args)  # a degree the layout decides: --fit searches and writes it (`_stated`)
    free = _unstated(args) if stated else args
    refused = []
    try:
        base = plan(args, model_cfg, device, gpus, mfu, False, baseline_bytes, peak_tflops, node)
    except UserError:  # (refused as written on these devices: planned with the data ranks they give, if that runs)
        if not stated:
            raise
        base = plan(free, model_cfg, device, gpus, mfu, False, baseline_bytes, peak_tflops, node)
        refused = [f"{key}: {n} is not what {gpus} processes give with the file's other degrees (`train` refuses "
                   f"it there): the file as written is planned with the data ranks they give, and the fitted "
                   f"layout's degree is written" for key, n in stated]
    as_written = base  # the file as written: its memory, speed and warnings are the "before"
    notes = [*refused, *(n for n in base.notes if "WARNING" in n)]
    precision = _precision_for(args, device)
    searched = with_changes(free, precision)
    if precision:  # the search runs, and the fitted file trains, in the precision the device has
        base = plan(searched, model_cfg, device, gpus, mfu, False, baseline_bytes, peak_tflops, node)
        notes.append(f"bf16: {base.device.name} has no bf16 tensor cores, so the fitted layout runs fp16 "
                     f"(bf16: false, fp16: true; loss scaling keeps it stable)")
    current = _current(args)
    replan = _replanner(searched, model_cfg, device, gpus, mfu, baseline_bytes, peak_tflops, node)
    budget = base.device.memory_gib * (1 - margin) if budget_gib is None else budget_gib
    carried = [(k, args.get(k), v) for k, v in precision.items()]
    fewer = _on_node(searched, model_cfg, device, gpus, mfu, baseline_bytes, peak_tflops, node)
    found = fit_search.fit(current, base, as_written, replan, budget, margin, carried, notes, args.config_path,
                           progress, fewer)
    if not levels or base.precision.amp_level != "O1" or not base.device.peak_tflops:
        return _stated(_kept(found, found, current, base, replan, budget, carried), stated, replan, args)
    if "fp16_opt_level" in args.explicit:  # the file's level is kept: O2's search (40 % of the time) not run
        found = {**found, "notes": [*found["notes"], "precision: the file sets fp16_opt_level O1, so --fit keeps it "
                                                     "(without the key it tries O2 too)"]}
        return _stated(_kept(found, found, current, base, replan, budget, carried), stated, replan, args)
    # a half-precision O1 file: O2 (half weights, fp32 master weights and AdamW state) searched too, as a lever
    o2_args = with_changes(searched, {"fp16_opt_level": "O2"})
    o2_base = plan(o2_args, model_cfg, device, gpus, mfu, False, baseline_bytes, peak_tflops, node)
    o2 = fit_search.fit(current, o2_base, as_written, _replanner(o2_args, model_cfg, device, gpus, mfu,
                                                                 baseline_bytes, peak_tflops, node),
                        budget, margin, [*carried, ("fp16_opt_level", "O1", "O2")], list(notes), args.config_path,
                        progress)
    best = pick_precision(found, o2, base.precision.amp_dtype, bool(searched.training.amp_master_grad))
    return _stated(_kept(best, found, current, base, replan, budget, carried), stated, replan, args)


def _unstated(args: Arguments) -> Arguments:
    """`args` without the data-parallel degree the file states (PaddleNLP's `data_parallel_degree`, PaddleFormers'
    `data_parallel_size`): `config.parallel` refuses a layout that does not give it, so with it every candidate of
    another tensor, pipeline or sharding split was refused and --fit searched that degree's layouts only (llama-3-8b
    on 8 A100-40GB stating 4: not the tp layout planned 29 % faster). --fit changes it as it changes the other
    degrees, and writes the chosen one (`_stated`)."""
    out = copy.copy(args)
    out.extra = {k: v for k, v in args.extra.items() if k not in dict(stated_data_parallel(args))}
    return out


def _stated(found: dict, stated: list[tuple[str, int]], replan, args: Arguments) -> dict:
    """`found` with each data-parallel degree the file states (`stated`: (key, degree)) set to the one the chosen
    layout gives, in its change and diff, so `-o`'s file is one `train` runs (`config.parallel` refuses a stated
    degree the layout does not give): the stated one where it still holds by the refusal's own rule
    (`one_process.stated_unmet` on `args`, the file, with the chosen change: PaddleNLP's dp, world //
    (sharding_parallel_degree x tp x sep x cp x pp), its sharding degree counted without a stage too, or the data
    ranks), else the layout's dp."""
    if not stated or found["after"] is None:
        return found
    chosen = replan({k: v for k, v in found["change"].items() if k in KEYS})
    if chosen is None:  # (planned already by the search: not expected)
        return found
    unmet = {k for k, _, _ in stated_unmet(with_changes(args, {k: v for k, v in found["change"].items() if k in KEYS}),
                                           chosen.parallel.data_ranks)}
    moved = [(key, old, chosen.parallel.dp if key in unmet else old) for key, old in stated]
    return {**found, "change": {**found["change"], **{k: new for k, _, new in moved}},
            "diff": [*found["diff"], *((k, old, new) for k, old, new in moved if new != old)]}


def _kept(best: dict, found: dict, current: dict, base: Plan, replan, budget: float, carried: list) -> dict:
    """`best` (the fit's answer), or the file's own layout where it fits the budget and the answer is predicted
    less than KEEP_WITHIN faster than it: a predicted gain under that threshold (a stated policy, not the planner's
    measured error on GPUs, against which its times are not measured) is no reason to change the file's degrees
    (Llama-2-7B on 8 A100 over a tp 2 file: tp 1 for +1.5 %). The file's layout takes the answer's flash attention:
    the faster kernel where it runs, whose gain the model's FLOPs leave out. Then `found` (the search at the file's
    precision level, `base` its plan) with that layout as the answer: the eval keys `fit_eval` sets there and the
    precision the device needs (`carried`) are still changed, and "kept" names the faster one
    (`fit_report.format_fit` says it)."""
    flash = {k: v for k, v in (best["change"] or {}).items() if k == "use_flash_attention"}
    moved = [d for d in best["diff"] if (d[0] in SEARCHED or d[0] == "fp16_opt_level") and d[0] not in flash]
    if best["after"] is None or not moved or best["ranked_by"] != "speed":
        return best
    own = replan(flash) if flash else base
    if own is None or own.least_gib > budget:
        return best
    mine, fastest = speed(own), best["after"]["speed"]
    gain = fastest["tokens_per_sec"] / mine["tokens_per_sec"] - 1  # (one global batch: the steps' ratio)
    if gain >= KEEP_WITHIN:
        return best
    evaluation = fit_search.fit_eval(current, {"change": flash, "report": own}, replan, budget,
                                     own.parallel.data_ranks)
    change = {**flash, **evaluation.get("change", {})}
    return {**found, "after": {"memory_gib": own.memory_gib, "startup_gib": own.startup_gib, "speed": mine,
                               "bound": traffic_bound(own, mine)},
            "change": {**{k: v for k, _, v in carried}, **change},
            "diff": list(carried) + fit_search.diff(current, change), "eval": evaluation or None, "faster": None,
            "kept": {"diff": moved, "speed": fastest, "gain": gain, "within": KEEP_WITHIN}}


def _current(args: Arguments) -> dict:
    """The file's values of the keys `--fit` searches, degrees as numbers (the search's starting point)."""
    current = {k: args.get(k) for k in SEARCHED}
    current["tensor_parallel_degree"] = degree(current["tensor_parallel_degree"])
    for key in ("pipeline_parallel_degree", "context_parallel_degree", "expert_parallel_degree"):
        current[key] = max(current[key], 1)
    for key in ("per_device_eval_batch_size", "eval_iters", "do_eval", "do_predict"):  # (`fit.fit_eval`'s)
        current[key] = args.get(key)
    return current


def _layout_or_more_devices(args: Arguments, base: Plan, replan, budget: float, progress=None) -> list[dict]:
    """The suggestion to put first when no single key fits: `--fit`'s search ranked by the fewest changed keys,
    then by speed (`fit.rank`), so its keys are the fastest layout of the fewest keys that fit the devices asked
    for together (tensor, pipeline, expert degrees with the rest), else the fewest devices (`fit.fewest_devices`,
    which also tries the search's smallest layout there, as the single keys leave those degrees as they are: a
    Mixture-of-Experts model whose experts are split over a fixed group needs them to change), both within `--fit`'s
    `budget` (its default margin), so `plan` and `plan --fit` give one answer: the layout with `--fit`'s eval change
    (`fit.fit_eval`), as the search fits an evaluation of 1 and the file's eval batch may be over the budget there."""
    current = _current(args)
    found = fit_search.search(current, base, replan, budget, fewest_first=True, progress=progress)
    if (best := found["best"]) is not None:
        r = best["report"]
        fastest = "; --fit ranks all of them by speed" if base.device.peak_tflops is not None else ""
        change, lowered = fit_search.with_eval(current, best["change"], r, replan, budget, base.parallel.data_ranks)
        return [{"change": {k: v for k, _, v in fit_search.diff(current, change)}, "memory_gib": r.peak_gib,
                 "saves_gib": base.peak_gib - r.peak_gib, "fits": True,
                 "why": f"no one key fits {base.gpus} x {base.device.name}, these together do with "
                        f"`plan --fit`'s {fit_search.DEFAULT_MARGIN:.0%} margin (the fewest keys of "
                        f"its layouts{', the fastest of those' if fastest else ''}{fastest}){lowered}"}]
    scale = fit_search.fewest_devices(current, base, replan, budget, found["smallest"])
    return [scale] if scale else []


def _precision_for(args: Arguments, device: str) -> dict:
    """The precision keys a fitted file needs on `device`: fp16 instead of bf16 where there is no bf16."""
    entry = hardware.lookup(device) if device.lower() != "cpu" else None
    if args.training.bf16 and not args.training.fp16 and hardware.pre_ampere(entry.capability if entry else None):
        return {"bf16": False, "fp16": True}
    return {}


def _replanner(args: Arguments, model_cfg, device: str, gpus: int, mfu, baseline_bytes: float, peak_tflops,
               node: hardware.Node = hardware.Node()):
    """`replan(change, world=gpus, layout=True)`: the plan of `args` with `change` applied, or None when `train`
    would refuse it (`config.resolve` raises); what the suggestions and the `--fit` search call for every candidate.
    `layout=False`: without the groups of ranks (`Plan.layout` None), for a question of memory only."""
    def replan(change: dict, world: int = gpus, layout: bool = True):
        try:
            return plan(with_changes(args, change), model_cfg, device, world, mfu, False, baseline_bytes, peak_tflops,
                        node, candidate=True, layout=layout)
        except UserError:
            return None

    return replan


def _on_node(args: Arguments, model_cfg, device: str, gpus: int, mfu, baseline_bytes: float, peak_tflops,
             node: hardware.Node):
    """`on_node(n) -> (the file planned on `gpus` processes with n a machine, its replan)`: `machines.fewer_a_machine`'s
    plans with fewer processes a machine than `node`'s."""
    def on_node(n: int):
        replan = fit_search.remembered(_replanner(args, model_cfg, device, gpus, mfu, baseline_bytes, peak_tflops,
                                                  dataclasses.replace(node, gpus=n)))
        return replan({}, gpus, layout=False), replan

    return on_node


def parse(config: str | None, overrides: list[str] | None) -> tuple[Arguments, ModelConfig]:
    """(Arguments, ModelConfig): the file and its overrides parsed once; every candidate re-resolves these."""
    from pretrain_cli.orchestration.opened import build_model_config
    from pretrain_cli.orchestration.prepare import load_arguments

    args = load_arguments(config, list(overrides or []))
    return args, build_model_config(args)[1]


def own_device(args: Arguments, device: str | None) -> tuple[str, list[str]]:
    """(the device `plan` plans, its note): `--device` as given, else the file's own: `cpu` for a file that says so
    (a CPU try-out's file planned on a GPU got GPU notes that do not apply and an ETA of 0.00 h), else
    DEFAULT_DEVICE, said in a note as `--gpus`' default is (`plan_options.file_gpus`): the A100 is plan's guess,
    not the user's card. `--device gpu` names no card: DEFAULT_DEVICE, with the same note."""
    if device is not None and device.lower() != "gpu":
        return device, []
    if device is None and args.training.device == "cpu":
        return "cpu", []
    why = "--device gpu names no card" if device is not None else "--device not given"
    return DEFAULT_DEVICE, [f"device: {why}: planned on {DEFAULT_DEVICE} (a gpu file's default); --device NAME "
                            f"plans yours"]


def from_file(config: str | None, overrides: list[str] | None = None, device: str | None = None,
              gpus: int | None = 1, mfu: float | None = None, suggest_changes: bool = True, baseline_bytes: float = 0.0,
              peak_tflops: float | None = None, node: hardware.Node = hardware.Node(),
              measured_mfu: float | None = None, progress=None) -> Plan:
    """`plan`'s report of an argument file (`--json` prints its `to_json()`), with suggestions when the run does
    not fit: the command's flags checked once, the file parsed once. `device` None: the file's (`own_device`);
    `gpus` None: the file's (`plan_options.file_gpus`). `measured_mfu`: the mfu `train` logged for this layout,
    which then gives the ETA (`eta.at_measured_mfu`); `progress`: the search's where no one key fits (`fit.search`)."""
    plan_options.check_flags(device, gpus, mfu, peak_tflops, node=node, measured_mfu=measured_mfu)
    args, model_cfg = parse(config, overrides)
    device, named = own_device(args, device)
    gpus, said = plan_options.file_gpus(args, gpus, node)
    said = [*named, *said]
    out = plan(args, model_cfg, device, gpus, mfu, suggest_changes, baseline_bytes, peak_tflops, node,
               measured_mfu=measured_mfu, progress=progress)
    return dataclasses.replace(out, notes=(*said, *out.notes)) if said else out


def fit_file(config: str | None, overrides: list[str] | None = None, device: str | None = None,
             gpus: int | None = 1, mfu: float | None = None, margin: float = fit_search.DEFAULT_MARGIN,
             peak_tflops: float | None = None, budget_gib: float | None = None, baseline_bytes: float = 0.0,
             node: hardware.Node = hardware.Node(), progress=None) -> tuple[Arguments, dict]:
    """(the parsed arguments, `plan --fit`'s result for an argument file): the flags checked once, the file
    parsed once. `device` None: the file's (`own_device`); `gpus` None: the file's (`plan_options.file_gpus`).
    `progress`: each search's (`fit.search`)."""
    plan_options.check_flags(device, gpus, mfu, peak_tflops, margin, node)
    args, model_cfg = parse(config, overrides)
    device, named = own_device(args, device)
    gpus, said = plan_options.file_gpus(args, gpus, node)
    said = [*named, *said]
    f = fit(args, model_cfg, device, gpus, mfu, margin, peak_tflops, budget_gib, baseline_bytes, node,
            progress=progress)
    return args, {**f, "notes": [*said, *f["notes"]]} if said else f
