"""Megatron-LM's `--eod-mask-loss` and `--reset-attention-mask`, as the unknown-key line answers them (review of
W4's Megatron commits). Megatron-core's GPTDataset sets `loss_mask[tokens == eod] = 0` on the INPUTS: it drops the
prediction of the token after each EOD, and the EOD stays a target. The line said to put a 0 byte of a `.lsm` at each
EOS, which here keeps the EOS itself out as a target (the opposite); the recipe that gives Megatron's mask is a 0
byte at each document's first token, checked here on packed samples."""
from __future__ import annotations

import numpy as np
import pytest

from pretrain_cli.config.parser import parse_config
from pretrain_cli.data.indexed import open_token_file
from pretrain_cli.data.indexed_writer import IndexedDatasetWriter
from pretrain_cli.data.samples import PackedDataset
from pretrain_cli.errors import UserError

EOS = 2


def _said(flag: str) -> str:
    with pytest.raises(UserError) as e:
        parse_config(None, [flag])
    return str(e.value)


def test_eod_mask_loss_names_the_token_after_each_eos():
    said = _said("--eod-mask-loss")
    assert said == ("command line: `eod-mask-loss` is Megatron-LM's argument; no key: the token after each EOS (the "
                    "next document's first) stays a target of the loss, as in PaddleNLP, attention_mask_type document "
                    "too; to leave it out, put a .lsm loss mask beside the .bin with a 0 byte at each document's first "
                    "token (a 0 keeps that token out as a target: docs/DATA.md, Token files)")
    assert "at each EOS" not in said


def test_reset_attention_mask_says_a_sentence_file_resets_per_sentence():
    assert _said("--reset-attention-mask") == (
        "command line: `reset-attention-mask` is Megatron-LM's argument; here set attention_mask_type document (in a "
        "file made with --split-sentences the mask resets at each sentence, not each document)")


@pytest.mark.parametrize("document_mask", [False, True])
def test_the_recipe_masks_what_megatron_masks(tmp_path, document_mask):
    """A `.lsm` 0 at each document's first token: labels are -100 exactly where the input is EOS (Megatron's
    `loss_mask[tokens == eod] = 0`), every EOS is still a target; attention_mask_type document changes no label."""
    rng = np.random.default_rng(3)
    docs = [np.append(rng.integers(3, 90, size=int(rng.integers(2, 9))), EOS) for _ in range(40)]
    prefix = str(tmp_path / "c")
    with IndexedDatasetWriter(prefix, np.uint16) as w:
        w.add_documents(np.concatenate(docs), [len(d) for d in docs])
        w.finalize()
    mask = np.ones(sum(map(len, docs)), np.uint8)
    mask[np.cumsum([0] + [len(d) for d in docs[:-1]])] = 0  # each document's first token
    ds = PackedDataset(open_token_file(prefix), 0, len(docs), 16, 7, "train")
    plain = [ds[i]["labels"] for i in range(len(ds))]
    mask.tofile(prefix + ".lsm")
    ds = PackedDataset(open_token_file(prefix), 0, len(docs), 16, 7, "train")
    ds.document_mask, ds.reset_position_ids = document_mask, True
    for i in range(len(ds)):
        s = ds[i]
        np.testing.assert_array_equal(s["labels"] == -100, s["input_ids"] == EOS)
        kept = s["labels"] != -100
        np.testing.assert_array_equal(s["labels"][kept], plain[i][kept])
        assert (plain[i] == EOS).sum() == (s["labels"] == EOS).sum()  # every EOS still a target
