"""A node's launcher dead while the ranks train (`training.node_loss`): its ranks say so in the store before the stop's
agreement, and a rank whose own launcher lives reads it once the stop is agreed. Stand-ins for the store and for each
rank's tie to its launcher (`launch.launcher_gone`); the launched form: tests/distributed/test_launcher_death.py."""
from pretrain_cli.distributed.launcher import launch
from pretrain_cli.training import node_loss


class Comm:
    """`distributed.comms.comm.Comm`'s store methods over one dict all ranks share."""

    def __init__(self, rank, store, world=4):
        self.rank, self.world, self.store = rank, world, store

    def tally(self, name, n=0):
        self.store[name] = self.store.get(name, 0) + n
        return self.store[name]

    def publish(self, name, text):
        self.store[name] = text

    def read(self, name):
        return self.store[name]


def test_the_ranks_of_a_node_whose_launcher_died_are_read_by_the_others_and_named(monkeypatch):
    store, gone = {}, {2, 3}  # ranks 2-3: the node whose launcher died
    for rank in range(4):
        monkeypatch.setattr(launch, "launcher_gone", lambda r=rank: 30 if r in gone else None)
        monkeypatch.setenv("PADDLE_CURRENT_ENDPOINT", f"10.0.0.{rank // 2 + 1}:6170")
        monkeypatch.setattr(node_loss.socket, "gethostname", lambda r=rank: f"host{r // 2}")
        assert node_loss.report(Comm(rank, store), rank) == (rank in gone)
    monkeypatch.setattr(launch, "launcher_gone", lambda: None)
    lost = node_loss.lost(Comm(0, store))
    assert sorted(r["rank"] for r in lost) == [2, 3] and {r["ip"] for r in lost} == {"10.0.0.2"}
    saved = "stopped at step 32 and saved; re-run the same command to resume from checkpoint-32"
    line = node_loss.line(0, lost, [0, 1], saved)
    assert line == (
        "rank 0: lost the node of ranks 2, 3 (host host1, 10.0.0.2) while the ranks ran: its launcher died (killed, or "
        "its terminal or session closed), and its ranks stopped at their launcher's death; this node's ranks 0-1 "
        "stopped too: stopped at step 32 and saved; re-run the same command to resume from checkpoint-32. Exit 1: "
        "start that node again and re-run on every node (MAX_RESTART restarts this one under scripts/launch.sh)")
    monkeypatch.setattr(launch, "launcher_gone", lambda: 30)  # a rank of the lost node itself: its own loss, not named
    assert node_loss.lost(Comm(2, store)) == []


def test_nothing_is_said_or_read_when_every_launcher_lives_or_the_run_is_one_process(monkeypatch):
    store = {}
    monkeypatch.setattr(launch, "launcher_gone", lambda: None)  # a plain SIGTERM stop: no launcher died
    assert not node_loss.report(Comm(1, store), 1) and node_loss.lost(Comm(0, store)) == []
    assert not any(key.startswith("launcher_gone/") for key in store)
    monkeypatch.setattr(launch, "launcher_gone", lambda: 30)
    assert not node_loss.report(Comm(0, {}, world=1), 0)  # one process: no other node to tell
