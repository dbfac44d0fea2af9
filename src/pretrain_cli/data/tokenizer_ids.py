"""What decides the ids a tokenizer gives, and whether transformers would rebuild it the same (`data.tokenizer` loads
and exports tokenizers; this module judges two serialised forms).

`ids_form` is what `Tokenizer.ids_fingerprint` hashes: two forms of one tokenizer (vocab.json + merges.txt against
its own tokenizer.json, a re-save by another library) agree on it exactly when `encode` gives them the same ids, so a
resume and token files' sidecars accept either form (`training.tokenizer_lineage`, `data.merge`).
`transformers_mismatch` says when transformers >= 5 would rebuild a tokenizer's normalizer and pre-tokenizer from a
class's own recipe (every qwen2 model's tokenizer is loaded as `Qwen2Tokenizer`) and so encode otherwise;
`qwen2_pipeline` is that recipe, which `data.tokenizer_training` trains with.
"""
from __future__ import annotations

import json

# Qwen2's pre-tokenizer pattern (its tokenizer.json and transformers' Qwen2Tokenizer): contractions, letters
# with one leading non-letter, single digits, punctuation runs, newline runs, other whitespace.
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def qwen2_pipeline(tok) -> None:
    """Qwen2's normalizer, pre-tokenizer and decoder, as transformers' `Qwen2Tokenizer` builds them."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers

    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()


def transformers_mismatch(tokenizer, model_type: str) -> str | None:
    """Why `AutoTokenizer` on a directory with this tokenizer and a `model_type` config.json would encode
    otherwise than `tokenizer.json`, or None. Only "qwen2" forces a class (`Qwen2Tokenizer`) over the
    `PreTrainedTokenizerFast` our directories name; that class keeps the BPE vocabulary and merges and
    rebuilds the rest, so the two agree exactly when normalizer, pre-tokenizer and BPE options are Qwen2's."""
    if model_type != "qwen2":
        return None
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    ours = tokenizer.spec()
    rebuilt = HFTokenizer(models.BPE(vocab={}, merges=[], dropout=None, unk_token=None, continuing_subword_prefix="",
                                     end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    qwen2_pipeline(rebuilt)
    theirs = json.loads(rebuilt.to_str())
    differs = [part for part in ("normalizer", "pre_tokenizer") if ids_form(ours)[part] != ids_form(theirs)[part]]
    model = ours.get("model") or {}
    if model.get("type") != "BPE":
        differs.append("model")
    else:
        differs += [f"BPE {k}" for k, v in theirs["model"].items()
                    if k not in ("vocab", "merges") and (model.get(k) or None) != (v or None)]
    if not differs:
        return None
    return (f"tokenizer: {tokenizer.path} differs from Qwen2's in {', '.join(differs)}, and transformers >= 5 loads "
            f"every qwen2 model's tokenizer as Qwen2Tokenizer, which rebuilds those parts: AutoTokenizer on the "
            f"output would give other ids than the training data; load it with "
            f"transformers.PreTrainedTokenizerFast.from_pretrained(DIR), or train the tokenizer with "
            f"`pretrain-cli train-tokenizer` (Qwen2's pipeline)")


def ids_form(spec: dict) -> dict:
    """The parts of a serialised tokenizer that decide the ids `encode` gives, as two forms of one tokenizer agree
    on them: the decoder and post-processor, which `encode` never asks for, left out; ByteLevel's `trim_offsets`,
    which moves offsets only, left out of the pre-tokenizer; each added token's `normalized` kept only where it
    can change a split (`_passes_matter`)."""
    added = spec.get("added_tokens") or []
    keep = spec.get("normalizer") is not None or _passes_matter(added)
    return {"normalizer": spec.get("normalizer"), "pre_tokenizer": _pre_tokenizer_ids(spec.get("pre_tokenizer")),
            "model": spec.get("model"), "truncation": spec.get("truncation"), "padding": spec.get("padding"),
            "added_tokens": sorted([t["id"], t["content"], bool(t.get("special")), bool(t.get("single_word")),
                                    bool(t.get("lstrip")), bool(t.get("rstrip")), keep and bool(t.get("normalized"))]
                                   for t in added)}


def _pre_tokenizer_ids(part):
    """A pre-tokenizer without ByteLevel's `trim_offsets` (in a Sequence too); nothing else is touched, so a key
    of that name elsewhere (a token's text in a vocabulary) stays."""
    if isinstance(part, dict) and part.get("type") == "Sequence":
        return {**part, "pretokenizers": [_pre_tokenizer_ids(p) for p in part.get("pretokenizers") or ()]}
    if isinstance(part, dict) and part.get("type") == "ByteLevel":
        return {k: v for k, v in part.items() if k != "trim_offsets"}
    return part


def _passes_matter(added: list) -> bool:
    """Whether, with no normalizer, the added tokens' `normalized` flags can change a split. `tokenizers` matches
    the tokens flagged false on the text first, then those flagged true on what is left: with no normalizer the
    two passes see the same text, so each token's matches are its own unless a match of another token can share
    a character with it (one text inside the other, or one's end the other's start: with `ab` and `bc`, "abc" is
    `ab`+c in one pass and a+`bc` when `bc` goes first: `_overlap`) or a flag looks past the match (single_word,
    lstrip, rstrip: a piece's edge reads as a word's). Either way the flags are kept."""
    if any(t.get("single_word") or t.get("lstrip") or t.get("rstrip") for t in added):
        return True
    return _overlap(sorted({t["content"] for t in added}))


def _overlap(texts: list) -> bool:
    """Whether one of the distinct `texts` holds another, or a proper end of one is a start of another. Comparing
    every pair is quadratic in their number (4,000 added tokens: seconds, on every fingerprint); here they make one
    trie with Aho-Corasick failure links (a node's link: its string's longest proper end that starts some text), so
    each text is read twice and each of its ends that starts a text is reached along its end node's links: linear
    in the texts' total length."""
    if len(texts) < 2:
        return False
    if "" in texts:  # inside every other text (`tokenizers` adds no empty token; kept as the pairwise rule had it)
        return True
    children, below, one, ends = [{}], [0], [-1], [False]  # per node; `below`: texts starting with its string
    last = []  # each text's end node
    for k, text in enumerate(texts):
        node = 0
        for c in text:
            nxt = children[node].get(c)
            if nxt is None:
                nxt = len(children)
                children[node][c] = nxt
                children.append({})
                below.append(0)
                one.append(-1)
                ends.append(False)
            node = nxt
            below[node] += 1
            one[node] = k
        ends[node] = True
        last.append(node)
    fail, inner = [0] * len(children), [False] * len(children)  # inner: a text ends at a node along the links
    queue = list(children[0].values())
    for n in queue:  # breadth first: a node's link is settled before its children's
        for c, m in children[n].items():
            f = fail[n]
            while f and c not in children[f]:
                f = fail[f]
            fail[m] = children[f].get(c, 0)
            inner[m] = ends[fail[m]] or inner[fail[m]]
            queue.append(m)
    for k, text in enumerate(texts):
        node = 0
        for c in text:  # a text ending at a start of this one (a prefix), or inside it (along the links)
            node = children[node][c]
            if (ends[node] and node != last[k]) or inner[node]:
                return True
        f = fail[last[k]]
        while f:  # a proper end of this text that starts another text
            if below[f] > 1 or one[f] != k:
                return True
            f = fail[f]
    return False
