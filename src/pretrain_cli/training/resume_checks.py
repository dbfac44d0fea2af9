"""What a resume must agree with its checkpoint in: the model's shape and the sequence length (`check_compatible`;
`mismatch`, the reason, is also what `plan --fit -o` says) and the tokenizer (`check_tokenizer`), refused before a
weight is read; and, allowed but said, the data (`data_changes`). `check` asks as `train` does; these judges read a
checkpoint's config.json, args.json, trainer_state.json and tokenizer files, never its tensors.
"""
from __future__ import annotations

import hashlib

from pretrain_cli.errors import UserError
from pretrain_cli.run_dir import ARGS_FILE
from pretrain_cli.storage.checkpoint_dir import CheckpointDir


def mismatch(ckpt, model_cfg, max_seq_length: int) -> str | None:
    """Why checkpoint `ckpt` (a `CheckpointDir`, or a path) is another model's or another sequence length's than
    the run's, or None when a resume may load it: what `check_compatible` refuses, and what `plan --fit -o` says
    when its fitted file starts over instead of resuming. Its config.json unreadable: the `UserError` saying so."""
    found = _mismatch(CheckpointDir.of(ckpt), model_cfg, max_seq_length)
    return found[0] if found else None


def _mismatch(ckpt: CheckpointDir, model_cfg, max_seq_length: int) -> tuple[str, str] | None:
    """(the reason, what a resume must keep the same: "model" or "max_seq_length"), or None."""
    from pretrain_cli.models.config import ModelConfig

    saved = ModelConfig.from_file(str(ckpt), pretrained=True)  # (it describes weights: read as they are)
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "tie_word_embeddings"):
        a, b = getattr(saved, key), getattr(model_cfg, key)
        if a != b:
            return f"checkpoint has {key}={a} but this run's model has {key}={b}", "model"
    saved_len = ((ckpt.args or {}).get("arguments") or {}).get("max_seq_length")
    if saved_len is not None and saved_len != max_seq_length:
        return (f"checkpoint was trained with max_seq_length={saved_len}, this run asks for {max_seq_length}",
                "max_seq_length")
    return None


def check_compatible(ckpt, model_cfg, max_seq_length: int, named: bool = False) -> None:
    """Refuse a resume whose model shape or sequence length differs from the checkpoint's (`mismatch`). `named`:
    the checkpoint is `resume_from_checkpoint`'s, which overwrite_output_dir does not drop (the fix is another
    checkpoint, or no resume_from_checkpoint)."""
    ckpt = CheckpointDir.of(ckpt)
    found = _mismatch(ckpt, model_cfg, max_seq_length)
    if found is None:
        return
    reason, same = found
    fix = ("resume_from_checkpoint another checkpoint of this model, or drop resume_from_checkpoint to start over"
           if named else "set overwrite_output_dir: true to start over")
    raise UserError(f"{ckpt}: {reason}; resume with the same {same}, or {fix}")


def check_tokenizer(ckpt, tokenizer, prefixes=(), args=None) -> None:
    """Refuse a resume with another tokenizer than the checkpoint's (the copy of its tokenizer files the run wrote
    into it), compared by fingerprint as train-tokenizer and inspect-data print it, and where those differ by the
    ids the two give (`tokenizer_lineage.same_ids`, the rule token files' sidecars are judged by too, so the data a
    resume in the other form reads passes where its sidecar records its ids' fingerprint): the embedding rows
    trained are that tokenizer's ids, which another's mean other tokens (a same-sized one passes every shape check).
    A run without a tokenizer has the sidecars of its token files (`prefixes`) compared with it instead. A
    checkpoint without tokenizer files (its run had no tokenizer) is judged by the tokenizer its args.json records
    (`tokenizer_lineage.check_recorded`); one that records none cannot be, which `data_changes` says. A new
    lineage on purpose starts from an export (continue_training). `args`: the run's arguments, whose key that
    supplied the tokenizer the refusal names (tokenizer_name_or_path, else model_name_or_path)."""
    from pretrain_cli.data import check_tokenizer as check_files
    from pretrain_cli.data.tokenizer import load_tokenizer
    from pretrain_cli.training.tokenizer_lineage import check_recorded, new_lineage, refusal_key, same_tokenizer

    ckpt = CheckpointDir.of(ckpt)
    if tokenizer is None and not prefixes:
        return
    if not (ckpt.path / "tokenizer.json").is_file():
        check_recorded(ckpt, tokenizer, prefixes, args)
        return
    if tokenizer is not None and hashlib.sha256((ckpt.path / "tokenizer.json").read_bytes()).hexdigest() == \
            tokenizer.sha256:  # the run's own file copied (a save copies it byte for byte): not parsed again
        return
    saved = load_tokenizer(ckpt.path)
    recorded = (ckpt.args or {}).get("arguments") or {}  # (a checkpoint's own run took it from either key too)
    was = recorded.get("tokenizer_name_or_path") or recorded.get("model_name_or_path")
    with_it = f"{was}, fingerprint {saved.fingerprint[:12]}" if was else f"fingerprint {saved.fingerprint[:12]}"
    if tokenizer is None:
        check_files(list(prefixes), saved, where="input_dir: ", instead=f"resume with data made with {ckpt.name}'s "
                                                                         f"tokenizer ({with_it}), {new_lineage(ckpt)}")
    elif not same_tokenizer(saved, tokenizer):
        raise UserError(f"{refusal_key(args)}: {tokenizer.path} (fingerprint {tokenizer.fingerprint[:12]}) is not the "
                        f"tokenizer {ckpt} was trained with ({with_it}): its token ids would mean other tokens; "
                        f"resume with that tokenizer, {new_lineage(ckpt)}")


def data_changes(ckpt, run) -> list[str]:
    """What a resume's data differs in from the checkpoint's run (its args.json): allowed (a new mix halfway is a
    choice), but said, since the data position (`consumed_samples`) then counts into other samples. And, first,
    that the tokenizer could not be checked (`check_tokenizer`), where the checkpoint holds no tokenizer files and its
    args.json records no tokenizer (`tokenizer_lineage.recorded`): train and check say these lines as it resumes."""
    from pretrain_cli.training.tokenizer_lineage import recorded

    ckpt = CheckpointDir.of(ckpt)
    lines = []
    if not (ckpt.path / "tokenizer.json").is_file() and recorded(ckpt) is None:
        lines.append(f"resuming from {ckpt.path.name}, which holds no tokenizer files and whose {ARGS_FILE} records "
                     f"no tokenizer (its run had none and its token files' sidecars named none, or it was written "
                     f"before the record): whether this run's tokenizer (or its token files') is the one its weights "
                     f"were trained with could not be checked")
    for keys, now in ((("data", "input_dir"), run.data.input_dir), (("data", "split"), list(run.data.split)),
                      (("loop", "seed"), run.loop.seed)):
        was = ckpt.run(*keys)
        if was is not None and was != now:
            lines.append(f"resuming with {keys[-1]} {now!r}, where {ckpt.path.name} was trained with {was!r}: "
                         f"its {ckpt.state.get('consumed_samples', 0)} consumed samples now index other samples")
    return lines
