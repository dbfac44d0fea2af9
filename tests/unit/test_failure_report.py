"""After a usage error the first rank said itself, Paddle's launcher copies that rank's log to its end before it
finishes (`failure_report.install`), so the error's line is surely on the console however long the log: the copy goes
on from where the launcher's own copy stopped, past `Container.logs`' 1000 lines a call, and also after the launcher's
`Pod.stop` has closed the log it copies from (`Container.terminate`), which it does at every failure before `finalize`.
"""
import types

from paddle.distributed.launch.controllers.controller import ControllerBase
from paddle.distributed.launch.job.container import Container

from pretrain_cli.distributed.launcher import failure_report, job

ERROR = "error: cfg.json: unknown key `learnig_rate`\n"


def _finalize(tmp_path, monkeypatch, stopped: bool):
    """Paddle's failure path on a first rank whose log holds 2500 lines and the error: the watch loop's last copy
    (`Pod.logs`: 1000 lines), then, when `stopped`, `Pod.stop`'s terminate, then finalize; (what finalize still ran,
    the log's lines on stdout after the watch loop's copy)."""
    log = tmp_path / "workerlog.0"
    log.write_text("".join(f"step {n}\n" for n in range(2500)) + ERROR)
    rank0 = Container()
    rank0.outfile = str(log)
    rank0._log_handler, rank0._log_start_offset = open(log), 0  # as Container.start opens it: nothing read yet
    finalized = []
    monkeypatch.setattr(ControllerBase, "finalize", lambda self, exit=True: finalized.append(exit))
    for name in ("tail", "terminate"):  # (restored after: install replaces them)
        monkeypatch.setattr(Container, name, getattr(Container, name))
    monkeypatch.setattr(failure_report, "usage_ended", lambda: True)
    monkeypatch.setattr(job, "verdict_dir", lambda: tmp_path)
    monkeypatch.setattr(job, "wait_for_watchers", lambda directory: None)
    monkeypatch.setattr(job, "said_on_console", lambda directory: True)
    monkeypatch.setattr(failure_report.logging.getLogger("LAUNCH"), "filters", [])
    failure_report.install()
    pod = types.SimpleNamespace(join=lambda: None, containers=[rank0])
    copied = []
    try:
        rank0.logs(fn=types.SimpleNamespace(write=copied.append))  # the watch loop's copy, not to stdout
        assert len(copied) == 1000
        if stopped:
            rank0.terminate()  # Pod.stop's: no process here (`_proc` None); the log it copies from is closed
            assert rank0._log_handler is None
        ControllerBase.finalize(types.SimpleNamespace(pod=pod), exit=False)
    finally:
        if rank0._log_handler is not None:
            rank0._log_handler.close()
    return finalized


def test_after_the_launcher_stopped_the_ranks_the_first_ranks_log_is_copied_on_to_its_end(tmp_path, monkeypatch,
                                                                                           capsys):
    finalized = _finalize(tmp_path, monkeypatch, stopped=True)
    out = capsys.readouterr().out
    assert finalized == [False]  # Paddle's own finalize still runs after the copy
    assert out.count("\n") == 1501 and out.startswith("step 1000\n") and out.endswith(ERROR), out[-200:]


def test_a_log_still_open_is_copied_on_past_1000_lines(tmp_path, monkeypatch, capsys):
    finalized = _finalize(tmp_path, monkeypatch, stopped=False)
    out = capsys.readouterr().out
    assert finalized == [False]
    assert out.count("\n") == 1501 and out.startswith("step 1000\n") and out.endswith(ERROR), out[-200:]
