r"""Encoding a long document in pieces, so `preprocess`'s memory is bounded by a piece, not by its longest document.

`tokenizers` holds about 110 bytes per character of the text it encodes at once (words; 230 for CJK, 270 for
minified JSON: benchmarks/long_document_rss.py; a 20 M-character document of words took 2.10 GiB). A document
longer than `PIECE_CHARS` is cut into pieces that are encoded one group at a time and joined: the same ids as the
whole, exactly, where a cut falls where the tokenizer's pre-tokenizer always splits whatever the context. For
the byte-level pipelines of GPT-2, Llama 3 and Qwen2 (ours: `train-tokenizer`) that is before a space between two
non-whitespace characters (the space starts the next word's pre-token, and every alternative of their split
patterns ends at a non-whitespace character followed by a space) or after a newline between two non-whitespace
characters (no alternative runs on from a newline into a non-whitespace character, and a lone newline ends every
pre-token that holds it); NFC never composes across either (a space or newline is a starter that composes with
nothing). Llama 3's and Qwen2's patterns also always split after any run of newlines before a non-whitespace
character (`\s*[\r\n]+` takes the run whole, ` ?[^\s\p{L}\p{N}]+[\r\n]*` ends on it, and no alternative starts
with a newline and goes on into non-whitespace), so paragraphs between blank lines are cut there too; GPT-2's
does not (in the whole text `\s+(?!\S)` leaves a run's last newline to a pre-token of its own, at a piece's end
it takes the run whole). `cuttable` admits only those pipelines (and no added token that holds or strips
whitespace) and answers which cut points; any other tokenizer encodes each document whole (memory then grows with
the longest document: docs/DATA.md, "Speed and memory"). Text with no cut point (minified JSON or JavaScript; for
GPT-2's pattern also CJK paragraphs between blank lines, which have no spaces) stays one piece past
`PIECE_CHARS`, at the whole encoding's cost. tests/unit/test_preprocess_long.py compares every cut point of
mixed text with the whole encoding for each admitted pattern (and finds GPT-2's differ after a blank line).
"""
from __future__ import annotations

import re

import numpy as np

from pretrain_cli.data.tokenizer_ids import QWEN2_SPLIT

PIECE_CHARS = 1 << 18  # 256 K characters: ~25 MB of the tokenizer's working memory per piece in flight
GROUP_CHARS = 1 << 20  # pieces encoded together (one `encode_batch`: its threads share them)
_WINDOW = 1 << 16  # a cut is looked for in the last 64 K characters before the piece's end
_CUT = re.compile(r"(?<=\S)(?= \S)|(?<=\S\n)(?=\S)")  # Python's \s covers the Unicode White_Space the patterns use
_CUT_AFTER_NEWLINES = re.compile(r"(?<=\S)(?= \S)|(?<=\n)(?=\S)")  # Llama 3's and Qwen2's: after any newline run
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
SPLITS = (QWEN2_SPLIT, LLAMA3_SPLIT, GPT2_SPLIT)


def cuttable(pipeline: dict) -> re.Pattern | None:
    """Where documents encoded with this tokenizer (`Tokenizer.pipeline()` of its `for_documents` copy) may be cut
    with the same ids as the whole: the cut points for `cut` and `encode`, or None (encode whole). Tokens still
    flagged special there are plain text under every `--special_tokens_in_text` choice (their own text, cut like
    any); the ones a choice matches as ids have lost the flag in that copy and are judged as any other added
    token."""
    norm, pre = pipeline.get("normalizer"), pipeline.get("pre_tokenizer") or {}
    norms = norm.get("normalizers", []) if norm and norm.get("type") == "Sequence" else [norm] if norm else []
    if any(n.get("type") != "NFC" for n in norms):
        return False
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    points = None
    if len(parts) == 1:  # GPT-2's byte level, its split pattern built in
        points = _CUT if _byte_level(parts[0], use_regex=True) else None
    elif len(parts) == 2:
        split, byte_level = parts
        pattern = (split.get("pattern") or {}).get("Regex")
        if (split.get("type") == "Split" and pattern in SPLITS and split.get("behavior") == "Isolated"
                and not split.get("invert") and _byte_level(byte_level, False)):
            points = _CUT if pattern == GPT2_SPLIT else _CUT_AFTER_NEWLINES
    added = [t for t in pipeline.get("added_tokens") or [] if not t.get("special")]  # flagged special: text
    if any(t.get("lstrip") or t.get("rstrip") or any(c.isspace() for c in t.get("content", "")) for t in added):
        return None
    return points


def _byte_level(part: dict, use_regex: bool) -> bool:
    return (part.get("type") == "ByteLevel" and not part.get("add_prefix_space")
            and bool(part.get("use_regex", True)) == use_regex)


def cut(text: str, limit: int | None = None, points: re.Pattern = _CUT):
    """`text` in pieces of about `limit` (default `PIECE_CHARS`) characters, cut at `points` (`cuttable`'s answer;
    the last one before a piece's limit, else the first after it; text with no such point stays one piece). A
    generator: only the pieces being encoded are copies."""
    limit = limit or PIECE_CHARS
    start = 0
    while len(text) - start > limit:
        end = start + limit
        last = None
        for last in points.finditer(text, max(start + 1, end - _WINDOW), end):
            pass
        if last is None:
            last = points.search(text, end)
            if last is None:
                break
        yield text[start : last.start()]
        start = last.start()
    yield text[start:]


def encode(tok, texts: list[str], dtype, points: re.Pattern = _CUT) -> list[np.ndarray]:
    """Each text's ids (`dtype`), a long one's encoded piece by piece (cut at `points`) and joined."""
    out: list[list[np.ndarray]] = [[] for _ in texts]
    group: list[tuple[int, str]] = []
    size = 0

    def flush():
        for (k, _), ids in zip(group, tok.encode_batch([p for _, p in group])):
            out[k].append(np.asarray(ids, dtype=dtype))
        group.clear()

    for k, text in enumerate(texts):
        for piece in cut(text, None, points):
            group.append((k, piece))
            size += len(piece)
            if size >= GROUP_CHARS:
                flush()
                size = 0
    if group:
        flush()
    return [parts[0] if len(parts) == 1 else np.concatenate(parts) for parts in out]
