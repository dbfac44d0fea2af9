"""A checkpoint that lost its checkpoint.index.json, read by `eval`: one process's (model.safetensors records each
tensor whole, its trainer_state.json there) evaluates from its model.safetensors with one note naming the missing
index; it was refused as incomplete, though its weights were all there. A multi-rank one stays refused (its pieces
lie in files only the index places), and so does a resume of either (`storage.intact.problem`)."""
import contextlib
import io
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file

from data_helpers import write_tokens

from pretrain_cli import cli
from pretrain_cli.storage import intact

TRAIN = ["--model_name_or_path", "micro-llama", "--device", "cpu", "--max_steps", "2", "--save_steps", "2",
         "--max_seq_length", "32", "--per_device_train_batch_size", "2", "--do_train", "--split", "90,5,5",
         "--disable_tqdm", "true"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint-2 of a one-process run of micro-llama."""
    root = tmp_path_factory.mktemp("lost_index")
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["train", *TRAIN, "--input_dir", write_tokens(root / "c", vocab_size=512),
                         "--output_dir", str(root / "run")]) == 0
    return root / "run" / "checkpoint-2"


def _eval(model, capsys) -> tuple[int, str, str]:
    code = cli.main(["eval", "--model", str(model), "--max_batches", "1"])
    out, err = capsys.readouterr()
    return code, out, err


def test_one_process_checkpoint_without_its_index_evaluates_with_one_note(checkpoint, tmp_path, capsys):
    code, whole, _ = _eval(checkpoint, capsys)
    assert code == 0
    lost = tmp_path / "checkpoint-2"
    shutil.copytree(checkpoint, lost)
    (lost / "checkpoint.index.json").unlink()
    code, out, err = _eval(lost, capsys)
    assert code == 0, err
    notes = [x for x in err.splitlines() if "checkpoint.index.json" in x]
    assert notes == [f"note: {lost / 'checkpoint.index.json'} is missing: the weights are read from its "
                     f"model.safetensors, whole as its one process wrote them, without the checksums the index kept; "
                     f"a resume does not take this checkpoint"], err
    assert out.split("; loss ")[1].split(";")[0] == whole.split("; loss ")[1].split(";")[0], (out, whole)
    # a resume still refuses it: the index kept the checksums it checks, and it reads the optimizer state too
    assert intact.problem(lost) == f"{lost / 'checkpoint.index.json'} is missing"


def test_a_multi_rank_checkpoint_without_its_index_is_still_refused(checkpoint, tmp_path, capsys):
    """Two ranks' files (here one process's twice, under the ranks' names): no index, no way to put the pieces
    together."""
    lost = tmp_path / "checkpoint-2"
    shutil.copytree(checkpoint, lost)
    (lost / "checkpoint.index.json").unlink()
    for kind in ("model", "optimizer"):
        for rank in (1, 2):
            shutil.copy(lost / f"{kind}.safetensors", lost / f"{kind}-0000{rank}-of-00002.safetensors")
        (lost / f"{kind}.safetensors").unlink()
    code, _, err = _eval(lost, capsys)
    assert code != 0 and err.strip() == (f"error: {lost / 'checkpoint.index.json'} is missing; the checkpoint is "
                                         f"incomplete: point --model to another checkpoint-N"), err


def test_only_a_file_that_records_every_tensor_whole_is_read_without_the_index(tmp_path):
    """What `intact.whole_without_index` takes: one process's model.safetensors whose header records each tensor at
    offsets 0 and of its own shape, beside a trainer state; not a piece of a larger tensor, nor a file recording
    nothing of its pieces (a checkpoint from before the index, judged as before), nor one without a trainer state."""
    def written(name: str, pieces: str | None, state: bool = True):
        d = tmp_path / name
        d.mkdir()
        meta = {"format": "pt"} | ({"pretrain_cli.pieces": pieces} if pieces is not None else {})
        save_file({"w": np.zeros((2, 3), np.float32)}, str(d / "model.safetensors"), metadata=meta)
        if state:
            (d / "trainer_state.json").write_text('{"global_step": 2, "consumed_samples": 4}')
        return d

    assert intact.whole_without_index(written("whole", '{"w": {"offsets": [0, 0], "global_shape": [2, 3]}}'))
    assert not intact.whole_without_index(written("piece", '{"w": {"offsets": [2, 0], "global_shape": [4, 3]}}'))
    assert not intact.whole_without_index(written("older", None))
    assert not intact.whole_without_index(written("stateless", '{"w": {"offsets": [0, 0], "global_shape": [2, 3]}}',
                                                  state=False))
