"""Print the README's model table: every published preset, its parameter count, and what `plan --fit` says it
needs on 8 x A100-80GB when trained with PaddleNLP's own pretraining file for its family.

    .venv/bin/python scripts/model_table.py

Each row is `pretrain-cli plan tests/e2e/paddlenlp_configs/<family>_pretrain_argument.json --model_name_or_path
<preset> --continue_training 0 --fit --device A100-80GB --gpus 8` (Qwen2/2.5/3: the qwen file, Qwen2-7B,
sharding stage2, recompute full, 2 x 4,096 tokens per GPU; Llama: the llama file, Meta-Llama-3-8B, tp 2 + stage2,
1 x 4,096 x acc 16). Nothing is imported from Paddle and nothing is written.
"""
from __future__ import annotations

import json

from pathlib import Path

from pretrain_cli.orchestration.planned import fit_file
from pretrain_cli.config.presets import HUB_NAMES, PRESET_DIR
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.families import family
from pretrain_cli.models.flops import param_counts

FILES = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "paddlenlp_configs"
ORDER = ("qwen2-", "qwen2.5-", "qwen3-", "llama-2-", "llama-3-", "llama-3.1-", "llama-3.2-")


def _size(name: str) -> float:
    return float(name.rsplit("-", 1)[1].rstrip("b"))


def presets() -> list[str]:
    """The dense presets: `plan --fit` of the Mixture-of-Experts ones (Qwen-MoE, DeepSeek) is not in this table."""
    dense = [n for n in HUB_NAMES if not family(ModelConfig.from_file(str(PRESET_DIR / n)).model_type).moe]
    return [n for prefix in ORDER for n in sorted((n for n in dense if n.startswith(prefix)), key=_size)]


def needs(name: str) -> str:
    """What `plan --fit` on 8 x A100-80GB says: the GiB per GPU of the fitted layout, or how many GPUs it takes."""
    cfg = ModelConfig.from_file(str(PRESET_DIR / name))
    family = "llama" if cfg.model_type == "llama" else "qwen"
    config = str(FILES / f"{family}_pretrain_argument.json")
    _, f = fit_file(config, ["--model_name_or_path", name, "--continue_training", "0"], "A100-80GB", 8)
    gib = f"({f['before']['memory_gib']:.1f} GiB/GPU)"
    as_written = max(f["before"]["memory_gib"], f["before"]["startup_gib"]) <= f["device"]["memory_gib"]
    shipped = f"fits as shipped {gib}" if as_written else f"does not fit as shipped {gib}"
    if f["after"] is not None:
        change = ", ".join(f"{k} {json.dumps(new)}" for k, _, new in f["diff"])
        if kept := f["kept"]:  # (`orchestration.planned._kept`: a predicted gain under its threshold)
            faster = ", ".join(f"{k} {json.dumps(new)}" for k, _, new in kept["diff"])
            return (f"{shipped}; kept: {faster} plans only {kept['gain']:.1%} faster"
                    + (f"; with {change} ({f['after']['memory_gib']:.1f} GiB)" if change else ""))
        if not change:
            return f"{shipped}, already the fastest that fits"
        return (f"{shipped}; {'fastest that fits' if as_written else 'fits with'}: {change} "
                f"({f['after']['memory_gib']:.1f} GiB)")
    more = f["more_devices"]
    if more is None:
        return shipped
    layout = ", ".join(f"{k} {json.dumps(v)}" for k, v in more["change"].items())
    return f"{shipped}: {more['gpus']} GPUs with {layout} ({more['memory_gib']:.1f} GiB)"


def rows() -> list[str]:
    out = ["| model | hub name | parameters | on 8 x A100-80GB (`plan --fit`, PaddleNLP's file) |",
           "|---|---|---|---|"]
    for name in presets():
        total = param_counts(ModelConfig.from_file(str(PRESET_DIR / name)))["total"]
        out.append(f"| `{name}` | `{HUB_NAMES[name][0]}` | {total / 1e9:.2f} B | {needs(name)} |")
    return out


if __name__ == "__main__":
    print("\n".join(rows()))
