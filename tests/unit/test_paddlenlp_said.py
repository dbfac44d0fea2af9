"""Where a PaddleNLP user's own files would train something other than PaddleNLP trains with them, the run says so
or reads them as PaddleNLP does (walk W6): a directory's token-count blend against PaddleNLP's weight 1.0 per file,
a `.lsm` loss mask PaddleNLP ignores, DeepSeek-V3's MTP weight (`num_nextn_predict_lambda`, 1.0 there) and
PaddleNLP's `rope_scaling_type` / `alibi` in config.json."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from pretrain_cli.config.parser import parse_config
from pretrain_cli.config.resolve import resolve
from pretrain_cli.data import build_datasets
from pretrain_cli.errors import UserError
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.rope_scaling import rope_inv_freq
from pretrain_cli.orchestration.resumed import apply_resume
from pretrain_cli.orchestration.run_spec import RunSpec
from pretrain_cli.run_config import Target
from pretrain_cli.storage.checkpoint_dir import CheckpointDir
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


def test_a_bad_lambda_names_the_model_directorys_config_json(tmp_path):
    """The one line named a bare "config.json"; from_dict's lines name <model_dir>/config.json."""
    d = {**model_config("micro-deepseek-v3").to_hf_dict(), "num_nextn_predict_lambda": "high"}
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(UserError) as e:
        _resolve(ModelConfig.from_dict(d), "--model_name_or_path", str(tmp_path))
    assert str(e.value).startswith(f"{tmp_path / 'config.json'}: num_nextn_predict_lambda (the multi-token "
                                   f"prediction loss's weight) must be a finite number >= 0, got 'high'; ")
    assert "\n" not in str(e.value)


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
    # PaddleNLP's NTK base: 10000 x 2^(16/14) for micro-llama's head_dim 16, to the digits rope_theta needs
    ({"rope_scaling_type": "ntk", "rope_scaling_factor": 2}, "ntk is not built here; its rotation is the default "
                                                             "RoPE's with rope_theta 22081.79027 (rope_theta x "),
    # (a large theta to every digit: it was 1.07672e+07)
    ({"rope_scaling_type": "ntk", "rope_scaling_factor": 8, "rope_theta": 1e6}, "rope_theta 10767201.54 ("),
    ({"rope_scaling_type": "yarn", "rope_scaling_factor": 2}, "'yarn' is not one PaddleNLP's LlamaConfig builds"),
    ({"rope_scaling": "linear"}, 'rope_scaling must be an object such as {"rope_type": "linear", "factor": 2.0}, '
                                 'got "linear"'),
    ({"rope_scaling_type": "linear", "rope_scaling": "linear"}, "rope_scaling must be an object"),
    ({"rope_scaling_type": "dynamic_ntk", "rope_scaling_factor": 2, "rope_scaling": {"rope_type": "linear",
                                                                                      "factor": 2}}, "disagree"),
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


def _rope_note(d: dict, tmp_path, *keys, continued=False):
    """build_model_config's notes for a model directory holding `d` (the run's max_seq_length from `keys`)."""
    from pretrain_cli.orchestration.opened import build_model_config

    (tmp_path / "config.json").write_text(json.dumps(d))
    extra = ["--continue_training", "true"] if continued else []
    args = parse_config(None, [*BASE, "--model_name_or_path", str(tmp_path), *extra, *keys])
    _, cfg = build_model_config(args)
    return cfg, [n for n in args.rewritten if "rope_scaling_type" in n]


def test_dynamic_ntk_is_plain_rope_within_max_position_embeddings_and_refused_past_it(tmp_path):
    """PaddleNLP's LlamaDynamicNTKScalingRotaryEmbedding rescales only past max_position_embeddings, which its
    run_pretrain raises to max_seq_length for a new model: that trains as plain RoPE (was refused). Pretrained weights
    keep their range, so a length past it is refused, naming the key that sets it."""
    d = _llama(rope_scaling_type="dynamic_ntk", rope_scaling_factor=2.0)  # max_position_embeddings 256
    cfg, (note,) = _rope_note(d, tmp_path, "--max_seq_length", "512")  # a new model: its range raised to 512
    assert cfg.rope_scaling is None and cfg.max_position_embeddings == 512
    assert np.array_equal(rope_inv_freq(cfg), rope_inv_freq(ModelConfig.from_dict(_llama())))
    assert note == (f"{tmp_path / 'config.json'}: rope_scaling_type dynamic_ntk: PaddleNLP's dynamic NTK rotates as "
                    f"plain RoPE at lengths up to max_position_embeddings 512, and sequences of 512 tokens stay within "
                    f"it, so plain RoPE, which runs here, is the same model (config.json keeps the key)")
    assert cfg.to_hf_dict()["rope_scaling_type"] == "dynamic_ntk"
    with pytest.raises(UserError) as e:
        _rope_note(d, tmp_path, "--max_seq_length", "512", continued=True)
    assert str(e.value).startswith(f"{tmp_path / 'config.json'}: rope_scaling_type dynamic_ntk: sequences of 512 "
                                   f"tokens reach past max_position_embeddings 256, ")
    assert str(e.value).endswith("lower --max_seq_length to at most 256, or remove rope_scaling_type for plain "
                                 "RoPE at every length")


