"""kill -9 at many points, a full disk during a save, and a killed preprocess.

Each training scenario kills the reference run (micro-qwen2, 10 steps, checkpoints at 3/6/9 and at
the last step 10, two kept) at one precise point via fault_inject/sitecustomize.py, then re-runs the very same
command: it must resume from the newest complete checkpoint and finish with final weights
byte-identical to the uninterrupted reference run.
"""
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness import check_one_line_error, clone, run_cli

# name -> (PCLI_FAULT, checkpoint steps present after the kill, step the re-run resumes from (None: scratch))
SCENARIOS = {
    "forward_before_first_checkpoint": ("forward:3", [], None),
    "forward_mid_run": ("forward:14", [3, 6], 6),
    "optimizer_step": ("opt_step:5", [3], 3),
    "optimizer_step_right_after_save": ("opt_step:7", [3, 6], 6),
    "writing_weights": ("save_weights:2", [3], 3),
    "writing_optimizer_state": ("save_optimizer:3", [3, 6], 6),
    "before_publish_rename": ("publish:2", [3], 3),
    "during_rotation": ("rotate:1", [6, 9], 9),
    "writing_last_checkpoint": ("save_weights:4", [6, 9], 9),
    # killed after checkpoint-10 (the last step's) while writing the final model: the re-run trains no step
    "writing_final_weights": ("save_weights:5", [9, 10], 10),
    # killed drawing the final loss curve, its temporary `loss_curve.png.tmp<pid>` written: the re-run removes
    # it (`checkpoint.clean_leftovers`) and writes the export again
    "drawing_final_loss_curve": ("curve_rename:1", [9, 10], 10),
}
# async_save: true (both runs): killed while the background writer writes checkpoint-6 (training has gone on
# meanwhile); the re-run resumes from the previous complete checkpoint and ends byte-identical to the
# synchronous reference
ASYNC = ("--async_save", "true")
ASYNC_SCENARIOS = {
    "async_writing_weights": ("save_weights:2", [3], 3),
    "async_writing_optimizer_state": ("save_optimizer:2", [3], 3),
    "async_before_publish_rename": ("publish:3", [3, 6], 6),
}


def _complete(out):
    """Checkpoint steps under their final names; each must be complete (trainer_state.json present)."""
    steps = []
    for p in out.glob("checkpoint-*"):
        m = re.fullmatch(r"checkpoint-(\d+)", p.name)
        if m:
            assert (p / "trainer_state.json").is_file() and (p / "optimizer.safetensors").is_file(), p
            steps.append(int(m.group(1)))
    return sorted(steps)


