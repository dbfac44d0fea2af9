"""A JSON file the user wrote names its mistake and the fix in one line, at the place to edit: the argument file,
a model's config.json and generation_config.json, and generate's prompt .jsonl all say it the same way."""
import argparse
import json

import pytest

from pretrain_cli.commands.generate import _prompts
from pretrain_cli.config.parser import read_argument_file
from pretrain_cli.errors import UserError
from pretrain_cli.json_mistakes import explain
from pretrain_cli.models.config import ModelConfig, read_generation

NUMBERS = "JSON numbers are decimal, with no leading 0, a digit after . and after e (16 for 0x10, 1.0, 1e-5)"
# (file text, where the mistake is, what the line says): the commonest hand-written mistakes
MISTAKES = [
    ('{\n  "max_steps": 10,\n  "output_dir": "out", // where it goes\n  "seed": 1\n}', "3:24",
     "a // comment (JSON has no comments); remove it"),
    ('{\n  "max_steps": 10, # steps\n  "seed": 1\n}', "2:20", "a # comment (JSON has no comments); remove it"),
    ('/* my run */\n{"seed": 1}', "1:1", "a /* */ comment (JSON has no comments); remove it"),
    ('{\n  "max_steps": 10,\n  "seed": 1,\n}', "3:12", "a trailing comma before }; remove it"),
    ('{"split": [949, 50, 1,]}', "1:22", "a trailing comma before ]; remove it"),
    ("{'max_steps': 10}", "1:2", 'a single-quoted string; JSON strings take double quotes ("...")'),
    ('{"output_dir": \'out\'}', "1:16", 'a single-quoted string; JSON strings take double quotes ("...")'),
    ('{max_steps: 10}', "1:2", 'an unquoted key max_steps; JSON keys take double quotes ("max_steps")'),
    ('{"do_train": True}', "1:14", "Python's True; JSON writes true"),
    ('{"do_eval": False}', "1:13", "Python's False; JSON writes false"),
    ('{"resume_from_checkpoint": None}', "1:28", "Python's None; JSON writes null"),
    ('{"bf16": true, "amp_master_grad": yes}', "1:35", 'an unquoted string yes; put it in double quotes ("yes")'),
    ('{\n  "max_steps": 10\n  "seed": 1\n}', "3:3", "a missing comma before this entry; put , after the entry before it"),
    ('{"max_steps": 10,, "seed": 1}', "1:18", "two commas in a row; remove one"),
    ('{"max_steps": , "seed": 1}', "1:15", "a key with no value; give it one"),
    ('{"max_steps" = 10}', "1:14", 'a key not followed by :; write "key": value (not =)'),
    ('{"seed": 1}\n{"max_steps": 10}', "2:1",
     "text after the closing } or ]; a file holds one JSON value: remove it or move it inside"),
    ('{"input_dir": "C:\\data"}', "1:18", "a backslash in a string; write \\\\ for a backslash (in a path, / works too)"),
    ('{"output_dir": "out\n}', "1:20", 'a string not closed on its line; end it with "'),
    ('{"output_dir": "out", "seed": 1', "1:32", "the JSON ends before its closing } or ]; close it"),
    ('{"output_dir": \u201cout\u201d}', "1:16",
     'a curly quote \u201c; JSON strings take straight double quotes ("), retype it'),
    # a number JSON cannot read is not a missing comma (the parser stops inside it, after a digit)
    *[(f'{{"seed": {n}}}', "1:10", f"a number JSON cannot read, {n}; {NUMBERS}")
      for n in ("01", "0x10", "1e", "1e-", "12abc", "1.")],
    ('{"output_dir":"x""seed":2}', "1:18", "a missing comma before this entry; put , after the entry before it"),
    # a number read whole, then the next entry: a missing comma, not a number JSON cannot read
    ('{"lr":3e-4"seed":1}', "1:11", "a missing comma before this entry; put , after the entry before it"),
    ('{"split": [1"x"]}', "1:13", "a missing comma before this entry; put , after the entry before it"),
    *[(t, w, "a missing comma before this entry; put , after the entry before it")
      for t, w in (('{"a":1{"b":2}}', "1:7"), ('{"a":1\'b\':2}', "1:7"), ('{"a":[1[2]]}', "1:8"))],
    ('{"output_dir": "say "hi""}', "1:21", 'a double quote inside a string ends it; write \\" for a quote inside a string'),
    ('{, "seed": 1}', "1:2", "a comma before the first entry; remove it"),
    ('{"split": [,949, 50, 1]}', "1:12", "a comma before the first entry; remove it"),
]


