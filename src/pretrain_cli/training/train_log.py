"""What a training run records of itself: the train log line's values (`_log`), the history the trainer state keeps
and metrics.jsonl's records (`_record`, `record_event`), the routing-collapse warning of a MoE model
(`training.routing_watch`), the one-time layout report and rank 0's progress bar.

A mixin of `trainer.Trainer`, apart from the loop so the loop reads as its stop conditions and bookkeeping: it
uses the trainer's `state`, `loop`, `schedule`, `parallel`, `device`, `comm`, `layout`, `continued`,
`resumed_step` and its collaborators `writer` and `throughput`, and changes nothing of the state but the log-interval
losses and the history.
"""
from __future__ import annotations

import sys

from pretrain_cli.training.metrics import (ETA_WINDOW, device_memory_gib, format_line, host_memory_gib, log,
                                          paddlenlp_first)
from pretrain_cli.training.closing import progress_or_epoch


class TrainLog:
    """The trainer's records: log lines, metrics.jsonl, the kept history, the progress bar."""

    def _log(self, grad_norm: float) -> None:
        s = self.state
        mean = self.comm.mean(s.interval_loss / max(1, s.interval_steps))  # every data rank's batches
        s.loss_sum += mean * s.interval_steps  # the run's train_loss: the ranks' mean, as the log line's
        values = {"loss": mean,
                  "learning_rate": self.schedule.lr_at(s.global_step), "global_step": s.global_step}
        if self.schedule.phase(s.global_step):  # warmup_stable_decay: warmup, stable, decay
            values["lr_phase"] = self.schedule.phase(s.global_step)
        values["eta"] = self.throughput.time_remaining(self.loop.max_steps - s.global_step)  # the recent step rate
        values.update(self.throughput.interval())
        if self.loop.memory_metrics:
            cur, peak = host_memory_gib()
            values.update({"host_memory_gib": round(cur, 4), "host_memory_peak_gib": round(peak, 4)})
        if self.device == "gpu":
            values.update(device_memory_gib())
        values.update({"grad_norm": round(grad_norm, 6), "tokens_seen": s.tokens_seen,
                       "consumed_samples": s.consumed_samples, "batch_hash": s.last_batch_hash,
                       "progress_or_epoch": progress_or_epoch(s.global_step, self.loop.max_steps)})
        cfg = getattr(self.layout.raw_model, "config", None)  # MoE: router losses, load; MTP (dense too): its loss
        if getattr(cfg, "sparse_layers", None) or getattr(cfg, "num_nextn_predict_layers", 0):
            from pretrain_cli.models.moe_loss import log_values

            values.update(log_values(self.layout.raw_model, self.layout.strategy))
        s.interval_loss, s.interval_steps = 0.0, 0
        values = paddlenlp_first(values)  # PaddleNLP's keys in its order, then ours
        log.info(format_line(values))
        self._record("train", values)
        if "moe_expert_share_per_layer" in values:
            self._watch_routing(values)

    def _watch_routing(self, values: dict) -> None:
        """A MoE layer collapsed onto one expert (`routing_watch`): a warning and a `routing_collapse` record,
        once per layer; an interval that dropped many assignments under capacity_factor: a warning and a
        `tokens_dropped` record, again only when worse. Every rank sees the same shares (gathered over the ranks), so
        every rank's log agrees."""
        from pretrain_cli.models.moe_loss import router_terms
        from pretrain_cli.training.routing_watch import CollapseWatch, steps_before

        model = self.layout.raw_model
        watch = getattr(self, "_collapse_watch", None)
        if watch is None:
            cfg = model.config
            watch = self._collapse_watch = CollapseWatch(cfg.num_experts, cfg.num_experts_per_tok, cfg.expert_layers,
                                                         self.schedule.warmup_steps, cfg.num_hidden_layers,
                                                         from_init=self.state.routers_from_init if self.continued
                                                         else True,
                                                         before=steps_before(self.state.routers_steps_before),
                                                         resumed_at=self.resumed_step)
            if (note := watch.note(self.loop.max_steps)) is not None:
                log.info(f"note: {note}")
        for layer, share in watch.see(values["moe_expert_share_per_layer"], self.state.global_step):
            rate, coef = float(model.moe.bias_update_rate or 0.0), router_terms(model).aux_coef
            log.warning(watch.message(self.state.global_step, layer, share, rate, coef))
            self.record_event("routing_collapse", {"layer": layer, "max_expert_share": share,
                                                   "top_k": watch.top_k, "experts": watch.experts,
                                                   "moe_router_bias_update_rate": rate,
                                                   "router_aux_loss_coef": coef})
        share = values.get("moe_dropped_share", 0.0)
        if share and watch.dropping(share):
            per_layer, moe = values.get("moe_dropped_share_per_layer", []), model.moe
            cap = moe.expert_capacity(self.loop.micro_batch * self.seq_len, watch.top_k, watch.experts)
            log.warning(watch.drop_message(self.state.global_step, share, per_layer, moe.capacity_factor, cap))
            self.record_event("tokens_dropped", {"dropped_share": round(share, 4), "dropped_share_per_layer": per_layer,
                                                 "since_step": watch.first, "capacity_factor": moe.capacity_factor,
                                                 "expert_capacity": cap})

    def record_event(self, kind: str, values: dict, step: int | None = None) -> None:
        """An event (a spike, a save's stall) in metrics.jsonl only: the trainer state stays small."""
        if self.writer is not None:
            self.writer.write(kind, self.state.global_step if step is None else step, values)

    def record_closing(self, values: dict) -> None:
        """The run's closing metrics (`training.closing`), once, at its end: in the kept history, which PaddleNLP's
        log_history ends with too, and in metrics.jsonl and the trackers."""
        from pretrain_cli.training.closing import RECORD_KIND

        self._record(RECORD_KIND, values)

    def _record(self, kind: str, values: dict) -> None:
        self.state.log_history.append({"kind": kind, "step": self.state.global_step, **values})
        del self.state.log_history[:-200]
        if self.writer is not None:
            self.writer.write(kind, self.state.global_step, values)

    def _report_layout(self) -> None:
        """What each rank holds (parameters, optimizer state): one log line, and with several processes a
        `layout` record in metrics.jsonl."""
        mine = self.strategy.local_bytes(self.model, self.optimizer)
        if self.layout.resume_bytes_read is not None:  # checkpoint bytes this rank read to resume
            mine["resume_bytes_read"] = self.layout.resume_bytes_read
        ranks = self.comm.gather_object(mine)
        mib = lambda b: f"{b / 2**20:.2f} MiB"  # noqa: E731
        held = "; ".join(f"rank {r} parameters {mib(x['parameters'])}, optimizer state {mib(x['optimizer_state'])}"
                         for r, x in enumerate(ranks))
        log.info(f"layout: {self.strategy.name}; {held}")
        if self.writer is not None and self.parallel.distributed:
            self.writer.write("layout", self.state.global_step, {"strategy": self.strategy.name, "per_rank": ranks})

    def _progress_bar(self):
        """tqdm with ETA on rank 0: shown when asked, or by default only on a terminal (a bar redrawn into a
        log file or a launcher's workerlog is noise)."""
        shown = self.loop.progress_bar if self.loop.progress_bar is not None else sys.stderr.isatty()
        if not shown or not self.parallel.is_rank0:
            return None
        from tqdm import tqdm

        # its remaining time from the recent rate, as the log line's `eta`: an average over ~ETA_WINDOW steps
        return tqdm(total=self.loop.max_steps, initial=self.state.global_step, desc="train", unit="step",
                    dynamic_ncols=True, mininterval=1.0, smoothing=2 / (ETA_WINDOW + 1))
