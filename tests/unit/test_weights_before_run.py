"""The weights a directory held before a run of ours first wrote there (a download, under overwrite_output_dir):
args.json records them (`final_model.weights_before_the_run`), and `final_model.final_step`, which eval, generate, the stop's
line and `remove_final` ask, takes them for no model of the run's until they change (the export replaces them). Before,
a run killed before its export left them taken for its trained weights, and the next start removed them as 'the final
model an earlier run exported'. An HF Trainer's snapshot ships a trainer_state.json and an all_results.json of its
own: neither tells a download from an export."""
import json
import os

import pytest

from pretrain_cli.errors import UserError
from pretrain_cli.orchestration.recorded import model_argument
from pretrain_cli.training import closing, final_model


def _download(out):
    out.mkdir()
    for name, text in (("model.safetensors", "weights"), ("config.json", "{}"), ("tokenizer.json", "{}"),
                       ("trainer_state.json", json.dumps({"global_step": 9})), ("all_results.json", "{}")):
        (out / name).write_text(text)


def _start(out):
    """What a training run's start writes: args.json, with the record of the weights there before it."""
    record = {"arguments": {}, "run": {}}
    if before := final_model.weights_before_the_run(out):
        record[final_model.BEFORE_RUN] = before
    (out / "args.json").write_text(json.dumps(record))
    return before


def test_a_download_recorded_before_the_run_is_no_final_model_until_replaced(tmp_path):
    out = tmp_path / "out"
    _download(out)
    assert final_model.final_step(out) == (True, 9)  # (no args.json: a model directory of its own)
    before = _start(out)
    assert [e["name"] for e in before] == ["model.safetensors"]
    assert final_model.final_step(out) == (False, None)
    assert final_model.remove_final(out) is None
    assert sorted(p.name for p in out.iterdir()) == ["all_results.json", "args.json", "config.json",
                                                     "model.safetensors", "tokenizer.json", "trainer_state.json"]
    assert "no final model yet" in closing.stopped("stopped", out, 2)
    with pytest.raises(UserError, match=r"neither a final model nor a checkpoint-N yet \(only model.safetensors: "
                                        r"the model it held before the run, not trained by it\)"):
        model_argument(str(out))
    assert _start(out) == before  # a second start carries the record on, the files unchanged
    (out / "model.safetensors").write_text("the run's weights")  # what its export writes in their place
    _later(out / "model.safetensors", out / "trainer_state.json")
    assert final_model.final_step(out) == (True, None)  # (the download's trainer_state.json is older: not the export's)
    assert final_model.before_the_run(out) == [] and _start(out) == []
    (out / "trainer_state.json").write_text(json.dumps({"global_step": 30}))  # the export's, written after them
    _later(out / "trainer_state.json", out / "model.safetensors")
    assert final_model.final_step(out) == (True, 30)


def _later(path, than):
    """`path` modified 1 s after `than` (an export writes trainer_state.json after its weights)."""
    t = than.stat().st_mtime_ns + 10**9
    os.utime(path, ns=(t, t))


def test_an_export_stopped_part_way_over_a_download_is_neither_its_step_nor_a_model(tmp_path):
    """Killed after its model.safetensors replaced the download's, before config.json: the re-run's line named
    'the final model of step 9' (the download's own trainer_state.json), and `eval --model out` said 'out has no
    config.json' where checkpoint-90 is the run's model."""
    out = tmp_path / "out"
    _download(out)
    _start(out)
    (out / "checkpoint-90").mkdir()
    (out / "config.json").unlink()  # the export's first removal
    (out / "model.safetensors").write_text("the run's weights")
    _later(out / "model.safetensors", out / "trainer_state.json")
    assert model_argument(str(out)) == (str(out / "checkpoint-90"), f"note: {out} holds no final model yet (its "
                                        f"run's export was stopped part way): using its newest checkpoint, "
                                        f"{out / 'checkpoint-90'}")
    assert final_model.remove_final(out).startswith("overwrite_output_dir: removed the final model an earlier run exported")
