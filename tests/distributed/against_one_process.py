"""A layout launched against one process's run of the same global batch, and the checks that it trained the same:
every step's loss, logged loss terms, busiest-expert shares and gradient norm, the saved AdamW state and weights, and
a checkpoint resumed on another layout. Shared by the MoE / MTP layout tests (test_moe_context.py,
test_moe_context_pipeline.py, test_mtp_context.py, test_mtp_dense.py, test_mtp_experts.py); the launching, reading and
tolerances underneath are launch_helpers.py's.
"""
from __future__ import annotations

from pathlib import Path

from launch_helpers import (assert_close_losses, assert_close_tensors, expert_shares, launch_joined, logged,
                            read_checkpoint, read_weights, reference, resume_from, write_config)

WEIGHT_TOL = 5e-5  # AdamW on near-zero gradients (rare tokens' embedding rows), as test_expert_zero1_hybrid.py
GRAD_TOL = 1.01e-4  # the gradient norm is logged to 4 digits


def launch_layouts(layouts: dict, root: Path, corpus: Path, shared: Path, check: bool = True) -> dict:
    """Each of `layouts` {name: (model keys, processes, layout keys, one process's keys)} launched under `root` and
    its one-process reference (`launch_helpers.reference`, shared by the session); with `check`, every launch must
    have succeeded. Returns name -> ((one process's run, its output dir), (the launch, its output dir))."""
    out = {}
    for name, (model, nproc, layout, one) in layouts.items():
        ref = reference(shared, corpus, **model, **one)
        run = launch_joined(write_config(root / f"{name}.json", corpus, root / name, **model, **layout),
                            root / f"{name}_log", nproc)
        if check:
            assert run.returncode == 0, run.explain()
        out[name] = ref, (run, root / name)
    return out


def assert_steps_match(run, ref, steps: int, nproc: int, terms=(), shares: bool = True, grad_tol: float = GRAD_TOL,
                       relative: bool = False) -> list[str]:
    """No rank's log holds a traceback; rank 0 logged every step's loss and each of `terms` (`mtp_loss`,
    `aux_loss`, ...) as one process did, the busiest expert's share per sparse layer too (`shares`: equal as text,
    one a step), and the gradient norm within `grad_tol` (times max(1, the norm) when `relative`). Returns the
    shares one process logged."""
    assert all("Traceback" not in run.log(n) for n in range(nproc))
    assert_close_losses(run.losses(0), ref.losses(0), range(1, steps + 1))
    for term in terms:
        assert_close_losses(logged(run.log(0), term), logged(ref.log(0), term), range(1, steps + 1))
    want_shares = expert_shares(ref.log(0))
    if shares:
        assert expert_shares(run.log(0)) == want_shares and len(want_shares) == steps
    got, want = logged(run.log(0), "grad_norm"), logged(ref.log(0), "grad_norm")
    assert sorted(got) == sorted(want) == list(range(1, steps + 1))
    assert all(abs(got[s] - want[s]) <= grad_tol * (max(1.0, want[s]) if relative else 1.0) for s in want), (got, want)
    return want_shares


def assert_saved_state_matches(out: Path, rout: Path, checkpoint: str) -> tuple[dict, dict, dict]:
    """The launch's checkpoint `checkpoint` (assembled from every rank's pieces) holds one process's AdamW state
    and weights, and its final weights are one process's (within WEIGHT_TOL). Returns the checkpoint's (AdamW state,
    weights) and one process's weights there, for a test's own checks."""
    saved, expected = (read_checkpoint(d / checkpoint) for d in (out, rout))
    assert_close_tensors(saved, expected)
    weights, expected_weights = (read_checkpoint(d / checkpoint, "weights") for d in (out, rout))
    assert_close_tensors(weights, expected_weights, WEIGHT_TOL)
    assert_close_tensors(read_weights(out), read_weights(rout), WEIGHT_TOL)
    return saved, weights, expected_weights


def resume_on_another_layout(runs: dict, layouts: dict, saved: str, under: str, corpus: Path, tmp_path: Path,
                             checkpoint: str = "checkpoint-3"):
    """A layout's checkpoint resumed on one process (`under` "one"), or one process's on a layout (`saved` "one"),
    of the `launch_layouts` runs; its final weights must be one process's (within WEIGHT_TOL): the steps after the
    checkpoint updated them with the AdamW state and schedule it read. Returns (the resumed run, one process's run
    it continues)."""
    name = saved if under == "one" else under
    model, nproc, layout, one = layouts[name]
    (ref, rout), (_, out) = runs[name]
    nproc, over = (1, one) if under == "one" else (nproc, layout)
    run = resume_from((rout if saved == "one" else out) / checkpoint, corpus, tmp_path, nproc, **model, **over)
    assert_close_tensors(read_weights(tmp_path / "resumed"), read_weights(rout), WEIGHT_TOL)
    return run, ref
