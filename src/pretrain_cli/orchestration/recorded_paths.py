"""The paths a run's record (its args.json) names, as `eval` reads them from another directory than the run's.

The record keeps each path as the run was given it: `./configs/deepseek-v3-tiny` was read from the directory the run
was started in (`working_directory`, recorded since). `eval` of a run's final model or checkpoint takes the model (and
its tokenizer) from the directory it evaluates, as `generate` and `export` do, so the recorded model path is never
needed; the token files of the run's split are, and a relative one is read from where the run was started (a path of
the same name here may hold other text), or refused in one line naming args.json, both directories and the fix,
before anything else is opened.
"""
from __future__ import annotations

import re
from pathlib import Path

from pretrain_cli.errors import UserError
from pretrain_cli.run_dir import ARGS_FILE, CHECKPOINT, is_record
from pretrain_cli.storage.checkpoint_dir import CheckpointDir


def record_of(config: str | None) -> dict | None:
    """The record `config` is (a run's args.json: `arguments` and `run`), else None (a user's argument file)."""
    if config is None or Path(config).name != ARGS_FILE:
        return None
    args = CheckpointDir(Path(config).parent).args
    return args if is_record(args) else None


def run_output(config: str) -> Path:
    """The output_dir of the run whose record `config` is: where the file lies (its checkpoint-N's parent), which is
    the recorded output_dir as seen from here, wherever the run was started (a relative output_dir is not)."""
    where = Path(config).parent
    return where.parent if CHECKPOINT.match(where.name) else where


def same_run(config: str, model_dir) -> bool:
    """Whether `model_dir` was written by the run whose record `config` is: its output_dir or one of its
    checkpoints (a model of another run keeps the check that it is the model `config` trains)."""
    return Path(model_dir).resolve() == run_output(config).resolve() or \
        Path(model_dir).resolve().parent == run_output(config).resolve()


def evaluated_model(model_dir) -> dict:
    """The `prepare` changes that take the architecture (and the tokenizer, where the directory carries its files)
    from the run's directory evaluated, whose config.json is the model the run trained (with its overrides:
    num_hidden_layers, vocab_size), instead of the path the run named it by."""
    from pretrain_cli.config.presets import has_tokenizer

    changes = {"model_name_or_path": str(model_dir)}
    if has_tokenizer(Path(model_dir)):  # the run's tokenizer, saved beside its weights
        changes["tokenizer_name_or_path"] = str(model_dir)
    return changes


def input_dir_of(config: str, record: dict, overrides: list[str]) -> tuple[dict, str | None]:
    """The record's `input_dir` as its run read it: a relative path means the directory the run was started in (the
    recorded `working_directory`), not the one eval runs in, where a `./data/tiny` may hold other text and be read
    without a word. Returns the `prepare` change that reads it from there (absolute) and a note when that is not
    here; a path found only here, or here and there with other files, is one line naming both; found nowhere, one
    line naming `config`, the directory it was relative to and the fix. A record without `working_directory`
    (written before it) reads it from here, else beside the record. `--input_dir` among the overrides replaces it and
    is judged as typed."""
    from pretrain_cli.config.parser import override_keys

    if any(ours == "input_dir" for _, ours in override_keys(overrides)):
        return {}, None
    value = record["arguments"].get("input_dir")
    tokens = value.split() if isinstance(value, str) else []
    paths = [p for p in tokens if not _number(p) and not Path(p).is_absolute()]  # (a blend's weights are numbers)
    here, recorded = Path.cwd(), record.get("working_directory")
    if not paths:
        return {}, None
    if not isinstance(recorded, str):
        _refuse_missing(config, [p for p in paths if not _present(here / p)], None, len(tokens) == 1)
        return {}, None
    started = Path(recorded)
    if started.resolve() == here.resolve():
        _refuse_missing(config, [p for p in paths if not _present(here / p)], started, len(tokens) == 1)
        return {}, None
    for p in paths:
        there, ours = _present(started / p), _present(here / p)
        if ours and not there:
            raise UserError(f"{config}: input_dir {p} is relative to the directory its run was started in ({started}), "
                            f"where it no longer exists; {here / p} (from here) may hold other text: pass "
                            f"--input_dir {here / p} to evaluate on it, or --input_dir with the run's token files")
        if ours and there and not _same_files(started / p, here / p):
            raise UserError(f"{config}: input_dir {p} is relative to the directory its run was started in ({started}), "
                            f"and {started / p} there and {here / p} here hold different files; pass --input_dir "
                            f"with the one to evaluate on ({started / p} is the run's)")
    _refuse_missing(config, [p for p in paths if not _present(started / p)], started, len(tokens) == 1)
    absolute = " ".join(str(started / t) if t in paths else t for t in tokens)
    return {"input_dir": absolute}, (f"note: {config}: input_dir {' '.join(paths)} read from {started}, the directory "
                                     f"its run was started in (relative paths of args.json mean that directory)")


