"""Whether a checkpoint directory is complete and undamaged, and if not, why: decided here and nowhere else.

A directory named `checkpoint-N` is complete when it is published (`atomic.publish_dir`), but files can be
lost or damaged afterwards (a disk error, a user, a copy cut short). `problem()` checks what a resume reads:

- `trainer_state.json`: present, a JSON object with an integer `global_step` and `consumed_samples`, and fp16's
  `loss_scaler` loadable where there is one (`checkpoint_dir.judge_loss_scaler`, asked again where a rollback reads
  it; not by `export_problem`: an export reads the weights alone);
- `config.json`: present and a JSON object, as every other JSON file it holds (`args.json`, transformers'
  `model.safetensors.index.json`, the tokenizer's files);
- `checkpoint.index.json`: present and readable whenever the directory holds per-rank files
  (`model-0000k-of-0000n.safetensors`), no `optimizer.safetensors` of a checkpoint from before the index, or
  files whose headers record their pieces (one process's, written with an index);
- every file the index lists: present, of the listed size, its own record of the pieces it holds (its
  safetensors header: `checkpoint_index.against_file`) agreeing with the index and, with `checksums`, the listed
  crc32 (`damage`); a checkpoint from before the index: every safetensors header readable and its data present.

Auto-resume (`newest`) takes the newest checkpoint without a problem, skipping each damaged one with one
warning line; a checkpoint named by `resume_from_checkpoint` is checked the same way and refused with one
line when damaged (orchestration.prepare). A checkpoint PaddleNLP's Trainer wrote is no damage: either way it is
one line of its own (`paddlenlp_checkpoint`), no other checkpoint tried. `damage(ckpt, files=...)` checks a
subset of the files: a rank that reads only some of them can verify just those, and an export only the weights'
(`export_problem`). A checkpoint that lost its index is no resume's, but `weights_without_index` says whether its
weights are still whole for the commands that read them alone (`eval`, `generate`, `export`, `continue_training`).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from pretrain_cli.errors import UserError
from pretrain_cli.run_dir import ARGS_FILE, OPTIMIZER_FILE, STATE_FILE, list_checkpoints
from pretrain_cli.storage import checkpoint_index
from pretrain_cli.storage.checkpoint_dir import CheckpointDir
from pretrain_cli.storage.shard_files import File, Problem, checksum

CONFIG_FILE = "config.json"
LOST_INDEX = "lost index"  # a `Problem`'s kind: checkpoint.index.json gone (`weights_without_index` may read it)
HF_INDEX = "model.safetensors.index.json"  # transformers' shard index (models.model_files.INDEX_FILE)


def _json_object(path: Path, required: bool) -> Problem | None:
    if not path.is_file():
        return Problem(f"{path} is missing", "incomplete") if required else None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return Problem(f"{path} is unreadable ({e})")
    return None if isinstance(obj, dict) else Problem(f"{path} is not a JSON object")


def _said(e: UserError) -> Problem:
    """The problem a reader's line names (its part before the advice): a `File`'s says its state; any other line is
    of a file there but unreadable."""
    return getattr(e, "problem", None) or Problem(str(e).split("; ")[0])


def _not_a_directory(path) -> Problem:
    """A path that is no directory: one that is not there said so (a mistyped checkpoint-N read "is not a
    directory", as if something else stood in its place)."""
    return Problem(f"{path} is not a directory") if os.path.lexists(path) else Problem(f"{path} does not exist",
                                                                                          "incomplete")


def problem(ckpt, checksums: bool = True, files=None, resume: bool = True) -> Problem | None:
    """Why checkpoint `ckpt` (a path or a `CheckpointDir`, whose state and index are then read once for all who
    ask it) cannot be resumed from (one line naming the file, and its `state`: incomplete or damaged), or None when
    it is complete; `files`: only those of the index's files (`damage`); `resume` False: its fp16 loss scale not
    judged (what `export_problem` asks: an export never loads it)."""
    meta = CheckpointDir.of(ckpt)
    ckpt = meta.path
    if not ckpt.is_dir():
        return _not_a_directory(ckpt)
    try:
        meta.resume_state if resume else meta.state
    except UserError as e:  # no trainer state at all: a save or copy that did not finish
        return Problem(str(e).split("; ")[0], "damaged" if (ckpt / STATE_FILE).is_file() else "incomplete")
    reason = _json_object(ckpt / CONFIG_FILE, True)
    others = sorted(p for p in ckpt.glob("*.json") if p.name not in (STATE_FILE, CONFIG_FILE, checkpoint_index.INDEX))
    for path in others:  # args.json, transformers' weight index, tokenizer files: each a JSON object
        reason = reason or _json_object(path, True)
    return reason or damage(meta, checksums, files)


def damage(ckpt, checksums: bool = True, files=None) -> Problem | None:
    """Why the weight and optimizer files of `ckpt` (a path or a `CheckpointDir`; only `files`, names as the index
    lists them, when given) cannot be read back: missing, truncated or altered; or None. Sizes come from the
    directory listing; `checksums` also re-reads every file (crc32, streamed)."""
    meta = CheckpointDir.of(ckpt)
    ckpt = meta.path
    try:
        index = meta.index
    except checkpoint_index.UnknownVersion:
        raise  # not damage: an older checkpoint is no substitute for one this code cannot read
    except UserError as e:
        return _said(e)
    if index is None:
        return _unindexed(ckpt)
    listed, wanted = index["files"], None if files is None else set(files)
    names = [n for n in listed if wanted is None or n in wanted]
    for name in names:
        path = ckpt / name
        try:
            size = os.path.getsize(path)
        except OSError:
            return Problem(f"{path} is missing", "incomplete")
        if size != listed[name]["bytes"]:  # shorter: cut short
            return Problem(f"{path} has {size} bytes, the index says {listed[name]['bytes']}",
                           "incomplete" if size < listed[name]["bytes"] else "damaged")
    if checksums:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(8, max(len(names), 1))) as pool:  # zlib and reads release the GIL
            sums = list(pool.map(lambda n: checksum(ckpt / n)["crc32"], names))
        for name, got in zip(names, sums):
            if got != listed[name]["crc32"]:
                return Problem(f"{ckpt / name} does not match its checksum")
    for name in names:  # what each file says it holds against the index: the headers only, a few KiB per file
        try:
            f = File(ckpt / name)
        except UserError as e:
            return _said(e)
        reason = checkpoint_index.against_file(index, name, f.tensors, f.metadata)
        if reason is not None:
            return Problem(f"{ckpt / checkpoint_index.INDEX} and {ckpt / name} disagree: {reason}")
    return None


