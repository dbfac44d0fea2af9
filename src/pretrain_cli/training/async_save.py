"""The background checkpoint writer behind `async_save: true`.

A save stalls training only for the copy of this rank's pieces of the weights and optimizer state to
host memory (numpy, owned by the snapshot); one thread per rank then writes them through the same
code as a synchronous save (`checkpoint.Saver._write`: temporary directory, fsync, rank 0's one rename
once every rank has reported), never a collective, so a directory named `checkpoint-N` is complete by
construction whichever threads wrote it, and a kill -9 mid-write leaves only `checkpoint-N.tmp/`, which
the next start removes.

At most one save is in flight: the next `submit` first waits for the previous one (torchtitan and
Megatron do the same; two would double the host memory). A writer's error is kept and raised in the
training thread at the next `submit` or `wait`, so it surfaces as the CLI's one line (an `OSError`
naming the file) rather than as a dead thread.

A rank other than 0 never waits for rank 0's verdict on a background write (a synchronous save does), so after
rank 0 failed a save and removed its checkpoint-N.tmp/, such a rank still writing made it again (its files, its
record) and the failed save left it behind: that rank removes it as it ends with an error
(`checkpoint.Saver.abandon`), unless it holds trainer_state.json or every rank's record (`publishable`: rank 0 may be
renaming it).

While a write is in flight the rank's progress record says which checkpoint it writes (`progress.writing`): the
rank's phase is its training thread's, so a rank stopped, killed or hung during the write was named "in
forward/backward at step 8" by the watchers, with no word of checkpoint-6, which the stop leaves unsaved
(`distributed.launcher.unsaved`). A wait for a write in flight that lasts `NOTE_AFTER` s is said once (`wait`): a
stop by signal, the end of training and the next save wait for it in silence otherwise, which a slow or stalled file
system made look like a hung stop.
"""
from __future__ import annotations

import threading

from pretrain_cli.distributed.launcher import progress

NOTE_AFTER = 10.0  # seconds of waiting for a write in flight before the log says what it waits for


class AsyncWriter:
    def __init__(self):
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last: str | None = None  # what the last write submitted wrote (`submit`'s `what`)
        self.failed = False  # whether that write raised
        self._began = 0.0  # time.monotonic() of the last write's submit

    def submit(self, what: str, fn, step: int = 0) -> float:
        """Start `fn()` in the background once the previous write is done; returns the seconds spent waiting.
        `step`: the checkpoint it writes, in this rank's progress record while it runs (0: none said)."""
        import time

        start = time.perf_counter()
        self.wait()
        waited = time.perf_counter() - start

        self.last, self.failed, self._began = what, False, time.monotonic()

        def work():
            progress.writing(step)
            try:
                fn()
            except BaseException as e:  # raised in the training thread by the next submit / wait
                self._error, self.failed = e, True
            finally:
                progress.writing(None)

        self._thread = threading.Thread(target=work, name=f"save {what}", daemon=True)
        self._thread.start()
        return waited

    def wait(self) -> None:
        """Block until the write in flight (if any) is published; raise its error, if it had one. Said once when the
        wait lasts `NOTE_AFTER` s."""
        if self._thread is not None:
            self._thread.join(NOTE_AFTER)
            if self._thread.is_alive():
                import time

                from pretrain_cli.training.metrics import log

                log.info(f"{self.last}: waiting for its background write (under way for "
                         f"{time.monotonic() - self._began:.0f} s) to finish before going on")
                self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error


class HostStaging:
    """Host buffers for the snapshot, allocated at the first save and reused by every later one.

    Copying into an existing buffer (`paddle.assign`) is ~4x faster than `Tensor.numpy()`, which allocates
    (and page-faults) fresh memory at every save: 0.2 s against 0.8 s for 450 MiB on the 2-core CI
    machine. The numpy arrays handed to the writer are views of these buffers (DLPack, no copy); reusing
    them is safe because a save first waits for the previous write. Tensors not on the CPU or not fp32
    (bf16 has no numpy dtype) are copied with `.numpy()`.
    """

    def __init__(self):
        self._bufs: dict = {}

    def copy(self, key: str, tensor):
        import numpy as np
        import paddle

        if not (tensor.place.is_cpu_place() and tensor.dtype == paddle.float32):
            return tensor.numpy()
        held = self._bufs.get(key)
        if held is None or list(held[0].shape) != list(tensor.shape):
            buf = paddle.empty(tensor.shape, dtype=tensor.dtype)
            held = self._bufs[key] = (buf, np.from_dlpack(buf))
        paddle.assign(tensor, output=held[0])
        return held[1]


def publishable(tmp, world: int) -> bool:
    """Whether rank 0 may be publishing checkpoint-N.tmp/ `tmp`, so another rank must not remove it: it holds
    trainer_state.json (`shard_writer.publish` writes it once every record is in, then deletes the records before its
    fsync and rename), or every rank's completion record and no error (`shard_writer.collect` waits for all of them)."""
    import json

    from pretrain_cli.training.shard_writer import RECORD

    if (tmp / "trainer_state.json").is_file():
        return True
    for rank in range(world):
        try:
            record = json.loads((tmp / RECORD.format(rank)).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        if not isinstance(record, dict) or "error" in record or "lost" in record:
            return False
    return True
