"""A data-parallel degree the file states (PaddleNLP's `data_parallel_degree`, PaddleFormers' `data_parallel_size`)
is computed here, as PaddleNLP computes it; one above 1 that the run's layout does not give is refused in one line
naming the processes it would take. It was a note that the key has no effect, while the run trained on fewer (or
more) data ranks than the file said, so on another global batch: `data_parallel_degree: 3` with tp 2 x pp 2 on 4
processes trained 1 data rank's batch. Values that match (the run's dp, world / (sharding x tp x pp x ...); its data
ranks only where the sharding group is every data rank) and the defaults -1/0/1 keep the note."""
import pytest
from run_helpers import resolve_run

from pretrain_cli.errors import UserError


@pytest.mark.parametrize("key", ["data_parallel_degree", "data_parallel_size"])
def test_a_stated_data_parallel_degree_the_layout_does_not_give_is_refused(key):
    with pytest.raises(UserError) as e:
        resolve_run(f"--{key}", "3", "--tensor_parallel_degree", "2", "--pipeline_parallel_degree", "2",
                    "--gradient_accumulation_steps", "4", world=4)
    line = next(x for x in str(e.value).splitlines() if x.startswith(f"{key}:"))
    assert line == (f"{key}: 3, but 4 processes / (tp 2 x pp 2) give 1 data rank; run it on 12 processes "
                    f"(`check --world_size 12`), or remove the key (the data ranks are computed from the world size "
                    f"and the other degrees)")


def test_the_data_ranks_of_the_layout_and_the_defaults_are_accepted():
    assert resolve_run("--data_parallel_degree", "2", "--tensor_parallel_degree", "2", world=4).parallel.dp_degree == 2
    zero1 = resolve_run("--data_parallel_size", "2", "--sharding", "stage1", "--sharding_parallel_degree", "2",
                        world=4).parallel  # dp 2 x sharding 2: PaddleFormers' dp, as PaddleNLP's
    assert (zero1.dp_degree, zero1.sharding_degree) == (2, 2)
    assert resolve_run("--data_parallel_degree", "2", "--sharding", "stage1", "--sharding_parallel_degree", "2",
                       world=4).parallel.dp_degree == 2  # PaddleNLP's: world / (sharding x tp x pp x cp)
    for value in ("1", "-1", "0"):
        assert resolve_run("--data_parallel_degree", value, "--tensor_parallel_degree", "2", world=4).parallel
    assert resolve_run("--data_parallel_degree", "4", world=1).parallel.world_size == 1  # a file for 4, checked on 1


def test_under_a_sharding_group_of_every_data_rank_the_line_names_the_sharding_degree_that_leaves_it():
    """With `sharding_parallel_degree` -1 the sharding group takes every data rank, so PaddleNLP's dp is 1 on any
    world: the line said 'run it on 8 processes', refused again on 8 ('16'), and so on. The count it names now is the
    one the stated degree is the data ranks at (2), and each fix it names passes."""
    with pytest.raises(UserError) as e:
        resolve_run("--data_parallel_degree", "2", "--sharding", "stage1", world=4)
    assert ("data_parallel_degree: 2, but 4 processes / (sharding 4) give 1 data rank; set sharding_parallel_degree: "
            "2 (ZeRO over the rest), run it on 2 processes (`check --world_size 2`), or remove the key") in str(e.value)
    assert resolve_run("--data_parallel_degree", "2", "--sharding", "stage1", "--sharding_parallel_degree", "2",
                       world=4).parallel.dp_degree == 2
    assert resolve_run("--data_parallel_degree", "2", "--sharding", "stage1", world=2).parallel.data_world_size == 2


