"""Token files: byte layout, independent readers/writers, validation errors."""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from data_helpers import write_mmidx_reference
from pretrain_cli.data.indexed import dtype_for_vocab, open_token_file, strip_prefix, token_prefixes
from pretrain_cli.data.indexed_writer import IndexedDatasetWriter
from pretrain_cli.errors import UserError

# Two documents [1,2,3] and [4,5] as uint16, spelled out by hand from ARCHITECTURE.md facts: MMIDIDX v1.
HAND_IDX = (
    b"MMIDIDX\x00\x00"
    + (1).to_bytes(8, "little")  # version
    + bytes([8])  # dtype code 8 = uint16
    + (2).to_bytes(8, "little")  # N sequences
    + (3).to_bytes(8, "little")  # D = documents + 1
    + (3).to_bytes(4, "little") + (2).to_bytes(4, "little")  # sizes int32
    + (0).to_bytes(8, "little") + (6).to_bytes(8, "little")  # byte pointers int64
    + (0).to_bytes(8, "little") + (1).to_bytes(8, "little") + (2).to_bytes(8, "little")  # doc_idx
)
HAND_BIN = b"\x01\x00\x02\x00\x03\x00\x04\x00\x05\x00"


def _write(prefix, docs, dtype=np.uint16):
    with IndexedDatasetWriter(prefix, dtype) as w:
        for d in docs:
            w.add_item(d)
            w.end_document()
        w.finalize()


def test_writer_matches_hand_written_bytes(tmp_path):
    prefix = str(tmp_path / "tiny")
    _write(prefix, [[1, 2, 3], [4, 5]])
    assert open(prefix + ".idx", "rb").read() == HAND_IDX
    assert open(prefix + ".bin", "rb").read() == HAND_BIN
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]
    ds = open_token_file(prefix + ".bin")
    assert len(ds) == 2 and ds.num_documents == 2 and ds.num_tokens == 5 and ds.dtype == np.uint16
    assert ds.get(0).tolist() == [1, 2, 3] and ds.get(1).tolist() == [4, 5]
    assert ds.get(0, offset=1, length=1).tolist() == [2]
    assert ds.sizes.tolist() == [3, 2] and ds.pointers.tolist() == [0, 6] and ds.doc_idx.tolist() == [0, 1, 2]
    assert ds.max_token_id() == 5


def test_hand_written_bytes_read_back(tmp_path):
    (tmp_path / "h.idx").write_bytes(HAND_IDX)
    (tmp_path / "h.bin").write_bytes(HAND_BIN)
    ds = open_token_file(tmp_path / "h")
    assert [ds.get(i).tolist() for i in range(2)] == [[1, 2, 3], [4, 5]]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64, np.uint8])
def test_reads_independent_numpy_writer(tmp_path, dtype):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 200, size=int(n)).tolist() for n in rng.integers(1, 50, size=30)]
    write_mmidx_reference(str(tmp_path / "ref"), docs, dtype)
    ds = open_token_file(str(tmp_path / "ref"))
    assert ds.dtype == np.dtype(dtype)
    assert [ds.get(i).tolist() for i in range(len(docs))] == docs
    _write(str(tmp_path / "ours"), docs, dtype)  # and our writer produces identical bytes
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"ours{ext}").read_bytes() == (tmp_path / f"ref{ext}").read_bytes()


@pytest.mark.parametrize("code,dtype", [(1, np.uint8), (2, np.int8), (3, np.int16), (4, np.int32), (5, np.int64),
                                        (6, np.float64), (7, np.float32), (8, np.uint16), (9, np.uint32), (10, np.uint64)])
def test_all_dtype_codes(tmp_path, code, dtype):
    tokens = np.array([3, 1, 4, 1, 5], dtype)
    isz = tokens.itemsize
    idx = (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, 2, 3) + struct.pack("<ii", 2, 3)
           + struct.pack("<qq", 0, 2 * isz) + struct.pack("<qqq", 0, 1, 2))
    (tmp_path / "c.idx").write_bytes(idx)
    (tmp_path / "c.bin").write_bytes(tokens.tobytes())
    ds = open_token_file(tmp_path / "c")
    assert ds.dtype == np.dtype(dtype) and ds.get(1).tolist() == [4, 1, 5]


