"""How a run stops: by a signal, on a non-finite loss under each nan policy, on out-of-memory; and what it says."""
import json

import pytest

from pretrain_cli.cli import main as cli_main

from e2e_helpers import write_config


@pytest.mark.parametrize("at_step", [2, 3])  # 3 = max_steps: the loop ends anyway, then the final export
def test_a_signal_stop_puts_the_processs_handlers_back_when_the_run_ends(corpus, tmp_path, monkeypatch, at_step):
    """A run stopped by SIGTERM ignores further signals while it saves (and exports), then leaves the handlers as
    they were: SIG_IGN stayed for good when the signal came in the last step."""
    import os
    import signal

    from pretrain_cli.training import trainer as trainer_mod

    real, steps = trainer_mod.Trainer.train_step, []

    def step_then_signal(self, batches):
        result = real(self, batches)
        steps.append(1)
        if len(steps) == at_step:
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer's handler: finish the step, save, stop
        return result

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", step_then_signal)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    assert cli_main(["train", write_config(tmp_path, corpus, max_steps=3, save_steps=10)]) == 0
    assert {s: signal.getsignal(s) for s in before} == before
    state = json.loads((tmp_path / "out" / f"checkpoint-{at_step}" / "trainer_state.json").read_text())
    assert state["global_step"] == at_step


