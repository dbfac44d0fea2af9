"""`continue_training: 1`: where the pretrained weights come from, and the one line when they cannot.

A preset (a hub name without a local directory) has no weights: one line says how to fetch them. A local
directory in HF or PaddleNLP format loads through `orchestration.prepare`, `training.run.build_model` and `lay_out`, as `train`
does — including a checkpoint as PaddleNLP saves a Qwen3 (HF's `model.` names with Paddle's `[in, out]` Linear
layout, its config.json keys, zero q/k/v biases from its Qwen2-derived attention, shards with an index).
"""
import json

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from safetensors.numpy import save_file  # noqa: E402

from pretrain_cli.orchestration.prepare import prepare  # noqa: E402
from pretrain_cli.run_config import Target  # noqa: E402
from pretrain_cli.errors import UserError  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.distributed.comms.comm import NoComm  # noqa: E402
from pretrain_cli.training.run import build_model as build_lazy, lay_out  # noqa: E402
from data_helpers import write_tokens  # noqa: E402

QWEN3 = dict(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def _args(tmp_path, model: str) -> str:
    """The argument file of a `continue_training` run of `model` over a token file of the model's vocabulary."""
    write_tokens(tmp_path / "data", vocab_size=QWEN3["vocab_size"])
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"model_name_or_path": model, "continue_training": 1, "do_train": True,
                                "output_dir": str(tmp_path / "out"), "input_dir": str(tmp_path / "data"),
                                "max_steps": 1, "max_seq_length": 32}))
    return str(path)


def _paddlenlp_qwen3(path):
    """(the model whose weights were saved, the directory) in PaddleNLP's Qwen3 format."""
    cfg = ModelConfig(**QWEN3)
    paddle.seed(3)
    src = build_model(cfg)
    tensors = {n: p.numpy() for n, p in src.named_parameters()}  # `model.` names, [in, out] Linear weights
    for layer in range(2):
        for proj, width in (("q", 64), ("k", 32), ("v", 32)):
            tensors[f"model.layers.{layer}.self_attn.{proj}_proj.bias"] = np.zeros(width, np.float32)
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    path.mkdir()
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(path / fname))
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}))
    hf = cfg.to_hf_dict()
    del hf["torch_dtype"]  # PaddleNLP writes `dtype` and its own keys
    hf.update(dtype="float32", use_flash_attention=True, fuse_attention_ffn=False, tensor_parallel_degree=1)
    (path / "config.json").write_text(json.dumps(hf))
    return src, path


def build_for_run(spec):
    """What `train` builds: the lazy model, its parameters read from the pretrained directory by the layout."""
    model = build_lazy(spec.run, spec.model_cfg)
    lay_out(spec.run, model, NoComm(), pretrained=spec.model_dir)
    return model


def test_paddlenlp_saved_qwen3_loads_through_prepare_and_build_model(tmp_path):
    src, path = _paddlenlp_qwen3(tmp_path / "qwen3-paddlenlp")
    spec = prepare(_args(tmp_path, str(path)), [], Target())
    assert spec.run.model.continue_training and spec.model_dir == path
    model = build_for_run(spec)
    want = dict(src.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.numpy(), want[name].numpy(), err_msg=name)


def test_nonzero_biases_the_model_has_not_are_still_refused(tmp_path):
    from safetensors.numpy import load_file

    _, path = _paddlenlp_qwen3(tmp_path / "qwen3-paddlenlp")
    shard = path / "model-00001-of-00002.safetensors"
    tensors = load_file(str(shard))
    bias = next(k for k in tensors if k.endswith("q_proj.bias"))
    tensors[bias] = np.ones_like(tensors[bias])
    save_file(tensors, str(shard))
    spec = prepare(_args(tmp_path, str(path)), [], Target())
    with pytest.raises(UserError, match="unexpected tensor.*q_proj.bias"):
        build_for_run(spec)


