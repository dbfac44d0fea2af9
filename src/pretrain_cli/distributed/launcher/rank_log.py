"""What launch.sh's console quotes from a rank's workerlog.N: only what this launch wrote there, read from its end.

Why this launch only: Paddle's launcher appends to workerlog.N (launch.sh passes no `--log_overwrite`), so after a
restart, or a second launch into the same output_dir, the log holds the earlier launches' ends too, and reading it whole
would say their `error:` lines again beside this one's. The launcher's `Container.start` notes the log's size as the
rank starts (its `_log_start_offset`); `failure_report` leaves that in launch.sh's verdict directory (`mark`,
`start.<log>`, removed by launch.sh before each launch), and `read` starts there. Why from its end, at most `WINDOW`
bytes: a failure's account is at the end, and the host may have just run out of memory (a 100 MB log read whole and
split takes ~0.5 s and ~250 MB: a review's measurement on the 2-core machine, by hand).

What is quoted (`account.cause`): the `error:` lines the rank said (`errors`: check reports every problem at once, its
record holds the first), and for a rank that crashed the end of its Python traceback or of Python's fatal-error stack
(`crash`), at most `LIMIT` lines: the console says what broke and where, the full log the rest.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

LIMIT = 20  # the most lines of a crash, or `error:` lines, the console quotes
WINDOW = 1 << 20  # the most bytes of a log's end read for it
PREFIX = "[pretrain-cli] "  # what starts the lines of the ranks' watchers (and the records' lines)
# a rank watcher's verdict on a rank (`verdict_line.line`, `departure.follow`), for this rank or another, or a
# join limit's (launch.sh says each once: the launcher's console copy of rank 0 leaves them out, `failure_report`)
VERDICT = re.compile(re.escape(PREFIX) + r"(rank \d+: )?rank \d+ \(pid \d+ on [^)]*\)( (died|left with an error|"
                     r"made no progress|was aborted by the collective library|stopped \()"
                     # a join's limit (`join_deadline`): the rank that never came, or the waiting rank's own
                     r"|( \(and \d+ more rank\(s\) of this host\))? (has not come|came) to the join"
                     r"|: the process group (of \d+ ranks )?has not formed)")
# what starts a crash's account in a rank's log: an uncaught exception's traceback (an ExceptionGroup's, indented),
# a fatal signal's stack (Python's faulthandler, on for every rank: `runtime.import_paddle`)
TRACEBACK, GROUP = "Traceback (most recent call last):", "  + Exception Group Traceback (most recent call last):"
# how a rank's fatal crash, or its reaction to a lost peer, starts (the one list: the launcher's console copy of rank 0
# leaves it out, `failure_report`; a watcher drops it from a survivor's output, `watcher.before_abort`): a line starting
# with gloo's C++ abort (`terminate called ... gloo::TimeoutException`, its `what():`), Python's fatal-error report, a
# Python traceback (after a peer's loss, the reaction: gloo's timeout raised in a Python collective, `RuntimeError:
# [.../gloo/...] TIMEOUT`; the console holds one to its exception line and leaves it out only where that is gloo's or
# the rank recorded an uncaught error, `failure_report._Console`), Paddle's C++ traceback, its summary and FatalError,
# or holding gloo's own forms (its C++ names, Paddle's gloo process group, gloo's enforce) or a place in gloo's sources,
# wherever gloo was built (the wheel's `/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:589`, a build's
# `gloo/transport/tcp/pair.cc:589`)
CRASH_STARTS = ("terminate called", "what():", "Fatal Python error", TRACEBACK, GROUP.lstrip(), "C++ Traceback",
                "Error Message Summary", "FatalError")
GLOO = ("gloo::", "process_group_gloo", "[enforce fail at")
GLOO_SOURCE = re.compile(r"gloo/[\w/]+\.(?:cc|h):\d+")
# a line the rank's own log writes (`training.metrics`: `[2026-12-07 18:00:00,123] [    INFO] - ...`): what follows a
# crash it survived (a Paddle error with its C++ traceback, caught and logged) is its own again
LOGGED = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \[")


def crash_line(line: str) -> bool:
    """Whether `line` is one of a crash, or of a rank's reaction to a lost peer (`CRASH_STARTS`, `GLOO`,
    `GLOO_SOURCE`)."""
    return (line.lstrip().startswith(CRASH_STARTS) or any(mark in line for mark in GLOO)
            or GLOO_SOURCE.search(line) is not None)


FATAL = "Fatal Python error: "
CHAINED = {"The above exception was the direct cause of the following exception:": "the direct cause",
           "During handling of the above exception, another exception occurred:": "raised while handling"}
STACK = re.compile(r"(Current thread 0x[0-9a-f]+|Stack) \(most recent call first\):")
CARETS = re.compile(r"\s*[\^~]+\s*")  # Python 3.11's markers under a traceback's line: emphasis only


def mark(directory, log, offset: int) -> None:
    """Rank log `log` begins this launch at byte `offset` (best effort)."""
    with contextlib.suppress(OSError, TypeError):
        (Path(directory) / f"start.{Path(log).name}").write_text(str(int(offset)))


def start(directory, log) -> int:
    """Where this launch's part of `log` begins (`mark`), 0 when no mark was left."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        return max(int((Path(directory) / f"start.{Path(log).name}").read_text()), 0)
    return 0


