"""A model directory whose weights are in files not read here (pytorch_model.bin, its shards, GGUF, .pdparams):
every command that would use them refuses in one line naming the files and the conversion, never runs the model
at random init; a directory without weights at all (a config.json alone) runs at random init on purpose, said once
on stderr, with the run's seed default (42) in `eval` and `generate` alike."""
import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.commands import eval as evaluate  # noqa: E402
from pretrain_cli.errors import UserError  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.models.foreign_weights import refuse_unread, unread_weights  # noqa: E402
from pretrain_cli.orchestration.prepare import prepare  # noqa: E402
from pretrain_cli.run_config import Target  # noqa: E402
from data_helpers import make_tokenizer, write_tokens  # noqa: E402

CFG = dict(model_type="qwen2", vocab_size=320, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
           num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
CONVERSION = "M.from_pretrained(d).save_pretrained(o); T.from_pretrained(d).save_pretrained(o)"


def _snapshot(d: Path, *files: str) -> str:
    """An HF snapshot: config.json, a tokenizer, and `files` (empty: only their names are judged)."""
    d.mkdir()
    (d / "config.json").write_text(json.dumps(ModelConfig(**CFG).to_hf_dict()))
    make_tokenizer(d)
    for name in files:
        (d / name).write_bytes(b"")
    return str(d)


def _eval_ns(**kw):
    parser = argparse.ArgumentParser()
    evaluate.add_arguments(parser)
    return parser.parse_args([a for k, v in kw.items() for a in (f"--{k}", str(v))])


def _generate(capsys, *argv):
    from pretrain_cli.cli import main as cli_main

    code = cli_main(["generate", *argv])
    return code, capsys.readouterr()


def test_which_files_are_unread_weights(tmp_path):
    shards = _snapshot(tmp_path / "shards", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
                       "pytorch_model.bin.index.json", "training_args.bin")
    assert unread_weights(shards) == ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
    beside = _snapshot(tmp_path / "both", "pytorch_model.bin", "model.safetensors")  # the safetensors are read
    assert unread_weights(beside) == []
    trainer = _snapshot(tmp_path / "trainer", "training_args.bin", "optimizer.pt", "rng_state_0.pth")
    assert unread_weights(trainer) == []  # a trainer's states are no weights
    states = _snapshot(tmp_path / "states", "scheduler.bin", "sampler.bin", "optimizer.bin", "scaler.pdparams",
                       "scaler.pt", "random_states_0.pth", "adapter_model.bin")  # (each matches UNREAD_WEIGHTS)
    assert unread_weights(states) == []  # accelerate's and PaddleNLP's states, a LoRA adapter: no model's weights


def test_an_optimizers_safetensors_are_no_weights(tmp_path):
    """The old judge counted every *.safetensors: optimizer.safetensors and master_weights alone were a model (an
    output_dir holding them refused), and beside them a pytorch_model.bin escaped the refusal."""
    from pretrain_cli.models.model_files import has_weights
    from pretrain_cli.models.foreign_weights import weight_files

    states = _snapshot(tmp_path / "states", "optimizer.safetensors", "master_weights-00001-of-00002.safetensors",
                       "optimizer-00001-of-00002.safetensors")
    assert weight_files(states) == ([], []) and not has_weights(states)
    d = _snapshot(tmp_path / "bin", "pytorch_model.bin", "optimizer.safetensors")
    assert unread_weights(d) == ["pytorch_model.bin"]
    with pytest.raises(UserError, match="holds weights in pytorch_model.bin"):
        refuse_unread(d, "--model")
    assert weight_files(_snapshot(tmp_path / "ours", "model.safetensors", "optimizer.safetensors")) == (
        ["model.safetensors"], [])


def test_pytorch_weights_without_config_json_are_not_offered_from_pretrained(tmp_path):
    """from_pretrained fails on a directory without config.json: the old refusal offered it there."""
    from pretrain_cli.config.presets import resolve_model_dir

    d = tmp_path / "bare"
    d.mkdir()
    (d / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(UserError) as e:
        resolve_model_dir(str(d), "--model")
    said = str(e.value)
    assert said == (f"--model: {d} holds weights in pytorch_model.bin, which pretrain-cli does not read "
                    f"(safetensors only), and no *.safetensors; transformers loads them only beside their model's "
                    f"config.json, which {d} lacks: put that config.json there, then run this again for the "
                    f"conversion")


def test_token_files_beside_a_config_json_are_no_weights(tmp_path):
    """The old code refused it: "holds weights in corpus_text_document.bin"."""
    d = _snapshot(tmp_path / "with_data", "corpus_text_document.bin", "corpus_text_document.idx")
    assert unread_weights(d) == []
    refuse_unread(d, "--model")  # nothing to refuse
    (Path(d) / "model_text_document.bin").write_bytes(b"")  # a weight's name, but a token file all the same
    (Path(d) / "model_text_document.idx").write_bytes(b"")
    assert unread_weights(d) == []


def test_the_conversion_is_the_one_that_works_for_the_files(tmp_path):
    """Printed only where transformers 5.25 loads the files (checked there: pytorch_model.fp16.bin loads only with
    variant='fp16'), into a new directory (an HF cache snapshot's config.json is a link into its blob store)."""
    d = _snapshot(tmp_path / "fp16", "pytorch_model.fp16.bin")
    with pytest.raises(UserError) as e:
        refuse_unread(d, "--model")
    said = str(e.value)
    assert f"d, o = {d!r}, {d + '-safetensors'!r}; M.from_pretrained(d, variant='fp16').save_pretrained(o)" in said
    assert said.endswith(f"and point --model at {d}-safetensors")
    for name in ("tf_model.h5", "flax_model.msgpack", "consolidated.00.pth", "model.ckpt"):
        d = _snapshot(tmp_path / name.replace(".", "_"), name)
        with pytest.raises(UserError) as e:
            refuse_unread(d, "--model")
        assert "transformers 5 has no loader" in str(e.value) and "python -c" not in str(e.value), name


def test_eval_refuses_pytorch_weights_instead_of_a_random_init(tmp_path):
    """The old code evaluated hub/Qwen2-bin at random init (loss = ln(vocab)) and exited 0."""
    prefix = write_tokens(tmp_path / "c", vocab_size=CFG["vocab_size"])
    d = _snapshot(tmp_path / "Qwen2-bin", "pytorch_model.bin")
    with pytest.raises(UserError) as e:
        evaluate.main(_eval_ns(model=d, data=prefix, max_seq_length=16))
    said = str(e.value)
    assert said.startswith(f"--model: {d} holds weights in pytorch_model.bin, which pretrain-cli does not read")
    assert CONVERSION in said and f"d, o = {d!r}, {d + '-safetensors'!r}" in said and "\n" not in said


def test_generate_refuses_them_in_text_and_json_alike(tmp_path, capsys):
    d = _snapshot(tmp_path / "Qwen2-bin", "pytorch_model.bin")
    for json_flag in ((), ("--json",)):
        code, out = _generate(capsys, "--model", d, "--prompt", "hello", "--max_new_tokens", "2", *json_flag)
        assert code == 2 and out.out == "" and "pytorch_model.bin" in out.err and CONVERSION in out.err
        assert "random init" not in out.err and "Traceback" not in out.err


def test_continue_training_names_the_key_and_the_conversion(tmp_path):
    """`check`/`train` stopped at "no model.safetensors ...; point to a directory with HF safetensors"."""
    d = _snapshot(tmp_path / "Qwen2-bin", "pytorch_model.bin")
    write_tokens(tmp_path / "data", vocab_size=CFG["vocab_size"])
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"model_name_or_path": d, "continue_training": 1, "output_dir": str(tmp_path / "o"),
                                "input_dir": str(tmp_path / "data"), "max_steps": 1, "max_seq_length": 16}))
    with pytest.raises(UserError) as e:
        prepare(str(args), [], Target())
    assert str(e.value).startswith(f"model_name_or_path: {d} holds weights in pytorch_model.bin")
    assert CONVERSION in str(e.value)