def test_without_weights_one_line_says_how_to_get_them(tmp_path, monkeypatch):
    from pretrain_cli.planning import hardware

    # a machine whose memory holds an 8 B model's training (this one's would add its own line: `host_fit`)
    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 2000.0)
    monkeypatch.setattr(hardware, "host_available_gib", lambda *a, **k: (2000.0, "MemAvailable"))
    with pytest.raises(UserError) as e:
        prepare(_args(tmp_path, "Qwen/Qwen3-8B"), [], Target())
    lines = str(e.value).splitlines()
    assert len(lines) == 1 and "`huggingface-cli download Qwen/Qwen3-8B --local-dir Qwen/Qwen3-8B`" in lines[0]
    with pytest.raises(UserError) as e:  # a test size has no hub repository to download from
        prepare(_args(tmp_path, "micro-qwen2"), [], Target())
    assert "huggingface-cli" not in str(e.value) and "config.json and *.safetensors weights" in str(e.value)
    pdparams = tmp_path / "paddlenlp-pickle"
    pdparams.mkdir()
    (pdparams / "config.json").write_text(json.dumps(ModelConfig(**QWEN3).to_hf_dict()))
    (pdparams / "model_state.pdparams").write_bytes(b"")
    with pytest.raises(UserError, match=r"\.pdparams \(pickle\), which is not read.*unified_checkpoint: true"):
        prepare(_args(tmp_path, str(pdparams)), [], Target())


def test_paddlenlp_fused_projections_are_one_line_saying_how_to_unfuse_them(tmp_path):
    """A PaddleNLP run with fuse_attention_qkv / fuse_attention_ffn saves q|k|v and gate|up as one tensor each:
    `check` (from the files' headers) and `train` (the name map) say so, not that a k_proj tensor is missing."""
    from safetensors.numpy import load_file

    _, path = _paddlenlp_qwen3(tmp_path / "qwen3-paddlenlp")
    spec = prepare(_args(tmp_path, str(path)), [], Target())  # unfused, as saved: it passes
    tensors = {}
    for shard in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
        shard.unlink()
    (path / "model.safetensors.index.json").unlink()
    for layer in range(2):
        at = f"model.layers.{layer}."
        fused = {"self_attn.qkv_proj.weight": [f"self_attn.{p}_proj.weight" for p in "qkv"],
                 "mlp.gate_up_fused_proj.weight": ["mlp.gate_proj.weight", "mlp.up_proj.weight"]}
        for name, parts in fused.items():  # [in, out] weights: the outputs side by side
            tensors[at + name] = np.concatenate([tensors.pop(at + p) for p in parts], axis=1)
        for p in "qkv":
            tensors.pop(f"{at}self_attn.{p}_proj.bias")
    save_file(tensors, str(path / "model.safetensors"))
    line = r"holds PaddleNLP's fused 'model.layers.0.mlp.gate_up_fused_proj.weight' \(4 fused in total.*both false"
    with pytest.raises(UserError, match=line):
        build_for_run(spec)
    with pytest.raises(UserError, match=line):
        prepare(_args(tmp_path, str(path)), [], Target())