def test_the_launch_a_file_is_written_for_counts_its_stated_data_parallel_degree():
    """`check` on one process names, and `plan` without --gpus plans, the processes the file's parallel keys run on
    (`fewest_processes`): a stated data-parallel degree counts there too, else the world they name is one the
    refusal above refuses (`plan` of a tp 2 file stating data_parallel_degree 2 planned 2 processes and failed)."""
    from run_helpers import BASE

    from pretrain_cli.config.one_process import fewest_processes
    from pretrain_cli.config.parser import parse_config

    def need(*argv):
        return fewest_processes(parse_config(None, [*BASE, *argv]))[0]

    assert need("--tensor_parallel_degree", "2", "--data_parallel_degree", "2") == 4
    assert need("--pipeline_parallel_degree", "2", "--data_parallel_size", "3") == 6
    # PaddleNLP's dp beside an explicit sharding degree: dp 2 x sharding 2 (it was 2, the data ranks reading)
    assert need("--data_parallel_degree", "2", "--sharding", "stage1", "--sharding_parallel_degree", "2") == 4
    assert need("--data_parallel_degree", "3", "--sharding", "stage1", "--sharding_parallel_degree", "2") == 6
    assert need("--tensor_parallel_degree", "2", "--data_parallel_degree", "1") == 2
    for world in (4, 6):  # each such world passes resolve
        assert resolve_run("--pipeline_parallel_degree", "2", "--data_parallel_size", str(world // 2),
                           "--gradient_accumulation_steps", "4", world=world).parallel.dp_degree == world // 2


def test_the_keys_rows_and_note_say_a_degree_the_layout_does_not_give_is_refused():
    """COMPATIBILITY.md's rows (from `paddlenlp_keys`, as the note a file stating one gets) said only that the data
    ranks are computed, as if any value were taken and ignored."""
    from pathlib import Path

    from pretrain_cli.config.paddlenlp_keys import IGNORED

    rows = {line.split("|")[1].strip(" `"): line for line in
            (Path(__file__).parents[2] / "docs" / "COMPATIBILITY.md").read_text().splitlines()
            if line.startswith("| `data_parallel_")}
    for key in ("data_parallel_degree", "data_parallel_size"):
        assert "a value above 1 that they do not give is refused" in IGNORED[key][1]
        assert IGNORED[key][1] in rows[key]


ADVISED = [  # (keys, world): a refused stated degree; every count or key its line names must pass
    (["--data_parallel_degree", "2", "--sharding", "stage1"], 8),
    (["--data_parallel_degree", "3", "--sharding", "stage1"], 12),
    (["--data_parallel_degree", "2", "--sharding", "stage1", "--tensor_parallel_degree", "2"], 8),
    (["--data_parallel_size", "6", "--sharding", "stage1", "--sharding_parallel_degree", "4"], 12),
    (["--data_parallel_degree", "3", "--tensor_parallel_degree", "2", "--pipeline_parallel_degree", "2"], 4),
    (["--data_parallel_degree", "3", "--sharding_parallel_degree", "2"], 4),
]


@pytest.mark.parametrize("keys,world", ADVISED)
def test_the_count_and_the_sharding_degree_the_line_names_pass_and_are_the_fewest_processes(keys, world):
    """One rule (`one_process.stated_unmet`) for the refusal and for the processes named (`least_data_ranks`,
    `fewest_processes`): a count the line names passes, and so does a sharding degree it names, at this world."""
    import re

    from run_helpers import BASE

    from pretrain_cli.config.one_process import fewest_processes
    from pretrain_cli.config.parser import parse_config

    with pytest.raises(UserError) as e:
        resolve_run(*keys, "--gradient_accumulation_steps", "4", world=world)
    line = next(x for x in str(e.value).splitlines() if x.startswith("data_parallel_"))
    named = int(re.search(r"run it on (\d+) processes", line).group(1))
    assert named == fewest_processes(parse_config(None, [*BASE, *keys]))[0]
    assert resolve_run(*keys, "--gradient_accumulation_steps", "4", world=named).parallel
    sharding = re.search(r"set sharding_parallel_degree: (\d+)", line)
    if sharding:
        assert resolve_run(*keys, "--sharding_parallel_degree", sharding.group(1), "--gradient_accumulation_steps", "4",
                           world=world).parallel


def test_a_stated_degree_no_count_gives_names_the_key_to_remove_and_the_file_is_planned_on_the_others():
    """expert_parallel_degree 4 must divide the data ranks, a stated data_parallel_degree 2 (no sharding) is them:
    no world gives both. `fewest_processes` named 4 (an lcm), which the refusal refused with 'run it on 2', where
    expert_parallel_degree's line said 'run it on 4'. Now the count is the expert degree's, and there the line names
    the key to remove, not a count."""
    from run_helpers import BASE

    from pretrain_cli.config.one_process import fewest_processes
    from pretrain_cli.config.parser import parse_config

    keys = ["--expert_parallel_degree", "4", "--data_parallel_degree", "2"]
    assert fewest_processes(parse_config(None, [*BASE, *keys])) == (4, "4 data ranks for expert_parallel_degree 4")
    with pytest.raises(UserError) as e:
        resolve_run(*keys, world=4, model="micro-qwen3-moe")
    assert str(e.value) == ("data_parallel_degree: 2, but 4 processes give 4 data ranks; no process count gives 2 "
                            "with expert_parallel_degree 4: remove the key (the data ranks are computed from the world "
                            "size and the other degrees)")


def test_paddlenlp_counts_the_sharding_degree_without_a_stage_too():
    """PaddleNLP's data_parallel_degree is world // (sharding_parallel_degree x tp x sep x cp x pp), the sharding
    degree counted without a `sharding` stage as well: `data_parallel_degree: 2` beside `sharding_parallel_degree: 2`
    on 4 processes is its dp, and was refused ('give 4 data ranks')."""
    run = resolve_run("--data_parallel_degree", "2", "--sharding_parallel_degree", "2", world=4)
    assert run.parallel.data_world_size == 4


def test_no_line_follows_a_refused_degree():
    """A degree refused before is reset to 1, and the stated degree's line then named a count for that other layout
    (tensor_parallel_degree 3 on 4 processes: 'give 4 data ranks; run it on 2 processes'): only the degree's line."""
    with pytest.raises(UserError) as e:
        resolve_run("--tensor_parallel_degree", "3", "--data_parallel_degree", "2", world=4)
    assert str(e.value) == "tensor_parallel_degree: 3 does not divide the world size 4; use a divisor of it"
    with pytest.raises(UserError) as e:
        resolve_run("--expert_parallel_degree", "4", "--data_parallel_degree", "2", world=2, model="micro-qwen3-moe")
    assert str(e.value).startswith("expert_parallel_degree: 4 does not divide the 2 data ranks")
    # only the expert line, which names the stated key itself (no count gives both: remove it), no line of the key's
    assert len(str(e.value).splitlines()) == 1 and not str(e.value).startswith("data_parallel_degree")


@pytest.mark.parametrize("key,world", [("data_parallel_degree", 2), ("data_parallel_size", 2),
                                       ("data_parallel_degree", 1)])
def test_the_note_of_a_stated_degree_is_true_whether_or_not_the_run_gives_it(key, world):
    """`check g.json --data_parallel_degree 2 --world_size 2` (the run's own degree) said 'accepted but has no effect
    here: ... a value above 1 that they do not give is refused': 'no effect' beside 'refused'. The note says the value
    sets nothing and is checked, for a value the run gives as for one that one process leaves unchecked."""
    notes = [n for n in resolve_run(f"--{key}", "2", world=world).notes if n.startswith(f"{key}:")]
    assert len(notes) == 1, notes
    assert "no effect" not in notes[0], notes[0]
    assert notes[0].startswith(f"{key}: 2: computed from the world size and the other degrees, so a stated value "
                               f"sets nothing: it is checked"), notes[0]


PN = ["--tensor_parallel_degree", "2", "--pipeline_parallel_degree", "2", "--sharding", "stage1",
      "--sharding_parallel_degree", "2", "--data_parallel_degree", "2", "--gradient_accumulation_steps", "4"]


def test_paddlenlp_dp_beside_an_explicit_sharding_degree_is_not_the_data_ranks():
    """PaddleNLP's file for 16 GPUs, dp 2 x sharding 2 x tp 2 x pp 2: the stated 2 was taken as the data ranks too, so
    8 processes passed (PaddleNLP's dp 1, half the file's global batch) and `plan --gpus 32` said 'run it on 8'.
    PaddleFormers' data_parallel_size is the same dp (world // (sharding_parallel_size x tp x sep x pp))."""
    from run_helpers import BASE

    from pretrain_cli.config.one_process import fewest_processes
    from pretrain_cli.config.parser import parse_config

    assert fewest_processes(parse_config(None, [*BASE, *PN]))[0] == 16
    with pytest.raises(UserError) as e:
        resolve_run(*PN, world=32)
    assert "run it on 16 processes (`check --world_size 16`)" in str(e.value)
    with pytest.raises(UserError, match="8 processes / \\(tp 2 x pp 2 x sharding 2\\) give 1 data rank"):
        resolve_run(*PN, world=8)
    run = resolve_run(*PN, world=16).parallel
    assert (run.dp_degree, run.sharding_degree) == (2, 2)
    zero1 = ["--data_parallel_size", "4", "--sharding", "stage1", "--sharding_parallel_degree", "2"]
    with pytest.raises(UserError, match="give 2 data ranks"):
        resolve_run(*zero1, world=4)
    assert resolve_run(*zero1, world=8).parallel.dp_degree == 4


def test_the_processes_that_give_large_stated_degrees_are_found_at_once():
    """The search went through every multiple up to the product of the stated degrees: 1000 and 999 took 20 s, larger
    values hung. A stated degree is given at one count of data ranks, so only those are checked."""
    import time

    from run_helpers import BASE

    from pretrain_cli.config.one_process import fewest_processes, least_data_ranks
    from pretrain_cli.config.parser import parse_config

    start = time.monotonic()
    args = parse_config(None, [*BASE, "--data_parallel_degree", "1000", "--data_parallel_size", "999"])
    assert least_data_ranks(args) is None and fewest_processes(args) == (1, "")
    big = parse_config(None, [*BASE, "--data_parallel_degree", str(10 ** 12), "--data_parallel_size", str(10 ** 12)])
    assert least_data_ranks(big) == 10 ** 12
    assert time.monotonic() - start < 2


def test_a_file_no_count_gives_is_said_so_on_one_process():
    """`plan` (no --gpus) of a file stating data_parallel_degree 2 and data_parallel_size 4 planned it on 1 process
    without a word, though every launch of more refuses it."""
    notes = resolve_run("--data_parallel_degree", "2", "--data_parallel_size", "4").notes
    assert ("data_parallel_degree: 2 and data_parallel_size: 4: no process count gives both, so every launch of more "
            "than one process is refused: remove them (the data ranks are computed from the world size and the other "
            "degrees)") in notes
    assert not any("no process count" in n for n in resolve_run("--data_parallel_degree", "2").notes)


def test_without_a_stage_the_line_names_no_sharding_axis():
    """Without a ZeRO stage the run has no sharding group: the line said '2 processes / (sharding 2) give 1 data rank'
    of a run with 2 data ranks. It names the run's data ranks and PaddleNLP's dp beside the sharding degree."""
    with pytest.raises(UserError) as e:
        resolve_run("--data_parallel_degree", "4", "--sharding_parallel_degree", "2", world=2)
    assert str(e.value) == ("data_parallel_degree: 4, but 2 processes give 2 data ranks (PaddleNLP's dp 1 beside "
                            "sharding_parallel_degree 2); run it on 8 processes (`check --world_size 8`), or remove "
                            "the key (the data ranks are computed from the world size and the other degrees)")
