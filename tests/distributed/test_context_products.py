"""Context parallelism composed with tensor and pipeline parallelism: the layout steps tp -> cp and cp -> pp
(distributed/steps.py) through the real launcher, 4 processes each, against conftest's one-process reference.

cp2 x tp2: each 32-token sequence cut into cp chunks (0+3, 1+2), each chunk's attention heads and MLP columns split
over the tp pair, the ring attention running on each rank's heads; cp2 x tp2 + sequence parallelism with document
masking, recompute and evaluation; cp2 x pp2: the pipeline's 4 micro-batches of 2 fed to the stages as each rank's
chunks. Each must follow the one-process curve step by step (<= 1e-5), end on its weights, and its checkpoint must
resume on one process on the same curve.
"""
from __future__ import annotations

import pytest
from launch_helpers import (STEPS, assert_checkpoint_matches, assert_close_losses, assert_close_tensors, evals,
                            launch_joined, read_weights, single, write_config)

CP_TP = dict(context_parallel_degree=2, tensor_parallel_degree=2, per_device_train_batch_size=8)
CP_PP = dict(context_parallel_degree=2, pipeline_parallel_degree=2, gradient_accumulation_steps=4,
             per_device_train_batch_size=2)
DOC = dict(attention_mask_type="document", recompute=True, do_eval=True, eval_steps=5, eval_iters=2)
WEIGHT_TOL = 2e-5  # the row-parallel and ring sums in another order than one process (test_layouts.py's WEIGHT_TOL)


@pytest.fixture(scope="module")
def products(corpus, tmp_path_factory):
    """name -> (Run, output_dir): cp2 x tp2 and cp2 x pp2, saving checkpoint-5."""
    out = {}
    for name, keys in {"cp2_tp2": CP_TP, "cp2_pp2": CP_PP}.items():
        root = tmp_path_factory.mktemp(name)
        run = launch_joined(write_config(root / "c.json", corpus, root / "out", save_steps=5, **keys), root / "log", 4)
        assert run.returncode == 0, run.explain()
        out[name] = (run, root / "out")
    return out


@pytest.mark.parametrize("name,layout", [
    ("cp2_tp2", "layout: tensor parallel (distributed.tensor_parallel): tp 2 x cp 2 x dp 1"),
    ("cp2_pp2", "layout: pipeline (fleet 1F1B): pp 2 x dp 1 x cp 2"),
])
def test_context_with_tensor_or_pipeline_parallelism_matches_one_process(products, ref, name, layout):
    (run, out), (r, rout) = products[name], ref
    assert_close_losses(run.losses(0), r.losses(0), range(1, STEPS + 1))  # <= 1e-5 every step
    assert_close_tensors(read_weights(out), read_weights(rout), WEIGHT_TOL)
    assert_checkpoint_matches(out / "checkpoint-5", rout / "checkpoint-5", WEIGHT_TOL)  # weights and AdamW state
    assert layout in run.log(0), run.log(0)[-2000:]
    assert all("Traceback" not in run.log(n) for n in range(4))


@pytest.mark.parametrize("name", ["cp2_tp2", "cp2_pp2"])
def test_context_product_checkpoint_resumes_on_one_process(products, ref, corpus, tmp_path, name):
    cfg = write_config(tmp_path / "c.json", corpus, tmp_path / "out", overwrite_output_dir=False,
                       per_device_train_batch_size=8,
                       resume_from_checkpoint=str(products[name][1] / "checkpoint-5"))
    run = single(cfg, tmp_path / "log")
    assert run.returncode == 0, run.explain()
    assert "at step 5" in run.log(0)
    assert_close_losses(run.losses(0), ref[0].losses(0), range(6, STEPS + 1))
    assert_close_tensors(read_weights(tmp_path / "out"), read_weights(ref[1]), WEIGHT_TOL)


def test_cp2_tp2_sequence_parallel_with_documents_recompute_and_evaluation(corpus, tmp_path):
    """Sequence parallelism cuts each cp rank's chunks further over the tp pair; documents cross the chunks;
    recompute reruns the ring; evaluation counts the same tokens once."""
    ref = single(write_config(tmp_path / "r.json", corpus, tmp_path / "rout", per_device_train_batch_size=8, **DOC),
                 tmp_path / "rlog")
    assert ref.returncode == 0, ref.explain()
    run = launch_joined(write_config(tmp_path / "c.json", corpus, tmp_path / "out", sequence_parallel=True,
                                     **CP_TP, **DOC), tmp_path / "log", 4)
    assert run.returncode == 0, run.explain()
    assert "layout: tensor parallel + sequence parallel (distributed.tensor_parallel): tp 2 x cp 2" in run.log(0)
    assert_close_losses(run.losses(0), ref.losses(0), range(1, STEPS + 1))
    assert_close_tensors(read_weights(tmp_path / "out"), read_weights(tmp_path / "rout"), WEIGHT_TOL)
    got, want = evals(run), evals(ref)
    assert len(got) == len(want) == 2 and [t for _, t in got] == [t for _, t in want]
    assert all(abs(float(a) - float(b)) <= 1e-5 for (a, _), (b, _) in zip(got, want)), (got, want)