def export_problem(path) -> Problem | None:
    """Why `path` cannot be exported (`pretrain-cli export`), or None: a `checkpoint-N` (it holds optimizer state
    or an index) must pass `problem`; the final directory, or any HF directory, needs a readable `config.json`,
    every shard its `model.safetensors.index.json` lists, and every safetensors header and data present; so does a
    checkpoint whose index is lost but whose weights are whole (`weights_without_index`). `path`: a directory or its
    `CheckpointDir`."""
    meta = CheckpointDir.of(path)
    path = meta.path
    if not path.is_dir():
        return _not_a_directory(path)
    if (path / checkpoint_index.INDEX).is_file() or any(path.glob("optimizer*.safetensors")):
        if weights_without_index(meta) is not None:  # its index lost, its weights whole: read as eval reads them
            return _json_object(path / CONFIG_FILE, True)
        return problem(meta, files=_weight_files(meta), resume=False)
    reason = _json_object(path / CONFIG_FILE, True) or _json_object(path / HF_INDEX, False)
    if reason is None and (path / HF_INDEX).is_file():
        listed = json.loads((path / HF_INDEX).read_text(encoding="utf-8")).get("weight_map")
        files = set(listed.values()) if isinstance(listed, dict) and all(isinstance(f, str) for f in listed.values()) \
            else set()  # (any other weight_map: `models.model_files.find_weights` says what is wrong with it)
        missing = sorted(files - {p.name for p in path.iterdir()})
        reason = Problem(f"{path / missing[0]} is missing", "incomplete") if missing else None
    weights = sorted(path.glob("*.safetensors"))
    return (reason or (None if weights else Problem(f"{path} holds no safetensors weights", "incomplete"))
            or _headers(weights))


