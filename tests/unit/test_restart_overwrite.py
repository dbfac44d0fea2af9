"""A MAX_RESTART restart of a run with overwrite_output_dir: true continues as its first attempt would have: from the
checkpoint this job wrote, if it wrote one, else it starts over with the overwrite. launch.sh passed every restart
`--overwrite_output_dir false`, so a first attempt that failed before its overwrite had removed the earlier run's
checkpoints left its restart beside them: with resume_from_checkpoint set it was refused
(`orchestration.resumed.later_checkpoints`, exit 2, "another run's"), without it the restart resumed the earlier run's
newest checkpoint, another run's training, as if it were this job's (`distributed/launcher/rerun.restart`)."""
import json
import os
import subprocess

from test_launch_script import SCRIPT
from test_restart_line import FAKE, _source

# test_restart_line's stand-in launcher, which also removes what RM_<n> names at call n (an overwrite done)
FAKE_RM = FAKE.replace('make=$(printenv "MAKE_$n" || true)',
                       'rm=$(printenv "RM_$n" || true)\nif [ -n "$rm" ]; then rm -rf $rm; fi\n'
                       'make=$(printenv "MAKE_$n" || true)')


def _launch(tmp_path, codes="1,0", max_restart="1", **env):
    fake = tmp_path / "python"
    fake.write_text(FAKE_RM)
    fake.chmod(0o755)
    record = tmp_path / "calls.txt"
    record.unlink(missing_ok=True)
    (tmp_path / "calls.txt.env").unlink(missing_ok=True)
    e = {k: v for k, v in os.environ.items() if k not in ("NPROC", "MASTER", "LOG_DIR", "MAX_RESTART")}
    e.update(PYTHON=str(fake), RECORD=str(record), CODES=codes, MAX_RESTART=max_restart, **env)
    out = subprocess.run(["bash", str(SCRIPT), "cfg.json"], env=e, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    return out, record.read_text().splitlines()


def _earlier_run(tmp_path, *steps):
    for step in steps:
        (tmp_path / "out" / f"checkpoint-{step}").mkdir(parents=True)


def test_a_named_resume_under_overwrite_whose_first_attempt_died_before_the_overwrite_is_restarted_not_refused(
        tmp_path):
    """The first attempt died before it removed the earlier run's checkpoint-8 (past the named checkpoint-4): the
    restart runs the user's command as typed (overwrite_output_dir: true), which resumes the named checkpoint and
    removes checkpoint-8; it was passed `--overwrite_output_dir false` and refused beside checkpoint-8."""
    named = _source(tmp_path)
    (tmp_path / "cfg.json").write_text(json.dumps({"output_dir": "out", "resume_from_checkpoint": named,
                                                   "overwrite_output_dir": True}))
    _earlier_run(tmp_path, 8)
    out, calls = _launch(tmp_path)
    assert out.returncode == 0 and len(calls) == 2, out.stderr
    assert calls[1].endswith("run_pretrain.py cfg.json"), calls  # the user's command, its overwrite kept
    assert ("restart 1 of 1, to resume from src/checkpoint-4, the checkpoint resume_from_checkpoint names, with "
            "overwrite_output_dir: true as the first attempt (this job has written no checkpoint past it; the "
            "overwrite removes checkpoint-8, which out held before this job began)") in out.stderr, out.stderr
    assert "refused" not in out.stderr


def test_an_overwrite_whose_first_attempt_died_before_it_is_restarted_from_step_0_not_from_the_earlier_run(tmp_path):
    """Without resume_from_checkpoint the restart resumed out/checkpoint-8, the earlier run's, which the first attempt
    was to remove: it now starts over with the overwrite, as the first attempt did."""
    (tmp_path / "cfg.json").write_text(json.dumps({"output_dir": "out", "overwrite_output_dir": True}))
    _earlier_run(tmp_path, 4, 8)
    out, calls = _launch(tmp_path)
    assert out.returncode == 0 and len(calls) == 2, out.stderr
    assert calls[1].endswith("run_pretrain.py cfg.json"), calls
    assert ("restart 1 of 1, to start again from step 0, with overwrite_output_dir: true as the first attempt (this "
            "job has written no checkpoint; the overwrite removes checkpoint-4, checkpoint-8, which out held before "
            "this job began)") in out.stderr, out.stderr
    assert "out/checkpoint-8" not in out.stderr
    # the overwrite done, nothing saved yet: still from step 0 with the overwrite (nothing left for it to remove)
    out, calls = _launch(tmp_path, RM_1=f"{tmp_path}/out/checkpoint-4 {tmp_path}/out/checkpoint-8")
    assert calls[1].endswith("run_pretrain.py cfg.json"), calls
    assert ("restart 1 of 1, to start again from step 0, with overwrite_output_dir: true as the first attempt (this "
            "job has written no checkpoint)") in out.stderr, out.stderr


def test_an_overwrite_that_saved_a_checkpoint_of_its_own_is_resumed_from_it(tmp_path):
    """The first attempt removed the earlier run's checkpoints and saved checkpoint-3: the restart resumes it
    (`--overwrite_output_dir false`), as before; a second restart after a restart that started over does too."""
    (tmp_path / "cfg.json").write_text(json.dumps({"output_dir": "out", "overwrite_output_dir": True}))
    _earlier_run(tmp_path, 8)
    out, calls = _launch(tmp_path, RM_1=f"{tmp_path}/out/checkpoint-8", MAKE_1=str(tmp_path / "out" / "checkpoint-3"))
    assert calls[1].endswith("run_pretrain.py cfg.json --overwrite_output_dir false"), calls
    assert "restart 1 of 1, to resume from out/checkpoint-3, the newest complete checkpoint" in out.stderr, out.stderr
    # the first attempt died before its overwrite; the restart (overwrite kept) removed checkpoint-8, saved
    # checkpoint-3 and died too: the second restart resumes that one
    for p in (tmp_path / "out").iterdir():
        p.rmdir()
    _earlier_run(tmp_path, 8)
    out, calls = _launch(tmp_path, codes="1,1,0", max_restart="2", RM_2=f"{tmp_path}/out/checkpoint-8",
                         MAKE_2=str(tmp_path / "out" / "checkpoint-3"))
    assert out.returncode == 0 and len(calls) == 3, out.stderr
    assert calls[1].endswith("run_pretrain.py cfg.json") and calls[2].endswith("--overwrite_output_dir false"), calls
    assert "restart 2 of 2, to resume from out/checkpoint-3, the newest complete checkpoint" in out.stderr, out.stderr


def test_without_overwrite_a_restart_still_passes_overwrite_false(tmp_path):
    """The user's overwrite_output_dir false (or unset): nothing changes, every restart resumes."""
    (tmp_path / "cfg.json").write_text(json.dumps({"output_dir": "out"}))
    _earlier_run(tmp_path, 8)
    out, calls = _launch(tmp_path)
    assert calls[1].endswith("run_pretrain.py cfg.json --overwrite_output_dir false"), calls
    assert "restart 1 of 1, to resume from out/checkpoint-8, the newest complete checkpoint" in out.stderr, out.stderr
