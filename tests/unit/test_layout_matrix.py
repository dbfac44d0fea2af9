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
            "cp2": (8, 1),
            # the semi-auto engine (tp alone, ZeRO-2/3) computes it over the global batch
            "tp2_d2": (8, 1), "d2_zero2": (8, 1), "d2_zero3": (8, 1), "tp2_d2_zero3": (8, 1)}
    for name, batch in want.items():
        keys, world = rows[name]
        assert m.reference_batch(keys, world, moe=True) == batch, name
        assert m.reference_batch(keys, world, moe=False) == (8, 1), name  # a dense model: one batch of 8
    assert m.is_moe("micro-qwen3-moe") and m.is_moe("micro-deepseek-v3") and not m.is_moe("micro-qwen2")
