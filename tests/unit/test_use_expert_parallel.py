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
                     "(moe_group 'data'); set expert_parallel_degree to choose another degree"]
    par, _ = _run("--tensor_parallel_degree", "2", world=8)  # 4 data ranks of each tp position
    assert (par.tp_degree, par.ep_degree) == (2, 4)


def test_where_the_layout_does_not_run_it_the_note_says_what_paddlenlp_does_and_what_to_set():
    par, notes = _run("--sharding", "stage1", world=4)  # the sharding group takes every data rank: dp 1
    assert par.ep_degree == 1 and len(notes) == 1
    assert notes[0].startswith("use_expert_parallel: true has no effect here: PaddleNLP spreads the experts over its "
                               "data-parallel group (expert_parallel_degree = its dp degree, 1 here")
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
