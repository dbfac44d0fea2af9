"""Where `model_name_or_path` / `tokenizer_name_or_path` point: a local directory or a shipped preset.

Nothing is ever downloaded. A hub-style name that is neither a local directory nor a preset
gets an error that says how to place the files locally (unless it names a family no download would make
trainable here, `UNBUILT`); so does `continue_training` with a preset, which is architecture only
(`require_pretrained`).
"""
from __future__ import annotations

from pathlib import Path

from pretrain_cli.errors import UserError
from pretrain_cli.models.families import MODEL_TYPES

PRESET_DIR = Path(__file__).resolve().with_name("presets")

# Hub names as published (matched case-insensitively), mapped to our presets. Each preset's config.json is the
# published base model's (docs/MODELS.md says which values were confirmed and where).
HUB_NAMES = {
    "qwen2-0.5b": ("Qwen/Qwen2-0.5B",),
    "qwen2-1.5b": ("Qwen/Qwen2-1.5B",),
    "qwen2-7b": ("Qwen/Qwen2-7B",),
    "qwen2-72b": ("Qwen/Qwen2-72B",),
    "qwen2.5-0.5b": ("Qwen/Qwen2.5-0.5B",),
    "qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B",),
    "qwen2.5-3b": ("Qwen/Qwen2.5-3B",),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B",),
    "qwen2.5-14b": ("Qwen/Qwen2.5-14B",),
    "qwen2.5-32b": ("Qwen/Qwen2.5-32B",),
    "qwen2.5-72b": ("Qwen/Qwen2.5-72B",),
    "qwen3-0.6b": ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B-Base"),  # same architecture as the post-trained model
    "qwen3-1.7b": ("Qwen/Qwen3-1.7B", "Qwen/Qwen3-1.7B-Base"),
    "qwen3-4b": ("Qwen/Qwen3-4B", "Qwen/Qwen3-4B-Base"),
    "qwen3-8b": ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B-Base"),
    "qwen3-14b": ("Qwen/Qwen3-14B", "Qwen/Qwen3-14B-Base"),
    "qwen3-32b": ("Qwen/Qwen3-32B",),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Base"),
    "qwen3-235b-a22b": ("Qwen/Qwen3-235B-A22B",),
    "qwen2-57b-a14b": ("Qwen/Qwen2-57B-A14B",),
    "qwen1.5-moe-a2.7b": ("Qwen/Qwen1.5-MoE-A2.7B",),
    # DeepSeek-R1 has DeepSeek-V3's architecture and config.json (its own weights)
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-Base", "deepseek-ai/DeepSeek-R1"),
    "deepseek-v2-lite": ("deepseek-ai/DeepSeek-V2-Lite",),
    "moonlight-16b-a3b": ("moonshotai/Moonlight-16B-A3B",),
    # the chat models' config.json is the base models' (PaddleNLP's llm/llama files name them)
    "llama-2-7b": ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b", "meta-llama/Llama-2-7b-chat-hf",
                   "meta-llama/Llama-2-7b-chat"),
    "llama-2-13b": ("meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b", "meta-llama/Llama-2-13b-chat-hf",
                   "meta-llama/Llama-2-13b-chat"),
    "llama-2-70b": ("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b", "meta-llama/Llama-2-70b-chat-hf",
                   "meta-llama/Llama-2-70b-chat"),
    "llama-3-8b": ("meta-llama/Meta-Llama-3-8B",),
    "llama-3-70b": ("meta-llama/Meta-Llama-3-70B",),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B"),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B"),
    "llama-3.1-405b": ("meta-llama/Llama-3.1-405B", "meta-llama/Meta-Llama-3.1-405B"),
    "llama-3.2-1b": ("meta-llama/Llama-3.2-1B",),
    "llama-3.2-3b": ("meta-llama/Llama-3.2-3B",),
    "tiny-llama": ("__internal_testing__/tiny-random-llama",),
}
ALIASES = {hub.lower(): preset for preset, hubs in HUB_NAMES.items() for hub in hubs}

