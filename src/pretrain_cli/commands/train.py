"""`pretrain-cli train` / `scripts/run_pretrain.py`: prepare the run (no Paddle), then train it."""
from __future__ import annotations

import argparse
import json

EPILOG = """Every key of the argument file (docs/COMPATIBILITY.md, or --help-keys) can follow the file as
--key value; later values win (default < file < command line). Bools take true/false/1/0, --flag alone
means true and --no_flag false. Examples:
  pretrain-cli train configs/demo_cpu.json --max_steps 100 --learning_rate 1e-3
  python -m paddle.distributed.launch --nproc_per_node 2 scripts/run_pretrain.py configs/demo_cpu.json"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--help-keys", action="store_true", help="list every argument-file key with its meaning")


def main(ns: argparse.Namespace) -> int:
    if ns.help_keys:
        from pretrain_cli.config.keys import KEYS

        for key, s in KEYS.items():
            print(f"--{key} ({s.section}, default {json.dumps(s.default)}): {s.help}")
        return 0
    from pretrain_cli import start_signals

    # before any import that starts threads (numpy's OpenBLAS, in prepare): they block SIGTERM as this
    # thread does, until Paddle's import has decided SIGTERM's disposition (`start_signals.hold_stop_signals`)
    start_signals.hold_stop_signals()
    try:
        return _train(ns)
    finally:
        start_signals.release_stop_signals()  # (a run that ended before Paddle's import: a usage error)


def _train(ns: argparse.Namespace) -> int:
    from pretrain_cli import runtime
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.orchestration.targets import launcher_target
    from pretrain_cli.distributed.launcher import launch
    from pretrain_cli.training.launch_logs import say_start

    say_start()  # a launched rank's first workerlog line: which lines are this launch's (`launch_logs`)
    launch.end_with_launcher()  # a launched rank stops at its launcher's death, and ends by a deadline
    runtime.setup_env(threads=runtime.default_threads(launch.local_size()))  # before anything imports Paddle
    spec = prepare(ns.config, ns.overrides, launcher_target(), lock=True)
    from pretrain_cli.errors import OUT_OF_MEMORY, DeviceOutOfMemory, is_out_of_memory
    from pretrain_cli.training.run import in_context, run

    try:
        return run(spec)
    except DeviceOutOfMemory as e:  # its line written anew, keeping a killed run's note (`in_context`)
        line = out_of_memory_line(ns, spec, e.step, peak_memory(spec.run.device))
        raise DeviceOutOfMemory(e.step, in_context(line, e)) from e
    except OUT_OF_MEMORY as e:  # building the model or the optimizer, before the first step
        if not is_out_of_memory(e):
            raise
        raise DeviceOutOfMemory(0, in_context(out_of_memory_line(ns, spec, 0, peak_memory(spec.run.device)), e)) from e


def peak_memory(device: str) -> str:
    """This process's peak: host RSS on CPU (VmHWM), the allocator's reserved peak on a GPU."""
    if device == "gpu":
        import paddle

        return f"{paddle.device.cuda.max_memory_reserved() / 2**30:.2f} GiB on the GPU"
    from pretrain_cli.training.metrics import host_memory_gib

    return f"{host_memory_gib()[1]:.2f} GiB"


def out_of_memory_line(ns: argparse.Namespace, spec, step: int, peak: str | None = None) -> str:
    """One line: where it ran out, the process's `peak`, and `plan --fit`'s layout for this run
    (`orchestration.out_of_memory_hint.out_of_memory_line`)."""
    from pretrain_cli import runtime
    from pretrain_cli.orchestration.out_of_memory_hint import out_of_memory_line as line

    gpu = None if spec.run.device == "cpu" else (runtime.gpu_name() or "")
    return line(spec.args, spec.model_cfg, spec.run, ns.config, step, gpu, peak)
