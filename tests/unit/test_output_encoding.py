"""What the entry point prints where stdout cannot encode every character (`cli._printable_streams`): `--json` stays
JSON (a path in another script as `\\uXXXX` escapes, not Python's `\\U0001f680`/`\\xfc`), and a stream that already has
an errors handler (a UTF-8 locale's `surrogateescape`) keeps it, so a path's undecodable bytes print as they were.
Real processes: a stream's encoding and errors handler are set when Python starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from data_helpers import write_tokens
from pretrain_cli import cli


def _inspect(prefix, **env) -> bytes:
    """`pretrain-cli inspect-data PREFIX --json`'s stdout under `env`."""
    done = subprocess.run([sys.executable, "-m", "pretrain_cli", "inspect-data", os.fsencode(prefix), "--json"],
                          env={**os.environ, **env}, capture_output=True, timeout=600)
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode("latin-1")[-2000:]
    return done.stdout


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_json_on_a_stdout_that_cannot_encode_a_path_is_still_json(tmp_path, encoding):
    """A prefix holding 東京🚀 and ü: json.loads gives the path back, whatever the stream could spell."""
    (tmp_path / "東京🚀ü").mkdir()
    prefix = write_tokens(tmp_path / "東京🚀ü" / "t")
    out = _inspect(prefix, PYTHONIOENCODING=encoding)
    assert json.loads(out.decode(encoding))["prefix"] == prefix, out
    assert b"\\ud83d\\ude80" in out and b"\\u6771\\u4eac" in out  # (🚀: its surrogate pair; 東京)


def test_a_surrogateescape_stdout_keeps_a_paths_undecodable_bytes(tmp_path):
    """Under PYTHONUTF8 stdout's handler is surrogateescape: a directory named with the byte 0xff prints as that
    byte, not as `\\udcff`."""
    d = os.path.join(os.fsencode(tmp_path), b"d\xff")
    os.mkdir(d)
    prefix = write_tokens(os.fsdecode(d) + "/t")
    out = _inspect(prefix, PYTHONUTF8="1", PYTHONIOENCODING="")
    assert b"/d\xff/t" in out and b"\\udcff" not in out, out


@pytest.mark.parametrize("env,encoding", [
    ({"PYTHONIOENCODING": "ascii:surrogateescape"}, "ascii"),
    ({"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}, "utf-8"),
])
def test_a_surrogateescape_stdout_that_is_not_utf8_prints_json(tmp_path, env, encoding):
    """A surrogateescape stream in ASCII (asked for, or the C locale's) raised UnicodeEncodeError on 東京🚀ü: now
    they are escapes, while a path's bytes that did not decode (all of them under the C locale, where argv is
    decoded as ASCII) are written back as they were, so the stdout is the path's own UTF-8 there."""
    (tmp_path / "東京🚀ü").mkdir()
    prefix = write_tokens(tmp_path / "東京🚀ü" / "t")
    out = _inspect(prefix, **env)
    assert json.loads(out.decode(encoding))["prefix"] == prefix, out


def test_the_escapes_are_json_s():
    """A character above U+FFFF is its UTF-16 surrogate pair; a character of the BMP (and a lone surrogate) its own."""
    cli._printable_streams()  # (registers the handler)
    text = "ü東🚀\udcff"
    escaped = text.encode("ascii", errors=cli.U_ESCAPE)
    assert escaped == b"\\u00fc\\u6771\\ud83d\\ude80\\udcff"
    assert json.loads(b'"' + escaped + b'"') == text
    mixed = "a\udcff東\udc80".encode("ascii", errors=cli.U_ESCAPE_BYTES)  # (surrogateescape's bytes kept)
    assert mixed == b"a\xff\\u6771\x80", mixed


def test_an_error_line_under_the_c_locale_names_a_path_as_its_bytes(tmp_path):
    """Under the C locale (no coercion, no UTF-8 mode) argv decodes a path's non-ASCII bytes to U+DC80..U+DCFF:
    stderr's `backslashreplace` printed them as `\\udce6` escapes; with U_ESCAPE_BYTES the error line holds the path's
    own bytes, which a user can copy."""
    missing = os.path.join(os.fsencode(tmp_path), "東京".encode(), b"t")
    done = subprocess.run([sys.executable, "-m", "pretrain_cli", "inspect-data", missing],
                          env={**os.environ, "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0",
                               "PYTHONIOENCODING": ""}, capture_output=True, timeout=600)
    assert done.returncode != 0 and done.stderr.startswith(b"error: " + missing + b":"), done.stderr
    assert b"\\udc" not in done.stderr, done.stderr
