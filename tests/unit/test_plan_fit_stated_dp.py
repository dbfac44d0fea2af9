"""`plan --fit` on a file that states a data-parallel degree (PaddleNLP's `data_parallel_degree`, PaddleFormers'
`data_parallel_size`): `config.parallel` refuses a layout that does not give it (d8e85260), so every candidate of
another split was refused and --fit searched that degree's layouts only (llama-3-8b on 8 A100-40GB stating 4: ZeRO-3
at tp 2, 17.8k tokens/s, not tp 4's 18.4k). It is searched as the other degrees are, and `-o` writes the degree the
chosen layout gives, so `train` (and `plan`) of the fitted file does not refuse it."""
import json
from pathlib import Path

import pytest
from plan_helpers import fit, plan

from pretrain_cli.cli import main as cli_main

FILE = str(Path(__file__).parents[2] / "configs" / "llama-3-8b_pretrain.json")
ON = dict(device="A100-40GB", gpus=8)


@pytest.mark.parametrize("key", ["data_parallel_degree", "data_parallel_size"])
def test_a_stated_data_parallel_degree_does_not_narrow_the_search(key):
    free = fit(FILE, [], **ON)
    stated = fit(FILE, [f"--{key}", "4"], **ON)
    assert stated["after"]["speed"]["tokens_per_sec"] == pytest.approx(free["after"]["speed"]["tokens_per_sec"])
    assert {k: v for k, v in stated["change"].items() if k != key} == free["change"]
    assert stated["change"]["tensor_parallel_degree"] == 4
    assert (key, 4, 1) in stated["diff"]  # tp 4 x 2 data ranks, ZeRO-1 over both: PaddleNLP's dp 1


def test_a_stated_degree_the_chosen_layout_gives_is_kept():
    f = fit(FILE, ["--data_parallel_degree", "2", "--tensor_parallel_degree", "4", "--gradient_accumulation_steps",
                   "32"], **ON)  # (tp 4 x 2 data ranks as written, what --fit chooses)
    assert f["change"].get("data_parallel_degree", 2) == 2
    assert not any(k == "data_parallel_degree" for k, _, _ in f["diff"])


def test_the_fitted_file_states_the_degree_its_layout_gives(tmp_path, capsys):
    src = json.loads(open(FILE).read())
    cfg, out = tmp_path / "llama.json", tmp_path / "fitted.json"
    cfg.write_text(json.dumps({**src, "output_dir": str(tmp_path / "run"), "data_parallel_degree": 4}))
    assert cli_main(["plan", str(cfg), "--device", "A100-40GB", "--gpus", "8", "--fit", "-o", str(out)]) == 0
    assert "data_parallel_degree: 4 -> 1" in capsys.readouterr().out
    fitted = json.loads(out.read_text())
    assert (fitted["data_parallel_degree"], fitted["tensor_parallel_degree"]) == (1, 4)
    assert plan(str(out), [], **ON)["fits"]  # resolved as `train` resolves it: not refused
