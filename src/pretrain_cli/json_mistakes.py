"""What a person got wrong in a JSON file they wrote, in one line: the cause and the fix.

Python's `json` names what its parser expected at the point it stopped ("Expecting property name enclosed in double
quotes"), which is the same sentence for a `//` comment, a trailing comma and a single-quoted key, and the point is
often past the cause (a trailing comma is reported at the `}` on the next line). The files users write by hand (an
argument file, a model's config.json, a prompt .jsonl, a tokenizer_config.json, a shard index) are read by one
judge so that every one of them names the mistake the same way, at the place to edit: `loads` is that one reader.
"""
from __future__ import annotations

import json
import re

from pretrain_cli.errors import UserError

_WORD = re.compile(r"[A-Za-z_][\w.\-]*")
_PYTHON = {"True": "true", "False": "false", "None": "null"}
_CURLY = "\u201c\u201d\u2018\u2019"
_NUMBER_START = re.compile(r"-?[0-9]")


def _where(doc: str, pos: int, first_line: int) -> str:
    line = doc.count("\n", 0, pos) + first_line
    return f"{line}:{pos - doc.rfind(chr(10), 0, pos)}"


def _last(doc: str, pos: int) -> int:
    """The position of the last character before `pos` that is not whitespace (-1: none)."""
    return len(doc[:pos].rstrip()) - 1


def _token(doc: str, pos: int) -> tuple[int, int]:
    """[start, end) of the run of word characters, dots and signs around `pos` (a number as written: `0x10`, `1e-`)."""
    start, end = pos, pos
    while start > 0 and (doc[start - 1].isalnum() or doc[start - 1] in "_.+-"):
        start -= 1
    while end < len(doc) and (doc[end].isalnum() or doc[end] in "_.+-"):
        end += 1
    return start, end


def _cause(doc: str, pos: int, msg: str) -> tuple[int, str] | None:
    """(where the cause is, what it is and what to do), or None: Python's own message is the best said."""
    rest, last = doc[pos:], _last(doc, pos)
    before = doc[last] if last >= 0 else ""
    if rest.startswith("//"):
        return pos, "a // comment (JSON has no comments); remove it"
    if rest.startswith("/*"):
        return pos, "a /* */ comment (JSON has no comments); remove it"
    if rest.startswith("#"):
        return pos, "a # comment (JSON has no comments); remove it"
    if msg == "Expecting ',' delimiter":
        prior = doc[pos - 1] if pos > 0 else ""
        if rest and prior == '"' and not rest[0].isspace() and rest[0] not in "\",:}]":
            return pos - 1, 'a double quote inside a string ends it; write \\" for a quote inside a string'
        if not rest.strip():
            return pos, "the JSON ends before its closing } or ]; close it"
        start, end = _token(doc, pos)
        if start < pos < end and _NUMBER_START.match(doc, start):  # stopped inside what was meant as a number
            return start, (f"a number JSON cannot read, {doc[start:end]}; JSON numbers are decimal, with no leading "
                           f"0, a digit after . and after e (16 for 0x10, 1.0, 1e-5)")
        # after a value's end (a number's digit too: `3e-4"seed"`, `1[2]`, whose number ends where the next begins)
        if ((prior.isspace() or prior in ('"', "]", "}")) and (rest[0] in "\"'{[-0123456789" or _WORD.match(rest))
                or prior.isdigit() and rest[0] in "\"'{["):
            return pos, "a missing comma before this entry; put , after the entry before it"  # (the next entry)
        return None
    if rest[:1] == "'":
        return pos, "a single-quoted string; JSON strings take double quotes (\"...\")"
    if rest[:1] and rest[0] in _CURLY:
        return pos, f"a curly quote {rest[0]}; JSON strings take straight double quotes (\"), retype it"
    word = _WORD.match(rest)
    if msg.startswith("Expecting property name"):
        if rest[:1] == "}" and before == ",":
            return last, "a trailing comma before }; remove it"
        if rest[:1] == "," and before == ",":
            return pos, "two commas in a row; remove one"
        if rest[:1] == "," and before == "{":
            return pos, "a comma before the first entry; remove it"
        if word:
            return pos, f'an unquoted key {word.group()}; JSON keys take double quotes ("{word.group()}")'
        if not rest.strip():
            return pos, "the JSON ends inside an object; close it with }"
        return None
    if msg == "Expecting value":
        if rest[:1] in ("]", "}") and rest and before == ",":
            return last, f"a trailing comma before {rest[0]}; remove it"
        if rest[:1] in (",", "}") and before == ":":
            return pos, "a key with no value; give it one"
        if rest[:1] == "," and before == ",":
            return pos, "two commas in a row; remove one"
        if rest[:1] == "," and before == "[":
            return pos, "a comma before the first entry; remove it"
        if word and word.group() in _PYTHON:
            return pos, f"Python's {word.group()}; JSON writes {_PYTHON[word.group()]}"
        if word:
            return pos, f'an unquoted string {word.group()}; put it in double quotes ("{word.group()}")'
        if not rest.strip():
            return pos, "the JSON ends where a value should be; finish it"
        return None
    if msg == "Expecting ':' delimiter":
        return pos, f"a key not followed by :; write \"key\": value{' (not =)' if rest[:1] == '=' else ''}"
    if msg == "Extra data" and before in ("}", "]"):
        return pos, "text after the closing } or ]; a file holds one JSON value: remove it or move it inside"
    if msg.startswith("Invalid \\escape"):
        return pos, "a backslash in a string; write \\\\ for a backslash (in a path, / works too)"
    if msg.startswith("Invalid control character"):
        if rest[:1] == "\n" or rest[:2] == "\r\n":
            return pos, 'a string not closed on its line; end it with "'
        if rest[:1] == "\t":
            return pos, "a tab inside a string; write \\t"
        return None
    if msg.startswith("Unexpected UTF-8 BOM"):  # (a file read as utf-8, which transformers reads it as too)
        return 0, "a byte-order mark at the start; save the file as UTF-8 without BOM"
    if msg.startswith("Unterminated string"):
        return pos, 'a string never closed; end it with "'
    return None


