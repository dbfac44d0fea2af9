"""A YAML argument file (`.yaml` / `.yml`: PaddleFormers' `paddleformers-cli train config.yaml`) read to the same flat
mapping of keys as a JSON one, with the JSON file's checks (`parser.load_json`): a key written twice is refused
(PyYAML keeps the last silently), the top level must be a mapping, and a syntax error names the file, line and
column PyYAML gives.

PyYAML is YAML 1.1 through its safe loader, with three changes where YAML 1.1 reads what the user wrote as another
value than they meant, none of which a JSON file (or PaddleNLP's argv) does:
- a date-like scalar (`2024-01-01`) stays the text it is, as JSON would have it, not a `datetime`;
- YAML 1.1's boolean words `yes`/`no`/`on`/`off` are true/false to a bool key and stay the word to a text key:
  `evaluation_strategy: no` (HF's and PaddleNLP's value) read False, refused as "expects string, got False";
- an integer written with a leading zero (`save_steps: 010`: octal, 8) or with colons (`1:30`: base 60, 90) is one
  line asking for the number as meant (or quoted text), where it was taken silently.
Its other readings stand and the key's type check takes them as a JSON value: `3e-5` (no dot) is the string "3e-5",
which a float key reads as PaddleNLP's argv does. This module is imported only when a YAML file is read
(`parser.read_argument_file`): PyYAML stays off every other command's start.
"""
from __future__ import annotations

import re

import yaml

from pretrain_cli.errors import UserError


class _Loader(yaml.SafeLoader):
    """The safe loader (no object is built from a tag), its mappings refusing a repeated key, dates kept as text.
    `path`: the file, for the lines a refusal names (set per load: one loader object reads one file)."""

    path = "<yaml>"

    def construct_mapping(self, node, deep=False):
        self.flatten_mapping(node)
        out = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            where = f"{self.path}:{key_node.start_mark.line + 1}"
            if not isinstance(key, str):
                raise UserError(f"{where}: key {key!r} is not a name; write the argument keys as names (`key: value`)")
            if key in out:
                raise UserError(f"{where}: key `{key}` appears more than once; keep one")
            out[key] = self.construct_object(value_node, deep=deep)
        return out

    def construct_yaml_bool(self, node):
        """`yes`/`no`/`on`/`off` as a `Word` (`read_words` decides per key); `true`/`false` a bool."""
        value = super().construct_yaml_bool(node)
        return Word(node.value, value) if node.value.lower() in WORDS else value

    def construct_yaml_int(self, node):
        """An integer as written; a leading zero (YAML 1.1's octal) or colons (its base 60) refused in one line."""
        text = str(node.value).replace("_", "").lstrip("+-")
        if ":" in text or _OCTAL.match(text):
            raise UserError(f"{self.path}:{node.start_mark.line + 1}: `{node.value}` is read by YAML 1.1 as "
                            f"{super().construct_yaml_int(node)} ({'base 60' if ':' in text else 'octal'}); write "
                            f"the number without {'colons' if ':' in text else 'the leading zero'}, or quote it "
                            f"for text")
        return super().construct_yaml_int(node)


WORDS = ("yes", "no", "on", "off")  # YAML 1.1's booleans that YAML 1.2 (and JSON) leave as text
_OCTAL = re.compile(r"0[0-7]+$")


class Word(str):
    """A YAML 1.1 boolean word as written (`no`), with its truth (`truth`), until `read_words` decides which."""

    def __new__(cls, text: str, truth: bool):
        out = super().__new__(cls, text)
        out.truth = truth
        return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _Loader.construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_scalar)
_Loader.add_constructor("tag:yaml.org,2002:bool", _Loader.construct_yaml_bool)
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def read_words(value, text: bool = False):
    """`value` with each `Word` in it its text where `text` (the value of a text key, and its list's items), else
    its truth (a bool key, an unknown one: YAML 1.1's reading)."""
    if isinstance(value, Word):
        return str(value) if text else value.truth
    if isinstance(value, list):
        return [read_words(v, text) for v in value]
    if isinstance(value, dict):
        return {k: read_words(v) for k, v in value.items()}
    return value


def load_yaml(path: str, text: str, text_keys=frozenset()) -> object:
    """The document in `text` (read from `path`), or one `UserError` naming where it is wrong. `text_keys`: the keys
    whose values are text (`parser.TEXT_KEYS`), which take YAML 1.1's boolean words as written."""
    loader = _Loader(text)
    loader.path = path
    try:
        data = loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        raise UserError(f"{where}: invalid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{path}: invalid YAML: {e}") from None
    except RecursionError:  # ('['*100000 is a flow sequence PyYAML's recursive parser does not reach the end of)
        raise UserError(f"{path}: nested deeper than a YAML reader follows; the argument file is one mapping of "
                        f"keys") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        return read_words(data)
    return {key: read_words(value, key in text_keys) for key, value in data.items()}
