"""Flat JSON (or YAML) argument file + `--key value` overrides → the three argument dataclasses.

Precedence: dataclass default < file < command line. A `.yaml`/`.yml` file (PaddleFormers') holds the same flat keys
and meets the same checks (`config.yaml_file`). Unlike PaddleNLP's JSON → argv →
argparse round trip, values are typed directly (each key's type: `config.keys`): JSON `null` means None (never the
string "None") for an optional key and is refused for another, dicts are rejected for scalar keys, a key written twice
is refused (json would keep the last silently), and there are no prefix abbreviations
(`--max_seq 5` is an unknown key with a did-you-mean suggestion, not `max_seq_length=5`).
"""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from pretrain_cli.config.arguments import SECTIONS, DataArguments, ModelArguments
from pretrain_cli.config.keys import KEYS, coerce, type_name
from pretrain_cli.config.megatron_flags import NAMES as MEGATRON_FLAGS
from pretrain_cli.config.megatron_names import megatron_hint
from pretrain_cli.config.paddleformers_keys import PIPELINE, pipeline, take_defaults
from pretrain_cli.config.paddlenlp_keys import ALIASES, IGNORED, attention, check_value, whose
from pretrain_cli.config.training_arguments import TrainingArguments
from pretrain_cli.errors import Problems, UserError
from pretrain_cli.json_mistakes import loads


@dataclass
class Arguments:
    """The parsed run: three sections plus where each value came from."""

    model: ModelArguments
    data: DataArguments
    training: TrainingArguments
    config_path: str | None
    explicit: dict  # key -> "file" | "command line" | "PaddleFormers' default" (`paddleformers_keys.take_defaults`)
    extra: dict = field(default_factory=dict)  # PaddleNLP's keys with no field here (paddlenlp_keys.IGNORED) -> value
    aliased: tuple = ()  # PaddleNLP's and PaddleFormers' other names that were read as ours (paddlenlp_keys.ALIASES)
    rewritten: tuple = ()  # the notes of the args.json record read, PaddleNLP's own rewrites of its keys (`_post_init`)
    # and PaddleFormers' readings (its attention implementation, its data keys, its defaults: `paddleformers_keys`)

    def to_dict(self) -> dict:
        """Flat {key: value}, the same shape as the user's file (written as args.json)."""
        out = {}
        for sec, _ in SECTIONS:
            obj = getattr(self, sec)
            for f in fields(obj):
                out[f.name] = getattr(obj, f.name)
        return out

    def get(self, key: str):
        return getattr(getattr(self, KEYS[key].section), key)

    def set(self, key: str, value) -> None:
        setattr(getattr(self, KEYS[key].section), key, value)


def _unknown(key: str, where: str, options=()) -> UserError:
    """Did-you-mean over the training keys and `options`, the command's own `--options` (`generate --max_new_token`
    means `--max_new_tokens`, not the nearest training key). A key that begins exactly one name is that name's
    abbreviation, which PaddleNLP's argparse would have taken (`--max_seq`: `max_seq_length`, not the nearer
    spelling `max_steps`). Megatron-LM's names, in either spelling, are answered with the key that says them here
    (`config.megatron_names`): their nearest spelling is often another key (`train_iters`: `eval_iters`); its
    other names (`config.megatron_flags`), in either spelling, get no suggestion, for the same reason."""
    own = {o.lstrip("-").replace("-", "_"): o for o in options}
    name = key.replace("-", "_")  # `--micro-batch-size`: the spelling of Megatron's flags
    begun = [k for k in [*own, *KEYS] if k.startswith(name)]
    # Megatron's flags are not typos of ours (`wandb-project` or `wandb_project`: not `do_predict`), so none of its
    # names gets a suggestion; hyphens are its spelling: another hyphenated name gets only a near-exact one
    # (`max-step`: max_steps)
    hyphens = "-" in key
    close = ([] if name in MEGATRON_FLAGS else begun if len(begun) == 1 else
             difflib.get_close_matches(name, [*own, *KEYS], n=1, cutoff=0.85 if hyphens else 0.6))
    if close and close[0] in own:  # eval's `--data-path`: its own --data, before Megatron's meaning
        return UserError(f"{where}: unknown option `--{key}`; did you mean `{own[close[0]]}`?")
    said = megatron_hint(key, own)  # `--data-path`, `--train-iters`: not the nearest spelling (data_cache, eval_iters)
    if said:
        return UserError(f"{where}: {said}")
    if name in _model_keys():  # `num_experts` is the model's, not a key with a near spelling (`no_recompute_layers`)
        return UserError(f"{where}: `{key}` is a key of the model's config.json, not of the argument file; write it "
                         f"in the config.json of a model directory and name that directory as model_name_or_path "
                         f'(docs/MOE.md, "Your own model size")')
    hint = f"; did you mean `{close[0]}`?" if close else "; see docs/COMPATIBILITY.md for the accepted keys"
    return UserError(f"{where}: unknown key `{key}`{hint}")


