"""The one way weights get into a model: a reader per source, the one name map, blocks read as a rank needs them.

A source is a directory of safetensors files, read by one of two readers (`open_reader`): a sharded checkpoint's
pieces through its `checkpoint.index.json` (`storage.checkpoint_index.Reader`), or whole files
(`storage.shard_files.Files`: a Hugging Face directory, a PaddleNLP one, a checkpoint from before the index).
`models.convert.name_map` maps the source's tensors to the model's parameters (HF names and layout, or
PaddleNLP's prefix and Paddle's layout; FP8 scales, router biases, multi-token prediction modules) and checks
names, shapes and dtypes once, before any tensor is read. `WeightSource` then answers `(name, box)` with that
block of the parameter, in Paddle's layout, fp32, reading from the files only those bytes
(`storage.shard_files.File.read`); DeepSeek's FP8 weights are dequantized block by block.

Every entry goes through it: resume, a spike rollback's rebuild and `continue_training` hand it to the layout
(`Strategy.place` → `distributed.layout.materialize`: each rank creates only its blocks); a rollback without rebuild,
`eval` and `generate` fill a model whole from it (`load_weights`, `load_for_inference`).

A checkpoint's checksums are verified by whoever read it: resume's rank 0 checks only that its files are present
and of the recorded sizes (`orchestration.resumed.find_resume`); each rank then checks the crc32 of the files it
read (`verify_everywhere`), so the pass over a 1.1 TiB checkpoint is spread over the ranks instead of done by one.
A rollback (with or without rebuild) verifies the same way.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from pretrain_cli.errors import UserError
from pretrain_cli.storage.checkpoint_dir import CheckpointDir


class DamagedCheckpoint(UserError):
    """Some rank found a file it read not matching its checksum (`reason`: the finding naming the file: this rank's, or
    the first rank's that found one). `train` then resumes from the previous checkpoint; a rollback stops with
    one line."""

    def __init__(self, reason: str | None):
        super().__init__(reason or "a file another rank read does not match its checksum (see its workerlog)")
        self.reason = reason


def verify_read(ckpt, files) -> str | None:
    """Why one of `files` (paths inside checkpoint `ckpt`, those this rank read) is missing, truncated or does not
    match the checksum its index records, or None (`storage.intact.damage` decides, for these files only)."""
    from pretrain_cli.storage import intact

    return intact.damage(ckpt, checksums=True, files=sorted({Path(f).name for f in files}))


def verify_everywhere(comm, ckpt, files) -> None:
    """Every rank checks the checksums of the `files` of `ckpt` it read; when any rank found one altered, every
    rank raises `DamagedCheckpoint` (one collective, then the finding naming the file, gathered)."""
    reason = verify_read(ckpt, files)
    if comm.any(reason is not None):  # every rank learns it, in the same collective, and which file it is
        found = [r for r in comm.gather_object(reason) if r is not None]  # (every rank reaches this one too)
        raise DamagedCheckpoint(reason or found[0])


def open_reader(ckpt, kind: str, use: str):
    """(reader of `kind` "weights" / "optimizer" tensors of directory `ckpt` (a path or a `CheckpointDir`), the
    file to name in errors): the index's pieces where it has one, else its whole safetensors files. A damaged file's
    line ends as `shard_files.advice_for` says for `use`, what the command does with the directory (a model
    directory's is to be downloaded again; a checkpoint read for inference is not resumed from another)."""
    from pretrain_cli.models.model_files import find_weights
    from pretrain_cli.run_dir import OPTIMIZER_FILE
    from pretrain_cli.storage import checkpoint_index
    from pretrain_cli.storage.shard_files import Files, advice_for

    meta = CheckpointDir.of(ckpt)
    advice = advice_for(meta.path, use)
    if meta.index is not None:
        return checkpoint_index.Reader(meta.path, meta.index, advice), meta.path / checkpoint_index.INDEX
    if kind == "optimizer":
        return Files([meta.path / OPTIMIZER_FILE], "optimizer state", advice), meta.path / OPTIMIZER_FILE
    weights = find_weights(meta.path, use)  # (which files, or the line an unreadable directory gets for `use`)
    return Files([p for p in weights if not Path(p).name.startswith("optimizer")], "weights", advice), meta.path


def as_float32(arr: np.ndarray, code: str) -> np.ndarray:
    """A block as fp32 (bf16 arrives as its uint16 bits: the high half of an fp32)."""
    if code == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32, copy=False)


class WeightSource:
    """The weights of checkpoint or model directory `path` (a path or a `CheckpointDir`) for `model` (built lazily,
    or eagerly: only names and shapes are asked)."""

    dtype = None  # as `distributed.layout.materialize.InitSource.dtype`
    kept = frozenset()  # as `InitSource.kept`

    def __init__(self, path, model, what: str = "checkpoint", fallback=None, *, use: str):
        """`fallback` (an `InitSource`): where multi-token prediction modules come from when the directory has
        none (transformers drops them when it saves a DeepSeek-V3); without one, the directory must hold them.
        `use`: what the command does with the directory (`open_reader`: what a damaged file's line advises)."""
        from pretrain_cli.distributed.layout.pieces import split_name
        from pretrain_cli.models.convert import is_mtp, name_map
        from pretrain_cli.models.model_files import quantization_block

        meta = CheckpointDir.of(path)
        self.reader, self.where = open_reader(meta, "weights", use)
        stored = {n: t for n, t in self.reader.index["tensors"].items() if split_name(n)[1] is None}  # weights
        try:
            found = name_map(stored, model, self.where, what, self._all_zero, absent_mtp=fallback is not None)
        except UserError:
            self.close()
            raise
        self.names, self.zeros, self.layout = found.names, found.zeros, found.layout
        self.fallback = fallback
        # what `fallback` gives: a run continued from this directory trains these from init (routing_watch's grace)
        self.initialised = frozenset(n for n, _ in model.named_parameters() if not self.holds(n))
        absent = sorted({n.split(".")[2] for n in self.initialised if is_mtp(n, model.config)})
        if absent:  # said, or a first loss well above transformers' own looks like a wrong load
            from pretrain_cli.training.metrics import log

            log.info(f"{self.where}: no multi-token prediction weights (transformers does not save them): the module"
                     f"{'s' * (len(absent) > 1)} of layer {', '.join(absent)} start{'' if len(absent) > 1 else 's'} "
                     f"from init, and the training loss includes their mtp_loss from there")
        self.block = quantization_block(meta.path)
        self.routers_before = self._routers_before(meta, model.config) if use == "continue_training" else {}

    def _routers_before(self, meta, cfg) -> dict[int, int]:
        """The MoE layers whose router this directory holds as a run of ours left it still from init, with the steps
        it trained since (`routing_watch.routers_before`: its trainer state says so, an older state with its
        args.json; a directory no run of ours wrote holds trained routers): a run continued from it gives them the
        rest of their grace."""
        from pretrain_cli.run_dir import STATE_FILE
        from pretrain_cli.training.routing_watch import ROUTER, routers_before

        layers = getattr(cfg, "expert_layers", None) or []
        if not layers or not (meta.path / STATE_FILE).is_file():
            return {}
        try:
            state = meta.state
        except UserError:  # (an unreadable state: no step to count from, so the routers count as trained)
            return {}
        continued = None if meta.record is None else bool(meta.run("model", "continue_training"))
        found = routers_before(state, continued, layers)
        return {i: n for i, n in found.items() if self.holds(f"model.layers.{i}.{ROUTER}")}

    def _all_zero(self, name: str) -> bool:
        return not np.asarray(self.reader.read(name)).any()

    def holds(self, name: str) -> bool:
        """Whether the directory gives parameter `name` (a router bias it has not: zeros)."""
        return name in self.names or name in self.zeros

    def __call__(self, name: str, box):
        from pretrain_cli.storage import fp8

        if not self.holds(name):  # a multi-token prediction module the directory does not hold
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
            arr = as_float32(raw, code)
        return np.ascontiguousarray(arr.T if transpose else arr)

    @property
    def bytes_read(self) -> int:
        return self.reader.bytes_read

    @property
    def files(self) -> list:
        """The files read so far (a sharded checkpoint's: only those the blocks touched)."""
        return self.reader.opened

    def close(self) -> None:
        self.reader.close()


def _kept(name, box):
    raise AssertionError(f"{name}: `load_weights` creates only what the directory holds")


def load_weights(model, path, what: str = "model directory", comm=None, *, use: str) -> str:
    """The weights of directory `path` (any source; a path or a `CheckpointDir`) into `model`, whole; returns the
    layout the name map found ("hf" or "paddlenlp"). Multi-token prediction modules the directory has not keep
    their values. A checkpoint of ours (it has an index) is checked as a resume checks it: its files against the
    index (sizes, the pieces each header records) before any is read, the checksums of those read after (on every
    rank of `comm`, which all learn of a damaged file): `DamagedCheckpoint` naming the file. `use`: `open_reader`'s."""
    from pretrain_cli.distributed.comms.comm import NoComm
    from pretrain_cli.distributed.layout.materialize import fill_whole
    from pretrain_cli.storage import intact

    meta = CheckpointDir.of(path)
    if meta.index is not None and (reason := intact.damage(meta, checksums=False)) is not None:
        raise DamagedCheckpoint(reason)
    source = WeightSource(meta, model, what, fallback=_kept, use=use)
    try:
        for name, param in model.named_parameters():  # created, or its values replaced
            if source.holds(name):
                fill_whole(name, param, source)
        files = source.files
    finally:
        source.close()
    if meta.index is not None:
        verify_everywhere(comm or NoComm(), meta, files)
    return source.layout


def holds_router_bias(ckpt, use: str) -> bool:
    """Whether directory `ckpt`'s weights hold a router bias (a run trained with `moe_router_bias_update_rate` > 0):
    a model built without one would drop it and route otherwise than the run did."""
    from pretrain_cli.models.convert import ROUTER_BIAS

    reader, _ = open_reader(ckpt, "weights", use)
    try:
        return any(name.endswith(ROUTER_BIAS) for name in reader.index["tensors"])
    finally:
        reader.close()


def load_for_inference(model_dir, cfg, seed: int, request=None, device: str | None = None):
    """(model, source) for `eval` and `generate`: the directory's weights, or a seeded random init when it has none
    (a preset). A directory with weights that cannot be read is an error, never a random init (a checkpoint that
    lost its index, its weights whole, is read, with `model_files.lost_index_note` on stderr). `request` on
    `device`: the kernels (`orchestration.targets.inference_kernels`; None: `ops.kernels`' defaults)."""
    from pretrain_cli import runtime
    from pretrain_cli.models.model_files import find_weights, has_weights, lost_index_note

    paddle = runtime.import_paddle()
    from pretrain_cli.models import build_model
    from pretrain_cli.ops.kernels import select

    weights = has_weights(model_dir)
    if weights:
        find_weights(model_dir)  # a damaged index fails here, before the model is built
        if (note := lost_index_note(model_dir)) is not None:  # (a checkpoint's weights, read whole without it)
            print(note, file=sys.stderr)
    if not str(device or paddle.device.get_device()).startswith(("gpu", "cuda")):
        from pretrain_cli.planning.hardware import host_memory_problem

        problem = host_memory_problem(cfg, 4, "running")  # fp32 weights, nothing else counted
        if problem:
            raise UserError(problem)
    paddle.seed(seed)
    moe = None
    if weights and cfg.expert_layers and holds_router_bias(model_dir, "inference"):  # the routing the run trained with
        from pretrain_cli.run_config import MoeConfig

        moe = MoeConfig(routing_bias=True)
    model = build_model(cfg, select(request, device or paddle.device.get_device()), moe)
    if weights:
        try:
            load_weights(model, model_dir, use="inference")
        except DamagedCheckpoint as e:
            from pretrain_cli.storage.shard_files import advice_for

            state = getattr(e.reason, "state", "damaged")  # (`storage.intact`'s Problem: incomplete or damaged)
            raise UserError(f"{e}; {advice_for(model_dir, 'inference').said(state)}") from None
    return model, ("trained weights" if weights else f"random init (seed {seed})")
