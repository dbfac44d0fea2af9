"""What the same command starts from when it is run again, for the lines that tell the user to re-run: the one judge
(`judge`) of the run's output settings that both a stop's line (`training.run_end.stop_message`) and the watchers'
lines (`resumes`) follow. Why: the advice named `checkpoint-N` literally, true whether checkpoint-50 existed or none
did; and it said "resume from out/checkpoint-3" under overwrite_output_dir: true, whose re-run removes checkpoint-3
and starts at step 0, and under an explicit resume_from_checkpoint, which the re-run resumes instead. The newest
published `checkpoint-N` is read from output_dir as it is when the line is written; a published one is complete by
construction (`run_dir`), whether its files are undamaged is checked by the re-run itself (`storage.intact`), not
here: this runs in the forked watchers, which must answer at once. Plain os calls only (no Paddle)."""
from __future__ import annotations

from pretrain_cli import run_dir

NAMED, OVER, NEWEST = "named", "over", "newest"  # resume_from_checkpoint; overwrite_output_dir: step 0; the newest


def judge(overwrite: bool, resume_from) -> str:
    """Where the same command starts (`orchestration.resumed.find_resume`'s order): the checkpoint that
    resume_from_checkpoint names, even under overwrite (NAMED); step 0 under overwrite_output_dir (OVER); else the
    newest complete checkpoint of output_dir, if any (NEWEST)."""
    if resume_from:
        return NAMED
    return OVER if overwrite else NEWEST


def resumes(output_dir, overwrite: bool = False, resume_from=None) -> str:
    """What follows "re-run ... to": `resume from out/checkpoint-50, the newest complete checkpoint` | `start from step
    0 (out holds no complete checkpoint)` | under overwrite `start again from step 0 (...)` | `resume from X, the
    checkpoint resume_from_checkpoint names` | (output_dir unknown) the newest complete one of output_dir, if any."""
    how = judge(overwrite, resume_from)
    newest = None
    if output_dir:
        try:
            newest = run_dir.latest_checkpoint(output_dir)
        except OSError:
            newest = None
    if how == NAMED:
        later = (f" (to continue from the newest complete one instead, set it to {newest})"
                 if newest is not None and str(newest) != str(resume_from) else "")
        return f"resume from {resume_from}, the checkpoint resume_from_checkpoint names{later}"
    if how == OVER:
        keep = (f"; to continue instead, set resume_from_checkpoint to {newest} (the newest complete checkpoint)"
                if newest is not None else "")
        return f"start again from step 0 (overwrite_output_dir: true removes the earlier checkpoints){keep}"
    if not output_dir:
        return "resume from the newest complete checkpoint of output_dir, if any"
    if newest is None:
        return f"start from step 0 ({output_dir} holds no complete checkpoint)"
    return f"resume from {newest}, the newest complete checkpoint"
