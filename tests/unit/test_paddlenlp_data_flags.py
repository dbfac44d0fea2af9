"""PaddleNLP's names for data settings, as a PaddleNLP user types them (the W6 walk): create_pretraining_data.py's
`--model_name_or_path` for the tokenizer was an error ('--tokenizer is required'), and `data_impl: lazy` said only
"must be one of mmap"."""
import json

from data_helpers import make_texts, make_tokenizer, write_jsonl
from pretrain_cli import cli
from pretrain_cli.data.indexed import open_token_file


def test_preprocess_reads_model_name_or_path_as_the_tokenizer(tmp_path, capsys):
    tok = make_tokenizer(tmp_path / "tok")
    write_jsonl(tmp_path / "a.jsonl", make_texts(5))
    argv = ["preprocess", "--input_path", str(tmp_path / "a.jsonl"), "--append_eos"]
    assert cli.main([*argv, "--output_prefix", str(tmp_path / "pn"), "--model_name_or_path", str(tok)]) == 0
    assert cli.main([*argv, "--output_prefix", str(tmp_path / "ours"), "--tokenizer", str(tok)]) == 0
    assert cli.main([*argv, "--output_prefix", str(tmp_path / "both"), "--tokenizer", str(tok),
                     "--model_name_or_path", str(tok)]) == 0  # the same one, twice: no question which
    same = [open_token_file(tmp_path / p) for p in ("pn", "ours", "both")]
    assert all(len(d) == len(same[0]) == 5 for d in same)
    assert all(d.get(i).tolist() == same[0].get(i).tolist() for d in same[1:] for i in range(5))
    capsys.readouterr()
    assert cli.main([*argv, "--output_prefix", str(tmp_path / "x"), "--tokenizer", str(tok),
                     "--model_name_or_path", "other"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --model_name_or_path other and --tokenizer {tok} name two tokenizers "
                   f"(--model_name_or_path is PaddleNLP's name for --tokenizer); give one of them\n")
    assert not (tmp_path / "x.bin").exists()
    assert cli.main([*argv, "--output_prefix", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --tokenizer: required: ") and len(err.splitlines()) == 1


def test_data_impl_lazy_says_what_it_is_and_what_to_do(tmp_path, capsys):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"model_name_or_path": "micro-llama", "data_impl": "lazy"}))
    assert cli.main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"error: {path}: key `data_impl`: lazy is PaddleNLP's older token file format (TNTIDX .idx")
    assert "set data_impl: mmap or leave it out" in err and "re-run `pretrain-cli preprocess`" in err
    assert cli.main(["check", str(path), "--data_impl", "cached"]) == 2  # any other value: the list of choices
    assert "key `data_impl` must be one of mmap; got 'cached'" in capsys.readouterr().err