def _model_keys() -> set[str]:
    """config.json's keys (`ModelConfig`'s, and transformers' other names for the number of experts), which a user
    sizing a model from the command line reaches for first."""
    from pretrain_cli.models.config import ModelConfig

    fixed = {f.name for f in fields(ModelConfig)} - {"extra", "generation"}
    return fixed | {"n_routed_experts", "num_local_experts", "aux_loss_alpha", "seq_aux"}


def _no_repeated_keys(path: str):
    """json's `object_pairs_hook`: a key written twice is refused (json keeps the last one silently, so an edit
    to the first copy would change nothing)."""
    def hook(pairs: list) -> dict:
        out = {}
        for key, value in pairs:
            if key in out:
                raise UserError(f"{path}: key `{key}` appears more than once; keep one")
            out[key] = value
        return out
    return hook


YAML_SUFFIXES = (".yaml", ".yml")
# the keys whose values are text, by any name: a YAML file's `evaluation_strategy: no` is the word (`yaml_file`)
TEXT_KEYS = frozenset(k for k in (*KEYS, *ALIASES) if KEYS[ALIASES.get(k, k)].base is str)
DATA_KEYS = (*PIPELINE, "dataset_type")  # PaddleFormers' data keys: `paddleformers_keys.pipeline` reads them together


def read_argument_file(path: str) -> dict:
    """The user's argument file as {key: value}, by its name: JSON (PaddleNLP's `.json`), or YAML (PaddleFormers'
    `.yaml`/`.yml`, the same flat keys), each with the same checks; any other name is refused before it is read."""
    suffix = Path(path).suffix.lower()
    if suffix in YAML_SUFFIXES:
        return load_yaml_file(path)
    if suffix != ".json":
        raise UserError(f"{path}: the argument file must be a .json file (PaddleNLP's) or a .yaml/.yml file "
                        f"(PaddleFormers'), one flat mapping of keys; name it for its format")
    return load_json(path)


