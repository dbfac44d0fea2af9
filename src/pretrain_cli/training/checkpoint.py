"""`output_dir/checkpoint-N/`: written by every rank at once, nothing gathered, self-describing, no pickle.

Layout (docs/CHECKPOINTS.md): config.json, generation_config.json, tokenizer files, args.json,
trainer_state.json; each rank's pieces of the weights and optimizer state in its own safetensors files
(`model-0000k-of-0000n.safetensors`, `optimizer-0000k-of-0000n.safetensors`; one process:
`model.safetensors`, `optimizer.safetensors`), keyed by HF tensor name (optimizer state
`<hf name>/moment1` etc.), HF layout; and `checkpoint.index.json`, where every piece lives. Where the
layout leaves the weights whole (one process, DP, ZeRO-1/2, pipeline parallelism with DP or ZeRO-1/2 in its
stages) the directory is also what transformers loads (with `model.safetensors.index.json` above one file); under
TP / ZeRO-3 the weights are pieces and only the final export is an HF directory.

A save goes to `checkpoint-N.tmp/`; `shard_writer` publishes it with one rename once every rank has
reported, so a crash at any point leaves either the complete new checkpoint or none. A directory named
`checkpoint-N` is complete by construction; rotation renames before deleting for the same reason, and
never removes the newest checkpoint. Resume reads the index and, per tensor, only the block the new
layout holds (`load_optimizer`); a checkpoint from before the index (one `optimizer.safetensors`) loads
the same way.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np

from pretrain_cli import atomic
from pretrain_cli.data.tokenizer import export_files
from pretrain_cli.distributed.launcher import progress
from pretrain_cli.errors import PeerFailed, UserError
from pretrain_cli.run_dir import ARGS_FILE, STATE_FILE, checkpoint_dir, checkpoints_past, list_checkpoints
from pretrain_cli.storage.checkpoint_dir import CheckpointDir, read_state
from pretrain_cli.training import shard_writer
from pretrain_cli.training.weight_source import as_float32, open_reader



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


def remove_past(output_dir, step: int) -> list[Path]:
    """Under `overwrite_output_dir`, the checkpoints past the step a run starts from (0, or the step of its
    `resume_from_checkpoint`) are an earlier run's. Left in place, rotation (which keeps the highest steps)
    would delete this run's newer saves first, and the next plain re-run would resume the earlier run; so
    they go, each as `rotate` removes one. Which ones is `checkpoints_past`'s to say (check's line and a launch.sh
    restart's name them before: `orchestration.opened.overwritten`, `distributed.launcher.rerun`)."""
    removed = []
    for path in checkpoints_past(output_dir, step):
        atomic.remove_tree(path)
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


def _block(strategy, reader, where, name: str, t, transpose: bool) -> np.ndarray:
    """This rank's block of `t` (`strategy.local_box`) read from the checkpoint's tensor `name`: fp32, Paddle
    layout, contiguous; a UserError when the saved tensor's shape is not the model's."""
    info = reader.index["tensors"][name]
    box, _ = strategy.local_box(t, name)
    box = box.transposed() if transpose else box
    if list(info["shape"]) != list(box.global_shape):
        raise UserError(f"{where}: {name} has shape {list(info['shape'])}, the model needs {list(box.global_shape)}; "
                        f"the checkpoint does not match config.json")
    arr = as_float32(reader.read(name, box.offsets, box.shape), info["dtype"])
    return np.ascontiguousarray(arr.T if transpose else arr)


def load_optimizer(strategy, model, optimizer, ckpt) -> dict:
    """The optimizer state of checkpoint `ckpt` (a path or a `CheckpointDir`) into an optimizer that is already
    AMP-decorated and laid out: for every accumulator (and O2 master weight) this rank holds, only its block
    (`strategy.local_box`) is read, from the pieces that intersect it, so any layout resumes from any other. Returns
    {"bytes_read": n, "files": the files read}."""
    import paddle

    from pretrain_cli.distributed.layout.pieces import inner_optimizer, local_value, split_name, state_tensors

    reader, where = open_reader(ckpt, "optimizer", "resume")
    inner = inner_optimizer(optimizer)
    managed = {p.name for p in inner._parameter_list}
    params = dict(model.named_parameters())
    owned = [p for p in params.values() if p.name in managed]
    # `dist.shard_optimizer`'s wrapper creates each accumulator and lays it out; the others create them whole
    # (fleet's ZeRO-1 only those of its own parameters, filtered by `managed`)
    creator = optimizer if type(optimizer).__name__ == "_ShardOptimizer" else inner
    creator._create_accumulators(paddle.static.default_main_program().global_block(), owned)
    try:
        for name, kind, t, transpose in state_tensors(model, optimizer):
            if kind != "optimizer":
                continue
            hf, slot = split_name(name)
            info = reader.index["tensors"].get(name)
            if info is None:
                if slot == "master":  # saved without O2: the (just loaded) weights themselves are the master copy
                    local_value(t).set_value(local_value(params[hf]).astype("float32"))
                    continue
                raise UserError(f"{where}: no {slot} for {hf}; the optimizer state does not match the model")
            if info["dtype"] != "F32":
                raise UserError(f"{where}: {name} is {info['dtype']}, expected F32; the file is not ours")
            local_value(t).set_value(_block(strategy, reader, where, name, t, transpose))
        return {"bytes_read": reader.bytes_read, "files": reader.opened}
    finally:
        reader.close()