def _refuse_missing(config: str, missing: list[str], started: Path | None, single: bool) -> None:
    """Token files found neither where the run was started nor here: one line, with the directory beside the record
    they are found from, if one is (a run's output_dir inside the directory it was started in)."""
    if not missing:
        return
    here = Path.cwd()
    tried = [d for d in (Path(config).resolve().parent, *Path(config).resolve().parents[:3])]
    found = next((d for d in tried if all(_present(d / p) for p in missing)), None)
    where = str(started) if started is not None else "which this record does not name"
    elsewhere = started is not None and started.resolve() != here.resolve()
    if found is None:
        fix = "pass --input_dir with the token files' path (an absolute one), or --data PREFIX"
    else:
        fix = f"it is found from {found}: run eval from there" + (
            f", or pass --input_dir {found / missing[0]}" if single else "")
    raise UserError(f"{config}: input_dir {' '.join(missing)} is relative to the directory its run was started in "
                    f"({where}) and is not found {'there or ' if elsewhere else ''}from here ({here}); "
                    f"{fix}")


def _same_files(a: Path, b: Path) -> bool:
    """Whether two token-file paths hold the same data: the same token files by name and size (`_token_files`:
    what the run reads, so a README or a tokenizer's files beside them are no difference), equal `.idx` files (the
    documents' lengths), equal first and last MiB of each `.bin` (reading whole corpora twice to compare them would
    cost more than the evaluation), and equal `.json` sidecars where both have one (one copied without its sidecar
    holds the same tokens)."""
    if a.resolve() == b.resolve():
        return True
    files_a, files_b = dict(_token_files(a)), dict(_token_files(b))
    sidecars = [n for n in files_a if n.endswith(".json") and n in files_b]
    data_a, data_b = ([(n, f.stat().st_size) for n, f in sorted(files.items()) if not n.endswith(".json")]
                      for files in (files_a, files_b))
    return data_a == data_b and all(_sample(files_a[n]) == _sample(files_b[n])
                                    for n in [n for n, _ in data_a] + sidecars)


# what the run reads of a token-file prefix: its pair (or the legacy pair), its loss mask and its `.json` sidecar
TOKEN_SUFFIXES = (".bin", ".idx", "_ids.npy", "_idx.npz", ".lsm", ".json")


def _token_files(path: Path) -> list[tuple[str, Path]]:
    """(name, file) of the token files a recorded input_dir `path` reads: a directory's every prefix
    (`data.indexed.token_prefixes`, as `data.blend` takes a directory), else the prefix's own."""
    from pretrain_cli.data.indexed import token_prefixes

    prefixes = [Path(p) for p in token_prefixes(path)] if path.is_dir() else [path]
    found = (q.with_name(q.name + s) for q in prefixes for s in TOKEN_SUFFIXES)
    return [(f.name, f) for f in found if f.is_file()]


def _sample(path: Path, size: int = 1 << 20) -> bytes:
    with open(path, "rb") as f:
        if path.suffix == ".idx" or path.stat().st_size <= 2 * size:
            return f.read()
        head = f.read(size)
        f.seek(-size, 2)
        return head + f.read()


def _number(token: str) -> bool:
    return re.fullmatch(r"[0-9.eE+-]+", token) is not None


def _present(path: Path) -> bool:
    """A directory or file, or a token-file prefix (`data/c` for data/c.bin/.idx)."""
    return path.exists() or path.with_name(path.name + ".idx").exists()
