"""A watcher's line says one state of the host's background checkpoint writes: its words (`unsaved.clause`) and its
re-run advice (`unsaved.resume_advice`) each looked at the writes themselves, so rank 0 stopping between the two
looks made the line say "checkpoint-6 was not published ... (rank 0 may still publish it)" and then advise the one
checkpoint `rerun.resumes` found, or the other way round. `unsaved.states` is now looked at once per line."""
import os

from pretrain_cli.distributed.launcher import unsaved, verdict_line
from test_unsaved_write import _records, _watcher


def test_the_lines_words_and_its_rerun_advice_say_one_state_of_the_writes(tmp_path, monkeypatch):
    out = tmp_path / "out"
    (out / "checkpoint-3").mkdir(parents=True)
    w = _watcher(tmp_path, out, hang_timeout=10.0)  # its ranks: this process, running
    _records(w, {0: 6})
    cause = w._check_progress(os.open(os.devnull, os.O_WRONLY))
    looks = []

    def rank_0_stops_after_the_first_look(pids):
        looks.append(list(pids))
        return len(looks) > 1  # running at the first look, stopped (nothing can publish) from the second on

    monkeypatch.setattr(unsaved, "_quiet", rank_0_stops_after_the_first_look)
    line = verdict_line.line(w, cause)
    assert len(looks) == 1, looks
    assert "(rank 0 may still publish it)" in line, line
    assert f"re-run the same command: it resumes from the newest complete checkpoint ({out / 'checkpoint-6'} if " \
           f"rank 0 publishes it, else {out / 'checkpoint-3'})." in line, line
