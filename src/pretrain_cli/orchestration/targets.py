"""Where a run executes, as `config.resolve` needs it (`run_config.Target`): this process under Paddle's launcher
(`train`, `check`), one process of this Paddle build's device kind (`eval`, `generate`), or a simulated launch
(`check --world_size`); and the kernels `eval` and `generate` build a model with."""
from __future__ import annotations

import sys

from pretrain_cli.config.parser import Arguments, parse_config
from pretrain_cli.errors import UserError
from pretrain_cli.run_config import KernelConfig, RunConfig, Target


def launcher_target() -> Target:
    """This process as `paddle.distributed.launch` started it, on the device kind this Paddle build runs."""
    from pretrain_cli import runtime
    from pretrain_cli.distributed.launcher import launch

    gpu = runtime.gpu_build_installed()
    return Target(device="gpu" if gpu else "cpu", world_size=launch.world_size(), rank=launch.rank(),
                  local_rank=launch.local_rank(), gpu_name=runtime.gpu_name() if gpu else None,
                  gpu_capability=runtime.gpu_capability() if gpu else None)


def inference_target() -> Target:
    """One process on the device kind this Paddle build runs: where `eval` and `generate` run."""
    from pretrain_cli import runtime

    gpu = runtime.gpu_build_installed()
    return Target(device="gpu" if gpu else "cpu", gpu_name=runtime.gpu_name() if gpu else None,
                  gpu_capability=runtime.gpu_capability() if gpu else None)


# the argument file of a model no run wrote (`inference_kernels`), which kernel overrides change
SNAPSHOT_ARGUMENTS = ("--use_flash_attention", "true")


def inference_kernels(run: RunConfig | None = None, arguments: Arguments | None = None,
                      model_cfg=None, mask: str = "causal") -> tuple[KernelConfig, str]:
    """(kernel request, device) for `eval` and `generate`: a run's own (`eval --config`: the same resolution
    as `train`), else what the run's `arguments` (a run's args.json) or, for a model no run wrote, an argument
    file setting `use_flash_attention: true` resolves to here: what that path costs `train` (on CPU, fp32
    probabilities kept for the backward) a forward alone never pays, and its CPU block kernel computes the losses
    of the scores' path, faster; a GPU in fp32 keeps the math path by `train`'s own rule, and `model_cfg`'s head
    width is judged as a forward's under `mask`, the mask the command runs (`config.compute.flash_width`: where
    flash-attn's forward refuses it, the math path, so the `kernels:` line names what runs). Where the width turns
    flash attention away its note is printed (`note: use_flash_attention: ...`), as `train` prints it at start-up:
    the run's kernels then never reach the kernels' own warning, so nothing else would say why."""
    if run is not None:
        kernels, device, notes = run.kernels, run.device, list(run.notes)
    else:
        from pretrain_cli.config.compute import kernels_for

        target, notes = inference_target(), []
        if arguments is None:
            arguments = parse_config(None, list(SNAPSHOT_ARGUMENTS))
        kernels = kernels_for(arguments, target, notes, model_cfg=model_cfg, mask=mask)
        device = target.device
    from pretrain_cli.config.compute import WIDTH_NOTE

    for note in notes:
        if note.startswith(WIDTH_NOTE):
            print(f"note: {note}", file=sys.stderr)
    return kernels, device


def simulated_target(world_size: int) -> Target:
    """Rank 0 of a `world_size`-process launch, without a launcher (`check --world_size`): the file's `device`
    is kept (a GPU run is checked as one on any machine), so every rule `train` applies to that world runs."""
    if world_size < 1:
        raise UserError(f"--world_size: must be >= 1, got {world_size}")
    return Target(device="gpu", world_size=world_size)
