"""A pretrained model trained past its `max_position_embeddings` (`continue_training` at a longer
`max_seq_length`, as PaddleNLP trains it): `train` runs it with one note, the config.json it saves keeps the
pretrained number, and transformers loads that directory and gives our logits on a sequence longer than it.

The yarn case leaves `original_max_position_embeddings` out of rope_scaling: transformers then takes
`max_position_embeddings` as the pretrained length its frequencies are computed from, so the number kept is part of
the model (written as the trained length, transformers would compute other logits)."""
import json

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import torch  # noqa: E402
import transformers  # noqa: E402

from parity_helpers import hf_model, load, token_ids  # noqa: E402

from pretrain_cli.cli import main as cli_main  # noqa: E402
from pretrain_cli.data.indexed_writer import IndexedDatasetWriter  # noqa: E402

PRETRAINED, LONGER = 16, 40  # the model's max_position_embeddings, the run's max_seq_length
COMMON = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=PRETRAINED, rms_norm_eps=1e-6, bos_token_id=1,
              eos_token_id=2, tie_word_embeddings=False)
CASES = {
    "qwen3-default-rope": (transformers.Qwen3Config, dict(head_dim=16),
                           {"rope_type": "default", "rope_theta": 1e4}),
    "llama-yarn-no-original": (transformers.LlamaConfig, dict(head_dim=16),
                               {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
}


def _token_file(prefix, vocab: int) -> str:
    rng = np.random.default_rng(0)
    with IndexedDatasetWriter(str(prefix), dtype=np.uint16) as w:
        for _ in range(24):
            w.add_item(rng.integers(3, vocab, size=100))
            w.end_document()
        w.finalize()
    return str(prefix)


def _logits(hf, ids):
    with torch.no_grad():
        return hf(input_ids=torch.from_numpy(ids)).logits.numpy()


@pytest.mark.parametrize("case", list(CASES))
def test_a_model_trained_past_its_range_loads_in_transformers_at_the_longer_length(case, tmp_path, capsys):
    cls, kw, rope = CASES[case]
    hf_model(cls(**COMMON, **kw, rope_parameters=rope), seed=2).save_pretrained(str(tmp_path / "src"),
                                                                               safe_serialization=True)
    if rope["rope_type"] == "yarn":  # as a config.json of transformers 4 may leave it (transformers 5 writes it)
        conf = json.loads((tmp_path / "src" / "config.json").read_text())
        del conf["rope_parameters"]["original_max_position_embeddings"]
        (tmp_path / "src" / "config.json").write_text(json.dumps(conf))
    args = {"model_name_or_path": str(tmp_path / "src"), "continue_training": 1, "do_train": True, "device": "cpu",
            "input_dir": _token_file(tmp_path / "data", COMMON["vocab_size"]), "split": "100,0,0",
            "output_dir": str(tmp_path / "out"), "max_seq_length": LONGER, "per_device_train_batch_size": 2,
            "max_steps": 2, "learning_rate": 0.01, "warmup_steps": 0, "report_to": ["none"], "seed": 3}
    (tmp_path / "args.json").write_text(json.dumps(args))
    assert cli_main(["train", str(tmp_path / "args.json")]) == 0
    log = capsys.readouterr().out  # (the run's log lines, its notes among them)
    assert (f"max_seq_length: {LONGER} is past the model's max_position_embeddings ({PRETRAINED}): positions "
            f"{PRETRAINED}-{LONGER - 1} take RoPE angles") in log
    assert f"the config.json it saves keeps max_position_embeddings {PRETRAINED}" in log
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["max_position_embeddings"] == PRETRAINED

    ids = token_ids(COMMON["vocab_size"], LONGER, seed=4)[:, :-1]  # [2, LONGER]: past the pretrained range
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), attn_implementation="eager").eval()
    ours, cfg = load(tmp_path / "out", None)
    assert cfg.max_position_embeddings == PRETRAINED
    with paddle.no_grad():
        o_logits = ours(paddle.to_tensor(ids)).numpy()
    h_logits = _logits(hf, ids)
    assert np.abs(o_logits - h_logits).max() <= 1e-4
    src = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "src"), attn_implementation="eager")
    assert np.abs(_logits(src.eval(), ids) - h_logits).max() > 1e-3  # the run trained: not the source's weights
    if rope["rope_type"] == "yarn":  # the kept number is the model: the trained length written would be another
        assert "original_max_position_embeddings" not in saved["rope_scaling"]
        (tmp_path / "out" / "config.json").write_text(json.dumps({**saved, "max_position_embeddings": LONGER}))
        other = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"),
                                                                  attn_implementation="eager").eval()
        assert np.abs(_logits(other, ids) - h_logits).max() > 1e-3
