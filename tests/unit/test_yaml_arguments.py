"""A YAML argument file (PaddleFormers' `paddleformers-cli train config.yaml`): the same flat keys as a JSON one, read
to the same arguments with the same checks; each problem one line naming the file (and the line, where PyYAML gives
one). Before, any name but *.json was refused with no hint."""
import json
from pathlib import Path

import pytest

from pretrain_cli.cli import main as cli_main
from pretrain_cli.config.parser import parse_config
from pretrain_cli.errors import UserError

QWEN = Path(__file__).resolve().parents[1] / "e2e" / "paddlenlp_configs" / "qwen_pretrain_argument_0p5b.json"

YAML = """# PaddleFormers-style: flat keys, comments, YAML's scalars
model_name_or_path: micro-qwen2
output_dir: ./out
input_dir: "./data"
do_train: yes                 # YAML 1.1: true
max_steps: 1_000
learning_rate: 3e-5           # no dot: YAML 1.1 reads a string, the float key takes it as PaddleNLP's argv does
min_learning_rate: 3.0e-6
split: 949,50,1
report_to: [none]
sharding: ""
resume_from_checkpoint:       # null
run_name: 2024-01-01          # a date: kept as the text, not a datetime
tensor_model_parallel_size: 1 # PaddleFormers' name, read as ours
"""

SAME_AS_JSON = {"model_name_or_path": "micro-qwen2", "output_dir": "./out", "input_dir": "./data", "do_train": True,
                "max_steps": 1000, "learning_rate": "3e-5", "min_learning_rate": 3.0e-6, "split": "949,50,1",
                "report_to": ["none"], "sharding": "", "resume_from_checkpoint": None, "run_name": "2024-01-01",
                "tensor_model_parallel_size": 1}


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".YAML"])
def test_a_yaml_file_reads_as_the_same_json_file(tmp_path, suffix):
    (tmp_path / f"cfg{suffix}").write_text(YAML)
    (tmp_path / "cfg.json").write_text(json.dumps(SAME_AS_JSON))
    from_yaml = parse_config(str(tmp_path / f"cfg{suffix}"), ["--max_steps", "7"])
    from_json = parse_config(str(tmp_path / "cfg.json"), ["--max_steps", "7"])
    assert from_yaml.to_dict() == from_json.to_dict()
    assert (from_yaml.explicit, from_yaml.extra, from_yaml.aliased) == (from_json.explicit, from_json.extra,
                                                                        from_json.aliased)
    t = from_yaml.training
    assert (t.learning_rate, t.max_steps, t.do_train, t.run_name) == (3e-5, 7, True, "2024-01-01")


@pytest.mark.parametrize("text,fragment", [
    ("max_steps: 5\nseed: 1\nmax_steps: 6\n", "cfg.yaml:3: key `max_steps` appears more than once; keep one"),
    ("max_steps: 5\nseed: [1,\n", "cfg.yaml:3:1: invalid YAML: expected the node content"),
    ("max_steps: 5\n\tseed: 1\n", "cfg.yaml:2:1: invalid YAML: found character '\\t' that cannot start any token"),
    ("- max_steps: 5\n", "cfg.yaml: the argument file must hold a YAML mapping of keys (key: value lines), got list"),
    ("", "cfg.yaml: the argument file is empty; it must hold one YAML mapping of keys"),
    ("# nothing yet\n", "cfg.yaml: the argument file holds no keys"),
    ("max_steps: 5\n---\nseed: 1\n", "cfg.yaml:2:1: invalid YAML: but found another document"),
    ("1: 5\n", "cfg.yaml:1: key 1 is not a name"),
])
def test_a_bad_yaml_file_is_one_line_naming_the_file_and_line(tmp_path, text, fragment):
    (tmp_path / "cfg.yaml").write_text(text)
    with pytest.raises(UserError) as e:
        parse_config(str(tmp_path / "cfg.yaml"))
    assert len(e.value.lines) == 1 and e.value.lines[0].startswith(str(tmp_path / fragment)), e.value.lines


def test_every_unknown_key_and_bad_value_of_a_yaml_file_is_named_at_once(tmp_path):
    (tmp_path / "cfg.yaml").write_text("max_stepz: 5\nseed: many\nevaluation_strategy: epochs\n")
    with pytest.raises(UserError) as e:
        parse_config(str(tmp_path / "cfg.yaml"))
    where = str(tmp_path / "cfg.yaml")
    assert e.value.lines == [f"{where}: unknown key `max_stepz`; did you mean `max_steps`?",
                             f"{where}: key `seed` expects int, got 'many'",
                             f"{where}: key `evaluation_strategy` must be one of no, steps, epoch; got 'epochs'"]


