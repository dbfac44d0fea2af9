"""`output_dir/checkpoint-N/`: written atomically, self-describing, no pickle.

Layout: HF-loadable weights (`model.safetensors`, `config.json`, `generation_config.json`,
tokenizer files) + `optimizer.safetensors` (AdamW moments keyed `<hf name>/moment1` etc., HF
layout, so any topology can read them) + `trainer_state.json` + `args.json`.

A save goes to `checkpoint-N.tmp/`, every file is fsynced, then one `rename` publishes it, so
a crash at any point leaves either the complete new checkpoint or none. A directory named
`checkpoint-N` is complete by construction; rotation renames before deleting for the same
reason, and never removes the newest checkpoint.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

from pretrain_cli import atomic
from pretrain_cli.errors import UserError
from pretrain_cli.run_dir import ARGS_FILE, OPTIMIZER_FILE, STATE_FILE, checkpoint_dir, list_checkpoints
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")
# Paddle AdamW accumulator tables → our names.
_ACCUMULATORS = {"moment1": "moment1", "moment2": "moment2", "beta1_pow_acc": "beta1_pow", "beta2_pow_acc": "beta2_pow"}


def rotate(output_dir, limit: int | None) -> list[Path]:
    """Delete the oldest checkpoints beyond `limit`; the newest complete one always survives."""
    if not limit:
        return []
    removed = []
    ckpts = list_checkpoints(output_dir)
    for _, path in ckpts[: max(0, len(ckpts) - max(limit, 1))]:
        atomic.remove_tree(path)  # renamed first: a crash mid-delete never leaves a half checkpoint-N
        removed.append(path)
    return removed


def clean_leftovers(output_dir) -> None:
    """Remove `*.tmp` / `*.deleting` directories and the temporary files (`atomic.tmp_path`) left by a killed
    process."""
    root = Path(output_dir)
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and (p.name.endswith(".deleting") or re.match(r"^checkpoint-\d+\.tmp", p.name)):
                shutil.rmtree(p, ignore_errors=True)
        for p in atomic.stale_temporaries(root):
            p.unlink(missing_ok=True)


def _inner(optimizer):
    """The Paddle AdamW under fleet / sharding wrappers (they keep it as `_inner_opt`)."""
    while hasattr(optimizer, "_inner_opt"):
        optimizer = optimizer._inner_opt
    return optimizer


def optimizer_tensors(model, optimizer, to_numpy=None, contiguous: bool = True) -> dict[str, np.ndarray]:
    """AdamW state keyed by HF parameter name, in HF layout (fp32 numpy).

    Read from the accumulator tables by parameter rather than by parsing Paddle's generated
    names: under O2 (`multi_precision`) the moments belong to the fp32 master copy
    (`<param>_fp32_master_0_moment1_0`), not to the parameter. Parameters this rank does not own
    (fleet's ZeRO-1) or that have no state yet are simply absent. `to_numpy` (a layout's full-tensor
    gather, the same tensors in the same order on every rank) replaces `tensor.numpy()`. `contiguous=False`
    leaves the transposed ones as views, laid out by `save_checkpoint` (in the background writer, for
    `async_save`, rather than in the training step).
    """
    lay_out = np.ascontiguousarray if contiguous else (lambda a: a)
    to_numpy = to_numpy or (lambda t: t.numpy())
    from pretrain_cli.models.convert import hf_param_names

    inner = _inner(optimizer)
    master = getattr(inner, "_master_weights", None) or {}
    params = dict(model.named_parameters())
    out = {}
    for ours, (hf, transpose) in hf_param_names(model).items():
        p = params[ours]
        target = master.get(p.name, p)
        for key, short in _ACCUMULATORS.items():
            t = inner._accumulators.get(key, {}).get(target.name)
            if t is None:
                continue
            arr = to_numpy(t)
            out[f"{hf}/{short}"] = lay_out(arr.T if transpose and arr.ndim == 2 else arr)
        if p.name in master:
            arr = to_numpy(master[p.name])
            out[f"{hf}/master"] = lay_out(arr.T if transpose else arr)
    return out


def load_optimizer(model, optimizer, path: Path) -> None:
    """Inverse of `optimizer_tensors`, into an optimizer that is already AMP-decorated and sharded.

    The accumulators (and O2 master weights) of the parameters this optimizer manages — under
    ZeRO-1 only its own shard — are created now and overwritten with the saved values, so a
    checkpoint from any topology loads into any other.
    """
    import paddle
    from safetensors.numpy import load_file

    from pretrain_cli.models.convert import hf_param_names

    try:
        tensors = load_file(str(path))
    except Exception as e:  # safetensors raises several types for a damaged file
        raise UserError(f"{path}: unreadable optimizer state ({e}); resume from another checkpoint") from None
    inner = _inner(optimizer)
    managed = {p.name for p in inner._parameter_list}
    params = dict(model.named_parameters())
    names = {ours: v for ours, v in hf_param_names(model).items() if params[ours].name in managed}
    # `dist.shard_optimizer`'s wrapper creates each accumulator and shards it; the others create them whole
    # (fleet's ZeRO-1 only those of its own parameters, filtered by `managed`)
    creator = optimizer if type(optimizer).__name__ == "_ShardOptimizer" else inner
    creator._create_accumulators(paddle.static.default_main_program().global_block(),
                                 [params[ours] for ours in names])
    master = getattr(inner, "_master_weights", None) or {}
    for ours, (hf, transpose) in names.items():
        p = params[ours]
        target = master.get(p.name, p)
        for key, short in _ACCUMULATORS.items():
            arr = tensors.get(f"{hf}/{short}")
            if arr is None:
                raise UserError(f"{path}: no {short} for {hf}; the optimizer state does not match the model")
            if transpose and arr.ndim == 2:
                arr = arr.T
            acc = inner._accumulators[key][target.name]
            if list(arr.shape) != list(acc.shape):
                raise UserError(f"{path}: {hf}/{short} has shape {list(arr.shape)}, the model needs {list(acc.shape)}")
            if arr.dtype.kind != "f":
                raise UserError(f"{path}: {hf}/{short} is {arr.dtype}, expected floating point; the file is not ours")
            acc.set_value(np.ascontiguousarray(arr, dtype=np.float32))
        if p.name in master:
            arr = tensors.get(f"{hf}/master")
            if arr is None:  # saved without O2: the fp32 weights themselves are the master copy
                continue
            master[p.name].set_value(np.ascontiguousarray(arr.T if transpose else arr, dtype=np.float32))


def save_checkpoint(output_dir, step: int, model, model_cfg, trainer_state: dict, run_args: dict,
                    optimizer_state: dict, tokenizer_dir=None, dtype: str = "float32", weights=None) -> Path:
    """Publish `checkpoint-N/` with the full optimizer state (and, from a sharded layout, the full weights)
    already gathered from the other ranks."""
    from safetensors.numpy import save_file

    from pretrain_cli.models.convert import save_hf

    final = checkpoint_dir(output_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        save_hf(model, model_cfg, str(tmp), dtype=dtype, values=weights)
        # transposed moments are laid out here, in the (possibly background) writer, not in the training step
        save_file({k: np.ascontiguousarray(v) for k, v in optimizer_state.items()}, str(tmp / OPTIMIZER_FILE),
                  metadata={"format": "np"})
        copy_tokenizer(tokenizer_dir, tmp)
        atomic.write_json(tmp / ARGS_FILE, run_args)
        atomic.write_json(tmp / STATE_FILE, trainer_state)  # written last: its presence marks a finished write
        return atomic.publish_dir(tmp, final)
    except BaseException:
        # disk full, permissions, Ctrl-C: drop the partial directory (frees the space it took) and let the
        # CLI report the OSError as one line; the previous checkpoint-M is untouched
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def copy_tokenizer(tokenizer_dir, dest) -> None:
    if tokenizer_dir is None:
        return
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.is_file():
            atomic.write_bytes(Path(dest) / name, src.read_bytes())


def read_state(ckpt: Path) -> dict:
    path = Path(ckpt) / STATE_FILE
    if not path.is_file():
        raise UserError(f"{ckpt}: no {STATE_FILE}, so this is not a complete checkpoint; pick another "
                        f"checkpoint-N or remove resume_from_checkpoint")
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: unreadable trainer state ({e}); resume from another checkpoint") from None
    for key in ("global_step", "consumed_samples"):
        if not isinstance(state.get(key), int):
            raise UserError(f"{path}: missing or invalid `{key}`; resume from another checkpoint")
    return state


def check_compatible(ckpt: Path, model_cfg, max_seq_length: int) -> None:
    """Refuse a resume whose model shape or sequence length differs from the checkpoint's."""
    from pretrain_cli.models.config import ModelConfig

    saved = ModelConfig.from_file(str(ckpt))
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "tie_word_embeddings"):
        a, b = getattr(saved, key), getattr(model_cfg, key)
        if a != b:
            raise UserError(f"{ckpt}: checkpoint has {key}={a} but this run's model has {key}={b}; resume with the "
                            f"same model, or set overwrite_output_dir: true to start over")
    args_path = Path(ckpt) / ARGS_FILE
    if args_path.is_file():
        saved_len = json.loads(args_path.read_text(encoding="utf-8")).get("arguments", {}).get("max_seq_length")
        if saved_len is not None and saved_len != max_seq_length:
            raise UserError(f"{ckpt}: checkpoint was trained with max_seq_length={saved_len}, this run asks for "
                            f"{max_seq_length}; resume with the same max_seq_length or set overwrite_output_dir: true")