def cause(e: json.JSONDecodeError) -> tuple[int, str]:
    """(the position in `e.doc` of the mistake, `<cause>; <fix>`, or Python's words where none are better)."""
    return _cause(e.doc, e.pos, e.msg) or (e.pos, e.msg.removesuffix(" at"))


def explain(e: json.JSONDecodeError, first_line: int = 1) -> str:
    """`line:column: invalid JSON: <cause>; <fix>` for `e` (raised parsing `e.doc`), the line counted from
    `first_line` (a .jsonl's lines are parsed one by one)."""
    found = _cause(e.doc, e.pos, e.msg)
    if found is None:
        return f"{_where(e.doc, e.pos, first_line)}: invalid JSON: {e.msg}"
    pos, what = found
    return f"{_where(e.doc, pos, first_line)}: invalid JSON: {what}"


NESTED = "nested deeper than a JSON reader follows"  # (`'['*100000`: valid JSON; `json` raises RecursionError)


def loads(data: str | bytes, where: str, holds: str, fix: str = "", line: int | None = None, **kw) -> object:
    """`data` (a file's text, or its bytes, decoded as strict UTF-8: transformers reads config.json so) parsed, or
    one `UserError` naming `where` (`line`: `data` is that line of the file) and what to do: invalid JSON (`explain`,
    then `fix`), JSON nested past Python's recursion limit (`'['*100000` is valid JSON; `json` raises
    RecursionError, then `holds` says what the file should be), bytes that are not UTF-8. `kw`: `json.loads`'s."""
    at = where if line is None else f"{where}:{line}"
    try:
        return json.loads(data.decode("utf-8") if isinstance(data, bytes) else data, **kw)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}:{explain(e, line or 1)}{'; ' + fix if fix else ''}") from None
    except RecursionError:
        raise UserError(f"{at}: {NESTED}; {holds}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{at}: byte {e.start} is not UTF-8 ({e.reason}); save the file as UTF-8") from None
