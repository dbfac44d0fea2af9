"""Our keys, typed: one `KeySpec` per field of the three argument dataclasses (`KEYS`), and `coerce`, which turns
a JSON value or command-line text into that key's type or refuses it with one line naming the key.

The parser (`config.parser`) reads files and the command line; what a value of a key may be is decided here, once, so
that `plan --fit`'s candidates and `prepare`'s overrides (`orchestration.planned`, `orchestration.prepare`) coerce
values the same way the argument file does.
"""
from __future__ import annotations

import json
import typing
from dataclasses import MISSING, dataclass, fields

from pretrain_cli.config.arguments import SECTIONS
from pretrain_cli.errors import UserError

# a value PaddleNLP takes that `choices` refuses here: what it is there and what to do, said after the key
_TNTIDX_WHAT_TO_DO = ("which is not read here; token files whose .idx starts MMIDIDX are mmap: set data_impl: mmap or "
                      "leave it out; TNTIDX ones: re-run `pretrain-cli preprocess` on their documents (or "
                      "create_pretraining_data.py --data_impl mmap)")
REFUSED_VALUES = {
    ("data_impl", "lazy"): "lazy is PaddleNLP's older token file format (TNTIDX .idx, read item by item through file "
                           f"reads, not memory-mapped), {_TNTIDX_WHAT_TO_DO}",
    ("data_impl", "cached"): "cached is the older reader of lazy's TNTIDX .idx files that holds them in memory, "
                             f"{_TNTIDX_WHAT_TO_DO}",
}
_TRUE = {"true", "t", "yes", "y", "1"}
_FALSE = {"false", "f", "no", "n", "0"}


@dataclass
class KeySpec:
    name: str
    section: str
    base: type  # bool, int, float, str
    is_list: bool
    optional: bool
    default: object
    help: str
    support: str
    choices: tuple | None


def _spec_for(section: str, cls) -> list[KeySpec]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        tp = hints[f.name]
        optional = False
        if typing.get_origin(tp) is typing.Union:
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            optional, tp = True, args[0]
        is_list = typing.get_origin(tp) in (list, typing.List)
        base = typing.get_args(tp)[0] if is_list else tp
        default = f.default if f.default is not MISSING else f.default_factory()
        out.append(KeySpec(f.name, section, base, is_list, optional, default,
                           f.metadata.get("help", ""), f.metadata.get("support", "supported"),
                           f.metadata.get("choices")))
    return out


KEYS: dict[str, KeySpec] = {s.name: s for sec, cls in SECTIONS for s in _spec_for(sec, cls)}


def type_name(spec: KeySpec) -> str:
    name = {bool: "bool (true/false/1/0)", int: "int", float: "float", str: "string"}[spec.base]
    if spec.is_list:
        name = f"list of {name}"
    return f"{name} or null" if spec.optional else name


def _scalar(spec: KeySpec, value, where: str):
    """Coerce one scalar: a JSON value, or a command-line string (both accept text the way PaddleNLP's argv does)."""
    def bad() -> UserError:  # built only when raised: `plan --fit` coerces every candidate's keys
        return UserError(f"{where}: key `{spec.name}` expects {type_name(spec)}, got {value!r}")

    base = spec.base
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise bad()
    if base is int:
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):  # PaddleNLP passes every JSON value through argv, so "100" works there too
            try:
                return int(value.strip())
            except ValueError:
                try:
                    f = float(value)
                except ValueError:
                    raise bad() from None
                if f.is_integer():
                    return int(f)
        raise bad()
    if base is float:
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                raise bad() from None
        raise bad()
    # str
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # e.g. "split": 949 — PaddleNLP str()s every value
    raise bad()


def coerce(spec: KeySpec, value, where: str, from_text: bool = False):
    if value is None or (from_text and isinstance(value, str) and value == "null"):
        if spec.optional or spec.default is None:
            return None
        # PaddleNLP's JSON -> argv round trip refuses it too (int("None")); a silent default would surface later
        # as a complaint about a value the user never wrote (`max_steps: must be > 0, got -1`)
        raise UserError(f"{where}: key `{spec.name}` expects {type_name(spec)}, got null; give a value, or leave "
                        f"the key out for its default ({json.dumps(spec.default)})")
    if spec.is_list:
        if isinstance(value, str) and not from_text:
            value = value.split() if spec.base is not str or " " in value else [value]
        if not isinstance(value, list):
            value = [value]
        return [_scalar(spec, v, where) for v in value]
    if isinstance(value, (list, dict)):
        kind = "a list" if isinstance(value, list) else "an object"
        raise UserError(f"{where}: key `{spec.name}` expects {type_name(spec)}, got {kind}")
    out = _scalar(spec, value, where)
    if spec.choices and out not in spec.choices:
        if (spec.name, out) in REFUSED_VALUES:
            raise UserError(f"{where}: key `{spec.name}`: {REFUSED_VALUES[spec.name, out]}")
        raise UserError(f"{where}: key `{spec.name}` must be one of {', '.join(spec.choices)}; got {out!r}")
    return out
