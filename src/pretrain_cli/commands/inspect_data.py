"""`pretrain-cli inspect-data`: validate and summarise a token file pair, decode a document,
or show exactly which samples (and batch hashes) training sees at a given step."""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from pretrain_cli.counts import first_few
from pretrain_cli.data.inspect import (TOKENIZER_IDS, check_ids, describe_step, step_record, summarize,
                                      summarize_directory)
from pretrain_cli.data.token_file_tokenizers import tokenizer_named
from pretrain_cli.commands import check_counts
from pretrain_cli.counts import count
from pretrain_cli.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prefix", nargs="?", help="token file prefix (PREFIX.bin/.idx; .bin/.idx suffix accepted), "
                                                  "or a directory of token files: one line per file and a check "
                                                  "that all share one tokenizer")
    parser.add_argument("--tokenizer", help="tokenizer directory: checks ids against its vocab, enables --decode "
                                            "(default: none; ids are checked against the file alone, and --decode "
                                            "takes the tokenizer the file's sidecar names, if there unchanged)")
    parser.add_argument("--decode", type=int, metavar="N", help="print document N as text (default: statistics)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of the summary (with --step: of the step's samples)")
    parser.add_argument("--step", type=int, metavar="K",
                        help="show the samples and batch hashes of optimizer step K (default: statistics)")
    parser.add_argument("--config", help="training argument file: its data keys and batch sizes for --step; "
                                         "output_dir and do_train may be absent (default: the flags below)")
    parser.add_argument("--max_seq_length", type=int, default=1024, help="for --step (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=42, help="for --step (default: %(default)s)")
    parser.add_argument("--split", default="949,50,1", help="for --step (default: %(default)s)")
    parser.add_argument("--sample_mode", default="packed", choices=("packed", "padded"),
                        help="for --step (default: %(default)s)")
    parser.add_argument("--batch_size", type=int, default=8,
                        help="per-device micro-batch, for --step (default: %(default)s)")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1, help="for --step (default: %(default)s)")
    parser.add_argument("--data_ranks", "--dp_size", dest="data_ranks", type=int, default=None, metavar="N",
                        help="data ranks, for --step: the ranks that each read their own batch (dp x sharding, "
                             "as train's `batch:` line counts them; --dp_size is the older name); with --config "
                             "the run is resolved on as many, as `train` on that launch would be (default: 1; "
                             "--config of a run's args.json: the data ranks that run had)")


def _skipped_batches(output_dir: str) -> tuple[list, str | None]:
    """The batches a run skipped (non-finite steps, spikes), from its newest trainer state
    (`training.checkpoint.newest_state`: the final one or a checkpoint's)."""
    from pretrain_cli.training.checkpoint import newest_state

    state, where = newest_state(output_dir)
    return (list(state.get("skipped_batches", [])) if state else []), (str(where) if where else None)


def _step_view(ns, tok) -> tuple:
    """--step K: (data lines, train split, micro_bs, acc, tokenizer, skipped batches, trainer state path, data
    ranks) from the run's own configuration, data and trainer state (--config), or from the flags."""
    if ns.config:
        return _config_step_view(ns, tok)
    if not ns.prefix:
        raise UserError("inspect-data: no data; pass a PREFIX or a --config with input_dir")
    from pretrain_cli.data import build_datasets

    splits = build_datasets(ns.prefix, ns.split, ns.max_seq_length, ns.seed, ns.sample_mode, tokenizer=tok,
                            need=("train",), vocab_size=tok.vocab_size if tok else None)
    return splits.describe(), splits.train, ns.batch_size, ns.gradient_accumulation_steps, tok, [], None, \
        ns.data_ranks or 1


