"""Which files `model_files.find_weights` reads a model directory's model from: transformers' names judge
(`model_files.HF_WEIGHTS`), as from_pretrained judges them. Before, a directory without an index had every *.safetensors
read as one model: a user's model_ema.safetensors alone was taken for the model (transformers raises OSError there),
beside model-base.safetensors both were read, and beside the first shard of an export killed part way a tensor both
held came silently from the last file."""
import numpy as np
import pytest
from safetensors.numpy import save_file

from pretrain_cli.errors import UserError
from pretrain_cli.models import convert, model_files


def _files(d, *names):
    d.mkdir(exist_ok=True)
    for name in names:
        (d / name).write_bytes(b"")
    return d


def _read(d):
    return [p.rsplit("/", 1)[1] for p in model_files.find_weights(str(d))]


def test_weights_under_other_names_alone_are_refused_naming_them(tmp_path):
    for names in (["model_ema.safetensors"], ["model_ema.safetensors", "model-base.safetensors"],
                  ["model.fp16.safetensors"]):
        d = _files(tmp_path / names[-1], "config.json", *names)
        with pytest.raises(UserError) as e:
            model_files.find_weights(str(d))
        assert str(e.value) == (f"{d}: holds weights only under names not read as a model ({', '.join(sorted(names))})"
                                f": the model is model.safetensors, or the shards model.safetensors.index.json lists; "
                                f"if one of them is this model's weights, rename it model.safetensors (beside its "
                                f"config.json), else point to another directory")


def test_shards_without_their_index_are_refused_naming_them(tmp_path):
    d = _files(tmp_path / "killed", "config.json", "model-00001-of-00003.safetensors", "model_ema.safetensors")
    with pytest.raises(UserError, match=r"killed: holds model-00001-of-00003.safetensors, transformers' shards, "
                                        r"without their model.safetensors.index.json: part of a model \(an export or "
                                        r"download stopped part way\), which is not read"):
        model_files.find_weights(str(d))


def test_a_model_is_its_single_file_its_index_or_a_checkpoints_pieces(tmp_path):
    assert _read(_files(tmp_path / "single", "model.safetensors", "model_ema.safetensors")) == ["model.safetensors"]
    d = _files(tmp_path / "sharded", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
               "model_ema.safetensors")
    (d / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model-00001-of-00002.safetensors", '
                                                    '"b": "model-00002-of-00002.safetensors"}}')
    assert _read(d) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    # a checkpoint-N of 2 ranks: their files, placed by checkpoint.index.json; never the optimizer's
    d = _files(tmp_path / "checkpoint-4", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
               "optimizer-00001-of-00002.safetensors", "optimizer-00002-of-00002.safetensors", "checkpoint.index.json")
    assert _read(d) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    # one from before the index: one process's model.safetensors and optimizer.safetensors (headers read)
    d = _files(tmp_path / "checkpoint-2")
    for name in ("model.safetensors", "optimizer.safetensors"):
        save_file({"w": np.zeros(2, np.float32)}, str(d / name))
    assert _read(d) == ["model.safetensors"]
    # a pipeline layout's checkpoint: transformers' index beside checkpoint.index.json, read by its pieces as before
    d = _files(tmp_path / "checkpoint-6", "model.safetensors", "model-00001-of-00002.safetensors",
               "model-00002-of-00002.safetensors", "optimizer-00001-of-00002.safetensors", "checkpoint.index.json")
    (d / "model.safetensors.index.json").write_text(INDEX)
    assert _read(d) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


INDEX = ('{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}')


def test_model_safetensors_beside_an_index_of_other_shards_is_refused_naming_both(tmp_path):
    """transformers reads model.safetensors first (modeling_utils: before the index); we read the index's shards: a
    directory holding both (two models mixed: our writer never leaves both) was read as another model than
    from_pretrained's. An index naming model.safetensors itself is one model."""
    d = _files(tmp_path / "mixed", "config.json", "model.safetensors", "model-00001-of-00002.safetensors",
               "model-00002-of-00002.safetensors")
    (d / "model.safetensors.index.json").write_text(INDEX)
    with pytest.raises(UserError) as e:
        model_files.find_weights(str(d))
    assert str(e.value) == (f"{d}: holds both model.safetensors, which transformers reads, and "
                            f"model.safetensors.index.json, which names model-00001-of-00002.safetensors, "
                            f"model-00002-of-00002.safetensors: two models mixed, not read; remove the one that is "
                            f"not this model (model.safetensors, or the index and its shards), or point to another "
                            f"directory")
    (d / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model.safetensors"}}')
    assert _read(d) == ["model.safetensors"]


def test_our_checkpoint_without_its_index_gets_intacts_line_not_a_downloads(tmp_path):
    """A checkpoint-N of ours that lost checkpoint.index.json: eval and continue_training said "transformers'
    shards, without their model.safetensors.index.json ... download or export it again", export "checkpoint.index.json
    is missing". Now all say `storage.intact`'s line, ended for what each does with it."""
    ranks = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
             "optimizer-00001-of-00002.safetensors", "optimizer-00002-of-00002.safetensors")
    d = _files(tmp_path / "checkpoint-4", "config.json", "trainer_state.json", *ranks)
    with pytest.raises(UserError) as e:
        model_files.find_weights(str(d))
    assert str(e.value) == (f"{d / 'checkpoint.index.json'} is missing; the checkpoint is incomplete: point --model "
                            f"to another checkpoint-N")
    with pytest.raises(UserError) as e:
        convert.readable_weights(str(d))
    assert str(e.value) == (f"{d / 'checkpoint.index.json'} is missing; the checkpoint is incomplete: point "
                            f"model_name_or_path to another of the run's checkpoints")
    (d / "model.safetensors.index.json").write_text(INDEX)  # a pipeline layout's: its pieces, not a model's shards
    with pytest.raises(UserError, match="checkpoint.index.json is missing; the checkpoint is incomplete"):
        model_files.find_weights(str(d))
    # one process's, written with an index (its header records its pieces), under a name of its own and our record
    d = _files(tmp_path / "saved", "optimizer.safetensors")
    (d / "args.json").write_text('{"arguments": {}, "run": {}}')
    save_file({"w": np.zeros(2, np.float32)}, str(d / "model.safetensors"),
              metadata={"pretrain_cli.pieces": '{"w": {"offsets": [0], "global_shape": [2]}}'})
    with pytest.raises(UserError, match=r"saved/checkpoint.index.json is missing; the checkpoint is incomplete"):
        model_files.find_weights(str(d))
    # PaddleNLP's Trainer's checkpoint (its optimizer in safetensors too) is no checkpoint of ours: its weights read
    d = _files(tmp_path / "checkpoint-8", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
               "optimizer-00001-of-00002.safetensors", "training_args.bin")
    (d / "model.safetensors.index.json").write_text(INDEX)
    assert _read(d) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
