"""After a usage error the first rank said itself, Paddle's launcher copies that rank's log to its end before it
finishes (`failure_report.install`), so the error's line is surely on the console. Paddle's `Container.logs` copies
at most 1000 lines a call (True while more may follow) and `Pod.logs` returns None: a loop on the pod copied 1000
lines once, and an error after a long log never reached the console."""
import types

from paddle.distributed.launch.controllers.controller import ControllerBase
from paddle.distributed.launch.job.container import Container

from pretrain_cli.distributed.launcher import failure_report, job


def test_the_first_ranks_log_is_copied_to_its_end_past_1000_lines(tmp_path, monkeypatch, capsys):
    log = tmp_path / "workerlog.0"
    log.write_text("".join(f"step {n}\n" for n in range(2500)) + "error: cfg.json: unknown key `learnig_rate`\n")
    rank0 = Container()
    rank0._log_handler, rank0._log_start_offset = open(log), 0  # as the launcher's copy opened it: nothing read yet
    finalized = []
    monkeypatch.setattr(ControllerBase, "finalize", lambda self, exit=True: finalized.append(exit))
    monkeypatch.setattr(Container, "tail", Container.tail)  # (restored after: install replaces both)
    monkeypatch.setattr(failure_report, "usage_ended", lambda: True)
    monkeypatch.setattr(job, "verdict_dir", lambda: tmp_path)
    monkeypatch.setattr(job, "wait_for_watchers", lambda directory: None)
    monkeypatch.setattr(job, "said_on_console", lambda directory: True)
    monkeypatch.setattr(failure_report.logging.getLogger("LAUNCH"), "filters", [])
    failure_report.install()
    pod = types.SimpleNamespace(join=lambda: None, containers=[rank0])
    try:
        ControllerBase.finalize(types.SimpleNamespace(pod=pod), exit=False)
    finally:
        rank0._log_handler.close()
    out = capsys.readouterr().out
    assert finalized == [False]  # Paddle's own finalize still runs after the copy
    assert out.count("\n") == 2501 and out.endswith("error: cfg.json: unknown key `learnig_rate`\n"), out[-200:]
