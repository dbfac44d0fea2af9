"""What a re-run of a failed job starts from, for the lines that tell the user to re-run: the newest published
`checkpoint-N` of the run's output_dir as it is when the line is written, or step 0 when there is none. Why: the
advice named `checkpoint-N` literally, true whether checkpoint-50 existed or none did, and a user could not tell a run
that would resume at step 50 from one that would start over. A published `checkpoint-N` is complete by construction
(`run_dir`); whether its files are undamaged is checked by the re-run itself (`storage.intact`), not here: this runs in
the forked watchers, which must answer at once. Plain os calls only (no Paddle)."""
from __future__ import annotations

from pretrain_cli import run_dir


def resumes(output_dir) -> str:
    """`resume from out/checkpoint-50, the newest complete checkpoint` | `start from step 0 (out holds no complete
    checkpoint)` | (output_dir unknown) `resume from the newest complete checkpoint of output_dir, if any`."""
    if not output_dir:
        return "resume from the newest complete checkpoint of output_dir, if any"
    try:
        newest = run_dir.latest_checkpoint(output_dir)
    except OSError:
        newest = None
    if newest is None:
        return f"start from step 0 ({output_dir} holds no complete checkpoint)"
    return f"resume from {newest}, the newest complete checkpoint"
