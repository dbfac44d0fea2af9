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


def test_the_restart_names_what_the_overwrite_removes_as_the_run_and_check_judge_it(tmp_path):
    """What overwrite_output_dir removes has one judge (`run_dir.checkpoints_past` from the step the run starts at),
    which the run's removal (`training.checkpoint.remove_past`), check's line (`orchestration.opened.overwritten`)
    and a restart's line (`rerun.restart`) all ask: the restart's line counted a checkpoint-0 that the removal keeps
    (it removes only the checkpoints past step 0), so it said the overwrite removes checkpoint-0."""
    from types import SimpleNamespace

    from pretrain_cli.distributed.launcher import rerun
    from pretrain_cli.orchestration.opened import overwritten
    from pretrain_cli.run_dir import checkpoints_past
    from pretrain_cli.training.checkpoint import remove_past

    _earlier_run(tmp_path, 0, 4, 8)
    out = tmp_path / "out"
    run = SimpleNamespace(loop=SimpleNamespace(do_train=True),
                          output=SimpleNamespace(output_dir=str(out), overwrite=True, logging_dir=None, report_to=()))
    for named, start in ((None, 0), (str(out / "checkpoint-4"), 4)):
        resume, line, keep = rerun.restart(str(out), named, rerun.identities(out), overwrite=True)
        removes = [p.name for p in checkpoints_past(out, start)]
        assert resume is None and keep, line
        assert line.endswith(f"the overwrite removes {', '.join(removes)}, which {out} held before this job began)"), \
            line
        assert f"past it ({', '.join(removes)})" in overwritten(run, start), overwritten(run, start)
    assert "checkpoint-0" not in rerun.restart(str(out), None, rerun.identities(out), overwrite=True)[1]
    removed = remove_past(out, 0)  # what the run does as it opens output_dir: the line's names, checkpoint-0 kept
    assert [p.name for p in removed] == ["checkpoint-4", "checkpoint-8"]
    assert [p.name for p in out.iterdir()] == ["checkpoint-0"]
