"""The argument file a bad-input case writes (cases.py): run.json as the reference run's with keys changed or
dropped (`cfg`), or any text under any name (`raw`); each returns the `check` call that reads it."""
from __future__ import annotations

import json
from pathlib import Path

from harness import RUN_CONFIG

CHECK = ["check", "run.json"]


def cfg(d: Path, **changes) -> list[str]:
    c = dict(RUN_CONFIG)
    for k, v in changes.items():
        if v is DROP:
            c.pop(k, None)
        else:
            c[k] = v
    (d / "run.json").write_text(json.dumps(c))
    return CHECK


DROP = object()


def raw(d: Path, text: str, name: str = "run.json") -> list[str]:
    (d / name).write_text(text)
    return ["check", name]
