"""`plan` on nodes of GPUs: a device count of part nodes is answered with counts and node sizes the file's layout runs
on (its tensor-parallel groups inside a node), and the suggestions and `--fit`'s search keep tensor parallelism
inside a node: tp all-reduces every layer, and across nodes it crosses the slow link."""
from pathlib import Path

from plan_helpers import fit, plan
from pretrain_cli.cli import main as cli_main
from pretrain_cli.planning.fit_candidates import candidates, lean_layouts
from pretrain_cli.planning.layout import tp_inside_node

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LLAMA3_8B = str(CONFIGS / "llama-3-8b_pretrain.json")  # tp 2, sharding stage1
# PaddleNLP's llm/config/deepseek-v3/pretrain_argument.json, as published: pp 2 x 4 data ranks (ep 4, ZeRO-1 over 4)
DSV3 = str(CONFIGS.parent / "tests" / "e2e" / "paddlenlp_configs" / "deepseek_v3_pretrain_argument.json")


def _refusal(capsys, *argv: str) -> str:
    assert cli_main(["plan", *argv, "--device", "H100"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err.strip()


def test_part_nodes_are_answered_with_counts_and_node_sizes_the_files_tp_runs_on(capsys):
    """`--gpus 12` on nodes of 8 for a file with tp 8 suggested `--gpus_per_node 6` (the hint was made before the file
    was read): tp 8 runs on no 12 devices, and nodes of 6 would split each tp group. The counts offered are whole
    nodes the file's layout divides; a node size only where the world runs the file and each node holds whole tp
    groups."""
    tp8 = _refusal(capsys, LLAMA3_8B, "--tensor_parallel_degree", "8", "--gpus", "12")
    assert tp8.endswith("use --gpus 8 or 16: whole nodes of 8 that the 8 processes the file's layout needs "
                        "(tensor_parallel_degree 8) divide")
    tp4 = _refusal(capsys, LLAMA3_8B, "--tensor_parallel_degree", "4", "--gpus", "12")
    assert tp4.endswith("or --gpus_per_node 4 (whole tensor-parallel groups of 4 in each node)")
    assert "--gpus 24:" in _refusal(capsys, LLAMA3_8B, "--tensor_parallel_degree", "8", "--pipeline_parallel_degree",
                                     "3", "--gpus", "12")  # (no whole node of 8 below 12 that 24 divides)
    # no model parallelism: any count of whole nodes, or the largest node size dividing the count
    assert _refusal(capsys, LLAMA3_8B, "--tensor_parallel_degree", "1", "--gpus", "12").endswith(
        "use --gpus 8 or 16, or --gpus_per_node 6")
    # the file's own process count (--gpus not given): PaddleNLP's DeepSeek-V3 file's 8 on nodes of 6
    assert cli_main(["plan", DSV3, "--device", "H100", "--gpus_per_node", "6"]) == 2
    err = capsys.readouterr().err
    assert "use --gpus 24: whole nodes of 6 that the 8 processes the file's layout needs (pipeline_parallel_degree 2" \
           in err and err.strip().endswith("sharding_parallel_degree 4) divide, or --gpus_per_node 4")


def test_no_count_offered_splits_the_files_tp_groups_across_nodes(capsys):
    """tp 16 on --gpus 12 was told --gpus 16 (two nodes of 8 holding halves of the group), tp 3 --gpus 24 (tp 3
    does not divide 8): a count whose tp groups would cross nodes is not offered; when none is, the line says so and
    what keeps them inside one."""
    tp16 = _refusal(capsys, LLAMA3_8B, "--tensor_parallel_degree", "16", "--gpus", "12")
    assert tp16.endswith("no count of whole nodes of 8 keeps the file's tensor-parallel groups of 16 inside a node: "
                         "set tensor_parallel_degree to a divisor of 8") and "--gpus 16" not in tp16
    tp3 = _refusal(capsys, LLAMA3_8B, "--tensor_parallel_degree", "3", "--gpus", "12")
    assert tp3.endswith("no count of whole nodes of 8 keeps the file's tensor-parallel groups of 3 inside a node: use "
                        "--gpus_per_node 6 (whole tensor-parallel groups of 3 in each node)") and "--gpus 24" not in tp3


def test_tp_inside_node_assumes_the_rank_rules_order():
    """`tp_inside_node` is asked before any group exists, so it assumes tp innermost: the run's own rank rule
    (`Topology`, what `plan`'s layout lines and `train` use) must agree on every layout it judges."""
    from pretrain_cli.orchestration.planned import rank_groups
    from pretrain_cli.run_layout import ParallelConfig

    for world, tp, pp, per_node in ((16, 8, 1, 8), (16, 4, 2, 8), (24, 3, 1, 8), (32, 16, 1, 8), (12, 4, 1, 6)):
        par = ParallelConfig(world_size=world, tp_degree=tp, pp_degree=pp, dp_degree=world // tp // pp)
        inside = all(len({rank // per_node for rank in g}) == 1 for g in rank_groups(par)["tp"])
        assert inside == tp_inside_node(tp, world, per_node), (world, tp, pp, per_node)


def test_tp_groups_stay_inside_a_node_where_tp_divides_it():
    assert tp_inside_node(8, 16, 8) and tp_inside_node(4, 24, 8) and tp_inside_node(6, 6, 8)  # one node: any
    assert not tp_inside_node(16, 16, 8) and not tp_inside_node(4, 12, 6) and not tp_inside_node(3, 24, 8)


def test_the_fit_search_tries_no_tp_across_nodes():
    """`--fit`'s candidates and the fewest-devices search's lean layouts on 32 devices in nodes of 8: tp 1 to 8, not
    16 or 32; without nodes (per_node 0) every divisor, as before."""
    current = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 16, "recompute": False,
               "use_flash_attention": True, "sharding": "", "tensor_parallel_degree": 1, "pipeline_parallel_degree": 1,
               "context_parallel_degree": 1, "sequence_parallel": False, "expert_parallel_degree": 1}
    tps = {c.get("tensor_parallel_degree", 1) for c in candidates(current, 32, 32, 4096, per_node=8)}
    assert tps == {1, 2, 4, 8}
    assert {c.get("tensor_parallel_degree", 1) for c in candidates(current, 32, 32, 4096)} == {1, 2, 4, 8, 16, 32}
    lean = {c.get("tensor_parallel_degree", 1) for c in lean_layouts(current, 32, 4096, per_node=8)}
    assert lean == {1, 2, 4, 8}


def test_deepseek_v3_at_8k_is_suggested_tp_8_on_more_nodes_not_tp_16_across_two():
    """PaddleNLP's DeepSeek-V3 file at 8,192 tokens on 8 H100 a node: the fewest devices were 192 with tp 16 (each tp
    group over two nodes, every layer's all-reduces on the 50 GB/s link), and --fit's 224 the same. Now the fewest
    devices whose tp groups stay in a node within --fit's budget, for both: 232 (tp 8, ZeRO-3 over 29 data ranks)."""
    at_8k = ["--max_seq_length", "8192"]
    first = plan(DSV3, at_8k, device="H100", gpus=8)["suggestions"][0]
    assert first["gpus"] == 232 and first["change"]["tensor_parallel_degree"] == 8 and first["fits"]
    assert "(29 nodes of 8)" in first["why"]
    more = fit(DSV3, at_8k, device="H100", gpus=8)["more_devices"]
    assert (more["gpus"], more["change"]) == (232, first["change"])



def test_plans_fewest_devices_search_tries_the_lean_layouts_of_its_nodes(monkeypatch):
    """`plan`'s fewest-devices suggestion asked `lean_layouts` without the node size (`--fit` passed it), so it
    planned tp groups across nodes only to count them as not fitting: now both pass `--gpus_per_node`."""
    from pretrain_cli.planning import fit_candidates

    seen, lean = [], fit_candidates.lean_layouts

    def lean_by_node(current, gpus, seq_len, experts=0, per_node=0):
        seen.append(per_node)
        return lean(current, gpus, seq_len, experts, per_node)

    monkeypatch.setattr(fit_candidates, "lean_layouts", lean_by_node)
    first = plan(DSV3, device="H100", gpus=8)["suggestions"][0]
    assert first["gpus"] == 192 and seen and set(seen) == {8}
