"""What launch.sh says a MAX_RESTART restart starts from, and what it passes it: it said "resuming from the newest
checkpoint" when output_dir held none (the restart then starts from step 0), and the line above it, the failure's
account, said step 0 rightly (`distributed/launcher/rerun.py` judges both now). With resume_from_checkpoint set and a
checkpoint past it that the failed attempt wrote, the restart said "to resume from src/checkpoint-4" and was refused
(`orchestration.resumed.later_checkpoints`: exit 2, its own checkpoint-8 called another run's): it continues from the
newest. The user's arguments are read as the run reads them (`--resume_from_checkpoint null`, dashes)."""
import json
import os
import subprocess

from test_launch_script import SCRIPT, _flaky

from pretrain_cli.distributed.launcher import rerun

# a stand-in PYTHON: job.py's own calls run; the launcher's call is recorded, makes the directory MAKE_<n> names (what
# attempt n saved; REMAKE_<n>: saved in place of the one there) and exits with the n-th of CODES
FAKE = """#!/usr/bin/env bash
if [ "$1" = "-c" ]; then exit 1; fi
case "$1" in *job.py) if [ "$2" = "ports" ]; then shift 4; else exec python3 "$@"; fi;; esac
echo "$@" >> "$RECORD"
echo "${PRETRAIN_CLI_RESTART:-}|${PRETRAIN_CLI_AS_SET:-}" >> "$RECORD.env"  # what the ranks' watchers are told
n=$(wc -l < "$RECORD")
make=$(printenv "MAKE_$n" || true)
if [ -n "$make" ]; then mkdir -p "$make"; fi
remake=$(printenv "REMAKE_$n" || true)  # an overwrite's: the old one removed, its own published under the name
if [ -n "$remake" ]; then mkdir -p "$remake.tmp"; rm -rf "$remake"; mv "$remake.tmp" "$remake"; fi
code=$(echo "$CODES" | cut -d, -f"$n")
exit "${code:-0}"
"""


