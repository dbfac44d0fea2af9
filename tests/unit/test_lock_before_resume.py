"""A second job started into a live run's output_dir (W2: two nodes on one machine under launch.sh, MASTER set, so
launch.sh's own `held` check is not asked): with another batch layout its rank 0 read the live run's checkpoint-50 and
blamed the batch (`gradient_accumulation_steps: checkpoint-50 was trained on 8 x acc 1 ...`, exit 2), where a matching
batch got the lock's `... is in use by another run (pid ...)` from `run`'s acquire. `prepare(..., lock=True)` (`train`,
`check`) judges the lock before anything reads a checkpoint there."""
from __future__ import annotations

import pytest

from data_helpers import write_tokens

from pretrain_cli.errors import UserError
from pretrain_cli.orchestration import resumed
from pretrain_cli.orchestration.prepare import prepare
from pretrain_cli.run_config import Target
from pretrain_cli.training import run_lock


class Read(Exception):
    """The resume's reading of output_dir's checkpoints began."""


def _args(tmp_path, out):
    return ["--model_name_or_path", "micro-qwen2", "--input_dir", write_tokens(tmp_path / "docs"), "--output_dir",
            str(out), "--do_train", "--max_steps", "2", "--device", "cpu", "--overwrite_output_dir", "false"]


def _reading(run):
    raise Read(run.output.output_dir)


def test_a_live_runs_output_dir_is_refused_before_its_checkpoints_are_read(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(resumed, "find_resume", _reading)
    live = run_lock.acquire(out)  # this process: a live run of this host
    try:
        with pytest.raises(UserError) as e:
            prepare(None, _args(tmp_path, out), Target("cpu", 1), lock=True)
        assert str(e.value) == run_lock.refusal(out)
        assert "is in use by another run (pid" in str(e.value)
        with pytest.raises(Read):  # `eval`, `inspect-data` (no lock asked) read as before
            prepare(None, _args(tmp_path, out), Target("cpu", 1))
    finally:
        live.release()
    with pytest.raises(Read):  # its run gone: the resume reads the checkpoints
        prepare(None, _args(tmp_path, out), Target("cpu", 1), lock=True)


def test_only_rank_0_judges_the_lock_its_own_rank_0_may_hold_already(tmp_path, monkeypatch):
    """Rank 1 of a launch reads no checkpoint before the join (rank 0's choice is taken then), and the lock it would
    find is its own rank 0's once that rank got going: not judged there."""
    out = tmp_path / "out"
    live = run_lock.acquire(out)
    try:
        spec = prepare(None, _args(tmp_path, out), Target("cpu", 2, rank=1, local_rank=1), lock=True)
        assert spec.resume is None
    finally:
        live.release()
