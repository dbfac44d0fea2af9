"""A stop's line (`training.run_end.stop_message`) says what re-running the user's own command does. Under a launch.sh
MAX_RESTART restart the run carries launch.sh's `--overwrite_output_dir false` and perhaps its
`--resume_from_checkpoint out/checkpoint-8`: a stop there said "the same command resumes from out/checkpoint-8, which
resume_from_checkpoint names", a value the user never set, or, under the user's overwrite_output_dir: true, "re-run the
same command to resume", whose re-run starts again from step 0. It now reads the user's settings as the watchers do
(`distributed.launcher.rerun.as_set`), and predicts the refusal of a named checkpoint beside later ones
(`orchestration.resumed.later_checkpoints`), as their advice does (`rerun.resumes`)."""
import json
from types import SimpleNamespace

from pretrain_cli.distributed.launcher import rerun
from pretrain_cli.training.run_end import stop_message


def _restart(monkeypatch, overwrite=False, resume_from=None):
    monkeypatch.setenv("PRETRAIN_CLI_RESTART", "1")
    monkeypatch.setenv(rerun.AS_SET, json.dumps({"overwrite": overwrite, "resume_from": resume_from}))


def _dirs(tmp_path, *names):
    for name in names:
        (tmp_path / name).mkdir(parents=True)


def test_a_stop_in_a_restart_names_the_users_checkpoint_not_launch_shs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _dirs(tmp_path, "src/checkpoint-4", "out/checkpoint-8", "out/checkpoint-12")
    _restart(monkeypatch, resume_from="src/checkpoint-4")
    # launch.sh's restart resumed out/checkpoint-8 (the job's own, past the named one) and stopped at step 12
    line = stop_message(SimpleNamespace(overwrite=False, output_dir="out", resume_from="out/checkpoint-8"), 12)
    assert line == ("stopped at step 12 and saved checkpoint-12; the same command is refused (resume_from_checkpoint "
                    "names src/checkpoint-4, and out holds checkpoint-8, checkpoint-12 past its step): to continue "
                    "from here, set it to out/checkpoint-12"), line
    assert "resumes from out/checkpoint-8" not in line


def test_a_stop_in_a_restart_of_an_overwrite_says_the_same_command_starts_again(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _dirs(tmp_path, "out/checkpoint-3", "out/checkpoint-6")
    _restart(monkeypatch, overwrite=True)
    line = stop_message(SimpleNamespace(overwrite=False, output_dir="out", resume_from=None), 6)
    assert line == ("stopped at step 6 and saved checkpoint-6; with overwrite_output_dir: true the same command starts "
                    "again from step 0: to continue, set resume_from_checkpoint to out/checkpoint-6"), line
    # the user named a checkpoint under overwrite: the same command resumes it (and removes the later ones)
    _restart(monkeypatch, overwrite=True, resume_from="out/checkpoint-3")
    line = stop_message(SimpleNamespace(overwrite=False, output_dir="out", resume_from="out/checkpoint-3"), 6)
    assert line.startswith("stopped at step 6 and saved checkpoint-6; the same command resumes from out/checkpoint-3, "
                           "which resume_from_checkpoint names: to continue from here, set it to out/checkpoint-6"), line


def test_a_first_attempts_stop_beside_a_later_checkpoint_says_the_named_one_is_refused(tmp_path, monkeypatch):
    """Not only under a restart: a run resumed from a named checkpoint that stops and saves a later one is refused on
    the same command (`later_checkpoints`); the line said that command resumes the named one."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PRETRAIN_CLI_RESTART", raising=False)
    _dirs(tmp_path, "out/checkpoint-4", "out/checkpoint-7")
    line = stop_message(SimpleNamespace(overwrite=False, output_dir="out", resume_from="out/checkpoint-4"), 7)
    assert line == ("stopped at step 7 and saved checkpoint-7; the same command is refused (resume_from_checkpoint "
                    "names out/checkpoint-4, and out holds checkpoint-7 past its step): to continue from here, set it "
                    "to out/checkpoint-7"), line
    # the plain cases are as they were
    assert stop_message(SimpleNamespace(overwrite=False, output_dir="out", resume_from=None), 7) == (
        "stopped at step 7 and saved; re-run the same command to resume from checkpoint-7")