def test_a_gguf_repository_without_config_json_is_told_to_choose_a_file(tmp_path, capsys):
    """A GGUF repository has no config.json: the old code stopped at "has no config.json", and named the first
    file by name (a Q2_K) as the one to convert."""
    d = tmp_path / "gguf"
    d.mkdir()
    for q in ("Q2_K", "Q4_K_M", "Q8_0"):
        (d / f"model-{q}.gguf").write_bytes(b"")
    code, out = _generate(capsys, "--model", str(d), "--prompt", "hello")
    assert code == 2 and "config.json" not in out.err and "Traceback" not in out.err
    assert f"--model: {d} holds weights in model-Q2_K.gguf, model-Q4_K_M.gguf, model-Q8_0.gguf" in out.err
    assert "pip install gguf" in out.err and "'CHOSEN.gguf'" in out.err and "'model-Q2_K.gguf'" not in out.err
    assert "M.from_pretrained(d, gguf_file=f).save_pretrained(o)" in out.err


def test_a_config_json_alone_is_a_random_init_said_once_with_one_seed(tmp_path, capsys):
    """The old code said "random init (seed 42)" only inside eval's result line, nothing in generate's text and
    "random init (seed 0)" in its JSON: a different model from eval's."""
    prefix = write_tokens(tmp_path / "c", vocab_size=CFG["vocab_size"])
    d = _snapshot(tmp_path / "noweights")
    note = f"note: --model {d} holds no weights (a config.json alone): it runs at random init (seed 42)"
    assert evaluate.main(_eval_ns(model=d, data=prefix, max_seq_length=16, max_batches=1)) == 0
    err = capsys.readouterr().err
    assert err.count(note) == 1
    code, out = _generate(capsys, "--model", d, "--prompt", "hello", "--max_new_tokens", "2")
    assert code == 0 and out.err.count(note) == 1 and "note" not in out.out
    code, out = _generate(capsys, "--model", d, "--prompt", "hello", "--max_new_tokens", "2", "--json")
    assert code == 0 and json.loads(out.out)["model_weights"] == "random init (seed 42)"


