"""What a watcher's line says of the checkpoints being written in the background (`async_save`) when the host's ranks
are stopped: which checkpoint, by whom, and that it is not saved.

A rank's phase is its training thread's (`progress`); with `async_save` a thread of the rank writes checkpoint-N
meanwhile, and rank 0's publishes it once every rank's part is in. A rank stopped, killed or hung while that write is
under way never finishes its part, and the watchers then kill every rank of the host, the other ranks' writes too:
checkpoint-N is never published. The line said only `made no progress for 10 s while in forward/backward at step 8`,
true of the training thread, while the log's last save line, `checkpoint-6: stalled 0.01 s (async)`, read as saved;
the re-run then resumed from checkpoint-3, unexplained. The watchers' re-run advice (`rerun.resumes`) names the
checkpoint the re-run takes instead. Plain os calls only (the watchers run no Paddle).
"""
from __future__ import annotations

from pretrain_cli import run_dir


def clause(writing: dict | None, named: list, output_dir) -> str:
    """The words added after the ranks a verdict names (`named`) for `writing` ({str(rank): the checkpoint step its
    background write writes}, `verdict.with_writes`): ", with its background write of checkpoint-6 unfinished:
    checkpoint-6 was not saved" when a named rank was writing, "; the background write of checkpoint-6 (rank 0) was
    cut short: checkpoint-6 was not saved" when only other ranks of its host were; "" when nothing was in flight, or
    what was is published in `output_dir` by now (None: not known, taken as not saved)."""
    if not writing:
        return ""
    by_rank = {int(r): int(step) for r, step in writing.items()}
    lost = sorted({step for step in by_rank.values() if not _published(output_dir, step)})
    if not lost:
        return ""
    saved = f"{_names(lost)} {'was' if len(lost) == 1 else 'were'} not saved"
    own = sorted({by_rank[r] for r in named if r in by_rank} & set(lost))
    if own:
        whose = "its" if len(named) == 1 else "their"
        return f", with {whose} background write of {_names(own)} unfinished: {saved}"
    writers = sorted(r for r, step in by_rank.items() if step in lost)
    ranks = f"rank {writers[0]}" if len(writers) == 1 else f"ranks {', '.join(map(str, writers))}"
    return f"; the background write of {_names(lost)} ({ranks}) was cut short: {saved}"


def _names(steps: list) -> str:
    names = [f"checkpoint-{s}" for s in steps]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _published(output_dir, step: int) -> bool:
    """Whether checkpoint-`step` is in `output_dir` (published: complete by construction, `run_dir`)."""
    return bool(output_dir) and run_dir.checkpoint_dir(output_dir, step).is_dir()