def _config_step_view(ns, tok) -> tuple:
    """--config: the run's data keys and batch sizes, resolved on its data ranks (--data_ranks, else a run's record's,
    else one), as `train` resolves them there: a resume keeps its checkpoint's global batch by the accumulation
    for that many ranks. A file without output_dir (a base config that leaves it to the command line) is inspected
    too: only training needs one, so an empty placeholder directory stands in, which holds no trainer state and so
    no skipped batches; so is one that sets no do_train."""
    import tempfile

    from pretrain_cli.orchestration.prepare import load_arguments, prepare
    from pretrain_cli.orchestration.recorded import data_ranks
    from pretrain_cli.orchestration.targets import inference_target, simulated_target

    overrides = ["--input_dir", ns.prefix] if ns.prefix else []
    ranks = ns.data_ranks if ns.data_ranks is not None else data_ranks(ns.config)
    with tempfile.TemporaryDirectory(prefix="pretrain-cli-inspect-") as placeholder:
        args = load_arguments(ns.config, overrides, record="arguments")  # a run's record: as the run took them
        has_output = bool(str(args.training.output_dir or "").strip())
        # the step's samples are the train split's, whatever do_train the file sets (a base file may leave the
        # do_* keys to the command line, as it may output_dir)
        changes = {"do_train": True, **({} if has_output else {"output_dir": placeholder})}
        # one process on this machine's device, as `eval` and `generate` resolve; on several data ranks the launch
        # of that many (`check --world_size`'s), with the file's tensor, pipeline and context degrees beside them
        model = 1
        for key in ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree"):
            model *= max(1, int(args.get(key) or 1))
        spec = prepare(ns.config, overrides, inference_target() if ranks == 1 else simulated_target(ranks * model),
                       changes, record="arguments")
    if spec.run.parallel.data_world_size != ranks:  # (a world the file's degrees split otherwise)
        raise UserError(f"--data_ranks {ranks}: {ns.config} runs {spec.run.parallel.data_world_size} data ranks on "
                        f"{count(spec.run.parallel.world_size, 'process')}; pass --data_ranks "
                        f"{spec.run.parallel.data_world_size}")
    skipped, where = _skipped_batches(spec.run.output.output_dir) if has_output else ([], None)
    lines = spec.splits.describe()
    if where:
        lines.append(f"trainer state: {where} ({len(skipped)} skipped batches; steps after it assume none)")
    lp = spec.run.loop
    return lines, spec.splits.train, lp.micro_batch, lp.grad_accum, tok or spec.tokenizer, skipped, where, ranks


def _step_object(view, step: int) -> dict:
    """`--step K --json`: `data.inspect.step_record` (what `describe_step` prints), with the data lines and the
    trainer state it read, for a script to compare a run's logged hashes with."""
    lines, dataset, micro_bs, acc, tok, skipped, where, ranks = view
    rec = step_record(dataset, step, micro_bs, acc, ranks, tok, skipped_batches=skipped)
    return {**rec, "trainer_state": str(where) if where else None, "data": lines}


def _step(ns, tok) -> int:
    """--step K: its samples and hashes, as text or (--json) one object."""
    if ns.step < 1:  # before any data is read
        raise UserError(f"--step: {ns.step} must be >= 1 (steps are counted from 1, as in the training log)")
    view = _step_view(ns, tok)
    if ns.json:
        print(json.dumps(_step_object(view, ns.step), ensure_ascii=False))
        return 0
    lines, dataset, micro_bs, acc, tok, skipped, _, ranks = view
    for line in lines + describe_step(dataset, ns.step, micro_bs, acc, ranks, tok, skipped_batches=skipped):
        print(line)
    return 0


def _made_with(prefix: str):
    """(the tokenizer the files' sidecar names as the one preprocess made them with, if it is there unchanged (its
    sha256), with a note: --decode of a file preprocess wrote needs no --tokenizer; else None, why it cannot be used
    ("" when the sidecar names none))."""
    from pretrain_cli.data.indexed import read_sidecar
    from pretrain_cli.data.tokenizer import load_tokenizer

    meta = read_sidecar(prefix) or {}
    path = meta.get("tokenizer")
    named = f"{prefix}.json names {path} as the tokenizer that made it"
    if not isinstance(path, str):
        return None, ""
    if not os.path.isdir(path):
        return None, f"{named}, which is not a directory from here ({os.getcwd()})"
    try:
        tok = load_tokenizer(path)
    except UserError as e:
        return None, f"{named}, which does not load ({e})"
    if tok.sha256 != meta.get("tokenizer_sha256"):
        return None, f"{named}, but its files changed since (their sha256 is not the one {prefix}.json records)"
    print(f"note: --decode: with {path}, the tokenizer {prefix}.json names as the one that made it", file=sys.stderr)
    return tok, ""


