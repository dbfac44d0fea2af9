"""The training loop: receives built objects (model, optimizer, schedule, data) and runs them.

`train_step` is one optimizer step: `acc` micro-batches of forward/backward, the global gradient
norm (used for clipping, logging and the non-finite policy), the update. Nothing else syncs
with the host inside a step. Data position is the only state besides weights and optimizer
moments, so `state_dict()` is small JSON and a resumed run is bitwise identical on CPU.
"""
from __future__ import annotations

import contextlib
import math
import signal
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from pretrain_cli.data.loader import BatchIterator, batch_hash, micro_batch
from pretrain_cli.loss import causal_lm_loss, causal_lm_loss_sum, loss_kernel
from pretrain_cli.metrics import format_line, host_memory_gib, log


class NonFiniteError(Exception):
    """Loss or gradient became NaN/inf under `nan_policy: stop` (or too many consecutive skips)."""


@dataclass
class TrainerState:
    global_step: int = 0
    consumed_samples: int = 0  # global training samples consumed (all data ranks)
    tokens_seen: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0
    train_seconds: float = 0.0  # summed over restarts (goodput)
    last_batch_hash: str = ""
    loss_sum: float = 0.0  # sum of per-step losses, for the run's mean train_loss
    interval_loss: float = 0.0  # losses since the last log line: a resume logs the same averages
    interval_steps: int = 0
    log_history: list = field(default_factory=list)


def split_loss(model, dataset, batch_size: int, batches: int, data_rank: int = 0, data_world: int = 1,
               autocast=None) -> tuple[float, float]:
    """(sum of token losses, counted tokens) over this rank's slice of the first `batches` global eval
    batches: the same batches every time, for the trainer's evaluation and `pretrain-cli eval --config`."""
    import paddle

    model.eval()
    total, count = 0.0, 0.0
    with paddle.no_grad():
        for k in range(batches):
            batch = micro_batch(dataset, k * batch_size * data_world, batch_size, data_rank, data_world)
            ids, labels = paddle.to_tensor(batch["input_ids"]), paddle.to_tensor(batch["labels"])
            with autocast() if autocast else contextlib.nullcontext():
                logits = model(ids)
            s, c = causal_lm_loss_sum(logits, labels, loss_kernel(model))
            total, count = total + float(s), count + float(c)
    return total, count


