"""Where `model_name_or_path` / `tokenizer_name_or_path` point: a local directory or a shipped preset.

Nothing is ever downloaded. A hub-style name that is neither a local directory nor a preset
gets an error that says how to place the files locally.
"""
from __future__ import annotations

from pathlib import Path

from pretrain_cli.errors import UserError

PRESET_DIR = Path(__file__).resolve().with_name("presets")

# Hub names that PaddleNLP's shipped argument files use, mapped to our presets.
ALIASES = {
    "qwen/qwen2.5-0.5b": "qwen2.5-0.5b",
    "qwen/qwen3-0.6b": "qwen3-0.6b",
    "qwen/qwen3-0.6b-base": "qwen3-0.6b",  # same architecture as the post-trained model
    "meta-llama/meta-llama-3-8b": "llama-3-8b",
    "meta-llama/llama-3.2-1b": "llama-3.2-1b",
    "__internal_testing__/tiny-random-llama": "tiny-llama",
}


def _literal_hint(name: str) -> str:
    """Paths are used literally; say so when a path looks like it expected a shell to expand it."""
    if name.startswith("~") or "$" in name or "`" in name:
        return " (paths are used as written, not shell-expanded: write the full path)"
    return ""


def _nearest_dir(path: Path) -> str:
    """"; did you mean <sibling>?" for the existing directory whose name is closest to a mistyped one."""
    import difflib

    siblings = sorted(p.name for p in path.parent.iterdir() if p.is_dir())
    close = difflib.get_close_matches(path.name, siblings, n=1, cutoff=0.6)
    return f"; did you mean {path.parent / close[0]}?" if close else f" (in {path.parent}: {', '.join(siblings[:8]) or 'no directories'})"


def preset_names() -> list[str]:
    if not PRESET_DIR.is_dir():
        return []
    return sorted(p.name for p in PRESET_DIR.iterdir() if (p / "config.json").is_file())


def _preset(name: str) -> Path | None:
    key = ALIASES.get(name.lower(), name)
    path = PRESET_DIR / key
    return path if key and "/" not in key and (path / "config.json").is_file() else None


def resolve_model_dir(name: str, key: str = "model_name_or_path") -> Path:
    """A directory holding an HF `config.json`."""
    local = Path(name)  # used as given: never `~`/`$VAR` expanded (a config must not depend on the shell)
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise UserError(f"{key}: {name} has no config.json; point it at an HF-format model directory or a preset "
                            f"({', '.join(preset_names())})")
        return local
    preset = _preset(name)
    if preset is not None:
        return preset
    if local.exists():
        raise UserError(f"{key}: {name} is a file; it must be a model directory with a config.json")
    if "/" in name and local.parent.is_dir():  # a local path with a typo (a hub name's org is no directory here)
        raise UserError(f"{key}: the directory {name} does not exist{_nearest_dir(local)}")
    raise UserError(
        f"{key}: {name!r} is neither a local directory nor a preset ({', '.join(preset_names())}){_literal_hint(name)}; nothing is "
        f"downloaded: fetch the model yourself (e.g. `huggingface-cli download {name} --local-dir ./models/x`) "
        f"and set {key} to that directory"
    )


def has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer.json").is_file() or ((path / "vocab.json").is_file() and (path / "merges.txt").is_file())


def resolve_tokenizer_dir(name: str | None, model_name: str, key: str = "tokenizer_name_or_path") -> Path | None:
    """The tokenizer directory, or None when the source (e.g. a preset) ships no tokenizer files."""
    if name is None:
        path = resolve_model_dir(model_name, "model_name_or_path")
        return path if has_tokenizer(path) else None
    local = Path(name)
    if local.is_dir():
        if not has_tokenizer(local):
            raise UserError(f"{key}: {name} holds no tokenizer.json (or vocab.json + merges.txt); "
                            f"train one with `pretrain-cli train-tokenizer`")
        return local
    preset = _preset(name)
    if preset is not None:
        return preset if has_tokenizer(preset) else None
    raise UserError(f"{key}: {name!r} is neither a local tokenizer directory nor a preset{_literal_hint(name)}; nothing is downloaded: "
                    f"place the tokenizer files in a directory or train one with `pretrain-cli train-tokenizer`")
