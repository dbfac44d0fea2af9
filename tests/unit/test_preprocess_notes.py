"""preprocess's notes on what a new user gets silently wrong (a new-user walk): a .txt file of one document per line
became one document, said only by `check`'s empty valid split; files without --append_eos were made without a word,
said only by inspect-data's 'documents ending in EOS: 0.0%'. And the --help that says how a .txt file is split."""
from __future__ import annotations

import argparse
import json

import pytest

from data_helpers import make_texts, make_tokenizer, run_preprocess, write_jsonl
from pretrain_cli.commands import preprocess, train_tokenizer
from pretrain_cli.data import documents, readers
from pretrain_cli.data.documents import DocumentReader, paragraph_note
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
    """Two long paragraphs in one file: one note, at the first. Three such files: three named, no word of further
    ones (there are none). Four: the fourth named, saying any further ones are not named (true of none), and no
    count. Five: the fourth so, then the count after the summary."""
    lines = make_texts(1000, seed=4)
    (tmp_path / "in").mkdir()
    for name in "abcde":
        (tmp_path / "in" / f"{name}.txt").write_text(("\n".join(lines) + "\n\n") * (2 if name == "a" else 1))
    named = [_long(f"{tmp_path / 'in' / n}.txt:1") for n in "abc"]
    err = _run(capsys, tok_dir, tmp_path / "three", *[tmp_path / "in" / f"{n}.txt" for n in "abc"])
    assert err == named, err
    err = _run(capsys, tok_dir, tmp_path / "four", *[tmp_path / "in" / f"{n}.txt" for n in "abcd"])
    assert err == [*named, _FOURTH.format(tmp_path / "in" / "d.txt")], err  # (no count after: no fifth to count)
    err = _run(capsys, tok_dir, tmp_path / "five", tmp_path / "in")
    assert err == [*named, _FOURTH.format(tmp_path / "in" / "d.txt"), f"preprocess: note: 5 .txt files held a "
                   f"paragraph of 1,000 lines and more (the first 4 named above): {RULE}"], err
    assert open_token_file(tmp_path / "five").num_documents == 6


_FOURTH = ("note: {}:1: also a paragraph of 1,000 lines and more with no blank line (any further such files are "
           "not named)")


def test_a_resumed_reader_goes_on_counting_long_paragraph_files(tmp_path):
    """The count is among the counters a resumed preprocess restores: the files after the resume are the fourth
    and fifth, not named as the first and second."""
    lines = make_texts(1000, seed=5)
    paths = []
    for name in "abcde":
        paths.append(tmp_path / f"{name}.txt")
        paths[-1].write_text("\n".join(lines) + "\n")
    first = DocumentReader(paths[:3], note=lambda line: None)
    assert len(list(first)) == 3
    notes: list[str] = []
    resumed = DocumentReader(paths[3:], note=notes.append)
    resumed.restore(first.counters())
    assert len(list(resumed)) == 2 and notes == [_FOURTH.format(paths[3])], notes
    assert paragraph_note(resumed).startswith("note: 5 .txt files held a paragraph"), paragraph_note(resumed)


def test_the_note_comes_before_the_line_after_the_thousandth_is_read(tmp_path):
    """The reader is told at the 1,000th line of a paragraph, before it asks for the 1,001st: a file object that
    stops the reading there finds the note given."""
    notes: list[str] = []
    reader = readers.FileReader(tmp_path / "lines.txt", "text", None, None, notes.append)

    def lines():
        for i in range(1000):
            yield b"line %d\n" % i
        raise RuntimeError(f"the 1,001st line read; notes so far: {notes}")

    with pytest.raises(RuntimeError, match=r"notes so far: \['.*lines.txt:1'\]"):
        list(reader._paragraphs(lines()))


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


def test_a_paragraph_past_the_bound_is_bad_input(tmp_path, tok_dir, capsys, monkeypatch):
    """A paragraph past PARAGRAPH_BYTES (here 1 MiB) is one line naming the file, the paragraph's first line and what
    to do; with --skip_bad_lines it is skipped (its lines to the next blank line), counted as what it is, a
    paragraph of so many lines and bytes (not '1 bad line': it may be a whole file), and said with its size, in the
    warning, preprocess's summary and its sidecar; the file's other paragraphs are read."""
    monkeypatch.setattr(readers, "PARAGRAPH_BYTES", 1 << 20)
    monkeypatch.setattr(documents, "PARAGRAPH_BYTES", 1 << 20)
    line = "x" * 99 + "\n"
    (tmp_path / "big.txt").write_text("first\n\n" + line * 11000 + "\nlast\n")
    with pytest.raises(UserError) as e:
        list(DocumentReader([tmp_path / "big.txt"], note=lambda line: None))
    assert str(e.value) == (f"{tmp_path / 'big.txt'}:3: a paragraph (one document) of more than 1 MiB with no blank "
                            f"line; put blank lines between documents (or write them as .jsonl) or pass "
                            f"--skip_bad_lines"), str(e.value)
    notes: list[str] = []
    reader = DocumentReader([tmp_path / "big.txt"], skip_bad_lines=True, note=notes.append)
    assert list(reader) == ["first", "last"] and reader.bad_lines == 0 and reader.dropped_paragraphs == 1
    skipped = (f"warning: skipped {tmp_path / 'big.txt'}:3: a paragraph (one document) of 11,000 lines / 1.1 MB "
               f"with no blank line, past the 1 MiB bound")
    assert notes == [_long(f"{tmp_path / 'big.txt'}:3"), skipped], notes
    capsys.readouterr()
    assert run_preprocess("--input_path", tmp_path / "big.txt", "--output_prefix", tmp_path / "big", "--tokenizer",
                          tok_dir, "--append_eos", "--skip_bad_lines", "--log_interval", "0") == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == notes, err
    assert ", 0 bad lines skipped, 1 paragraph of 11,000 lines / 1.1 MB skipped, " in out, out
    sidecar = json.loads((tmp_path / "big.json").read_text())
    assert sidecar["skipped_long_paragraphs"] == 1 and sidecar["skipped_bad_lines"] == 0, sidecar


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
