"""`plan --fit -o` for a GPU from a CPU try-out's argument file: the fitted file must run on the GPU it was fitted
for, and must not resume the try-out's checkpoint of another model."""
import json

from pretrain_cli.cli import main as cli_main


def _cpu_moe_file(tmp_path):
    cfg = tmp_path / "moe_cpu.json"
    cfg.write_text(json.dumps({"model_name_or_path": "Qwen/Qwen3-30B-A3B", "device": "cpu", "bf16": True,
                               "input_dir": "data", "output_dir": str(tmp_path / "out"), "max_seq_length": 4096,
                               "per_device_train_batch_size": 8, "max_steps": 20, "do_train": True}, indent=2))
    return cfg


def test_a_cpu_file_fitted_for_a_gpu_is_written_for_the_gpu(tmp_path, capsys):
    """The walk from a CPU try-out to 8 H100s: the fitted layout (pipeline, expert parallelism, ZeRO-1) was
    written with the source's `device: cpu`, so `train` on the GPU node would have run it on the host."""
    cfg, out = _cpu_moe_file(tmp_path), tmp_path / "fitted.json"
    assert cli_main(["plan", str(cfg), "--device", "H100", "--gpus", "8", "--fit", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    fitted = json.loads(out.read_text())
    assert fitted["device"] == "gpu" and list(fitted)[:3] == ["model_name_or_path", "device", "bf16"]
    assert fitted["expert_parallel_degree"] > 1  # the layout the fit chose for the GPUs
    assert "device gpu (the source's cpu: the layout was fitted for H100)" in text


def test_a_cpu_file_fitted_for_the_cpu_keeps_its_device(tmp_path, capsys):
    cfg, out = _cpu_moe_file(tmp_path), tmp_path / "fitted.json"
    assert cli_main(["plan", str(cfg), "--model_name_or_path", "micro-qwen3-moe", "--max_seq_length", "128",
                     "--device", "cpu", "--fit", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["device"] == "cpu" and "device gpu" not in capsys.readouterr().out


def test_the_source_runs_checkpoint_of_another_model_is_not_resumed(tmp_path, capsys):
    """The try-out trained the file's small model into output_dir; plan's command line swapped in a published one:
    resuming that checkpoint, `check` and `train` refused the fitted file (hidden_size=64 against 2048)."""
    import shutil

    from pretrain_cli.config.presets import resolve_model_dir

    cfg, out = _cpu_moe_file(tmp_path), tmp_path / "fitted.json"
    ckpt = tmp_path / "out" / "checkpoint-20"
    ckpt.mkdir(parents=True)
    shutil.copy(resolve_model_dir("micro-qwen3-moe") / "config.json", ckpt / "config.json")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 20}))
    assert cli_main(["plan", str(cfg), "--device", "H100", "--gpus", "8", "--fit", "-o", str(out)]) == 0
    fitted = json.loads(out.read_text())
    assert "resume_from_checkpoint" not in fitted and fitted["output_dir"] == str(tmp_path / "out") + "-fitted"
    assert (f"starting over ({ckpt}: checkpoint has hidden_size=64 but this run's model has hidden_size=2048)"
            in capsys.readouterr().out)
    # the same model (here, a smaller one the source's checkpoint is of) still resumes by name
    assert cli_main(["plan", str(cfg), "--model_name_or_path", "micro-qwen3-moe", "--max_seq_length", "128",
                     "--device", "H100", "--gpus", "8", "--fit", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["resume_from_checkpoint"] == str(ckpt)
    assert f"resuming from {ckpt}" in capsys.readouterr().out


def test_a_paddlenlp_checkpoint_in_the_source_output_dir_is_not_resumed(tmp_path, capsys):
    """A PaddleNLP run's output_dir reused: its newest checkpoint-N is PaddleNLP's Trainer's, which `train` refuses to
    resume; the fitted file starts over and the printed line says why."""
    cfg, out = _cpu_moe_file(tmp_path), tmp_path / "fitted.json"
    ckpt = tmp_path / "out" / "checkpoint-10"
    ckpt.mkdir(parents=True)
    for name in ("training_args.bin", "scheduler.pdparams", "trainer_state.json"):
        (ckpt / name).write_bytes(b"{}")
    assert cli_main(["plan", str(cfg), "--model_name_or_path", "micro-qwen3-moe", "--max_seq_length", "128",
                     "--device", "H100", "--gpus", "8", "--fit", "-o", str(out)]) == 0
    assert "resume_from_checkpoint" not in json.loads(out.read_text())
    out = capsys.readouterr().out
    # train's own refusal (storage.intact.paddlenlp_checkpoint), its advice naming the checkpoint's path
    assert f"starting over ({ckpt} is a checkpoint of PaddleNLP's Trainer (training_args.bin)" in out
    assert f"start from its weights instead: model_name_or_path: {ckpt}, continue_training: true" in out


def test_the_written_line_checks_and_launches_the_gpu_file_as_it_will_run(tmp_path, capsys):
    """Followed on a GPU-less laptop, `check fitted.json` checked the GPU file as this CPU's one-process run and
    refused it for memory; `--world_size N` checks it as the N-GPU launch. The launch names the nodes it needs."""
    cfg, out = _cpu_moe_file(tmp_path), tmp_path / "fitted.json"
    assert cli_main(["plan", str(cfg), "--device", "H100", "--gpus", "16", "--fit", "-o", str(out)]) == 0
    assert (f"`pretrain-cli check {out} --world_size 16` validates it on any machine, `MASTER=<node 0's ip:port> "
            f"NNODES=2 NODE_RANK=<0..1> scripts/launch.sh {out}` on each of its 2 nodes runs it (8 GPUs a node)"
            in capsys.readouterr().out)
    assert cli_main(["plan", str(cfg), "--model_name_or_path", "micro-qwen3-moe", "--max_seq_length", "128",
                     "--device", "H100", "--gpus", "4", "--fit", "-o", str(out)]) == 0
    assert f"--world_size 4` validates it on any machine, `DEVICES=0,1,2,3 scripts/launch.sh {out}`" in (
        capsys.readouterr().out)
    assert cli_main(["plan", str(cfg), "--model_name_or_path", "micro-qwen3-moe", "--max_seq_length", "128",
                     "--device", "cpu", "--fit", "-o", str(out)]) == 0
    assert f"`pretrain-cli check {out}` validates it, `pretrain-cli train {out}` runs it" in capsys.readouterr().out
