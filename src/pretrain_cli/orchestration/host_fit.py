"""Will a CPU training run fit in this machine's memory? Answered before it starts, from `plan`'s own memory model.

A CPU run that outgrows the machine is not told so by Paddle: the kernel's out-of-memory killer ends it with
SIGKILL (exit 137, no message of ours can be printed). So `check` and `train` (`orchestration.prepare`, every rank)
plan the resolved run as `plan --device cpu` does (`planning.plan.setup_for`, `planning.memory.estimate` and
`startup_parts`: the activations with the run's recompute and attention kernel, the fused loss's chunk), add what
each process holds beyond Paddle's allocator (`RUNTIME_GIB`), multiply by the processes this host runs, and compare
with what the machine has available (`planning.hardware.host_available_gib`: MemAvailable, or the cgroup's room).
Clearly too large: refused in one line naming the keys to lower; close (within the model's measured error,
`MEASURED_ERROR`): a note. Pure arithmetic: nothing is allocated, Paddle is not imported.
"""
from __future__ import annotations

import dataclasses

from pretrain_cli.config.one_process import fewest_processes, stated_data_parallel, stated_process_counts
from pretrain_cli.planning import hardware
from pretrain_cli.planning.memory import GIB, estimate, startup_parts
from pretrain_cli.planning.plan import Device, setup_for

# What a training process holds beyond the tensors Paddle's host allocator counts (what the memory model counts):
# the interpreter, Paddle's libraries and the CPU kernels loaded, the data's index and pages read. Measured: peak RSS
# less the planned tensors of tiny-qwen2 at 1 and 8 sequences of 256 tokens (0.33 GiB; docs/TRAINING.md).
RUNTIME_GIB = 0.35
# The measured peak RSS of `train` over the prediction (plan + RUNTIME_GIB), about the lowest and highest seen in
# the calibration (benchmarks/cpu_run_memory.py; docs/TRAINING.md, "Host memory on CPU"), with a margin: a run is
# refused only when even the lowest would not fit, noted when the highest would not. With the CPU kernels and without
# `full` recompute -9 % to +7 % measured. Under `full` recompute +18 % to +62 % (growing with the micro-batch), on
# Paddle's own ops (`cpu_fused_ops: false`) +30 %, +119 % with `full` recompute: the wide band. Not tensors plan
# misses (Paddle's allocator peaks at or below plan there): memory freed to glibc's malloc that it keeps resident
# (docs/TRAINING.md, "Host memory on CPU").
MEASURED_ERROR, UNCALIBRATED_ERROR = (0.90, 1.20), (1.0, 2.5)


def measured_error(run) -> tuple[float, float]:
    """(lowest, highest) measured peak RSS over the prediction for runs like `run` (`MEASURED_ERROR`)."""
    close = run.kernels.cpu_ops and run.recompute_granularity != "full"
    return MEASURED_ERROR if close else UNCALIBRATED_ERROR


def processes_here(world_size: int) -> int:
    """The training processes this host runs: the launcher's ranks on this node (`PADDLE_LOCAL_SIZE`) under a launch,
    else the world asked about (`check --world_size N` of a CPU file: N processes on this machine, as
    `--nproc_per_node N` starts them)."""
    from pretrain_cli.distributed.launcher import launch

    return max(min(launch.local_size(), world_size), 1) if launch.world_size() > 1 else max(world_size, 1)


def planned_gib(run, model_cfg, micro_batch: int | None = None, recompute: str | None | bool = False) -> float:
    """One process's planned peak (GiB): the larger of the steady-state step and start-up, plus `RUNTIME_GIB`;
    `micro_batch` / `recompute` (a granularity, or None for off) replace the run's to ask what a change would need."""
    setup = setup_for(run, model_cfg, Device(None, 0.0))  # (attention: the kernel that runs, as plan)
    if micro_batch is not None:
        setup = dataclasses.replace(setup, micro_batch=micro_batch)
    if recompute is not False:
        setup = dataclasses.replace(setup, recompute=recompute)
    return max(sum(estimate(setup).values()), sum(startup_parts(setup).values())) / GIB + RUNTIME_GIB