def test_pytorch_weights_count_as_weights_wherever_weights_are_judged(tmp_path):
    """One judge of which files are weights: a directory of pytorch_model.bin without continue_training is said not
    to be loaded (the old note looked for *.safetensors alone), and an output_dir holding one is not overwritten
    (the old check named model.safetensors, its index and model_state.pdparams only)."""
    from pretrain_cli.models.model_files import has_weights
    from pretrain_cli.orchestration.opened import foreign_model
    from pretrain_cli.run_config import Target as T

    d = _snapshot(tmp_path / "Qwen2-bin", "pytorch_model.bin")
    assert not has_weights(d)  # not read
    common = ["--input_dir", write_tokens(tmp_path / "docs", vocab_size=CFG["vocab_size"]), "--do_train",
              "--max_steps", "2", "--device", "cpu", "--max_seq_length", "16"]
    spec = prepare(None, ["--model_name_or_path", d, "--output_dir", str(tmp_path / "out"), *common,
                          "--continue_training", "0"], T("cpu", 1))
    note = (f"model_name_or_path: {d} holds weights, which this run does not load: it builds the model from "
            f"config.json alone, at a random init; convert them to safetensors first (`pretrain-cli check` with "
            f"continue_training: 1 names the conversion)")  # (continue_training: 1 refuses them as they are)
    assert note in spec.run.notes, spec.run.notes
    with pytest.raises(UserError, match=r"output_dir: .* holds a model no run wrote there \(pytorch_model\.bin, "):
        foreign_model(replace(spec.run, output=replace(spec.run.output, output_dir=d)))


def test_eval_config_names_the_files_output_dir_not_model(tmp_path, capsys):
    """`eval --config FILE --data D` without --model evaluates the file's output_dir: its refusals said "--model:",
    an option the user never gave."""
    from pretrain_cli.cli import main as cli_main

    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"")  # weights without their config.json
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"model_name_or_path": "micro-qwen2", "output_dir": str(out)}))
    prefix = write_tokens(tmp_path / "c", vocab_size=CFG["vocab_size"])
    assert cli_main(["eval", "--config", str(cfg), "--data", prefix, "--max_seq_length", "16"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {cfg}: output_dir: {out} has no config.json")


def test_a_peft_adapter_is_refused_as_no_model(tmp_path, capsys):
    """A LoRA adapter (adapter_model.safetensors + adapter_config.json) counted as a model: "has no config.json", or
    beside one a missing lm_head.weight; it is named as an adapter, with the merge that makes it a model."""
    from pretrain_cli.models.model_files import has_weights

    bare = tmp_path / "lora"
    bare.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (bare / name).write_bytes(b"{}")
    code, out = _generate(capsys, "--model", str(bare), "--prompt", "hello")
    merge = f"`PeftModel.from_pretrained(base, {str(bare)!r}).merge_and_unload().save_pretrained(out)`"
    assert code == 2 and out.err.splitlines() == [
        f"error: --model: {bare} holds adapter_config.json, adapter_model.safetensors: a PEFT adapter, not a model; "
        f"merge it into its base first ({merge}) and point --model at out"]
    beside = _snapshot(tmp_path / "with_config", "adapter_model.safetensors")
    assert not has_weights(beside)
    with pytest.raises(UserError, match=r"holds adapter_model.safetensors: a PEFT adapter, not a model; merge"):
        refuse_unread(beside, "--model")
    refuse_unread(_snapshot(tmp_path / "merged", "model.safetensors", "adapter_model.safetensors"))  # a model beside