def _finish_and_compare(d, reference, resumed_from, extra=()):
    p = run_cli(["train", "run.json", *extra], cwd=d)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    if resumed_from is None:
        assert "resumed from" not in p.stdout
    else:
        assert f"resumed from out/checkpoint-{resumed_from} at step {resumed_from}" in p.stdout
    out, ref = d / "out", reference / "out"
    assert (out / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    for step in (9, 10):
        for f in ("model.safetensors", "optimizer.safetensors"):
            assert (out / f"checkpoint-{step}" / f).read_bytes() == (ref / f"checkpoint-{step}" / f).read_bytes()
    assert not [x.name for x in out.iterdir() if x.name.endswith((".tmp", ".deleting")) or ".tmp" in x.name]


def _kill_and_resume(name, d, reference):
    fault, present, resumed_from = SCENARIOS.get(name) or ASYNC_SCENARIOS[name]
    extra = ASYNC if name in ASYNC_SCENARIOS else ()
    p = run_cli(["train", "run.json", *extra], cwd=d, faults=fault)
    assert p.returncode == -9, f"fault {fault} did not fire: rc {p.returncode}\n{p.stderr[-2000:]}"
    assert _complete(d / "out") == present
    if name == "writing_final_weights":
        assert not (d / "out" / "model.safetensors").exists()  # never half a file under the final name
    if name == "drawing_final_loss_curve":
        assert list((d / "out").glob("loss_curve.png.tmp*"))  # what the re-run must clean up
    if extra:
        assert "(async)" in p.stdout
    _finish_and_compare(d, reference, resumed_from, extra)


def _killed_twice(d, reference):
    """Two kills in a row at different points, then a clean re-run."""
    assert run_cli(["train", "run.json"], cwd=d, faults="save_optimizer:2").returncode == -9
    assert _complete(d / "out") == [3]
    p = run_cli(["train", "run.json"], cwd=d, faults="forward:9")  # resumed at 3: kill in step 8
    assert p.returncode == -9 and "resumed from out/checkpoint-3" in p.stdout
    assert _complete(d / "out") == [3, 6]
    _finish_and_compare(d, reference, 6)


@pytest.fixture(scope="module")
def outcomes(assets, reference, tmp_path_factory):
    """Every scenario (kill, then re-run) two at a time: most of a run is interpreter and Paddle start-up,
    which overlaps well. name -> None or the AssertionError the scenario raised."""
    root = tmp_path_factory.mktemp("faults")
    jobs = {name: (lambda n=name: _kill_and_resume(n, clone(assets, root / n), reference))
            for name in [*SCENARIOS, *ASYNC_SCENARIOS]}
    jobs["killed_twice"] = lambda: _killed_twice(clone(assets, root / "twice"), reference)

    def guard(fn):
        try:
            fn()
        except BaseException as e:  # re-raised by the test that owns the scenario
            return e
        return None

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {n: pool.submit(guard, fn) for n, fn in jobs.items()}
        return {n: f.result() for n, f in futures.items()}


@pytest.mark.parametrize("name", sorted(SCENARIOS) + sorted(ASYNC_SCENARIOS) + ["killed_twice"])
def test_kill_and_resume(name, outcomes):
    if outcomes[name] is not None:
        raise outcomes[name]


def test_disk_full_during_save(workdir, reference):
    """ENOSPC while writing checkpoint-6's optimizer state: one line, exit 1, checkpoint-3 intact."""
    out = workdir / "out"
    p = run_cli(["train", "run.json"], cwd=workdir, faults="enospc:2")
    check_one_line_error(p.returncode, p.stdout, p.stderr,
                         ["checkpoint-6.tmp/optimizer.safetensors", "No space left on device", "re-run"], code=1)
    assert _complete(out) == [3]
    assert not list(out.glob("checkpoint-*.tmp"))  # the partial directory is gone, and the space it took
    assert not (out / "model.safetensors").exists()  # the run did not go on as if the save had worked
    _finish_and_compare(workdir, reference, 3)  # resumes from checkpoint-3 and ends byte-identical


def test_disk_full_in_the_async_writer_surfaces_at_the_next_save(workdir, reference):
    """ENOSPC in the background writer of checkpoint-6: training went on, and the next save (step 9) reports
    it as the same one line, exit 1; checkpoint-3 intact, no partial directory; a re-run ends identical."""
    out = workdir / "out"
    p = run_cli(["train", "run.json", *ASYNC], cwd=workdir, faults="enospc:2")
    check_one_line_error(p.returncode, p.stdout, p.stderr,
                         ["checkpoint-6.tmp/optimizer.safetensors", "No space left on device", "re-run"], code=1)
    assert "checkpoint-9: stalled" not in p.stdout  # the failed write is reported before step 9's is queued
    assert _complete(out) == [3] and not list(out.glob("checkpoint-*.tmp"))
    assert not (out / "model.safetensors").exists()
    _finish_and_compare(workdir, reference, 3, ASYNC)


def test_disk_full_leaves_no_tmp_dir(workdir):
    p = run_cli(["train", "run.json"], cwd=workdir, faults="enospc_weights:2")
    assert p.returncode == 1
    assert not list((workdir / "out").glob("checkpoint-*.tmp"))


def test_preprocess_killed_midway(assets, workdir):
    """Killed after the first batch: nothing under the final names; a re-run completes, byte-identical."""
    argv = ["preprocess", "--input_path", "corpus.jsonl", "--output_prefix", "new/c", "--tokenizer", "tok",
            "--append_eos"]
    p = run_cli(argv, cwd=workdir, faults="preprocess_batch:1")
    assert p.returncode == -9
    # (c.lock: its flock died with the process; the re-run takes the file and removes it)
    assert sorted(x.name for x in (workdir / "new").iterdir()) == ["c.bin.tmp", "c.docs.tmp", "c.lock", "c.sizes.tmp"]
    p = run_cli(["inspect-data", "new/c"], cwd=workdir)
    check_one_line_error(p.returncode, p.stdout, p.stderr, ["new/c", "no token files"])
    p = run_cli(argv, cwd=workdir)
    assert p.returncode == 0, p.stderr
    for ext in (".bin", ".idx"):
        assert (workdir / "new" / f"c{ext}").read_bytes() == (assets / "data" / f"c{ext}").read_bytes()
    assert sorted(x.name for x in (workdir / "new").iterdir()) == ["c.bin", "c.idx", "c.json"]


def test_preprocess_killed_between_renames(assets, workdir):
    """Killed after c.bin is renamed but before c.idx: the .idx is the commit point, so readers see no pair,
    and an old pair under the same prefix is never mixed with the new .bin (its .idx is removed first)."""
    argv = ["preprocess", "--input_path", "corpus.jsonl", "--output_prefix", "data/c", "--tokenizer", "tok",
            "--append_eos"]
    (workdir / "corpus.jsonl").write_text((workdir / "corpus.jsonl").read_text().replace("alpha", "omega"))
    p = run_cli(argv, cwd=workdir, faults="preprocess_rename:1")
    assert p.returncode == -9
    assert not (workdir / "data" / "c.idx").exists()
    p = run_cli(["check", "run.json"], cwd=workdir)
    check_one_line_error(p.returncode, p.stdout, p.stderr, ["input_dir: data", "no .idx"])
    assert run_cli(argv, cwd=workdir).returncode == 0
    assert run_cli(["inspect-data", "data/c"], cwd=workdir).returncode == 0
