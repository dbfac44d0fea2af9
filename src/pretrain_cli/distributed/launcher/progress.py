"""Each rank's progress (its step and phase), visible to the rank watchers of its host: a hung rank and a straggler.

A rank that stops making progress (a stalled file system, a deadlock, a stuck device, a paused VM: `kill -STOP`) is
the most common failure of a long multi-node run, and the collective library says nothing useful about it: gloo
aborts the waiting ranks after 30 s (`gloo::TimeoutException`, blaming nobody), NCCL waits far longer. So each rank
writes where it is into a small record the watchers of its host read (`distributed.launcher.watchdog`, outside the
training loop, in their own processes): a file of `SIZE` bytes in the host's shared watch directory, memory-mapped by
the rank, so a mark is a few stores into memory, no system call. The training loop marks each phase as it enters it
(`mark`): `data` (the step's batches), `forward/backward`, `collective` (gradient sync, norm, the step's agreements),
`save`, `save (waiting)` (a synchronous save's own files written, waiting for the other ranks' or rank 0's publish;
rank 0 marks `save` again for its publish),
`eval`; `start-up` until the first mark. The phase is the training thread's; a background write of a checkpoint
(`async_save`) runs beside it, so the record also says which checkpoint such a write is writing (`writing`, from
`training.async_save.AsyncWriter`): a rank stopped or killed during it was named "in forward/backward" with no word
of the checkpoint its stop left unsaved (`distributed.launcher.unsaved`).

**Hung** (`hung`): once a rank's mark is older than its phase's allowance (`allowance`: the `hang_timeout` key, else
`DEFAULT` seconds, raised to `STEPS` of the run's own step time once that is known; `start-up`, `save` and
`eval`, whose length no step time predicts, at least `START`; a rank waiting for the others to finish a save the
save's allowance too: judged by the plain key, a healthy save whose ranks' parts differ by more than it was called
hung; a stopped rank, `/proc` state T, the plain one in any phase, timed from its mark or from when its watcher
first saw it stopped, whichever is later: it cannot progress, but a slow save already past the plain one and stopped
for a moment is no hang; a debugger's stop, state t, counts as running), the job has stalled, and the rank named is
the one the others wait for: a stopped one (`/proc` state T), else
one that is not waiting (`WAITING`: in a collective, or for a save's other parts), else the late one whose mark is
oldest. Inside a pipeline's schedule a stage
waiting for its neighbour is in `forward/backward` too, so there a hang that is not a stopped process is named by
the oldest mark only.

**Straggler** (`stragglers`): a rank whose own work per step (the median of the last `WINDOW` steps) stays `RATIO`
times the other ranks' median or more (and `GAP` seconds more). Own work is what waits for no other rank: the data
phase and the forward passes (`worked`; timed by `training.step`). Not the backward: under data parallelism the
gradient all-reduce runs inside it, so a rank waiting for a slow peer waits there, and the wall time of a whole
step is the same on every rank. A slow data phase (a stalled file system) and a slow device or host show. Under
tensor parallelism and ZeRO-3 the forward holds collectives too, and a pipeline's schedule runs the forward itself
(only the data phase is timed there); on GPU the forward's wall time is the host's launch time, not the device's.
"""
from __future__ import annotations

import mmap
import os
import statistics
import struct
import threading
import time
from collections import deque
from pathlib import Path

PHASES = ("start-up", "data", "forward/backward", "collective", "save", "save (waiting)", "eval",
          "done")  # done: its watcher stopped
# step, phase, since (wall time of the mark), step seconds, busy seconds, steps timed, pid, the step of the checkpoint
# a background write is writing (0: none)
_FORMAT = "<qqdddqqq"
SIZE = struct.calcsize(_FORMAT)
DEFAULT = 300.0  # seconds without progress before a rank is hung, when hang_timeout is not set
STEPS = 20  # ... or this many of the run's own steps, when its steps are slower
START = 600.0  # start-up (building, reading a checkpoint), a save and an evaluation are allowed at least this long
LONG = ("start-up", "save", "save (waiting)", "eval")  # whose length is no step's: a checkpoint's bytes, eval_iters
SAVING = ("save", "save (waiting)")  # a save: the rank's own part, then its wait for the others' (synchronous)
WAITING = ("collective", "save (waiting)")  # a rank waiting for others: not the one they wait for
WAITED = 20.0  # a rank idle this long when gloo's 30 s timeout ends a peer waiting for it is the one that hung
WINDOW = 20  # steps a straggler's median is taken over
RATIO = 1.5  # a straggler's own work per step, over the other ranks' median
GAP = 0.5  # ... and at least this many seconds more (a loaded host's jitter in short steps is no straggler)