def test_dtype_for_vocab():
    assert dtype_for_vocab(32000) == np.uint16 and dtype_for_vocab(65499) == np.uint16
    assert dtype_for_vocab(65500) == np.int32 and dtype_for_vocab(151643) == np.int32


def test_legacy_pair_and_loss_mask(tmp_path):
    prefix = str(tmp_path / "old")
    np.save(prefix + "_ids.npy", np.array([7, 8, 9, 10, 11, 12], np.uint16))
    np.savez(prefix + "_idx.npz", lens=np.array([2, 1, 3], np.int32), docs=np.array([0, 2, 3], np.int64))
    np.array([1, 0, 1, 1, 0, 1], np.uint8).tofile(prefix + ".lsm")
    ds = open_token_file(prefix)
    assert ds.format == "legacy" and ds.num_documents == 2 and len(ds) == 3
    assert [ds.get(i).tolist() for i in range(3)] == [[7, 8], [9], [10, 11, 12]]
    assert ds.loss_mask.tolist() == [1, 0, 1, 1, 0, 1]
    assert token_prefixes(tmp_path) == [prefix]
    assert strip_prefix(prefix + "_idx.npz") == prefix


def _corrupt(tmp_path, mutate_idx=None, mutate_bin=None):
    prefix = str(tmp_path / "x")
    _write(prefix, [[1, 2, 3], [4, 5]])
    if mutate_idx:
        data = bytearray(open(prefix + ".idx", "rb").read())
        open(prefix + ".idx", "wb").write(mutate_idx(data))
    if mutate_bin:
        data = bytearray(open(prefix + ".bin", "rb").read())
        open(prefix + ".bin", "wb").write(mutate_bin(data))
    return prefix


def _set(data, offset, raw):
    data[offset : offset + len(raw)] = raw
    return bytes(data)


@pytest.mark.parametrize("mutate_idx,mutate_bin,expect", [
    (lambda d: _set(d, 0, b"NOTMAGIC!"), None, "wrong magic"),
    (lambda d: _set(d, 9, struct.pack("<Q", 2)), None, "unsupported version 2"),
    (lambda d: _set(d, 17, b"\x0b"), None, "unknown dtype code 11"),
    (lambda d: bytes(d[:-5]), None, "truncated"),
    (lambda d: bytes(d[:20]), None, "truncated"),
    (None, lambda d: bytes(d[:-2]), "the pair is truncated or mismatched"),
    (lambda d: _set(d, 34 + 8 + 8, struct.pack("<q", 4)), None, "inconsistent pointer at sequence 1"),
    (lambda d: _set(d, 34 + 8 + 16 + 16, struct.pack("<q", 1)), None, "doc_idx runs 0..1 but there are 2 sequences"),
])
def test_validation_errors(tmp_path, mutate_idx, mutate_bin, expect):
    prefix = _corrupt(tmp_path, mutate_idx, mutate_bin)
    with pytest.raises(UserError, match=expect) as e:
        open_token_file(prefix)
    assert "\n" not in str(e.value) and "x." in str(e.value)


def test_zero_documents_and_missing(tmp_path):
    idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 0, 1) + struct.pack("<q", 0)
    (tmp_path / "e.idx").write_bytes(idx)
    (tmp_path / "e.bin").write_bytes(b"")
    with pytest.raises(UserError, match="zero documents"):
        open_token_file(tmp_path / "e")
    with pytest.raises(UserError, match="no token files.*pretrain-cli preprocess"):
        open_token_file(tmp_path / "nothing")


