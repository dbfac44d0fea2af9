"""The fewest-devices search (`suggestions.more_devices`) finds its count with `suggestions.first_count`: the counts
within a node one by one, then the most, the first two whole nodes, and bisection between. It gives the answers the
one-by-one search gave (every count, fewest first, until one fits), on cpu and on GPUs, where nothing fits and where
the count lies far on, and where no count fits it plans one count, not each. The bisection rests on the least need
of a process not growing over whole-node counts, checked on a dense model, an MoE and a cpu run.

`plan --fit` alone is compared (`plan`'s first suggestion is the same search, `fit.fewest_devices`:
tests/unit/test_plan_one_answer.py): each case plans its counts twice, the one-by-one way and this one."""
from pathlib import Path

import pytest

from pretrain_cli.orchestration import planned
from pretrain_cli.planning import hardware, suggestions
from pretrain_cli.planning.fit_candidates import lean_layouts
from pretrain_cli.planning.hardware import Node
from plan_helpers import fit

LLAMA3_8B = Path(__file__).resolve().parents[2] / "configs" / "llama-3-8b_pretrain.json"

# (machine GiB for cpu, command-line keys, device, --gpus, --gpus_per_node)
CASES = {
    "8b-cpu-none-fits": (23.5, [], "cpu", 2, 8),
    "8b-cpu-32-machines": (20.0, ["--tensor_parallel_degree", "1", "--sharding", ""], "cpu", 4, 1),
    "qwen2.5-7b-cpu-3-a-node": (20.0, ["--model_name_or_path", "Qwen/Qwen2.5-7B", "--tensor_parallel_degree", "1"],
                                "cpu", 1, 3),
    "qwen2-72b-cpu-384": (256.0, ["--model_name_or_path", "Qwen/Qwen2-72B"], "cpu", 1, 8),
    "qwen2-72b-a100-24": (64.0, ["--model_name_or_path", "Qwen/Qwen2-72B"], "A100-80GB", 2, 8),
    "llama3-70b-v100-1408": (64.0, ["--model_name_or_path", "meta-llama/Meta-Llama-3-70B"], "V100-16GB", 1, 8),
}


def one_by_one(counts, fits, per_node):
    """The search as it was: each count, fewest first."""
    return next((i for i, world in enumerate(counts) if fits(world)), None)


def _answers(mem, args, device, gpus, per, monkeypatch) -> tuple:
    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: mem)
    monkeypatch.setattr(hardware, "host_available_gib", lambda *a, **k: (mem, "MemAvailable"))
    f = fit(str(LLAMA3_8B), args, device=device, gpus=gpus, node=Node(gpus=per))
    return f["more_devices"], f["machine"]


@pytest.mark.parametrize("case", list(CASES))
def test_first_count_gives_the_one_by_one_searchs_answers(case, monkeypatch):
    mem, args, device, gpus, per = CASES[case]
    new = _answers(mem, args, device, gpus, per, monkeypatch)
    monkeypatch.setattr(suggestions, "first_count", one_by_one)
    assert new == _answers(mem, args, device, gpus, per, monkeypatch)
    more, machine = new
    assert (more or {}).get("gpus") == {"8b-cpu-none-fits": None, "8b-cpu-32-machines": 32,
                                        "qwen2.5-7b-cpu-3-a-node": None, "qwen2-72b-cpu-384": 384,
                                        "qwen2-72b-a100-24": 24, "llama3-70b-v100-1408": 1408}[case]
    assert (more is None) == ("no number of processes up to 4096 fits" in (machine or ""))


def test_where_no_count_fits_one_is_planned_not_each(monkeypatch):
    """configs/llama-3-8b_pretrain.json on 23.5 GiB cpu machines of 8 processes: the state holds from 64
    processes on, and no count up to 4,096 fits: the one-by-one search planned all 7 counts (1,828 plans in all for
    `plan`), this one the most."""
    asked, search = [], suggestions.first_count

    def counting(counts, fits, per_node):  # (8 a machine: the search with fewer is `machines.fewer_a_machine`'s)
        return search(counts, lambda world: (per_node == 8 and asked.append(world)) or fits(world), per_node)

    monkeypatch.setattr(suggestions, "first_count", counting)
    more, machine = _answers(23.5, [], "cpu", 2, 8, monkeypatch)
    assert more is None and "no number of processes up to 4096 fits" in machine
    assert sorted(set(asked)) == [4096]


def test_first_count_bisects_between_the_second_and_the_most():
    """Counts 1..10 that fit from the 7th on: 10 first, then 1 and 2, then bisection, to index 6."""
    asked = []

    def fits(world):
        asked.append(world)
        return world >= 7

    assert suggestions.first_count(list(range(1, 11)), fits, 1) == 6
    assert asked[:3] == [10, 1, 2] and len(asked) <= 6
    assert suggestions.first_count(list(range(1, 11)), lambda world: False, 1) is None
    # within a node every count is asked in turn (on cpu more processes each get less memory)
    asked.clear()
    assert suggestions.first_count([2, 4, 8, 16, 32], fits, 8) == 2 and asked == [2, 4, 32, 8]


@pytest.mark.parametrize("config, args, device, per", [
    ("llama-3.2-1b_pretrain.json", [], "V100-16GB", 2),
    ("qwen3-moe-tiny_cpu.json", ["--model_name_or_path", "Qwen/Qwen3-30B-A3B", "--max_seq_length", "512"], "T4", 2),
    ("llama-3.2-1b_pretrain.json", ["--max_seq_length", "1024"], "cpu", 2)])
def test_the_least_need_does_not_grow_over_whole_node_counts(config, args, device, per, monkeypatch):
    """What `first_count`'s bisection assumes: of the layouts the count search offers (`fit_candidates.lean_layouts`,
    the file as written, each sharding stage), the least a process needs on 2n devices is no more than on n (a layout of
    one data rank gains DataParallel's buffers on two, its ZeRO-1 variant there needs less)."""
    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 64.0)
    args_, cfg = planned.parse(str(LLAMA3_8B.parent / config), args)
    node = Node(gpus=per)
    replan = planned._replanner(args_, cfg, device, per, None, 0.0, None, node)
    current = planned._current(args_)
    base = replan({}, per, layout=False)
    least = []
    for world in (per * 2 ** i for i in range(5)):  # whole nodes: each process the same budget
        tries = [{}, *({"sharding": f"stage{k}"} for k in (1, 2, 3)),
                 *lean_layouts(current, world, base.max_seq_length, base.model.experts, per)]
        least.append(min(r.least_gib for r in (replan(c, world, layout=False) for c in tries) if r is not None))
    assert all(b <= a + 1e-9 for a, b in zip(least, least[1:])), least
    assert least[-1] < least[0]
