"""benchmarks/layout_matrix.py: which one-process run each row is compared with. A Mixture-of-Experts model's
balance loss (its default scope, `micro_batch`) is a loss per micro-batch of each rank, so a row is compared with one
process in the same micro-batches; against one batch of 8 its data-parallel and pipeline rows of micro-qwen3-moe
printed max |dloss| 6.6e-5 to 1.5e-4 for layouts that equal one process."""
from bench_scripts import load


def _matrix():
    return load("layout_matrix")


def test_a_moe_row_is_compared_in_its_own_micro_batches():
    m = _matrix()
    rows = {name: (keys, world) for name, keys, world in m.layouts(4)}
    want = {"d2": (4, 2), "d2_zero1": (4, 2), "pp2": (4, 2), "pp2_d2": (2, 4), "tp2_pp2": (4, 2), "tp2": (8, 1),
            # context parallelism: a cp group's micro-batch is its data rank's (each cp rank routes its chunks, the
            # balance loss's sums taken over the group: tests/distributed/test_moe_context.py); it was refused
            "cp2": (8, 1), "cp2_zero2": (8, 1), "cp2_d2": (4, 2), "pp2_cp2": (4, 2),
            # the semi-auto engine (tp alone, ZeRO-2/3) computes it over the global batch
            "tp2_d2": (8, 1), "d2_zero2": (8, 1), "d2_zero3": (8, 1), "tp2_d2_zero3": (8, 1)}
    for name, batch in want.items():
        keys, world = rows[name]
        assert m.reference_batch(keys, world, "micro-qwen3-moe") == batch, name
        assert m.reference_batch(keys, world, "micro-qwen2") == (8, 1), name  # a dense model: one batch of 8
    assert m.is_moe("micro-qwen3-moe") and m.is_moe("micro-deepseek-v3") and not m.is_moe("micro-qwen2")


def test_a_tp_row_on_fleets_groups_is_compared_in_each_ranks_micro_batches():
    """tp alone runs on fleet's groups, the balance loss per rank's micro-batch, for multi-head latent attention (but
    ZeRO-3: the semi-auto engine) and with expert parallelism; the degrees alone named the semi-auto engine, so those
    rows were compared with one batch of 8 (micro-qwen2-moe's tp2_d2_ep2: max |dloss| 2.3e-5, |dweight| 4.1e-3)."""
    m = _matrix()
    for model, ep, want in (("micro-deepseek-v3", 1, {"tp2_d2": (4, 2), "tp2_d2_zero1": (4, 2), "tp2_d2_zero2": (4, 2),
                                                      "tp2_d2_zero3": (8, 1), "tp2": (8, 1)}),
                            ("micro-qwen3-moe", 2, {"tp2_d2_ep2": (4, 2), "tp2_d2_zero1_ep2": (4, 2),
                                                    "tp2_d2_zero2_ep2": (4, 2)})):
        rows = {name: (keys, world) for name, keys, world in m.layouts(4, ep)}
        for name, batch in want.items():
            assert m.reference_batch(*rows[name], model) == batch, (model, name)


def test_an_ep_cp_pp_row_is_compared_in_each_ranks_micro_batches():
    """ep x cp x pp runs (tests/distributed/test_moe_context_pipeline.py): its 8-process rows are compared with one
    process in 4 micro-batches of 2, each data rank's 2 micro-batches of 2 (resolving them raised: "ep x cp x pp")."""
    m = _matrix()
    rows = {name: (keys, world) for name, keys, world in m.layouts(8, 2)}
    for name in ("pp2_cp2_d2_ep2", "pp2_cp2_d2_zero1_ep2", "pp2_cp2_d2_zero2_ep2"):
        assert m.reference_batch(*rows[name], "micro-qwen3-moe") == (2, 4), name
