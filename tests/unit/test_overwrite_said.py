"""`check` with `overwrite_output_dir: true` names what `train` removes as it starts (the earlier run's checkpoints
past its start, its final model, its records in metrics.jsonl and report_to's VisualDL files; args.json rewritten),
with their count: PaddleNLP's flag removes nothing (it only skips the resume),
and `check` said nothing of it (the W6 walk's out/q40)."""
import json
import os

from data_helpers import write_tokens
from pretrain_cli import cli
from pretrain_cli.orchestration.opened import overwritten
from pretrain_cli.training import final_model


def _earlier_run(out):
    """An earlier run's directory: its record, two checkpoints and the final model of step 4."""
    out.mkdir()
    (out / "args.json").write_text("{}")
    for n in (2, 4):
        (out / f"checkpoint-{n}").mkdir()
    (out / "model.safetensors").write_bytes(b"weights")
    (out / "config.json").write_text("{}")
    (out / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    t = (out / "model.safetensors").stat().st_mtime_ns + 10**9  # (an export writes its state after its weights)
    os.utime(out / "trainer_state.json", ns=(t, t))


def test_check_names_what_overwrite_output_dir_removes(tmp_path, capsys):
    out = tmp_path / "out"
    _earlier_run(out)
    (tmp_path / "args.json").write_text(json.dumps({
        "model_name_or_path": "micro-llama", "input_dir": write_tokens(tmp_path / "data", n_docs=40, doc_len=64),
        "output_dir": str(out), "device": "cpu", "do_train": True, "max_steps": 3, "max_seq_length": 16,
        "split": "1", "tokenizer_name_or_path": None, "overwrite_output_dir": True}))
    assert cli.main(["check", str(tmp_path / "args.json")]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: overwrite")]
    assert said == [f"warning: overwrite_output_dir: train starts at step 0 and first removes from {out} 2 "
                    f"checkpoints past it (checkpoint-2, checkpoint-4) and the final model of step 4 an earlier run "
                    f"exported (3 files: model.safetensors, trainer_state.json, config.json), and rewrites its args.json; "
                    f"PaddleNLP's overwrite_output_dir removes nothing (it only skips the resume): to keep them, choose another "
                    f"output_dir"], said
    assert all(p.exists() for p in (out / "checkpoint-2", out / "model.safetensors"))  # check removes nothing
    assert final_model.remove_final(out).endswith("(model.safetensors, trainer_state.json, config.json): this run writes "
                                             "its own at its end")  # what train removes is what check named


def test_nothing_said_where_nothing_goes(tmp_path):
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.run_config import Target

    out = tmp_path / "out"
    _earlier_run(out)
    args = tmp_path / "args.json"
    args.write_text(json.dumps({
        "model_name_or_path": "micro-llama", "input_dir": write_tokens(tmp_path / "data", n_docs=40, doc_len=64),
        "output_dir": str(out), "do_train": True, "max_steps": 3, "max_seq_length": 16, "split": "1",
        "overwrite_output_dir": True}))
    run = prepare(str(args), [], Target()).run
    assert overwritten(run, 4) == (f"overwrite_output_dir: train starts at step 4 and first removes from {out} the "
                                   f"final model of step 4 an earlier run exported (3 files: model.safetensors, "
                                   f"trainer_state.json, config.json), and rewrites its args.json; PaddleNLP's "
                                   f"overwrite_output_dir removes nothing (it only skips the resume): to keep them, "
                                   f"choose another output_dir")
    assert overwritten(run, 4, reads=(str(out),)) is None  # the run reads its model there: the final model stays


def _records(out):
    """The earlier run's records: 3 in metrics.jsonl (steps 0, 2, 4) and a VisualDL file under runs/."""
    (out / "metrics.jsonl").write_text("".join(json.dumps({"kind": k, "step": n}) + "\n"
                                               for k, n in (("startup", 0), ("train", 2), ("train", 4))))
    (out / "runs").mkdir()
    (out / "runs" / "vdlrecords.1700000000.log").write_bytes(b"earlier")


def test_the_earlier_runs_records_are_named_and_are_what_train_cuts(tmp_path):
    """metrics.jsonl is written anew at step 0 (cut past a resume's step), report_to's VisualDL files replaced by
    the new run's (`training.metrics.MetricsWriter`, which `train` opens them with): check named neither."""
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.run_config import Target
    from pretrain_cli.training.metrics import MetricsWriter

    out = tmp_path / "out"
    out.mkdir()
    (out / "args.json").write_text("{}")
    _records(out)
    args = tmp_path / "args.json"
    args.write_text(json.dumps({
        "model_name_or_path": "micro-llama", "input_dir": write_tokens(tmp_path / "data", n_docs=40, doc_len=64),
        "output_dir": str(out), "do_train": True, "max_steps": 3, "max_seq_length": 16, "split": "1",
        "overwrite_output_dir": True, "report_to": "visualdl"}))
    run = prepare(str(args), [], Target()).run
    tail = ("PaddleNLP's overwrite_output_dir removes nothing (it only skips the resume): to keep them, choose "
            "another output_dir")
    assert overwritten(run, 2) == (f"overwrite_output_dir: train starts at step 2 and first removes from {out} 1 "
                                   f"record of metrics.jsonl (past step 2) and visualdl's records past step 2 in "
                                   f"{out / 'runs'}, and rewrites its args.json; {tail}")
    assert overwritten(run, 0) == (f"overwrite_output_dir: train starts at step 0 and first removes from {out} 3 "
                                   f"records of metrics.jsonl (to step 4) and visualdl's 1 file in {out / 'runs'} "
                                   f"(vdlrecords.1700000000.log), and rewrites its args.json; {tail}")
    writer = MetricsWriter(str(out), None, ("visualdl",), None)  # (train's, at step 0 under overwrite_output_dir)
    writer.close()
    assert (out / "metrics.jsonl").read_text() == ""
    assert not (out / "runs" / "vdlrecords.1700000000.log").exists()