def test_linear_beside_an_hf_llama3_rope_scaling_is_llama3_as_paddlenlp_reads_it(tmp_path):
    """PaddleNLP's _init_rope takes an HF rope_scaling of rope_type llama3 first and ignores rope_scaling_type: the
    pair was refused as disagreeing; it is llama3, said."""
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    cfg, (note,) = _rope_note(_llama(rope_scaling_type="linear", rope_scaling_factor=2.0, rope_scaling=llama3),
                              tmp_path, "--max_seq_length", "64")
    assert cfg.rope_scaling == llama3
    assert np.array_equal(rope_inv_freq(cfg), rope_inv_freq(ModelConfig.from_dict(_llama(rope_scaling=llama3))))
    assert note == (f"{tmp_path / 'config.json'}: rope_scaling_type linear is ignored beside rope_scaling of "
                    f"rope_type llama3, as PaddleNLP's LlamaAttention ignores it (its _init_rope takes llama3 first): "
                    f"positions rotate by llama3 scaling, as in transformers")


def _checkpoint(tmp_path, run, step: int = 4):
    ckpt = tmp_path / f"checkpoint-{step}"
    ckpt.mkdir()
    (ckpt / "args.json").write_text(json.dumps({"run": run.to_dict()}))
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "consumed_samples": 8 * step}))
    return CheckpointDir(ckpt)


def _resumed(cfg, saved, *keys):
    args, run = _resolve(cfg, *keys)
    spec = RunSpec(args, run, "m", cfg, resume=saved.path, unresumed=(args, run, Target("cpu", 1, 0, 0, None)))
    spec.args, spec.run = apply_resume(spec, saved)
    return spec


def test_a_resume_keeps_the_loss_weights_its_checkpoint_trained_with_unless_set(tmp_path):
    """A checkpoint trained at mtp_loss_weight 0.3 (config.json's lambda was not read then) resumed from a config.json
    holding num_nextn_predict_lambda 1.0 trained on at 1.0 unsaid (R14: loss 8.10 -> 12.50); so did a router weight
    config.json gives (aux_loss_alpha) when the file was edited."""
    cfg = model_config("micro-deepseek-v3")
    saved = _checkpoint(tmp_path, _resolve(cfg)[1])
    assert saved.run("moe", "mtp_loss_weight") == 0.3
    pn = dataclasses.replace(cfg, extra={**cfg.extra, "num_nextn_predict_lambda": 1.0, "aux_loss_alpha": 0.01})
    spec = _resumed(pn, saved)
    assert spec.run.moe.mtp_loss_weight == 0.3 and spec.run.moe.aux_loss_coef == saved.run("moe", "aux_loss_coef")
    (note,) = [n for n in spec.run.notes if n.startswith("loss weights: ")]
    assert note == ("loss weights: checkpoint-4's run trained with other ones: mtp_loss_weight 0.3 kept (this run "
                    "would take 1; set mtp_loss_weight to change it); router_aux_loss_coef 0.0001 kept (this run "
                    "would take 0.01; set router_aux_loss_coef to change it)")
    line = next(x for x in spec.describe() if x.startswith("  model: "))
    assert line.endswith("; MTP loss weight 0.3 (kept from checkpoint-4's run)")
    # set by the user: theirs, the change named
    spec = _resumed(pn, saved, "--num_nextn_predict_lambda", "1.0", "--router_z_loss_coef", "0.001")
    assert spec.run.moe.mtp_loss_weight == 1.0 and spec.run.moe.z_loss_coef == 0.001
    (note,) = [n for n in spec.run.notes if n.startswith("loss weights: ")]
    assert "mtp_loss_weight 0.3 -> 1 as set, in effect from the first step resumed" in note
    assert "router_z_loss_coef 0 -> 0.001 as set" in note
    # the same weights: nothing said
    assert not [n for n in _resumed(cfg, saved).run.notes if n.startswith("loss weights: ")]


def test_the_config_json_a_run_writes_says_the_mtp_weight_it_trained_with():
    """Checkpoints and the export kept the model directory's num_nextn_predict_lambda 1.0 while the run trained at
    mtp_loss_weight 0.3: a continue_training from them (or PaddleNLP) then went on at 1.0."""
    from pretrain_cli.models.convert import as_trained

    cfg = model_config("micro-deepseek-v3")
    pn = dataclasses.replace(cfg, extra={**cfg.extra, "num_nextn_predict_lambda": 1.0})
    run = _resolve(pn, "--mtp_loss_weight", "0.3")[1]
    written = as_trained(pn, run.moe.mtp_loss_weight).to_hf_dict()
    assert written["num_nextn_predict_lambda"] == 0.3
    continued = ModelConfig.from_dict(written)
    assert _resolve(continued)[1].moe.mtp_loss_weight == 0.3
    assert "num_nextn_predict_lambda" not in as_trained(cfg, 0.3).to_hf_dict()  # (a config.json without it: none)