def newest_state(output_dir) -> tuple[dict | None, Path | None]:
    """A run's newest complete trainer state (the highest `global_step`: the final directory's or a checkpoint's)
    and the file it came from; (None, None) when `output_dir` holds none."""
    best, where = None, None
    for path in [Path(output_dir)] + [p for _, p in list_checkpoints(output_dir)]:
        try:
            state = read_state(path)
        except UserError:
            continue
        if best is None or state["global_step"] > best["global_step"]:
            best, where = state, path / STATE_FILE
    return best, where


class Saver:
    """The trainer's saver (`trainer.Collaborators.saver`): every rank writes the pieces it owns, rank 0
    publishes once all have reported. It is handed what to save at each call and holds no model, optimizer or
    trainer (a rollback may replace them).

    Synchronous: the ranks write at once, then the others wait on the launcher's TCP store (not in a gloo
    collective, whose hard 30 s timeout a slow save would trip: docs/DISTRIBUTED.md) until rank 0 has
    published. `async_save`: each rank copies its pieces to its own host buffers (`training.async_save`) and a
    background thread per rank writes them; rank 0's thread also waits for the others' records and
    publishes; nobody waits for the write. Either way the log and metrics.jsonl say how long training stood
    still for the save.
    """

    def __init__(self, out: Path, model_cfg, comm, run_args, tokenizer_dir, dtype: str, limit: int | None,
                 async_save: bool = False, rank: int = 0, world_size: int = 1, layout: str = "single process"):
        """`rank`, `world_size`: this process in the run; `layout`: the strategy's name (the index records it)."""
        from pretrain_cli.training.async_save import AsyncWriter, HostStaging

        self.out, self.cfg, self.comm, self.run_args = Path(out), model_cfg, comm, run_args
        self.tokenizer_dir, self.dtype, self.limit = tokenizer_dir, dtype, limit
        self.rank, self.world_size, self.layout = rank, world_size, layout
        self.writer = AsyncWriter() if async_save else None
        self.staging = HostStaging() if async_save else None

    def __call__(self, step: int, pieces: list, state: dict | None) -> dict:
        """Save checkpoint-`step`: of this rank's `pieces` (`Strategy.pieces`: no copy yet) the ones it writes
        (`pieces.writer_of`), and on rank 0 the trainer `state` (a copy the caller no longer changes).
        Returns the save's event for metrics.jsonl (how long training stood still)."""
        import time

        from pretrain_cli.distributed.layout.pieces import local_value, writer_of
        from pretrain_cli.training.metrics import host_memory_gib, log

        start = time.perf_counter()
        rank = self.rank
        waited = 0.0
        if self.writer is not None:  # one save in flight: its host buffers are reused below
            self.writer.wait()
            waited = time.perf_counter() - start
        owner = writer_of(pieces)
        mine = [p for p in pieces if owner[p.name] == rank]
        if self.writer is None:
            self._write_sync(step, [(p, p.view) for p in mine], state)  # training waits: views suffice
        else:  # copied now, since training goes on changing them; laid out by the writer thread
            from pretrain_cli.training.shard_writer import layout_out

            staged = [(p, layout_out(self.staging.copy(p.name, local_value(p.tensor)), p.transpose)) for p in mine]
            world, layout = self.world_size, self.layout
            self.writer.submit(f"checkpoint-{step}", lambda: self._write(step, rank, world, layout, staged, state),
                               step)
        stall = time.perf_counter() - start
        kind = "async" if self.writer is not None else "sync"
        extra = f"; {waited:.3f} s of it waiting for the previous write" if waited > 0.001 else ""
        log.info(f"checkpoint-{step}: stalled {stall:.3f} s ({kind}{extra})")
        return {"stall_seconds": round(stall, 6), "async": self.writer is not None,
                "waited_seconds": round(waited, 6), "host_memory_peak_gib": round(host_memory_gib()[1], 4)}

    def _write_sync(self, step: int, pieces, state) -> None:
        from pretrain_cli.distributed.comms.comm import rank0_round

        if self.rank != 0:
            failed = None
            try:
                self._write(step, self.rank, self.world_size, self.layout, pieces, state)
            except OSError as e:  # its part failed (disk full), or rank 0 failed first and removed the directory
                from pretrain_cli.training.metrics import log

                log.warning(f"checkpoint-{step}: this rank's part failed ({e}); rank 0 fails the save")
                failed = e
            # rank 0 decides the save (it reads this rank's error record): ending only after rank 0 has ended, this
            # rank is never the first death its host's watchers name (its error then raced rank 0's own, and its
            # `No such file or directory` in a directory rank 0 had just removed was named as the cause)
            try:
                self.comm.wait_for_rank0(f"publishing checkpoint-{step}")
            except PeerFailed:  # rank 0 failed the save and is done with it: what this rank wrote since goes too
                shard_writer.drop(shard_writer.tmp_dir(checkpoint_dir(self.out, step)))
                raise
            if failed is not None:
                raise failed
            return
        with rank0_round(self.comm):
            self._write(step, 0, self.world_size, self.layout, pieces, state)

    def _write(self, step: int, rank: int, world: int, layout: str, pieces, state) -> None:
        """This rank's files; rank 0 also the shared files, then (every rank done) the index and the rename."""
        from pretrain_cli.models.convert import write_model_config
        from pretrain_cli.training.metrics import log

        final = checkpoint_dir(self.out, step)
        tmp = shard_writer.tmp_dir(final)
        try:
            shard_writer.write_rank(tmp, rank, world, pieces)
            if self.writer is None:  # training waits for the others' parts now: a wait, not this rank's work, and
                # given the save's allowance (a plain collective's, `hang_timeout`, killed healthy saves slower on
                # one rank than that): the rank named at a hang is then the one still writing
                progress.mark("save (waiting)", step)
            if rank != 0:
                return
            write_model_config(self.cfg, str(tmp), self.dtype)
            export_files(self.tokenizer_dir, tmp)
            atomic.write_json(tmp / ARGS_FILE, self.run_args)
            records = shard_writer.collect(tmp, world, step)
            if self.writer is None:  # every part is in: the index, the rename and the rotation are rank 0's own work
                progress.mark("save", step)
            path = shard_writer.publish(tmp, final, records, layout, state)
        except BaseException as e:
            # disk full, permissions, Ctrl-C: rank 0 drops the partial directory (frees the space it took) and
            # the CLI reports the error as one line; another rank tells rank 0; checkpoint-M is untouched
            if rank == 0:
                shard_writer.drop(tmp)
            else:
                shard_writer.report_failure(tmp, rank, e)
            raise
        removed = rotate(self.out, self.limit)
        log.info(f"saved {path}" + (f"; removed {', '.join(x.name for x in removed)}" if removed else ""))

    def wait(self) -> None:
        """The end of training and a signal stop: the write in flight is published (or its error raised)."""
        if self.writer is not None:
            self.writer.wait()

    def abandon(self, error: BaseException | None) -> None:
        """A rank other than 0 ending with `error`, its background write done (`run_end.finish`): that checkpoint's
        .tmp, unpublished, is removed when rank 0 will not publish it: this rank's write failed, or a rank did
        (`PeerFailed`), and it holds neither trainer_state.json (rank 0 publishing it: the records are gone by then) nor
        every rank's record (`async_save.publishable`)."""
        from pretrain_cli.training.async_save import publishable

        last = self.writer.last if self.writer is not None and self.rank != 0 else None
        if last is None or not (self.writer.failed or isinstance(error, PeerFailed)):
            return
        final = self.out / last
        tmp = shard_writer.tmp_dir(final)
        if not final.exists() and tmp.exists() and not publishable(tmp, self.world_size):
            shard_writer.drop(tmp)

    def newest(self, is_rank0: bool) -> Path | None:
        """Every rank: the newest complete checkpoint, the same one on all of them (a rollback's target), or
        None. Rank 0 finishes the write in flight first and names it; the others take the same one."""
        from pretrain_cli.distributed.comms.comm import rank0_round
        from pretrain_cli.run_dir import latest_checkpoint

        if is_rank0:
            with rank0_round(self.comm):
                self.wait()
                return self.comm.agree_on_resume(latest_checkpoint(self.out))
        self.comm.wait_for_rank0("finishing the checkpoint to roll back to")
        self.wait()  # this rank's own part of it is done too
        return self.comm.agree_on_resume(None)

    def load_into(self, path: Path, model, strategy, optimizer) -> None:
        """The checkpoint's weights and optimizer state written into a layout's own (whole) tensors: `model` the
        unwrapped model, `optimizer` as wrapped for `strategy`; then, as a resume does, every rank checks the
        checksums of the files it read (`weight_source.DamagedCheckpoint` on every rank when one is altered)."""
        from pretrain_cli.training.weight_source import load_weights, verify_everywhere

        ckpt = CheckpointDir.of(path)
        load_weights(model, ckpt, "checkpoint", self.comm, use="resume")
        verify_everywhere(self.comm, ckpt, load_optimizer(strategy, model, optimizer, ckpt)["files"])