class Saver:
    """The trainer's `save_fn`: gather (every rank), then rank 0 writes while the others wait.

    The others wait on the launcher's TCP store, not in a gloo collective, whose hard 30 s timeout a
    slow save would trip (docs/DISTRIBUTED.md). With `async_save` the gather stays collective (every
    rank at the same step) but rank 0 hands the host copies to a background writer
    (`training.async_save`) and nobody waits for the write. Either way the log and metrics.jsonl say
    how long training stood still for the save.
    """

    def __init__(self, out: Path, model_cfg, comm, run_args, tokenizer_dir, dtype: str, limit: int | None,
                 async_save: bool = False):
        from pretrain_cli.training.async_save import AsyncWriter, HostStaging

        # the model, optimizer and layout are the trainer's, read at each call: a rollback may replace them
        self.out, self.cfg, self.comm, self.run_args = Path(out), model_cfg, comm, run_args
        self.tokenizer_dir, self.dtype, self.limit = tokenizer_dir, dtype, limit
        self.writer = AsyncWriter() if async_save else None
        self.staging = HostStaging() if async_save else None

    def __call__(self, trainer) -> None:
        import time

        from pretrain_cli.training.metrics import log

        start = time.perf_counter()
        step = trainer.state.global_step
        # short collectives where the layout shards them: every rank takes part before rank 0 writes
        waited, stage = 0.0, None
        if self.writer is not None:  # one save in flight: its host buffers are reused below
            self.writer.wait()
            waited = time.perf_counter() - start
            stage = lambda t: self.staging.copy(t.name, t)  # noqa: E731
        model, strategy = trainer.raw_model, trainer.strategy
        weights = strategy.gather_weights(model)
        opt_state = strategy.gather_optimizer_state(
            model, lambda to_numpy: optimizer_tensors(model, trainer.optimizer, to_numpy or stage, contiguous=False))
        if self.writer is None:
            self._write_sync(trainer, weights, opt_state)
        elif strategy.parallel.is_rank0:
            if weights is None:  # whole parameters on rank 0: copied now, since training goes on changing them
                weights = {name: self.staging.copy(name, p) for name, p in model.named_parameters()}
            state = trainer.state_dict()  # (a deep copy)
            self.writer.submit(f"checkpoint-{step}", lambda: self._write(step, model, weights, opt_state, state))
        stall = time.perf_counter() - start
        kind = "async" if self.writer is not None else "sync"
        extra = f"; {waited:.3f} s of it waiting for the previous write" if waited > 0.001 else ""
        log.info(f"checkpoint-{step}: stalled {stall:.3f} s ({kind}{extra})")
        trainer.record_event("checkpoint", {"stall_seconds": round(stall, 6), "async": self.writer is not None,
                                            "waited_seconds": round(waited, 6)})

    def _write_sync(self, trainer, weights, opt_state) -> None:
        from pretrain_cli.distributed.comm import rank0_round

        step = trainer.state.global_step
        if not trainer.strategy.parallel.is_rank0:
            self.comm.wait_for_rank0(f"saving checkpoint-{step}")
            return
        with rank0_round(self.comm):
            self._write(step, trainer.raw_model, weights, opt_state, trainer.state_dict())

    def _write(self, step: int, model, weights, opt_state, state: dict) -> None:
        from pretrain_cli.training.metrics import log

        path = save_checkpoint(self.out, step, model, self.cfg, state, self.run_args, opt_state,
                               self.tokenizer_dir, dtype=self.dtype, weights=weights)
        removed = rotate(self.out, self.limit)
        log.info(f"saved {path}" + (f"; removed {', '.join(x.name for x in removed)}" if removed else ""))

    def wait(self) -> None:
        """The end of training and a signal stop: the write in flight is published (or its error raised)."""
        if self.writer is not None:
            self.writer.wait()

    def newest(self, is_rank0: bool) -> Path | None:
        """Every rank: the newest complete checkpoint, the same one on all of them (a rollback's target), or
        None. Rank 0 finishes the write in flight first and names it; the others take the same one."""
        from pretrain_cli.distributed.comm import rank0_round
        from pretrain_cli.run_dir import latest_checkpoint

        if is_rank0:
            with rank0_round(self.comm):
                self.wait()
                return self.comm.agree_on_resume(latest_checkpoint(self.out))
        self.comm.wait_for_rank0("finishing the checkpoint to roll back to")
        return self.comm.agree_on_resume(None)

    def load_into(self, trainer, path: Path) -> None:
        """The checkpoint's weights and optimizer state written into the trainer's own (whole) tensors."""
        from pretrain_cli.models.convert import load_weights

        load_weights(trainer.raw_model, self.cfg, str(path))
        load_optimizer(trainer.raw_model, trainer.optimizer, path / OPTIMIZER_FILE)
