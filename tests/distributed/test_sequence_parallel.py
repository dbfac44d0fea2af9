"""Sequence parallelism with tensor parallelism (distributed/steps/sequence_parallel.py) through the real launcher.

TP2 + SP on 2 processes (engine "tensor_parallel"): micro-qwen2, every rank the whole global batch of 8, the norms
and residual stream cut on the sequence over the two tp ranks. One launch with document masking, recompute and
evaluation (`DOC`) must follow the one-process curve step by step (<= 1e-5; conftest's `doc_ref`), write the same
tp slices as TP does, and its checkpoint must resume on one process on the same curve (and one process's under
TP2 + SP). TP2 x PP2 + SP on 4 processes runs the same hooks inside fleet's pipeline stages; the causal mask under
SP: TP2 + SP x 2 data ranks with ZeRO-1 (the last test) and cp2 x tp2 + SP (test_context_products.py).
"""
from __future__ import annotations

import json

import pytest
from launch_helpers import (DOC, STEPS, assert_checkpoint_matches, assert_close_losses, assert_close_tensors, evals,
                            launch_joined, read_weights, single, write_config)

SP = dict(tensor_parallel_degree=2, sequence_parallel=True, per_device_train_batch_size=8)
TP_PP_SP = dict(pipeline_parallel_degree=2, tensor_parallel_degree=2, sequence_parallel=True,
                gradient_accumulation_steps=4, per_device_train_batch_size=2)
WEIGHT_TOL = 2e-5  # the row-parallel sums in another order than one process (test_layouts.py's WEIGHT_TOL)


@pytest.fixture(scope="module")
def tp_sp(corpus, tmp_path_factory):
    """TP2 + SP with document masking, recompute and evaluation (`DOC`), saving checkpoint-5."""
    root = tmp_path_factory.mktemp("tp2_sp")
    run = launch_joined(write_config(root / "c.json", corpus, root / "out", save_steps=5, **SP, **DOC), root / "log",
                        2)
    assert run.returncode == 0, run.explain()
    return run, root / "out"


def test_tp2_sp_matches_one_process_step_by_step(tp_sp, doc_ref):
    """Document masking (RoPE positions restarting per document, attention within documents), recompute and
    evaluation through the sequence-parallel layers: the same curve, weights and evaluation as one process."""
    (run, out), (r, rout) = tp_sp, doc_ref
    assert_close_losses(run.losses(0), r.losses(0), range(1, STEPS + 1))  # <= 1e-5 every step
    assert_close_tensors(read_weights(out), read_weights(rout), WEIGHT_TOL)
    got, want = evals(run), evals(r)
    assert len(got) == len(want) == 2 and [t for _, t in got] == [t for _, t in want]
    assert all(abs(float(a) - float(b)) <= 1e-5 for (a, _), (b, _) in zip(got, want)), (got, want)
    assert "layout: tensor parallel (distributed.steps.tensor_parallel): dp 1, tp 2 + sp" in run.log(0)
    assert "attention_mask_type = \"document\"" in run.log(0) and "recompute full" in run.log(0)
    # the final norm's output is gathered whole on each tp rank, the head whole: the fused head + loss reads them
    assert "head+loss=cpu" in run.log(0)
    assert all("Traceback" not in run.log(n) for n in range(2))


