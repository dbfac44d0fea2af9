"""What is in a token file pair, and which samples training sees at a given step (behind `inspect-data`).

Opening the pair runs every structural check (magic, version, dtype, sizes vs file
length, pointer monotonicity), so "it opens" already means "it is well-formed".
"""
from __future__ import annotations


import numpy as np

from pretrain_cli.counts import count
from pretrain_cli.errors import UserError

_CHUNK = 1 << 20


def summarize(ds, tokenizer=None, eos: int | None = None) -> dict:
    """Counts, document length statistics and a log2 length histogram; with an EOS id (the tokenizer's, else `eos`:
    the one the file's sidecar records), the share of documents that end in it."""
    doc_idx = np.asarray(ds.doc_idx, dtype=np.int64)
    sizes = np.asarray(ds.sizes, dtype=np.int64)
    seq_start = np.concatenate(([0], np.cumsum(sizes)))  # [N+1] element offset of each sequence
    doc_len = seq_start[doc_idx[1:]] - seq_start[doc_idx[:-1]]  # [documents] tokens per document
    hist: dict[str, int] = {}
    if doc_len.size:
        if (doc_len == 0).any():  # Megatron's empty documents (no sequence between two doc_idx entries), not length 1
            hist["0"] = int((doc_len == 0).sum())
        buckets = np.floor(np.log2(doc_len[doc_len > 0])).astype(np.int64)
        for b, c in zip(*np.unique(buckets, return_counts=True)):
            hist[f"{2 ** int(b)}-{2 ** (int(b) + 1) - 1}"] = int(c)
    out = {
        "prefix": ds.prefix, "format": ds.format, "dtype": ds.dtype.name,
        "documents": ds.num_documents, "sequences": len(ds), "tokens": ds.num_tokens,
        "max_token_id": ds.max_token_id(),
        "doc_length": {"min": int(doc_len.min()), "mean": float(doc_len.mean()), "max": int(doc_len.max())},
        "length_histogram": hist, "loss_mask": ds.loss_mask is not None,
    }
    if tokenizer is not None:
        out["vocab_size"] = tokenizer.vocab_size
        eos = tokenizer.eos_token_id
    if eos is not None:
        nonempty = doc_len > 0
        last = seq_start[doc_idx[1:]][nonempty] - 1  # element index of each document's last token
        ends = sum(int((np.asarray(ds.data[last[s : s + _CHUNK]]) == eos).sum())
                   for s in range(0, last.size, _CHUNK))
        out["eos_rate"] = ends / max(1, int(nonempty.sum()))
    return out


def summarize_directory(directory: str, tokenizer=None, tokenizer_dir: str = "") -> dict:
    """Every token file in a directory (each opened, so each is checked, and its ids, with `tokenizer` also its
    sidecar, as `check_ids`): documents, tokens, dtype and the tokenizer its sidecar records; `tokenizers` groups
    the files by it (`tokenizer_groups`); `problems` lists disagreements (dtype, vocab size, EOS id, tokenizer)."""
    from pretrain_cli.data.indexed import open_token_file, read_sidecar, token_prefixes
    from pretrain_cli.data.token_file_tokenizers import TOKENIZER_FIELDS, tokenizer_problems

    prefixes = token_prefixes(directory)
    if not prefixes:
        raise UserError(f"{directory}: holds no .idx or _idx.npz token files; pass a directory of token files or a "
                        "PREFIX")
    rows, items, datasets = [], [], []
    for p in prefixes:
        ds = open_token_file(p)
        datasets.append(ds)
        meta = read_sidecar(p)
        items.append((p, meta))
        row = {"prefix": p, "format": ds.format, "dtype": ds.dtype.name, "documents": ds.num_documents,
               "tokens": ds.num_tokens, "sidecar": meta is not None}
        row.update({f: meta.get(f) for f in (*TOKENIZER_FIELDS, "tokenizer", "tokenizer_fingerprint",
                                             "tokenizer_ids_fingerprint", "special_tokens_in_text")} if meta else {})
        rows.append(row)
    check_ids(datasets, tokenizer, tokenizer_dir)
    problems = tokenizer_problems(items)
    dtypes = sorted({r["dtype"] for r in rows})
    if len(dtypes) > 1:
        odd = next(r for r in rows if r["dtype"] != rows[0]["dtype"])
        problems.insert(0, f"{odd['prefix']}: dtype {odd['dtype']} differs from {rows[0]['dtype']} in "
                           f"{rows[0]['prefix']}; the files were made with different tokenizers")
    return {"directory": str(directory), "files": rows, "documents": sum(r["documents"] for r in rows),
            "tokens": sum(r["tokens"] for r in rows), "without_sidecar": sum(not r["sidecar"] for r in rows),
            "tokenizers": tokenizer_groups(items), "problems": problems}


TOKENIZER_IDS = ("tokenizer_ids_fingerprint", "tokenizer_fingerprint", "tokenizer_sha256")


