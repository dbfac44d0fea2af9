"""`check --world_size N`: a launch of N processes checked on this machine, by the resolve that launch runs."""
import pytest

from pretrain_cli.cli import main as cli_main

from e2e_helpers import write_config


def test_check_world_size_simulates_a_launch_on_any_machine(corpus, tmp_path, capsys):
    """A 4-process file checked here, by the resolve a launch runs: tp 2 x 2 data ranks passes; the same file with
    degrees the model and world cannot take lists every problem, one line each, exit 2."""
    cfg = write_config(tmp_path, corpus, tensor_parallel_degree=2, sharding="stage1", gradient_accumulation_steps=2)
    assert cli_main(["check", cfg, "--world_size", "4"]) == 0
    out = capsys.readouterr().out
    assert "check: OK — training would start on 4 processes (simulated)" in out
    assert "world 4, dp 1, sharding stage1 x2, tp 2" in out
    assert "ranks: 4 processes = 2 data ranks x tp 2; each data rank reads 8 sequences (4 per micro-step)" in out
    assert "batch: 4 x acc 2 x 2 data ranks = 16 sequences" in out
    assert cli_main(["check", cfg]) == 0 and "check: OK — training would start\n" in capsys.readouterr().out
    bad = ["--tensor_parallel_degree", "4", "--sharding_parallel_degree", "3"]
    assert cli_main(["check", cfg, "--world_size", "8", *bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: tensor_parallel_degree: 4 does not divide the model's num_key_value_heads (2); use a "
                   "divisor of it",
                   "error: sharding_parallel_degree: 3 does not divide the 2 data-parallel processes (world 8 / (tp 4)); "
                   "use a divisor or -1"]
    assert cli_main(["check", cfg, "--world_size", "6", "--tensor_parallel_degree", "4"]) == 2
    assert "tensor_parallel_degree: 4 does not divide the world size 6" in capsys.readouterr().err
    assert cli_main(["check", cfg, "--world_size", "0"]) == 2
    assert "--world_size: must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("world", [1, 2, 8])
def test_check_world_size_says_its_count_in_english(corpus, tmp_path, monkeypatch, capsys, world):
    """A GPU file checked on this CPU machine as a launch of `world` GPUs: "on 1 process", "a launch on 1 GPU" (it
    said "an 1-GPU launch" and "on 1 processes"; "an 2-GPU launch" too)."""
    from pretrain_cli import runtime

    monkeypatch.setattr(runtime, "gpu_build_installed", lambda: False)  # (as on a GPU machine's CPU-only checkout)
    cfg = write_config(tmp_path, corpus, device="gpu")
    assert cli_main(["check", cfg, "--world_size", str(world)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    gpus, processes = ("1 GPU", "1 process") if world == 1 else (f"{world} GPUs", f"{world} processes")
    assert f"note: --world_size {world} checks the run as a launch on {gpus} (device gpu" in out, out
    assert out.strip().splitlines()[-1] == f"check: OK — training would start on {processes} (simulated)"
