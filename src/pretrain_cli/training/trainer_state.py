"""What the training loop is given and what it carries across a restart: `TrainerState` (the data position, the
skipped batches and rollbacks, the loss bookkeeping, the history: small JSON that `Trainer.state_dict` writes
into every checkpoint), `Collaborators` (what it reports to and saves through) and `NonFiniteError` (how
`nan_policy: stop` ends it)."""
from __future__ import annotations

from dataclasses import dataclass, field


class NonFiniteError(Exception):
    """Loss or gradient became NaN/inf under `nan_policy: stop` (or too many consecutive skips)."""


@dataclass
class TrainerState:
    global_step: int = 0
    consumed_samples: int = 0  # global training samples consumed (all data ranks)
    tokens_seen: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0
    skipped_batches: list = field(default_factory=list)  # consumed_samples where a skipped step's batch began
    # (non-finite and spike skips behind; rollback windows possibly ahead: the loop jumps over them)
    spike_stats: dict = field(default_factory=dict)  # running means of the spike guard (training.spike)
    rollbacks: list = field(default_factory=list)  # {"spike_step", "checkpoint_step", "window": [start, end)}
    train_seconds: float = 0.0  # summed over restarts (goodput)
    last_batch_hash: str = ""
    loss_sum: float = 0.0  # sum of the logged steps' losses (the ranks' mean), for the run's mean train_loss
    interval_loss: float = 0.0  # losses since the last log line: a resume logs the same averages
    interval_steps: int = 0
    log_history: list = field(default_factory=list)
    # the MoE layers whose router started from init in this lineage (a run from init: all; a continued one those
    # the load took from init, `routing_watch.routers_from_init`, or a run of ours left so, `routers_before`), and
    # the steps those trained before it (str(layer): steps), kept so a resumed process gives them the rest of the
    # grace too, and a run continued from this state's directory learns it from the state alone
    routers_from_init: list = field(default_factory=list)
    routers_steps_before: dict = field(default_factory=dict)
    # whether routers_from_init is that for a run from init too (False: a state from before, where such a run left
    # it empty, and its directory's args.json says how the run began; a run from init that resumes such a state
    # names all its routers then, `Trainer.load_state_dict`)
    routers_named: bool = False


@dataclass
class Collaborators:
    """What the loop reports to and saves through, given at construction (None: not wanted, as in the
    benchmarks and tests that only step): rank 0's metrics writer, the throughput meter, the
    `checkpoint.Saver`, and for a rollback on the semi-auto engine, `path -> Layout` built again from it.
    Whoever builds them closes them (`close`); the trainer only uses them."""

    writer: object = None
    throughput: object = None
    saver: object = None
    rebuild: object = None

    def close(self) -> None:
        """The metrics writer's files and trackers (a drawing in flight is waited for)."""
        if self.writer is not None:
            self.writer.close()