def _launch(tmp_path, *args, codes="1,0", **env):
    fake = tmp_path / "python"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    record = tmp_path / "calls.txt"
    record.unlink(missing_ok=True)
    (tmp_path / "calls.txt.env").unlink(missing_ok=True)
    e = {k: v for k, v in os.environ.items() if k not in ("NPROC", "MASTER", "LOG_DIR", "MAX_RESTART")}
    e.update(PYTHON=str(fake), RECORD=str(record), CODES=codes, MAX_RESTART="1", **env)
    out = subprocess.run(["bash", str(SCRIPT), "cfg.json", *args], env=e, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    return out, record.read_text().splitlines()


def _source(tmp_path, step=4):
    src = tmp_path / "src" / f"checkpoint-{step}"
    src.mkdir(parents=True)
    (src / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return "src/checkpoint-4"


def test_a_restart_says_step_0_when_output_dir_holds_no_checkpoint_and_the_checkpoint_when_it_does(tmp_path):
    (tmp_path / "cfg.json").write_text(json.dumps({"output_dir": "out"}))
    out, calls = _flaky(tmp_path, "1,0", "1")
    assert out.returncode == 0 and len(calls) == 2, out.stderr
    assert "restart 1 of 1, to start from step 0 (out holds no complete checkpoint)" in out.stderr, out.stderr
    assert "newest" not in out.stderr
    (tmp_path / "out" / "checkpoint-4").mkdir(parents=True)
    out, calls = _flaky(tmp_path, "1,0", "1")
    assert "restart 1 of 1, to resume from out/checkpoint-4, the newest complete checkpoint" in out.stderr, out.stderr


def test_a_restart_continues_from_the_checkpoint_its_job_wrote_past_the_named_one(tmp_path):
    named = _source(tmp_path)
    (tmp_path / "cfg.json").write_text(json.dumps({"output_dir": "out", "resume_from_checkpoint": named}))
    out, calls = _launch(tmp_path, MAKE_1=str(tmp_path / "out" / "checkpoint-8"))
    assert out.returncode == 0 and len(calls) == 2, out.stderr
    assert calls[1].endswith("cfg.json --overwrite_output_dir false --resume_from_checkpoint out/checkpoint-8")
    assert ("restart 1 of 1, to resume from out/checkpoint-8, the newest complete checkpoint (this job's own, past "
            "src/checkpoint-4, which resume_from_checkpoint names)") in out.stderr, out.stderr
    # nothing past it yet: the named one, passed as the user set it
    (tmp_path / "out" / "checkpoint-8").rmdir()
    out, calls = _launch(tmp_path)
    assert calls[1].endswith("cfg.json --overwrite_output_dir false"), calls
    assert "restart 1 of 1, to resume from src/checkpoint-4, the checkpoint resume_from_checkpoint names" in out.stderr


def test_a_later_checkpoint_output_dir_held_before_the_job_began_is_not_taken_for_its_own(tmp_path):
    named = _source(tmp_path)
    (tmp_path / "cfg.json").write_text(json.dumps({"output_dir": "out", "resume_from_checkpoint": named}))
    (tmp_path / "out" / "checkpoint-8").mkdir(parents=True)  # another run's (a first attempt failing before its check)
    out, calls = _launch(tmp_path, MAKE_1=str(tmp_path / "out" / "checkpoint-12"))
    assert calls[1].endswith("cfg.json --overwrite_output_dir false"), calls
    assert ("to resume from src/checkpoint-4, the checkpoint resume_from_checkpoint names, which is refused: out held "
            "checkpoint-8 past it before this job began (another run's)") in out.stderr, out.stderr


def test_under_overwrite_the_checkpoint_the_first_attempt_wrote_in_place_of_another_runs_is_its_own(tmp_path):
    """overwrite_output_dir: true removes another run's checkpoint-8 past the named checkpoint and the first attempt
    publishes its own checkpoint-8: by name it was taken for the other run's, and the restart refused (exit 2,
    advising the overwrite the user had set). The very directory held before the job began is still another run's,
    which the restart's overwrite removes."""
    named = _source(tmp_path)
    (tmp_path / "cfg.json").write_text(json.dumps({"output_dir": "out", "resume_from_checkpoint": named,
                                                   "overwrite_output_dir": True}))
    (tmp_path / "out" / "checkpoint-8").mkdir(parents=True)  # another run's
    out, calls = _launch(tmp_path, REMAKE_1=str(tmp_path / "out" / "checkpoint-8"))
    assert calls[1].endswith("cfg.json --overwrite_output_dir false --resume_from_checkpoint out/checkpoint-8"), calls
    assert ("restart 1 of 1, to resume from out/checkpoint-8, the newest complete checkpoint (this job's own, past "
            "src/checkpoint-4, which resume_from_checkpoint names)") in out.stderr, out.stderr
    # the first attempt failed before its overwrite: not this job's, so the restart keeps the user's overwrite, which
    # removes it (it was refused beside it: test_restart_overwrite)
    out, calls = _launch(tmp_path)
    assert calls[1].endswith("cfg.json"), calls
    assert "the overwrite removes checkpoint-8, which out held before this job began" in out.stderr, out.stderr


def test_the_users_arguments_are_read_as_the_run_reads_them(tmp_path):
    """`--resume_from_checkpoint null` is None to the CLI (it said "resume from null"); `--resume-from-checkpoint`
    is the key (it was not seen)."""
    named = _source(tmp_path)
    (tmp_path / "cfg.json").write_text(json.dumps({"output_dir": "out", "resume_from_checkpoint": named}))
    (tmp_path / "out" / "checkpoint-2").mkdir(parents=True)
    out, calls = _launch(tmp_path, "--resume_from_checkpoint", "null")
    assert "restart 1 of 1, to resume from out/checkpoint-2, the newest complete checkpoint" in out.stderr, out.stderr
    assert "null" not in out.stderr.replace("--resume_from_checkpoint null", "")
    (tmp_path / "cfg.json").write_text(json.dumps({"output_dir": "out"}))
    out, calls = _launch(tmp_path, "--resume-from-checkpoint", named, MAKE_1=str(tmp_path / "out" / "checkpoint-8"))
    assert calls[1].endswith("--overwrite_output_dir false --resume_from_checkpoint out/checkpoint-8"), calls
    assert "to resume from out/checkpoint-8, the newest complete checkpoint (this job's own" in out.stderr, out.stderr


def test_a_restarts_watchers_advise_re_running_the_users_own_command_not_launch_shs(tmp_path, monkeypatch):
    """A restart runs with launch.sh's `--overwrite_output_dir false --resume_from_checkpoint out/checkpoint-8`; its
    watchers' advice to re-run the same command said "as set, out/checkpoint-8 is refused", a value the user never
    set: launch.sh hands the restart the user's own settings (`rerun.as_set`), which the advice names."""
    import signal

    from pretrain_cli.distributed.launcher import verdict_line, watcher

    named = _source(tmp_path)
    (tmp_path / "cfg.json").write_text(json.dumps({"output_dir": "out", "resume_from_checkpoint": named}))
    out, calls = _launch(tmp_path, MAKE_1=str(tmp_path / "out" / "checkpoint-8"))
    own = json.dumps({"overwrite": False, "resume_from": named})
    assert (tmp_path / "calls.txt.env").read_text().splitlines() == ["0|", f"1|{own}"], out.stderr
    (tmp_path / "out" / "checkpoint-12").mkdir()  # the restart's own, then it died too
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRETRAIN_CLI_RESTART", "1")
    monkeypatch.setenv(rerun.AS_SET, own)
    (tmp_path / "shared").mkdir()
    w = watcher.Watcher(1, {0: 10, 1: 11}, "h", tmp_path / "shared", None, grace=1.0, output_dir="out",
                        resume_from="out/checkpoint-8")
    line = verdict_line.line(w, {"kind": "died", "ranks": [1], "statuses": [signal.SIGKILL]})
    assert ("Re-run the same command (or launch with MAX_RESTART) to resume from out/checkpoint-12, the newest "
            "complete checkpoint, with resume_from_checkpoint set to it (as set, src/checkpoint-4 is refused: out holds "
            "checkpoint-8, checkpoint-12 past its step).") in line, line
    monkeypatch.setenv(rerun.AS_SET, json.dumps({"overwrite": True, "resume_from": None}))  # the user's overwrite
    assert rerun.as_set("out", False, None) == ("out", True, None)
    monkeypatch.setenv("PRETRAIN_CLI_RESTART", "0")  # the first attempt: its own settings are the user's
    assert rerun.as_set("out", False, "x") == ("out", False, "x")


def test_the_watchers_advice_predicts_the_refusal_of_a_named_checkpoint_beside_later_ones(tmp_path):
    named = _source(tmp_path)
    out = tmp_path / "out"
    (out / "checkpoint-8").mkdir(parents=True)
    full = str(tmp_path / named)
    assert rerun.resumes(str(out), False, full) == (
        f"resume from {out / 'checkpoint-8'}, the newest complete checkpoint, with resume_from_checkpoint set to it "
        f"(as set, {full} is refused: {out} holds checkpoint-8 past its step)")
    # under overwrite the later ones are removed, and the named one is resumed (no refusal)
    assert rerun.resumes(str(out), True, full).startswith(f"resume from {full}, the checkpoint resume_from_checkpoint")
    (out / "checkpoint-8").rename(out / "checkpoint-3")  # an earlier one beside it: no refusal either
    assert rerun.resumes(str(out), False, full).startswith(f"resume from {full}, the checkpoint resume_from_checkpoint")
