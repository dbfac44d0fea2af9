"""config.one_process: the note of a multi-process file run as one process names what runs it on more: `check
--world_size N` from a shell, launch.sh's own NPROC (CPU) or DEVICES (GPUs) under scripts/launch.sh, whose ranks
have `job.VERDICTS_ENV`."""
from run_helpers import resolve_run
from pretrain_cli.distributed.launcher.job import VERDICTS_ENV

EP2 = ("--expert_parallel_degree", "2")


def _note(*flags, **kw) -> str:
    run = resolve_run(*EP2, *flags, model="micro-qwen3-moe", **kw)
    return next(n for n in run.notes if n.startswith("parallel: "))


def test_from_a_shell_check_checks_it(monkeypatch):
    monkeypatch.delenv(VERDICTS_ENV, raising=False)
    assert _note() == ("parallel: one process, so expert_parallel_degree=2 has no effect; the file's layout needs 2 "
                       "processes: `check --world_size 2` checks it as they run it")


def test_under_launch_sh_its_own_setting_starts_them(monkeypatch, tmp_path):
    """It said `check --world_size 2` to a user who had launched, where NPROC=2 is what they change."""
    monkeypatch.setenv(VERDICTS_ENV, str(tmp_path))
    assert _note().endswith("needs 2 processes: `NPROC=2 scripts/launch.sh` starts them")
    assert _note("--device", "gpu", device="gpu", gpu_name="A100").endswith("`DEVICES=0,1 scripts/launch.sh` starts them, one per GPU")