def read(log, begin: int = 0, length: int = WINDOW, whole: bool = True) -> Iterator[str]:
    """The lines of `log` (each with its "\\n", but maybe the last) from byte `begin`, at most its last `length` bytes;
    `whole`: without the part of a line the window cut. A log now shorter than `begin` (cut or rotated since) is read
    from its beginning. Lines end as Paddle reads them (text mode, universal newlines: "\\n", "\\r\\n" or a lone
    "\\r"); bytes that are not UTF-8 are replaced. Nothing when it cannot be read."""
    try:
        raw = open(log, "rb")
    except (OSError, ValueError, TypeError):
        return
    with raw, contextlib.suppress(OSError, ValueError):
        size = os.fstat(raw.fileno()).st_size
        begin = 0 if begin > size else begin
        at = max(begin, size - length)
        raw.seek(at)
        lines = io.TextIOWrapper(raw, errors="replace", newline=None)
        if whole and at > begin:
            next(lines, None)
        yield from lines


def since(directory, log) -> list[str]:
    """This launch's lines of `log` (from `start`; at most its last `WINDOW` bytes), without their line ends."""
    return [x.removesuffix("\n") for x in read(log, start(directory, log))]


def errors(lines: Iterable[str], line: str) -> list[str]:
    """The `error:` lines among `lines`, in order, once each, the first `LIMIT` of them (and a line saying how many
    more the log holds); `error: <line>` (the rank's record) alone when they do not hold it."""
    said, seen = [], set()
    for x in lines:
        x = x.removesuffix("\n")
        if x.startswith("error: ") and x not in seen:
            seen.add(x)
            if len(said) < LIMIT:
                said.append(x)
    if f"error: {line}" not in seen:
        return [f"error: {line}"]
    more = len(seen) - len(said)
    return said + ([f"… ({more} more error: lines in its full log)"] if more else [])


def crash(lines: list[str], fatal: bool = False) -> list[str]:
    """The end of the last crash in `lines`, at most `LIMIT` lines, [] when there is none. An uncaught exception
    (`fatal` False): its traceback's last lines, ending with the exception (the line it was raised from above it),
    after a line naming the exception it was chained to, if any. A fatal signal: Python's `Fatal Python error` line
    (with the C++ `terminate called` / `what():` lines before it, gloo's abort) and the crashed thread's innermost
    frames. Each kind looks for its own start only: an exception whose interpreter then crashed at exit is its
    traceback, a signal's death its stack, not whatever came last."""
    starts = (FATAL,) if fatal else (TRACEBACK, GROUP)
    at = max((n for n, x in enumerate(lines) if x.startswith(starts)), default=None)
    if at is None:
        return []
    return _fatal(lines, at) if fatal else _traceback(lines, at)


def _traceback(lines: list[str], at: int) -> list[str]:
    group = lines[at].startswith(GROUP)
    end = next((n for n in range(at + 1, len(lines)) if lines[n][:1] not in ("", " ")), len(lines))
    # (a traceback ends at its exception, the first line after the frames not indented; a group's is indented)
    block = [x for x in lines[at:end if group else end + 1] if not CARETS.fullmatch(x)]
    while block and not block[-1].strip():
        block.pop()
    head = [block[0], *_chained(lines, at)]
    if len(block) + len(head) - 1 <= LIMIT:
        return [*head[1:], *block] if len(head) > 1 else block
    tail = block[-(LIMIT - 1 - len(head)):]
    if tail[0].startswith("    ") and not group:  # (a frame's source line: from its `File` line on)
        tail = tail[1:]
    return [*head[1:], block[0], f"  … ({len(block) - 1 - len(tail)} lines more in its full log)", *tail]


def _chained(lines: list[str], at: int) -> list[str]:
    """One line naming the exception the one at `at` was chained to (its traceback above it), or []."""
    n = at - 1
    while n >= 0 and not lines[n].strip():
        n -= 1
    if n < 0 or lines[n] not in CHAINED:
        return []
    earlier = next((x for x in reversed(lines[:n]) if x.strip() and x[:1] != " "), None)
    return [f"({CHAINED[lines[n]]}: {earlier})"] if earlier else []


def _fatal(lines: list[str], at: int) -> list[str]:
    end = next((n for n in range(at, len(lines)) if VERDICT.match(lines[n])), len(lines))
    block = lines[at:end]
    head = [x for x in lines[max(at - 2, 0):at] if x.startswith(("terminate called", "  what():"))]
    head.append(lines[at])
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