@pytest.mark.parametrize("text,where,said", MISTAKES)
def test_an_argument_file_names_the_mistake_and_its_fix(tmp_path, text, where, said):
    path = tmp_path / "run.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as e:
        read_argument_file(str(path))
    assert str(e.value) == f"{path}:{where}: invalid JSON: {said}"


@pytest.mark.parametrize("text,said", [
    ('"seed": 1}', "1:7: invalid JSON: Extra data"),  # (no opening {: no closing } or ] ends the value read)
    ('{"seed": NaNx}', "1:13: invalid JSON: Expecting ',' delimiter"),  # (not a number, not a missing comma)
    ('[true"x"]', "1:6: invalid JSON: Expecting ',' delimiter"),
])
def test_a_mistake_with_no_better_words_keeps_pythons_and_its_place(text, said):
    with pytest.raises(json.JSONDecodeError) as e:
        json.loads(text)
    assert explain(e.value) == said


def test_a_models_config_json_and_generation_config_say_it_the_same_way(tmp_path):
    (tmp_path / "config.json").write_text('{\n  "model_type": "qwen2",\n  "hidden_size": 64,\n}')
    with pytest.raises(UserError) as e:
        ModelConfig.from_file(str(tmp_path))
    assert str(e.value) == f"{tmp_path / 'config.json'}:3:20: invalid JSON: a trailing comma before }}; remove it"
    (tmp_path / "generation_config.json").write_text('{"do_sample": True}')
    with pytest.raises(UserError) as e:
        read_generation(str(tmp_path))
    assert str(e.value) == (f"{tmp_path / 'generation_config.json'}:1:15: invalid JSON: Python's True; JSON writes "
                            f"true; fix or remove the file")


def test_a_prompt_jsonl_names_the_line_of_the_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "one"}\n\n{\'prompt\': "three"}\n', encoding="utf-8")
    with pytest.raises(UserError) as e:
        _prompts(argparse.Namespace(prompt=None, prompt_file=str(path)))
    assert str(e.value) == (f"{path}:3:2: invalid JSON: a single-quoted string; JSON strings take double quotes "
                            f'("..."); one object per line')