# The families of PaddleNLP's other llm/config/* folders (their files name these models), which the model code here
# does not build: a name beginning with one of these (lower case) is refused as that family, not answered with a
# download command whose config.json `models.config` would then refuse. name prefix -> family
UNBUILT = {
    "mistralai/mixtral": "Mixtral", "mistralai/mistral": "Mistral", "baichuan-inc/": "Baichuan",
    "thudm/chatglm": "ChatGLM", "zai-org/chatglm": "ChatGLM", "ieityuan/yuan": "Yuan",
    "gpt2": "GPT", "gpt3": "GPT", "openai-community/gpt2": "GPT",  # HF's gpt2* and PaddleNLP's gpt2-*-en, gpt3-*
    "google/gemma": "Gemma", "bigscience/bloom": "BLOOM", "facebook/opt": "OPT",
}


LIST_HINT = "`pretrain-cli check --list-models` lists them"


def _literal_hint(name: str) -> str:
    """Paths are used literally; say so when a path looks like it expected a shell to expand it."""
    if name.startswith("~") or "$" in name or "`" in name:
        return " (paths are used as written, not shell-expanded: write the full path)"
    return ""


def _plainly_a_path(name: str) -> bool:
    """A name no hub repository has (`org/name`, one separator): `./x`, `../x`, an absolute path, a backslash, or
    more than one separator (as in a/b/c)."""
    return name.startswith(("./", "../", "/", "~")) or "\\" in name or name.count("/") > 1 or name in (".", "..")


