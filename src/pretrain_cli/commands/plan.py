"""`pretrain-cli plan`: memory, FLOPs, tokens, checkpoint size and time for an argument file, before any GPU time.

`main` hands the file to `orchestration.planned.from_file` / `fit_file` (the entry points tests and scripts call
too: the flags checked once, the file parsed once), which resolve it exactly as `train` does but for a target
(`--device`, `--gpus`), and for `--fit` re-resolve every candidate layout of `planning.fit` from the parsed
arguments and keep the fastest that fits; `-o` writes it. Never imports Paddle, never opens the data.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from pretrain_cli.errors import UserError
from pretrain_cli.orchestration.planned import DEFAULT_DEVICE
from pretrain_cli.planning import fit as fit_search
from pretrain_cli.planning import device_names, fit_report, hardware
from pretrain_cli.planning.plan import MFU_FP32, MFU_HALF, MFU_MOE_CPU
from pretrain_cli.planning.report import format_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None,
                        help=f"target accelerator, e.g. A100-80GB, H100, V100-16GB, or cpu (known: "
                             f"{', '.join(device_names.listed())}; default: the file's device: "
                             f"cpu for a file that says `device: cpu`, else {DEFAULT_DEVICE})")
    parser.add_argument("--gpus", type=int, default=None,
                        help="devices (processes) in the run (default: the fewest the file's parallel keys run on: "
                             "tensor x pipeline x context parallel degree x the data ranks expert_parallel_degree "
                             "and sharding_parallel_degree divide; 1 for a file without them)")
    parser.add_argument("--measured_mfu", type=float, default=None,
                        help="the mfu `train` logged for this file's layout: the ETA is then model FLOPs / (devices x "
                             "peak x it), nothing added, the run's time at that speed (not with --fit, which times "
                             "other layouts; default: none, the speed model's ETA at --mfu)")
    parser.add_argument("--mfu", type=float, default=None,
                        help=f"the kernels' share of the peak on the FLOPs the devices run (recompute included), "
                             f"to which the speed model adds the pipeline's bubble and the traffic; not the mfu "
                             f"`train` logs, which has those inside it: give that one as --measured_mfu (default: "
                             f"{MFU_HALF} with fp16/bf16, "
                             f"{MFU_FP32} in fp32, {MFU_MOE_CPU} for a Mixture-of-Experts model on cpu)")
    parser.add_argument("--peak_tflops", type=float, default=None,
                        help="dense peak TFLOPS per device for the ETA; wins over the file's peak_tflops and the "
                             "hardware table (default: the table's peak for --device and the run's precision)")
    parser.add_argument("--gpus_per_node", type=int, default=hardware.GPUS_PER_NODE,
                        help="GPUs in one node: consecutive ranks share a node, and a parallel group inside one "
                             "uses the device's in-node link (NVLink, else PCIe) (default: %(default)s)")
    parser.add_argument("--cross_node_gbps", type=float, default=None,
                        help="GB/s per GPU one way between nodes, for groups that span nodes (default: the device "
                             "generation's 8-GPU node, one InfiniBand adapter per GPU: 50 for H100/H800/H20/H200 "
                             "(400 Gb/s NDR), 25 for A100/A800 (200 Gb/s HDR), 12.5 for V100 (100 Gb/s EDR))")
    parser.add_argument("--tokens", default=None,
                        help="the run's length in tokens (10B, 500M, 1e10): max_steps becomes them over the tokens "
                             "of a step, rounded up (default: the file's max_steps)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    parser.add_argument("--fit", action="store_true",
                        help="search micro-batch/accumulation (same global batch), recompute, flash attention, "
                             "sharding stage, tensor-parallel degree (with or without sequence parallelism), "
                             "pipeline, context-parallel and (Mixture-of-Experts) expert-parallel degree for the "
                             "fastest layout whose steady state and start-up fit --device")
    parser.add_argument("--margin", type=float, default=None,
                        help=f"with --fit: fraction of device memory kept free (default: {fit_search.DEFAULT_MARGIN})")
    parser.add_argument("-o", "--output", default=None,
                        help="with --fit: write the fitted argument file here (the file with the changed keys; a "
                             "fitted file there is replaced, any other file refused; default: none, only print)")


def write_fitted(args, change: dict, path: str, device: str = DEFAULT_DEVICE,
                 tokens: str | None = None) -> tuple[str, list[tuple[str, object, object, str]]]:
    """The user's file (key order kept; a run's `args.json`, its `user_arguments`, as `train` reads it) with the
    command-line overrides and the fitted keys, published atomically: JSON, or YAML where `path` ends in .yaml/.yml
    (whichever the source was). Returns (what the printed line says about its output directory, (key, the file's
    value or the key's default, the value written, where it came from) for each key written from the command line
    (or PaddleFormers' defaults) at a value the file does not hold, but the fitted ones (`change`, in the fit's own
    diff): `-o`'s changes list names every key it writes (max_steps of `--tokens`, a `--max_seq_length`)).

    A file that says `device: cpu` fitted for a GPU (`device`, plan's --device) gets `device: gpu`: the layout is
    the GPU's, and kept at cpu the GPU machine would run it on its host, the layout the fit chose included.

    Its `output_dir` is the source's + `-fitted`: training it never overwrites or resumes the source's run by
    accident (a run with `overwrite_output_dir: true` would wipe it); where plan's command line names another
    model than the file's (`--model_name_or_path`, the file's output_dir kept), the directory beside it named for
    that model + `-fitted` (a Llama-2-7B planned over a llama-3-8b file: not `./checkpoints/llama-3-8b-fitted`; a
    checkpoint-N directory with its run directory's name, `output-checkpoint-5-fitted`). When the
    source's directory holds a checkpoint (a run that ran out of memory), the fitted file resumes from the newest
    one by name
    (`resume_from_checkpoint`): any layout resumes from any other, and the fit keeps the global batch. Not when
    plan's command line changed the model or `max_seq_length` (a CPU try-out's file planned for a published model),
    nor when PaddleNLP's Trainer wrote it (a PaddleNLP run's output_dir): `train` would refuse that checkpoint, so
    the fitted run starts over and the printed line says why."""
    from pretrain_cli import atomic, run_dir
    from pretrain_cli.config.keys import KEYS
    from pretrain_cli.config.paddlenlp_keys import ALIASES
    from pretrain_cli.config.parser import YAML_SUFFIXES, arguments_of, read_argument_file

    path_in = args.config_path  # its keys, in the user's order, as `load_arguments` reads them:
    raw = arguments_of(read_argument_file(path_in), "user_arguments", path_in)[0] if path_in is not None else {}
    given = []
    mine = str(next((v for k, v in raw.items() if "model_name_or_path" in (k, ALIASES.get(k))), "")).rstrip("/")
    for key, where in args.explicit.items():
        if where == "file" or key in change:
            continue
        old = next((v for k, v in raw.items() if key in (k, ALIASES.get(k))), KEYS[key].default)
        if args.get(key) != old:
            given.append((key, old, args.get(key), f"--tokens {tokens}" if key == "max_steps" and tokens else where))
    for key, value in [*((k, args.get(k)) for k, where in args.explicit.items() if where != "file"), *change.items()]:
        raw = _put(raw, key, value)
    source = str(args.get("output_dir")).rstrip("/") or "."
    raw["output_dir"], why = f"{source}-fitted", ""
    model = str(args.get("model_name_or_path") or "").rstrip("/")
    if args.explicit.get("model_name_or_path") not in (None, "file") and model != mine and args.explicit.get(
            "output_dir") in (None, "file") and Path(model).name:
        # another model than the file's: its directory named for it, a checkpoint-N with its run's name (every
        # run has a checkpoint-5)
        name = Path(model).name
        name = f"{Path(model).parent.name}-{name}" if run_dir.CHECKPOINT.match(name) and Path(model).parent.name \
            else name
        raw["output_dir"] = f"{source.rpartition('/')[0]}{'/' if '/' in source else ''}{name}-fitted"
        why = f"named for --model_name_or_path {model}; "
    said = f"output_dir {raw['output_dir']} ({why}the source's {source} is left to its run)"
    ckpts = run_dir.list_checkpoints(source) if not raw.get("resume_from_checkpoint") else []
    other = _another_run(args, ckpts[-1][1]) if ckpts else None
    if ckpts and other is None:
        raw["resume_from_checkpoint"] = str(ckpts[-1][1])
        said += f", resuming from {ckpts[-1][1]}"
    elif ckpts:
        said += f", starting over ({other})"
    if device.lower() != "cpu" and args.get("device") == "cpu":
        raw = _put(raw, "device", "gpu")
        said += f"; device gpu (the source's cpu: the layout was fitted for {device})"
    if Path(path).suffix.lower() in YAML_SUFFIXES:  # -o names the format, whatever the source's
        import yaml

        text = yaml.safe_dump(raw, sort_keys=False, default_flow_style=False, allow_unicode=True)
    else:
        text = json.dumps(raw, indent=4, ensure_ascii=False) + "\n"  # as the YAML above: a file to read and edit
    atomic.write_text(path, text)  # an OSError is one `error:` line, exit 1 (cli.py)
    return said, given


def _another_run(args, ckpt) -> str | None:
    """The line naming checkpoint `ckpt` and what makes it one `train` would refuse to resume the fitted run from,
    or None: PaddleNLP's Trainer wrote it (`storage.intact.paddlenlp_checkpoint`'s own line, the one `train` refuses
    it with, its advice naming `ckpt`), or it is another model's or another sequence length's
    (`training.resume_checks.mismatch`). None too when its config.json cannot be read, which `train` names as it
    resumes."""
    from pretrain_cli.orchestration.opened import build_model_config
    from pretrain_cli.storage.intact import paddlenlp_checkpoint
    from pretrain_cli.training.resume_checks import mismatch

    if foreign := paddlenlp_checkpoint(ckpt):
        return foreign
    model_cfg = build_model_config(args)[1]
    try:
        reason = mismatch(ckpt, model_cfg, args.get("max_seq_length"))
    except (UserError, OSError, ValueError):  # its config.json unreadable or not a model's
        return None
    return None if reason is None else f"{ckpt}: {reason}"


def _put(raw: dict, key: str, value) -> dict:
    """`raw` with `key` set, in the place of the file's other name for it (PaddleNLP's or PaddleFormers', e.g.
    `tensor_model_parallel_size`, `attn_impl`): a file holding both names of one key is refused when read."""
    from pretrain_cli.config.paddlenlp_keys import ALIASES

    if not any(ALIASES.get(k) == key for k in raw):
        return {**raw, key: value}
    return {key if ALIASES.get(k) == key else k: value if ALIASES.get(k) == key else v for k, v in raw.items()}


def check_output(path: str, config: str | None) -> None:
    """Refuse an `-o` that cannot or must not be replaced, before the search: a directory or a missing parent
    (the rename would fail naming its temporary), the argument file being fitted (the source would be lost),
    and an existing file that is not a fitted file (`output_dir` ending in `-fitted`, as `write_fitted` writes it).
    A fitted file is replaced, so re-running the same `plan --fit -o` refreshes it."""
    from pretrain_cli.config.keys import KEYS
    from pretrain_cli.config.parser import read_argument_file

    out = Path(path)
    if out.is_dir():
        raise UserError(f"-o {path}: is a directory; give the fitted file's path, e.g. -o {out / 'fitted.json'}")
    parent = out.parent
    if not parent.is_dir():
        raise UserError(f"-o {path}: {parent} is not an existing directory; create it or write the file elsewhere")
    if not out.exists():
        return
    if config is not None and out.resolve() == Path(config).resolve():
        raise UserError(f"-o {path}: is the argument file being fitted; write the fitted file to another path")
    try:
        raw = read_argument_file(path)
    except UserError:
        raw = {}
    if not (set(raw) <= set(KEYS) and str(raw.get("output_dir", "")).endswith("-fitted")):
        raise UserError(f"-o {path}: exists and is not a fitted argument file `plan --fit -o` wrote; "
                        f"choose another path, or remove it")


def _token_count(text: str, overrides: list[str]) -> float:
    """--tokens as a number: 10B, 500M, 2.5T, 1e10 or 10000000000; with --max_steps too the length is given twice."""
    from pretrain_cli.config.parser import override_keys

    if any(ours == "max_steps" for _, ours in override_keys(overrides)):
        raise UserError(f"--tokens {text} and --max_steps both set the run's length; give one")
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}.get(text.strip()[-1:].upper(), 1.0)
    try:
        tokens = float(text.strip()[:-1] if scale != 1.0 else text) * scale
    except ValueError:
        tokens = 0.0
    if not 0 < tokens < float("inf"):
        raise UserError(f"--tokens: {text!r} is no token count; give one such as 10B, 500M or 1e10")
    return tokens


SAY_AFTER = 2.0  # seconds a layout search is projected to take from which it says so


class Searching:
    """`planning.fit.search`'s progress (`progress(total, what)`): once the first candidates project the search to
    take more than SAY_AFTER seconds (DeepSeek-V3 on 224 H100: 8,580 candidates a search, minutes; a small model's
    thousands take one), one line on stderr saying what it searches (stdout stays the report, or the one JSON
    object), and on a terminal tqdm's bar from there, cleared when the search ends."""

    def __init__(self, total: int, what: str):
        self.total, self.what, self.done, self.start, self.bar = total, what, 0, time.monotonic(), None
        self.said = False

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif not self.said and self.done >= 32 and (time.monotonic() - self.start) / self.done * self.total > SAY_AFTER:
            self.said = True
            print(f"plan: searching {self.total:,} candidate layouts ({self.what}) for the ones that fit",
                  file=sys.stderr, flush=True)
            if sys.stderr.isatty():
                from tqdm import tqdm

                self.bar = tqdm(total=self.total, initial=self.done, file=sys.stderr, unit="layout", leave=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def main(ns: argparse.Namespace) -> int:
    # --fit's own options are refused without it, not ignored: the user meant them to change something
    if ns.output is not None and not ns.fit:
        raise UserError("-o: writes the fitted file, so it needs --fit; add --fit")
    if ns.margin is not None and not ns.fit:
        raise UserError("--margin: only used with --fit; add --fit")
    if ns.measured_mfu is not None and ns.fit:
        raise UserError("--measured_mfu: measured on the file's layout, and --fit times other layouts; give --fit "
                        "the kernels' share of peak as --mfu, or plan the file without --fit")
    if ns.output is not None and not ns.output.strip():
        raise UserError("-o: empty path; give the fitted file's path, e.g. -o fitted.json")
    if ns.output:
        check_output(ns.output, ns.config)
    margin = fit_search.DEFAULT_MARGIN if ns.margin is None else ns.margin
    from pretrain_cli.orchestration import planned

    node = hardware.Node(ns.gpus_per_node, ns.cross_node_gbps)
    if ns.tokens is not None:  # a step's tokens as this target runs the file (its data ranks), then the steps
        tokens = _token_count(ns.tokens, ns.overrides)
        # (--fit keeps the global batch: the same steps)
        per_step = planned.from_file(ns.config, ns.overrides, ns.device, ns.gpus, ns.mfu, False,
                                     peak_tflops=ns.peak_tflops, node=node).tokens_per_step
        ns.overrides = [*ns.overrides, "--max_steps", str(math.ceil(tokens / per_step))]
    if not ns.fit:
        r = planned.from_file(ns.config, ns.overrides, ns.device, ns.gpus, ns.mfu, peak_tflops=ns.peak_tflops,
                              node=node, measured_mfu=ns.measured_mfu, progress=Searching)
        print(json.dumps(r.to_json(), indent=2, ensure_ascii=False) if ns.json else format_report(r))
        return 0
    args, f = planned.fit_file(ns.config, ns.overrides, ns.device, ns.gpus, ns.mfu, margin, ns.peak_tflops,
                               node=node, progress=Searching)
    device = ns.device if ns.device and ns.device.lower() != "gpu" else f["device"]["name"]  # (`own_device`)
    if ns.output and f["after"] is not None:  # every key written is in the printed changes: the command line's too
        said, given = write_fitted(args, f["change"], ns.output, device, ns.tokens)
        f = {**f, "given": given}
    if not ns.json and f["notes"]:
        print("\n".join(f"note: {n}" for n in f["notes"]))
    print(json.dumps(f, indent=2, ensure_ascii=False) if ns.json else fit_report.format_fit(f))
    if ns.output and f["after"] is not None and not ns.json:
        print(f"wrote {ns.output}: {said}; {next_steps(ns.output, device, f['gpus'], ns.gpus_per_node)}")
    elif ns.output and f["after"] is None:  # (under --json on stderr: stdout is the one JSON object)
        print(nothing_written(ns.output, f), file=sys.stderr if ns.json else sys.stdout)
    return 0 if f["after"] is not None else 1


def nothing_written(path: str, f: dict) -> str:
    """The line `-o` gets when no layout fits: no file, and how to get one (the device count --fit found)."""
    more = f.get("more_devices")
    how = (f"; `--gpus {more['gpus']} --fit -o {path}` writes the layout that fits there" if more
           else "; use devices with more memory")
    return f"nothing written: -o {path}: no layout fits {f['gpus']} x {f['device']['name']} (above){how}"


def next_steps(path: str, device: str, gpus: int, per_node: int) -> str:
    """How to check and start the fitted file where it will run. A GPU file checked on a GPU-less laptop without
    `--world_size` is checked as this CPU's one-process run (and refused for memory); `scripts/launch.sh` starts
    every visible GPU of a node, or NPROC CPU processes (docs/DISTRIBUTED.md), so a part of a node is named."""
    gpu = device.lower() != "cpu"
    check = f"`pretrain-cli check {path}{f' --world_size {gpus}' if gpu or gpus > 1 else ''}` validates it" + (
        " on any machine" if gpu else "")
    if gpus <= 1:
        return f"{check}, `pretrain-cli train {path}` runs it"
    nodes, here = (gpus // per_node, per_node) if gpus > per_node else (1, gpus)
    env = f"NPROC={here} " if not gpu else f"DEVICES={','.join(map(str, range(here)))} " if here < per_node else ""
    if nodes > 1:
        env += f"MASTER=<node 0's ip:port> NNODES={nodes} NODE_RANK=<0..{nodes - 1}> "
    return (f"{check}, `{env}scripts/launch.sh {path}` {f'on each of its {nodes} nodes ' if nodes > 1 else ''}"
            f"runs it ({here} {'GPUs' if gpu else 'processes'} a node)")
