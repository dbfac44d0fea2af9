"""Parameter counts and FLOPs/token against ARCHITECTURE.md facts: Qwen2.5-0.5B, FLOPs per token (no Paddle needed)."""
import sys

import pytest

from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.flops import flops_per_token, paddlenlp_flops_per_token, param_counts
from pretrain_cli.config.presets import PRESET_DIR

QWEN = ModelConfig.from_file(str(PRESET_DIR / "qwen2.5-0.5b"))
LLAMA = ModelConfig.from_file(str(PRESET_DIR / "llama-3-8b"))


def test_qwen25_05b_params():
    c = param_counts(QWEN)
    assert round(c["total"] / 1e6, 1) == 494.0
    assert round(c["embedding"] / 1e6, 1) == 136.1
    assert round(c["non_embedding"] / 1e6, 1) == 357.9


def test_llama3_8b_params():
    c = param_counts(LLAMA)
    assert round(c["total"] / 1e9, 2) == 8.03
    assert round(c["non_embedding"] / 1e9, 2) == 7.50


def test_flops_per_token_palm_form():
    assert flops_per_token(QWEN, 1024) == pytest.approx(3.228e9, rel=5e-4)
    assert flops_per_token(LLAMA, 4096) == pytest.approx(5.147e10, rel=5e-4)
    assert flops_per_token(LLAMA, 8192) == pytest.approx(5.79e10, rel=5e-3)


def test_paddlenlp_formula():
    assert paddlenlp_flops_per_token(QWEN, 1024) == pytest.approx(3.427e9, rel=5e-4)
    assert paddlenlp_flops_per_token(LLAMA, 4096) == pytest.approx(5.630e10, rel=5e-4)


def test_recompute_only_counts_as_hardware_flops():
    model = flops_per_token(QWEN, 1024)
    assert flops_per_token(QWEN, 1024, recompute="full") == model
    full = flops_per_token(QWEN, 1024, recompute="full", hardware=True)
    attn = flops_per_token(QWEN, 1024, recompute="full_attn", hardware=True)
    core = flops_per_token(QWEN, 1024, recompute="core_attn", hardware=True)
    assert model < core < attn < full < model * 4 / 3 + 1
    p = [paddlenlp_flops_per_token(QWEN, 1024, r) for r in (None, "core_attn", "full_attn", "full")]
    assert p == sorted(p)
    with pytest.raises(ValueError):
        flops_per_token(QWEN, 1024, recompute="all")


def test_flops_module_does_not_import_paddle():
    import subprocess

    code = ("import sys; import pretrain_cli.models.flops, pretrain_cli.models; "
            "assert 'paddle' not in sys.modules, 'paddle imported'")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_qwen3_and_llama32_presets_match_their_published_sizes():
    qwen3 = ModelConfig.from_file(str(PRESET_DIR / "qwen3-0.6b"))
    c = param_counts(qwen3)  # Qwen3-0.6B: "0.6B, 0.44B non-embedding", tied
    assert (round(c["total"] / 1e9, 2), round(c["non_embedding"] / 1e9, 2)) == (0.60, 0.44)
    # q_norm and k_norm ([head_dim] each, every layer) are counted
    assert c["total"] - param_counts(ModelConfig(**{**qwen3.__dict__, "model_type": "llama", "extra": {}}))["total"] \
        == 2 * 128 * 28
    llama = ModelConfig.from_file(str(PRESET_DIR / "llama-3.2-1b"))
    assert round(param_counts(llama)["total"] / 1e9, 2) == 1.24  # Llama 3.2 1B: 1.23B, tied
    assert llama.tie_word_embeddings and llama.rope_scaling["rope_type"] == "llama3"


def test_hub_names_resolve_to_the_new_presets():
    from pretrain_cli.config.presets import resolve_model_dir

    assert resolve_model_dir("Qwen/Qwen3-0.6B") == PRESET_DIR / "qwen3-0.6b"
    assert resolve_model_dir("Qwen/Qwen3-0.6B-Base") == PRESET_DIR / "qwen3-0.6b"
    assert resolve_model_dir("meta-llama/Llama-3.2-1B") == PRESET_DIR / "llama-3.2-1b"


def test_models_doc_lists_every_preset_with_its_plan_count():
    from pathlib import Path

    from pretrain_cli.config.presets import HUB_NAMES, preset_names

    doc = (Path(__file__).resolve().parents[2] / "docs" / "MODELS.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(" `"): line for line in doc.splitlines() if line.startswith("| `")}
    for name in preset_names():
        c = param_counts(ModelConfig.from_file(str(PRESET_DIR / name)))
        assert name in rows, f"docs/MODELS.md has no row for preset {name}"
        assert f"| {c['total']:,} | {c['embedding']:,} | {c['non_embedding']:,} |" in rows[name], name
        listed = rows[name].rstrip().removesuffix("|").split("|")[-1].strip()  # hub names, as `check --list-models`
        assert listed == ", ".join(f"`{h}`" for h in HUB_NAMES.get(name, ())), name
