"""The one exception type that means "the user can fix this", and a collector for several.

The CLI turns a `UserError` into one line per problem on stderr and exit code 2; anything else
is a bug and keeps its traceback (shown in full with `--debug`). Validation that can find more
than one problem (an argument file with a bad key *and* a missing tokenizer) collects them in
`Problems` and raises them together, so the user fixes everything in one round.
"""
from __future__ import annotations

import errno


class UserError(Exception):
    """Bad input: a file, key or value the user controls. The message says what to do.

    Several problems travel as one `UserError` whose message has one problem per line.
    """

    exit_code = 2
    # what launch.sh reads from the rank's verdict (`distributed.launcher.job`): usage errors are not retried
    kind = "usage"

    @property
    def lines(self) -> list[str]:
        return [line for line in str(self).splitlines() if line.strip()] or [str(self)]


class Problems:
    """Collects `UserError`s from independent checks; `raise_if_any()` reports them all at once."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, message: str) -> None:
        self.items.append(message)

    def run(self, check, *args, **kwargs):
        """`check(*args)`'s result, or None after recording the UserError it raised."""
        try:
            return check(*args, **kwargs)
        except UserError as e:
            self.items.extend(e.lines)
            return None

    def raise_if_any(self) -> None:
        if self.items:
            seen = list(dict.fromkeys(self.items))
            raise UserError("\n".join(seen))


class DeviceOutOfMemory(UserError):
    """The device ran out of memory while training: the run's layout is too big for it (exit 1, not 2: the
    file is valid, the hardware is not enough). `step` is the step being run (0: before the first one)."""

    exit_code = 1
    kind = "system"

    def __init__(self, step: int, message: str = ""):
        self.step = step
        super().__init__(message or f"out of memory at step {step}")


class RendezvousFailed(UserError):
    """The ranks could not join one process group (a port taken, a node late): nothing has run yet, so a new
    launch may succeed. Exit 75 (EX_TEMPFAIL), which launch.sh retries with new ports."""

    exit_code = 75
    kind = "transient"


class PeerFailed(UserError):
    """This rank stops because another rank failed (rank 0 gone while this one waited on it): not this rank's
    own verdict, which is the other rank's (launch.sh reads that one). Exit 1."""

    exit_code = 1
    kind = "peer"


def is_out_of_memory(e: BaseException) -> bool:
    """Paddle raises MemoryError for an allocation it cannot make (CPU and GPU: its ResourceExhausted error);
    some GPU paths surface it as a RuntimeError naming it, and an allocation that fails in the backward of a
    PyLayer (our fused CPU kernels) comes back as an OSError, Paddle's `(External)` error, with the
    MemoryError's text inside; an OSError ENOMEM is the system's own out of memory."""
    text = str(e)
    named = "out of memory" in text.lower() or "ResourceExhausted" in text
    return (isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and named)
            or (isinstance(e, OSError) and (named or e.errno == errno.ENOMEM)))

OUT_OF_MEMORY = (MemoryError, RuntimeError, OSError)  # the types `is_out_of_memory` may accept


_OS_HINTS = {
    errno.ENOSPC: "free disk space (or point output_dir elsewhere) and re-run the same command; "
                  "training resumes from the last complete checkpoint",
    errno.EDQUOT: "free space within your quota and re-run the same command",
    errno.EACCES: "check the permissions, or choose another path",
    errno.EPERM: "check the permissions, or choose another path",
    errno.EROFS: "the file system is read-only; choose another path",
    errno.EMFILE: "too many open files; raise `ulimit -n` and re-run",
}


def os_error_line(e: OSError) -> str:
    """`<file>: <strerror>; <what to do>` on one line: the CLI's, and what a rank leaving with it tells the other ranks
    (`training.run_end`)."""
    where = e.filename if e.filename is not None else "system"
    if e.filename2 is not None:
        where = f"{e.filename} -> {e.filename2}"
    what = e.strerror or str(e) or type(e).__name__
    hint = _OS_HINTS.get(e.errno, "fix the cause and re-run the same command (--debug shows the traceback)")
    return " ".join(f"{where}: {what}; {hint}".split())
