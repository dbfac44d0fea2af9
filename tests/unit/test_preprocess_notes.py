"""preprocess's notes on what a new user gets silently wrong (a new-user walk): a .txt file of one document per line
became one document, said only by `check`'s empty valid split; files without --append_eos were made without a word,
said only by inspect-data's 'documents ending in EOS: 0.0%'. And the --help that says how a .txt file is split."""
from __future__ import annotations

import argparse

import pytest

from data_helpers import make_texts, make_tokenizer, run_preprocess, write_jsonl
from pretrain_cli.commands import preprocess, train_tokenizer
from pretrain_cli.data.indexed import open_token_file

RULE = ("a .txt file's documents are separated by blank lines, not by line ends; if each line is a document, put a "
        "blank line between documents or write them as .jsonl (one {\"text\": ...} object per line)")
NO_EOS = "preprocess: note: no --append_eos: "


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


def _run(capsys, tok_dir, out, *paths, eos: bool = True) -> list[str]:
    """preprocess `paths` into `out`; its stderr's lines."""
    capsys.readouterr()
    argv = ["--input_path", *paths, "--output_prefix", out, "--tokenizer", tok_dir, "--log_interval", "0"]
    assert run_preprocess(*argv, *(["--append_eos"] if eos else [])) == 0
    return capsys.readouterr().err.splitlines()


def test_a_txt_file_of_one_document_per_line_is_said_once(tmp_path, tok_dir, capsys):
    """400 lines without a blank line: one document, and one note naming the file, its count and the rule."""
    lines = make_texts(400, seed=1)
    (tmp_path / "lines.txt").write_text("\n".join(lines) + "\n")
    err = _run(capsys, tok_dir, tmp_path / "one", tmp_path / "lines.txt")
    assert open_token_file(tmp_path / "one").num_documents == 1
    assert err == [f"preprocess: note: {tmp_path / 'lines.txt'}: 400 lines made 1 document: {RULE}"], err

    # two blank lines in 400: three documents of ~133 lines are as few; a further file is named in the same note
    (tmp_path / "few.txt").write_text("\n".join(lines[:100]) + "\n\n" + "\n".join(lines[100:300]) + "\n\n"
                                      + "\n".join(lines[300:]) + "\n")
    err = _run(capsys, tok_dir, tmp_path / "two", tmp_path / "lines.txt", tmp_path / "few.txt")
    assert err == [f"preprocess: note: {tmp_path / 'lines.txt'}: 400 lines made 1 document; {tmp_path / 'few.txt'}: "
                   f"400 lines made 3 documents: {RULE}"], err


def test_txt_files_whose_blank_lines_separate_documents_get_no_note(tmp_path, tok_dir, capsys):
    """Paragraphs of a few lines each, a short .txt of one paragraph, and .jsonl lines are what they should be."""
    texts = make_texts(90, seed=2)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "paragraphs.txt").write_text("\n\n".join("\n".join(texts[i:i + 3]) for i in range(0, 90, 3)))
    (tmp_path / "in" / "short.txt").write_text("\n".join(texts[:19]) + "\n")  # 19 lines: too few to judge
    write_jsonl(tmp_path / "in" / "docs.jsonl", texts)
    err = _run(capsys, tok_dir, tmp_path / "c", tmp_path / "in")
    assert err == [] and open_token_file(tmp_path / "c").num_documents == 30 + 1 + 90


def test_without_append_eos_one_note_says_what_it_costs(tmp_path, tok_dir, capsys):
    """The tokenizer has an EOS ([EOT]) and it was not appended: one note, after the summary, naming the flag."""
    write_jsonl(tmp_path / "a.jsonl", make_texts(30, seed=3))
    err = _run(capsys, tok_dir, tmp_path / "no", tmp_path / "a.jsonl", eos=False)
    assert err == [f"{NO_EOS}the documents do not end in [EOT] (the EOS of {tok_dir}), so packed training samples "
                   f"run one document into the next with nothing between them; add --append_eos (sample_mode padded "
                   f"adds an EOS itself)"], err
    assert not [line for line in _run(capsys, tok_dir, tmp_path / "yes", tmp_path / "a.jsonl") if NO_EOS in line]


@pytest.mark.parametrize("command", [preprocess, train_tokenizer])
def test_help_says_that_blank_lines_separate_a_txt_files_documents(command):
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    said = " ".join(p.format_help().split())
    assert "documents separated by blank lines" in said or "documents are separated by blank lines" in said, said
