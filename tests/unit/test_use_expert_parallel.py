"""PaddleNLP's `use_expert_parallel: true` without `expert_parallel_degree`: PaddleNLP's MoELayer (moe_group "data")
spreads the experts over the data-parallel group, expert parallelism of the dp degree. Here it was a note that the key
has no effect ('expert_parallel_degree > 1 turns expert parallelism on') and the run held every expert on every rank.
Now the experts are spread over the dp ranks where the layout runs that, with one note saying so; else one note says
what PaddleNLP does, why it does not run here and what key to set."""
from run_helpers import resolve_run

MOE = dict(model="micro-qwen3-moe")  # 8 experts


def _run(*argv, world=2):
    r = resolve_run("--use_expert_parallel", "true", "--max_seq_length", "64", *argv, world=world, **MOE)
    return r.parallel, [n for n in r.notes if n.startswith("use_expert_parallel:")]


def test_the_experts_are_spread_over_the_data_parallel_ranks_as_paddlenlp_spreads_them():
    par, notes = _run()
    assert par.ep_degree == 2
    assert notes == ["use_expert_parallel: true: the experts are spread over the 2 data-parallel ranks "
                     "(expert_parallel_degree 2), as PaddleNLP's MoELayer spreads them over its data-parallel group "
                     "(its default moe_group 'data'); a stated expert_parallel_degree decides, as it sizes "
                     "PaddleNLP's DeepseekV2MoE expert group"]
    par, _ = _run("--tensor_parallel_degree", "2", world=8)  # 4 data ranks of each tp position
    assert (par.tp_degree, par.ep_degree) == (2, 4)


def test_where_the_layout_does_not_run_it_the_note_says_what_paddlenlp_does_and_what_to_set():
    par, notes = _run("--sharding", "stage1", world=4)  # the sharding group takes every data rank: dp 1
    assert par.ep_degree == 1 and len(notes) == 1
    assert notes[0].startswith("use_expert_parallel: true has no effect here: PaddleNLP's MoELayer (moe_group 'data') "
                               "spreads the experts over its data-parallel group (expert_parallel_degree = its dp "
                               "degree, 1 here")
    assert "set expert_parallel_degree: 4" in notes[0]
    par, notes = _run("--sharding", "stage3", world=2)  # ZeRO-3 shards over every data rank: dp 1
    assert par.ep_degree == 1 and len(notes) == 1 and "expert_parallel_degree = its dp degree, 1 here" in notes[0]
    assert "sharding: stage3" in notes[0]  # (no degree runs beside it: the line says so, not a key to set)
    par, notes = _run(world=3)
    assert par.ep_degree == 1 and len(notes) == 1 and "which does not divide num_experts (8)" in notes[0]
    par, notes = _run("--capacity_factor", "1.25")
    assert par.ep_degree == 1 and len(notes) == 1 and "set capacity_factor: 0" in notes[0]


def test_a_stated_expert_parallel_degree_or_one_process_keeps_the_file_s_choice():
    par, notes = _run("--expert_parallel_degree", "1")
    assert par.ep_degree == 1 and len(notes) == 1 and "expert_parallel_degree: 1" in notes[0]
    par, notes = _run("--expert_parallel_degree", "2")
    assert par.ep_degree == 2 and notes == []
    _, notes = _run(world=1)
    assert len(notes) == 1 and "one process" in notes[0]


def test_a_dense_model_is_told_it_has_no_experts():
    notes = [n for n in resolve_run("--use_expert_parallel", "true", world=2).notes
             if n.startswith("use_expert_parallel:")]
    assert len(notes) == 1 and "qwen2 has no experts" in notes[0]


def _record(tmp_path, *argv, world=2):
    """args.json of a run of `argv` on `world` processes (`RunSpec.record`), and the run `train RUN/args.json` on as
    many resolves from it (its `user_arguments`; `arguments`, as `eval` reads it, too)."""
    import json

    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.orchestration.run_spec import RunSpec
    from pretrain_cli.run_config import Target
    from run_helpers import BASE, model_config
    from pretrain_cli.config.presets import resolve_model_dir

    cfg = model_config(MOE["model"])
    args = parse_config(None, [*BASE, "--max_seq_length", "64", *argv])
    spec = RunSpec(args=args, run=resolve(args, cfg, Target("cpu", world, 0, 0)), model_dir=resolve_model_dir(
        MOE["model"]), model_cfg=cfg)
    (tmp_path / "args.json").write_text(json.dumps(spec.record(), default=str))
    again = [resolve(parse_config(str(tmp_path / "args.json"), record=record), cfg, Target("cpu", world, 0, 0))
             for record in ("user_arguments", "arguments")]
    return spec.run, json.loads((tmp_path / "args.json").read_text()), again


def test_the_record_of_a_run_that_spread_the_experts_builds_the_same_layout(tmp_path):
    """args.json held expert_parallel_degree 1 (the field's default) and no use_expert_parallel: `check RUN/args.json
    --world_size 2` read the 1 as a stated degree and kept every expert on every rank. Now it records the key and
    -1, PaddleNLP's unset degree, which the note-giving rule reads as not written."""
    run, record, again = _record(tmp_path, "--use_expert_parallel", "true")
    assert run.parallel.ep_degree == 2
    for keys in (record["user_arguments"], record["arguments"]):
        assert (keys["use_expert_parallel"], keys["expert_parallel_degree"]) == ("true", -1)  # (as typed)
    assert [r.parallel.ep_degree for r in again] == [2, 2]
    run, record, again = _record(tmp_path, "--use_expert_parallel", "true", "--expert_parallel_degree", "1")
    assert record["user_arguments"]["expert_parallel_degree"] == 1  # stated: it decides, in the record too
    assert run.parallel.ep_degree == 1 and [r.parallel.ep_degree for r in again] == [1, 1]


def test_a_stated_minus_one_is_paddlenlp_s_unset_degree_not_a_decision():
    par, notes = _run("--expert_parallel_degree", "-1")
    assert par.ep_degree == 2 and len(notes) == 1 and "the experts are spread over the 2" in notes[0]


def test_a_layout_that_blocks_it_is_named_in_a_few_words_with_the_key_to_set():
    """The note pasted the whole refusal line of a degree the user never asked for ('expert_parallel_degree: 2 with
    sharding: stage3 is not supported (ZeRO-3 runs on the semi-auto engine, ...); use sharding: stage1 ...')."""
    par, notes = _run("--sharding", "stage3", "--sharding_parallel_degree", "1")
    assert par.ep_degree == 1 and notes == [
        "use_expert_parallel: true has no effect here: PaddleNLP's MoELayer (moe_group 'data') spreads the experts "
        "over its data-parallel group (expert_parallel_degree = its dp degree, 2 here, which sharding: stage3 does "
        "not run here); set sharding: stage1 or '' to spread them"]


def test_compatibility_md_lists_it_among_the_keys_that_take_effect():
    """Its row sat under 'Other PaddleNLP keys: accepted, ignored' (PADDLENLP_IGNORED) though it spreads the experts,
    and said 'as PaddleNLP does' of one of PaddleNLP's two MoE layers."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "COMPATIBILITY.md").read_text()
    [section] = [s for s in text.split("\n## ") if "| `use_expert_parallel` |" in s]
    assert section.startswith("Other PaddleNLP keys that take effect\n") and "ignored" not in section.splitlines()[0]
    row = next(line for line in section.splitlines() if line.startswith("| `use_expert_parallel` |"))
    assert "MoELayer (default moe_group 'data')" in row and "moe_group 'expert' is sized by expert_parallel_degree" \
        in row and "a stated expert_parallel_degree decides" in row