def main(ns: argparse.Namespace) -> int:
    check_counts(ns, "max_seq_length", "batch_size", "gradient_accumulation_steps", "data_ranks")
    tok = None
    if ns.tokenizer:
        from pretrain_cli.data.tokenizer import load_tokenizer

        tok = load_tokenizer(ns.tokenizer)
    if ns.step is not None:
        return _step(ns, tok)
    if not ns.prefix:
        raise UserError("inspect-data: PREFIX is required (the token files' path without .bin/.idx)")
    if os.path.isdir(ns.prefix):
        return _directory(ns, tok)
    from pretrain_cli.data.indexed import open_token_file

    ds = open_token_file(ns.prefix)
    check_ids([ds], tok, ns.tokenizer)
    if ns.decode is not None:
        why = ""
        if tok is None:
            tok, why = _made_with(ds.prefix)
        if tok is None:
            raise UserError("--decode: needs --tokenizer DIR to turn ids back into text" + (f": {why}" if why else ""))
        if not 0 <= ns.decode < ds.num_documents:
            raise UserError(f"--decode: document {ns.decode} out of range; {ds.prefix} has "
                            f"{count(ds.num_documents, 'document')}")
        a, b = int(ds.doc_idx[ns.decode]), int(ds.doc_idx[ns.decode + 1])
        ids = np.concatenate([ds.get(i) for i in range(a, b)]) if b > a else np.zeros(0, np.int64)
        print(tok.decode(ids))
        return 0
    from pretrain_cli.data.indexed import read_sidecar

    meta = read_sidecar(ds.prefix)
    info = summarize(ds, tok, (meta or {}).get("eos_token_id"))  # without --tokenizer: the EOS the sidecar records
    if meta and meta.get("special_tokens_in_text") is not None:  # (sidecars from before the option have none)
        info["special_tokens_in_text"] = meta["special_tokens_in_text"]
    made = meta is not None and any(meta.get(f) for f in TOKENIZER_IDS)  # (a sidecar may record no tokenizer)
    if made:
        info.update({f: meta[f] for f in ("tokenizer", *TOKENIZER_IDS) if meta.get(f) is not None})
    if ns.json:
        print(json.dumps(info, sort_keys=True, ensure_ascii=False))
        return 0
    dl = info["doc_length"]
    print(f"{info['prefix']}: OK ({info['format']}, {info['dtype']})")
    print(f"documents {info['documents']}  sequences {info['sequences']}  tokens {info['tokens']}  "
          f"max token id {info['max_token_id']}" + (f" (vocab {info['vocab_size']})" if "vocab_size" in info else ""))
    print(f"document length: min {dl['min']}  mean {dl['mean']:.1f}  max {dl['max']}")
    if "eos_rate" in info:
        without = " (preprocessed without --append_eos)" if meta and meta.get("eos_appended") is False else ""
        print(f"documents ending in EOS: {100 * info['eos_rate']:.1f}%{without}")
    if "special_tokens_in_text" in info:
        print(f"special tokens' text in documents became: {info['special_tokens_in_text']} "
              "(preprocess --special_tokens_in_text)")
    if made:
        print(f"made with {tokenizer_named(meta)}")
    width = max(info["length_histogram"].values(), default=1)
    for bucket, n in info["length_histogram"].items():
        print(f"  {bucket:>15} {n:>9} {'#' * max(1, round(40 * n / width))}")
    for line in _tokenizer_notes(0 if meta else 1, 1, tok, ns.tokenizer, one=True):
        print(line)
    return 0


def _tokenizer_notes(without_sidecar: int, files: int, tok, tokenizer_dir: str | None, one: bool = False) \
        -> list[str]:
    """What the summary says of the files' tokenizer beyond their rows: that --tokenizer's check passed (else a
    summary with --tokenizer reads as one without it, which checks nothing against a tokenizer), and which files'
    tokenizer no sidecar records (such a file was checked against --tokenizer only by its ids' range). `one`: a
    PREFIX, not a directory's files."""
    lines = []
    if tok is not None:
        k = files - without_sidecar
        named = "" if not k else "; its sidecar agrees with it" if one else \
            f"; {count(k, 'sidecar')} agree{'s' if k == 1 else ''} with it"
        lines.append(f"ids checked against {tokenizer_dir}: all below its vocab {tok.vocab_size}{named}")
    if without_sidecar:
        n = without_sidecar
        its, has = ("its", "has") if n == 1 else ("their", "have")
        what = f"{count(n, 'file')} {has}" if not one else "the file has"
        fix = (f"only {its} ids' range was checked against {tokenizer_dir}" if tok is not None
               else f"--tokenizer DIR checks {its} ids against one")
        lines.append(f"note: {what} no .json sidecar (Megatron, PaddleNLP or an older pretrain-cli made "
                     f"{'it' if n == 1 else 'them'}): {its} tokenizer is unknown; {fix}")
    return lines