def check(run, model_cfg, config_path: str | None, processes: int = 1,
          available: tuple[float, str] | None = None) -> tuple[str | None, str | None]:
    """(the refusal, the note) for a CPU training run `run` on `processes` processes of this host; (None, None)
    for a run that fits, a GPU run, a run without training, or a machine whose memory is unknown. `available`:
    (GiB, source) in place of this machine's (`hardware.host_available_gib`)."""
    if run.device != "cpu" or not run.loop.do_train:
        return None, None
    have, source = available or hardware.host_available_gib()
    if have != have:  # unknown (NaN): no figure to compare with
        return None, None
    per = planned_gib(run, model_cfg)
    need = per * processes
    low, high = measured_error(run)
    if need * high <= have:
        return None, None
    each = f"{processes} processes on this host x {per:.2f} GiB, each" if processes > 1 else "its"
    what = (f"planned to need {need:.1f} GiB ({each} `plan --device cpu` peak + {RUNTIME_GIB} GiB of Paddle's "
            f"runtime) and this machine has {have:.1f} GiB available ({source})")
    fix = _what_fits(run, model_cfg, have / processes, config_path)
    if need * low > have:
        return (f"per_device_train_batch_size: this CPU run is {what}: the kernel would kill it without a message; "
                f"{fix}"), None
    return None, (f"memory: this CPU run is {what}, within the estimate's error (measured peaks "
                  f"{low - 1:+.0%} to {high - 1:+.0%} of it): it may be killed by the kernel's out-of-memory killer; "
                  f"{fix}")


def gpu_question(args) -> str:
    """What a refusal for this machine's memory adds when the user did not ask for a CPU run (no `device: cpu`):
    the file was resolved to this CPU only because this Paddle has no GPU build (a login node), and the question
    its author means, whether it fits the GPUs it is written for, is `plan`'s (`--device`: `planning.hardware`).
    The N offered passes `config.parallel`: a multiple of the fewest processes, or, where the file states a
    data-parallel degree, which pins the data ranks, the counts that give it (`one_process.stated_process_counts`)."""
    if args.training.device == "cpu":
        return ""
    where = {"command line": "the command line"}.get(args.explicit.get("device"), "the file")
    said = f"{where} asks for device gpu" if "device" in args.explicit else "the file does not set device"
    least, counts = fewest_processes(args)[0], stated_process_counts(args)
    stated = " and ".join(f"{k} {d}" for k, d in stated_data_parallel(args))
    if counts:
        which = f", {' or '.join(map(str, counts))}: {stated} pin{'s' if ' and ' not in stated else ''} the data ranks"
    else:  # (no stated degree, or one no count gives: `fewest_processes` counts without it)
        which = f", a multiple of {least}" if least > 1 else ""
        which += f", without {stated}: no count gives it with the other keys" if counts == [] else ""
    return (f"; {said} and this Paddle has no GPU build, so this is the run on this machine's CPU: for GPUs, ask "
            f"`pretrain-cli plan {args.config_path or 'FILE'} --device H100` (or another of plan's --device names), "
            f"and check it as their launch with `pretrain-cli check {args.config_path or 'FILE'} --world_size N` "
            f"(N: the GPUs{which})")


def _what_fits(run, model_cfg, room: float, config_path: str | None) -> str:
    """What to lower, with the largest micro-batch dividing this one whose highest measured peak is within `room`
    GiB a process (gradient_accumulation_steps raised to keep the global batch), and whether `full` recompute alone
    would do (judged by its own, wider band)."""
    b, acc = run.loop.micro_batch, run.loop.grad_accum
    high = measured_error(run)[1]
    divisors = sorted({d for i in range(1, int(b ** 0.5) + 1) if b % i == 0 for d in (i, b // i)} - {b}, reverse=True)
    fits = next((d for d in divisors if planned_gib(run, model_cfg, d) * high <= room), None)
    if fits:
        batch = (f"lower per_device_train_batch_size to {fits} with gradient_accumulation_steps {acc * b // fits} "
                 f"(the same global batch)")
    else:
        batch = "lower per_device_train_batch_size (with gradient_accumulation_steps to keep the global batch)"
    recompute = ""
    if run.recompute_granularity != "full":
        alone = planned_gib(run, model_cfg, recompute="full") * UNCALIBRATED_ERROR[1] <= room
        key = "recompute true" if run.recompute_granularity is None else "recompute_granularity full"
        recompute = f", or set {key}{' (enough alone)' if alone else ''}"
    return (f"{batch}, max_seq_length{recompute} (`pretrain-cli plan {config_path or 'FILE'} --device cpu` shows the "
            f"breakdown)")
