"""preprocess: documents -> token files round trip, sidecar, bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest

from data_helpers import run_preprocess, make_texts, make_tokenizer, write_jsonl
from pretrain_cli.data.indexed import open_token_file
from pretrain_cli.data.indexed_writer import IndexedDatasetWriter
from pretrain_cli.errors import UserError
from pretrain_cli.data.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tok")



@pytest.mark.parametrize("append_eos", [False, True])
def test_round_trip_uint16(tmp_path, tok_dir, append_eos):
    texts = make_texts(120, seed=3)
    texts[5] = ""  # empty documents are skipped
    write_jsonl(tmp_path / "in" / "b.jsonl", texts[60:])
    write_jsonl(tmp_path / "in" / "sub" / "a.jsonl", texts[:60])  # walked recursively, sorted by path
    (tmp_path / "in" / "notes.md").write_text("ignored")
    args = ["--input_path", tmp_path / "in", "--output_prefix", tmp_path / "out" / "c", "--tokenizer", tok_dir,
            "--log_interval", "50"] + (["--append_eos"] if append_eos else [])
    assert run_preprocess(*args) == 0
    tok = load_tokenizer(tok_dir)
    order = texts[60:] + texts[:60]  # "b.jsonl" sorts before "sub/a.jsonl"
    want = [tok.encode(t) + ([tok.eos_token_id] if append_eos else []) for t in order if t]
    ds = open_token_file(tmp_path / "out" / "c")
    assert ds.dtype == np.uint16 and ds.num_documents == len(want) == 119
    assert [ds.get(i).tolist() for i in range(len(ds))] == want
    meta = json.loads((tmp_path / "out" / "c.json").read_text())
    assert meta["documents"] == 119 and meta["tokens"] == sum(map(len, want))
    assert meta["max_token_id"] == max(max(w) for w in want) and meta["dtype"] == "uint16"
    assert meta["tokenizer_sha256"] == tok.sha256 and meta["eos_appended"] is append_eos
    assert meta["skipped_empty_documents"] == 1 and meta["vocab_size"] == tok.vocab_size


def test_workers_give_identical_bytes(tmp_path, tok_dir):
    write_jsonl(tmp_path / "a.jsonl", make_texts(700, seed=4))
    for w in (1, 2):
        run_preprocess("--input_path", tmp_path / "a.jsonl", "--output_prefix", tmp_path / f"w{w}", "--tokenizer", tok_dir,
             "--workers", w, "--append_eos")
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"w1{ext}").read_bytes() == (tmp_path / f"w2{ext}").read_bytes()


def test_int32_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(60000, 151000, size=int(n)) for n in rng.integers(1, 30, size=20)]
    with IndexedDatasetWriter(tmp_path / "big", np.int32) as w:
        w.add_documents(np.concatenate(docs), [len(d) for d in docs])
        w.finalize()
    ds = open_token_file(tmp_path / "big")
    assert ds.dtype == np.int32 and ds.max_token_id() == max(int(d.max()) for d in docs)
    assert all(ds.get(i).tolist() == d.tolist() for i, d in enumerate(docs))


def test_txt_paragraphs_and_max_doc_num(tmp_path, tok_dir):
    (tmp_path / "a.txt").write_text("one line\nsame doc\n\n\ntwo\n\nthree\n")
    run_preprocess("--input_path", tmp_path / "a.txt", "--output_prefix", tmp_path / "t", "--tokenizer", tok_dir)
    tok = load_tokenizer(tok_dir)
    ds = open_token_file(tmp_path / "t")
    assert [tok.decode(ds.get(i)) for i in range(len(ds))] == ["one line\nsame doc", "two", "three"]
    run_preprocess("--input_path", tmp_path / "a.txt", "--output_prefix", tmp_path / "m", "--tokenizer", tok_dir,
         "--max_doc_num", "2")
    assert open_token_file(tmp_path / "m").num_documents == 2


def test_max_doc_num_says_from_how_many_files_its_documents_came(tmp_path, tok_dir, capsys):
    """--max_doc_num takes the first N documents in file order: the summary says how far into the files that was."""
    for i in range(3):
        write_jsonl(tmp_path / "in" / f"{i}.jsonl", make_texts(20, seed=i))
    capsys.readouterr()
    run_preprocess("--input_path", tmp_path / "in", "--output_prefix", tmp_path / "m", "--tokenizer", tok_dir,
                   "--max_doc_num", "25")
    assert capsys.readouterr().out.rstrip().endswith("; --max_doc_num 25: the first documents, from 2 of 3 files")
    run_preprocess("--input_path", tmp_path / "in", "--output_prefix", tmp_path / "a", "--tokenizer", tok_dir,
                   "--max_doc_num", "100")  # more than there are: nothing to say
    assert "--max_doc_num" not in capsys.readouterr().out


def test_bad_lines(tmp_path, tok_dir):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"text": "good one"}\n{"text": broken\n{"other": "x"}\n{"text": "good two"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:2: not valid JSON .*--skip_bad_lines") as e:
        run_preprocess("--input_path", f, "--output_prefix", tmp_path / "o", "--tokenizer", tok_dir)
    assert "\n" not in str(e.value)
    assert not list(tmp_path.glob("o.*"))  # nothing left behind, not even .tmp files
    run_preprocess("--input_path", f, "--output_prefix", tmp_path / "o", "--tokenizer", tok_dir, "--skip_bad_lines")
    assert open_token_file(tmp_path / "o").num_documents == 2
    assert json.loads((tmp_path / "o.json").read_text())["skipped_bad_lines"] == 2
    f.write_text('{"other": "x"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:1: no string field 'text'.*--json_key"):
        run_preprocess("--input_path", f, "--output_prefix", tmp_path / "p", "--tokenizer", tok_dir)


def test_bad_json_line_says_where_in_the_line(tmp_path, tok_dir):
    """The column and the mistake as every user's JSON file names it (`json_mistakes.cause`), not json's "Invalid
    control character at" / "Expecting value", which say neither what is wrong nor what to do."""
    f = tmp_path / "bad.jsonl"
    f.write_text('{"text": "good one"}\n{"text": "unterminated\n{"text": broken}\n')
    with pytest.raises(UserError, match=r'bad.jsonl:2: not valid JSON at column 23: a string not closed on its '
                                        r'line; end it with "; fix it or pass --skip_bad_lines$'):
        run_preprocess("--input_path", f, "--output_prefix", tmp_path / "o", "--tokenizer", tok_dir)
    f.write_text('{"text": broken}\n')
    with pytest.raises(UserError, match=r'bad.jsonl:1: not valid JSON at column 10: an unquoted string broken; put '
                                        r'it in double quotes \("broken"\); fix it'):
        run_preprocess("--input_path", f, "--output_prefix", tmp_path / "o", "--tokenizer", tok_dir)