def _nearest_dir(path: Path) -> str:
    """"; did you mean <sibling>?" for the existing directory whose name is closest to a mistyped one."""
    import difflib

    siblings = sorted(p.name for p in path.parent.iterdir() if p.is_dir())
    close = difflib.get_close_matches(path.name, siblings, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {path.parent / close[0]}?"
    return f" (in {path.parent}: {', '.join(siblings[:8]) or 'no directories'})"


def _nearest_name(name: str) -> str | None:
    """The preset or hub name closest to a mistyped one (case-insensitive), as unknown keys get one."""
    import difflib

    names = {n.lower(): n for n in preset_names()}
    names.update({hub.lower(): hub for hubs in HUB_NAMES.values() for hub in hubs})
    close = difflib.get_close_matches(name.lower(), list(names), n=1, cutoff=0.75)
    return names[close[0]] if close else None


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
            from pretrain_cli.models.foreign_weights import refuse_unread

            refuse_unread(local, key)  # weights not read come first: a GGUF repository has no config.json
            raise UserError(f"{key}: {name} has no config.json; point it at an HF-format model directory or a preset "
                            f"({LIST_HINT})")
        return local
    preset = _preset(name)
    if preset is not None:
        return preset
    if local.exists():
        raise UserError(f"{key}: {name} is a file; it must be a model directory with a config.json")
    if "/" in name and local.parent.is_dir():  # a local path with a typo (a hub name's org is no directory here)
        raise UserError(f"{key}: the directory {name} does not exist{_nearest_dir(local)}")
    if _plainly_a_path(name):  # no hub repository is named so: never "huggingface-cli download ./configs/x"
        where = "" if local.is_absolute() else f" (a relative path, read from the current directory, {Path.cwd()})"
        fix = "" if local.is_absolute() else ", or give the model directory's absolute path"
        raise UserError(f"{key}: the directory {name} does not exist{where}{_literal_hint(name)}; check the "
                        f"path{fix}")
    unbuilt = next((fam for prefix, fam in UNBUILT.items() if name.lower().startswith(prefix)), None)
    if unbuilt is not None:
        raise UserError(f"{key}: {name!r} is a {unbuilt} model, a family pretrain-cli does not build, downloaded "
                        f"or not: it trains {', '.join(MODEL_TYPES)} (model_type); set {key} to a preset of one "
                        f"({LIST_HINT}) or to a directory holding one")
    close = _nearest_name(name)
    hint = f"; did you mean {close!r}? ({LIST_HINT})" if close else f" ({LIST_HINT})"
    if close and "/" not in name:  # a preset's name mistyped: no hub repository to fetch ("download tiny-qwen")
        raise UserError(f"{key}: {name!r} is neither a local directory nor a preset{hint}{_literal_hint(name)}")
    raise UserError(
        f"{key}: {name!r} is neither a local directory nor a preset{hint}{_literal_hint(name)}; nothing is "
        f"downloaded: fetch the model yourself (e.g. `huggingface-cli download {name} --local-dir ./models/x`) "
        f"and set {key} to that directory"
    )


def is_preset(path: Path) -> bool:
    """Whether `resolve_model_dir` answered with a shipped preset (architecture only, never weights)."""
    return Path(path).resolve().parent == PRESET_DIR


def require_pretrained(name: str, model_dir: Path, key: str = "model_name_or_path", source: str | None = None) -> bool:
    """`continue_training` loads pretrained weights: a preset has none, so say how to fetch them (True: not a
    preset, look for the weights). `source`: where continue_training came from (`Arguments.explicit`), named when
    the file left it out (PaddleFormers' default)."""
    if not is_preset(model_dir):
        return True
    start = "or set continue_training to 0 to start from a random init"
    what = "continue_training" + (f" ({source}: the file leaves it out)" if source and source not in
                                  ("file", "command line") else "")
    if name.lower() in ALIASES:  # a published model: its weights are one download away
        raise UserError(
            f"{key}: {what} loads pretrained weights, but {name!r} is a preset here (architecture only, "
            f"nothing is downloaded): fetch config.json and the *.safetensors with `huggingface-cli download {name} "
            f"--local-dir {name}` where you start training (a local directory wins over the preset), {start}")
    raise UserError(f"{key}: {what} loads pretrained weights, but {name!r} is a shipped preset "
                    f"(architecture only, no weights): point {key} at a directory holding config.json and "
                    f"*.safetensors weights, {start}")


def has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer.json").is_file() or ((path / "vocab.json").is_file() and (path / "merges.txt").is_file())


# sentencepiece models a tokenizer directory may hold instead: transformers' name (Llama 2's tokenizer.model) and
# PaddleNLP's (its LlamaTokenizer saves sentencepiece.bpe.model, a name transformers does not look for)
SENTENCEPIECE = ("tokenizer.model", "sentencepiece.bpe.model")


def sentencepiece_model(path) -> str | None:
    """The name of the sentencepiece model directory `path` holds (`SENTENCEPIECE`, transformers' name first), or
    None: what `no_tokenizer` and the tokenizer line of a run without one (`orchestration.prepare`) name."""
    return next((f for f in SENTENCEPIECE if (Path(path) / f).is_file()), None)


def no_tokenizer(key: str, name: str, local: Path) -> UserError:
    """The line for a directory without the tokenizer files read here. One with a sentencepiece model (Llama 2's,
    PaddleNLP's) gets transformers' conversion, which keeps its ids, where a new tokenizer would not fit the token
    files already made with it."""
    sp = sentencepiece_model(local)
    if sp is None:
        return UserError(f"{key}: {name} holds no tokenizer.json (or vocab.json + merges.txt); "
                         f"train one with `pretrain-cli train-tokenizer`")
    rename = f"rename it {SENTENCEPIECE[0]} (transformers' name), then " if sp != SENTENCEPIECE[0] else ""
    return UserError(f"{key}: {name} holds a sentencepiece model ({sp}) but no tokenizer.json, which is what is read; "
                     f"{rename}write one beside it with transformers (and the sentencepiece package): `python -c "
                     f"\"from transformers import AutoTokenizer as T; T.from_pretrained('{local}').save_pretrained("
                     f"'{local}')\"`")


def resolve_tokenizer_dir(name: str | None, model_name: str, key: str = "tokenizer_name_or_path") -> Path | None:
    """The tokenizer directory, or None when the source (e.g. a preset) ships no tokenizer files."""
    if name is None:
        path = resolve_model_dir(model_name, "model_name_or_path")
        return path if has_tokenizer(path) else None
    local = Path(name)
    if local.is_dir():
        if not has_tokenizer(local):
            raise no_tokenizer(key, name, local)
        return local
    preset = _preset(name)
    if preset is not None and has_tokenizer(preset):
        return preset
    if preset is not None and name.lower() in ALIASES:  # a published tokenizer: as for a published model
        raise UserError(
            f"{key}: {name!r} is not on disk and nothing is downloaded: fetch the tokenizer with `huggingface-cli "
            f"download {name} --include 'tokenizer*' vocab.json merges.txt --local-dir {name}` where you start "
            f"training (a local directory wins), or set {key} to a tokenizer directory")
    if preset is not None:
        raise UserError(f"{key}: {name!r} is a shipped preset, which holds no tokenizer files; set {key} to a "
                        f"tokenizer directory, or train one with `pretrain-cli train-tokenizer`")
    raise UserError(f"{key}: {name!r} is neither a local tokenizer directory nor a preset{_literal_hint(name)}; "
                    f"nothing is downloaded: place the tokenizer files in a directory or train one with "
                    f"`pretrain-cli train-tokenizer`")