def _read_text(path: str, kind: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{path}: argument file not found")
    try:
        text = p.read_text(encoding="utf-8-sig")  # a BOM (Windows editors write one) is not part of the JSON
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read the argument file ({e})") from None
    if not text.strip():
        raise UserError(f"{path}: the argument file is empty; it must hold one {kind} of keys")
    return text


def load_json(path: str) -> dict:
    text = _read_text(path, "JSON object")
    obj = loads(text, path, "the argument file is one object of keys", object_pairs_hook=_no_repeated_keys(path))
    if not isinstance(obj, dict):
        raise UserError(f"{path}: the argument file must hold a JSON object {{\"key\": value, ...}}, got "
                        f"{type(obj).__name__}")
    return obj


def load_yaml_file(path: str) -> dict:
    from pretrain_cli.config.yaml_file import load_yaml

    obj = load_yaml(path, _read_text(path, "YAML mapping"), TEXT_KEYS)
    if obj is None:  # comments only
        raise UserError(f"{path}: the argument file holds no keys; it must hold one YAML mapping of keys (key: value)")
    if not isinstance(obj, dict):
        raise UserError(f"{path}: the argument file must hold a YAML mapping of keys (key: value lines), got "
                        f"{type(obj).__name__}")
    return obj


def arguments_of(obj: dict, record: str = "arguments", path: str = "") -> tuple[dict, list]:
    """(keys, notes) of a file: the file itself, or of a run's own record (`args.json`: version, arguments,
    user_arguments, run, notes) its `record`: `arguments`, what the run took (a resume's derived keys in: what `eval`
    and `inspect-data` read it for), or `user_arguments`, what its user set (what `train`, `check` and `plan` start a
    run from, so that a resume on other data ranks keeps the global batch; with a note). A record from before
    `user_arguments` has only `arguments`."""
    if not (isinstance(obj.get("arguments"), dict) and "version" in obj and "run" in obj):
        return obj, []
    took, user = obj["arguments"], obj.get("user_arguments")
    if record == "arguments" or not isinstance(user, dict):
        return took, []
    derived = ", ".join(f"{k} {json.dumps(took[k])}" for k in took if k in user and user[k] != took[k])
    return user, [f"{path}: a run's record: its user_arguments are read (the keys as that run's user set them), not "
                  f"its arguments" + (f" ({derived}: what its resume derived)" if derived else "")]


def split_overrides(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """`--k v`, `--k=v`, `--flag`, `--no_flag`, `--k v1 v2` → [(key, [values])]."""
    out: list[tuple[str, list[str]]] = []
    for tok in tokens:
        if tok.startswith("--") and len(tok) > 2:
            key, eq, val = tok[2:].partition("=")
            out.append((key.replace("-", "_") if key.replace("-", "_") in KEYS else key, [val] if eq else []))
        elif out:
            out[-1][1].append(tok)
        else:
            raise UserError(f"command line: unexpected argument {tok!r}; overrides look like --key value")
    return out


def _negated_flag(key: str, raw: list[str]) -> bool:
    """`--no_<bool key>` with no value: the key set to false."""
    return key.startswith("no_") and key[3:] in KEYS and KEYS[key[3:]].base is bool and not raw


def override_keys(tokens: list[str]) -> list[tuple[str, str]]:
    """(as typed, our name) of each `--key` among `tokens`: another name (`ALIASES`) as ours, `--no_<flag>` as the
    flag; a key of no name of ours (`IGNORED`, an unknown one) as typed."""
    out = []
    for key, raw in split_overrides(tokens):
        ours = key[3:] if _negated_flag(key, raw) else ALIASES.get(key, key)
        out.append((key, ours))
    return out


def check_override_keys(tokens: list[str], options=()) -> None:
    """Refuse an unknown `--key` among a command's overrides before anything runs, suggesting the nearest of the
    training keys and the command's own `options` (cli.py passes them)."""
    for key, raw in split_overrides(tokens):
        if key not in (*KEYS, *IGNORED, *ALIASES, *DATA_KEYS) and not _negated_flag(key, raw):
            raise _unknown(key, "command line", options)


def parse_config(config_path: str | None, overrides: list[str] | None = None, record: str = "arguments") -> Arguments:
    """Parse and type-check; no cross-key validation (see `validate`) and no I/O beyond the file. Every unknown key
    and bad value of the file and the command line is named at once (a PaddleFormers file can hold ten of them), its
    jsonl data keys in one line; a PaddleFormers file's omitted keys take its defaults (`config.paddleformers_keys`).
    `record`: which keys of a run's args.json (`arguments_of`)."""
    values: dict[str, object] = {}
    explicit: dict[str, str] = {}
    extra: dict[str, object] = {}
    aliased: list[str] = []
    problems = Problems()

    def own_name(key: str, where: str, given) -> str:
        """Our name for `key`; two names of one key in one place are refused (which one wins?)."""
        if key not in ALIASES:
            return key
        ours = ALIASES[key]
        other = next((k for k in given if k != key and (k == ours or ALIASES.get(k) == ours)), None)
        if other is not None:
            theirs = "ours" if other == ours else whose(other)
            raise UserError(f"{where}: `{key}` and `{other}` are one key ({whose(key)} name and {theirs}); "
                            f"set only {ours}")
        aliased.append(key)
        return ours

    def from_file(key: str, raw, given) -> None:
        ours = own_name(key, config_path, given)
        if ours not in KEYS:
            raise _unknown(ours, config_path)
        if ALIASES.get(key) == "use_flash_attention":  # PaddleFormers' attention implementations (`ATTENTION`)
            raw, note = attention(key, raw, config_path)
            notes.append(note)
        values[ours] = coerce(KEYS[ours], raw, config_path)
        explicit[ours] = "file"

    given, notes = (arguments_of(read_argument_file(config_path), record, config_path) if config_path is not None
                    else ({}, []))  # notes: which record of a run's args.json, then PaddleFormers' readings
    pairs = split_overrides(overrides or [])
    data = {k: v for k, v in given.items() if k in DATA_KEYS}  # PaddleFormers' data keys: one line together
    data.update((k, " ".join(raw) or True) for k, raw in pairs if k in DATA_KEYS)
    notes += problems.run(pipeline, data, given, config_path if set(data) & set(given) else "command line") or []
    for key, raw in given.items():
        if key in DATA_KEYS:
            continue
        if key in IGNORED:
            extra[key] = raw
            problems.run(check_value, key, raw, config_path)
            continue
        problems.run(from_file, key, raw, given)
    for key, raw in pairs:
        if key not in DATA_KEYS:
            problems.run(_from_command_line, key, raw, pairs, own_name, values, explicit, extra, notes)
    notes += take_defaults(given, values, explicit)
    problems.raise_if_any()
    sections = {}
    for sec, cls in SECTIONS:
        kw = {f.name: values[f.name] for f in fields(cls) if f.name in values}
        sections[sec] = cls(**kw)
    return Arguments(config_path=config_path, explicit=explicit, extra=extra, aliased=tuple(dict.fromkeys(aliased)),
                     rewritten=_post_init(sections["training"]) + tuple(notes), **sections)


def _from_command_line(key: str, raw: list[str], pairs, own_name, values: dict, explicit: dict, extra: dict,
                       notes: list) -> None:
    """One `--key value...` of the command line into `values` (or `extra`, for a key without effect here)."""
    where = "command line"
    if key in IGNORED:
        extra[key] = " ".join(raw) if raw else True
        check_value(key, extra[key], where)
        return
    theirs, key = key, own_name(key, where, [k for k, _ in pairs])
    if ALIASES.get(theirs) == "use_flash_attention" and len(raw) == 1:  # PaddleFormers' values (`ATTENTION`)
        on, note = attention(theirs, raw[0], where)
        raw = [str(on)]
        notes.append(note)
    if key not in KEYS:
        if _negated_flag(key, raw):
            values[key[3:]] = False
            explicit[key[3:]] = where
            return
        raise _unknown(key, where)
    spec = KEYS[key]
    if not raw:
        if spec.base is not bool or spec.is_list:
            raise UserError(f"{where}: --{key} needs a value ({type_name(spec)})")
        value = True
    elif spec.is_list:
        value = coerce(spec, raw, where, from_text=True)
    elif len(raw) > 1:  # Megatron's `--data-path 0.3 a 0.7 b` takes the blend as several; input_dir as one text
        quote = f"; a blend is one value: quote it, --{key} \"{' '.join(raw)}\"" if key == "input_dir" else ""
        raise UserError(f"{where}: --{key} takes one value, got {len(raw)}: {' '.join(raw)}{quote}")
    else:
        value = coerce(spec, raw[0], where, from_text=True)
    values[key] = value
    explicit[key] = where


def _post_init(t: TrainingArguments) -> tuple:
    """PaddleNLP's `TrainingArguments.__post_init__` rewrites one key from another, so its files mean that:
    `evaluation_strategy: steps` or `epoch` turns on `do_eval` ("if self.do_eval is False and
    self.evaluation_strategy != IntervalStrategy.NO: self.do_eval = True")."""
    if t.evaluation_strategy != "no" and not t.do_eval:
        t.do_eval = True
        return (f"evaluation_strategy: {t.evaluation_strategy} turns on do_eval (as in PaddleNLP)",)
    return ()
