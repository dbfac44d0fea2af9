"""Argument file parsing: precedence, types, strictness, the resolution rules, and `check`'s output-dir and input
checks. (The command line's usage errors, did-you-mean and counts: test_command_line.py.)"""
import json

import pytest

from pretrain_cli.config.keys import KEYS
from pretrain_cli.config.parser import parse_config
from pretrain_cli.errors import UserError
from pretrain_cli.config.parallel import parse_sharding
from pretrain_cli.data.splits import parse_split
from pretrain_cli.config.resolve import resolve
from pretrain_cli.run_config import Target
from run_helpers import model_config, resolve_run

BASE = {"output_dir": "out", "input_dir": "data", "do_train": True, "max_steps": 10}


def write(tmp_path, obj, name="cfg.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(p)


def test_precedence_default_file_command_line(tmp_path):
    cfg = write(tmp_path, {**BASE, "learning_rate": 3e-4, "max_seq_length": 128})
    a = parse_config(cfg, ["--max_seq_length", "64"])
    assert a.training.learning_rate == 3e-4  # file over default
    assert a.data.max_seq_length == 64  # command line over file
    assert a.training.adam_beta2 == 0.999  # default
    assert a.explicit["max_seq_length"] == "command line" and a.explicit["learning_rate"] == "file"


@pytest.mark.parametrize("raw,expected", [(True, True), (False, False), (1, True), (0, False), ("true", True),
                                          ("False", False), ("yes", True), ("n", False), ("1", True)])
def test_bool_forms_in_json(tmp_path, raw, expected):
    a = parse_config(write(tmp_path, {**BASE, "recompute": raw}))
    assert a.training.recompute is expected


def test_bool_forms_on_command_line():
    a = parse_config(None, ["--recompute", "--do_eval", "0", "--no_unified_checkpoint", "--bf16=true"])
    assert a.training.recompute is True and a.training.do_eval is False
    assert a.training.unified_checkpoint is False and a.training.bf16 is True


def test_quoted_numbers_are_accepted_like_paddlenlp(tmp_path):
    a = parse_config(write(tmp_path, {**BASE, "max_steps": "100", "learning_rate": "3e-4", "warmup_steps": "1e1"}))
    assert a.training.max_steps == 100 and a.training.learning_rate == 3e-4 and a.training.warmup_steps == 10


def test_null_is_none_for_an_optional_key_and_refused_for_another(tmp_path):
    a = parse_config(write(tmp_path, {**BASE, "eval_steps": None, "tokenizer_name_or_path": None}))
    assert a.training.eval_steps is None  # optional -> None, never the string "None"
    assert a.model.tokenizer_name_or_path is None
    assert parse_config(None, ["--eval_steps", "null"]).training.eval_steps is None
    # non-optional: refused naming null, not a later "max_steps: must be > 0, got -1" about a value nobody wrote
    with pytest.raises(UserError, match=r"cfg\.json: key `max_steps` expects int, got null; give a value, or leave "
                                        r"the key out for its default \(-1\)"):
        parse_config(write(tmp_path, {**BASE, "max_steps": None}))
    with pytest.raises(UserError, match=r"command line: key `max_seq_length` expects int, got null"):
        parse_config(None, ["--max_seq_length", "null"])


def test_a_key_written_twice_is_refused_naming_it_and_the_file(tmp_path):
    cfg = write(tmp_path, '{"max_steps": 5, "output_dir": "o", "max_steps": 6}')
    with pytest.raises(UserError) as e:
        parse_config(cfg)
    assert e.value.lines == [f"{cfg}: key `max_steps` appears more than once; keep one"]


def test_a_file_starting_with_a_utf8_bom_is_read(tmp_path):
    p = tmp_path / "cfg.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(BASE).encode())
    assert parse_config(str(p)).training.max_steps == 10


def test_lists_and_list_on_command_line(tmp_path):
    a = parse_config(write(tmp_path, {**BASE, "report_to": "visualdl", "no_recompute_layers": [0, 2]}))
    assert a.training.report_to == ["visualdl"] and a.training.no_recompute_layers == [0, 2]
    a = parse_config(None, ["--no_recompute_layers", "1", "3"])
    assert a.training.no_recompute_layers == [1, 3]


def test_unknown_key_suggests_closest(tmp_path):
    """(`max_seq_len`, the example here before, is PaddleFormers' name for max_seq_length now: read as it.)"""
    with pytest.raises(UserError, match=r"unknown key `max_seq_lenght`; did you mean `max_seq_length`\?"):
        parse_config(write(tmp_path, {**BASE, "max_seq_lenght": 5}))


def test_no_prefix_abbreviations():
    """PaddleNLP's argparse takes `--max_seq` for the one key it begins, `max_seq_length`: here it is refused, and
    the suggestion is that key (the nearest by spelling was `max_steps`, another setting altogether)."""
    with pytest.raises(UserError, match=r"unknown key `max_seq`; did you mean `max_seq_length`\?"):
        parse_config(None, ["--max_seq", "5"])


@pytest.mark.parametrize("key,value,fragment", [
    ("max_steps", "ten", "`max_steps` expects int, got 'ten'"),
    ("max_steps", 1.5, "`max_steps` expects int"),
    ("learning_rate", True, "`learning_rate` expects float"),
    ("recompute", "maybe", "`recompute` expects bool"),
    ("max_seq_length", {"a": 1}, "got an object"),
    ("split", [1, 2], "got a list"),
    ("lr_scheduler_type", "polynomial", "must be one of linear, cosine"),
])
def test_wrong_type_names_key_value_and_type(tmp_path, key, value, fragment):
    with pytest.raises(UserError) as e:
        parse_config(write(tmp_path, {**BASE, key: value}))
    assert fragment in str(e.value) and "cfg.json" in str(e.value)


def test_json_syntax_error_has_line_and_column(tmp_path):
    cfg = write(tmp_path, '{\n  "max_steps": 5\n  "seed": 1\n}')
    with pytest.raises(UserError, match=r"cfg\.json:3:3: invalid JSON"):
        parse_config(cfg)


@pytest.mark.parametrize("text,fragment", [("", "is empty"), ("[1, 2]", "must hold a JSON object")])
def test_empty_and_non_object_files(tmp_path, text, fragment):
    with pytest.raises(UserError, match=fragment):
        parse_config(write(tmp_path, text))


def test_missing_file():
    with pytest.raises(UserError, match="argument file not found"):
        parse_config("/nonexistent/cfg.json")


@pytest.mark.parametrize("override,fragment", [
    (["--fp16", "--bf16"], "fp16, bf16: both are true"),
    (["--warmup_ratio", "1.5"], "warmup_ratio: must be in [0, 1]"),
    (["--max_steps", "0"], "max_steps: must be > 0"),
    (["--per_device_train_batch_size", "-1"], "per_device_train_batch_size: must be >= 1"),
    (["--max_seq_length", "99999999999999"], "out of range"),
    (["--split", "100,0,0", "--do_eval"], "gives the valid split a share of 0"),
    (["--sharding", "stage4"], "unknown option 'stage4'"),
    (["--min_learning_rate", "1", "--learning_rate", "0.1"], "min_learning_rate"),
    (["--hang_timeout", "-5"], "hang_timeout: must be a finite number of seconds >= 0 (0: not watched), got -5"),
])
def test_impossible_combinations(override, fragment):
    with pytest.raises(UserError) as e:
        resolve_run(*override)
    assert fragment in str(e.value)


def test_fp16_and_bf16_both_true_say_where_and_a_fix_that_works_from_there(tmp_path):
    """Both typed said "drop --fp16 or --bf16": `f16.json --fp16 true --bf16 true`, --bf16 dropped, kept the file's
    fp16 (no conflict) but --fp16 dropped was refused again; `--KEY false` wins wherever the other came from. Both in
    the file: that file named; any other mix (a PaddleFormers default) named its file, where it said "file"."""
    from dataclasses import replace

    from pretrain_cli.config.compute import resolve_precision
    from pretrain_cli.errors import Problems

    def refused(args) -> list[str]:
        problems = Problems()
        resolve_precision(args, "cpu", Target(), [], problems)
        return problems.items

    f16 = write(tmp_path, {**BASE, "fp16": True}, "f16.json")
    assert refused(parse_config(f16, ["--fp16", "true", "--bf16", "true"])) == [
        "fp16, bf16: both are true (both on the command line); choose one precision: pass --fp16 false or --bf16 "
        "false"]
    assert refused(parse_config(f16, ["--fp16", "false", "--bf16", "true"])) == []  # (the advice, followed)
    both = parse_config(write(tmp_path, {**BASE, "fp16": True, "bf16": True}, "both.json"))
    assert refused(both) == [f"fp16, bf16: both are true (both in {tmp_path / 'both.json'}); choose one precision: "
                             f"set one of them false there"]
    mixed = replace(both, explicit={**both.explicit, "bf16": "PaddleFormers' default"})
    assert refused(mixed) == [f"fp16, bf16: both are true (fp16 from {tmp_path / 'both.json'}, bf16 from "
                              f"PaddleFormers' default); choose one precision: pass --fp16 false or --bf16 false"]


def test_every_problem_is_reported_at_once():
    with pytest.raises(UserError) as e:
        resolve_run("--fp16", "--bf16", "--warmup_ratio", "1.5", "--per_device_train_batch_size", "0")
    text = "\n".join(e.value.lines)
    for fragment in ("fp16, bf16: both are true", "warmup_ratio: must be in [0, 1]",
                     "per_device_train_batch_size: must be >= 1"):
        assert fragment in text
    assert len(e.value.lines) == 3  # a bad input is not reported again through its consequences


def test_resolution_notes_and_values():
    r = resolve_run("--max_steps", "100", "--warmup_steps", "30", "--warmup_ratio", "0.01", "--sharding", "stage2",
                    "--tensor_parallel_degree", "2", "--fp16", "--do_eval", "--logging_steps", "7", "--device", "gpu")
    assert r.schedule.warmup_steps == 30 and r.schedule.decay_steps == 100 and r.loop.eval_steps == 7
    assert r.device == "cpu" and r.precision.amp_dtype is None and r.parallel.sharding_stage == 0
    text = "\n".join(r.notes)
    for fragment in ("warmup_steps=30 wins over warmup_ratio=0.01", "gpu requested but this Paddle has no GPU build",
                     "fp16 is not applicable on cpu", "tensor_parallel_degree=2", "sharding='stage2' has no effect",
                     "evaluating every logging_steps = 7"):
        assert fragment in text
    r = resolve_run("--max_steps", "10", "--warmup_ratio", "0.25", "--device", "gpu", device="gpu")
    assert r.schedule.warmup_steps == 2.5 and r.device == "gpu"  # PaddleNLP's ratio x max_steps, not its ceiling
    r = resolve_run("--max_steps", "3", "--warmup_ratio", "0.5", "--learning_rate", "3e-5", "--min_learning_rate",
                    "3e-6", "--lr_scheduler_type", "linear")
    assert [r.schedule.lr_at(t) for t in (1, 2, 3)] == pytest.approx([2e-5, 2.1e-5, 3e-6])  # PaddleNLP's rates
    assert resolve_run("--max_steps", "10", "--warmup_ratio", "0.25", "--lr_scheduler_type",
                       "warmup_stable_decay").schedule.warmup_steps == 3  # transformers' WSD: the ceiling


def test_hf_trainer_keys_paddlenlp_files_carry_are_accepted_and_said_to_do_nothing():
    r = resolve_run("--max_steps", "10", "--save_strategy", "no", "--logging_strategy", "no", "--run_name", "exp1",
                    "--skip_profile_timer", "false")
    text = "\n".join(r.notes)
    for key in ("save_strategy", "logging_strategy", "run_name", "skip_profile_timer"):
        assert f"{key}: accepted but has no effect here" in text, key
    assert not any("accepted but" in n for n in resolve_run("--max_steps", "10", "--save_strategy", "steps").notes)


def test_an_ignored_key_s_note_reads_as_one_sentence():
    """Each ignored key's note goes on after "here: " in lower case ("... here: every rank reads ..."), not with a
    capital as a new sentence would: only a name keeps its capital (PaddleNLP, DP, HF's; PaddleNLP's other keys'
    reasons name Llama, Megatron and Baidu)."""
    from pretrain_cli.config.paddlenlp_keys import IGNORED

    names = {"Llama", "Megatron's", "Baidu"}

    def plain_capital(reason: str) -> bool:
        word = reason.split()[0]
        return word[0].isupper() and not any(c.isupper() for c in word[1:]) and word not in names

    r = resolve_run("--max_steps", "10", "--distributed_dataloader", "true", "--run_name", "exp1")
    assert "distributed_dataloader: accepted but has no effect here: every rank reads its micro-batches" in "\n".join(
        r.notes)
    keys = [k for k, s in KEYS.items() if s.support == "ignored"]
    assert len(keys) > 20 and [k for k in keys if plain_capital(KEYS[k].help)] == []
    assert [k for k, (_, why) in IGNORED.items() if plain_capital(why)] == []


def test_multi_process_tensor_parallel_must_divide_the_model():
    # micro-qwen2: 4 heads, 2 KV heads, intermediate 128
    assert resolve_run("--tensor_parallel_degree", "2", world=4).parallel.tp_degree == 2
    with pytest.raises(UserError, match="tensor_parallel_degree: 4 does not divide the model's num_key_value_heads"):
        resolve_run("--tensor_parallel_degree", "4", world=4)
    with pytest.raises(UserError, match="does not divide the world size 2"):
        resolve_run("--tensor_parallel_degree", "4", world=2)
    both = resolve_run("--pipeline_parallel_degree", "2", "--tensor_parallel_degree", "2", world=8)
    p = both.parallel  # tp 2 inside 2 stages, dp 2: the pipeline engine; the embedding and head whole per stage
    assert (p.engine, p.tp_degree, p.pp_degree, p.dp_degree, p.vocab_parallel) == ("pipeline", 2, 2, 2, False)
    assert any("stay whole on every tensor-parallel rank" in n for n in both.notes)
    with pytest.raises(UserError, match="tensor_parallel_degree: 4 does not divide the model's num_key_value_heads"):
        resolve_run("--pipeline_parallel_degree", "2", "--tensor_parallel_degree", "4", world=8)


def test_multi_head_latent_attention_takes_the_tp_step_except_under_zero3():
    # MLA's tp is the `tp` step on fleet's groups (alone, with ZeRO-1/2, with ep); with ZeRO-3 the semi-auto engine's
    # placements, which shard the parameters (docs/DISTRIBUTED.md, "Multi-head latent attention ...")
    def layout(*keys, world=4):
        p = resolve_run("--tensor_parallel_degree", "2", *keys, world=world, model="micro-deepseek-v3").parallel
        return p.engine, p.manual_tp, p.sharding_stage

    assert layout(world=2) == ("tensor_parallel", True, 0)
    assert layout("--sharding", "stage2") == ("tensor_parallel", True, 2)
    assert layout("--expert_parallel_degree", "2") == ("tensor_parallel", True, 0)
    assert layout("--sharding", "stage3") == ("semi_auto", False, 3)


def test_split_and_sharding_parsers():
    assert parse_split("949,50,1") == pytest.approx([0.949, 0.05, 0.001])
    assert parse_split("98/2") == pytest.approx([0.98, 0.02, 0.0])
    assert parse_sharding("stage2 offload") == (2, True)
    with pytest.raises(UserError):
        parse_split("a,b")
    with pytest.raises(UserError):
        parse_sharding("stage1 offload")


def test_every_field_is_documented():
    assert len(KEYS) > 90
    for key, spec in KEYS.items():
        assert spec.help, key
        assert spec.support in ("supported", "ignored", "extension"), key


def test_cpu_layout_hint(monkeypatch):
    import pretrain_cli.config.resolve as resolve_mod

    monkeypatch.setattr(resolve_mod.os, "cpu_count", lambda: 4)
    base = ["--output_dir", "o", "--input_dir", "d", "--do_train", "--max_steps", "5"]
    # the fused CPU kernels use every core from one process: no launcher hint (docs/PERFORMANCE.md §3.5)
    assert not any("nproc_per_node" in n for n in resolve_run(base=base).notes)
    # Paddle's single-threaded ops: one process per core is faster, and the note says how
    assert any("--nproc_per_node 4" in n for n in resolve_run("--cpu_fused_ops", "false", base=base).notes)
    assert not any("nproc_per_node" in n for n in resolve_run("--cpu_fused_ops", "false", base=base, world=2).notes)


def test_a_short_first_run_of_a_long_warmup_is_accepted_with_the_warmup_clipped():
    r = resolve_run("--max_steps", "5", "--warmup_steps", "20")
    assert r.schedule.warmup_steps == 5 and r.schedule.decay_steps == 5
    assert r.schedule.lr_at(5) == r.schedule.max_lr
    assert any("warmup_steps=20 is longer than the run (max_steps 5); clipped to 5" in n for n in r.notes)
    with pytest.raises(UserError, match="decay_steps: 4 ends before warmup"):  # an explicit decay_steps still is
        resolve_run("--max_steps", "5", "--warmup_steps", "20", "--decay_steps", "4")


def test_check_output_dir_refuses_a_file_and_a_directory_that_cannot_be_created(tmp_path):
    from pretrain_cli.orchestration.opened import check_output_dir

    f = tmp_path / "notes.md"
    f.write_text("x")
    with pytest.raises(UserError, match="notes.md is a file, not a directory"):
        check_output_dir(str(f))
    with pytest.raises(UserError, match=r"notes.md \(part of .*notes.md/run\) is a file"):
        check_output_dir(str(f / "run"))
    with pytest.raises(UserError, match="output_dir: cannot create /sys/pretrain-cli/run .*choose a directory"):
        check_output_dir("/sys/pretrain-cli/run")  # root passes access() there; mkdir still fails
    assert check_output_dir(str(tmp_path / "a" / "b")) == tmp_path / "a" / "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.md"]  # the probe leaves nothing behind


def test_check_lists_missing_token_files_beside_a_missing_tokenizer(tmp_path, monkeypatch, capsys):
    from pretrain_cli.cli import main

    monkeypatch.chdir(tmp_path)
    cfg = write(tmp_path, {**BASE, "model_name_or_path": "micro-llama", "sample_mode": "padded",
                           "tokenizer_name_or_path": "./tokenizer", "input_dir": "./data", "device": "cpu",
                           "max_seq_length": 64})
    assert main(["check", cfg]) == 2
    err = capsys.readouterr().err
    assert "tokenizer_name_or_path: './tokenizer'" in err and "./data" in err and err.count("error: ") == 2
