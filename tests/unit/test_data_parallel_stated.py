"""A data-parallel degree the file states (PaddleNLP's `data_parallel_degree`, PaddleFormers' `data_parallel_size`)
is computed here, as PaddleNLP computes it; one above 1 that the run's layout does not give is refused in one line
naming the processes it would take. It was a note that the key has no effect, while the run trained on fewer (or
more) data ranks than the file said, so on another global batch: `data_parallel_degree: 3` with tp 2 x pp 2 on 4
processes trained 1 data rank's batch. Values that match (the run's dp, or dp x sharding: its data ranks) and the
defaults -1/0/1 keep the note."""
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
    zero1 = resolve_run("--data_parallel_size", "4", "--sharding", "stage1", "--sharding_parallel_degree", "2",
                        world=4).parallel  # dp 2 x sharding 2: PaddleFormers' data ranks
    assert (zero1.dp_degree, zero1.sharding_degree) == (2, 2)
    assert resolve_run("--data_parallel_degree", "2", "--sharding", "stage1", "--sharding_parallel_degree", "2",
                       world=4).parallel.dp_degree == 2  # PaddleNLP's: world / (sharding x tp x pp x cp)
    for value in ("1", "-1", "0"):
        assert resolve_run("--data_parallel_degree", value, "--tensor_parallel_degree", "2", world=4).parallel
    assert resolve_run("--data_parallel_degree", "4", world=1).parallel.world_size == 1  # a file for 4, checked on 1


def test_under_a_sharding_group_of_every_data_rank_the_line_names_the_sharding_degree_that_leaves_it():
    with pytest.raises(UserError) as e:
        resolve_run("--data_parallel_degree", "2", "--sharding", "stage1", world=4)
    assert ("data_parallel_degree: 2, but 4 processes / (sharding 4) give 1 data rank; set sharding_parallel_degree: "
            "2 (ZeRO over the rest), run it on 8 processes") in str(e.value)


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
    assert need("--data_parallel_degree", "2", "--sharding", "stage1", "--sharding_parallel_degree", "2") == 2
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