def test_a_directory_where_a_prefix_belongs_names_the_prefixes_inside(tmp_path):
    """A blend's entry (or eval's --data) names token files by prefix; a directory there said "no token files with
    this prefix" of a directory that holds them. input_dir alone takes a directory."""
    from pretrain_cli.data import build_datasets

    idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 1, 2) + struct.pack("<iqqq", 3, 0, 0, 1)
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "a.idx").write_bytes(idx)
    (tmp_path / "web" / "a.bin").write_bytes(struct.pack("<3H", 5, 6, 7))
    assert open_token_file(tmp_path / "web" / "a").num_documents == 1
    blend = f"0.7 {tmp_path / 'web'} 0.3 {tmp_path / 'web' / 'a'}"
    with pytest.raises(UserError) as e:
        build_datasets(blend, "1", 2, 1, need=("train",))
    assert str(e.value) == (f"input_dir: {tmp_path / 'web'}: is a directory, not a token file prefix; name its "
                            f"token files by "
                            f"their prefix ({tmp_path / 'web' / 'a'})")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="empty: is a directory, not a token file prefix; it holds no .bin/.idx pair"):
        open_token_file(tmp_path / "empty")


def test_writer_abort_leaves_no_files(tmp_path):
    prefix = str(tmp_path / "crash")
    with pytest.raises(RuntimeError):
        with IndexedDatasetWriter(prefix) as w:
            w.add_item([1, 2])
            raise RuntimeError("crash")
    assert os.listdir(tmp_path) == []


def test_max_token_id_cached_in_sidecar(tmp_path):
    prefix = str(tmp_path / "s")
    _write(prefix, [[1, 200, 3], [4, 5]])
    (tmp_path / "s.json").write_text(json.dumps({"format": "pretrain-cli-tokens/1", "tokens": 5}))
    assert open_token_file(prefix).max_token_id() == 200
    assert json.loads((tmp_path / "s.json").read_text())["max_token_id"] == 200
    (tmp_path / "s.json").write_text(json.dumps({"format": "pretrain-cli-tokens/1", "tokens": 5, "max_token_id": 7}))
    assert open_token_file(prefix).max_token_id() == 7  # trusts a matching sidecar (no rescan)


def test_min_token_id_is_recorded_and_cached(tmp_path):
    """preprocess and merge-data record the smallest id, and one scan of a sidecar without it is cached, so checking
    a signed file for ids below 0 costs a scan at most once."""
    prefix = str(tmp_path / "s")
    _write(prefix, [[9, 200, 3], [4, 5]], np.int32)
    (tmp_path / "s.json").write_text(json.dumps({"format": "pretrain-cli-tokens/1", "tokens": 5, "max_token_id": 200}))
    assert open_token_file(prefix).min_token_id() == 3
    assert json.loads((tmp_path / "s.json").read_text())["min_token_id"] == 3
    (tmp_path / "s.json").write_text(json.dumps({"format": "pretrain-cli-tokens/1", "tokens": 5, "max_token_id": 200,
                                                 "min_token_id": 1}))
    assert open_token_file(prefix).min_token_id() == 1  # trusts a matching sidecar (no rescan)


@pytest.mark.parametrize("ids,lens,docs,bad,expect", [
    (np.array([1.0, 2.0, 3.0]), np.array([2, 1]), np.array([0, 2]), "_ids.npy", "token array of float64, not integers"),
    (np.array([1, 2, 3]), np.array([4, -1]), np.array([0, 2]), "_idx.npz", "negative length in 'lens' at sequence 1"),
    (np.array([1, 2, 3]), np.array([[2, 1]]), np.array([0, 2]), "_idx.npz", "'lens' is int64 of shape (1, 2), not a 1-D"),
    (np.array([1, 2, 3]), np.array([2.0, 1.0]), np.array([0, 2]), "_idx.npz", "'lens' is float64"),
    (None, np.array([2, 1]), np.array([0, 2]), "_ids.npy", "unreadable legacy token array"),
])
def test_legacy_pair_refuses_what_would_read_as_garbage(tmp_path, ids, lens, docs, bad, expect):
    """Each complaint names the broken file of the pair (a garbage _ids.npy was blamed on the _idx.npz)."""
    prefix = str(tmp_path / "leg")
    if ids is None:
        (tmp_path / "leg_ids.npy").write_bytes(b"not an npy file at all")
    else:
        np.save(prefix + "_ids.npy", ids)
    np.savez(prefix + "_idx.npz", lens=lens, docs=docs)
    with pytest.raises(UserError) as e:
        open_token_file(prefix)
    assert str(e.value).startswith(prefix + bad + ": ") and expect in str(e.value), str(e.value)
