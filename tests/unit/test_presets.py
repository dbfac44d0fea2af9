"""The shipped presets: every published dense size, its parameter count against the published total, the hub
names that select it, and `check --list-models`.

Published totals as printed by their publishers (docs/MODELS.md cites each): the Qwen2.5 and Qwen3 model cards'
"Number of Parameters", the Qwen2 technical report's Table 1, the Llama 3.2 model card, and for Llama 2 / 3 / 3.1
(whose cards give only the nominal 7B/8B/70B/405B) the size the Hugging Face hub prints from the safetensors
files. A count must be within 0.5 % of the figure, or within half a unit of its last printed digit when the
figure is printed more coarsely than that ("0.6B" covers 0.55–0.65 B).
"""
from decimal import Decimal

import pytest

from pretrain_cli.config.presets import ALIASES, HUB_NAMES, PRESET_DIR, preset_names, resolve_model_dir
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.flops import param_counts

PUBLISHED = {  # preset: total as published, in billions (a string: its printed precision matters)
    "qwen2-0.5b": "0.49", "qwen2-1.5b": "1.54", "qwen2-72b": "72.71",
    "qwen2.5-0.5b": "0.49", "qwen2.5-1.5b": "1.54", "qwen2.5-3b": "3.09", "qwen2.5-7b": "7.61",
    "qwen2.5-14b": "14.7", "qwen2.5-72b": "72.7",
    "qwen3-0.6b": "0.6", "qwen3-1.7b": "1.7", "qwen3-4b": "4.0", "qwen3-8b": "8.2", "qwen3-14b": "14.8",
    "qwen3-32b": "32.8",
    # Mixture-of-Experts: model cards' "Number of Parameters" (Qwen3: 30.5B / 235B; Qwen1.5-MoE-A2.7B: 14.3B) and
    # the Qwen2 technical report's Table 1 (Qwen2-57B-A14B: 57.41B)
    "qwen3-30b-a3b": "30.5", "qwen3-235b-a22b": "235", "qwen2-57b-a14b": "57.41", "qwen1.5-moe-a2.7b": "14.3",
    # DeepSeek: DeepSeek-V3's README_WEIGHTS.md ("Total parameters: 671B", main model without the MTP module), the
    # DeepSeek-V2 paper (V2-Lite: 15.7B), Moonlight's model card ("16B" total)
    "deepseek-v3": "671", "deepseek-v2-lite": "15.7", "moonlight-16b-a3b": "16",
    "llama-2-7b": "6.74", "llama-2-13b": "13.0", "llama-2-70b": "69.0",
    "llama-3-8b": "8.03", "llama-3-70b": "70.6", "llama-3.1-8b": "8.03", "llama-3.1-70b": "70.6",
    "llama-3.1-405b": "406", "llama-3.2-1b": "1.23", "llama-3.2-3b": "3.21",
}
# Published figures that disagree with the published config.json itself (whose arithmetic transformers' own
# count confirms for every preset: tests/parity/test_hf_parity.py). Each is pinned to the config's exact count.
DISAGREE = {
    # Qwen2 report Table 1: "7.07B"; that is the non-embedding count (7,070,619,136). Qwen2.5-7B has the same
    # config.json and its card says 7.61B
    "qwen2-7b": ("7.07", 7_615_616_512),
    # Qwen2.5-32B card: "32.5B" (non-embedding "31.0B"); its config.json gives 32.76B (another project's test
    # fixture asserts the same 32,763,876,352 for this config)
    "qwen2.5-32b": ("32.5", 32_763_876_352),
}
TEST_SIZES = {"llama-171m", "tiny-llama", "tiny-qwen2", "micro-llama", "micro-qwen2", "micro-qwen3-moe",
              "micro-qwen2-moe", "micro-deepseek-v3", "micro-deepseek-v2"}
ACTIVE = {"qwen3-30b-a3b": "3.3", "qwen3-235b-a22b": "22", "qwen2-57b-a14b": "14", "qwen1.5-moe-a2.7b": "2.7",
          "deepseek-v3": "37"}  # DeepSeek-V3's README: 37B activated


def _within(count: int, published: str) -> bool:
    figure = Decimal(published) * 10**9
    last_digit = Decimal(1).scaleb(Decimal(published).as_tuple().exponent) * 10**9
    return abs(Decimal(count) - figure) <= max(figure * Decimal("0.005"), last_digit / 2)


def _count(name: str) -> int:
    return param_counts(ModelConfig.from_file(str(PRESET_DIR / name)))["total"]


