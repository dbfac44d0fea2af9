"""What train's closing lines say of a run directory (`training/closing.py`, `final_model.final_step`), and the closing
metrics' counts (`run_end.train_results`), without a run."""
import json

from pretrain_cli.training import closing, final_model

STOP = "stopped at step 3 and saved; re-run the same command to resume from checkpoint-3"


def test_a_final_model_is_its_weights_its_step_named_where_its_state_says_it(tmp_path):
    """An export killed between its weights and trainer_state.json leaves weights that `eval --model out` reads:
    the stop's line names the checkpoint, not out, and says the step is unknown; `remove_final` takes the weights
    away (said without a step)."""
    out = tmp_path / "out"
    out.mkdir()
    assert final_model.final_step(out) == (False, None)
    assert closing.stopped(STOP, out, 3) == (f"{STOP}; no final model yet: pretrain-cli eval --model {out} and "
                                             f"pretrain-cli generate --model {out} read checkpoint-3 meanwhile")
    (out / "model.safetensors").write_bytes(b"weights")
    (out / "config.json").write_text("{}")
    ckpt = out / "checkpoint-3"
    assert final_model.final_step(out) == (True, None)
    assert closing.stopped(STOP, out, 3) == (
        f"{STOP}; {out} holds a final model exported when the run ended earlier (its step unknown: no "
        f"trainer_state.json): pretrain-cli eval --model {ckpt} and pretrain-cli generate --model {ckpt} read "
        f"step 3's weights meanwhile")
    (out / "trainer_state.json").write_text("{")
    assert final_model.final_model(out) == (True, None, "no readable trainer_state.json")
    (out / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    assert final_model.final_step(out) == (True, 2)
    assert closing.stopped(STOP, out, 3) == (
        f"{STOP}; {out} holds the final model of step 2 (exported when the run ended there): pretrain-cli eval "
        f"--model {ckpt} and pretrain-cli generate --model {ckpt} read step 3's weights meanwhile")
    (out / "trainer_state.json").unlink()
    assert final_model.remove_final(out) == (f"overwrite_output_dir: removed the final model an earlier run exported to "
                                        f"{out} (model.safetensors, config.json): this run writes its own at its end")
    assert final_model.final_step(out) == (False, None) and final_model.remove_final(out) is None
    # weights under a name no export of ours writes: no final model (eval refuses them, naming them), none to remove
    (out / "consolidated.safetensors").write_bytes(b"weights")
    (out / "config.json").write_text("{}")
    assert final_model.final_step(out) == (False, None)
    assert final_model.remove_final(out) is None and (out / "config.json").is_file()


def test_a_complete_runs_recorded_blocks_are_read_from_all_results(tmp_path):
    """A re-run of a complete run prints what its export printed: all_results.json's train keys and test keys."""
    results = {"train_loss": 6.5, "progress_or_epoch": 1.0, "global_step": 2, "eval_loss": 6.7, "test_loss": 6.6}
    (tmp_path / "all_results.json").write_text(json.dumps(results))
    (tmp_path / "train_results.json").write_text(json.dumps({"train_loss": 6.5}))
    assert closing.recorded(tmp_path) == results
    assert closing.recorded(tmp_path / "absent") == {}


def test_samples_per_second_counts_every_launchs_samples_whatever_ignore_data_skip_resets():
    """train_runtime is every launch's, and so are the samples: from tokens_seen, not consumed_samples (the data
    position, which a resume with ignore_data_skip sets back to 0). 6 steps of 4 sequences in 2 s, resumed so at
    step 4 (consumed_samples 8: the 2 steps since), are 12 samples/s, not the 4/s of those 2 steps alone."""
    from types import SimpleNamespace as NS

    from pretrain_cli.training import run_end
    from pretrain_cli.training.trainer_state import TrainerState

    state = TrainerState(global_step=6, consumed_samples=8, tokens_seen=6 * 4 * 32, train_seconds=2.0, loss_sum=6.0)
    trainer = NS(state=state, seq_len=32, loop=NS(max_steps=6), throughput=NS(tokens_this_launch=2 * 4 * 32),
                 process_seconds=1.0)
    results = run_end.train_results(trainer)
    assert results["train_samples_per_second"] == 12.0 and results["train_steps_per_second"] == 3.0
    assert results["train_tokens_per_second"] == 12.0 * 32


def test_a_state_older_than_the_weights_is_said_so_not_unreadable(tmp_path):
    """A copy that kept no modification times (scp -r, rsync without -t) leaves trainer_state.json older than the
    weights: its step is not taken (it may be a download's own), and the stop's line says why. It said "no readable
    trainer_state.json" of a file that says step 8."""
    import os

    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"weights")
    (out / "trainer_state.json").write_text(json.dumps({"global_step": 8}))
    t = (out / "model.safetensors").stat().st_mtime_ns
    os.utime(out / "trainer_state.json", ns=(t - 10**9, t - 10**9))
    why = ("its trainer_state.json, of step 8, is older than its weights: a download's own or an earlier export's, "
           "or a copy that kept no modification times")
    assert final_model.final_model(out) == (True, None, why) and final_model.final_step(out) == (True, None)
    ckpt = out / "checkpoint-9"
    assert closing.stopped(STOP, out, 9) == (
        f"{STOP}; {out} holds a final model exported when the run ended earlier (its step unknown: {why}): "
        f"pretrain-cli eval --model {ckpt} and pretrain-cli generate --model {ckpt} read step 9's weights meanwhile")
