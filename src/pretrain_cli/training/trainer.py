"""The training loop: receives built objects and the run configuration's loop settings, and runs them.

Its concerns are other objects, all given at construction: the optimizer step (`step.Step` over a
`step.Layout`), saving (`checkpoint.Saver`, handed the step, this rank's pieces and the state), the spike
policy (`spike.SpikePolicy`, which acts on the run only through the members of `spike.Recoverable`), the
metrics writer and throughput meter. What remains here is the loop, its stop conditions, the bookkeeping of
skipped steps (non-finite or spike: one place) and evaluation; the log line and the records are
`train_log.TrainLog`'s, a mixin of the trainer. The data position and, under fp16, the loss scaler's
state are the only state besides weights and optimizer moments, so `state_dict()` is small JSON and a resumed
run is bitwise identical on CPU.
"""
from __future__ import annotations

import gc
import sys
import time
from dataclasses import asdict
from pathlib import Path

from pretrain_cli.data.loader import BatchIterator
from pretrain_cli.distributed.launcher import progress
from pretrain_cli.errors import UserError
from pretrain_cli.storage.checkpoint_dir import CheckpointDir
from pretrain_cli.training.evaluation import line_values, loss_sum, split_batches
from pretrain_cli.training import node_loss
from pretrain_cli.training.metrics import format_line, log
from pretrain_cli.training.spike import SpikePolicy
from pretrain_cli.training.step import Layout, Step, StepResult
from pretrain_cli.training.stop_signals import StopSignals
from pretrain_cli.training.train_log import TrainLog
from pretrain_cli.training.trainer_state import Collaborators, NonFiniteError, TrainerState
from pretrain_cli.run_config import RunConfig
from pretrain_cli.training.precision import resume_loss_scale