def _weight_files(meta: CheckpointDir) -> list[str] | None:
    """The files of a checkpoint's index that hold weights: what an export reads (a damaged optimizer state does
    not stop it). None without a readable index: `problem` then judges the whole directory."""
    try:
        index = meta.index
    except UserError:
        return None
    return None if index is None else [n for n in index["files"] if not n.startswith("optimizer")]


def _unindexed(ckpt: Path) -> Problem | None:
    """A checkpoint without `checkpoint.index.json`: one from before the index (whole `optimizer.safetensors`,
    headers and data sizes checked), or one whose index is gone. One process writes the same two file names, so
    its files' own record of their pieces (`pretrain_cli.pieces`, which the older files lack) tells it apart:
    without its index it would have no checksum left to check."""
    shards = sorted(ckpt.glob("*-of-*.safetensors"))
    missing = Problem(f"{ckpt / checkpoint_index.INDEX} is missing", "incomplete", LOST_INDEX)
    if not (ckpt / OPTIMIZER_FILE).is_file() or any(p.name.startswith("optimizer") for p in shards):
        return missing
    return _headers(sorted(ckpt.glob("*.safetensors")), indexed_format=missing)


_MODEL_FILE = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors")  # a rank's weights (`checkpoint_index.file_name`)


def weights_without_index(ckpt) -> list[Path] | None:
    """The files checkpoint `ckpt` (a path or a `CheckpointDir`), its checkpoint.index.json gone, still holds its
    weights whole in, or None: what every reader of the weights alone takes (`eval`, `generate`, `export`,
    `continue_training`: `models.model_files.find_weights`), where the index placed pieces only it could put
    together. Whole means: the trainer state there (written last: no half-written save), the world size its args.json
    records (one process where none is recorded and the only weights file is model.safetensors), and the files of
    that world: one process's model.safetensors alone; a wider run's, where each rank held whole tensors (data
    parallel, pipeline stages), exactly the shards transformers' model.safetensors.index.json lists (the writer
    leaves it: `training.shard_writer.publish`), each holding exactly the tensors it maps to that file. Every file's
    data is all there and its header records each tensor whole (`checkpoint_index.PIECES_KEY`: at offsets 0, of
    its own global shape: a ZeRO-3 or tensor-parallel slice renamed to model.safetensors is a piece). The
    checksums went with the index, so none is checked; a resume, which checks them and reads the optimizer state
    too, still refuses the checkpoint (`_unindexed`)."""
    meta = CheckpointDir.of(ckpt)
    ckpt = meta.path
    if (ckpt / checkpoint_index.INDEX).is_file() or not (ckpt / STATE_FILE).is_file():
        return None
    there = {p.name for p in ckpt.glob("model*.safetensors") if _MODEL_FILE.fullmatch(p.name)}
    single = checkpoint_index.file_name("model", 0, 1)
    world = meta.run("parallel", "world_size")
    if world is None and there == {single}:  # (an args.json without it: one process's name is all there is)
        world = 1
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        return None
    if world == 1:
        mapped = None if there != {single} else {single: None}
    else:
        mapped = _hf_shards(ckpt, {checkpoint_index.file_name("model", r, world) for r in range(world)})
    if not mapped or set(mapped) != there:  # (model.safetensors beside a rank's file, a rank's file not listed)
        return None
    for name, names in mapped.items():
        if _headers([ckpt / name]) is not None:
            return None
        f = File(ckpt / name)
        try:
            held = json.loads(f.metadata[checkpoint_index.PIECES_KEY])
        except (KeyError, TypeError, ValueError):  # (no record of its pieces: a checkpoint from before the index)
            return None
        if not (isinstance(held, dict) and f.tensors and set(held) == set(f.tensors) == (names or set(f.tensors))
                and all(isinstance(p, dict) and isinstance(p.get("offsets"), list) and not any(p["offsets"])
                        and p.get("global_shape") == f.tensors[t].get("shape") for t, p in held.items())):
            return None
    return [ckpt / name for name in sorted(mapped)]