def test_a_signal_after_the_last_step_lets_the_run_evaluate_and_export_and_exit_0(corpus, tmp_path, monkeypatch,
                                                                                   capsys):
    """SIGTERM while the run evaluates or writes its final model (after the last step's checkpoint): it killed the
    export (143) and left run.lock; now it is said, ignored, and the run ends as it would have, exit 0."""
    import os
    import signal

    from pretrain_cli.training import export as export_mod

    real = export_mod.write_weights

    def signalled_then_write(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(export_mod, "write_weights", signalled_then_write)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    assert cli_main(["train", write_config(tmp_path, corpus, max_steps=3, save_steps=10)]) == 0
    out = tmp_path / "out"
    assert (out / "model.safetensors").is_file() and (out / "all_results.json").is_file()
    assert not (out / "run.lock").exists()
    assert "received SIGTERM after the last step (saved): finishing" in capsys.readouterr().out
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_stop_agreed_on_another_ranks_signal_ignores_this_ranks_own_during_the_save(corpus, tmp_path, monkeypatch,
                                                                                      capsys):
    """A rank that stops because another rank's signal reached it first (`comm.any`) gets its own first SIGTERM from
    the launcher only later, during the save: it was handled there (and so could interrupt the save's store wait with
    EINTR, as a second signal did before 2f079be). Signals are ignored from the agreement on: here the "other rank"
    agrees at step 2 and the launcher's SIGTERM lands as the save begins."""
    import os
    import signal

    from pretrain_cli.distributed.comms import comm as comm_mod
    from pretrain_cli.training import trainer as trainer_mod

    real_step, real_save, steps, during_save = trainer_mod.Trainer.train_step, trainer_mod.Trainer._save, [], []

    def counted(self, batches):
        steps.append(1)
        return real_step(self, batches)

    def signalled_save(self, stopping=False):
        if stopping:
            during_save.append((signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)))
            os.kill(os.getpid(), signal.SIGTERM)  # the launcher's SIGTERM, after the ranks agreed to stop
        return real_save(self, stopping)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", counted)
    monkeypatch.setattr(trainer_mod.Trainer, "_save", signalled_save)
    monkeypatch.setattr(comm_mod.NoComm, "any", lambda self, flag: flag or len(steps) == 2)  # another rank's signal
    assert cli_main(["train", write_config(tmp_path, corpus, max_steps=5, save_steps=10)]) == 0
    assert during_save == [(signal.SIG_IGN, signal.SIG_IGN)]
    assert "received SIGTERM" not in capsys.readouterr().out  # not handled: no handler ran mid-save
    state = json.loads((tmp_path / "out" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2


def _poison_step(monkeypatch, bad_steps):
    """Make the loss NaN on the given (1-based) micro-batch calls."""
    import pretrain_cli.training.step as step_mod  # where the step computes its loss

    real = step_mod.mean_loss
    calls = {"n": 0}

    def loss(total, count):
        calls["n"] += 1
        value = real(total, count)
        return value * float("nan") if calls["n"] in bad_steps else value

    monkeypatch.setattr(step_mod, "mean_loss", loss)


def test_nan_policy_stop_saves_nothing_corrupt(corpus, tmp_path, monkeypatch, capsys):
    _poison_step(monkeypatch, {3})
    cfg = write_config(tmp_path, corpus, max_steps=6, save_steps=2)
    assert cli_main(["train", cfg]) == 2
    err = capsys.readouterr().err
    assert "step 3" in err and "not finite" in err
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    assert not (out / "model.safetensors").exists()


def test_nan_policy_skip_counts_and_limits(corpus, tmp_path, monkeypatch, capsys):
    _poison_step(monkeypatch, {3, 4})
    cfg = write_config(tmp_path, corpus, max_steps=5, nan_policy="skip")
    assert cli_main(["train", cfg]) == 0
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert state["global_step"] == 5 and state["skipped_steps"] == 2
    assert state["consumed_samples"] == 7 * 4  # skipped batches are consumed, not replayed
    assert state["skipped_batches"] == [8, 12]
    # inspect-data --config --step K shows the batch step K really trained on, skips included
    logged = {r["step"]: r["batch_hash"] for r in map(json.loads, (tmp_path / "out" / "metrics.jsonl").open())
              if r["kind"] == "train"}
    capsys.readouterr()
    for step in (2, 3, 5):
        assert cli_main(["inspect-data", "--config", cfg, "--step", str(step)]) == 0
        out = capsys.readouterr().out
        assert f"rank 0: samples [{4 * (step + 1 if step >= 3 else step - 1)}," in out, out
        assert f"hash {logged[step]}" in out, (step, out)
    monkeypatch.undo()
    _poison_step(monkeypatch, set(range(3, 100)))
    cfg = write_config(tmp_path, corpus, max_steps=9, nan_policy="skip", nan_skip_limit=3,
                       output_dir=str(tmp_path / "out2"))
    assert cli_main(["train", cfg]) == 2
    assert "3 consecutive non-finite steps" in capsys.readouterr().err


def test_stop_message_says_how_to_continue():
    from types import SimpleNamespace

    from pretrain_cli.training.run_end import stop_message

    def output(overwrite):
        return SimpleNamespace(overwrite=overwrite, output_dir="o", resume_from=None)

    assert "re-run the same command to resume from checkpoint-7" in stop_message(output(False), 7)
    text = stop_message(output(True), 7)
    assert "re-run the same command" not in text and "resume_from_checkpoint to o/checkpoint-7" in text


# what Paddle raised when an allocation failed in the backward of our fused loss's PyLayer (an `(External)` error,
# which Python sees as an OSError), and what it raises for a failed allocation anywhere else
PYLAYER_OOM = OSError("(External) { ==== Error message in backward of GradNodePyLayer__Fused ==== MemoryError: "
                      "(ResourceExhausted) Fail to alloc memory of 544538624 size, error code is 12.\n  At: "
                      "/x/ops/cpu_ops.py(197): scale_by\n  /x/ops/linear_loss.py(77): backward }")


@pytest.mark.parametrize("where", ["step", "start-up"])
def test_out_of_memory_on_cpu_is_one_line_with_step_peak_and_suggestion(corpus, tmp_path, capsys, monkeypatch, where):
    """An allocation failing at step 2 (the PyLayer backward's OSError) or while the model is built (MemoryError):
    `error: out of memory at step N (process peak X GiB) on 1 x cpu: top plan suggestion …`, exit 1, no stack."""
    from pretrain_cli.distributed.strategies.strategy import Strategy
    from pretrain_cli.training import run

    if where == "step":
        calls, real = [], Strategy.forward_backward

        def failing(self, *a, **k):
            calls.append(1)
            if len(calls) == 2:
                raise PYLAYER_OOM
            return real(self, *a, **k)

        monkeypatch.setattr(Strategy, "forward_backward", failing)
    else:
        def no_memory(*a, **k):
            raise MemoryError("(ResourceExhausted) Fail to alloc memory of 4294967296 size, error code is 12.")

        monkeypatch.setattr(run, "build_model", no_memory)
    cfg = write_config(tmp_path, corpus, max_steps=4)
    assert cli_main(["train", cfg]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1, err
    at = "at step 2" if where == "step" else "before the first step (building the run)"
    assert err[0].startswith(f"error: out of memory {at} (process peak "), err[0]
    assert " GiB) on 1 x cpu: top plan suggestion for this run: " in err[0] or "no layout" in err[0], err[0]
    assert "External" not in err[0] and "cpu_ops.py" not in err[0] and "ResourceExhausted" not in err[0]
