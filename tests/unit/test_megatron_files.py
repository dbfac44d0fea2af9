"""Token files as Megatron-LM's own tools write them (W4's walk): `tools/preprocess_data.py` through
megatron/core/datasets/indexed_dataset.py's `IndexedDatasetBuilder`, re-typed here from that file, with its
sentence-level documents (`--split-sentences`), its empty documents (a document index entry with no sequence) and
its multimodal index (`multimodal=True`: one int8 mode per sequence after the document index,
`tools/preprocess_mmdata.py` writing each image's raw bytes as an int32 sequence of mode 1)."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from pretrain_cli.data.indexed import open_token_file
from pretrain_cli.data.inspect import summarize
from pretrain_cli.errors import UserError

CODES = {np.uint16: 8, np.int32: 4}


class MegatronBuilder:
    """IndexedDatasetBuilder: add_document(ids, lengths, modes), end with finalize (its _IndexWriter)."""

    def __init__(self, prefix: str, dtype=np.uint16, multimodal: bool = False):
        self.prefix, self.dtype, self.multimodal = prefix, dtype, multimodal
        self.data = open(prefix + ".bin", "wb")
        self.sequence_lengths, self.document_indices = [], [0]
        self.sequence_modes = [] if multimodal else None

    def add_document(self, ids, lengths, modes=None):
        self.data.write(np.array(ids, dtype=self.dtype).tobytes(order="C"))
        self.sequence_lengths.extend(lengths)
        self.document_indices.append(len(self.sequence_lengths))
        if self.multimodal:
            self.sequence_modes.extend(modes if modes is not None else [0] * len(lengths))

    def finalize(self):
        self.data.close()
        item = np.dtype(self.dtype).itemsize
        pointers = np.concatenate(([0], np.cumsum(self.sequence_lengths[:-1], dtype=np.int64) * item))
        with open(self.prefix + ".idx", "wb") as f:
            f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", CODES[self.dtype]))
            f.write(struct.pack("<Q", len(self.sequence_lengths)) + struct.pack("<Q", len(self.document_indices)))
            f.write(np.array(self.sequence_lengths, np.int32).tobytes() + pointers.astype(np.int64).tobytes())
            f.write(np.array(self.document_indices, np.int64).tobytes())
            if self.sequence_modes is not None:
                f.write(np.array(self.sequence_modes, np.int8).tobytes())


def _sentences(prefix, dtype=np.uint16, multimodal=False):
    """Three documents of sentences (the last with Megatron's EOD 2 appended to its last sentence), one empty."""
    b = MegatronBuilder(prefix, dtype, multimodal)
    b.add_document([5, 6, 7, 8, 2], [3, 2])
    b.add_document([], [])  # preprocess_data.py's document whose text gave no ids
    b.add_document([9, 10, 11, 2], [1, 3])
    b.finalize()
    return prefix


def test_sentence_level_file_with_an_empty_document_reads_and_counts_it_as_empty(tmp_path):
    ds = open_token_file(_sentences(str(tmp_path / "c_text_sentence")))
    assert (ds.num_documents, len(ds), ds.num_tokens) == (3, 4, 9)
    assert ds.get(1).tolist() == [8, 2] and ds.doc_idx.tolist() == [0, 2, 2, 4]
    info = summarize(ds)
    assert info["doc_length"]["min"] == 0
    # the empty document is its own bucket, not one of length 1 ("1-1" held it)
    assert info["length_histogram"] == {"0": 1, "4-7": 2}


def test_multimodal_index_of_text_only_reads(tmp_path):
    ds = open_token_file(_sentences(str(tmp_path / "t"), multimodal=True))
    assert (ds.num_documents, ds.num_tokens) == (3, 9) and ds.get(3).tolist() == [10, 11, 2]


def test_multimodal_index_with_images_is_refused_naming_the_modes(tmp_path):
    b = MegatronBuilder(str(tmp_path / "mm"), np.int32, multimodal=True)
    image = np.frombuffer(bytes(range(200, 216)), dtype=np.int32)  # preprocess_mmdata.py's raw image bytes
    for _ in range(2):
        b.add_document([5, 6, 2, *image], [3, image.size], [0, 1])
    b.finalize()
    with pytest.raises(UserError) as e:
        open_token_file(tmp_path / "mm")
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'mm'}.idx: a multimodal index") and "\n" not in msg
    assert "2 of 4 sequences are of mode 1" in msg and "sequence 1;" in msg and "preprocess_data.py" in msg


