"""`plan --tokens N`: "how long would 10B tokens take" asked the user to divide by the tokens of a step, which
depend on the data ranks `--gpus` gives; plan sets max_steps from the token count itself."""
import json
import math

import pytest

from pretrain_cli.cli import main as cli_main


def _plan(capsys, *argv):
    assert cli_main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("gpus", ["1", "8"])
def test_tokens_sets_max_steps_to_cover_them(write_args, capsys, gpus):
    cfg = write_args()
    per_step = _plan(capsys, cfg, "--gpus", gpus)["tokens_per_step"]  # 1 x 1024 on each data rank
    assert per_step == 1024 * int(gpus)
    r = _plan(capsys, cfg, "--gpus", gpus, "--tokens", "10B")
    steps = math.ceil(10e9 / per_step)
    assert r["max_steps"] == steps and r["total_tokens"] == steps * per_step >= 10e9
    assert r["eta_hours"] == pytest.approx(_plan(capsys, cfg, "--gpus", gpus, "--max_steps", str(steps))["eta_hours"])
    assert _plan(capsys, cfg, "--gpus", gpus, "--tokens", "1e10")["max_steps"] == steps


def test_the_steps_of_a_long_run_are_grouped_as_its_tokens(write_args, capsys):
    """'190735 steps = 100,000,000,000 tokens' read as one more number to count the digits of."""
    assert cli_main(["plan", write_args(), "--tokens", "10B"]) == 0
    assert "1,024 tokens/step; 9,765,625 steps = 10,000,000,000 tokens" in capsys.readouterr().out


@pytest.mark.parametrize("argv,error", [
    (["--tokens", "ten"], "--tokens: 'ten' is no token count; give one such as 10B, 500M or 1e10"),
    (["--tokens", "0"], "--tokens: '0' is no token count; give one such as 10B, 500M or 1e10"),
    (["--tokens", "1B", "--max_steps", "5"], "--tokens 1B and --max_steps both set the run's length; give one"),
])
def test_bad_tokens_are_one_line(write_args, capsys, argv, error):
    assert cli_main(["plan", write_args(), *argv]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {error}"


def test_fit_says_how_long_the_tokens_take_at_each_speed(capsys):
    """"Will Llama-3.1-8B at 8K fit 8 H100 and how long for 100B tokens?": --fit gave tokens/s before and after
    but no hours, which plan's ETA (MFU only, no traffic) does not give for the fitted layout either."""
    from pathlib import Path

    cfg = str(Path(__file__).resolve().parents[2] / "configs" / "llama-3-8b_pretrain.json")
    argv = ["plan", cfg, "--model_name_or_path", "meta-llama/Llama-3.1-8B", "--max_seq_length", "8192",
            "--recompute", "true", "--device", "H100", "--gpus", "8", "--tokens", "100B", "--fit"]  # (recompute off)
    assert cli_main([*argv, "--json"]) == 0
    f = json.loads(capsys.readouterr().out)
    hours = [f["total_tokens"] / f[k]["speed"]["tokens_per_sec"] / 3600 for k in ("before", "after")]
    assert f["total_tokens"] >= 100e9 and 24 * 14 < min(hours)  # weeks, not hours
    assert cli_main(argv) == 0
    assert (f"  time for {f['total_tokens']:,} tokens at that speed: {hours[0]:,.1f} h -> {hours[1]:,.1f} h "
            f"({hours[0] / 24:,.1f} -> {hours[1] / 24:,.1f} days)") in capsys.readouterr().out.splitlines()


def test_a_long_runs_eta_is_also_in_days(capsys):
    """100B tokens of Llama-3.1-8B at 8K on 8 H100 is "508.32 h": three weeks, said so."""
    from pathlib import Path

    cfg = str(Path(__file__).resolve().parents[2] / "configs" / "llama-3-8b_pretrain.json")
    argv = ["plan", cfg, "--model_name_or_path", "meta-llama/Llama-3.1-8B", "--max_seq_length", "8192",
            "--device", "H100", "--gpus", "8", "--tokens", "100B"]
    eta = _plan(capsys, *argv[1:])["eta_hours"]
    assert cli_main(argv) == 0 and eta > 48
    assert [x for x in capsys.readouterr().out.splitlines() if x.startswith("ETA: ")][0].endswith(
        f" = {eta:.2f} h ({eta / 24:.1f} days)")


def test_fit_gives_no_time_before_for_a_file_that_does_not_fit(capsys):
    """Qwen3-30B-A3B at 8K on 16 H100 with the Llama file's tp 2 + ZeRO-1 needs 139.7 GiB as written: a run that
    cannot start has no time to compare the fitted layout's with."""
    from pathlib import Path

    cfg = str(Path(__file__).resolve().parents[2] / "configs" / "llama-3-8b_pretrain.json")
    argv = ["plan", cfg, "--model_name_or_path", "Qwen/Qwen3-30B-A3B", "--max_seq_length", "8192",
            "--device", "H100", "--gpus", "16", "--tokens", "100B", "--fit"]
    assert cli_main([*argv, "--json"]) == 0
    f = json.loads(capsys.readouterr().out)
    assert f["before"]["memory_gib"] > f["device"]["memory_gib"] and f["diff"]
    hours = f["total_tokens"] / f["after"]["speed"]["tokens_per_sec"] / 3600
    assert cli_main(argv) == 0
    assert (f"  time for {f['total_tokens']:,} tokens at that speed: {hours:,.1f} h ({hours / 24:,.1f} days); "
            f"as written the file does not fit: no time before") in capsys.readouterr().out.splitlines()
