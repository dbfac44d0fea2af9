"""The re-run advice of a watcher's line names what a re-run starts from: the newest published checkpoint-N of the
run's output_dir as it is when the line is written, or step 0 when it holds none (it said `checkpoint-N` literally,
true either way)."""
import signal

from pretrain_cli.distributed.launcher import rerun, watcher


def _line(tmp_path, out, me=1, culprit=1, kind="died"):
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    w = watcher.Watcher(me, {0: 10, 1: 11}, "h", shared, None, grace=1.0, output_dir=str(out), remote={2: "other"})
    return w._line({"kind": kind, "ranks": [culprit], "statuses": [signal.SIGKILL]})


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