class Trainer:
    def __init__(self, model, optimizer, schedule, splits, args, resolved, parallel, throughput, writer=None,
                 save_fn=None, amp=None, comm=None):
        self.model, self.optimizer, self.schedule, self.splits = model, optimizer, schedule, splits
        self.args, self.t, self.resolved, self.parallel = args, args.training, resolved, parallel
        self.throughput, self.writer, self.save_fn = throughput, writer, save_fn
        self.amp = amp  # AmpContext or None (fp32)
        self.comm = comm  # parallel.Comm: all-reduce helpers; None for one process
        self.state = TrainerState()
        self.last_eval: dict = {}
        self.process_seconds = 0.0  # training wall time of this process (not summed over restarts)
        self.stop_requested = False

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        d = asdict(self.state)
        d["max_steps"] = self.t.max_steps
        return d

    def load_state_dict(self, d: dict) -> None:
        known = {k: d[k] for k in asdict(self.state) if k in d}
        self.state = TrainerState(**known)
        if self.t.ignore_data_skip:
            self.state.consumed_samples = 0

    # ------------------------------------------------------------------ steps
    def _forward_loss(self, batch):
        import paddle

        ids = paddle.to_tensor(batch["input_ids"])  # int64 [bsz, seq_len]
        labels = paddle.to_tensor(batch["labels"])
        with self.amp.autocast() if self.amp else contextlib.nullcontext():
            logits = self.model(ids)
        return causal_lm_loss(logits, labels, loss_kernel(self.model))

    def _grad_params(self):
        return self.comm.grad_params(self.model) if self.comm else self.model.parameters()

    def _grad_norm(self):
        import paddle

        # one `squared_l2_norm` kernel per parameter (what Paddle's ClipGradByGlobalNorm uses) instead
        # of square + sum and a full-size temporary; [1] each, reshaped to a 0-D total
        sq_l2 = paddle._C_ops.squared_l2_norm
        squares = [sq_l2(g if g.dtype == paddle.float32 else g.astype("float32"))
                   for g in (p.grad for p in self._grad_params()) if g is not None]
        if self.comm is None:
            return paddle.sqrt(paddle.add_n(squares)).reshape([]) if squares else paddle.zeros([])
        sq = paddle.add_n(squares).reshape([]) if squares else paddle.zeros([], dtype="float32")
        return paddle.sqrt(self.comm.reduce_norm_sq(sq))  # ZeRO-1: owners' parts summed over sharding ranks

    def train_step(self, batches) -> tuple[float, float, bool]:
        """One optimizer step over `acc` micro-batches; returns (loss, grad_norm, applied)."""
        acc = self.t.gradient_accumulation_steps
        self.optimizer.set_lr(self.schedule.lr_at(self.state.global_step + 1))
        total = None
        for i in range(acc):
            batch = next(batches)
            sync = self.comm.no_sync(self.model) if (self.comm and i < acc - 1) else contextlib.nullcontext()
            with sync:
                loss = self._forward_loss(batch) / acc
                if self.amp and self.amp.scaler is not None:
                    self.amp.scaler.scale(loss).backward()
                else:
                    loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        self.state.last_batch_hash = batch_hash(batch)
        if self.comm is not None:
            self.comm.sync_grads(self.optimizer)
        if self.amp and self.amp.scaler is not None:
            self.amp.scaler.unscale_(self.optimizer)
        norm = self._grad_norm()
        stats = np.array([float(total), float(norm)], dtype=np.float64)  # the one host sync of the step
        loss_v, norm_v = float(stats[0]), float(stats[1])
        if not math.isfinite(norm_v) and math.isfinite(loss_v) and self.amp and self.amp.scaler is not None:
            # fp16 overflow, routine with a large scale: the scaler skips this update and lowers the scale
            # (PaddleNLP counts the step too); only a non-finite loss is a NaN for nan_policy
            self.amp.scaler.step(self.optimizer)
            self.amp.scaler.update()
            self.optimizer.clear_grad()
            log.warning(f"step {self.state.global_step + 1}: fp16 overflow, update skipped by the loss scaler")
            return loss_v, norm_v, True
        if not (math.isfinite(loss_v) and math.isfinite(norm_v)):
            self.optimizer.clear_grad()
            if self.amp and self.amp.scaler is not None:
                self.amp.scaler.update()
            return loss_v, norm_v, False
        if self.t.max_grad_norm > 0 and norm_v > self.t.max_grad_norm:
            import paddle

            coef = self.t.max_grad_norm / (norm_v + 1e-6)
            with paddle.no_grad():
                for p in self._grad_params():
                    if p.grad is not None:
                        p.grad.scale_(coef)
        if self.amp and self.amp.scaler is not None:
            self.amp.scaler.step(self.optimizer)
            self.amp.scaler.update()
        elif self.comm is not None:
            self.comm.step(self.optimizer)
        else:
            self.optimizer.step()
        self.optimizer.clear_grad()
        return loss_v, norm_v, True

    # ------------------------------------------------------------------ loop
    def _install_signal_handlers(self):
        def handler(signum, frame):
            self.stop_requested = True
            log.warning(f"received {signal.Signals(signum).name}: finishing the current step, then saving")

        old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
        return lambda: [signal.signal(s, h) for s, h in old.items()]

    def train(self) -> dict:
        t, p = self.t, self.parallel
        bs, dws = t.per_device_train_batch_size, p.data_world_size
        global_batch = bs * t.gradient_accumulation_steps * dws
        restore = self._install_signal_handlers()
        batches = BatchIterator(self.splits.train, self.state.consumed_samples, bs, p.data_rank, dws,
                                prefetch=t.dataloader_num_workers)  # 0: read in the step (~0.1 ms a batch)
        self.model.train()
        start = time.perf_counter()
        stopped_by_signal = False
        bar = self._progress_bar()
        try:
            while self.state.global_step < t.max_steps:
                loss, norm, applied = self.train_step(batches)
                self.state.consumed_samples += global_batch
                if not applied:
                    self._non_finite(loss, norm)
                    continue
                self.state.consecutive_skips = 0
                self.state.global_step += 1
                step = self.state.global_step
                self.state.tokens_seen += global_batch * self.args.data.max_seq_length
                self.state.loss_sum += loss
                self.state.interval_loss += loss
                self.state.interval_steps += 1
                self.throughput.step()
                if bar is not None:
                    bar.update(1)
                if step % t.logging_steps == 0 or (t.logging_first_step and step == 1) or step == t.max_steps:
                    self._log(norm)
                    if bar is not None:
                        bar.set_postfix(loss=f"{self.state.log_history[-1]['loss']:.4f}", refresh=False)
                if t.do_eval and step % self.resolved.eval_steps == 0:
                    self.evaluate("valid")
                    self.model.train()
                stop = self._agree(self.stop_requested)
                if step % t.save_steps == 0 or stop:
                    self._save()
                if stop:
                    stopped_by_signal = step < t.max_steps
                    break
        finally:
            self.process_seconds = time.perf_counter() - start
            self.state.train_seconds += self.process_seconds
            batches.close()
            restore()
            if bar is not None:
                bar.close()
        return {"stopped_by_signal": stopped_by_signal}

    def _progress_bar(self):
        """tqdm with ETA on rank 0: `disable_tqdm` false shows it, true hides it, unset shows it on a terminal only
        (a bar redrawn into a log file or a launcher's workerlog is noise)."""
        import sys

        hidden = self.t.disable_tqdm if self.t.disable_tqdm is not None else not sys.stderr.isatty()
        if hidden or self.parallel.rank != 0:
            return None
        from tqdm import tqdm

        return tqdm(total=self.t.max_steps, initial=self.state.global_step, desc="train", unit="step",
                    dynamic_ncols=True, mininterval=1.0)

    def _agree(self, flag: bool) -> bool:
        """All ranks stop at the same step, or none does (a stop on one rank alone would hang the rest)."""
        return self.comm.any(flag) if self.comm else flag

    def _non_finite(self, loss: float, norm: float) -> None:
        step = self.state.global_step + 1
        if self.t.nan_policy == "stop":
            raise NonFiniteError(f"step {step}: loss {loss} / gradient norm {norm} is not finite; stopped without "
                                 f"saving (the last checkpoint is intact). Lower learning_rate, check the data, "
                                 f"or set nan_policy: skip")
        self.state.skipped_steps += 1
        self.state.consecutive_skips += 1
        log.warning(f"step {step}: non-finite loss {loss} / grad norm {norm}; update skipped "
                    f"({self.state.consecutive_skips} in a row, {self.state.skipped_steps} in total)")
        if self.state.consecutive_skips >= self.t.nan_skip_limit:
            raise NonFiniteError(f"step {step}: {self.state.consecutive_skips} consecutive non-finite steps "
                                 f"(nan_skip_limit {self.t.nan_skip_limit}); stopped")

    def _log(self, grad_norm: float) -> None:
        loss = self.state.interval_loss / max(1, self.state.interval_steps)
        if self.comm:
            loss = self.comm.mean(loss)
        values = {"loss": loss, "learning_rate": self.schedule.lr_at(self.state.global_step),
                  "global_step": self.state.global_step}
        values.update(self.throughput.interval())
        if not self.t.skip_memory_metrics or self.resolved.device == "cpu":
            cur, peak = host_memory_gib()
            values.update({"host_memory_gib": round(cur, 4), "host_memory_peak_gib": round(peak, 4)})
        if self.resolved.device == "gpu":
            import paddle

            values.update({"max_memory_allocated": round(paddle.device.cuda.max_memory_allocated() / 2**30, 4),
                           "max_memory_reserved": round(paddle.device.cuda.max_memory_reserved() / 2**30, 4)})
        values.update({"grad_norm": round(grad_norm, 6), "tokens_seen": self.state.tokens_seen,
                       "consumed_samples": self.state.consumed_samples, "batch_hash": self.state.last_batch_hash,
                       "progress_or_epoch": round(self.state.global_step / self.t.max_steps, 4)})
        self.state.interval_loss, self.state.interval_steps = 0.0, 0
        log.info(format_line(values))
        self._record("train", values)

    def _record(self, kind: str, values: dict) -> None:
        self.state.log_history.append({"kind": kind, "step": self.state.global_step, **values})
        del self.state.log_history[:-200]
        if self.writer is not None:
            self.writer.write(kind, self.state.global_step, values)

    def _save(self) -> None:
        if self.save_fn is not None:
            self.save_fn(self)

    # ------------------------------------------------------------------ eval
    def evaluate(self, split: str = "valid") -> dict:
        """Loss over the same `eval_iters` batches every time, so curves are comparable."""
        import paddle

        bs, p = self.t.per_device_eval_batch_size, self.parallel
        start = time.perf_counter()
        total, count = split_loss(self.model, self.splits.get(split), bs, self.t.eval_iters, p.data_rank,
                                  p.data_world_size, self.amp.autocast if self.amp else None)
        if self.comm:
            total, count = self.comm.sum(total), self.comm.sum(count)
        loss = total / max(count, 1.0)
        runtime = time.perf_counter() - start
        prefix = "eval" if split == "valid" else "test"
        values = {f"{prefix}_loss": loss, f"{prefix}_ppl": round(math.exp(min(loss, 50.0)), 4),
                  f"{prefix}_runtime": round(runtime, 4),
                  f"{prefix}_samples_per_second": round(self.t.eval_iters * bs * p.data_world_size / runtime, 4),
                  f"{prefix}_tokens": int(count), "global_step": self.state.global_step}
        log.info(format_line(values))
        self._record(prefix, values)
        if split == "valid":
            self.last_eval = values
        return values
