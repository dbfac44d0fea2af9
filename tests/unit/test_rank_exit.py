"""The ranks leave a stop together (`training.rank_exit`): no rank returns before every rank has stopped its watcher,
which takes any exit of a rank of its host for a death and SIGKILLs its own rank (rank 0 was killed so before its
`finally` released the run lock). Rank-0 rounds over a fake TCP store, ranks as threads, no process group."""
import threading
import time

import pytest

from pretrain_cli.distributed.comms.comm import Comm, NoComm
from pretrain_cli.training import rank_exit
from fake_store import FakeStore


class FakeWatchdog:
    """`watchdog` for `rank_exit`: each rank's `stop` noted in `events`; the slow rank's only after a while."""

    def __init__(self, events: list, slow: int):
        self.events, self.slow, self.rank = events, slow, threading.local()

    def stop(self):
        if getattr(self.rank, "value", 0) == self.slow:
            time.sleep(0.3)  # (descheduled, or just slower to get here: the other ranks are past their stop by now)
        self.events.append(("stopped", getattr(self.rank, "value", 0)))


def test_no_rank_leaves_before_every_rank_has_stopped_its_watcher(monkeypatch):
    store, events, errors = FakeStore(), [], []
    fake = FakeWatchdog(events, slow=2)
    monkeypatch.setattr(rank_exit, "watchdog", fake)
    comms = [Comm(rank, 3) for rank in range(3)]
    for c in comms:
        c._store = lambda: store

    def rank(c):
        fake.rank.value = c.rank
        try:
            rank_exit.leave_together(c)
            events.append(("left", c.rank))
        except Exception as e:  # (raised in the thread: reported by the assertion below)
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(c,)) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    kinds = [kind for kind, _ in events]
    assert sorted(events) == [("left", 0), ("left", 1), ("left", 2), ("stopped", 0), ("stopped", 1), ("stopped", 2)]
    assert kinds == ["stopped"] * 3 + ["left"] * 3, events  # the slow rank's stop before any rank left
    # rank 0 stayed until both other ranks had seen each round (its process hosts the store)
    assert store.values["pretrain_cli/save/1/seen"] == 2 and store.values["pretrain_cli/save/2/seen"] == 2


def test_one_process_stops_its_watcher_and_leaves(monkeypatch):
    events = []
    monkeypatch.setattr(rank_exit, "watchdog", FakeWatchdog(events, slow=-1))
    rank_exit.leave_together(NoComm())
    assert events == [("stopped", 0)]


class Recorder:
    """`watchdog` for `rank_exit.leave`: what each kind of end did."""

    def __init__(self):
        self.calls = []

    def stop(self):
        self.calls.append(("stop",))

    def leave_alone(self, line):
        self.calls.append(("leave_alone", line))


def test_each_kind_of_end_leaves_its_one_way(monkeypatch):
    fake = Recorder()
    monkeypatch.setattr(rank_exit, "watchdog", fake)
    rank_exit.leave(NoComm(), rank_exit.End.AGREED)  # together: the watcher stopped, then rank 0's rounds
    rank_exit.leave(NoComm(), rank_exit.End.DONE)
    rank_exit.leave(NoComm(), rank_exit.End.ALONE, ValueError("rank 1: its file is missing\nsecond line"))
    assert fake.calls == [("stop",), ("stop",), ("leave_alone", "rank 1: its file is missing")]
    with pytest.raises(TypeError, match="kind must be an End, not 'done'"):
        rank_exit.leave(NoComm(), "done")  # a string is no kind: loud, not taken for DONE
    assert len(fake.calls) == 3


def _finish_ending_with(monkeypatch, train, lost_nodes=()):
    """`run_end.finish` on one rank whose loop ends by `train()` (a result or an error): the kind of end it left by,
    what it raised (`lost_nodes`: the ranks whose launcher died, as the loop read them at its stop)."""
    from types import SimpleNamespace as NS

    from pretrain_cli.training import run_end

    ends = []
    monkeypatch.setattr(rank_exit, "leave", lambda comm, kind, error=None: ends.append((kind, type(error).__name__)))
    r = NS(loop=NS(do_train=True, max_steps=5, do_eval=False, do_predict=False),
           output=NS(overwrite=False, output_dir="out", resume_from=None), parallel=NS(rank=0, is_rank0=True))
    trainer = NS(state=NS(global_step=2, train_seconds=1.0, consumed_samples=8, tokens_seen=64, loss_sum=1.0,
                          interval_loss=0.0, skipped_steps=0),
                 train=train, throughput=NS(tokens_this_launch=64), process_seconds=1.0, loop=r.loop, seq_len=8,
                 record_closing=lambda values: None, lost_nodes=list(lost_nodes))
    collaborators = NS(saver=NS(wait=lambda: None, abandon=lambda error: None), close=lambda: None)
    try:
        out = run_end.finish(r, trainer, NoComm(), collaborators)
    except Exception as e:  # noqa: BLE001 - what the end raised, for the assertion
        out = e
    return ends, out


def _raises(e):
    def train():
        raise e
    return train


def test_run_end_names_the_kind_of_each_end_once(monkeypatch):
    from pretrain_cli.errors import PeerFailed, UserError
    from pretrain_cli.training.trainer_state import NonFiniteError

    ends, out = _finish_ending_with(monkeypatch, lambda: {"stopped_by_signal": True})
    assert ends == [(rank_exit.End.AGREED, "NoneType")] and out is None
    ends, out = _finish_ending_with(monkeypatch, _raises(NonFiniteError("step 3: loss nan")))
    assert ends == [(rank_exit.End.AGREED, "UserError")] and str(out) == "step 3: loss nan"
    ends, out = _finish_ending_with(monkeypatch, _raises(PeerFailed("rank 1: lost rank 0")))
    assert ends == [(rank_exit.End.ALONE, "PeerFailed")] and isinstance(out, PeerFailed)
    ends, out = _finish_ending_with(monkeypatch, _raises(MemoryError()))
    assert ends == [(rank_exit.End.ALONE, "DeviceOutOfMemory")] and isinstance(out, UserError) and out.step == 3
    ends, out = _finish_ending_with(monkeypatch, lambda: {"stopped_by_signal": False})
    assert ends == [(rank_exit.End.DONE, "NoneType")] and out["global_step"] == 2
    ends, out = _finish_ending_with(monkeypatch, _raises(RuntimeError("gloo: connection reset")))
    assert ends == [] and isinstance(out, RuntimeError)  # (a crash: the watcher stays, to name what it sees)
    # stopped with the others for a node whose launcher died (`node_loss`): the same agreed end, then exit 1
    ends, out = _finish_ending_with(monkeypatch, lambda: {"stopped_by_signal": True},
                                    [{"rank": 1, "host": "b", "ip": "10.0.0.2"}])
    assert ends == [(rank_exit.End.AGREED, "PeerFailed")] and isinstance(out, PeerFailed) and out.exit_code == 1
    assert str(out).startswith("rank 0: lost the node of rank 1 (host b, 10.0.0.2) while the ranks ran: ") and \
        "this node's rank 0 stopped too: stopped at step 2 and saved; re-run the same command" in str(out)
