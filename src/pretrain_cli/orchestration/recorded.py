"""The run a model directory records: `eval` and `generate` on an output directory or a `checkpoint-N`
take the settings of the run that wrote it (its `args.json`), with the same `--key value` overrides
`train` takes, and say where what they do differs from that run."""
from __future__ import annotations

from pathlib import Path

from pretrain_cli.config.parser import Arguments, parse_config
from pretrain_cli.errors import UserError
from pretrain_cli.storage.checkpoint_dir import CheckpointDir


def record_path(model_dir) -> Path | None:
    """`model_dir/args.json` when a run of ours wrote it, else None (an HF directory, a preset)."""
    return CheckpointDir.of(model_dir).record


def run_arguments(config: str | None, model_dir, overrides: list[str], command: str) -> Arguments | None:
    """The arguments `command` runs with: `--config`'s file, else the record of the run that wrote
    `model_dir`, each with `overrides`; None when there is neither (then no override may be given)."""
    record = record_path(model_dir) if config is None and model_dir is not None else None
    source = config or (str(record) if record is not None else None)
    if source is None:
        if overrides:
            raise UserError(f"{command}: {' '.join(overrides)}: --key value overrides change a run's settings; "
                            f"pass --config FILE, or a --model directory a run wrote (it holds args.json)")
        return None
    return parse_config(source, overrides)


def differences(model_dir, max_seq_length: int, attention_mask_type: str, reset_position_ids) -> list[str]:
    """Notes where an evaluation's windows differ from those of the run that trained `model_dir` (its
    args.json); none for a directory no run of ours wrote."""
    path = record_path(model_dir) if model_dir is not None else None
    if path is None:
        return []
    trained = parse_config(str(path)).data
    notes = []
    if max_seq_length != trained.max_seq_length:
        notes.append(f"note: {max_seq_length}-token windows; the model was trained on {trained.max_seq_length}-token "
                     f"ones ({path})")
    if attention_mask_type != trained.attention_mask_type:
        notes.append(f"note: attention_mask_type {attention_mask_type}; the model was trained with "
                     f"{trained.attention_mask_type} ({path})")
    elif attention_mask_type == "document" and (reset_position_ids is not False) != \
            (trained.reset_position_ids is not False):
        notes.append(f"note: reset_position_ids {reset_position_ids is not False}; the model was trained with "
                     f"{trained.reset_position_ids is not False} ({path})")
    return notes