def _hf_shards(ckpt: Path, ranks: set) -> dict | None:
    """{shard: the tensor names transformers' index maps to it} of `ckpt`'s model.safetensors.index.json, or None
    where it is absent, unreadable, or lists a file that is none of the ranks' names `ranks`."""
    try:
        weight_map = json.loads((ckpt / HF_INDEX).read_text(encoding="utf-8")).get("weight_map")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        return None  # (a list or an object for a file: no file name, and unhashable)
    if not set(weight_map.values()) <= ranks:
        return None
    shards: dict = {}
    for tensor, shard in weight_map.items():
        shards.setdefault(shard, set()).add(tensor)
    return shards


def _headers(paths, indexed_format: Problem | None = None) -> Problem | None:
    """The first of the safetensors files `paths` whose header is unreadable or whose data is cut short; with
    `indexed_format`, that line for a file whose header records its pieces (written with an index)."""
    for path in paths:
        try:
            f = File(path)
        except UserError as e:
            return _said(e)
        if f.data_end > f.size:
            return Problem(f"{path} is truncated ({f.size} bytes, its tensors end at {f.data_end})", "incomplete")
        if indexed_format and checkpoint_index.PIECES_KEY in (f.metadata or {}):
            return indexed_format
    return None


# what PaddleNLP's Trainer writes into each checkpoint-N (TRAINING_ARGS_NAME, SCHEDULER_NAME, its per-rank RNG state)
PADDLENLP_MARKS = ("training_args.bin", "scheduler.pdparams", "rng_state*.pth")
# its weights and optimizer state, beside a trainer_state.json: without unified_checkpoint its pickles, with it the
# optimizer's and master weights' shard indexes (ours is checkpoint.index.json)
_PADDLENLP_FILES = ("model_state*.pdparams", "*.pdopt", "optimizer.safetensors.index.json",
                    "master_weights.safetensors.index.json")


def _paddlenlp_signs(ckpt: Path) -> list[str]:
    """The files of `ckpt` only PaddleNLP's Trainer writes there: its marks anywhere; beside a trainer_state.json (a
    model directory of transformers' shards is no checkpoint) its weight and optimizer files, and the shards
    model.safetensors.index.json lists that Paddle's numpy writer wrote (metadata format "np": one per rank, "-of-"
    even for one; ours say "pt", and a pipeline layout of ours leaves that index too)."""
    marks = [p.name for pattern in PADDLENLP_MARKS for p in sorted(ckpt.glob(pattern))]
    if marks or not (ckpt / STATE_FILE).is_file():
        return marks
    signs = [p.name for pattern in _PADDLENLP_FILES for p in sorted(ckpt.glob(pattern))]
    for name in sorted(_hf_shards(ckpt, {p.name for p in ckpt.glob("model-*-of-*.safetensors")}) or ()):
        try:
            numpy_written = (File(ckpt / name).metadata or {}).get("format") == "np"
        except UserError:  # (an unreadable header: no sign either way)
            numpy_written = False
        signs += [name] if numpy_written else []
    return signs


