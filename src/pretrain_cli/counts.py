"""Counts in English: `1 token file`, `3 token files`, `2 batches`, `1 process`. The lines that state a count with
its noun where it can be one (the resolved run and its notes, `eval`, `inspect-data`, `merge-data`, `preprocess`, the
data lines) say it through `count`, so no count of one reads as `1 files`. A base module: the data layer's lines use
it as much as the commands'."""
from __future__ import annotations


def plural(noun: str) -> str:
    """The noun's plural: `batch` -> `batches`, `process` -> `processes`, `GPU` -> `GPUs`; the last word of a
    compound noun (`token file` -> `token files`, `data rank` -> `data ranks`)."""
    return noun + "es" if noun.endswith(("s", "x", "ch", "sh")) else noun + "s"


def count(n: int, noun: str, grouped: bool = False) -> str:
    """`n noun`, the noun plural unless n is 1; `grouped`: thousands separated (`2,496 windows`)."""
    number = f"{n:,}" if grouped else str(n)
    return f"{number} {noun if n == 1 else plural(noun)}"


def first_few(names: list[str], shown: int = 3) -> str:
    """Up to `shown` of `names` and how many more (`a, b, c and 4 more`): one line names a list without growing with
    it."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
