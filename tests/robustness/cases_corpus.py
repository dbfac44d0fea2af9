"""Bad inputs (cases.py): the corpus given to `preprocess` and `train-tokenizer` (bad JSON lines, missing keys,
non-UTF-8 bytes, empty documents, corrupt Parquet and gzip, an output that would overwrite the input)."""
from __future__ import annotations


def _pre(src: str, *extra) -> list[str]:
    return ["preprocess", "--input_path", src, "--output_prefix", "out/x", "--tokenizer", "tok", *extra]
def j_bad_json_line(d):
    (d / "in.jsonl").write_text('{"text": "fine"}\n{"text": "broken\n{"text": "fine"}\n')
    return _pre("in.jsonl"), ["in.jsonl:2:", "not valid JSON", "--skip_bad_lines"]
def j_missing_key(d):
    (d / "in.jsonl").write_text('{"text": "fine"}\n{"text": "fine"}\n{"body": "x"}\n')
    return _pre("in.jsonl"), ["in.jsonl:3:", "no string field 'text'", "--json_key"]
def j_non_string_text(d):
    (d / "in.jsonl").write_text('{"text": 5}\n')
    return _pre("in.jsonl"), ["in.jsonl:1:", "no string field"]
def j_not_utf8(d):
    (d / "in.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "\xff\xfe"}\n')
    return _pre("in.jsonl"), ["in.jsonl", "not UTF-8"]
def j_all_empty(d):
    (d / "in.jsonl").write_text('{"text": ""}\n{"text": "   "}\n')
    return _pre("in.jsonl"), ["no non-empty documents"]
def j_missing_input(d):
    return _pre("nothere.jsonl"), ["nothere.jsonl", "input path not found"]
def j_no_text_files(d):
    (d / "bin_only").mkdir()
    (d / "bin_only" / "a.csv").write_bytes(b"PAR1")
    return _pre("bin_only"), ["no .jsonl/.json/.txt", ".parquet files"]
def j_corrupt_parquet(d):
    (d / "in.parquet").write_bytes(b"PAR1 not really")
    return _pre("in.parquet"), ["in.parquet", "not a readable Parquet file", "--skip_bad_lines"]
def j_truncated_gzip(d):
    import gzip

    (d / "in.jsonl.gz").write_bytes(gzip.compress(b'{"text": "fine"}\n' * 50)[:-12])
    return _pre("in.jsonl.gz"), ["in.jsonl.gz: line", "corrupt or truncated .gz data", "--skip_bad_lines"]
def j_output_clash(d):
    return ["preprocess", "--input_path", "in.json", "--output_prefix", "in", "--tokenizer", "tok"], ["would overwrite the input"]
def j_output_clash_setup(d):
    (d / "in.json").write_text('{"text": "hello"}\n')
    return j_output_clash(d)
def j_train_tokenizer_bad_line(d):
    (d / "in.jsonl").write_text('{"text": "fine"}\n[not json\n')
    return (["train-tokenizer", "--input_path", "in.jsonl", "--output_dir", "out/tok", "--vocab_size", "300"],
            ["in.jsonl:2:", "not valid JSON"])
