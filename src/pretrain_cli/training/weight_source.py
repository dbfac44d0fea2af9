"""Weights on disk as a `distributed.layout.materialize` source: each rank reads only the blocks of the tensors it holds.

Resuming from a checkpoint (any layout's: whole tensors or pieces with `checkpoint.index.json`), a spike
rollback's rebuild, and `continue_training` from a Hugging Face or PaddleNLP directory all build the model
lazily and hand this to the layout (`Strategy.place`): a ZeRO-3 shard, a TP slice or a pipeline stage is read
as the byte ranges of its own block (`storage.shard_files.File.read`, `checkpoint_index.Reader.read`), in
Paddle's layout, fp32; nothing else of the files is read. Names, layouts and shapes are checked as the
whole-model loader (`models.convert.load_hf_state_dict`) checks them, before any block is read.

A checkpoint's checksums are verified the same way: rank 0 checks only that its files are present and of the
recorded sizes (`orchestration.prepare.find_resume`); each rank then checks the crc32 of the files it read
(`verify_read`), so the pass over a 1.1 TiB checkpoint is spread over the ranks instead of done by one.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from pretrain_cli.errors import UserError


class DamagedCheckpoint(UserError):
    """Some rank found a file it read not matching its checksum (`reason`: the finding naming the file: this rank's, or
    the first rank's that found one). `train` then resumes from the previous checkpoint; where nothing catches it (a
    spike rollback's rebuild), one line."""

    def __init__(self, reason: str | None):
        super().__init__(reason or "a file another rank read does not match its checksum (see its workerlog)")
        self.reason = reason


def verify_read(ckpt, files) -> str | None:
    """Why one of `files` (paths inside checkpoint `ckpt`, those this rank read) is missing, truncated or does not
    match the checksum its index records, or None (`storage.intact.damage` decides, for these files only)."""
    from pretrain_cli.storage import intact

    return intact.damage(ckpt, checksums=True, files=sorted({Path(f).name for f in files}))


class WeightSource:
    """The weights of checkpoint or model directory `path` for `model` (lazily built: names and shapes)."""

    dtype = None  # as `distributed.layout.materialize.InitSource.dtype`

    def __init__(self, path, model, what: str = "checkpoint", fallback=None):
        """`fallback` (an `InitSource`): where multi-token prediction modules come from when the directory has
        none (transformers drops them when it saves a DeepSeek-V3)."""
        from pretrain_cli.distributed.layout.pieces import split_name
        from pretrain_cli.models.convert import (_IGNORED_SUFFIXES, ROUTER_BIAS, detect_layout, hf_params, is_mtp,
                                                 is_mtp_shared_copy, quantization_block)
        from pretrain_cli.storage import fp8
        from pretrain_cli.training.checkpoint import open_reader

        self.reader, self.where = open_reader(Path(path), "weights")
        stored = {n: t for n, t in self.reader.index["tensors"].items() if split_name(n)[1] is None}  # weights
        layout = detect_layout({n: SimpleNamespace(shape=tuple(t["shape"])) for n, t in stored.items()}, model)
        self.names = {}  # ours -> (stored name, stored transposed)
        for hf, _, transpose in hf_params(model):  # our names are HF's
            self.names[hf] = (_stored_name(hf, stored) if layout == "paddlenlp" else hf,
                                transpose and layout == "hf")
        params = dict(model.named_parameters())
        tied = model.lm_head is None
        cfg = model.config
        self.fallback = fallback
        if fallback is not None and not any(is_mtp(n, cfg) for n in stored):  # MTP modules start from init
            self.names = {k: v for k, v in self.names.items() if not is_mtp(k, cfg)}
        self.zeros = set()  # a MoE router bias the source has not: it starts at 0
        for ours, (name, transpose) in self.names.items():
            if name not in stored and name.endswith(ROUTER_BIAS):
                self.zeros.add(ours)
                continue
            if name not in stored:
                self.close()
                raise UserError(f"{self.where}: tensor {name!r} is missing; the {what} does not match config.json")
            want = list(reversed(params[ours].shape)) if transpose else list(params[ours].shape)
            if list(stored[name]["shape"]) != want:
                self.close()
                raise UserError(f"{self.where}: tensor {name!r} has shape {list(stored[name]['shape'])} but config.json "
                                f"implies {want}; use the config.json that belongs to these weights")
        known = {name for name, _ in self.names.values()}
        known |= {name + fp8.SCALE_SUFFIX for name in known if name + fp8.SCALE_SUFFIX in stored}  # FP8 scales
        self.block = quantization_block(path)
        extra = sorted(n for n in stored if n not in known and not n.endswith(_IGNORED_SUFFIXES + (ROUTER_BIAS,))
                       and not is_mtp_shared_copy(n, cfg)
                       and not (tied and n.endswith("lm_head.weight")) and not self._zero_bias(n))
        if extra:
            self.close()
            raise UserError(f"{self.where}: unexpected tensor {extra[0]!r} ({len(extra)} unexpected in total); the "
                            f"{what} does not match config.json")

    def _zero_bias(self, name: str) -> bool:
        """PaddleNLP's Qwen3 may save all-zero q/k/v biases the model has not: exactly no bias."""
        from pretrain_cli.models.convert import _QKV_BIASES

        return name.endswith(_QKV_BIASES) and not np.asarray(self.reader.read(name)).any()

    def __call__(self, name: str, box):
        from pretrain_cli.training.checkpoint import _as_float32

        from pretrain_cli.storage import fp8

        if name not in self.names:  # a multi-token prediction module the directory does not hold
            return self.fallback(name, box)
        if name in self.zeros:
            return np.zeros(box.shape, dtype=np.float32)
        stored, transpose = self.names[name]
        where = box.transposed() if transpose else box
        code = self.reader.index["tensors"][stored]["dtype"]
        raw = self.reader.read(stored, where.offsets, where.shape)
        if code == fp8.CODE:  # DeepSeek's FP8 release: this block's values × the scales of the blocks it crosses
            scale = self.reader.read(stored + fp8.SCALE_SUFFIX).astype(np.float32)
            arr = fp8.dequantize(fp8.decode(raw), scale, self.block, where.offsets)
        else:
            arr = _as_float32(raw, code)
        return np.ascontiguousarray(arr.T if transpose else arr)

    @property
    def bytes_read(self) -> int:
        return self.reader.bytes_read

    @property
    def files(self) -> list:
        from pretrain_cli.training.checkpoint import files_opened

        return files_opened(self.reader)

    def close(self) -> None:
        self.reader.close()


def _stored_name(hf: str, stored: dict) -> str:
    """A PaddleNLP file's name for HF name `hf`: the family prefix (`llama.`, `qwen2.`) instead of `model.`, or
    `model.` kept (PaddleNLP's Qwen3)."""
    from pretrain_cli.models.convert import PADDLENLP_PREFIXES

    if hf.startswith("model."):
        for prefix in PADDLENLP_PREFIXES:
            if prefix + hf[len("model."):] in stored:
                return prefix + hf[len("model."):]
    return hf
