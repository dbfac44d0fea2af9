"""Which files of a model directory are its model, judged as transformers judges them (`HF_WEIGHTS`), and what
their refusals say; kept apart from the name map (`convert`) because every reader of a model directory (inference,
continuing, the final export's check) asks which files before it asks which tensors."""
from __future__ import annotations

import json
import os
import re

from pretrain_cli import json_mistakes
from pretrain_cli.counts import first_few
from pretrain_cli.errors import UserError
from pretrain_cli.models.foreign_weights import refuse_unread, weight_files
from pretrain_cli.storage import fp8

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# transformers' names for a model's weights, as its save_pretrained writes them and from_pretrained reads them: the
# safetensors and PyTorch files, single or sharded (`-0000k-of-0000n` before the ending), with a variant (`.fp16`:
# `_add_variant` puts it before the last dot, so the indexes' comes before `.json`), and their indexes. An HF
# directory's model is these files; any other name (model_ema.safetensors, model.safetensors.bak) is not
_V, _SHARD = r"(\.[A-Za-z0-9_]+)?", r"(-\d{5}-of-\d{5})?"
HF_WEIGHTS = re.compile(rf"model{_V}{_SHARD}\.safetensors|model\.safetensors\.index{_V}\.json"
                        rf"|pytorch_model{_V}{_SHARD}\.bin|pytorch_model\.bin\.index{_V}\.json")


def hf_weight_names(out_dir) -> list[str]:
    """The files of `out_dir` under transformers' names for weights (`HF_WEIGHTS`; a `.bin` beside a same-named
    `.idx` is a token file), in the order a save removes them: PyTorch's first (each index before its weights), then
    the safetensors index, then its weights. While PyTorch's go, transformers reads the earlier safetensors model
    whole; once its index (or single file) has gone it finds no model (an error), never part of one."""
    d = str(out_dir)
    names = [n for n in os.listdir(d) if HF_WEIGHTS.fullmatch(n) and os.path.isfile(os.path.join(d, n))
             and not (n.endswith(".bin") and os.path.isfile(os.path.join(d, n[:-4] + ".idx")))]
    return sorted(names, key=lambda n: (not n.startswith("pytorch_model"), ".index" not in n, n))


def find_weights(src_dir, use: str = "inference") -> list[str]:
    """The safetensors files a model directory's model is read from, judged by transformers' names (`HF_WEIGHTS`)
    (the names from_pretrained reads): the shards its model.safetensors.index.json lists, else its model.safetensors
    alone; in a checkpoint-N of ours, its weights beside checkpoint.index.json (which places their pieces). Other
    weights are never read as the model: shards without their index (an export or download stopped part way)
    are refused naming them, as are weights under other names only (model_ema.safetensors: read beside another
    file, a tensor both hold came silently from the last). A directory holding both model.safetensors and the
    index is refused naming both, not read as transformers reads it (model.safetensors first): our writer never
    leaves both (`convert.write_hf_dir` removes a model's files first), so both are two models mixed (a sharded one
    copied over a single-file one: cp and rsync remove nothing), and which is this one the files cannot tell. One of our
    checkpoints without its checkpoint.index.json (`_ours_unindexed`) gets `storage.intact`'s line, ended as
    `advice_for` says for `use`, unless its weights are whole without it (`storage.intact.weights_without_index`,
    the one judge for every `use`: one process's model.safetensors, or the shards transformers' index lists of a
    run whose ranks held whole tensors), then read as any model directory's (`lost_index_note` says so). UserError
    naming the directory if there are none."""
    from pretrain_cli.storage.checkpoint_index import INDEX as CHECKPOINT_INDEX

    src_dir = str(src_dir)
    if _ours_unindexed(src_dir) and _read_without_index(src_dir) is None:
        from pretrain_cli.storage import intact
        from pretrain_cli.storage.shard_files import advice_for

        reason = intact.damage(src_dir, checksums=False)  # (headers only: a checkpoint from before the index passes)
        if reason is not None:
            raise UserError(f"{reason}; {advice_for(src_dir, use).said(reason.state)}")
    index = os.path.join(src_dir, INDEX_FILE)
    if os.path.isfile(index):
        try:
            with open(index, "rb") as f:
                data = f.read()
        except OSError as e:
            raise UserError(f"{index}: unreadable shard index ({e}); re-create it or point to another "
                            f"checkpoint") from None
        again = "re-create it or point to another checkpoint"
        obj = json_mistakes.loads(data, index, holds=f"a shard index is one JSON object; {again}", fix=again)
        weight_map = obj.get("weight_map") if isinstance(obj, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) and v and os.path.basename(v) == v
                                                       for v in weight_map.values()):
            raise UserError(f"{index}: `weight_map` must map tensor names to shard file names in this directory; "
                            f"re-create it or point to another checkpoint")
        files = sorted(set(weight_map.values()))
        if os.path.isfile(os.path.join(src_dir, SINGLE_FILE)) and SINGLE_FILE not in files and \
                not os.path.isfile(os.path.join(src_dir, CHECKPOINT_INDEX)):
            raise UserError(f"{src_dir}: holds both {SINGLE_FILE}, which transformers reads, and {INDEX_FILE}, "
                            f"which names {first_few(files)}: two models mixed, not read; remove the one that is not "
                            f"this model ({SINGLE_FILE}, or the index and its shards), or point to another directory")
        return [os.path.join(src_dir, f) for f in files]
    found = weight_files(src_dir)[0]  # (no optimizer's, no adapter's)
    named = [n for n in found if HF_WEIGHTS.fullmatch(n)]
    if os.path.isfile(os.path.join(src_dir, CHECKPOINT_INDEX)) and named:  # its pieces: `checkpoint_index.Reader`
        return [os.path.join(src_dir, n) for n in named]
    if SINGLE_FILE in found:
        return [os.path.join(src_dir, SINGLE_FILE)]
    shards = [n for n in named if re.search(r"-\d{5}-of-\d{5}\.", n)]
    if shards:
        raise UserError(f"{src_dir}: holds {first_few(shards)}, transformers' shards, without their {INDEX_FILE}: part "
                        f"of a model (an export or download stopped part way), which is not read; download or "
                        f"export it again, or point to another model directory")
    if found:
        raise UserError(f"{src_dir}: holds weights only under names not read as a model ({first_few(found)}): the "
                        f"model is {SINGLE_FILE}, or the shards {INDEX_FILE} lists; if one of them is this model's "
                        f"weights, rename it {SINGLE_FILE} (beside its config.json), else point to another directory")
    refuse_unread(src_dir)  # weights in files not read (pytorch_model.bin, .pdparams ...): named, with the conversion
    raise UserError(f"{src_dir}: no {SINGLE_FILE} or {INDEX_FILE}; point to a directory with HF safetensors")


