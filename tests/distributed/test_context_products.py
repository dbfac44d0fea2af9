"""Context parallelism composed with tensor and pipeline parallelism: the layout steps tp -> cp and cp -> pp
(distributed/steps/order.py) through the real launcher, 4 processes each, against one process.

cp2 x tp2: each 32-token sequence cut into cp chunks (0+3, 1+2), each chunk's attention heads and MLP columns split
over the tp pair, the ring attention running on each rank's heads; cp2 x tp2 + sequence parallelism with ZeRO-2
over the cp ranks (fleet's sharding optimizer, the unowned gradients released after each update); cp2 x pp2 with
document masking, recompute and evaluation: the pipeline's 4 micro-batches of 2 fed to the stages as each rank's
chunks with their global positions. Each must follow the one-process curve step by step (<= 1e-5), end on its
weights and AdamW state, and its checkpoint must resume on one process on the same curve.
"""
from __future__ import annotations

import json

import pytest
from launch_helpers import (DOC, STEPS, assert_checkpoint_matches, assert_close_losses, assert_close_tensors, evals,
                            launch_joined, read_weights, single, write_config)

CP_TP = dict(context_parallel_degree=2, tensor_parallel_degree=2, per_device_train_batch_size=8)
# ZeRO-2 over the 2 cp ranks of each tp rank (fleet's sharding axis is sharding x cp), with sequence parallelism
CP_TP_SP_ZERO2 = dict(CP_TP, sequence_parallel=True, sharding="stage2")
CP_PP_DOC = dict(context_parallel_degree=2, pipeline_parallel_degree=2, gradient_accumulation_steps=4,
                 per_device_train_batch_size=2, **DOC)
WEIGHT_TOL = 2e-5  # the row-parallel and ring sums in another order than one process (test_layouts.py's WEIGHT_TOL)


@pytest.fixture(scope="module")
def products(corpus, tmp_path_factory, ref, doc_ref):
    """name -> (Run, output_dir, its one-process reference): each layout once, saving checkpoint-5."""
    out = {}
    for name, keys, reference in (("cp2_tp2", CP_TP, ref), ("cp2_tp2_sp_zero2", CP_TP_SP_ZERO2, ref),
                                  ("cp2_pp2_doc", CP_PP_DOC, doc_ref)):
        root = tmp_path_factory.mktemp(name)
        run = launch_joined(write_config(root / "c.json", corpus, root / "out", save_steps=5, **keys), root / "log", 4)
        assert run.returncode == 0, run.explain()
        out[name] = (run, root / "out", reference)
    return out


@pytest.mark.parametrize("name,layout", [
    ("cp2_tp2", "layout: tensor parallel (distributed.steps.tensor_parallel): dp 1, tp 2, cp 2;"),
    ("cp2_tp2_sp_zero2", "layout: tensor parallel (distributed.steps.tensor_parallel): dp 1, sharding stage2 x1, "
                         "tp 2 + sp, cp 2 (fleet's sharding group: sharding x cp, 2 ranks);"),
    ("cp2_pp2_doc", "layout: pipeline (fleet 1F1B): dp 1, cp 2, pp 2;"),
])
def test_context_with_tensor_or_pipeline_parallelism_matches_one_process(products, name, layout):
    run, out, (r, rout) = products[name]
    assert_close_losses(run.losses(0), r.losses(0), range(1, STEPS + 1))  # <= 1e-5 every step
    assert_close_tensors(read_weights(out), read_weights(rout), WEIGHT_TOL)
    assert_checkpoint_matches(out / "checkpoint-5", rout / "checkpoint-5", WEIGHT_TOL)  # weights and AdamW state
    assert layout in run.log(0), run.log(0)[-2000:]
    assert "head+loss=cpu" in run.log(0)  # each rank's own tokens through the fused head + loss (a whole head)
    assert all("Traceback" not in run.log(n) for n in range(4))
    got, want = evals(run), evals(r)  # (the document-masked pipeline evaluates: the same tokens, counted once)
    assert len(got) == len(want) and [t for _, t in got] == [t for _, t in want]
    assert all(abs(float(a) - float(b)) <= 1e-5 for (a, _), (b, _) in zip(got, want)), (got, want)
    if "zero2" in name:  # each rank keeps its owned gradients only between steps
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        held = [r for r in records if r["kind"] == "layout"][0]["per_rank"]
        assert all(0 < rank["gradients"] < 0.75 * rank["parameters"] for rank in held), held


@pytest.mark.parametrize("name", ["cp2_tp2", "cp2_pp2_doc"])
def test_context_product_checkpoint_resumes_on_one_process(products, corpus, tmp_path, name):
    _, saved, (r, rout) = products[name]
    keys = DOC if "doc" in name else {}
    cfg = write_config(tmp_path / "c.json", corpus, tmp_path / "out", overwrite_output_dir=False,
                       per_device_train_batch_size=8, resume_from_checkpoint=str(saved / "checkpoint-5"), **keys)
    run = single(cfg, tmp_path / "log")
    assert run.returncode == 0, run.explain()
    assert "at step 5" in run.log(0)
    assert_close_losses(run.losses(0), r.losses(0), range(6, STEPS + 1))
    assert_close_tensors(read_weights(tmp_path / "out"), read_weights(rout), WEIGHT_TOL)
