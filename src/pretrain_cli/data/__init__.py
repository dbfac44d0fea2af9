"""Token files -> train/valid/test sample datasets (numpy only; no Paddle here).

`build_datasets()` is the one entry point (`orchestration.prepare` calls it); batches come from
`data.loader.BatchIterator` / `micro_batch` over the returned datasets.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from pretrain_cli.counts import count, first_few
from pretrain_cli.data.blend import BlendedDataset, parse_input_dir, source_name
from pretrain_cli.data.indexed import IndexedDataset, check_token_ids, open_token_file
from pretrain_cli.data.samples import special_ids
from pretrain_cli.data.splits import SPLIT_NAMES, parse_split, split_datasets
from pretrain_cli.errors import UserError

__all__ = ["DataSplits", "build_datasets", "check_tokenizer", "open_token_file", "IndexedDataset", "BlendedDataset"]

_RATIO_WINDOW = 10_000


@dataclass
class DataSplits:
    train: object = None
    valid: object = None
    test: object = None
    sources: list = field(default_factory=list)  # one dict per source: prefix, weight, dataset, splits
    # what the run should know of its sources: their sidecars (`missing_eos`), a directory's token-count weights
    # (`directory_weights`), their `.lsm` loss masks (`loss_masks`)
    notes: list = field(default_factory=list)

    def get(self, name: str):
        return getattr(self, name)

    def describe(self, train_samples: int | None = None) -> list[str]:
        """Start-up log lines: per source documents/tokens/epochs; requested vs realised ratios."""
        lines = []
        total_w = sum(s["weight"] for s in self.sources)
        for s in self.sources:
            src = s["dataset"]
            share = s["weight"] / total_w
            line = (f"data: {source_name(src.prefix)} weight {share:.3f}: {count(src.num_documents, 'document')}"
                    + (f" in {count(len(src), 'sequence')} (split and shuffled by sequence)" if src.unit != "document"
                       else "") + f", {count(src.num_tokens, 'token')} ({src.dtype.name})")
            unit = "doc" if src.unit == "document" else "sequence"
            for name in SPLIT_NAMES:
                ds = s["splits"].get(name)
                if ds is not None:
                    line += f"; {name} {count(ds.num_docs, unit)} / {count(ds.samples_per_epoch, 'sample')} per epoch"
            train = s["splits"].get("train")
            if train_samples and train is not None:  # a run that reads a small corpus many times says so at start
                line += (f"; the run's {round(train_samples * share):,} train samples from it: "
                         f"{_epochs(train.epochs_for(train_samples * share))} epochs")
            lines.append(line)
        for name in SPLIT_NAMES:
            ds = getattr(self, name)
            if isinstance(ds, BlendedDataset):
                req = "/".join(f"{w:.3f}" for w in ds.weights)
                real = "/".join(f"{r:.3f}" for r in ds.realized_ratios(_RATIO_WINDOW))
                lines.append(f"data: {name} blend requested {req}, realised {real} over the first {_RATIO_WINDOW} "
                             "samples")
        return lines


def _epochs(x: float) -> str:
    """Two decimals, or two significant digits below 0.1: a short run on a large corpus reads 0.0008 of an epoch,
    which two decimals showed as 0.00 (as if the source were not read)."""
    if x >= 0.1 or x <= 0:
        return f"{x:.2f}"
    return f"{x:.{1 - math.floor(math.log10(x))}f}"


def check_tokenizer(prefixes: list[str], tokenizer, where: str = "", instead: str | None = None) -> None:
    """Token files made by another tokenizer than the run's (or, with none, by different ones) would train on
    ids that mean other text: refused, by their sidecars (`preprocess` writes them); `where` begins the line
    (`eval --data` names its option), `instead` ends it (the other way out, where it is not a run's key:
    `inspect-data --tokenizer`)."""
    from pretrain_cli.data.indexed import read_sidecar
    from pretrain_cli.data.token_file_tokenizers import tokenizer_mismatches, tokenizer_problems

    items = [(p, read_sidecar(p)) for p in prefixes]
    problems = (tokenizer_mismatches(items, tokenizer, instead) if hasattr(tokenizer, "sha256")
                else tokenizer_problems(items))
    if problems:
        more = f" ({len(problems)} such files)" if len(problems) > 1 else ""
        raise UserError(where + problems[0] + more)


def missing_eos(prefixes: list[str]) -> list[str]:
    """A warning naming the token files whose sidecars say preprocess appended no EOS though the tokenizer has one
    (`eos_appended` false): packed samples join their documents with nothing between them, which no check refuses
    and no loss shows. Files without a sidecar (another tool's) are not judged."""
    from pretrain_cli.data.indexed import read_sidecar

    without = [p for p in prefixes if (m := read_sidecar(p)) and m.get("eos_appended") is False
               and m.get("eos_token_id") is not None]
    if not without:
        return []
    one = len(without) == 1
    names = first_few(without)
    return [f"input_dir: WARNING: {names} {'was' if one else 'were'} preprocessed without --append_eos (eos_appended "
            f"false in {'its sidecar' if one else 'their sidecars'}): packed samples run one document into the next "
            f"with no EOS between them, so the model never learns where a document ends; re-run preprocess with "
            f"--append_eos"]


_EQUAL_WITHIN = 0.1  # a token share within a tenth of 1/n of it (shards of one corpus) blends as PaddleNLP's would


def directory_weights(input_dir, sources: list) -> list[str]:
    """A note where input_dir is a directory of several token files whose token shares (the weights here: one
    merged corpus, as a directory of `preprocess --num_tasks` shards is) differ from PaddleNLP's, whose
    run_pretrain gives each file of a directory weight 1.0: both blends, and the input_dir that trains as PaddleNLP
    does. Shares within `_EQUAL_WITHIN` of equal (shards) say nothing: the two blends are alike."""
    n = len(sources)
    if n < 2 or len(str(input_dir).split()) != 1:
        return []
    total = sum(s["weight"] for s in sources)
    shares = [s["weight"] / total for s in sources]
    if max(abs(x * n - 1) for x in shares) <= _EQUAL_WITHIN:
        return []
    names = "/".join(source_name(s["prefix"]) for s in sources[:4])
    ours = "/".join(f"{x:.3f}" for x in shares[:4])
    equal = "/".join([f"{1 / n:.3f}"] * min(n, 4))
    more = f"/... ({n} files)" if n > 4 else ""
    pairs = " ".join(f"1.0 {s['prefix']}" for s in sources[:4]) + (" ..." if n > 4 else "")
    return [f"input_dir: {input_dir} holds {n} token files, blended by their tokens {ours}{more} ({names}{more}); "
            f"PaddleNLP's run_pretrain weighs each 1.0: {equal}{more}. To train as PaddleNLP does, set input_dir to "
            f"\"{pairs}\"{' (1.0 before each prefix)' if n > 4 else ''}"]


def loss_masks(sources: list) -> list[str]:
    """A note naming the sources whose `.lsm` loss mask keeps tokens out of the loss here: PaddleNLP's
    run_pretrain reads the file but trains on every token, so the same directory trains differently unless said."""
    masked = [s["prefix"] + ".lsm" for s in sources if s["dataset"].loss_mask is not None]
    if not masked:
        return []
    one = len(masked) == 1
    names = first_few(masked)
    return [f"input_dir: {names}: {'a .lsm loss mask' if one else '.lsm loss masks'} beside the tokens: the tokens "
            f"whose byte is 0 are no target of the loss (PaddleNLP's run_pretrain ignores .lsm files and trains on "
            f"every token); move {'it' if one else 'them'} aside to train on every token"]


def _vocabulary_fix(src, tokenizer) -> str:
    """What to do about ids the model's vocabulary does not hold, by what the run knows of them. A tokenizer the run
    loaded fits the model (`open_tokenizer` refuses a larger one), so ids past the model's are past the tokenizer's
    too: the files were made with another tokenizer, and preprocess is the fix. Without one (none named, or refused
    as larger than the model, whose line names --vocab_size) the ids are most likely a larger tokenizer's: a new
    model takes a vocabulary that holds them; pretrained weights keep theirs, so the data must be the model's."""
    size = getattr(tokenizer, "vocab_size", None)
    if size is not None:
        return (f"these are not the ids of the run's tokenizer ({size} tokens): re-run preprocess with it "
                f"(tokenizer_name_or_path)")
    return (f"a new model holds them with --vocab_size {src.max_token_id() + 1} or more (the key vocab_size: the "
            f"size of the tokenizer that made them); pretrained weights keep their vocabulary: re-run preprocess "
            f"with the model's tokenizer")


def build_datasets(input_dir, split, max_seq_length: int, seed: int, sample_mode: str = "packed",
                   tokenizer=None, data_cache: str | None = None, need=("train", "valid", "test"),
                   vocab_size: int | None = None, document_mask: bool = False,
                   reset_position_ids: bool = True, split_text: str = "") -> DataSplits:
    """Open every source, check ids against vocab_size, split, sample and blend.

    `split`: the train/valid/test fractions a run resolved (`RunConfig.data.split`, with `split_text` as
    written), or the text of a command line's `--split` (`inspect-data`), parsed here once.

    `tokenizer` (a `pretrain_cli.data.tokenizer.Tokenizer` or a directory) is needed for sample_mode 'padded';
    a loaded one is also what every source's sidecar must name (`check_tokenizer`). `need` names the splits the
    run uses (or maps each to the samples the run reads from it: `split_datasets`); an empty one is an error.
    `data_cache`, if set, is where per-epoch index arrays are cached (atomic writes).
    `document_mask`: packed samples also carry `doc_start` (and `position_ids` with `reset_position_ids`).
    """
    if isinstance(split, str):
        split, split_text = parse_split(split), split
    need = need if isinstance(need, dict) else tuple(need)  # {name: samples read}: `split_datasets`'s
    unknown = [n for n in need if n not in SPLIT_NAMES]
    if unknown:
        raise ValueError(f"unknown split names {unknown}")
    special = None
    if sample_mode == "padded":
        if isinstance(tokenizer, str):
            from pretrain_cli.data.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        special = special_ids(tokenizer, getattr(tokenizer, "path", "tokenizer"))
    sources, opened = [], [(weight, open_token_file(prefix, key="input_dir"))
                           for weight, prefix in parse_input_dir(input_dir)]
    opened = [(float(src.num_tokens) if w is None else w, src) for w, src in opened]  # a directory's files: by size
    for weight, src in opened:
        if vocab_size is not None:
            check_token_ids(src, vocab_size, fix=_vocabulary_fix(src, tokenizer))
        splits = split_datasets(src, split, max_seq_length, seed, sample_mode, need, special, data_cache,
                                document_mask, reset_position_ids, split_text, opened)
        sources.append({"prefix": src.prefix, "weight": weight, "dataset": src, "splits": splits})
    check_tokenizer([s["prefix"] for s in sources], tokenizer)
    out = DataSplits(sources=sources)
    if "train" in need and sample_mode == "packed":  # (a padded sample ends in the tokenizer's EOS whatever the file)
        out.notes = missing_eos([s["prefix"] for s in sources])
    out.notes += directory_weights(input_dir, sources) + loss_masks(sources)
    for name in SPLIT_NAMES:
        present = [(s["weight"], s["splits"][name], s["prefix"]) for s in sources if s["splits"][name] is not None]
        if not present:
            continue
        if len(present) == 1:
            setattr(out, name, present[0][1])
        else:
            ws, dss, names = zip(*present)
            setattr(out, name, BlendedDataset(list(dss), list(ws), [source_name(p) for p in names]))
    return out
