"""Real corpora: compressed and Parquet readers, error lines, task shares, resume, merge-data, inspect of a directory."""
from __future__ import annotations

import argparse
import bz2
import gzip
import json
import lzma
import os

import numpy as np
import pytest

from data_helpers import run_preprocess, make_texts, make_tokenizer, write_jsonl, write_mmidx_reference
from pretrain_cli import cli
from pretrain_cli.commands import inspect_data
from pretrain_cli.data import build_datasets
from pretrain_cli.data.documents import DocumentReader
from pretrain_cli.data.indexed import open_token_file
from pretrain_cli.data.indexed_writer import IndexedDatasetWriter
from pretrain_cli.data.merge import merge
from pretrain_cli.errors import UserError


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tok")



def _jsonl_bytes(texts, key="text") -> bytes:
    return "".join(json.dumps({key: t}) + "\n" for t in texts).encode()


def _zst(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


def _parquet(path, texts, key="text", row_group_size=7):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": list(range(len(texts))), key: texts}), path, row_group_size=row_group_size)


def test_every_format_reads_the_same_documents(tmp_path, tok_dir):
    texts = make_texts(30, seed=1)
    raw = _jsonl_bytes(texts)
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.jsonl").write_bytes(raw)
    (d / "b.jsonl.gz").write_bytes(gzip.compress(raw))
    (d / "c.jsonl.zst").write_bytes(_zst(raw[:500]) + _zst(raw[500:]))  # two frames, as concatenated shards are
    (d / "d.json.bz2").write_bytes(bz2.compress(raw))
    (d / "e.jsonl.xz").write_bytes(lzma.compress(raw))
    (d / "f.txt.gz").write_bytes(gzip.compress("\n\n".join(texts).encode()))
    _parquet(d / "g.parquet", texts, key="content")
    (d / "notes.md").write_text("skipped")
    for f in sorted(d.iterdir()):
        if f.suffix == ".md":
            continue
        reader = DocumentReader(f, json_key="content" if f.suffix == ".parquet" else "text")
        assert list(reader) == texts, f.name
        assert reader.bytes >= sum(map(len, texts))
    # a glob and a directory, overlapping: each file once, sorted; Parquet's column named by --json_key
    (tmp_path / "p").mkdir()
    _parquet(tmp_path / "p" / "x.parquet", texts[:5])
    run_preprocess("--input_path", str(d / "*.jsonl*"), d, tmp_path / "p" / "x.parquet", "--output_prefix", tmp_path / "o" / "c",
         "--tokenizer", tok_dir, "--skip_bad_lines")
    meta = json.loads((tmp_path / "o" / "c.json").read_text())
    # a, b, c, e by the glob; d (.json.bz2) and f from the directory walk; g has no 'text' column (skipped part)
    assert meta["input_files"] == 8 and meta["documents"] == 6 * 30 + 5 and meta["skipped_corrupt_parts"] == 1


@pytest.mark.parametrize("name,content,expect", [
    ("t.jsonl.gz", lambda raw: gzip.compress(raw)[:-30], r"t.jsonl.gz: line \d+: corrupt or truncated .gz data"),
    ("t.jsonl.zst", lambda raw: _zst(raw[:600]) + _zst(raw[600:])[:-20], r"t.jsonl.zst: line \d+: corrupt or truncated .zst data"),
    ("t.jsonl.zst", lambda raw: _zst(raw.replace(b"\n", b"\n{oops\n", 1)), r"t.jsonl.zst:2: not valid JSON"),
    ("t.jsonl.xz", lambda raw: lzma.compress(raw + b'{"text": "\xff"}\n'), r"t.jsonl.xz:31: not UTF-8"),
    ("t.parquet", lambda raw: b"PAR1 not really", r"t.parquet: not a readable Parquet file"),
])
def test_corrupt_input_is_one_line_or_skipped_and_counted(tmp_path, tok_dir, capsys, name, content, expect):
    raw = _jsonl_bytes(make_texts(30, seed=2))
    (tmp_path / name).write_bytes(content(raw))
    argv = ["preprocess", "--input_path", str(tmp_path / name), "--output_prefix", str(tmp_path / "o"),
            "--tokenizer", str(tok_dir)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "--skip_bad_lines" in err
    import re

    assert re.search(expect, err), err
    assert not list(tmp_path.glob("o.*"))  # nothing half-written
    rc = cli.main(argv + ["--skip_bad_lines"])
    if name.endswith(".parquet"):  # nothing readable is left
        assert rc == 2 and "no non-empty documents" in capsys.readouterr().err
        return
    assert rc == 0
    meta = json.loads((tmp_path / "o.json").read_text())
    assert meta["skipped_bad_lines"] + meta["skipped_corrupt_parts"] == 1 and meta["documents"] >= 1


def test_parquet_errors_name_the_column_and_row_group(tmp_path, tok_dir):
    _parquet(tmp_path / "a.parquet", ["one", "two", None, "four"], row_group_size=2)
    with pytest.raises(UserError, match=r"a.parquet: row group 1 row 0: 'text' is null"):
        run_preprocess("--input_path", tmp_path / "a.parquet", "--output_prefix", tmp_path / "o", "--tokenizer", tok_dir)
    with pytest.raises(UserError, match=r"a.parquet: no column 'body' \(columns: id, text\); pass --json_key COLUMN"):
        run_preprocess("--input_path", tmp_path / "a.parquet", "--output_prefix", tmp_path / "o", "--tokenizer", tok_dir,
             "--json_key", "body")
    with pytest.raises(UserError, match=r"a.parquet: column 'id' holds int64, not strings"):
        run_preprocess("--input_path", tmp_path / "a.parquet", "--output_prefix", tmp_path / "o", "--tokenizer", tok_dir,
             "--json_key", "id")


def _corpus_files(d, n=5):
    texts = make_texts(25 * n, seed=6)
    for i in range(n):
        write_jsonl(d / f"part{i}.jsonl", texts[25 * i : 25 * (i + 1)])
    return texts


def test_tasks_merge_to_the_single_run_bytes(tmp_path, tok_dir, capsys):
    _corpus_files(tmp_path / "in")
    common = ["--input_path", tmp_path / "in", "--tokenizer", tok_dir, "--append_eos"]
    run_preprocess(*common, "--output_prefix", tmp_path / "one" / "c")
    for i in range(3):
        run_preprocess(*common, "--output_prefix", tmp_path / "tasks" / "c", "--num_tasks", 3, "--task_index", i)
    names = sorted(p.name for p in (tmp_path / "tasks").iterdir())
    assert names == [f"c-0000{i}-of-00003.{e}" for i in range(3) for e in ("bin", "idx", "json")]
    shares = [json.loads((tmp_path / "tasks" / f"c-0000{i}-of-00003.json").read_text())["input_files"] for i in range(3)]
    assert shares == [1, 2, 2]  # contiguous shares files[i*n//N:(i+1)*n//N]
    assert cli.main(["merge-data", str(tmp_path / "m" / "c"), str(tmp_path / "tasks")]) == 0
    for ext in (".bin", ".idx"):
        assert (tmp_path / "m" / f"c{ext}").read_bytes() == (tmp_path / "one" / f"c{ext}").read_bytes()
    meta = json.loads((tmp_path / "m" / "c.json").read_text())
    one = json.loads((tmp_path / "one" / "c.json").read_text())
    assert meta["documents"] == one["documents"] and meta["tokenizer_sha256"] == one["tokenizer_sha256"]
    # a directory of task outputs as input_dir: each file weighted by its tokens, like the merged file
    splits = build_datasets(str(tmp_path / "tasks"), "1", 8, 0, need=("train",))
    assert [s["weight"] for s in splits.sources] == [s["dataset"].num_tokens for s in splits.sources]
    # inspect-data on the directory: one line per file, the tokenizer agrees
    capsys.readouterr()
    p = argparse.ArgumentParser()
    inspect_data.add_arguments(p)
    assert inspect_data.main(p.parse_args([str(tmp_path / "tasks")])) == 0
    out = capsys.readouterr().out
    assert "3 token files" in out and out.count("-of-00003") == 3 and "the 3 files with a sidecar agree" in out
    # more tasks than files: an empty task says so and writes nothing
    run_preprocess(*common, "--output_prefix", tmp_path / "many" / "c", "--num_tasks", 9, "--task_index", 0)
    assert "nothing to do" in capsys.readouterr().out and not (tmp_path / "many").exists()
    # outputs inside the input directory are never read back: the re-run finds the same inputs
    run_preprocess(*common, "--output_prefix", tmp_path / "in" / "tok" / "c")
    run_preprocess(*common, "--output_prefix", tmp_path / "in" / "tok" / "c")
    assert "already complete" in capsys.readouterr().out
    with pytest.raises(UserError, match=r"--task_index: 3 must be in \[0, 2\]"):
        run_preprocess(*common, "--output_prefix", tmp_path / "x", "--num_tasks", 3, "--task_index", 3)


def test_killed_task_resumes_after_its_finished_files(tmp_path, tok_dir, monkeypatch, capsys):
    _corpus_files(tmp_path / "in", n=4)
    argv = ["--input_path", tmp_path / "in", "--tokenizer", tok_dir, "--output_prefix"]
    run_preprocess(*argv, tmp_path / "ref" / "c")
    read, die = [], [True]
    original_read = DocumentReader.read

    def read_then_die(self, path):
        read.append(path.name)
        for i, text in enumerate(original_read(self, path)):
            if path.name == "part2.jsonl" and i == 10 and die[0]:
                raise KeyboardInterrupt  # killed in the middle of the third file
            yield text

    monkeypatch.setattr(DocumentReader, "read", read_then_die)
    with pytest.raises(KeyboardInterrupt):
        run_preprocess(*argv, tmp_path / "out" / "c")
    left = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert left == ["c.bin.tmp", "c.docs.tmp", "c.progress.json", "c.sizes.tmp"]  # no final names
    assert json.loads((tmp_path / "out" / "c.progress.json").read_text())["done_files"] == 2
    read.clear()
    die[0] = False
    run_preprocess(*argv, tmp_path / "out" / "c", "--workers", 2)
    assert read == ["part2.jsonl", "part3.jsonl"]  # the finished files are skipped
    assert "resuming" in capsys.readouterr().err
    for ext in (".bin", ".idx"):
        assert (tmp_path / "out" / f"c{ext}").read_bytes() == (tmp_path / "ref" / f"c{ext}").read_bytes()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["c.bin", "c.idx", "c.json"]
    read.clear()
    run_preprocess(*argv, tmp_path / "out" / "c")  # a finished task re-run (a requeued array) does nothing
    assert read == [] and "already complete" in capsys.readouterr().out
    # a progress record made with other settings is not trusted: the task starts over, and says so
    die[0] = True
    with pytest.raises(KeyboardInterrupt):
        run_preprocess(*argv, tmp_path / "eos" / "c")
    read.clear()
    die[0] = False
    run_preprocess(*argv, tmp_path / "eos" / "c", "--append_eos")
    assert read[0] == "part0.jsonl" and "made with other settings (eos)" in capsys.readouterr().err


def test_merge_is_megatron_layout_and_checks_inputs(tmp_path, tok_dir):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 300, size=int(n)).tolist() for n in rng.integers(1, 20, size=12)]
    write_mmidx_reference(str(tmp_path / "a"), docs[:5])  # no sidecars: Megatron/PaddleNLP files
    write_mmidx_reference(str(tmp_path / "b"), docs[5:])
    write_mmidx_reference(str(tmp_path / "want"), docs)
    meta = merge(str(tmp_path / "m"), [tmp_path / "a.idx", tmp_path / "b"])
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"m{ext}").read_bytes() == (tmp_path / f"want{ext}").read_bytes()
    assert meta["inputs_without_sidecar"] == 2 and meta["documents"] == 12
    with IndexedDatasetWriter(tmp_path / "wide", np.int32) as w:
        w.add_documents(np.arange(5), [2, 3])
        w.finalize()
    with pytest.raises(UserError, match=r"wide: dtype int32 differs from uint16 of .*a; .*share a dtype"):
        merge(str(tmp_path / "x"), [tmp_path / "a", tmp_path / "wide"])
    with pytest.raises(UserError, match="the output is also an input"):
        merge(str(tmp_path / "a"), [tmp_path / "a", tmp_path / "b"])
    assert not list(tmp_path.glob("x.*"))
    # sidecars that disagree on the tokenizer: merge refuses, inspect-data on the directory exits 2 naming both
    d = tmp_path / "mixed"
    write_jsonl(tmp_path / "t.jsonl", make_texts(20, seed=3))
    small = make_tokenizer(tmp_path / "small", make_texts(50, seed=1), vocab_size=280)
    run_preprocess("--input_path", tmp_path / "t.jsonl", "--output_prefix", d / "a", "--tokenizer", tok_dir)
    run_preprocess("--input_path", tmp_path / "t.jsonl", "--output_prefix", d / "b", "--tokenizer", small)
    write_mmidx_reference(str(d / "c"), docs)
    with pytest.raises(UserError, match=r"b.json: vocab_size 280 differs from 300 in .*a.json"):
        merge(str(tmp_path / "y"), [d])
    rc = cli.main(["inspect-data", str(d)])
    assert rc == 2
    assert open_token_file(d / "c").num_documents == 12