def test_empty_corpus_and_clobber(tmp_path, tok_dir):
    write_jsonl(tmp_path / "e.jsonl", ["", " "])
    with pytest.raises(UserError, match="no non-empty documents"):
        run_preprocess("--input_path", tmp_path / "e.jsonl", "--output_prefix", tmp_path / "o", "--tokenizer", tok_dir)
    assert not list(tmp_path.glob("o.*"))
    with pytest.raises(UserError, match=r"no .jsonl/.json/.txt \(plain, .gz, .zst, .bz2, .xz\) or .parquet files"):
        (tmp_path / "d").mkdir()
        run_preprocess("--input_path", tmp_path / "d", "--output_prefix", tmp_path / "o", "--tokenizer", tok_dir)
    write_jsonl(tmp_path / "x.json", ["hello"])
    with pytest.raises(UserError, match="would overwrite the input"):
        run_preprocess("--input_path", tmp_path / "x.json", "--output_prefix", tmp_path / "x", "--tokenizer", tok_dir)


def test_a_prefix_without_a_file_name_or_under_a_file_is_refused(tmp_path, tok_dir):
    """`data/` would write the hidden `data/.bin`, which a directory input_dir then blends in."""
    write_jsonl(tmp_path / "t.jsonl", ["hello world"])
    (tmp_path / "data").mkdir()
    (tmp_path / "afile").write_text("x")
    for prefix, words in ((f"{tmp_path / 'data'}/", "names a directory, not the files' name; add one, e.g. "),
                          (f"{tmp_path / 'data'}/.bin", "names a directory"),
                          (f"{tmp_path / 'afile'}/c", f"{tmp_path / 'afile'} is a file, not a directory"),
                          (f"{tmp_path / 'afile'}/d/c", f"{tmp_path / 'afile'} is a file, not a directory")):
        with pytest.raises(UserError) as e:
            run_preprocess("--input_path", tmp_path / "t.jsonl", "--output_prefix", prefix, "--tokenizer", tok_dir)
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "data", "t.jsonl"]
    assert not list((tmp_path / "data").iterdir())


def test_the_data_layer_prints_nothing_the_command_says_where_lines_go(tmp_path, tok_dir, capsys):
    """`data.preprocess` takes the `Job` the command builds and hands every line to the caller: the outcome to
    `say`, progress and warnings to `note`; with neither given, nothing reaches stdout or stderr."""
    from pretrain_cli.data.preprocess import Job, preprocess

    write_jsonl(tmp_path / "in" / "a.jsonl", make_texts(30, seed=5))
    (tmp_path / "in" / "b.jsonl").write_text('{"text": "fine"}\nnot json\n')
    job = Job((str(tmp_path / "in"),), str(tmp_path / "out" / "c"), str(tok_dir), log_interval=10, skip_bad_lines=True)
    assert preprocess(job) == 0
    assert capsys.readouterr() == ("", "")
    said, noted = [], []
    assert preprocess(Job(job.input_path, str(tmp_path / "again" / "c"), str(tok_dir), log_interval=10,
                          skip_bad_lines=True), said.append, noted.append) == 0
    assert capsys.readouterr() == ("", "")
    assert len(said) == 1 and said[0].startswith("preprocess: wrote ") and "1 bad lines skipped" in said[0]
    assert any(n.startswith("warning: skipped ") for n in noted) and any(" docs/s, " in n for n in noted)
