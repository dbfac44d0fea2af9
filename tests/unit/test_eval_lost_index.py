"""A checkpoint that lost its checkpoint.index.json, read for its weights alone (`eval`, `generate`, `export`,
`continue_training`): one judge, `storage.intact.weights_without_index`, takes it where each tensor is whole in the
files the run's recorded world size leaves (one process's model.safetensors; a data-parallel run's shards, which
transformers' model.safetensors.index.json lists), with one note naming the missing index. A checkpoint whose pieces
only the index could put together stays refused, as does a resume of any of them (`storage.intact.problem`); and
`eval --model RUN_DIR` takes the checkpoint a resume would (the newest complete), naming the one passed over."""
import contextlib
import io
import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from data_helpers import write_tokens

from pretrain_cli import cli
from pretrain_cli.storage import checkpoint_index, intact

TRAIN = ["--model_name_or_path", "micro-llama", "--device", "cpu", "--max_steps", "2", "--save_steps", "1",
         "--max_seq_length", "32", "--per_device_train_batch_size", "2", "--do_train", "--split", "90,5,5",
         "--disable_tqdm", "true"]
NOTE = ("is missing: the weights are read from {}, without the checksums the index kept; a resume does not take this "
        "checkpoint")
ONE = "its model.safetensors, whole as its one process wrote them"
TWO = "the 2 files its model.safetensors.index.json lists, each tensor whole as its 2 processes wrote them"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A one-process run of micro-llama: checkpoint-1, checkpoint-2 and its final model."""
    root = tmp_path_factory.mktemp("lost_index")
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["train", *TRAIN, "--input_dir", write_tokens(root / "c", vocab_size=512),
                         "--output_dir", str(root / "run")]) == 0
    return root / "run"


@pytest.fixture(scope="module")
def checkpoint(run):
    return run / "checkpoint-2"


def _eval(model, capsys, *more) -> tuple[int, str, str]:
    code = cli.main(["eval", "--model", str(model), "--max_batches", "1", *more])
    out, err = capsys.readouterr()
    return code, out, err


def _loss(out: str) -> str:
    return out.split("; loss ")[1].split(";")[0]


def _lost(checkpoint, dest):
    shutil.copytree(checkpoint, dest)
    (dest / "checkpoint.index.json").unlink()
    return dest


def _data_parallel(checkpoint, dest, hf_index: bool = True):
    """`checkpoint` as a 2-process data-parallel run saves it (`training.shard_writer`): each rank's whole tensors
    in its own model file recording them, transformers' index listing them, args.json recording world_size 2; then
    its checkpoint.index.json lost."""
    lost = _lost(checkpoint, dest)
    tensors = load_file(str(lost / "model.safetensors"))
    names = sorted(tensors)
    shards = {checkpoint_index.file_name("model", r, 2): names[r::2] for r in range(2)}
    for fname, keys in shards.items():
        held = [{"name": k, "offsets": [0] * tensors[k].ndim, "global_shape": list(tensors[k].shape)} for k in keys]
        save_file({k: tensors[k] for k in keys}, str(lost / fname), metadata=checkpoint_index.file_metadata(held))
    for r in range(2):
        shutil.copy(lost / "optimizer.safetensors", lost / checkpoint_index.file_name("optimizer", r, 2))
    for name in ("model.safetensors", "optimizer.safetensors"):
        (lost / name).unlink()
    if hf_index:
        (lost / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}))
    args = json.loads((lost / "args.json").read_text())
    args["run"]["parallel"].update(world_size=2, dp_degree=2)
    (lost / "args.json").write_text(json.dumps(args))
    return lost


def test_one_process_checkpoint_without_its_index_evaluates_with_one_note(checkpoint, tmp_path, capsys):
    code, whole, _ = _eval(checkpoint, capsys)
    assert code == 0
    lost = _lost(checkpoint, tmp_path / "checkpoint-2")
    code, out, err = _eval(lost, capsys)
    assert code == 0, err
    notes = [x for x in err.splitlines() if "checkpoint.index.json" in x]
    assert notes == [f"note: {lost / 'checkpoint.index.json'} " + NOTE.format(ONE)], err
    assert _loss(out) == _loss(whole), (out, whole)
    # a resume still refuses it: the index kept the checksums it checks, and it reads the optimizer state too
    assert intact.problem(lost) == f"{lost / 'checkpoint.index.json'} is missing"


def test_a_data_parallel_checkpoint_without_its_index_evaluates_from_transformers_index(checkpoint, tmp_path, capsys):
    """Every tensor whole in the shards transformers' index lists: read as the one-process checkpoint is (it was
    refused as "incomplete"); without that index, which shard holds what is no longer known, and it is refused."""
    code, whole, _ = _eval(checkpoint, capsys)
    lost = _data_parallel(checkpoint, tmp_path / "checkpoint-2")
    code, out, err = _eval(lost, capsys)
    assert code == 0, err
    assert [x for x in err.splitlines() if "checkpoint.index.json" in x] == [
        f"note: {lost / 'checkpoint.index.json'} " + NOTE.format(TWO)], err
    assert _loss(out) == _loss(whole), (out, whole)
    (lost / "model.safetensors.index.json").unlink()
    code, _, err = _eval(lost, capsys)
    assert code != 0 and err.strip() == (f"error: {lost / 'checkpoint.index.json'} is missing; the checkpoint is "
                                         f"incomplete: point --model to another checkpoint-N"), err


def test_a_wider_runs_files_renamed_to_one_process_names_are_refused(checkpoint, tmp_path, capsys):
    """Rank 0's files of a 2-process run renamed model.safetensors / optimizer.safetensors look like one process's;
    args.json's world_size says otherwise. Before, eval said the weights were "whole as its one process wrote them",
    then stopped at the half of the tensors rank 1 held."""
    lost = _data_parallel(checkpoint, tmp_path / "checkpoint-2")
    for kind in ("model", "optimizer"):
        (lost / checkpoint_index.file_name(kind, 0, 2)).rename(lost / f"{kind}.safetensors")
        (lost / checkpoint_index.file_name(kind, 1, 2)).unlink()
    (lost / "model.safetensors.index.json").unlink()
    code, _, err = _eval(lost, capsys)
    assert code != 0 and err.strip() == (f"error: {lost / 'checkpoint.index.json'} is missing; the checkpoint is "
                                         f"incomplete: point --model to another checkpoint-N"), err


def test_a_multi_rank_checkpoint_without_its_index_is_still_refused(checkpoint, tmp_path, capsys):
    """Two ranks' files (here one process's twice, under the ranks' names) and no transformers' index: no way to
    put the pieces together."""
    lost = _lost(checkpoint, tmp_path / "checkpoint-2")
    for kind in ("model", "optimizer"):
        for rank in (1, 2):
            shutil.copy(lost / f"{kind}.safetensors", lost / f"{kind}-0000{rank}-of-00002.safetensors")
        (lost / f"{kind}.safetensors").unlink()
    code, _, err = _eval(lost, capsys)
    assert code != 0 and err.strip() == (f"error: {lost / 'checkpoint.index.json'} is missing; the checkpoint is "
                                         f"incomplete: point --model to another checkpoint-N"), err


def test_only_files_that_record_every_tensor_whole_are_read_without_the_index(tmp_path):
    """What `intact.weights_without_index` takes: a model.safetensors whose header records each tensor at offsets
    0 and of its own shape, beside a trainer state and alone; not a piece of a larger tensor (a ZeRO-3 rank's slice
    renamed, even at offsets 0), nor a file recording nothing of its pieces (a checkpoint from before the index,
    judged as before), nor one without a trainer state, nor one beside a rank's file, nor one of a run whose args.json
    records 2 processes."""
    def written(name: str, pieces: str | None, state: bool = True, beside: str | None = None, world=None):
        d = tmp_path / name
        d.mkdir()
        meta = {"format": "pt"} | ({"pretrain_cli.pieces": pieces} if pieces is not None else {})
        save_file({"w": np.zeros((2, 3), np.float32)}, str(d / "model.safetensors"), metadata=meta)
        if beside is not None:
            shutil.copy(d / "model.safetensors", d / beside)
        if state:
            (d / "trainer_state.json").write_text('{"global_step": 2, "consumed_samples": 4}')
        if world is not None:
            (d / "args.json").write_text(json.dumps({"run": {"parallel": {"world_size": world}}}))
        return d

    whole = '{"w": {"offsets": [0, 0], "global_shape": [2, 3]}}'
    assert intact.weights_without_index(written("whole", whole)) == [tmp_path / "whole" / "model.safetensors"]
    assert intact.weights_without_index(written("one", whole, world=1)) == [tmp_path / "one" / "model.safetensors"]
    assert intact.weights_without_index(written("piece", '{"w": {"offsets": [2, 0], "global_shape": [4, 3]}}')) is None
    assert intact.weights_without_index(written("slice", '{"w": {"offsets": [0, 0], "global_shape": [4, 3]}}')) is None
    assert intact.weights_without_index(written("older", None)) is None
    assert intact.weights_without_index(written("stateless", whole, state=False)) is None
    assert intact.weights_without_index(written("beside", whole, beside="model-00002-of-00002.safetensors")) is None
    assert intact.weights_without_index(written("two", whole, world=2)) is None


@pytest.mark.parametrize("shard", [["model-00001-of-00002.safetensors"], {"file": "model-00001-of-00002.safetensors"},
                                   None, 1])
def test_a_weight_map_naming_no_file_is_refused_in_one_line(checkpoint, tmp_path, capsys, shard):
    """transformers' index mapping a tensor to a list or an object: the judge's set() of its values ended eval,
    generate, export and check in a TypeError traceback (review R9 on 214f97fc); now no lost-index read, so the
    checkpoint is refused as any other without its index."""
    lost = _data_parallel(checkpoint, tmp_path / "checkpoint-2")
    hf = lost / "model.safetensors.index.json"
    index = json.loads(hf.read_text())
    index["weight_map"][sorted(index["weight_map"])[0]] = shard
    hf.write_text(json.dumps(index))
    assert intact.weights_without_index(lost) is None
    code, _, err = _eval(lost, capsys)
    assert code == 2 and err.strip() == (f"error: {lost / 'checkpoint.index.json'} is missing; the checkpoint is "
                                         f"incomplete: point --model to another checkpoint-N"), err
    assert cli.main(["export", str(lost), str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {lost}: cannot export: {lost / 'checkpoint.index.json'} is "
                                               f"missing; export another checkpoint-N (or the final directory)")


def test_export_and_continue_training_take_what_eval_takes(checkpoint, tmp_path, capsys):
    """One judge for every reader of the weights alone: `export` of a checkpoint whose weights are whole without
    its index writes the tensors the intact checkpoint's export writes, and a run continues from it, each with the
    note (both refused it as incomplete before, though eval read it)."""
    def exported(src, out):
        code = cli.main(["export", str(src), str(out)])
        err = capsys.readouterr().err
        assert code == 0, err
        return load_file(str(out / "model.safetensors")), [x for x in err.splitlines() if "checkpoint.index" in x]

    whole, notes = exported(checkpoint, tmp_path / "whole")
    assert notes == []
    for lost, how in ((_lost(checkpoint, tmp_path / "one" / "checkpoint-2"), ONE),
                      (_data_parallel(checkpoint, tmp_path / "dp" / "checkpoint-2"), TWO)):
        got, notes = exported(lost, lost.parent / "export")
        assert notes == [f"note: {lost / 'checkpoint.index.json'} " + NOTE.format(how)]
        assert sorted(got) == sorted(whole) and all(np.array_equal(got[k], whole[k]) for k in whole)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(["train", *TRAIN[2:], "--model_name_or_path", str(lost), "--continue_training", "1",
                         "--max_steps", "1", "--input_dir", str(checkpoint.parent.parent / "c"),
                         "--output_dir", str(tmp_path / "continued")])
    assert code == 0, out.getvalue()
    said = f"model_name_or_path: {lost / 'checkpoint.index.json'} " + NOTE.format(TWO)
    assert said in out.getvalue(), out.getvalue()
    # the index gone with weights no reader can put together: export's own line, as before
    (lost / "model.safetensors.index.json").unlink()
    assert cli.main(["export", str(lost), str(tmp_path / "refused")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {lost}: cannot export: {lost / 'checkpoint.index.json'} is "
                                               f"missing; export another checkpoint-N (or the final directory)")


def test_a_run_directory_stands_for_its_newest_complete_checkpoint(run, tmp_path, capsys):
    """`eval --model RUN_DIR` of a run stopped before its export took its highest checkpoint-N, though it had lost
    its index and a resume takes checkpoint-1 beside it; now the checkpoint a resume takes, the other named. With no
    complete one left, the newest is read as it is (here with the lost-index note)."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "model.safetensors").unlink()  # (stopped before its final export)
    (copy / "checkpoint-2" / "checkpoint.index.json").unlink()
    code, out, err = _eval(copy, capsys)
    assert code == 0, err
    assert [x for x in err.splitlines() if "final model" in x] == [
        f"note: {copy} holds no final model yet (its run stopped before the export): using its newest complete "
        f"checkpoint, {copy / 'checkpoint-1'}; not checkpoint-2: {copy / 'checkpoint-2' / 'checkpoint.index.json'} "
        f"is missing (its weights are whole without it: --model {copy / 'checkpoint-2'} reads them)"], err
    assert f"; {copy / 'checkpoint-1'}, trained weights;" in out, out
    assert cli.main(["export", str(copy), str(tmp_path / "x")]) == 2  # (the line that names what eval reads)
    said = capsys.readouterr().err.strip()
    assert said.endswith(f"export its newest complete checkpoint, {copy / 'checkpoint-1'}, which eval --model {copy} "
                         f"reads"), said
    (copy / "checkpoint-2" / "model.safetensors").rename(copy / "weights")  # its weights no longer there whole
    code, out, err = _eval(copy, capsys)
    assert code == 0 and (f"; not checkpoint-2: {copy / 'checkpoint-2' / 'checkpoint.index.json'} is missing\n"
                          in err), err
    (copy / "weights").rename(copy / "checkpoint-2" / "model.safetensors")
    shutil.rmtree(copy / "checkpoint-1")
    code, out, err = _eval(copy, capsys)
    assert code == 0 and f"; {copy / 'checkpoint-2'}, trained weights;" in out, err
    assert f"using its newest checkpoint, {copy / 'checkpoint-2'}\n" in err, err


def test_a_run_directory_read_for_its_weights_does_not_judge_the_loss_scale(run, tmp_path):
    """The readers of the weights alone never load fp16's loss scale: a newest checkpoint whose `loss_scaler` a
    resume refuses is still the one `eval` / `generate` / `export` of the run directory read (they passed over it to
    checkpoint-1, naming the scale)."""
    from pretrain_cli.orchestration.recorded import trained_model

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "model.safetensors").unlink()  # (stopped before its final export)
    state_file = copy / "checkpoint-2" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "loss_scaler": {"scale": -1.0, "incr_count": 0, "decr_count": 0}}))
    model, note = trained_model(copy)
    assert model == copy / "checkpoint-2", note
    assert note.endswith(f"using its newest checkpoint, {copy / 'checkpoint-2'}"), note  # nothing passed over
    assert intact.newest_complete(copy)[0] == copy / "checkpoint-1"  # a resume still passes over it