def test_inspect_directory_notes_files_without_sidecar(tmp_path, tok_dir, capsys):
    write_jsonl(tmp_path / "t.jsonl", make_texts(20, seed=3))
    run_preprocess("--input_path", tmp_path / "t.jsonl", "--output_prefix", tmp_path / "d" / "a", "--tokenizer", tok_dir)
    write_mmidx_reference(str(tmp_path / "d" / "old"), [[1, 2, 3], [4]])
    capsys.readouterr()
    assert cli.main(["inspect-data", str(tmp_path / "d"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [os.path.basename(r["prefix"]) for r in info["files"]] == ["a", "old"]
    assert info["without_sidecar"] == 1 and info["problems"] == [] and info["documents"] == 22
    assert info["files"][0]["vocab_size"] == 300 and info["files"][0]["eos_token_id"] is not None
    assert cli.main(["inspect-data", str(tmp_path / "d")]) == 0
    assert "note: 1 file has no .json sidecar" in capsys.readouterr().out


def test_token_files_of_another_tokenizer_are_refused(tmp_path, tok_dir):
    """The run's tokenizer against each file's sidecar (train, check and inspect-data build their data here): a
    different vocabulary, or the same size retrained on other text (only tokenizer.json's sha256 differs)."""
    from pretrain_cli.data.tokenizer import load_tokenizer

    write_jsonl(tmp_path / "t.jsonl", make_texts(20, seed=3))
    other = make_tokenizer(tmp_path / "other", make_texts(50, seed=1), vocab_size=280)
    same_size = make_tokenizer(tmp_path / "same_size", make_texts(50, seed=7), vocab_size=300)
    run_preprocess("--input_path", tmp_path / "t.jsonl", "--output_prefix", tmp_path / "d" / "a", "--tokenizer", tok_dir)
    run_preprocess("--input_path", tmp_path / "t.jsonl", "--output_prefix", tmp_path / "e" / "b", "--tokenizer", other)
    ok = build_datasets(str(tmp_path / "d"), "90,5,5", 16, 1, tokenizer=load_tokenizer(tok_dir), need=("train",))
    assert ok.train is not None
    for tok, field in ((other, f"vocab_size 300; {other} has 280"), (same_size, "fingerprint")):
        with pytest.raises(UserError) as e:
            build_datasets(str(tmp_path / "d"), "90,5,5", 16, 1, tokenizer=load_tokenizer(tok), need=("train",))
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"{tmp_path / 'd' / 'a'}.json: made by another tokenizer than")
        assert field in msg and "re-run preprocess with" in msg, msg
    # a blend of files of two tokenizers, with no tokenizer in the run: refused too
    blend = f"0.5 {tmp_path / 'd' / 'a'} 0.5 {tmp_path / 'e' / 'b'}"
    with pytest.raises(UserError, match=r"b.json: vocab_size 280 differs from 300 in .*a.json"):
        build_datasets(blend, "90,5,5", 16, 1, need=("train",))
    assert cli.main(["inspect-data", str(tmp_path / "d" / "a"), "--tokenizer", str(other)]) == 2
    # the same tokenizer, reformatted (a run's export of a vocab.json + merges.txt source, or a re-save): accepted
    from pretrain_cli.data.tokenizer import export_files

    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "tokenizer.json").write_text(json.dumps(json.loads((tok_dir / "tokenizer.json").read_text()),
                                                                 indent=4))
    (tmp_path / "export").mkdir()
    export_files(tok_dir, tmp_path / "export")
    for copy in (tmp_path / "copy", tmp_path / "export"):
        assert load_tokenizer(copy).sha256 != load_tokenizer(tok_dir).sha256 or copy.name == "export"
        assert build_datasets(str(tmp_path / "d"), "90,5,5", 16, 1, tokenizer=load_tokenizer(copy),
                              need=("train",)).train is not None
    # a sidecar from before the fingerprint (sha256 of the file's bytes only): judged by size and eos alone
    meta = json.loads((tmp_path / "d" / "a.json").read_text())
    meta.pop("tokenizer_fingerprint")
    (tmp_path / "d" / "a.json").write_text(json.dumps(meta))
    assert build_datasets(str(tmp_path / "d"), "90,5,5", 16, 1, tokenizer=load_tokenizer(tmp_path / "copy"),
                          need=("train",)).train is not None