@pytest.mark.parametrize("idx_dtype,bin_dtype,said", [
    (np.uint16, np.int32, "9 tokens of 4 bytes (int32), but the .idx's dtype code 8 says uint16"),
    (np.int32, np.uint16, "9 tokens of 2 bytes (uint16), but the .idx's dtype code 4 says int32"),
])
def test_bin_of_the_other_dtype_is_named_as_such(tmp_path, idx_dtype, bin_dtype, said):
    _sentences(str(tmp_path / "a"), idx_dtype)
    _sentences(str(tmp_path / "b"), bin_dtype)
    (tmp_path / "a.bin").write_bytes((tmp_path / "b.bin").read_bytes())
    with pytest.raises(UserError, match="different writes; put the .bin beside its own .idx") as e:
        open_token_file(tmp_path / "a")
    assert said in str(e.value)


def test_truncated_bin_says_how_short(tmp_path):
    prefix = _sentences(str(tmp_path / "a"))
    data = open(prefix + ".bin", "rb").read()
    open(prefix + ".bin", "wb").write(data[:-6])
    with pytest.raises(UserError, match=r"12 bytes, but the .idx describes 9 uint16 tokens \(18 bytes\), 6 bytes "
                                        "short; the pair is truncated or mismatched"):
        open_token_file(prefix)


def test_a_sentence_level_file_is_split_and_counted_by_sequence(tmp_path):
    """`split` divides the `.idx`'s sequences, as Megatron-core's GPTDataset (numel_low_level_dataset: its
    sequence_lengths) and PaddleNLP do; for a `--split-sentences` file those are sentences, and the `data:` line said
    '20 documents; train 95 docs' of its 100 sentences."""
    from pretrain_cli.data import build_datasets
    from pretrain_cli.data.splits import parse_split

    b = MegatronBuilder(str(tmp_path / "c_text_sentence"))
    rng = np.random.default_rng(0)
    for _ in range(20):  # 20 documents of 5 sentences of 4 tokens, EOD 2 ending the last
        ids = rng.integers(3, 50, size=20).tolist()
        ids[-1] = 2
        b.add_document(ids, [4] * 5)
    b.finalize()
    splits = build_datasets(str(tmp_path / "c_text_sentence"), parse_split("95,5,0"), 8, 1, need=("train", "valid"))
    (line,) = splits.describe()
    assert line.startswith("data: c_text_sentence weight 1.000: 20 documents in 100 sequences (split and shuffled by "
                           "sequence), 400 tokens (uint16); train 95 sequences / 47 samples per epoch; valid 5 "
                           "sequences / 2 samples per epoch"), line
    with pytest.raises(UserError, match=r"leaves the test split empty \(0 of 100 sequences in "):
        build_datasets(str(tmp_path / "c_text_sentence"), parse_split("95,5,0"), 8, 1, need=("train", "test"))


def test_an_unweighted_megatron_blend_says_how_to_weigh_it(tmp_path, monkeypatch):
    """Megatron-core takes `--data-path a b` without weights (each weighed by its samples); input_dir said "weight
    'a' is not a number" of it. The prefixes exist: where no word of the text is a source, the text is a mistyped
    path (test_one_path_with_a_space_is_not_an_unweighted_blend)."""
    from pretrain_cli.data.blend import parse_input_dir

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    _sentences("data/a_text_document")
    _sentences("data/b_text_document")
    with pytest.raises(UserError) as e:
        parse_input_dir("data/a_text_document data/b_text_document")
    assert str(e.value) == ("input_dir: 'data/a_text_document data/b_text_document' names 2 prefixes and no weights "
                            "(Megatron-LM's unweighted --data-path, which weighs each by its size); put a weight "
                            'before each ("1.0 data/a_text_document 1.0 data/b_text_document": equal shares), or name '
                            "a directory holding only them (each weighted by its tokens)")
    with pytest.raises(UserError, match="is not weight/prefix pairs"):
        parse_input_dir("0.3 a b")