def _ours_unindexed(src_dir: str) -> bool:
    """A checkpoint of our runs (optimizer*.safetensors, and its checkpoint-N name or our args.json record; not
    PaddleNLP's, which holds its Trainer's files) without its checkpoint.index.json."""
    from pathlib import Path

    from pretrain_cli.run_dir import CHECKPOINT
    from pretrain_cli.storage import checkpoint_index, intact
    from pretrain_cli.storage.checkpoint_dir import CheckpointDir

    path = Path(src_dir)
    if (path / checkpoint_index.INDEX).is_file() or not any(path.glob("optimizer*.safetensors")):
        return False
    ours = CHECKPOINT.match(path.name) or CheckpointDir(path).record is not None
    return bool(ours) and intact.paddlenlp_checkpoint(path) is None


def _read_without_index(src_dir: str) -> list | None:
    """The weight files one of our checkpoints without its checkpoint.index.json is read from all the same
    (`storage.intact.weights_without_index`: each tensor whole in them), or None."""
    from pretrain_cli.storage import intact

    return intact.weights_without_index(src_dir) if _ours_unindexed(src_dir) else None


def lost_index_note(src_dir, lead: str = "note: ") -> str | None:
    """The one note of a checkpoint `find_weights` reads without its checkpoint.index.json (said once by each
    command that reads it: `eval`, `generate`, `export`, and a run that continues from it, whose notes start with
    `lead`), or None."""
    from pretrain_cli.storage.checkpoint_dir import CheckpointDir
    from pretrain_cli.storage.checkpoint_index import INDEX as CHECKPOINT_INDEX

    files = _read_without_index(str(src_dir))
    if files is None:
        return None
    world = CheckpointDir(src_dir).run("parallel", "world_size")
    read = (f"its {SINGLE_FILE}, whole as its one process wrote them" if len(files) == 1 and world in (1, None) else
            f"the {len(files)} files its {INDEX_FILE} lists, each tensor whole as its {world} processes wrote them")
    return (f"{lead}{os.path.join(str(src_dir), CHECKPOINT_INDEX)} is missing: the weights are read from {read}, "
            f"without the checksums the index kept; a resume does not take this checkpoint")


def quantization_block(src_dir) -> tuple[int, int]:
    """The FP8 block size of a model directory (its config.json's `quantization_config`; 128 × 128 if none)."""
    try:
        with open(os.path.join(str(src_dir), "config.json"), encoding="utf-8") as f:
            quant = json.load(f).get("quantization_config")
    except (OSError, ValueError, AttributeError, RecursionError):  # (ModelConfig.from_file names what is wrong)
        quant = None
    return fp8.block_size(quant if isinstance(quant, dict) else None)


def has_weights(model_dir) -> bool:
    """Whether a directory holds safetensors weights (a preset or a bare config.json does not): `find_weights` then
    reads its model from them or refuses them in one line, never a random init in their place."""
    return bool(weight_files(model_dir)[0])

