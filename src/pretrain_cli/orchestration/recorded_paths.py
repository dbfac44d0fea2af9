"""The paths a run's record (its args.json) names, as `eval` reads them from another directory than the run's.

The record keeps each path as the run was given it: `./configs/deepseek-v3-tiny` was read from the directory the run
was started in (`working_directory`, recorded since). `eval` of a run's final model or checkpoint takes the model (and
its tokenizer) from the directory it evaluates, as `generate` and `export` do, so the recorded model path is never
needed; the token files of the run's split are, and a relative one not found from here is one line naming args.json,
the directory it was relative to and the fix, before anything else is opened.
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


def check_input_dir(config: str, record: dict, overrides: list[str]) -> None:
    """A relative `input_dir` of the record not found from here: one line naming `config`, the directory the path
    was relative to (the recorded `working_directory`, else where it is found beside the record), and the fix;
    without the check, `input_dir: ./demo/data: no token files` blamed the data. `--input_dir` among the overrides
    replaces it and is judged as typed."""
    from pretrain_cli.config.parser import override_keys

    if any(ours == "input_dir" for _, ours in override_keys(overrides)):
        return
    value = record["arguments"].get("input_dir")
    paths = [p for p in (value.split() if isinstance(value, str) else []) if not _number(p)]  # (a blend's weights)
    here = Path.cwd()
    missing = [p for p in paths if not Path(p).is_absolute() and not _present(here / p)]
    if not missing:
        return
    recorded = record.get("working_directory")
    tried = [Path(recorded)] if isinstance(recorded, str) else []
    tried += [d for d in (Path(config).resolve().parent, *Path(config).resolve().parents[:3]) if d not in tried]
    found = next((d for d in tried if all(_present(d / p) for p in missing)), None)
    started = recorded if isinstance(recorded, str) else "which this record does not name"
    if found is None:
        fix = "pass --input_dir with the token files' path (an absolute one), or --data PREFIX"
    else:
        fix = (f"{'it is there' if str(found) == recorded else f'it is found from {found}'}: run eval from there"
               + (f", or pass --input_dir {found / missing[0]}" if len(paths) == 1 else ""))
    raise UserError(f"{config}: input_dir {' '.join(missing)} is relative to the directory its run was started in "
                    f"({started}) and is not found from here ({here}); {fix}")


def _number(token: str) -> bool:
    return re.fullmatch(r"[0-9.eE+-]+", token) is not None


def _present(path: Path) -> bool:
    """A directory or file, or a token-file prefix (`data/c` for data/c.bin/.idx)."""
    return path.exists() or path.with_name(path.name + ".idx").exists()
