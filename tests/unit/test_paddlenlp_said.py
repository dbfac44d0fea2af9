"""Where a PaddleNLP user's own files would train something other than PaddleNLP trains with them, the run says so
or reads them as PaddleNLP does (walk W6): a directory's token-count blend against PaddleNLP's weight 1.0 per file,
a `.lsm` loss mask PaddleNLP ignores, DeepSeek-V3's MTP weight (`num_nextn_predict_lambda`, 1.0 there) and
PaddleNLP's `rope_scaling_type` / `alibi` in config.json."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pretrain_cli.config.parser import parse_config
from pretrain_cli.config.resolve import resolve
from pretrain_cli.data import build_datasets
from pretrain_cli.errors import UserError
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.rope_scaling import rope_inv_freq
from pretrain_cli.orchestration.run_spec import RunSpec
from pretrain_cli.run_config import Target
from run_helpers import BASE, model_config
from sample_corpus import corpus


def _directory(tmp_path, docs_a: int, docs_b: int):
    d = tmp_path / "data"
    d.mkdir()
    corpus(d / "big", n_docs=docs_a, seed=1)
    corpus(d / "small", n_docs=docs_b, seed=2)
    return d


def _blend_notes(notes):
    return [n for n in notes if "PaddleNLP's run_pretrain weighs each 1.0" in n]


def test_a_directory_of_unequal_files_says_both_blends_and_the_input_dir_that_trains_as_paddlenlp(tmp_path):
    """PaddleNLP's get_train_data_file gives each file of a directory weight 1.0; here each weighs its tokens. The
    rule is kept (a directory of --num_tasks shards samples as the merged file), and said where the two differ."""
    d = _directory(tmp_path, 300, 60)
    splits = build_datasets(str(d), "1", 8, 0, need=("train",))
    total = sum(s["weight"] for s in splits.sources)
    shares = [s["weight"] / total for s in splits.sources]
    (note,) = _blend_notes(splits.notes)
    assert f"blended by their tokens {shares[0]:.3f}/{shares[1]:.3f} (big/small)" in note
    assert "weighs each 1.0: 0.500/0.500" in note
    assert f'"1.0 {d}/big 1.0 {d}/small"' in note
    # the string it names trains as PaddleNLP: equal shares, and no note
    paddlenlp = build_datasets(f"1.0 {d}/big 1.0 {d}/small", "1", 8, 0, need=("train",))
    assert np.allclose(paddlenlp.train.realized_ratios(10_000), [0.5, 0.5], atol=0.01)
    assert not _blend_notes(paddlenlp.notes)


def test_shards_of_one_corpus_blend_alike_and_say_nothing(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    corpus(d / "part0", n_docs=200, seed=7)
    corpus(d / "part1", n_docs=200, seed=7)  # the same sizes: the token shares are 0.5/0.5
    assert not _blend_notes(build_datasets(str(d), "1", 8, 0, need=("train",)).notes)


def test_a_loss_mask_is_named_with_how_to_train_without_it(tmp_path):
    """PaddleNLP's run_pretrain reads the .lsm but trains on every token; here its 0 bytes leave the loss."""
    prefix, docs = corpus(tmp_path / "masked", n_docs=40)
    plain, _ = corpus(tmp_path / "plain", n_docs=40, seed=3)
    n = sum(len(x) for x in docs)
    (np.arange(n) % 2).astype(np.uint8).tofile(prefix + ".lsm")
    notes = build_datasets(f"1 {prefix} 1 {plain}", "1", 8, 0, need=("train",)).notes
    (note,) = [x for x in notes if ".lsm" in x]
    assert note.startswith(f"input_dir: {prefix}.lsm: a .lsm loss mask") and "ignores .lsm files" in note
    assert "move it aside to train on every token" in note and plain not in note
    assert not [x for x in build_datasets(plain, "1", 8, 0, need=("train",)).notes if ".lsm" in x]


def _resolve(cfg, *keys):
    args = parse_config(None, [*BASE, *keys])
    return args, resolve(args, cfg, Target("cpu", 1, 0, 0, None))


def _model_line(cfg, *keys):
    args, run = _resolve(cfg, *keys)
    spec = RunSpec(args, run, "m", cfg)
    return run, next(line for line in spec.describe() if line.startswith("  model: "))


