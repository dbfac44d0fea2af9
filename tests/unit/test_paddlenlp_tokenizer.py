"""A tokenizer directory holding only a sentencepiece model (Llama 2's tokenizer.model, PaddleNLP's
sentencepiece.bpe.model): one line naming transformers' conversion to the tokenizer.json read here, which keeps the
ids of the token files already made with it, where it said to train a new tokenizer (`config.presets.no_tokenizer`).
The command was run as printed (transformers 5.25, sentencepiece 0.2.3): its tokenizer.json gave sentencepiece's
ids; without the rename, transformers finds no tokenizer.model in PaddleNLP's directory and loads 3 tokens."""
import pytest

from pretrain_cli.config.presets import resolve_tokenizer_dir
from pretrain_cli.errors import UserError


@pytest.mark.parametrize("name, rename", [("tokenizer.model", False), ("sentencepiece.bpe.model", True)])
def test_a_sentencepiece_directory_is_one_line_naming_the_conversion(tmp_path, name, rename):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / name).write_bytes(b"\x0a")
    (tok / "tokenizer_config.json").write_text('{"tokenizer_class": "LlamaTokenizer"}')
    with pytest.raises(UserError) as e:
        resolve_tokenizer_dir(str(tok), "micro-llama")
    line = str(e.value)
    assert "\n" not in line and "train-tokenizer" not in line
    assert line.startswith(f"tokenizer_name_or_path: {tok} holds a sentencepiece model ({name}) but no tokenizer.json")
    assert ("rename it tokenizer.model (transformers' name), then " in line) == rename
    assert line.endswith(f"`python -c \"from transformers import AutoTokenizer as T; T.from_pretrained('{tok}')"
                         f".save_pretrained('{tok}')\"`")
    (tok / name).unlink()  # nothing to convert: a tokenizer of its own is the way
    with pytest.raises(UserError, match="holds no tokenizer.json .*train one with `pretrain-cli train-tokenizer`"):
        resolve_tokenizer_dir(str(tok), "micro-llama")


def test_a_model_directory_with_only_a_sentencepiece_model_says_so_on_the_tokenizer_line(tmp_path):
    """No tokenizer_name_or_path: the run trains without one (its token files are made), and its tokenizer line says
    why the model directory's sentencepiece model is not it."""
    import json
    import shutil

    from data_helpers import write_tokens
    from pretrain_cli.config.presets import PRESET_DIR
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.run_config import Target

    model = tmp_path / "llama2"
    model.mkdir()
    shutil.copy(PRESET_DIR / "micro-llama" / "config.json", model / "config.json")
    (model / "tokenizer.model").write_bytes(b"\x0a")
    write_tokens(tmp_path / "data", vocab_size=512)
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"model_name_or_path": str(model), "do_train": True, "max_steps": 2, "max_seq_length": 32,
                                "input_dir": str(tmp_path / "data"), "output_dir": str(tmp_path / "out")}))
    line = next(x for x in prepare(str(args), [], Target()).describe() if x.startswith("  tokenizer: "))
    assert line == (f"  tokenizer: none (checkpoints will carry no tokenizer files); {model} holds a sentencepiece "
                    f"model (tokenizer.model), which is not read: set tokenizer_name_or_path to a directory with its "
                    f"tokenizer.json (docs/DATA.md, \"Tokenizers and transformers\")")