def test_check_finds_weights_that_do_not_belong_to_the_config_json(tmp_path, capsys):
    """`check` reads the pretrained directory's headers through train's name map: a config.json of another size
    is its error line (exit 2), where it said OK and `train` stopped after its start-up."""
    from pretrain_cli.cli import main as cli_main

    _, path = _paddlenlp_qwen3(tmp_path / "qwen3-paddlenlp")
    args = _args(tmp_path, str(path))
    assert cli_main(["check", args]) == 0 and "check: OK" in capsys.readouterr().out
    (path / "config.json").write_text(json.dumps(ModelConfig(**{**QWEN3, "intermediate_size": 40}).to_hf_dict()))
    assert cli_main(["check", args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: tensor 'model.layers.0.") and err.count("\n") == 1
    assert "but config.json implies" in err and err.endswith("use the config.json that belongs to these weights\n")


def test_a_new_model_grows_its_position_range_to_the_samples_and_pretrained_weights_keep_theirs(tmp_path):
    """PaddleNLP's run_pretrain.py sizes a new model's max_position_embeddings to max_seq_length (the max of the
    two), which a preset's user cannot edit; weights trained for a shorter range train past it and keep their
    range, with a note, as PaddleNLP's continue_training does."""
    path = tmp_path / "qwen3"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(ModelConfig(**QWEN3).to_hf_dict()))  # max_position_embeddings 64
    args = json.loads(open(_args(tmp_path, str(path))).read())
    cfg = tmp_path / "new.json"
    cfg.write_text(json.dumps({**args, "continue_training": 0, "max_seq_length": 128}))
    spec = prepare(str(cfg), [], Target())
    assert spec.model_cfg.max_position_embeddings == 128
    assert "max_position_embeddings: raised from 64 to max_seq_length 128" in "\n".join(spec.run.notes)
    _, pretrained = _paddlenlp_qwen3(tmp_path / "pretrained")
    spec = prepare(_args(tmp_path, str(pretrained)), ["--max_seq_length", "128"], Target())
    assert spec.model_cfg.max_position_embeddings == 64 and spec.run.data.max_seq_length == 128
    assert [n for n in spec.run.notes if n.startswith("max_seq_length: 128 is past the model's "
                                                       "max_position_embeddings (64): positions 64-127 take")]


def test_continuing_a_run_that_trained_past_the_range_notes_only_what_it_has_not_seen(tmp_path):
    """A run's checkpoint continued past config.json's max_position_embeddings keeps that number (64) and records
    the length it trained at (its args.json: 96): continuing it at 96 notes nothing, at 128 only positions 96-127."""
    _, pretrained = _paddlenlp_qwen3(tmp_path / "pretrained")
    (pretrained / "args.json").write_text(json.dumps({"arguments": {"max_seq_length": 96},
                                                      "run": {"data": {"max_seq_length": 96}}}))
    spec = prepare(_args(tmp_path, str(pretrained)), ["--max_seq_length", "96"], Target())
    assert not [n for n in spec.run.notes if "is past the model's" in n]
    spec = prepare(_args(tmp_path, str(pretrained)), ["--max_seq_length", "128"], Target())
    assert [n for n in spec.run.notes if n.startswith("max_seq_length: 128 is past the model's "
                                                       "max_position_embeddings (64) and the 96 tokens its run "
                                                       "trained on: positions 96-127 take")]


def test_a_run_records_the_longest_length_its_weights_trained_at(tmp_path):
    """A run trained at 96 then continued at 32 recorded 32 (its own max_seq_length), and eval of the second run's
    model noted positions 32-95 as unseen: args.json's trained_length carries the longest forward, and an older
    args.json without it is read by its run's max_seq_length, or before `run` its arguments'."""
    from pretrain_cli.storage.checkpoint_dir import CheckpointDir

    _, pretrained = _paddlenlp_qwen3(tmp_path / "pretrained")
    (pretrained / "args.json").write_text(json.dumps({"arguments": {"max_seq_length": 96},
                                                      "run": {"data": {"max_seq_length": 96}}}))
    assert CheckpointDir(pretrained).trained_length == 96  # (from before trained_length: its run's)
    spec = prepare(_args(tmp_path, str(pretrained)), ["--max_seq_length", "32"], Target())
    record = spec.record()
    assert record["trained_length"] == 96 and record["run"]["data"]["max_seq_length"] == 32
    (pretrained / "args.json").write_text(json.dumps(record))  # that run's record, continued again at 16
    assert CheckpointDir(pretrained).trained_length == 96
    assert prepare(_args(tmp_path, str(pretrained)), ["--max_seq_length", "16"], Target()).record()[
        "trained_length"] == 96
    assert prepare(_args(tmp_path, str(pretrained)), ["--max_seq_length", "128"], Target()).record()[
        "trained_length"] == 128
    (pretrained / "args.json").write_text(json.dumps({"arguments": {"max_seq_length": 48}}))  # before `run`
    assert CheckpointDir(pretrained).trained_length == 48


def test_check_reads_the_weights_without_the_fused_cpu_kernels(tmp_path, capsys, monkeypatch):
    """Names and shapes do not depend on the kernels: `check` builds its model with reference ones, where the
    run's default would compile the fused CPU kernels (~40 CPU-s on a first check) or warn without a compiler."""
    from pretrain_cli.cli import main as cli_main
    from pretrain_cli.ops import cpu_ops

    def load():
        raise AssertionError("check called cpu_ops.load")

    _, path = _paddlenlp_qwen3(tmp_path / "qwen3-paddlenlp")
    args = _args(tmp_path, str(path))
    monkeypatch.setattr(cpu_ops, "load", load)
    assert cli_main(["check", args]) == 0
    assert "check: OK" in capsys.readouterr().out


def _damaged(data: bytes, damage: str) -> bytes:
    """A shard's bytes cut in half, cut to 6 bytes (before its header's length ends), or with its header spoiled."""
    return {"truncated": data[:len(data) // 2], "short": data[:6], "header": data[:8] + b"{not json" + data[17:]}[damage]


def _damage(shard, damage: str):
    """`shard` removed ("missing") or rewritten damaged (`_damaged`'s kinds); returns it."""
    if damage == "missing":
        shard.unlink()
    else:
        shard.write_bytes(_damaged(shard.read_bytes(), damage))
    return shard


@pytest.mark.parametrize("damage", ["missing", "truncated", "short", "header"])
def test_a_half_downloaded_model_directory_says_to_download_it_again(tmp_path, damage):
    """A shard the index names but the directory lacks, or one cut short, is the download's fault: one line saying
    to download it again, not the checkpoint advice ("resume from another checkpoint") a model directory cannot
    follow."""
    _, path = _paddlenlp_qwen3(tmp_path / "qwen3-paddlenlp")
    shard = _damage(path / "model-00002-of-00002.safetensors", damage)
    with pytest.raises(UserError) as e:
        prepare(_args(tmp_path, str(path)), [], Target())
    line = str(e.value)
    assert line.startswith(f"{shard}: ") and "\n" not in line and "checkpoint" not in line
    assert {"missing": "missing, though model.safetensors.index.json names it", "truncated": "truncated (",
            "short": "truncated (6 bytes", "header": "unreadable safetensors header"}[damage] in line
    assert line.endswith("download it again, or point model_name_or_path to a complete directory")


@pytest.mark.parametrize("damage", ["missing", "truncated", "short", "header"])
def test_a_damaged_checkpoint_continued_from_says_what_is_wrong_before_what_to_do(tmp_path, damage):
    """The same damage in a run's checkpoint (its trainer_state.json) is no download's: the line says what it makes
    of the checkpoint (incomplete, damaged), then to name another of the run's checkpoints."""
    _, path = _paddlenlp_qwen3(tmp_path / "checkpoint-4")
    (path / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    size = (path / "model-00002-of-00002.safetensors").stat().st_size
    shard = _damage(path / "model-00002-of-00002.safetensors", damage)
    with pytest.raises(UserError) as e:
        prepare(_args(tmp_path, str(path)), [], Target())
    state = "damaged" if damage == "header" else "incomplete"
    assert str(e.value) == f"{shard}: " + {
        "missing": "missing, though model.safetensors.index.json names it",
        "truncated": f"truncated ({size // 2:,} bytes, its header says {size:,})",
        "short": "truncated (6 bytes, shorter than the 8 that give the header's length)",
        "header": "unreadable safetensors header (Expecting property name enclosed in double quotes: line 1 column 2 "
                  "(char 1))",
    }[damage] + f"; the checkpoint is {state}: point model_name_or_path to another of the run's checkpoints"


def test_a_shard_that_cannot_be_opened_says_why(tmp_path, monkeypatch):
    """A shard that is there but unreadable (its permissions) is neither missing nor damaged: one line with the
    system's reason and what fixes it, not "download it again". As root chmod 000 still lets it be read, so the
    open is made to fail as it would for another user."""
    import builtins
    import os

    from pretrain_cli.storage import shard_files

    _, path = _paddlenlp_qwen3(tmp_path / "qwen3-paddlenlp")
    shard = path / "model-00002-of-00002.safetensors"
    shard.chmod(0)
    if os.access(shard, os.R_OK):  # root: the permission bits do not stop it
        def denying_open(file, *a, **k):
            if os.fspath(file) == os.fspath(shard):
                raise PermissionError(13, "Permission denied", os.fspath(file))
            return builtins.open(file, *a, **k)

        monkeypatch.setattr(shard_files, "open", denying_open, raising=False)
    try:
        with pytest.raises(UserError) as e:
            prepare(_args(tmp_path, str(path)), [], Target())
    finally:
        shard.chmod(0o644)
    assert str(e.value) == f"{shard}: unreadable (Permission denied); fix its permissions"