def test_a_tntidx_index_is_named(tmp_path):
    """Megatron's (and PaddleNLP's) older IndexedDataset, `--data-impl lazy`/`cached`: its .idx starts TNTIDX; the
    line said "wrong magic b'TNTIDX\\x00\\x00\\x01'" without naming the format or how to get the one read here."""
    (tmp_path / "x.idx").write_bytes(b"TNTIDX\x00\x00" + struct.pack("<QQQQQ", 1, 4, 4, 2, 3) + bytes(72))
    (tmp_path / "x.bin").write_bytes(np.arange(1, 6, dtype=np.int32).tobytes())
    with pytest.raises(UserError) as e:
        open_token_file(tmp_path / "x")
    assert str(e.value) == (f"{tmp_path / 'x'}.idx: a TNTIDX index, the older format of Megatron-LM's and PaddleNLP's "
                            "--data-impl lazy and cached, which is not read here; re-create the pair from its "
                            "documents with `pretrain-cli preprocess` (or Megatron's tools/preprocess_data.py, which "
                            "writes MMIDIDX)")


def test_one_path_with_a_space_is_not_an_unweighted_blend(tmp_path):
    """A prefix or directory whose path holds a space (`my corpus/c_text_document`) is one source: 54fdbf04 called it
    Megatron's unweighted blend of 2 prefixes before looking whether the whole text names token files."""
    from pretrain_cli.data.blend import parse_input_dir

    (tmp_path / "my corpus").mkdir()
    prefix = _sentences(str(tmp_path / "my corpus" / "c_text_document"))
    assert parse_input_dir(prefix) == [(1.0, prefix)]
    assert parse_input_dir(prefix + ".bin") == [(1.0, prefix + ".bin")]
    assert parse_input_dir(str(tmp_path / "my corpus")) == [(None, prefix)]
    # not there, nor any word of it: a mistyped path, named whole (it was 'names 2 prefixes and no weights')
    with pytest.raises(UserError) as e:
        parse_input_dir(str(tmp_path / "my corpus" / "other"))
    assert str(e.value) == (f"input_dir: {str(tmp_path / 'my corpus' / 'other')!r} does not exist (no directory, and "
                            "no .idx or _idx.npz token files beside that prefix; a path with a space is read as one "
                            "source), nor does any of its 2 words, as Megatron-LM's unweighted blend would read it: "
                            "check the path")
    # a word that is a source: Megatron's unweighted blend, as before
    word = _sentences(str(tmp_path / "a"))
    with pytest.raises(UserError, match="names 2 prefixes and no weights"):
        parse_input_dir(f"{word} {tmp_path / 'b'}")


def test_an_unweighted_blend_of_shell_text_says_it_is_not_expanded():
    """`input_dir '$(touch pwned)'` lost the note other paths get (data.indexed) when it became '2 prefixes'."""
    from pretrain_cli.data.blend import parse_input_dir

    with pytest.raises(UserError) as e:
        parse_input_dir("$(touch pwned)")
    assert "does not exist" in str(e.value)  # no word of it is a source (was 'names 2 prefixes and no weights')
    assert str(e.value).endswith(" (paths are used as written, not shell-expanded)")
    with pytest.raises(UserError) as e:
        parse_input_dir("data/a data/b")
    assert "shell-expanded" not in str(e.value)


def test_a_sentence_document_beside_an_empty_one_is_counted_by_sequence(tmp_path):
    """One 2-sentence document and one empty one: 2 sequences and 2 documents, yet the sequences are not the
    documents (doc_idx [0, 2, 2]); `unit` compared the counts and said "document"."""
    b = MegatronBuilder(str(tmp_path / "c_text_sentence"))
    b.add_document([5, 6, 7, 2], [2, 2])
    b.add_document([], [])
    b.finalize()
    ds = open_token_file(tmp_path / "c_text_sentence")
    assert (len(ds), ds.num_documents, ds.unit) == (2, 2, "sequence")
    assert open_token_file(_documents(tmp_path / "d")).unit == "document"


def _documents(prefix):
    b = MegatronBuilder(str(prefix))
    b.add_document([5, 6, 2], [3])
    b.add_document([7, 2], [2])
    b.finalize()
    return str(prefix)


def test_unit_is_worked_out_once_at_open(tmp_path, monkeypatch):
    """`unit` was a property comparing the whole doc_idx with np.arange on every read (~0.5 s and 400 MB a read at
    50M documents, read twice per source); it is worked out when the file is opened."""
    docs = open_token_file(_documents(tmp_path / "d"))
    sentences = open_token_file(_sentences(str(tmp_path / "c_text_sentence")))

    def boom(*a, **k):
        raise AssertionError("unit compared the index again")

    monkeypatch.setattr(np, "arange", boom)
    assert (docs.unit, docs.unit, sentences.unit) == ("document", "document", "sequence")