def test_every_published_size_is_a_preset():
    families = {"qwen2": ["0.5b", "1.5b", "7b", "72b", "57b-a14b"],  # Qwen2 has no 3B, 14B or 32B
                "qwen2.5": ["0.5b", "1.5b", "3b", "7b", "14b", "32b", "72b"],
                "qwen3": ["0.6b", "1.7b", "4b", "8b", "14b", "32b", "30b-a3b", "235b-a22b"],
                "llama-2": ["7b", "13b", "70b"], "llama-3": ["8b", "70b"], "llama-3.1": ["8b", "70b", "405b"],
                "llama-3.2": ["1b", "3b"], "qwen1.5-moe": ["a2.7b"], "deepseek": ["v3", "v2-lite"],
                "moonlight": ["16b-a3b"]}
    wanted = {f"{family}-{size}" for family, sizes in families.items() for size in sizes}
    assert wanted == set(preset_names()) - TEST_SIZES
    assert wanted == set(PUBLISHED) | set(DISAGREE)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_the_published_total(name):
    assert _within(_count(name), PUBLISHED[name]), (name, _count(name), PUBLISHED[name])


@pytest.mark.parametrize("name", sorted(ACTIVE))
def test_moe_active_parameters_match_the_published_activated_count(name):
    """The "A3B"/"A22B"/"A14B"/"A2.7B" of the name: parameters one token passes through (top-k experts), within
    2 % of the cards' "Number of Activated Parameters" (printed to one or two digits: 3,353,032,704 is "3.3B")."""
    active = param_counts(ModelConfig.from_file(str(PRESET_DIR / name)))["active"]
    assert abs(active / (float(ACTIVE[name]) * 1e9) - 1) < 0.02, (name, active)


