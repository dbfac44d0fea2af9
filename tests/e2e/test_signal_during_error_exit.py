"""A signal while a run leaves with an error (W2, disk full under launch.sh: rank 1, its save failed by rank 0, got the
launcher's SIGTERM as it left): its log said `received SIGTERM after the last step (saved): finishing the evaluation
and the final export`, none of which was true. It is said as what it met, ignored as before, and the run's own error
is its end."""
import errno

from pretrain_cli.cli import main as cli_main

from e2e_helpers import write_config


def test_a_signal_while_the_run_ends_with_an_error_is_said_as_that(corpus, tmp_path, monkeypatch, capsys):
    import os
    import signal

    from pretrain_cli.training import rank_exit
    from pretrain_cli.training import trainer as trainer_mod

    real_step, real_leave = trainer_mod.Trainer.train_step, rank_exit.leave

    def full(self, batches):
        if self.state.global_step == 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "checkpoint-2.tmp" / "x"))
        return real_step(self, batches)

    def signalled_then_leave(*args, **kwargs):  # the launcher's SIGTERM as the rank leaves with its error
        os.kill(os.getpid(), signal.SIGTERM)
        return real_leave(*args, **kwargs)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", full)
    monkeypatch.setattr(rank_exit, "leave", signalled_then_leave)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    assert cli_main(["train", write_config(tmp_path, corpus, max_steps=3, save_steps=10)]) == 1
    captured = capsys.readouterr()
    assert "received SIGTERM while this rank ends with an error: ignored" in captured.out, captured.out[-2000:]
    assert "after the last step" not in captured.out
    assert captured.err.splitlines() == [f"error: {tmp_path}/out/checkpoint-2.tmp/x: No space left on device; free "
                                         f"disk space (or point output_dir elsewhere) and re-run the same command; "
                                         f"training resumes from the last complete checkpoint"]
    assert not (tmp_path / "out" / "run.lock").exists()
    assert {s: signal.getsignal(s) for s in before} == before
