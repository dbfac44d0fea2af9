"""`eval` of a run's directory from another directory than the one the run was started in: the run named its model
by a relative path (`--model_name_or_path ./models/tiny`, as docs/MOE.md does with ./configs/deepseek-v3-tiny),
which eval no longer needs (the directory evaluated holds the model, as `generate` reads it); a relative input_dir,
which the run's split does need, is one line naming args.json, the run's directory and the fix."""
import json
import os
import shutil
from pathlib import Path

import pytest

from data_helpers import write_tokens

from pretrain_cli import cli
from pretrain_cli.config.presets import resolve_model_dir
from pretrain_cli.errors import UserError
from pretrain_cli.models.config import ModelConfig

TRAIN = ["--model_name_or_path", "./models/tiny", "--input_dir", "./data/c", "--device", "cpu", "--max_steps", "2",
         "--save_steps", "2", "--max_seq_length", "32", "--per_device_train_batch_size", "2",
         "--per_device_eval_batch_size", "2", "--do_train", "--do_eval", "--eval_iters", "1", "--split", "90,5,5",
         "--logging_steps", "2", "--disable_tqdm", "true"]


class _In:
    """The current directory set to `path` for the block (each command reads relative paths from it)."""

    def __init__(self, path):
        self.path, self.before = path, None

    def __enter__(self):
        self.before = os.getcwd()
        os.chdir(self.path)

    def __exit__(self, *exc):
        os.chdir(self.before)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(started, other, output_dir): a 2-step run started in `started` naming its model and data relatively, its
    output_dir outside `started` (as the user's was)."""
    root = tmp_path_factory.mktemp("elsewhere")
    started, other, out = root / "repo", root / "other", root / "runs" / "tiny"
    (started / "data").mkdir(parents=True)
    other.mkdir()
    shutil.copytree(resolve_model_dir("micro-qwen2"), started / "models" / "tiny")
    write_tokens(started / "data" / "c", n_docs=40, doc_len=64, vocab_size=64)
    with _In(started):
        assert cli.main(["train", *TRAIN, "--output_dir", str(out)]) == 0
    return started, other, out


def _eval(capsys, *argv):
    code, out = cli.main(["eval", *argv]), capsys.readouterr()
    return code, out.out, out.err.strip().splitlines()


def test_a_runs_checkpoint_evaluates_from_another_directory_without_its_model_path(trained, capsys):
    """The run's split, from the run's directory and from another: the same loss (the model is the directory
    evaluated). Before, from elsewhere: `model_name_or_path: './models/tiny' is neither a local directory nor a
    preset ... huggingface-cli download ./models/tiny`."""
    started, other, out = trained
    data = str(started / "data" / "c")
    losses = []
    for where in (started, other):
        for model in (out / "checkpoint-2", out):
            with _In(where):
                code, stdout, err = _eval(capsys, "--model", str(model), "--input_dir", data, "--json")
            assert code == 0, err
            losses.append(json.loads(stdout)["loss"])
    assert losses[0] == losses[2] and losses[1] == losses[3], losses
    with _In(other):  # --config the run's record: its output_dir is where the record lies, not the path recorded
        code, stdout, err = _eval(capsys, "--config", str(out / "args.json"), "--input_dir", data, "--json")
    assert code == 0 and json.loads(stdout)["loss"] == losses[1], err


def test_a_relative_input_dir_is_read_from_where_the_run_started_said_once(trained, capsys):
    """From another directory the recorded ./data/c means the run's (started/data/c): read from there, with one
    note; the loss is the one from where the run started. Before: one error line, "run eval from there"."""
    started, other, out = trained
    record = json.loads((out / "checkpoint-2" / "args.json").read_text())
    assert record["working_directory"] == str(started)
    losses = []
    for where in (started, other):
        with _In(where):
            code, stdout, err = _eval(capsys, "--model", str(out / "checkpoint-2"), "--json")
        assert code == 0, err
        losses.append(json.loads(stdout)["loss"])
        notes = [x for x in err if "input_dir" in x]
        assert notes == ([] if where == started else [
            f"note: {out / 'checkpoint-2' / 'args.json'}: input_dir ./data/c read from {started}, the directory its "
            f"run was started in (relative paths of args.json mean that directory)"]), err
    assert losses[0] == losses[1], losses


def test_a_relative_input_dir_here_that_may_not_be_the_runs_is_refused_naming_both(trained, capsys, tmp_path):
    """R6: from other2/ whose ./data/tiny held other text, eval read it without a word (loss 5.6484, 5.5721 from the
    run's directory). Other files of the same name here, or the name here only (the run's gone), are refused in
    one line naming both; the same files here are read from the run's directory."""
    started, other, out = trained
    here = tmp_path / "other2"
    (here / "data").mkdir(parents=True)
    write_tokens(here / "data" / "c", n_docs=30, doc_len=64, vocab_size=64)
    args_json = out / "checkpoint-2" / "args.json"
    with _In(here):
        code, _, err = _eval(capsys, "--model", str(out / "checkpoint-2"))
    assert code == 2 and err == [
        f"error: {args_json}: input_dir ./data/c is relative to the directory its run was started in ({started}), and "
        f"{started / 'data' / 'c'} there and {here / 'data' / 'c'} here hold different files; pass --input_dir with "
        f"the one to evaluate on ({started / 'data' / 'c'} is the run's)"], err
    for suffix in (".bin", ".idx"):  # the same files here: the run's, read from where it started
        shutil.copy(started / "data" / f"c{suffix}", here / "data" / f"c{suffix}")
    with _In(here):
        code, _, err = _eval(capsys, "--model", str(out / "checkpoint-2"))
    assert code == 0 and any(x.startswith(f"note: {args_json}: input_dir ./data/c read from {started}") for x in err)
    moved = tmp_path / "gone"  # a record whose run directory no longer holds the data
    shutil.copytree(out / "checkpoint-2", moved)
    record = json.loads((moved / "args.json").read_text())
    record["working_directory"] = str(tmp_path / "deleted")
    (moved / "args.json").write_text(json.dumps(record))
    with _In(here):
        code, _, err = _eval(capsys, "--model", str(moved))
    assert code == 2 and err == [
        f"error: {moved / 'args.json'}: input_dir ./data/c is relative to the directory its run was started in "
        f"({tmp_path / 'deleted'}), where it no longer exists; {here / 'data' / 'c'} (from here) may hold other "
        f"text: pass --input_dir {here / 'data' / 'c'} to evaluate on it, or --input_dir with the run's token "
        f"files"], err


def test_a_record_without_its_working_directory_says_so_and_where_the_path_is_found(trained, capsys, tmp_path):
    """A record written before `working_directory`: the directories about it are tried (a run's output_dir inside
    the directory it was started in); found nowhere, the fix is an absolute --input_dir or --data."""
    started, other, out = trained
    for inside in (True, False):
        run = (started / "out" if inside else tmp_path / "run") / "tiny"
        shutil.copytree(out / "checkpoint-2", run)
        record = json.loads((run / "args.json").read_text())
        del record["working_directory"]
        (run / "args.json").write_text(json.dumps(record))
        with _In(other):
            code, _, err = _eval(capsys, "--model", str(run))
        fix = (f"it is found from {started}: run eval from there, or pass --input_dir {started / 'data' / 'c'}"
               if inside else "pass --input_dir with the token files' path (an absolute one), or --data PREFIX")
        assert code == 2 and err == [
            f"error: {run / 'args.json'}: input_dir ./data/c is relative to the directory its run was started in "
            f"(which this record does not name) and is not found from here ({other}); {fix}"], err


def test_a_recorded_data_folder_here_with_other_files_beside_the_runs_token_files_is_the_runs(tmp_path, monkeypatch):
    """R11: a relative input_dir folder was compared file by file over the whole folder: `eval --model ../proj/out`
    from a directory whose ./data held the run's token files and a README was refused as "different files". Only
    the token files the run reads (every prefix's .bin/.idx, sidecar where both have one) are compared: another
    prefix here, or other tokens under the run's names, still are a difference."""
    from pretrain_cli.orchestration.recorded_paths import input_dir_of

    started, here = tmp_path / "proj", tmp_path / "other"
    for d in (started, here):
        (d / "data").mkdir(parents=True)
        write_tokens(d / "data" / "c", n_docs=8, doc_len=16, vocab_size=64)
    (here / "data" / "README.md").write_text("where these tokens came from")
    (here / "data" / "c.json").write_text("{}")  # a sidecar the run's copy lacks: the same tokens
    (started / "data" / "tokenizer").mkdir()
    config = str(tmp_path / "out" / "args.json")
    record = {"arguments": {"input_dir": "./data"}, "run": {}, "working_directory": str(started)}
    monkeypatch.chdir(here)
    change, note = input_dir_of(config, record, [])
    assert change == {"input_dir": str(started / "data")} and note == (
        f"note: {config}: input_dir ./data read from {started}, the directory its run was started in (relative "
        f"paths of args.json mean that directory)")
    write_tokens(here / "data" / "d", n_docs=8, doc_len=16, vocab_size=64)  # a prefix the run would read here too
    refused = (f"{config}: input_dir ./data is relative to the directory its run was started in ({started}), and "
               f"{started / 'data'} there and {here / 'data'} here hold different files; pass --input_dir with the one "
               f"to evaluate on ({started / 'data'} is the run's)")
    with pytest.raises(UserError) as e:
        input_dir_of(config, record, [])
    assert str(e.value) == refused
    for suffix in (".bin", ".idx"):
        (here / "data" / f"d{suffix}").unlink()
    write_tokens(here / "data" / "c", n_docs=8, doc_len=16, vocab_size=60)  # other tokens under the run's names
    with pytest.raises(UserError) as e:
        input_dir_of(config, record, [])
    assert str(e.value) == refused


def test_our_checkpoint_without_its_index_is_said_so_by_eval(trained, capsys, tmp_path):
    """R11: eval of a checkpoint-N of ours that lost checkpoint.index.json said "transformers' shards, without their
    model.safetensors.index.json ... download or export it again" of 2 ranks' files (`test_model_files`), and read
    one process's model.safetensors, whose header records pieces, without a word. Now ranks' pieces only the index
    placed get `storage.intact`'s line (`test_eval_lost_index`), and one process's, whole in that file, is read with
    one note naming the missing index."""
    started, other, out = trained
    ckpt = tmp_path / "checkpoint-2"
    shutil.copytree(out / "checkpoint-2", ckpt)
    (ckpt / "checkpoint.index.json").unlink()
    with _In(started):
        code, _, err = _eval(capsys, "--model", str(ckpt), "--input_dir", str(started / "data" / "c"))
    said = [x for x in err if "checkpoint.index.json" in x]
    assert code == 0 and said == [f"note: {ckpt / 'checkpoint.index.json'} is missing: the weights are read from its "
                                  f"model.safetensors, whole as its one process wrote them, without the checksums "
                                  f"the index kept; a resume does not take this checkpoint"], err


@pytest.mark.parametrize("name", ["./configs/deepseek-v3-tiny", "../models/x", "models/org/x", "models\\x"])
def test_a_plain_path_not_found_is_never_sent_to_the_hub(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        resolve_model_dir(name)
    assert str(e.value) == (f"model_name_or_path: the directory {name} does not exist (a relative path, read from the "
                            f"current directory, {tmp_path}); check the path, or give the model directory's absolute "
                            f"path")


def test_a_hub_name_keeps_its_download_hint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="huggingface-cli download someorg/some-model --local-dir"):
        resolve_model_dir("someorg/some-model")


def test_n_group_left_out_is_named_as_transformers_default_with_the_key_to_set():
    """A DeepSeek-V3 config.json without n_group took transformers' 8, which 6 experts do not divide: said so (it
    read as if the file set 8), and the fix sets it (V3 routes by noaux_tc only: no "use topk_method greedy")."""
    path = Path(__file__).resolve().parents[2] / "configs" / "deepseek-v3-tiny" / "config.json"
    raw = {**json.loads(path.read_text()), "n_routed_experts": 6, "num_experts_per_tok": 2, "topk_group": 1}
    del raw["n_group"]
    with pytest.raises(UserError) as e:
        ModelConfig.from_dict(raw, source="m/config.json")
    assert str(e.value) == ("m/config.json: n_group (8: transformers' deepseek_v3 default, as config.json does not "
                            "set n_group) must divide the 6 routed experts and topk_group (1) lie in 1..n_group; set "
                            "n_group in config.json (n_group 1, topk_group 1: no group limit)")
    assert ModelConfig.from_dict({**raw, "n_group": 1}, source="m/config.json").n_group == 1  # (the fix named works)
    raw["n_group"] = 4  # set by the file, wrong: no default named
    with pytest.raises(UserError, match=r"^m/config.json: n_group \(4\) must divide .*; fix them \(n_group 1"):
        ModelConfig.from_dict(raw, source="m/config.json")
