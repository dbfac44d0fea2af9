"""PaddleNLP's names for data settings, as a PaddleNLP user types them (the W6 walk): create_pretraining_data.py's
`--model_name_or_path` for the tokenizer was an error ('--tokenizer is required'), its README's `--model_name`,
`--data_format` and `--data_impl` were unknown options, and `data_impl: lazy` said only "must be one of mmap"."""
import json

import pytest

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
    assert cli.main(["check", str(path), "--data_impl", "cached"]) == 2  # the older in-memory reader of TNTIDX
    assert "key `data_impl`: cached is the older reader of lazy's TNTIDX" in capsys.readouterr().err
    assert cli.main(["check", str(path), "--data_impl", "infer"]) == 2  # any other value: the list of choices
    assert "key `data_impl` must be one of mmap; got 'infer'" in capsys.readouterr().err


def test_paddlenlps_readme_preprocess_command_runs_as_typed(tmp_path, capsys, monkeypatch):
    """PaddleNLP's README: `--model_name "..." --data_format "JSON" --json_key "text" --data_impl "mmap"` (with
    --append_eos, --workers, --log_interval); `./tok` and `tok/` are one tokenizer."""
    monkeypatch.chdir(tmp_path)
    make_tokenizer(tmp_path / "tok")
    write_jsonl(tmp_path / "a.jsonl", make_texts(5))
    argv = ["preprocess", "--input_path", "a.jsonl", "--append_eos", "--workers", "1", "--log_interval", "100"]
    assert cli.main([*argv, "--output_prefix", "pn", "--model_name", "./tok", "--data_format", "JSON",
                     "--json_key", "text", "--data_impl", "mmap"]) == 0
    assert cli.main([*argv, "--output_prefix", "ours", "--tokenizer", "tok/", "--model_name_or_path", "./tok"]) == 0
    pn, ours = open_token_file(tmp_path / "pn"), open_token_file(tmp_path / "ours")
    assert len(pn) == len(ours) == 5 and all(pn.get(i).tolist() == ours.get(i).tolist() for i in range(5))


@pytest.mark.parametrize("flags,said", [
    (["--data_format", "CSV"], "--data_format CSV: PaddleNLP's only value is JSON"),
    (["--data_impl", "lazy"], "--data_impl lazy: lazy is PaddleNLP's older token file format (TNTIDX .idx"),
    (["--data_impl", "cached"], "--data_impl cached: cached is the older reader of lazy's TNTIDX .idx files"),
    (["--split_sentences"], "--split_sentences: PaddleNLP's create_pretraining_data.py flag: one sequence per "
                            "sentence is not written here"),
    (["--max_repeated_len", "100"], "--max_repeated_len: PaddleNLP's create_pretraining_data.py flag: collapsing"),
    (["--chinese", "--cn_whole_word_segment"], "--chinese: PaddleNLP's create_pretraining_data.py flag: Chinese "
                                               "sentence splitting and ERNIE's whole-word ## marking"),
    (["--cn_seg_func", "jieba"], "--cn_seg_func: PaddleNLP's create_pretraining_data.py flag: Chinese"),
    (["--model_name", "other"], "--model_name other and --tokenizer tok name two tokenizers (--model_name is "
                                "PaddleNLP's name for --tokenizer); give one of them"),
])
def test_paddlenlp_flags_not_done_here_are_one_line(tmp_path, capsys, monkeypatch, flags, said):
    monkeypatch.chdir(tmp_path)
    make_tokenizer(tmp_path / "tok")
    write_jsonl(tmp_path / "a.jsonl", make_texts(2))
    assert cli.main(["preprocess", "--input_path", "a.jsonl", "--output_prefix", "x", "--tokenizer", "tok",
                     *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {said}") and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x.bin").exists()