def test_tp2_sp_writes_the_tp_slices(tp_sp, doc_ref):
    """Each rank writes its tp slices (the same pieces as TP inside a pipeline stage) and whole tensors once; the
    pieces assemble to the one-process checkpoint's tensors, weights and AdamW state alike."""
    out, rout = tp_sp[1], doc_ref[1]
    ckpt = out / "checkpoint-5"
    assert_checkpoint_matches(ckpt, rout / "checkpoint-5", WEIGHT_TOL)
    index = json.loads((ckpt / "checkpoint.index.json").read_text())
    q = index["tensors"]["model.layers.0.self_attn.q_proj.weight"]  # HF [out, in]: split on out (rows)
    assert sorted(tuple(p["offsets"]) for p in q["pieces"]) == [(0, 0), (q["shape"][0] // 2, 0)]
    norm = index["tensors"]["model.layers.0.input_layernorm.weight"]  # whole, written once
    assert [tuple(p["offsets"]) for p in norm["pieces"]] == [(0,)]


def test_checkpoint_resumes_across_sp_and_one_process(tp_sp, doc_ref, corpus, tmp_path):
    """TP2 + SP's checkpoint-5 on one process: the same curve from step 6 (with `DOC`, as the run that saved it).
    One process's checkpoint on TP2 + SP: test_sp_with_zero1_over_two_data_ranks resumes from it."""
    ref = doc_ref
    cfg = write_config(tmp_path / "c.json", corpus, tmp_path / "out", overwrite_output_dir=False,
                       resume_from_checkpoint=str(tp_sp[1] / "checkpoint-5"), per_device_train_batch_size=8, **DOC)
    run = single(cfg, tmp_path / "log")
    assert run.returncode == 0, run.explain()
    assert "resumed from" in run.log(0) and "at step 5" in run.log(0)
    assert_close_losses(run.losses(0), ref[0].losses(0), range(6, STEPS + 1))
    assert_close_tensors(read_weights(tmp_path / "out"), read_weights(ref[1]), WEIGHT_TOL)


@pytest.mark.parametrize("nproc,keys", [(4, TP_PP_SP)], ids=["tp2_pp2_sp"])
def test_sp_with_documents_recompute_and_evaluation(corpus, tmp_path, doc_ref, nproc, keys):
    """Document masking, recompute and evaluation through the sequence-parallel layers inside fleet's two stages
    (the cut stream sent between them): the same curve, weights and evaluation as one process. (On one stage:
    test_tp2_sp_matches_one_process_step_by_step.)"""
    ref, rout = doc_ref
    run = launch_joined(write_config(tmp_path / "c.json", corpus, tmp_path / "out", **keys, **DOC), tmp_path / "log",
                        nproc)
    assert run.returncode == 0, run.explain()
    assert_close_losses(run.losses(0), ref.losses(0), range(1, STEPS + 1))
    assert_close_tensors(read_weights(tmp_path / "out"), read_weights(rout), WEIGHT_TOL)
    got, want = evals(run), evals(ref)
    assert len(got) == len(want) == 2 and [t for _, t in got] == [t for _, t in want]
    assert all(abs(float(a) - float(b)) <= 1e-5 for (a, _), (b, _) in zip(got, want)), (got, want)
    assert "layout: pipeline (fleet 1F1B): dp 1, tp 2 + sp, pp 2" in run.log(0)


def test_sp_with_zero1_over_two_data_ranks(corpus, tmp_path, ref):
    """Two data ranks of two tp ranks each (per-device batch 4: the same global batch of 8), ZeRO-1 over them:
    the norms' gradients summed over each tp group, then reduced to each owner over the data ranks. Resumed from
    one process's checkpoint-5 (each rank its TP slice and its ZeRO-1 share of the AdamW state), which proves that
    resume too: the same curve from step 6."""
    cfg = write_config(tmp_path / "c.json", corpus, tmp_path / "out", tensor_parallel_degree=2, sequence_parallel=True,
                       per_device_train_batch_size=4, sharding="stage1", overwrite_output_dir=False,
                       resume_from_checkpoint=str(ref[1] / "checkpoint-5"))
    run = launch_joined(cfg, tmp_path / "log", 4)
    assert run.returncode == 0, run.explain()
    assert "resumed from" in run.log(0) and "at step 5" in run.log(0)
    assert_close_losses(run.losses(0), ref[0].losses(0), range(6, STEPS + 1))
    assert_close_tensors(read_weights(tmp_path / "out"), read_weights(ref[1]), WEIGHT_TOL)
    assert ("layout: tensor parallel (distributed.steps.tensor_parallel): dp 1, sharding stage1 x2, tp 2 + sp"
            in run.log(0))