def test_a_model_directory_a_run_names_says_it_in_check(tmp_path, capsys):
    """model_name_or_path's config.json, read by `check` and `train` (`orchestration.opened`), the same way."""
    from pretrain_cli import cli

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{\n  "model_type": "llama", // tiny\n  "hidden_size": 16\n}\n')
    assert cli.main(["check", "--model_name_or_path", str(tmp_path / "m"), "--output_dir", str(tmp_path / "o"),
                     "--do_train", "--max_steps", "1"]) == 2
    assert f"error: {tmp_path / 'm' / 'config.json'}:2:26: invalid JSON: a // comment (JSON has no comments); " \
           f"remove it" in capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("content,said", [
    ('\ufeff{"model_type": "llama"}'.encode(), "1:1: invalid JSON: a byte-order mark at the start; save the file as "
                                               "UTF-8 without BOM"),
    (b'{"model_type": "llama", "name": "caf\xe9"}', " byte 36 is not UTF-8 (invalid continuation byte); save the "
                                                   "file as UTF-8"),
    (b"[" * 100000, " nested deeper than a JSON reader follows; a model config is one object of keys"),
])
def test_a_model_config_json_not_read_as_utf8_json_is_one_line(tmp_path, capsys, content, said):
    """A byte-order mark (which transformers' reader refuses too), Latin-1 text and nesting past Python's recursion
    limit: one line each, where a UnicodeDecodeError or RecursionError traceback ended `check`."""
    from pretrain_cli import cli

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_bytes(content)
    assert cli.main(["check", "--model_name_or_path", str(tmp_path / "m"), "--output_dir", str(tmp_path / "o"),
                     "--do_train", "--max_steps", "1"]) == 2
    assert f"error: {tmp_path / 'm' / 'config.json'}:{said}" in capsys.readouterr().err.splitlines()


def test_a_generation_config_with_a_byte_order_mark_says_it(tmp_path):
    (tmp_path / "generation_config.json").write_bytes('\ufeff{"do_sample": true}'.encode())
    with pytest.raises(UserError) as e:
        read_generation(str(tmp_path))
    assert str(e.value) == (f"{tmp_path / 'generation_config.json'}:1:1: invalid JSON: a byte-order mark at the start; "
                            f"save the file as UTF-8 without BOM; fix or remove the file")


def test_a_prompt_jsonl_line_may_hold_unicode_line_separators(tmp_path):
    """JSON strings may hold U+2028, U+2029 and U+0085 unescaped; only \\n ends a .jsonl line."""
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "one\u2028two"}\r\n{"prompt": "three\x85four\u2029"}\n', encoding="utf-8")
    assert _prompts(argparse.Namespace(prompt=None, prompt_file=str(path))) == [
        (f"{path}:1", "one\u2028two"), (f"{path}:2", "three\x85four\u2029")]


def test_an_argument_file_nested_past_the_recursion_limit_is_one_line(tmp_path):
    path = tmp_path / "run.json"
    path.write_text("[" * 100000)
    with pytest.raises(UserError) as e:
        read_argument_file(str(path))
    assert str(e.value) == f"{path}: nested deeper than a JSON reader follows; the argument file is one object of keys"


@pytest.mark.parametrize("content,said", [
    (b'{"model_type": "llama", "name": "caf\xe9"}', " byte 36 is not UTF-8 (invalid continuation byte); save the "
                                                   "file as UTF-8"),
    (b"[" * 100000, " nested deeper than a JSON reader follows; a model config is one object of keys"),
    (b'["llama"]', " must hold a JSON object"),
])
def test_a_model_directory_read_by_model_config_from_file_says_it_in_one_line(tmp_path, content, said):
    """`ModelConfig.from_file` (eval's and generate's model directory, a checkpoint's config.json) as
    `orchestration.opened` reads model_name_or_path's: a UnicodeDecodeError, RecursionError or TypeError ended
    in a traceback."""
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(UserError) as e:
        ModelConfig.from_file(str(tmp_path))
    assert str(e.value) == f"{tmp_path / 'config.json'}:{said}"


def test_a_generation_config_nested_past_the_recursion_limit_is_one_line(tmp_path):
    (tmp_path / "generation_config.json").write_text("[" * 100000)
    with pytest.raises(UserError) as e:
        read_generation(str(tmp_path))
    assert str(e.value) == f"{tmp_path / 'generation_config.json'}: nested deeper than a JSON reader follows; fix or " \
                           f"remove it"


@pytest.mark.parametrize("name,said", [
    ("prompts.jsonl", ":1: nested deeper than a JSON reader follows; one object per line"),
    ("run.yaml", ": nested deeper than a YAML reader follows; the argument file is one mapping of keys"),
])
def test_a_prompt_file_and_a_yaml_argument_file_nested_past_the_recursion_limit_are_one_line(tmp_path, name, said):
    """The readers of user files the first guards missed: generate's --prompt_file and a YAML argument file ended in
    a RecursionError traceback ('['*100000 is valid JSON, and YAML's flow sequence)."""
    path = tmp_path / name
    path.write_text("[" * 100000 + "\n")
    with pytest.raises(UserError) as e:
        if name.endswith(".jsonl"):
            _prompts(argparse.Namespace(prompt=None, prompt_file=str(path)))
        else:
            read_argument_file(str(path))
    assert str(e.value) == f"{path}{said}"
