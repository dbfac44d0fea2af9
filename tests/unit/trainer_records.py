"""The records a training run hands its metrics writer, for the tracker tests (test_trackers.py, test_trackers_wandb.py,
and the fresh interpreter of its real-wandb test, which imports this module by path)."""


def log_steps(writer, first: int, last: int, offset: float = 0.0) -> dict:
    """What the trainer writes from step `first` to `last`, saving every 5 steps: the writer's mark as a saved step
    begins logging (its checkpoint keeps it), that step's train record, its evaluation and its checkpoint record.
    Returns {step: mark}."""
    marks = {}
    for s in range(first, last + 1):
        if s % 5 == 0:
            marks[s] = writer.mark()
        writer.write("train", s, {"loss": 10.0 - s / 10 + offset})
        if s % 5 == 0:
            writer.write("eval", s, {"eval_loss": 9.0 - s / 10})
            writer.write("checkpoint", s, {"stall_seconds": 0.1})
    return marks
