"""Which final model a run directory holds: the files a final export writes (`final_files`), the step it was
written at (`final_step`, `final_model`, `whole_final`), the weights the directory held before a run of ours first
wrote there (`weights_before_the_run`: never taken for the run's model), and an earlier run's export that a run
starting over removes (`earlier_final`, `remove_final`). `eval`, `generate`, `export`, `check` and the closing
lines ask it what `output_dir` holds; `training.export` writes what it reads.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from pretrain_cli import run_dir
from pretrain_cli.data.tokenizer import TOKENIZER_FILES
from pretrain_cli.models.model_files import hf_weight_names


FINAL_FILES = (run_dir.STATE_FILE, "train_results.json", "all_results.json", "loss_curve.png", "config.json",
               "generation_config.json", *TOKENIZER_FILES)  # what `write_final` writes beside the weights and args.json


def final_files(out) -> list[Path]:
    """The files of a final export in run directory `out` (`write_final`'s: the weights, single or transformers'
    shards and their index, and `FINAL_FILES`; not args.json, which every training run rewrites at its start,
    nor anything else the directory holds)."""
    from pretrain_cli.models.model_files import INDEX_FILE, SINGLE_FILE

    out = Path(out)
    shards = sorted(p for p in out.glob("model-*-of-*.safetensors") if re.fullmatch(r"model-\d+-of-\d+\.safetensors",
                                                                                     p.name))
    return [*shards, *(out / n for n in (SINGLE_FILE, INDEX_FILE, *FINAL_FILES) if (out / n).is_file())]


def leftover_weights(out, written, earlier) -> list[str]:
    """Lines for the weights the final export into `out` found beside its own (`written`, and their index; `earlier`:
    the files under transformers' names, `model_files.HF_WEIGHTS`, that `out` held before it): those under
    transformers' names are an earlier model's, which `convert.write_hf_dir` removed (loaders read them in place of
    this run's model, or beside it: use_safetensors=False the PyTorch files, our loader an old index's shards);
    one line names those that went. Weights under other names (consolidated.safetensors, model_ema.safetensors, a
    .gguf, a .pdparams: `foreign_weights.weight_files`) are no HF directory's model and not ours to remove; one
    line names them, as neither from_pretrained nor `eval --model` reads them there."""
    from pretrain_cli.models.model_files import INDEX_FILE
    from pretrain_cli.models.foreign_weights import weight_files

    out, lines = Path(out), []
    removed = sorted(n for n in earlier if not (out / n).exists())  # (one still there was written anew)
    if removed:
        lines.append(f"final export: removed {', '.join(removed)} from {out}: an earlier model's weights under "
                     f"transformers' names, which loaders would read in place of this run's")
    read, unread = weight_files(out)
    left = [n for n in read + unread if n not in written and n != INDEX_FILE]
    if left:
        lines.append(f"final export: {out} also holds {', '.join(left)}: weights under names no export of ours "
                     f"writes, left as they are (from_pretrained and eval --model read this run's, not them); "
                     f"remove them if nothing needs them")
    return lines


# args.json's record of the weights output_dir held before a run of ours first wrote there (`weights_before_the_run`)
BEFORE_RUN = "weights_before_the_run"


def weights_before_the_run(out) -> list[dict]:
    """What args.json records under `BEFORE_RUN` as a training run starts in `out` (name, size, mtime_ns of each
    file): the weight files there when no run of ours has recorded itself there (no args.json of ours: a downloaded
    model under overwrite_output_dir), else the earlier record's files that are unchanged. They are no model of
    the run's (`final_step`), whatever else the directory holds: an HF Trainer's snapshot ships its own
    trainer_state.json and all_results.json, so those could not tell."""
    from pretrain_cli.models.foreign_weights import weight_files

    out = Path(out)
    kept = _recorded(out)
    if kept is None:
        read, unread = weight_files(out)
        return [_stat(out / n) for n in read + unread]
    return [e for e in kept if _unchanged(out, e)]


def before_the_run(out) -> list[str]:
    """The names of the weight files in `out` that args.json records as there before its run (`BEFORE_RUN`), and
    that are unchanged: a model the run did not train."""
    return [e["name"] for e in _recorded(out) or [] if _unchanged(out, e)]


def _recorded(out: Path) -> list | None:
    """args.json's `BEFORE_RUN` entries ([] without the key), or None when `out` holds no args.json of ours."""
    try:
        args = json.loads((out / run_dir.ARGS_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not run_dir.is_record(args):
        return None
    entries = args.get(BEFORE_RUN)
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _stat(path: Path) -> dict:
    st = path.stat()
    return {"name": path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _unchanged(out: Path, entry: dict) -> bool:
    """Whether the file `entry` records is in `out` as recorded (the same size and modification time)."""
    name = entry.get("name")
    if not isinstance(name, str) or Path(name).name != name:  # (a file of this directory, by its name alone)
        return False
    try:
        return _stat(out / name) == {"name": name, "size": entry.get("size"), "mtime_ns": entry.get("mtime_ns")}
    except OSError:
        return False


def final_step(out) -> tuple[bool, int | None]:
    """(whether run directory `out` holds a final model, the step it was exported at): `final_model`'s first two."""
    return final_model(out)[:2]


def final_model(out) -> tuple[bool, int | None, str | None]:
    """(whether run directory `out` holds a final model, the step it was exported at, why that step is unknown): a
    final model is safetensors weights under transformers' names (`model_files.HF_WEIGHTS`: what an export of ours
    writes), whole or what an export stopped part way left (`whole_final` tells), but for those args.json records
    as there before the run (`before_the_run`: a download the run has not replaced yet); weights under other names
    are no model (`model_files.find_weights` refuses them). Its step is the trainer state the export wrote after its
    weights, None where that is missing, unreadable or older than them (an export killed before it: what is there
    is a download's own, or an earlier export's; or a copy that kept no modification times: scp -r, rsync without
    -t), with that reason, for a line naming the model to say (`closing.stopped`). `eval`, `generate`
    (`orchestration.recorded`), `export`, `continue_training`, `closing.stopped` and `remove_final` all ask here,
    so they agree on what is there."""
    out = Path(out)
    weights = set(n for n in hf_weight_names(out) if n.endswith(".safetensors")) if out.is_dir() else set()
    weights -= set(before_the_run(out))
    if not weights:
        return False, None, None
    state = out / run_dir.STATE_FILE
    try:
        step = int(json.loads(state.read_text(encoding="utf-8"))["global_step"])
    except FileNotFoundError:
        return True, None, f"no {run_dir.STATE_FILE}"
    except (OSError, ValueError, KeyError, TypeError):
        return True, None, f"no readable {run_dir.STATE_FILE}"
    try:
        older = state.stat().st_mtime_ns < max((out / n).stat().st_mtime_ns for n in weights)
    except OSError:
        return True, None, f"no readable {run_dir.STATE_FILE}"
    if older:  # (the export writes it after the weights)
        return True, None, (f"its {run_dir.STATE_FILE}, of step {step}, is older than its weights: a download's "
                            f"own or an earlier export's, or a copy that kept no modification times")
    return True, step, None


def whole_final(out) -> bool:
    """Whether run directory `out` holds its final model whole (`final_step`): config.json, which the export writes
    after the weights, and every file `model_files.find_weights` reads the model from. What an export stopped part way
    left is no model to evaluate, sample, export or continue from: those take the newest checkpoint."""
    from pretrain_cli.errors import UserError
    from pretrain_cli.models.model_files import find_weights

    if not final_step(out)[0] or not (Path(out) / "config.json").is_file():
        return False
    try:
        return all(Path(f).is_file() for f in find_weights(out))
    except UserError:
        return False


def unfinished_run(src, key: str, then: str) -> None:
    """Refuse `src` where a run's output_dir (its args.json, a checkpoint-N) holds no whole final model
    (`whole_final`), in one line naming its newest complete checkpoint, which `eval --model src` reads: what else
    it holds is the model it held before the run (`before_the_run`: a download) or part of a stopped export, not
    what the run trained. `key` names the argument; `then`, what to do with the checkpoint. A run reading its own
    output_dir (resuming there) is not asked."""
    from pretrain_cli.errors import UserError
    from pretrain_cli.storage.checkpoint_dir import CheckpointDir

    src = Path(src)
    latest = run_dir.latest_checkpoint(src) if src.is_dir() else None
    if latest is None or CheckpointDir(src).record is None or whole_final(src):
        return
    from pretrain_cli.storage.intact import newest_complete

    try:  # what `recorded.trained_model` takes: the one a resume takes
        newest = newest_complete(src)[0] or latest
    except UserError:  # (a checkpoint PaddleNLP's Trainer wrote)
        newest = latest
    before = before_the_run(src)
    held = ""
    if before:
        held = (f"; {', '.join(before)} there {'is' if len(before) == 1 else 'are'} the model {src} held before the "
                f"run, not trained by it")
    elif final_step(src)[0]:
        held = "; the weights there are what an export stopped part way left"
    raise UserError(f"{key}{src} holds no final model of its run yet (still training, or stopped before its export"
                    f"{held}); {then} its newest{'' if newest == latest else ' complete'} checkpoint, {newest}, "
                    f"which eval --model {src} reads")


def earlier_final(out) -> tuple[list[Path], int | None]:
    """(the files of the final model `remove_final` removes from `out`, [] where it removes none; its step): what
    `check` names before a run starting over there removes them."""
    has, step = final_step(out)
    files = final_files(out)
    if not has or all(f.name in FINAL_FILES for f in files):  # no weights an export of ours wrote
        return [], step
    return files, step


def remove_final(out) -> str | None:
    """An earlier run's final export in `out`, removed by a run that starts over there (`overwrite_output_dir`):
    left in place, until this run writes its own, `eval` and `generate` on `out` (and transformers) took it for
    this run's model, beside this run's checkpoints. Only our export's weights make one: weights under other names
    (a consolidated.safetensors) are no export of ours, and are left, as is a model args.json records as there
    before the run (`final_step`: a download; the final export replaces it). Returns the line saying what went, or
    None."""
    files, step = earlier_final(out)
    if not files:
        return None
    for f in files:
        f.unlink(missing_ok=True)
    return (f"overwrite_output_dir: removed the final model{'' if step is None else f' of step {step}'} an earlier "
            f"run exported to {out} ({', '.join(f.name for f in files)}): this run writes its own at its end")