def test_mtp_weight_reads_paddlenlp_lambda_from_config_json_and_as_an_argument():
    """PaddleNLP's DeepSeek-V3 config weighs the MTP loss by num_nextn_predict_lambda (1.0 by default); config.json's
    was dropped and the argument was an unknown key, so a PaddleNLP model trained at our 0.3 unsaid."""
    cfg = model_config("micro-deepseek-v3")
    pn = dataclasses.replace(cfg, extra={**cfg.extra, "num_nextn_predict_lambda": 1.0})
    run, line = _model_line(pn)
    assert run.moe.mtp_loss_weight == 1.0
    assert line.endswith("; MTP loss weight 1 (config.json's num_nextn_predict_lambda)")
    run, line = _model_line(pn, "--num_nextn_predict_lambda", "0.5")  # the argument wins over config.json
    assert run.moe.mtp_loss_weight == 0.5 and line.endswith("; MTP loss weight 0.5")
    assert "num_nextn_predict_lambda: read as mtp_loss_weight (PaddleNLP's name for it)" in run.notes
    run, line = _model_line(cfg)  # neither set: ours, and PaddleNLP's default named
    assert run.moe.mtp_loss_weight == 0.3
    assert "; MTP loss weight 0.3 (mtp_loss_weight's default" in line and "defaults to 1.0" in line
    with pytest.raises(UserError, match="num_nextn_predict_lambda"):
        _resolve(dataclasses.replace(cfg, extra={"num_nextn_predict_lambda": -1}))


def test_config_json_with_paddlenlp_lambda_and_no_layers_key_is_not_a_typo():
    d = {**model_config("micro-deepseek-v3").to_hf_dict(), "num_nextn_predict_lambda": 1.0}
    del d["num_nextn_predict_layers"]  # (1 by DeepseekV3Config's default; the lambda is no misspelt layers key)
    assert ModelConfig.from_dict(d).extra["num_nextn_predict_lambda"] == 1.0


def _llama(**keys) -> dict:
    return {**model_config("micro-llama").to_hf_dict(), **keys}


def test_paddlenlp_linear_rope_scaling_is_the_hf_rope_scaling():
    """PaddleNLP's LlamaConfig rope_scaling_type linear + rope_scaling_factor 2 trained unscaled here (dropped)."""
    cfg = ModelConfig.from_dict(_llama(rope_scaling_type="linear", rope_scaling_factor=2))
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    hf = ModelConfig.from_dict(_llama(rope_scaling={"rope_type": "linear", "factor": 2.0}))
    assert np.array_equal(rope_inv_freq(cfg), rope_inv_freq(hf))
    assert not np.array_equal(rope_inv_freq(cfg), rope_inv_freq(ModelConfig.from_dict(_llama())))
    again = ModelConfig.from_dict(cfg.to_hf_dict())  # its export carries both, which agree
    assert again.rope_scaling == cfg.rope_scaling
    assert ModelConfig.from_dict(_llama(rope_scaling_type=None, rope_scaling_factor=4.0)).rope_scaling is None


@pytest.mark.parametrize("keys, words", [
    ({"rope_scaling_type": "ntk", "rope_scaling_factor": 2}, "rope_scaling_type ntk is not built here"),
    ({"rope_scaling_type": "dynamic_ntk", "rope_scaling_factor": 2}, "'dynamic_ntk' is not built here"),
    ({"rope_scaling_type": "linear", "rope_scaling_factor": 2, "rope_scaling": {"rope_type": "linear", "factor": 4}},
     "disagree"),
    ({"rope_scaling_type": "linear", "rope_scaling_factor": 0}, "rope_scaling_factor must be a positive number"),
    ({"alibi": True}, "alibi: true (PaddleNLP's ALiBi bias"),
])
def test_paddlenlp_position_keys_not_built_here_are_refused_in_one_line(keys, words):
    with pytest.raises(UserError) as e:
        ModelConfig.from_dict(_llama(**keys), source="m/config.json")
    assert str(e.value).startswith("m/config.json: ") and words in str(e.value) and "\n" not in str(e.value)
    assert ModelConfig.from_dict(_llama(alibi=False)).rope_scaling is None
