"""What launch.sh's console quotes from a rank's workerlog.N: only what this launch wrote there.

Why this launch only: Paddle's launcher appends to workerlog.N (launch.sh passes no `--log_overwrite`), so after a
restart, or a second launch into the same output_dir, the log holds the earlier launches' ends too, and the console
said their `error:` lines again beside this one's. The launcher's `Container.start` notes the log's size as the rank
starts (its `_log_start_offset`); `failure_report` leaves that in launch.sh's verdict directory (`mark`, `start.<log>`,
removed by launch.sh before each launch), and `since` reads the log from there.

What is quoted (`job.cause`): every `error:` line the rank said (`errors`: check reports every problem at once, its
record holds the first), and for a rank that crashed the end of its Python traceback or of Python's fatal-error stack
(`crash`), at most `LIMIT` lines: the console says what broke and where, the full log the rest.
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

LIMIT = 20  # the most lines of a crash the console quotes
# what starts a crash's account in a rank's log: an uncaught exception's traceback, a fatal signal's stack
# (Python's faulthandler, on for every rank: `runtime.import_paddle`)
TRACEBACK, FATAL = "Traceback (most recent call last):", "Fatal Python error: "
STACK = re.compile(r"(Current thread 0x[0-9a-f]+|Stack) \(most recent call first\):")
CARETS = re.compile(r"\s*[\^~]+\s*")  # Python 3.11's markers under a traceback's line: emphasis only
OWN_END = "[pretrain-cli] rank "  # the rank's watcher's line after its end (`watcher.Watcher._line`)


def mark(directory, log, offset: int) -> None:
    """Rank log `log` begins this launch at byte `offset` (best effort)."""
    with contextlib.suppress(OSError, TypeError):
        (Path(directory) / f"start.{Path(log).name}").write_text(str(int(offset)))


def since(directory, log) -> list[str]:
    """The lines of `log` from this launch's start (`mark`; the whole log when none was left), [] when it cannot be
    read. Split at "\\n" only, as the log's writers and Paddle's readline split it."""
    start = 0
    with contextlib.suppress(OSError, ValueError, TypeError):
        start = int((Path(directory) / f"start.{Path(log).name}").read_text())
    try:
        with open(log, "rb") as text:
            text.seek(start)
            return [x.removesuffix("\r") for x in text.read().decode(errors="replace").split("\n")]
    except (OSError, ValueError, TypeError):
        return []


def errors(lines: list[str], line: str) -> list[str]:
    """The `error:` lines among `lines`, in order, once each; `error: <line>` (the rank's record) alone when they do
    not hold it."""
    said = list(dict.fromkeys(x for x in lines if x.startswith("error: ")))
    return said if f"error: {line}" in said else [f"error: {line}"]


def crash(lines: list[str]) -> list[str]:
    """The end of the last crash in `lines`, at most `LIMIT` lines, [] when there is none. An uncaught exception: its
    traceback's last lines, ending with the exception (the line it was raised from above it); a fatal signal: Python's
    `Fatal Python error` line (with the C++ `terminate called` / `what():` lines before it, gloo's abort) and the
    crashed thread's innermost frames."""
    start = max((n for n, x in enumerate(lines) if x.startswith((TRACEBACK, FATAL))), default=None)
    if start is None:
        return []
    end = next((n for n in range(start, len(lines)) if lines[n].startswith(OWN_END)), len(lines))
    block = [x for x in lines[start:end] if not CARETS.fullmatch(x)]
    while block and not block[-1].strip():
        block.pop()
    if lines[start].startswith(TRACEBACK):
        if len(block) <= LIMIT:
            return block
        tail = block[-(LIMIT - 2):]
        if tail[0].startswith("    "):  # (a frame's source line: from its `File` line on)
            tail = tail[1:]
        return [block[0], f"  … ({len(block) - 1 - len(tail)} lines more in its full log)", *tail]
    head = [x for x in lines[max(start - 2, 0):start] if x.startswith(("terminate called", "  what():"))]
    head.append(lines[start])
    frames = next((n for n, x in enumerate(block) if STACK.match(x)), None)
    if frames is None:  # (no stack: what follows the fatal line up to its first blank)
        rest = block[1:block.index("", 1)] if "" in block[1:] else block[1:]
        return (head + rest)[:LIMIT]
    stack = [block[frames]]
    for x in block[frames + 1:]:
        if not x.startswith("  "):
            break
        stack.append(x)
    keep = LIMIT - len(head) - 1
    if len(stack) > keep + 1:
        stack = stack[:keep] + [f"  … ({len(stack) - keep} frames more in its full log)"]
    return head + stack
