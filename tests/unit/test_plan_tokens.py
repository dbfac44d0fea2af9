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


@pytest.mark.parametrize("argv,error", [
    (["--tokens", "ten"], "--tokens: 'ten' is no token count; give one such as 10B, 500M or 1e10"),
    (["--tokens", "0"], "--tokens: '0' is no token count; give one such as 10B, 500M or 1e10"),
    (["--tokens", "1B", "--max_steps", "5"], "--tokens 1B and --max_steps both set the run's length; give one"),
])
def test_bad_tokens_are_one_line(write_args, capsys, argv, error):
    assert cli_main(["plan", write_args(), *argv]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {error}"
