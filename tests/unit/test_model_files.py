"""Which files `convert.find_weights` reads a model directory's model from: transformers' names judge
(`convert.HF_WEIGHTS`), as from_pretrained judges them. Before, a directory without an index had every *.safetensors
read as one model: a user's model_ema.safetensors alone was taken for the model (transformers raises OSError there),
beside model-base.safetensors both were read, and beside the first shard of an export killed part way a tensor both
held came silently from the last file."""
import pytest

from pretrain_cli.errors import UserError
from pretrain_cli.models import convert


def _files(d, *names):
    d.mkdir(exist_ok=True)
    for name in names:
        (d / name).write_bytes(b"")
    return d


def _read(d):
    return [p.rsplit("/", 1)[1] for p in convert.find_weights(str(d))]


def test_weights_under_other_names_alone_are_refused_naming_them(tmp_path):
    for names in (["model_ema.safetensors"], ["model_ema.safetensors", "model-base.safetensors"],
                  ["model.fp16.safetensors"]):
        d = _files(tmp_path / names[-1], "config.json", *names)
        with pytest.raises(UserError) as e:
            convert.find_weights(str(d))
        assert str(e.value) == (f"{d}: holds weights only under names not read as a model ({', '.join(sorted(names))})"
                                f": the model is model.safetensors, or the shards model.safetensors.index.json lists; "
                                f"if one of them is this model's weights, rename it model.safetensors (beside its "
                                f"config.json), else point to another directory")


def test_shards_without_their_index_are_refused_naming_them(tmp_path):
    d = _files(tmp_path / "killed", "config.json", "model-00001-of-00003.safetensors", "model_ema.safetensors")
    with pytest.raises(UserError, match=r"killed: holds model-00001-of-00003.safetensors, transformers' shards, "
                                        r"without their model.safetensors.index.json: part of a model \(an export or "
                                        r"download stopped part way\), which is not read"):
        convert.find_weights(str(d))


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
    # one from before the index: one process's model.safetensors and optimizer.safetensors
    assert _read(_files(tmp_path / "checkpoint-2", "model.safetensors", "optimizer.safetensors")) == \
        ["model.safetensors"]
