"""What the same command starts from when it is run again, for the lines that tell the user to re-run: the one judge
(`judge`) of the run's output settings that both a stop's line (`training.run_end.stop_message`) and the watchers'
lines (`resumes`) follow. Why: the advice named `checkpoint-N` literally, true whether checkpoint-50 existed or none
did; and it said "resume from out/checkpoint-3" under overwrite_output_dir: true, whose re-run removes checkpoint-3
and starts at step 0, and under an explicit resume_from_checkpoint, which the re-run resumes instead. The newest
published `checkpoint-N` is read from output_dir as it is when the line is written; a published one is complete by
construction (`run_dir`), whether its files are undamaged is checked by the re-run itself (`storage.intact`), not
here: this runs in the forked watchers, which must answer at once. Plain os calls only (no Paddle).

A named checkpoint beside later ones in output_dir is refused without overwrite (`orchestration.resumed.
later_checkpoints`), so there the advice names the newest instead (`past`); and a MAX_RESTART restart of launch.sh,
whose own attempt wrote them, resumes from the newest (`restart`): it said "to resume from src-ckpt-4" and was refused,
exit 2, its own checkpoint-8 called another run's; under the user's overwrite_output_dir: true a restart starts over
as its first attempt did until the job wrote a checkpoint (that attempt may have failed before its overwrite)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from pretrain_cli import run_dir

# resume_from_checkpoint; that one refused beside later checkpoints; overwrite_output_dir: step 0; the newest
NAMED, REFUSED, OVER, NEWEST = "named", "refused", "over", "newest"
AS_SET = "PRETRAIN_CLI_AS_SET"  # under launch.sh's restarts: the user's own output settings (`as_set`)


def as_set(output_dir, overwrite: bool, resume_from) -> tuple:
    """(output_dir, overwrite, resume_from) the user's own command runs with: the run's, except in a launch.sh
    MAX_RESTART restart (`PRETRAIN_CLI_RESTART` > 0), which runs with `--overwrite_output_dir false` and perhaps a
    `--resume_from_checkpoint` of its own: then the user's, as `job.py restart` read them (`AS_SET`, JSON). The
    watchers' advice to re-run the same command named launch.sh's values ("as set, out/checkpoint-8 is refused"),
    which the user never set and the same command does not pass."""
    try:
        restarted = int(os.environ.get("PRETRAIN_CLI_RESTART") or 0) > 0
        own = json.loads(os.environ.get(AS_SET) or "null") if restarted else None
    except ValueError:
        own = None
    if not isinstance(own, dict):
        return output_dir, overwrite, resume_from
    return output_dir, own.get("overwrite") is True, own.get("resume_from") or None


def judge(overwrite: bool, resume_from, output_dir=None) -> str:
    """Where the same command starts (`orchestration.resumed.find_resume`'s order): the checkpoint that
    resume_from_checkpoint names, even under overwrite (NAMED), unless, without overwrite, `output_dir` holds
    checkpoints past its step (`past`), beside which `later_checkpoints` refuses it (REFUSED: not judged when
    output_dir is unknown); step 0 under overwrite_output_dir (OVER); else the newest complete checkpoint of
    output_dir, if any (NEWEST). The one place a stop's line (`stop_message`) and the watchers' (`resumes`) ask."""
    if resume_from:
        return REFUSED if not overwrite and past(output_dir, resume_from) else NAMED
    return OVER if overwrite else NEWEST


def resumes(output_dir, overwrite: bool = False, resume_from=None) -> str:
    """What follows "re-run ... to": `resume from out/checkpoint-50, the newest complete checkpoint` | `start from step
    0 (out holds no complete checkpoint)` | under overwrite `start again from step 0 (...)` | `resume from X, the
    checkpoint resume_from_checkpoint names` | (output_dir unknown) the newest complete one of output_dir, if any."""
    how = judge(overwrite, resume_from, output_dir)
    newest = None
    if output_dir:
        try:
            newest = run_dir.latest_checkpoint(output_dir)
        except OSError:
            newest = None
    if how == REFUSED:
        return (f"resume from {newest}, the newest complete checkpoint, with resume_from_checkpoint set to it (as set, "
                f"{resume_from} is refused: {output_dir} holds {beyond(output_dir, resume_from)} past its step)")
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


def _step(checkpoint) -> int | None:
    """The step of `checkpoint` as a resume reads it (its trainer_state.json's global_step), else its name's number,
    else None."""
    path = Path(checkpoint)
    try:
        step = json.loads((path / run_dir.STATE_FILE).read_text())["global_step"]
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    except (OSError, ValueError, TypeError, KeyError):
        pass
    m = run_dir.CHECKPOINT.match(path.name)
    return int(m.group(1)) if m else None


def past(output_dir, resume_from) -> list[Path]:
    """The checkpoints of `output_dir` past the step of `resume_from`, oldest first: what `later_checkpoints` refuses
    a resume from it beside (without overwrite); [] when either is unknown."""
    return _past_step(output_dir, _step(resume_from) if resume_from else None)


def beyond(output_dir, resume_from) -> str:
    """The names of `past`, for the lines that say why the same command is refused (REFUSED)."""
    return ", ".join(p.name for p in past(output_dir, resume_from))


def _past_step(output_dir, step: int | None) -> list[Path]:
    """`run_dir.checkpoints_past`, the one judge of what lies past a step, read where the watchers must answer at
    once: [] when output_dir or the step is unknown, or output_dir cannot be read."""
    if step is None or not output_dir:
        return []
    try:
        return run_dir.checkpoints_past(output_dir, step)
    except OSError:
        return []


def identity(checkpoint) -> str | None:
    """`checkpoint-N:inode:ctime` of a checkpoint directory (None: gone), what launch.sh notes before its first
    attempt (`job.py checkpoints`). Not the name alone: under overwrite_output_dir the first attempt removes another
    run's checkpoint-8 and publishes its own under that name (a new directory renamed into place: another inode and
    ctime), which by name was taken for the other run's and the restart refused beside it."""
    try:
        st = Path(checkpoint).stat()
    except OSError:
        return None
    return f"{Path(checkpoint).name}:{st.st_ino}:{st.st_ctime_ns}"


def identities(output_dir) -> list[str]:
    """The `identity` of each checkpoint output_dir holds (none where it cannot be read)."""
    try:
        found = [identity(p) for _, p in run_dir.list_checkpoints(output_dir)]
    except OSError:
        return []
    return [i for i in found if i]


def restart(output_dir, resume_from, before, overwrite: bool = False) -> tuple[str | None, str, bool]:
    """(the checkpoint launch.sh's MAX_RESTART restart passes as resume_from_checkpoint, or None; what follows "restart
    k of N, to"; whether it keeps the user's overwrite_output_dir: true, else it runs with overwrite_output_dir false).
    A restart continues as the first attempt would have. Past a named checkpoint lie only checkpoints this
    job wrote (none of them among `before`, the `identity` of each checkpoint output_dir held when launch.sh began):
    it continues from the newest; the very directories held before it began are another run's, which the restart is
    refused beside as the first attempt was (unless that attempt failed before its check). Under the user's
    overwrite_output_dir: true it continues from a checkpoint this job wrote, and, where there is none, starts over
    with the overwrite as the first attempt did: passed overwrite false, a first attempt that failed before its
    overwrite had removed another run's checkpoints was refused beside them (named) or resumed another run's newest."""
    if overwrite:
        removed = _overwritten(output_dir, resume_from)  # (until this job wrote one: another run's)
        if not [p for p in removed if identity(p) not in before]:
            return None, _over_again(output_dir, resume_from, removed), True
    beyond = past(output_dir, resume_from)
    if not beyond:
        return None, resumes(output_dir, False, resume_from), False
    theirs = [p.name for p in beyond if identity(p) in before]
    if theirs:
        return None, (f"resume from {resume_from}, the checkpoint resume_from_checkpoint names, which is refused: "
                      f"{output_dir} held {', '.join(theirs)} past it before this job began (another run's)"), False
    return str(beyond[-1]), (f"resume from {beyond[-1]}, the newest complete checkpoint (this job's own, past "
                             f"{resume_from}, which resume_from_checkpoint names)"), False


def _overwritten(output_dir, resume_from) -> list[Path]:
    """The checkpoints of output_dir that overwrite_output_dir removes as a run starts, judged as the run's removal
    (`training.checkpoint.remove_past`) and check's line (`orchestration.opened.overwritten`) judge it, by
    `run_dir.checkpoints_past` from the step the run starts at: the named checkpoint's, else 0 (a checkpoint-0 is
    kept; this counted it, so the restart's line said the overwrite removes one it keeps)."""
    return _past_step(output_dir, _step(resume_from) if resume_from else 0)


def _over_again(output_dir, resume_from, removed: list[Path]) -> str:
    """What follows "restart k of N, to" when the restart keeps the user's overwrite: where it starts, and what the
    overwrite removes (all of it held before this job began)."""
    gone = (f"; the overwrite removes {', '.join(p.name for p in removed)}, which {output_dir} held before this job "
            f"began" if removed else "")
    if resume_from:
        return (f"resume from {resume_from}, the checkpoint resume_from_checkpoint names, with overwrite_output_dir: "
                f"true as the first attempt (this job has written no checkpoint past it{gone})")
    return (f"start again from step 0, with overwrite_output_dir: true as the first attempt (this job has written no "
            f"checkpoint{gone})")