class Trainer(TrainLog):
    """The loop over `train_step`, with its stop conditions (max_steps, a signal, the non-finite and spike
    policies), logging, evaluation and saves. Built complete: everything it uses arrives here."""

    model = property(lambda self: self.layout.model)  # the layout's objects, read where the loop needs them
    optimizer = property(lambda self: self.layout.optimizer)
    amp = property(lambda self: self.layout.amp)
    strategy = property(lambda self: self.layout.strategy)
    raw_model = property(lambda self: self.layout.raw_model)

    def __init__(self, layout: Layout, splits, run: RunConfig, comm, collaborators: Collaborators | None = None,
                 resumed: dict | None = None, signals: StopSignals | None = None,
                 resumed_from: CheckpointDir | None = None):
        self.adopt(layout)
        self.splits, self.comm = splits, comm
        self.loop, self.schedule = run.loop, run.schedule
        self.seq_len, self.parallel, self.device = run.data.max_seq_length, run.parallel, run.device
        self.continued = run.model.continue_training  # weights (a MoE's router too) trained before this run's lineage
        c = collaborators or Collaborators()
        self.writer, self.throughput, self.saver, self.rebuild = c.writer, c.throughput, c.saver, c.rebuild
        self.spike = (SpikePolicy(run.spike, run.loop.nan_skip_limit, self.global_batch)
                      if run.spike.enabled else None)
        self.step = Step(run, comm, self.spike.guard if self.spike is not None else None)
        self.state = TrainerState()
        layers = self._expert_layers = getattr(getattr(layout.raw_model, "config", None), "expert_layers", None)
        if layers:  # (a resume's state then says what the run's first process found)
            from pretrain_cli.training.routing_watch import routers_from_init

            # from init in this run (a run from init: all); those read still in their grace counted on
            here = routers_from_init(layout.initialised, layers) if self.continued else list(layers)
            before = {i: n for i, n in layout.routers_before.items() if i not in here}
            self.state.routers_from_init = sorted({*here, *before})
            self.state.routers_steps_before = {str(i): n for i, n in before.items() if n}
            self.state.routers_named = True
        self.last_eval: dict = {}
        self._marked: tuple | None = None  # (step, the writer's mark taken as that step began logging)
        self.process_seconds = 0.0  # training wall time of this process (not summed over restarts)
        self._started: float | None = None  # when this process's training loop began, while it runs
        self._own_signals = signals is None  # (`run` restores its own after the lock: stop_signals.py)
        self.signals = signals or StopSignals()
        self.lost_nodes: list[dict] = []  # at a stop: the ranks whose launcher died (`node_loss.lost`)
        if resumed is not None:
            self.load_state_dict(resumed, resumed_from)
        # the step this process's training starts after (its resume's; 0 from the start), where the MoE counts its
        # first log line reads began (`train_log`); a spike's rollback later moves the state's step, not this
        self.resumed_step = self.state.global_step

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The trainer state as a checkpoint keeps it: `train_seconds` includes this process's loop so far, so a
        resume from a checkpoint written mid-loop carries the time spent before it (goodput over restarts)."""
        d = asdict(self.state)
        d["max_steps"] = self.loop.max_steps
        if self._started is not None:
            d["train_seconds"] += time.perf_counter() - self._started
        if self.amp.loss_scaling:  # fp16: the loss scaler's state (the same on every rank: the steps' common verdict)
            d["loss_scaler"] = self.amp.state_dict()
        return d

    def load_state_dict(self, d: dict, ckpt: CheckpointDir | None = None) -> None:
        """`d`: the trainer state of checkpoint `ckpt` (None: one of unknown origin, judged by this run's settings)."""
        known = {k: d[k] for k in asdict(self.state) if k in d}
        self.state = TrainerState(**known)
        if self.loop.ignore_data_skip:  # the data position only: the closing metrics count samples by tokens_seen
            self.state.consumed_samples = 0
        if self._expert_layers and "routers_named" not in d:
            # a state from before routers_named: a run from init's routers are all from init (it left the list
            # empty), a continued run's list was exact (none before per-layer graces, when it judged all at once);
            # named so that this lineage's later states say it themselves (`routing_watch.routers_before`). Which
            # run wrote it is the checkpoint's record's to say (its args.json), not this run's continue_training
            took = ((ckpt.args or {}).get("arguments") if ckpt is not None else None) or {}
            wrote = took.get("continue_training") if isinstance(took, dict) else None
            if not (self.continued if wrote is None else wrote):
                self.state.routers_from_init = list(self._expert_layers)
            self.state.routers_named = True
        resume_loss_scale(self.amp, d.get("loss_scaler"), ckpt)

    def release(self) -> None:
        """Let go of the model and optimizer before a rebuild, so the old and the new never hold memory at
        once (the saver holds no references of its own: it reads the trainer's at each save)."""
        self.layout = None

    def adopt(self, layout: Layout) -> None:
        """Take over the model, optimizer, precision and layout (at construction, and after a rebuild)."""
        self.layout = layout

    # ------------------------------------------------------------------ what the spike policy may do
    def newest_checkpoint(self) -> Path | None:
        """Every rank: the newest complete checkpoint, the same on all (None without a saver or checkpoint)."""
        return self.saver.newest(self.parallel.is_rank0) if self.saver is not None else None

    def reload(self, path: Path) -> dict:
        """Weights, optimizer state and trainer state from checkpoint `path` (this process's time is not undone,
        its log only past the checkpoint's step: the steps trained again log anew); returns the checkpoint's
        trainer state. The semi-auto engine's placed pieces cannot be written into mid-run, so there the layout is
        built again (`Collaborators.rebuild`)."""
        from pretrain_cli.training.weight_source import DamagedCheckpoint

        ckpt = CheckpointDir(path)
        state = ckpt.resume_state  # (its fp16 loss scale judged: a rollback loads it)
        try:
            if self.rebuild is not None:
                self.release()
                gc.collect()
                self.adopt(self.rebuild(ckpt))
            else:
                self.saver.load_into(ckpt, self.raw_model, self.strategy, self.optimizer)
        except DamagedCheckpoint as e:  # checked as a resume checks it: every file read, by its checksum
            raise UserError(f"spike rollback: {e}; the checkpoint to roll back to is damaged: resume from an earlier "
                            f"one (resume_from_checkpoint), or set spike_policy: skip") from None
        seconds = self.state.train_seconds
        history = [e for e in self.state.log_history if e.get("step", 0) <= state["global_step"]]
        self.load_state_dict(state, ckpt)
        s = self.state
        s.consumed_samples, s.train_seconds, s.log_history = state["consumed_samples"], seconds, history
        return state

    def rewind_records(self, state: dict) -> dict | None:
        """Every rank, after a rollback's reload: rank 0 cuts metrics.jsonl and the trackers back to where the
        checkpoint's mark (`state["record_files"]`) says they stood (`MetricsWriter.rewind`) and returns what it
        dropped; the others wait for it on the launcher's store, as for a save (a tracker that cannot rewind, a new
        wandb run given the history up to `REPLAY_BYTES`, takes longer than a collective waits). None where there is
        no writer."""
        from pretrain_cli.distributed.comms.comm import rank0_round

        self._marked = None  # (a mark past the cut)
        if not self.parallel.is_rank0:
            self.comm.wait_for_rank0(f"cutting the record files back to step {state['global_step']}")
            return None
        with rank0_round(self.comm):
            if self.writer is None:
                return None
            return self.writer.rewind(state["global_step"], state.get("record_files"))

    @property
    def global_batch(self) -> int:
        return self.loop.micro_batch * self.loop.grad_accum * self.parallel.data_world_size

    # ------------------------------------------------------------------ steps
    def train_step(self, batches) -> StepResult:
        """One optimizer step (`step.Step`): (loss, grad_norm, outcome, reason); the benchmarks time
        exactly this."""
        return self.step(self.layout, batches, self.state)

    # ------------------------------------------------------------------ loop
    def train(self) -> dict:
        lp = self.loop
        self.signals.listen()
        batches = self._open_batches()
        self.model.train()
        start = self._started = time.perf_counter()
        stopped_by_signal, reported, reported_gone = False, False, False
        bar = self._progress_bar()
        try:
            while self.state.global_step < lp.max_steps:
                if self._skip_ahead():  # a rolled-back window starts here: jump over it
                    batches.close()
                    batches = self._open_batches()
                first_sample = self.state.consumed_samples
                self._note_epochs(first_sample)
                result = self.train_step(batches)
                self.state.consumed_samples += self.global_batch
                if result.outcome == "spike":
                    if self.spike.handle(self, result.reason, result.loss, result.grad_norm, first_sample):
                        batches.close()
                        batches = self._open_batches()
                    continue
                if result.outcome == "non_finite":
                    self._non_finite(result.loss, result.grad_norm, first_sample)
                    continue
                loss, norm = result.loss, result.grad_norm
                self._account(loss)
                if not reported:  # the optimizer state exists from the first update on
                    self._report_layout()
                    reported = True
                step = self.state.global_step
                if bar is not None:
                    bar.update(1)
                saving = step % lp.save_steps == 0 or step == lp.max_steps  # the last step is resumable too
                if saving and self.writer is not None:  # rank 0: where the record files stand before this step's
                    self._marked = (step, self.writer.mark())  # records, for its checkpoint (record_files)
                if step % lp.logging_steps == 0 or (lp.logging_first_step and step == 1) or step == lp.max_steps:
                    self._log(norm)
                    if bar is not None:
                        bar.set_postfix(loss=f"{self.state.log_history[-1]['loss']:.4f}", refresh=False)
                if lp.do_eval and step % lp.eval_steps == 0:
                    self.evaluate("valid")
                    self.model.train()
                asked = self.signals.requested  # (read once: a signal landing after this is the next step's)
                if asked and not reported_gone:  # its launcher died: said for the other nodes before they agree
                    reported_gone = node_loss.report(self.comm, self.comm.rank)
                stop = self.comm.any(asked)
                if stop:  # agreed, maybe on another rank's signal: from here on none interrupts this rank's save
                    self.signals.hold(step)
                    self.lost_nodes = node_loss.lost(self.comm)  # ranks whose launcher died, this one's alive
                if saving or stop:
                    self._save(stopping=stop)
                if stop:  # (this rank's own signal, or another rank's: `comm.any`)
                    stopped_by_signal, self.signals.requested = step < lp.max_steps, True
                    break
        finally:
            self.process_seconds = time.perf_counter() - start
            self.state.train_seconds += self.process_seconds
            self._started = None
            batches.close()
            if self.signals.requested:  # until `run` has written its last files and released its lock
                self.signals.hold()
            elif self._own_signals:
                self.signals.restore()
            elif sys.exc_info()[0] is not None:  # an error ends the loop (a full disk's save, a rank 0 gone): said so
                self.signals.ending()
            else:  # the last step is saved: `run` evaluates and exports, a signal there said and ignored
                self.signals.finishing()
            if bar is not None:
                bar.close()
        return {"stopped_by_signal": stopped_by_signal}

    def _open_batches(self) -> BatchIterator:
        lp, topo = self.loop, self.strategy.topology
        return BatchIterator(self.splits.train, self.state.consumed_samples, lp.micro_batch, topo.data_rank,
                             topo.data_world_size, prefetch=lp.prefetch)  # 0: read in the step (~0.1 ms)

    def _note_epochs(self, first_sample: int) -> None:
        """One line where the step about to run wraps around the train split (a source's, in a blend): the run is
        past one reading of its data, which a long run on a small corpus reaches unnoticed otherwise. A global batch
        larger than an epoch starts several at once: one line for them (it was a line each, 82 at step 1 of the
        demo's 2,434-sample split at 100,000 sequences a step)."""
        begun: dict[str, list[int]] = {}
        for name, epoch in self.splits.train.epochs_begun(first_sample, self.global_batch):
            if epoch > 0:
                begun.setdefault(name, []).append(epoch + 1)
        for name, epochs in begun.items():
            which = f"epoch {epochs[0]}" if len(epochs) == 1 else \
                f"epochs {epochs[0]}-{epochs[-1]} (its global batch holds more than an epoch)"
            log.info(f"data: step {self.state.global_step + 1} starts {which} of {name}'s train split: its samples "
                     f"again, in a new order")

    def _skip_ahead(self) -> bool:
        """Move past recorded batches that must not be trained (rollback windows); True if it moved."""
        s, moved = self.state, False
        if s.rollbacks and s.skipped_batches and max(s.skipped_batches) >= s.consumed_samples:
            pending = set(s.skipped_batches)
            while s.consumed_samples in pending:
                s.consumed_samples += self.global_batch
                moved = True
        return moved

    def _account(self, loss: float) -> None:
        s = self.state
        s.consecutive_skips = 0
        s.global_step += 1
        s.tokens_seen += self.global_batch * self.seq_len
        s.interval_loss += loss  # this rank's: the ranks' mean is taken at the log line (and at a save)
        s.interval_steps += 1
        if self.throughput is not None:
            self.throughput.step()

    def _non_finite(self, loss: float, norm: float, first_sample: int) -> None:
        step = self.state.global_step + 1
        if self.loop.nan_policy == "stop":
            raise NonFiniteError(f"step {step}: loss {loss} / gradient norm {norm} is not finite; stopped without "
                                 f"saving (the last checkpoint is intact). Lower learning_rate, check the data, "
                                 f"or set nan_policy: skip")
        in_a_row, total = self.skip(first_sample)
        log.warning(f"step {step}: non-finite loss {loss} / grad norm {norm}; update skipped "
                    f"({in_a_row} in a row, {total} in total)")
        if in_a_row >= self.loop.nan_skip_limit:
            raise NonFiniteError(f"step {step}: {in_a_row} consecutive non-finite steps "
                                 f"(nan_skip_limit {self.loop.nan_skip_limit}); stopped")

    # ------------------------------------------------------------------ skipped steps (non-finite, spike)
    def skip(self, first_sample: int) -> tuple[int, int]:
        """Book a step whose update was withheld (non-finite or a spike): its batch is consumed and recorded,
        the step is not counted. Returns (skips in a row, skips in total)."""
        s = self.state
        s.skipped_steps += 1
        s.consecutive_skips += 1
        s.skipped_batches.append(first_sample)
        return s.consecutive_skips, s.skipped_steps

    def note_rollback(self, skipped_batches: list, rollbacks: list) -> None:
        """After a rollback's reload: the batches to jump over from now on, and every rollback so far."""
        self.state.skipped_batches, self.state.rollbacks = skipped_batches, rollbacks

    def _save(self, stopping: bool = False) -> None:
        progress.mark("save", self.state.global_step)
        if self.saver is not None:
            pieces = self.strategy.pieces(self.raw_model, self.optimizer)  # no collective, no copy
            # the losses since the last log line as the ranks' mean: rank 0 writes the state every rank resumes from
            self.state.interval_loss = self.comm.mean(self.state.interval_loss)
            state = self.state_dict() if self.parallel.is_rank0 else None  # (a deep copy)
            if state is not None and self.writer is not None:  # (a stop between saves: the files as they are now)
                step, marks = self._marked or (None, None)
                state["record_files"] = marks if step == self.state.global_step else self.writer.mark()
            self.record_event("checkpoint", self.saver(self.state.global_step, pieces, state))
        if self.writer is not None and self.state.global_step < self.loop.max_steps:
            # rank 0: the loss curve up to this checkpoint; the one at max_steps is the final export's to draw, with
            # the run's last evaluation in it (a drawing is 0.4-0.9 CPU-s: a third of a short CPU run's time)
            self.writer.plot(stopping)

    # ------------------------------------------------------------------ eval
    def evaluate(self, split: str = "valid") -> dict:
        """Loss over the same `eval_iters` batches every time, so curves are comparable (the test split: `test_iters`,
        PaddleNLP's ten times as many)."""
        bs, p = self.loop.eval_batch, self.parallel
        iters = self.loop.eval_iters if split == "valid" else self.loop.test_iters
        progress.mark("eval", self.state.global_step)
        start = time.perf_counter()
        topo = self.strategy.topology
        batches = split_batches(self.splits.get(split), bs, iters, topo.data_rank, topo.data_world_size)
        total, count, _ = loss_sum(self.model, batches, self.amp.autocast, shard=self.strategy.shard_batch,
                                   to_host=self.strategy.to_host)
        # each rank summed its data rank's slice, which its stages and tp ranks share
        if not self.strategy.global_batch:
            copies = topo.world_size // topo.data_world_size
            total, count = self.comm.sum(total) / copies, self.comm.sum(count) / copies
        loss = total / max(count, 1.0)
        runtime = time.perf_counter() - start
        prefix = "eval" if split == "valid" else "test"
        values = line_values(prefix, loss, count, runtime, iters, iters * bs * p.data_world_size,
                             self.state.global_step, self.loop.max_steps)
        log.info(format_line(values))
        self._record(prefix, values)
        if split == "valid":
            self.last_eval = values
        return values