def paddlenlp_checkpoint(ckpt) -> str | None:
    """One line when `ckpt` is a checkpoint-N PaddleNLP's Trainer wrote (a PaddleNLP run's output_dir reused here,
    or one named by resume_from_checkpoint): not damage, so no other checkpoint is tried nor their removal
    suggested; its optimizer and schedule are PaddleNLP's (pickles, or safetensors under Paddle's names) and its
    trainer_state.json records no data position of ours, so only its weights carry over. None for any other
    directory (one of ours has its args.json and checkpoint.index.json, whatever else lies in it)."""
    ckpt = Path(ckpt)
    if (ckpt / ARGS_FILE).exists() or (ckpt / checkpoint_index.INDEX).exists():
        return None
    signs = _paddlenlp_signs(ckpt)
    if not signs:
        return None
    pickled = [p.name for p in sorted(ckpt.glob("*.pdparams")) if p.name.startswith("model_state")]
    weights = (f"save its weights as safetensors ({pickled[0]} is a pickle, not read here; in PaddleNLP, load the "
               f"model from it and call model.save_pretrained(\"{ckpt}\", safe_serialization=True)), then "
               if pickled and not any(ckpt.glob("*.safetensors")) else "")
    return (f"{ckpt} is a checkpoint of PaddleNLP's Trainer ({signs[0]}), which pretrain-cli does not resume (its "
            f"optimizer state, schedule and data position are PaddleNLP's); start from its weights instead: "
            f"{weights}model_name_or_path: {ckpt}, continue_training: true, and another output_dir")


def skipping(ckpt, reason: str) -> str:
    """The one warning line of a damaged checkpoint skipped for the previous one, whoever found the damage (rank 0's
    listing check here, or a rank's checksum of the files it read: `training.run.previous_checkpoint`)."""
    return f"not resuming from {Path(ckpt).name}: {reason}; trying the previous checkpoint"


def newest(output_dir, checksums: bool = True, before: int | None = None) -> Path | None:
    """The newest `checkpoint-N` of `output_dir` (N < `before` when given) without a `problem` (None when there is
    none at all). A damaged one is skipped with one warning line; when every checkpoint is damaged, a UserError
    (exit 2). The first checkpoint PaddleNLP's Trainer wrote, met newest first, is a UserError with its own line
    (`paddlenlp_checkpoint`) at once: older checkpoints are not tried. `checksums` False checks presence and sizes
    only (each rank then checks the files it reads)."""
    import logging

    found, skipped = newest_complete(output_dir, checksums, before)
    for path, reason in skipped:
        logging.getLogger("pretrain_cli").warning(skipping(path, reason))
    if found is None and skipped:
        raise UserError(f"{output_dir}: every checkpoint is damaged (the oldest: {skipped[-1][1]}); remove them to "
                        f"start over, or set overwrite_output_dir: true")
    return found


def newest_complete(output_dir, checksums: bool = False, before: int | None = None,
                    resume: bool = True) -> tuple[Path | None, list[tuple[Path, Problem]]]:
    """(the newest `checkpoint-N` of `output_dir` without a `problem`, or None; the newer ones passed over, newest
    first, each with its problem): the one judge of which checkpoint a run's directory stands for, for a resume
    (`newest`) and for `eval` / `generate` / `export` of a run stopped before its final model
    (`orchestration.recorded.trained_model`, `resume` False: they never load the fp16 loss scale, so it is not
    judged), who each say the skipped ones in their own words. A checkpoint PaddleNLP's Trainer wrote, met newest
    first, is a UserError at once (`paddlenlp_checkpoint`)."""
    skipped = []
    for n, path in reversed(list_checkpoints(output_dir)):
        if before is not None and n >= before:
            continue
        if foreign := paddlenlp_checkpoint(path):
            raise UserError(foreign)
        reason = problem(path, checksums, resume=resume)
        if reason is None:
            return path, skipped
        skipped.append((path, reason))
    return None, skipped


def previous(output_dir, step: int, reason: str, checksums: bool = True) -> Path:
    """Where a run falls back to when its checkpoint of `step` is damaged (`reason`): the newest intact one before it;
    none left, one line (exit 2). `train` finds the damage while reading (each rank then checks the files it reads,
    so `checksums` False here); `check --verify` before it."""
    older = newest(output_dir, checksums=checksums, before=step)
    if older is None:
        raise UserError(f"{output_dir}: every checkpoint is damaged (the oldest: {reason}); remove them to start "
                        f"over, or set overwrite_output_dir: true")
    return older
