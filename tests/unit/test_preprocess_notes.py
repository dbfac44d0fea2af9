"""preprocess's notes on what a new user gets silently wrong (a new-user walk): a .txt file of one document per line
became one document, said only by `check`'s empty valid split; files without --append_eos were made without a word,
said only by inspect-data's 'documents ending in EOS: 0.0%'. And the --help that says how a .txt file is split."""
from __future__ import annotations

import argparse

import pytest

from data_helpers import make_texts, make_tokenizer, run_preprocess, write_jsonl
from pretrain_cli.commands import preprocess, train_tokenizer
from pretrain_cli.data import readers
from pretrain_cli.data.documents import DocumentReader
from pretrain_cli.data.indexed import open_token_file
from pretrain_cli.errors import UserError

RULE = ("a .txt file's documents are separated by blank lines, not by line ends; if each line is a document, put a "
        "blank line between documents or write them as .jsonl (one {\"text\": ...} object per line)")
NO_EOS = "preprocess: note: no --append_eos: "


def _long(where) -> str:
    return f"note: {where}: a paragraph of 1,000 lines and more with no blank line, one document: {RULE}"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


def _run(capsys, tok_dir, out, *paths, eos: bool = True) -> list[str]:
    """preprocess `paths` into `out`; its stderr's lines."""
    capsys.readouterr()
    argv = ["--input_path", *paths, "--output_prefix", out, "--tokenizer", tok_dir, "--log_interval", "0"]
    assert run_preprocess(*argv, *(["--append_eos"] if eos else [])) == 0
    return capsys.readouterr().err.splitlines()


def test_a_txt_file_of_one_document_per_line_is_said_while_it_is_read(tmp_path, tok_dir, capsys):
    """1,200 lines without a blank line, then a blank line and a paragraph: said once the paragraph reaches 1,000
    lines, before the reader hands it on to be tokenized (a corpus of such lines held as one document may never
    reach the end of the run), naming the file and the paragraph's first line."""
    lines = make_texts(1200, seed=1)
    (tmp_path / "lines.txt").write_text("\n".join(lines) + "\n\n" + "\n".join(lines[:5]) + "\n")
    notes: list[str] = []
    docs = iter(DocumentReader([tmp_path / "lines.txt"], note=notes.append))
    first = next(docs)
    assert notes == [_long(f"{tmp_path / 'lines.txt'}:1")] and first.count("\n") == 1199, notes
    assert next(docs).count("\n") == 4 and next(docs, None) is None and len(notes) == 1

    err = _run(capsys, tok_dir, tmp_path / "one", tmp_path / "lines.txt")
    assert open_token_file(tmp_path / "one").num_documents == 2
    assert err == [_long(f"{tmp_path / 'lines.txt'}:1")], err


def test_each_file_is_said_once_and_the_first_three_by_name(tmp_path, tok_dir, capsys):
    """Two long paragraphs in one file: one note, at the first. Four such files: three named, then a count after
    the summary."""
    lines = make_texts(1000, seed=4)
    for name in "abcd":
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / f"{name}.txt").write_text(("\n".join(lines) + "\n\n") * (2 if name == "a" else 1))
    err = _run(capsys, tok_dir, tmp_path / "four", tmp_path / "in")
    named = [_long(f"{tmp_path / 'in' / n}.txt:1") for n in "abc"]
    named[2] = named[2].replace("one document:", "one document (further such files are not named):")
    assert err == [*named, f"preprocess: note: 4 .txt files held a paragraph of 1,000 lines and more (the first 3 "
                           f"named above): {RULE}"], err
    assert open_token_file(tmp_path / "four").num_documents == 5


def test_txt_files_whose_blank_lines_separate_documents_get_no_note(tmp_path, tok_dir, capsys):
    """Paragraphs of a few lines each, 20 paragraphs of 25 hard-wrapped lines, articles of 30 one-line paragraphs
    between blank lines, a paragraph of 999 lines, and .jsonl lines are what they should be."""
    texts = make_texts(999, seed=2)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "paragraphs.txt").write_text("\n\n".join("\n".join(texts[i:i + 3]) for i in range(0, 90, 3)))
    (tmp_path / "in" / "wrapped.txt").write_text("\n\n".join("\n".join(texts[i:i + 25]) for i in range(0, 500, 25)))
    (tmp_path / "in" / "articles.txt").write_text("\n\n".join("\n".join(texts[i:i + 30]) for i in range(0, 300, 30)))
    (tmp_path / "in" / "short.txt").write_text("\n".join(texts) + "\n")  # 999 lines: one below the bar
    write_jsonl(tmp_path / "in" / "docs.jsonl", texts[:90])
    err = _run(capsys, tok_dir, tmp_path / "c", tmp_path / "in")
    assert err == [] and open_token_file(tmp_path / "c").num_documents == 10 + 30 + 1 + 20 + 90


def test_a_paragraph_past_the_bound_is_bad_input(tmp_path, monkeypatch):
    """A paragraph past PARAGRAPH_BYTES (here 1 MiB) is one line naming the file, the paragraph's first line and what
    to do; with --skip_bad_lines it is skipped (its lines to the next blank line) and counted, and the file's other
    paragraphs are read."""
    monkeypatch.setattr(readers, "PARAGRAPH_BYTES", 1 << 20)
    line = "x" * 99 + "\n"
    (tmp_path / "big.txt").write_text("first\n\n" + line * 11000 + "\nlast\n")
    with pytest.raises(UserError) as e:
        list(DocumentReader([tmp_path / "big.txt"], note=lambda line: None))
    assert str(e.value) == (f"{tmp_path / 'big.txt'}:3: a paragraph (one document) of more than 1 MiB with no blank "
                            f"line; put blank lines between documents (or write them as .jsonl) or pass "
                            f"--skip_bad_lines"), str(e.value)
    notes: list[str] = []
    reader = DocumentReader([tmp_path / "big.txt"], skip_bad_lines=True, note=notes.append)
    assert list(reader) == ["first", "last"] and reader.bad_lines == 1
    assert notes == [_long(f"{tmp_path / 'big.txt'}:3"), f"warning: skipped {tmp_path / 'big.txt'}:3: a paragraph "
                     f"(one document) of more than 1 MiB with no blank line"], notes


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
