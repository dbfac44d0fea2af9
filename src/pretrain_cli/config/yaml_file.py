"""A YAML argument file (`.yaml` / `.yml`: PaddleFormers' `paddleformers-cli train config.yaml`) read to the same flat
mapping of keys as a JSON one, with the JSON file's checks (`parser.load_json`): a key written twice is refused
(PyYAML keeps the last silently), the top level must be a mapping, and a syntax error names the file, line and
column PyYAML gives.

PyYAML is YAML 1.1 through its safe loader, with one change: a date-like scalar (`2024-01-01`) stays the text it is,
as JSON would have it, not a `datetime`. Its other readings stand and the key's type check takes them as a JSON
value: `3e-5` (no dot) is the string "3e-5", which a float key reads as PaddleNLP's argv does; `yes`/`on` are true.
This module is imported only when a YAML file is read (`parser.read_argument_file`): PyYAML stays off every other
command's start.
"""
from __future__ import annotations

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


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _Loader.construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_scalar)


def load_yaml(path: str, text: str) -> object:
    """The document in `text` (read from `path`), or one `UserError` naming where it is wrong."""
    loader = _Loader(text)
    loader.path = path
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        raise UserError(f"{where}: invalid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{path}: invalid YAML: {e}") from None
    finally:
        loader.dispose()