def test_another_name_is_refused_saying_which_names_are_read(tmp_path, capsys):
    (tmp_path / "cfg.toml").write_text("max_steps = 5\n")
    assert cli_main(["check", str(tmp_path / "cfg.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path / 'cfg.toml'}: the argument file must be a .json file (PaddleNLP's) or a "
                   f".yaml/.yml file (PaddleFormers'), one flat mapping of keys; name it for its format"]


def test_plan_fits_a_yaml_file_and_writes_the_fitted_file_in_the_format_o_names(tmp_path, capsys):
    """PaddleNLP's Qwen2.5-0.5B file as YAML: `plan` and `plan --fit` read it as the JSON one; `-o fitted.yaml` is
    YAML (the source's keys in their order, the fitted ones changed), `-o fitted.json` JSON, and both plan alike."""
    import yaml

    from plan_helpers import plan

    source = json.loads(QWEN.read_text())
    (tmp_path / "qwen.yaml").write_text(yaml.safe_dump(source, sort_keys=False))
    at = ["--max_seq_length", "4096", "--device", "V100-16GB", "--gpus", "8"]
    assert cli_main(["plan", str(tmp_path / "qwen.yaml"), *at]) == 0 and "fits" in capsys.readouterr().out
    def planned(path, overrides=()):
        return {k: v for k, v in plan(str(path), list(overrides), device="V100-16GB", gpus=8).items() if k != "config"}

    assert planned(tmp_path / "qwen.yaml", ["--max_seq_length", "4096"]) == planned(QWEN, ["--max_seq_length", "4096"])
    for name in ("fitted.yaml", "fitted.json"):
        assert cli_main(["plan", str(tmp_path / "qwen.yaml"), *at, "--fit", "-o", str(tmp_path / name)]) == 0
        assert f"wrote {tmp_path / name}" in capsys.readouterr().out
    fitted = yaml.safe_load((tmp_path / "fitted.yaml").read_text())
    assert fitted == json.loads((tmp_path / "fitted.json").read_text())
    assert list(fitted)[:len(source)] == list(source) and fitted["output_dir"].endswith("-fitted")
    assert planned(tmp_path / "fitted.yaml") == planned(tmp_path / "fitted.json")
    # the same -o again replaces the fitted YAML file it wrote (read back as a fitted file)
    assert cli_main(["plan", str(tmp_path / "qwen.yaml"), *at, "--fit", "-o", str(tmp_path / "fitted.yaml")]) == 0


def test_plan_fit_puts_a_key_in_the_place_of_the_files_other_name_for_it(tmp_path, capsys):
    """A key the command line sets, written into the fitted file, replaces the file's other name for it (PaddleFormers'
    min_lr for min_learning_rate) where it stood: `plan --fit -o` wrote both names, a file `plan` and `train` refused
    ("`min_lr` and `min_learning_rate` are one key")."""
    import yaml

    source = {("min_lr" if k == "min_learning_rate" else k): v for k, v in json.loads(QWEN.read_text()).items()}
    (tmp_path / "qwen.yaml").write_text(yaml.safe_dump(source, sort_keys=False))
    fitted = tmp_path / "fitted.yaml"
    at = ["--max_seq_length", "4096", "--device", "V100-16GB", "--gpus", "8", "--min_learning_rate", "2e-6"]
    assert cli_main(["plan", str(tmp_path / "qwen.yaml"), *at, "--fit", "-o", str(fitted)]) == 0
    keys = list(yaml.safe_load(fitted.read_text()))
    assert "min_lr" not in keys and keys.index("min_learning_rate") == list(source).index("min_lr")
    assert parse_config(str(fitted)).training.min_learning_rate == 2e-6


def test_yaml_11s_words_no_and_off_are_text_to_a_text_key_and_false_to_a_bool_key(tmp_path):
    """`evaluation_strategy: no` (HF's and PaddleNLP's value, as a YAML file writes it) was YAML 1.1's False: refused as
    "key `evaluation_strategy` expects string, got False", with nothing saying to quote it. A text key now takes the
    word as written; a bool key still reads yes/no/on/off as YAML 1.1 does."""
    (tmp_path / "cfg.yaml").write_text("model_name_or_path: micro-qwen2\nevaluation_strategy: no\nsave_strategy: no\n"
                                       "logging_strategy: 'no'\ndo_eval: off\ndo_train: on\nbf16: yes\nfp16: NO\n")
    args = parse_config(str(tmp_path / "cfg.yaml"))
    t = args.training
    assert (t.evaluation_strategy, t.save_strategy, t.logging_strategy) == ("no", "no", "no")
    assert (t.do_eval, t.do_train, t.bf16, t.fp16) == (False, True, True, False)


@pytest.mark.parametrize("value, read, fix", [("010", "8 (octal)", "without the leading zero"),
                                              ("1:30", "90 (base 60)", "without colons")])
def test_an_integer_yaml_11_reads_as_another_number_is_one_line(tmp_path, value, read, fix):
    """`save_steps: 010` was YAML 1.1's octal 8 (and `1:30` its base-60 90), taken in silence; JSON refuses a leading
    zero and PaddleNLP's argv reads 10."""
    (tmp_path / "cfg.yaml").write_text(f"model_name_or_path: micro-qwen2\nsave_steps: {value}\n")
    with pytest.raises(UserError) as e:
        parse_config(str(tmp_path / "cfg.yaml"))
    assert e.value.lines == [f"{tmp_path / 'cfg.yaml'}:2: `{value}` is read by YAML 1.1 as {read}; write the number "
                             f"{fix}, or quote it for text"]