def test_the_rule_is_tight_enough_to_catch_a_wrong_config():
    """A wrong intermediate size, a tied head that is not, one layer too many: each leaves the published band."""
    assert _within(7_615_616_512, "7.61") and not _within(7_615_616_512 - 152064 * 3584, "7.61")  # tied by mistake
    assert not _within(_count("qwen2.5-14b") + 3 * 5120 * 256 * 48, "14.7")  # intermediate 14080 instead of 13824
    assert not _within(_count("llama-2-7b") * 33 // 32, "6.74")
    assert _within(596_049_920, "0.6") and not _within(596_049_920, "0.600")


@pytest.mark.parametrize("name", sorted(DISAGREE))
def test_published_figures_that_disagree_with_their_own_config(name):
    published, exact = DISAGREE[name]
    assert _count(name) == exact and not _within(exact, published)


def test_hub_names_as_published_select_their_presets():
    cases = {"Qwen/Qwen2-7B": "qwen2-7b", "Qwen/Qwen2.5-7B": "qwen2.5-7b", "Qwen/Qwen2.5-32B": "qwen2.5-32b",
             "Qwen/Qwen3-8B": "qwen3-8b", "Qwen/Qwen3-4B-Base": "qwen3-4b", "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
             "meta-llama/Meta-Llama-3-8B": "llama-3-8b", "meta-llama/Llama-3.2-3B": "llama-3.2-3b",
             "meta-llama/Llama-2-7b-hf": "llama-2-7b", "meta-llama/Llama-2-7b-chat": "llama-2-7b", "meta-llama/Llama-3.1-405B": "llama-3.1-405b",
             "qwen2.5-72b": "qwen2.5-72b"}
    for hub, preset in cases.items():
        assert resolve_model_dir(hub) == PRESET_DIR / preset, hub
    assert set(HUB_NAMES) <= set(preset_names()) and len(ALIASES) == sum(map(len, HUB_NAMES.values()))


def test_a_mistyped_model_name_gets_a_did_you_mean():
    from pretrain_cli.errors import UserError

    for typo, meant in (("qwen2.5-05b", "qwen2.5-0.5b"), ("tiny-qwen", "tiny-qwen2"),
                        ("Qwen/Qwen2.5-0.5", "Qwen/Qwen2.5-0.5B"), ("meta-llama/Llama-3.1-8", "meta-llama/Llama-3.1-8B")):
        with pytest.raises(UserError, match=f"did you mean '{meant}'"):
            resolve_model_dir(typo)
    with pytest.raises(UserError, match="huggingface-cli download org/unrelated-model"):
        resolve_model_dir("org/unrelated-model")
    # a preset's name mistyped has no hub repository to fetch: it said "`huggingface-cli download tiny-qwen ...`"
    with pytest.raises(UserError) as e:
        resolve_model_dir("tiny-qwen")
    assert "download" not in str(e.value) and str(e.value).endswith("(`pretrain-cli check --list-models` lists them)")


def test_each_family_carries_its_published_architecture_details():
    """The keys a wrong copy would get wrong: RoPE scaling (3.1/3.2 only), tied heads, biases, head_dim, eps."""
    cfg = {name: ModelConfig.from_file(str(PRESET_DIR / name)) for name in preset_names()}
    for name in ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"):
        assert cfg[name].rope_scaling["factor"] == 8.0 and cfg[name].max_position_embeddings == 131072
    assert cfg["llama-3.2-3b"].rope_scaling["factor"] == 32.0 and cfg["llama-3.2-3b"].head_dim == 128
    assert cfg["llama-3-70b"].rope_scaling is None and cfg["llama-2-70b"].rope_theta == 10000.0
    assert [n for n in cfg if cfg[n].tie_word_embeddings and n not in TEST_SIZES] == [
        "llama-3.2-1b", "llama-3.2-3b", "qwen2-0.5b", "qwen2-1.5b", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b",
        "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b"]
    assert all(cfg[n].head_dim == 128 and not cfg[n].attention_bias for n in cfg if n.startswith("qwen3-"))
    assert [n for n in cfg if cfg[n].rms_norm_eps == 1e-5 and n.startswith("qwen")] == [
        "qwen2-72b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b"]


def test_check_list_models_prints_every_preset(capsys):
    from pretrain_cli.cli import main

    assert main(["check", "--list-models"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:-1]}
    assert set(rows) == set(preset_names())
    assert "405.85 B" in rows["llama-3.1-405b"] and "Qwen/Qwen2.5-7B" in rows["qwen2.5-7b"]
    assert "7.62 B" in rows["qwen2-7b"] and "Qwen/Qwen2-7B" in rows["qwen2-7b"]


def test_readme_model_table_is_what_the_script_and_plan_print():
    """README's table is `scripts/model_table.py`'s output (plan --fit on 8 x A100-80GB per preset), row for row."""
    import importlib.util
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("model_table", repo / "scripts" / "model_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    rows = table.rows()
    readme = (repo / "README.md").read_text(encoding="utf-8").splitlines()
    start = readme.index(rows[0])
    sparse = [n for n in HUB_NAMES if ModelConfig.from_file(str(PRESET_DIR / n)).num_experts]
    assert readme[start:start + len(rows)] == rows and len(rows) == 2 + len(HUB_NAMES) - 1 - len(sparse)  # all
    # but tiny-llama and the Mixture-of-Experts presets (`plan --fit` for them is not in the table)
    assert "fits as shipped" in rows[2 + table.presets().index("qwen2-7b")]
    # 135 GiB per GPU as shipped does not fit 80: the row said "fits: as shipped 135.0 GiB/GPU"
    assert "| does not fit as shipped (135.4 GiB/GPU); fits with: tensor_parallel_degree 8" in \
        rows[2 + table.presets().index("qwen3-32b")]
    assert "kept: tensor_parallel_degree 1, gradient_accumulation_steps 8 plans only 1.5% faster |" in \
        rows[2 + table.presets().index("llama-2-7b")]
    assert "does not fit" in rows[2 + table.presets().index("llama-3.1-405b")]


def test_the_deepseek_v2_lite_file_scales_down_to_a_preset_of_its_family():
    """PaddleNLP's llm/config/deepseek-v2/pretrain_argument.json on CPU: every other PaddleNLP file's family has a
    micro preset for a scaled-down run of the file (`--model_name_or_path micro-...`); DeepSeek-V2-Lite's had none,
    and `--num_hidden_layers 2 --vocab_size 512` of its own leaves 668 M parameters (10 GiB to train, `plan --device
    cpu`). The file's pp 8 on one process is a note."""
    from run_helpers import resolve_run

    cfg = ModelConfig.from_file(str(PRESET_DIR / "micro-deepseek-v2"))
    assert (cfg.model_type, cfg.q_lora_rank, cfg.topk_method) == ("deepseek_v2", None, "greedy")  # V2-Lite's kind
    assert param_counts(cfg)["total"] < 200_000
    run = resolve_run("--pipeline_parallel_degree", "8", "--gradient_accumulation_steps", "32", "--recompute",
                      "--max_seq_length", "64", model="micro-deepseek-v2")
    assert run.moe is not None and run.recompute is not None
