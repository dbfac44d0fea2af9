"""What a watcher's line says of the checkpoints being written in the background (`async_save`) when the host's ranks
are stopped: which checkpoint, by whom, and whether it is saved.

A rank's phase is its training thread's (`progress`); with `async_save` a thread of the rank writes checkpoint-N
meanwhile, and rank 0's publishes it once every rank's part is in. A rank stopped, killed or hung while that write is
under way never finishes its part, and the watchers then kill every rank of the host, the other ranks' writes too:
checkpoint-N is never published. The line said only `made no progress for 10 s while in forward/backward at step 8`,
true of the training thread, while the log's last save line, `checkpoint-6: stalled 0.01 s (async)`, read as saved;
the re-run then resumes from checkpoint-3, unexplained. The watchers' re-run advice (`rerun.resumes`) names the
checkpoint the re-run takes instead. Plain os calls only (the watchers run no Paddle).

"Not saved" is said only once nothing can publish it any more (`_final`): each watcher kills only its own rank, so a
line written at once came before rank 0 was stopped, which could publish checkpoint-6 in that gap (its part was all
it lacked), and the line then said "checkpoint-6 was not saved ... resume from checkpoint-3" of a run whose re-run
took checkpoint-6. The watcher waits for its host's ranks to be dead or stopped first (`settle`); then a checkpoint not
published is lost for good when rank 0 is among them, or when a rank of the host lacks its part (rank 0 elsewhere
publishes only once every part is in). Otherwise (rank 0 on another host with every part here written, or a rank
still running after `WAIT` s) the line says only what it saw: not published when it was written, and that rank 0 may
still publish it; its re-run advice then names both checkpoints the re-run may take (`resume_advice`), not the one
`rerun.resumes` finds now, which is wrong if rank 0 publishes.
"""
from __future__ import annotations

import json
import time

from pretrain_cli import processes, run_dir
from pretrain_cli.distributed.launcher import rerun

WAIT = 1.0  # the longest a watcher waits for its host's ranks to be dead or stopped before it says a write is lost
# a rank's record of its finished part: `training.shard_writer.RECORD`, a layer above this one, so copied here, and
# tests/unit/test_unsaved_write.py holds the two equal (a renamed record would read as every part unwritten)
PART = "rank-{:05d}.done.json"