_CURRENT = None  # this rank's `Record`, while a watcher reads it


class Record:
    """This rank's progress record (the rank's side): a memory-mapped file of SIZE bytes."""

    def __init__(self, path: Path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self.map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self.step, self.phase, self.since = 0, 0, time.time()
        self.started = None  # wall time of this step's `data` mark
        self.saved = None  # seconds the last finished save took (its `save` mark to the next outside it): `last_save`
        self.saving = self.since  # wall time of the current (or last) save's first mark
        self.own = 0.0  # this step's own work so far: its data phase, its forward passes (`worked`)
        self.steps, self.busy = deque(maxlen=WINDOW), deque(maxlen=WINDOW)
        self.writing = 0  # the checkpoint step a background write writes (`writing`), 0: none
        # the training thread marks, the background writer sets `writing`: each writes the whole record from the
        # fields, so without the lock one could write back the other's old value (a write ended, said in flight)
        self._lock = threading.Lock()
        self._write()

    def mark(self, phase: str, step: int) -> None:
        with self._lock:
            self._mark(phase, step)

    def write_of(self, step: int) -> None:
        """A background write of checkpoint-`step` begins (0: this rank's background write ended); nothing once the
        record is closed (a rank leaving with its error stops its watcher before its write has ended)."""
        with self._lock:
            if not self.map.closed:
                self.writing = step
                self._write()

    def _mark(self, phase: str, step: int) -> None:
        now = time.time()
        if PHASES[self.phase] in SAVING and phase not in SAVING:
            self.saved = now - self.saving
        if phase == "save" and PHASES[self.phase] not in SAVING:
            self.saving = now
        if phase == "data":  # a step starts: the previous one, from its data mark to this one, is timed
            if self.started is not None and step != self.step:
                self.steps.append(now - self.started)
            self.started, self.own = now, 0.0
        elif phase == "forward/backward" and self.phase == PHASES.index("data"):
            self.own += now - self.since
        elif phase == "collective" and self.started is not None:
            self.busy.append(self.own)
        self.step, self.phase, self.since = step, PHASES.index(phase), now
        self._write()

    def _write(self) -> None:
        step_s = statistics.median(self.steps) if self.steps else 0.0
        busy_s = statistics.median(self.busy) if self.busy else 0.0
        # packed first, then copied in one slice: `struct.pack_into` zero-fills its target before it writes the
        # fields, and a watcher reading in between saw `since` 0, a rank "without progress for 1.8e9 s" (a false hang)
        self.map[:SIZE] = struct.pack(_FORMAT, self.step, self.phase, self.since, step_s, busy_s, len(self.busy),
                                      os.getpid(), self.writing)

    def close(self) -> None:
        with self._lock:
            self.map.close()


def open_record(path: Path) -> None:
    """Start recording this rank's progress at `path` (the watchers of its host read it)."""
    global _CURRENT
    _CURRENT = Record(path)


def close_record() -> None:
    global _CURRENT
    if _CURRENT is not None:
        _CURRENT.mark("done", _CURRENT.step)  # past its last collective: no longer watched
        _CURRENT.close()
        _CURRENT = None


def mark(phase: str, step: int) -> None:
    """This rank enters `phase` of step `step` (nothing when no watcher reads it: one process, one rank per host)."""
    if _CURRENT is not None:
        _CURRENT.mark(phase, step)


def writing(step: int | None) -> None:
    """This rank's background writer (`async_save`) begins writing checkpoint-`step`; None: its write ended (done,
    published by rank 0's, or failed). Nothing when no watcher reads this rank."""
    record = _CURRENT  # (read once: a thread of its own, while the rank may be closing it)
    if record is not None:
        record.write_of(step or 0)


def last_save() -> float | None:
    """Seconds this rank's last finished save took (the wait of an asynchronous one: its copy), or None (none yet,
    or no watcher reads this rank: one process)."""
    return None if _CURRENT is None else _CURRENT.saved


def worked(seconds: float) -> None:
    """This rank spent `seconds` of the step on its own work, waiting for no other rank (a forward pass)."""
    if _CURRENT is not None:
        _CURRENT.own += seconds


# ------------------------------------------------------------------ the watchers' side
def read(shared: Path, ranks) -> dict:
    """{rank: {"step", "phase", "since", "step_seconds", "busy_seconds", "timed", "pid", "writing"}} of the records in
    `shared` (a rank whose record is not there yet is left out; `writing`: the checkpoint step its background write
    writes, 0: none)."""
    out = {}
    for r in ranks:
        try:
            raw = _settled(Path(shared) / f"progress.{r}")
            step, phase, since, step_s, busy_s, timed, pid, writing_step = struct.unpack(_FORMAT, raw[:SIZE])
        except (OSError, struct.error):
            continue
        if not pid:  # created (zero-filled by its truncate) but not written yet: not there yet
            continue
        out[r] = {"step": step, "phase": PHASES[phase] if 0 <= phase < len(PHASES) else "?", "since": since,
                  "step_seconds": step_s, "busy_seconds": busy_s, "timed": timed, "pid": pid, "writing": writing_step}
    return out


def _settled(path: Path, tries: int = 5) -> bytes:
    """The record's bytes as two reads in a row agree (a rank's write is a 64-byte copy that a read can cut through:
    a step from the new mark with the time of the old one)."""
    raw = path.read_bytes()
    for _ in range(tries):
        again = path.read_bytes()
        if again == raw:
            break
        raw = again
    return raw


def allowance(phase: str, key: float | None, step_seconds: float, stopped: bool = False) -> float | None:
    """Seconds a rank may stay in `phase` without a new mark (None: not watched, `hang_timeout: 0`). A `stopped` rank
    (`/proc` state T) cannot progress whatever its phase: the plain timeout, from when it was seen stopped (`hung`; a
    rank stopped while writing its part of a save was named only after the save's 600 s)."""
    if key == 0 or phase == "done":
        return None
    base = key if key is not None else max(DEFAULT, STEPS * step_seconds)
    return max(base, START) if phase in LONG and not stopped else base


def hung(records: dict, now: float, key: float | None, stopped=None) -> tuple[int, float] | None:
    """(the hung rank, its seconds without progress), or None: see the module docstring. Once any rank is late, the
    job has made no progress for that long, and the rank named is the one the others wait for, late itself or not
    (it may have marked its phase after a waiting rank marked its wait). `stopped`: {rank: when its watcher first
    saw it stopped}: such a rank is late also once it has been stopped the plain timeout past its mark, timed from
    the later of the two (a slow healthy save past `hang_timeout`, touched by a 1 s SIGSTOP, is no hang)."""
    stopped = stopped or {}
    step_s = max((rec["step_seconds"] for rec in records.values()), default=0.0)
    late = []
    for r, rec in records.items():
        allowed = allowance(rec["phase"], key, step_s)
        if allowed is not None and (now - rec["since"] >= allowed or r in stopped and now - max(
                rec["since"], stopped[r]) >= allowance(rec["phase"], key, step_s, stopped=True)):
            late.append(r)
    if not late:
        return None
    live = [r for r, rec in records.items() if rec["phase"] != "done"]
    r = min(live, key=lambda r: (r not in stopped, records[r]["phase"] in WAITING, r not in late,
                                 records[r]["since"]))
    return r, now - records[r]["since"]


def writes(records: dict) -> dict:
    """{str(rank): the checkpoint step its background write writes} of the ranks in `records` with one in flight (str
    keys: a verdict is shared as JSON)."""
    return {str(r): rec["writing"] for r, rec in records.items() if rec.get("writing")}


def stragglers(records: dict) -> list[tuple[int, float]]:
    """[(rank, its own work per step over the other ranks' median)] for each straggler (module docstring)."""
    timed = {r: rec["busy_seconds"] for r, rec in records.items() if rec["timed"] >= WINDOW and rec["busy_seconds"] > 0}
    out = []
    for r, busy in sorted(timed.items()):
        others = [b for q, b in timed.items() if q != r]
        if others and busy >= RATIO * statistics.median(others) and busy - statistics.median(others) >= GAP:
            out.append((r, busy / statistics.median(others)))
    return out
