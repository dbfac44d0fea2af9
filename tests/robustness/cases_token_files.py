"""Bad inputs (cases.py): token files (`.idx`/`.bin` damaged or missing, ids above the vocabulary, splits and blends
that cannot be made, legacy pickles) as `check`, `inspect-data` and `eval` read them."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from case_run_json import cfg


def idx_patch(d: Path, offset: int, data: bytes) -> None:
    p = d / "data" / "c.idx"
    b = bytearray(p.read_bytes())
    b[offset: offset + len(data)] = data
    p.write_bytes(bytes(b))


def idx_header(d: Path):
    b = (d / "data" / "c.idx").read_bytes()
    n, dd = struct.unpack("<QQ", b[18:34])
    return n, dd


def t_missing_prefix(d):
    return cfg(d, input_dir="data/nothere"), ["input_dir: data/nothere", "no token files"]
def t_empty_dir(d):
    (d / "empty").mkdir()
    return cfg(d, input_dir="empty"), ["input_dir", "empty", "no .idx"]
def t_wrong_magic(d):
    idx_patch(d, 0, b"NOTANIDX\x00")
    return cfg(d), ["data/c.idx", "wrong magic"]
def t_wrong_version(d):
    idx_patch(d, 9, struct.pack("<Q", 2))
    return cfg(d), ["data/c.idx", "version 2"]
def t_dtype_code(d):
    idx_patch(d, 17, bytes([42]))
    return cfg(d), ["data/c.idx", "dtype code 42"]
def t_truncated_idx(d):
    p = d / "data" / "c.idx"
    p.write_bytes(p.read_bytes()[:-100])
    return cfg(d), ["data/c.idx", "truncated"]
def t_header_only(d):
    p = d / "data" / "c.idx"
    p.write_bytes(p.read_bytes()[:20])
    return cfg(d), ["data/c.idx", "34-byte header"]
def t_short_bin(d):
    p = d / "data" / "c.bin"
    p.write_bytes(p.read_bytes()[:-64])
    return cfg(d), ["data/c.bin", "truncated or mismatched"]
def t_missing_bin(d):
    (d / "data" / "c.bin").unlink()
    return cfg(d), ["data/c.bin", "missing"]
def t_decreasing_pointers(d):
    n, _ = idx_header(d)
    off = 34 + 4 * n + 8 * 5  # pointer of sequence 5
    idx_patch(d, off, struct.pack("<q", 2))
    return cfg(d), ["data/c.idx", "decreasing pointer at sequence 5"]
def t_doc_idx_end(d):
    n, dd = idx_header(d)
    idx_patch(d, 34 + 12 * n + 8 * (dd - 1), struct.pack("<q", n + 7))
    return cfg(d), ["data/c.idx", "doc_idx"]
def t_ids_above_vocab(d):
    p = d / "data" / "c.bin"
    a = np.fromfile(p, np.uint16)
    a[100] = 600
    a.tofile(p)
    (d / "data" / "c.json").unlink()  # the sidecar's max_token_id would be stale
    return cfg(d), ["data/c.bin", "max token id 600", "vocab_size 512"]
def t_zero_documents(d):
    with open(d / "data" / "c.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 0, 1) + struct.pack("<q", 0))
    (d / "data" / "c.bin").write_bytes(b"")
    return cfg(d), ["data/c.idx", "zero documents"]
def t_split_rounds_to_zero(d):
    return cfg(d, split="9990,1,0", do_eval=True), ["leaves the valid split empty", "0 of 400 documents", "set split: "]
def t_lsm_size(d):
    (d / "data" / "c.lsm").write_bytes(b"\x01" * 10)
    return cfg(d), ["data/c.lsm", "one byte per token"]
def t_legacy_pickle(d):
    arr = np.array([{"a": 1}, None], dtype=object)
    with open(d / "data" / "c_ids.npy", "wb") as f:
        np.save(f, arr, allow_pickle=True)
    np.savez(d / "data" / "c_idx.npz", lens=np.array([2]), docs=np.array([0, 1]))
    return cfg(d), ["data/c_ids.npy", "unreadable legacy", "Python objects"]
def t_blend_negative_weight(d):
    return cfg(d, input_dir="-1 data/c"), ["input_dir", "must be positive"]
def t_blend_odd(d):
    return cfg(d, input_dir="0.5 data/c 0.5"), ["input_dir", "weight/prefix pairs"]
def t_seq_longer_than_data(d):
    # a one-document corpus far shorter than max_seq_length
    tok = [1, 2, 3, 4, 5]
    with open(d / "data" / "c.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 1, 2))
        f.write(struct.pack("<i", len(tok)) + struct.pack("<q", 0) + struct.pack("<qq", 0, 1))
    np.array(tok, np.uint16).tofile(d / "data" / "c.bin")
    (d / "data" / "c.json").unlink()
    return cfg(d, split="1"), ["data/c", "fewer than one sample"]
def t_inspect_vocab(d):
    return ["inspect-data", "data/c", "--tokenizer", "small"], ["data/c.bin", "max token id", "vocab size 270"]
def t_inspect_step_zero(d):
    return ["inspect-data", "data/c", "--step", "0", "--max_seq_length", "32"], ["--step", ">= 1"]
def t_inspect_missing(d):
    return ["inspect-data", "data/zzz"], ["data/zzz", "no token files"]
def t_eval_data_missing(d):
    return ["eval", "--model", "micro-qwen2", "--data", "data/zzz", "--max_seq_length", "32"], ["data/zzz", "no token files"]
def t_eval_short_data(d):
    return ["eval", "--model", "micro-qwen2", "--data", "data/c", "--max_seq_length", "10000000"], ["--data", "fewer than one window"]
def t_eval_seq_zero(d):
    return ["eval", "--model", "micro-qwen2", "--data", "data/c", "--max_seq_length", "0"], ["--max_seq_length", ">= 1"]
def t_eval_ids_above_vocab(d):
    t_ids_above_vocab(d)
    return ["eval", "--model", "micro-qwen2", "--data", "data/c", "--max_seq_length", "32"], ["token id 600", "512"]
def t_eval_missing_model(d):
    return ["eval", "--model", "nomodel", "--data", "data/c", "--max_seq_length", "32"], ["--model", "nomodel"]