def settle(pids) -> None:
    """Wait until every process of `pids` (the host's ranks) is dead or stopped, for at most `WAIT` s: each watcher
    kills or holds (SIGSTOP) only its own rank, and a rank still running may yet publish a write in flight."""
    deadline = time.monotonic() + WAIT
    while not _quiet(pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def clause(writing: dict | None, named: list, output_dir, host: dict | None = None, seen: tuple | None = None) -> str:
    """The words added after the ranks a verdict names (`named`) for `writing` ({str(rank): the checkpoint step its
    background write writes}, `verdict.with_writes`), `host` being the host's ranks ({rank: pid}): ", with its
    background write of checkpoint-6 unfinished: checkpoint-6 was not saved" when a named rank was writing, "; the
    background write of checkpoint-6 (rank 0) was cut short: checkpoint-6 was not saved" when only other ranks of its
    host were; "" when nothing was in flight, or what was is published in `output_dir` by now. Where it may still be
    published (`_final`): "... under way: checkpoint-6 was not published when this line was written (rank 0 may still
    publish it)". `seen`: `states` of the same write, looked at once for the whole line (`resume_advice` too)."""
    if not writing:
        return ""
    by_rank, final, lost = seen or states(writing, output_dir, host)
    if not lost:
        return ""
    gone, pending = [s for s in lost if s in final], [s for s in lost if s not in final]
    said = "; ".join(([f"{_names(gone)} {_was(gone)} not saved"] if gone else []) + (
        [f"{_names(pending)} {_was(pending)} not published when this line was written (rank 0 may still publish "
         f"{'it' if len(pending) == 1 else 'them'})"] if pending else []))
    own = sorted({by_rank[r] for r in named if r in by_rank} & set(lost))
    if own:
        whose, state = "its" if len(named) == 1 else "their", "unfinished" if final >= set(own) else "under way"
        return f", with {whose} background write of {_names(own)} {state}: {said}"
    writers = sorted(r for r, step in by_rank.items() if step in lost)
    ranks = f"rank {writers[0]}" if len(writers) == 1 else f"ranks {', '.join(map(str, writers))}"
    state = "was under way" if pending else "was cut short"
    return f"; the background write of {_names(lost)} ({ranks}) {state}: {said}"


def resume_advice(writing: dict | None, host: dict | None, output_dir, overwrite: bool = False,
                  resume_from=None, seen: tuple | None = None) -> str | None:
    """What follows "re-run the same command: " where a checkpoint of `writing` may still be published (`clause`'s
    "rank 0 may still publish it"): "it resumes from the newest complete checkpoint (out/checkpoint-6 if rank 0
    publishes it, else out/checkpoint-3)". The re-run takes the newest published one (`rerun.NEWEST`), not known
    yet: `rerun.resumes`'s one checkpoint, beside "may still publish it", was wrong if rank 0 published. None where
    the re-run's start does not hang on it (nothing pending; resume_from_checkpoint or overwrite_output_dir decides;
    a checkpoint as new published meanwhile): `rerun.resumes` then. `seen`: the `states` `clause` said the line's
    words by: looked at again, rank 0 dying in between made the advice contradict them (not saved, yet "if rank 0
    publishes it")."""
    if not writing or not output_dir or rerun.judge(overwrite, resume_from, output_dir) != rerun.NEWEST:
        return None
    _, final, lost = seen or states(writing, output_dir, host)
    pending = [s for s in lost if s not in final]
    try:
        published = run_dir.list_checkpoints(output_dir)
    except OSError:
        published = []
    if not pending or (published and published[-1][0] >= max(pending)):
        return None
    paths = [str(run_dir.checkpoint_dir(output_dir, s)) for s in pending]
    maybe = (f"{paths[0]} if rank 0 publishes it" if len(paths) == 1 else
             f"the newest of {', '.join(paths[:-1])} and {paths[-1]} that rank 0 publishes")
    otherwise = (f"else {published[-1][1]}" if published else
                 f"else starts from step 0: {output_dir} holds no complete checkpoint")
    return f"it resumes from the newest complete checkpoint ({maybe}, {otherwise})"


def states(writing: dict, output_dir, host: dict | None) -> tuple[dict, set, list]:
    """({rank: step} of `writing`, the steps nothing can publish any more, the steps not published), looked at in
    that order (`_final` before `_published`: see `_final`). A watcher's line looks once and hands the result to
    `clause` and `resume_advice`, so its two halves say one state of the host."""
    by_rank = {int(r): int(step) for r, step in writing.items()}
    final = _final(by_rank, output_dir, host)
    return by_rank, final, sorted({step for step in by_rank.values() if not _published(output_dir, step)})


def _final(by_rank: dict, output_dir, host: dict | None) -> set:
    """The steps of `by_rank` ({rank: step}) that nothing can publish any more, as far as this host can tell: every
    rank of `host` is dead or stopped, and rank 0, the publisher, is one of them or a rank here lacks its part of the
    step (a record of its finished part; a death notice or an error record is none). Asked before whether the
    checkpoint is published: rank 0 elsewhere renames `checkpoint-N.tmp` with the parts' records in it, then removes
    them, so a record missing after the publish would read as a part never written."""
    if not output_dir or not host or not _quiet(host.values()):
        return set()
    if 0 in host:
        return set(by_rank.values())
    return {step for r, step in by_rank.items() if r in host and not _part_written(output_dir, step, r)}


def _quiet(pids) -> bool:
    """Every process of `pids` dead or stopped (SIGSTOP: a watcher's hold, a user's `kill -STOP`; not a tracer's)."""
    return all(not processes.alive(pid) or processes.stopped(pid, traced=False) for pid in pids)


def _part_written(output_dir, step: int, rank: int) -> bool:
    tmp = run_dir.checkpoint_dir(output_dir, step)
    try:
        record = json.loads((tmp.with_name(tmp.name + ".tmp") / PART.format(rank)).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and "files" in record


def _was(steps: list) -> str:
    return "was" if len(steps) == 1 else "were"


def _names(steps: list) -> str:
    names = [f"checkpoint-{s}" for s in steps]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _published(output_dir, step: int) -> bool:
    """Whether checkpoint-`step` is in `output_dir` (published: complete by construction, `run_dir`)."""
    return bool(output_dir) and run_dir.checkpoint_dir(output_dir, step).is_dir()