def tokenizer_groups(items) -> list[dict]:
    """The files whose sidecar names a tokenizer ((prefix, sidecar) `items`), in the groups of one tokenizer that
    `token_file_tokenizers.tokenizer_groups` makes, the one rule of "the same tokenizer" (more than one group is
    what `tokenizer_problems` refuses, so the two never disagree): each named by the first of `TOKENIZER_IDS` one
    of its sidecars records (the ids fingerprint, which decides whether files or a file and a run's tokenizer
    match; in sidecars from before it, the fingerprint; before that, tokenizer.json's sha256), with the tokenizer
    paths its sidecars record and its files."""
    from pretrain_cli.data.token_file_tokenizers import tokenizer_groups as one_tokenizer_each

    out = []
    for group in one_tokenizer_each(items):
        field = next(f for f in TOKENIZER_IDS if any(m.get(f) for _, m in group))
        out.append({field: next(m[field] for _, m in group if m.get(field)),
                    "tokenizers": list(dict.fromkeys(m["tokenizer"] for _, m in group if m.get("tokenizer"))),
                    "files": [p for p, _ in group]})
    return out


def check_ids(datasets, tokenizer=None, tokenizer_dir: str = "") -> None:
    """What `train` and `check` refuse, refused here too: ids below 0, and with a tokenizer, ids beyond its vocabulary
    and files whose sidecar names another tokenizer (`data.check_tokenizer`: vocabulary size, EOS id, fingerprint;
    a tokenizer retrained on other text has the same size and ids in range)."""
    from pretrain_cli.data import check_tokenizer
    from pretrain_cli.data.indexed import check_token_ids

    for ds in datasets:
        check_token_ids(ds, tokenizer.vocab_size if tokenizer is not None else None,
                        f"vocab size {tokenizer.vocab_size} of {tokenizer_dir}" if tokenizer is not None else "",
                        "the file was made with another tokenizer: re-run preprocess with this one")
    if tokenizer is not None:
        check_tokenizer([ds.prefix for ds in datasets], tokenizer,
                        instead="pass the --tokenizer that made it")


def first_sample(step: int, batch: int, skipped_batches=()) -> int:
    """The first global sample of optimizer step `step` (1-based): step k takes the k-th batch of `batch`
    samples that was not skipped (a non-finite step consumes its batch without counting as a step)."""
    first = (step - 1) * batch
    for s in sorted(skipped_batches):
        if s <= first:
            first += batch
    return first


def step_record(dataset, step: int, micro_bs: int, acc: int, data_ranks: int, tokenizer=None,
                decode_chars: int = 120, skipped_batches=()) -> dict:
    """Samples and hashes of optimizer step `step` (1-based, as logged): step k consumes the global samples
    [first, first + B), B = micro_bs*data_ranks*acc (`first_sample`); micro-step m on data rank r takes its slice.
    `data_ranks` counts every rank that reads its own batch (dp x sharding, ARCHITECTURE.md facts: degrees), not
    the dp degree alone: a sharding or expert-parallel run's data ranks are its sharding ranks too. The one
    computation behind `describe_step`'s lines and `inspect-data --step K --json`."""
    from pretrain_cli.data.loader import batch_hash, micro_batch

    if step < 1:
        raise UserError(f"--step: {step} must be >= 1 (steps are counted from 1, as in the training log)")
    g = micro_bs * data_ranks
    first = first_sample(step, g * acc, skipped_batches)
    micro_steps = []
    for m in range(acc):
        consumed = first + m * g
        ranks = []
        for r in range(data_ranks):
            part = micro_batch(dataset, consumed, micro_bs, r, data_ranks)
            rank = {"rank": r, "samples": [consumed + r * micro_bs, consumed + (r + 1) * micro_bs],
                    "hash": batch_hash(part)}
            if tokenizer is not None:
                rank["first_sample"] = tokenizer.decode(part["input_ids"][0])[:decode_chars]
            ranks.append(rank)
        micro_steps.append({"micro_step": m, "samples": [consumed, consumed + g],
                            "hash": batch_hash(micro_batch(dataset, consumed, g, 0, 1)), "ranks": ranks})
    return {"step": step, "samples": [first, first + g * acc], "micro_batch_size": micro_bs, "data_ranks": data_ranks,
            "gradient_accumulation_steps": acc, "skipped_batches": len(skipped_batches), "micro_steps": micro_steps}


def describe_step(dataset, step: int, micro_bs: int, acc: int, data_ranks: int, tokenizer=None,
                  decode_chars: int = 120, skipped_batches=()) -> list[str]:
    """`step_record` as the lines `inspect-data --step K` prints; the batch in the words of `train`'s `batch:` line
    ("N data ranks", never "dp N", which a sharding or expert-parallel user reads as the dp degree alone)."""
    rec = step_record(dataset, step, micro_bs, acc, data_ranks, tokenizer, decode_chars, skipped_batches)
    (first, end), skipped = rec["samples"], rec["skipped_batches"]
    after = f"; after {count(skipped, 'skipped batch')}" if skipped else ""
    lines = [f"step {step}: global samples [{first}, {end}) (micro_bs {micro_bs} x {count(data_ranks, 'data rank')} x "
             f"acc {acc}{after})"]
    for ms in rec["micro_steps"]:
        lo, hi = ms["samples"]
        lines.append(f"  micro-step {ms['micro_step']}: samples [{lo}, {hi}) global hash {ms['hash']}")
        for r in ms["ranks"]:
            lines.append(f"    rank {r['rank']}: samples [{r['samples'][0]}, {r['samples'][1]}) hash {r['hash']}")
            if "first_sample" in r:
                lines.append(f"      first sample: {r['first_sample']!r}")
    return lines


