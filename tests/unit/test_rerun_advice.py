"""The re-run advice of a watcher's line names what a re-run starts from: the newest published checkpoint-N of the
run's output_dir as it is when the line is written, or step 0 when it holds none (it said `checkpoint-N` literally,
true either way)."""
import signal

from pretrain_cli.distributed.launcher import rerun, verdict_line, watcher


def _line(tmp_path, out, me=1, culprit=1, kind="died", **output):
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    w = watcher.Watcher(me, {0: 10, 1: 11}, "h", shared, None, grace=1.0, output_dir=str(out), remote={2: "other"},
                        **output)
    return verdict_line.line(w, {"kind": kind, "ranks": [culprit], "statuses": [signal.SIGKILL]})


def test_the_newest_complete_checkpoint_is_named(tmp_path):
    out = tmp_path / "out"
    for name in ("checkpoint-20", "checkpoint-50", "checkpoint-100.tmp", "checkpoint-7"):
        (out / name).mkdir(parents=True)
    (out / "checkpoint-90").write_text("not a directory")
    line = _line(tmp_path, out)
    assert f"Re-run the same command (or launch with MAX_RESTART) to resume from {out / 'checkpoint-50'}, the newest " \
           f"complete checkpoint." in line, line
    assert "checkpoint-N" not in line
    peer = _line(tmp_path, out, me=0)  # a survivor's line
    assert f"for its cause; re-run to resume from {out / 'checkpoint-50'}, the newest complete checkpoint." in peer


def test_no_checkpoint_says_the_re_run_starts_from_step_0(tmp_path):
    for out in (tmp_path / "empty", tmp_path / "missing"):
        if out.name == "empty":
            (out / "checkpoint-10.tmp").mkdir(parents=True)  # a save cut short: no checkpoint
        line = _line(tmp_path, out, me=0, culprit=0, kind="lost")
        assert f"to start from step 0 ({out} holds no complete checkpoint)." in line, line
        assert "resume" not in line
    assert rerun.resumes(None) == "resume from the newest complete checkpoint of output_dir, if any"


def test_under_overwrite_the_advice_says_the_same_command_starts_at_step_0(tmp_path):
    """With overwrite_output_dir: true a re-run removes checkpoint-3 ('overwrite_output_dir: removed checkpoint-3'):
    the advice said 'to resume from out/checkpoint-3'."""
    out = tmp_path / "out"
    (out / "checkpoint-3").mkdir(parents=True)
    line = _line(tmp_path, out, overwrite=True)
    assert ("Re-run the same command (or launch with MAX_RESTART) to start again from step 0 (overwrite_output_dir: "
            f"true removes the earlier checkpoints); to continue instead, set resume_from_checkpoint to "
            f"{out / 'checkpoint-3'} (the newest complete checkpoint).") in line, line
    assert "to resume from" not in line


def test_an_explicit_resume_from_checkpoint_is_where_the_same_command_starts(tmp_path):
    out = tmp_path / "out"
    for name in ("checkpoint-3", "checkpoint-9"):
        (out / name).mkdir(parents=True)
    # resume_from_checkpoint wins over overwrite (`resumed.find_resume`); without it, beside the later checkpoint-9
    # the re-run is refused (`resumed.later_checkpoints`: `test_restart_line`)
    line = _line(tmp_path, out, overwrite=True, resume_from=str(out / "checkpoint-3"))
    assert (f"to resume from {out / 'checkpoint-3'}, the checkpoint resume_from_checkpoint names (to continue from "
            f"the newest complete one instead, set it to {out / 'checkpoint-9'}).") in line, line
    same = _line(tmp_path, out, resume_from=str(out / "checkpoint-9"))
    assert f"to resume from {out / 'checkpoint-9'}, the checkpoint resume_from_checkpoint names." in same, same


def test_a_stop_s_line_follows_the_same_judge():
    from types import SimpleNamespace

    from pretrain_cli.training.run_end import stop_message

    named = stop_message(SimpleNamespace(overwrite=False, output_dir="o", resume_from="o/checkpoint-3"), 7)
    assert named == ("stopped at step 7 and saved checkpoint-7; the same command resumes from o/checkpoint-3, which "
                     "resume_from_checkpoint names: to continue from here, set it to o/checkpoint-7")
    assert rerun.judge(True, "o/checkpoint-3") == rerun.NAMED and rerun.judge(True, None) == rerun.OVER


def test_one_judge_says_a_named_checkpoint_beside_later_ones_is_refused(tmp_path, monkeypatch):
    """`judge`'s REFUSED: resume_from_checkpoint names a checkpoint, overwrite_output_dir is off and output_dir holds
    checkpoints past its step (`orchestration.resumed.later_checkpoints` refuses that command). The stop's line and
    the watchers' advice each wrote that condition out themselves; both now follow the judge."""
    from types import SimpleNamespace

    from pretrain_cli.training.run_end import stop_message

    monkeypatch.delenv("PRETRAIN_CLI_RESTART", raising=False)
    out = tmp_path / "out"
    for name in ("checkpoint-3", "checkpoint-5"):
        (out / name).mkdir(parents=True)
    named = str(out / "checkpoint-3")
    assert rerun.judge(False, named, str(out)) == rerun.REFUSED
    assert rerun.judge(True, named, str(out)) == rerun.NAMED  # (the overwrite removes checkpoint-5)
    assert rerun.judge(False, str(out / "checkpoint-5"), str(out)) == rerun.NAMED
    assert rerun.judge(False, named) == rerun.NAMED and rerun.judge(False, None, str(out)) == rerun.NEWEST
    assert rerun.resumes(str(out), False, named).endswith(f"(as set, {named} is refused: {out} holds checkpoint-5 "
                                                          f"past its step)")
    assert stop_message(SimpleNamespace(overwrite=False, output_dir=str(out), resume_from=named), 5) == (
        f"stopped at step 5 and saved checkpoint-5; the same command is refused (resume_from_checkpoint names {named}, "
        f"and {out} holds checkpoint-5 past its step): to continue from here, set it to {out / 'checkpoint-5'}")
