"""The field helper behind every argument dataclass: what a key's help text and support tag hang on.

Each key carries a `help` text (shown by `pretrain-cli train --help-keys` and used to build
docs/COMPATIBILITY.md) and a `support` tag:

- ``supported`` — implemented with PaddleNLP's meaning (or a documented, better one);
- ``ignored`` — accepted so PaddleNLP files run, but has no effect here (the reason says why);
- ``extension`` — a key PaddleNLP does not have.

Fields marked ``ignored`` are reported by `resolve.py` when a file sets them to a
non-default value, so nothing is silently dropped.
"""
from __future__ import annotations

from dataclasses import field


def arg_field(default, help: str, support: str = "supported", choices=None):
    meta = {"help": help, "support": support}
    if choices is not None:
        meta["choices"] = tuple(choices)
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)