def _agreed(known: list, dtype: str) -> str:
    """The line of a directory whose files with a sidecar agree: the tokenizer as the fullest sidecar records it
    (the first to record the first of `TOKENIZER_IDS` any records, as `data.inspect.tokenizer_groups` names a
    group: an older sidecar, tokenizer.json's sha256 alone, may come first), and where they record several
    fingerprints (`tokenizer_problems` joined them by their ids fingerprints), that they are forms of one tokenizer."""
    k = next((r for f in TOKENIZER_IDS for r in known if r.get(f)), known[0])
    which = ("the file with a sidecar says" if len(known) == 1 else
             f"the {count(len(known), 'file')} with a sidecar agree")
    fps = {r["tokenizer_fingerprint"] for r in known if r.get("tokenizer_fingerprint")}
    forms = f"; {len(fps)} fingerprints: forms of one tokenizer, which give the same ids" if len(fps) > 1 else ""
    return (f"tokenizer: {which}: vocab {k.get('vocab_size')}, eos {k.get('eos_token_id')}, {tokenizer_named(k)}"
            f"{forms}; dtype {dtype}")


_ID_NAMES = {"tokenizer_ids_fingerprint": "ids fingerprint", "tokenizer_fingerprint": "fingerprint",
             "tokenizer_sha256": "tokenizer.json sha256"}


def _groups_line(groups: list) -> str:
    """The tokenizers a directory's files were made with, each with the files it made (three named, then a count),
    as `data.inspect.tokenizer_groups` groups and names them."""
    said = []
    for g in groups:
        field = next(f for f in TOKENIZER_IDS if f in g)
        files = [os.path.basename(p) for p in g["files"]]
        named = first_few(files)
        said.append(f"{', '.join(g['tokenizers']) or 'a tokenizer not named'} ({_ID_NAMES[field]} "
                    f"{str(g[field])[:12]}): {named}")
    return f"tokenizers: the files were made with {len(groups)}: " + "; ".join(said)


def _directory(ns, tok) -> int:
    """A directory: one line per token file, totals, and whether all files share one tokenizer (exit 2 if not)."""
    if ns.decode is not None:
        raise UserError(f"--decode: {ns.prefix} is a directory; pass one token file PREFIX")
    info = summarize_directory(ns.prefix, tok, ns.tokenizer)
    if ns.json:
        print(json.dumps(info, sort_keys=True, ensure_ascii=False))
    else:
        rows = info["files"]
        print(f"{info['directory']}: {count(len(rows), 'token file')}, {count(info['documents'], 'document')}, "
              f"{count(info['tokens'], 'token')}")
        width = max(len(os.path.basename(r["prefix"])) for r in rows)
        for r in rows:
            made = (f"vocab {r.get('vocab_size')}  eos {r.get('eos_token_id')}  {tokenizer_named(r)}"
                    if r["sidecar"] else "no sidecar")
            if r.get("special_tokens_in_text") is not None:
                made += f"  special tokens' text: {r['special_tokens_in_text']}"
            print(f"  {os.path.basename(r['prefix']):<{width}}  documents {r['documents']:>10}  "
                  f"tokens {r['tokens']:>13}  {r['dtype']:<6}  {made}")
        if not info["problems"]:
            known = [r for r in rows if r["sidecar"]]
            if known:
                print(_agreed(known, rows[0]["dtype"]))
            for line in _tokenizer_notes(info["without_sidecar"], len(rows), tok, ns.tokenizer):
                print(line)
        elif len(info["tokenizers"]) > 1:
            print(_groups_line(info["tokenizers"]))
    if info["problems"]:
        raise UserError("\n".join(info["problems"]))
    return 0
