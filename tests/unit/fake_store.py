"""A stand-in for the launcher's TCP store (its `add` only), shared by ranks run as threads: the rank-0 rounds of
`distributed.comms.comm` and `training.rank_exit` run over it without a process group."""
import threading


class FakeStore:
    def __init__(self):
        self.values, self.lock = {}, threading.Lock()

    def add(self, key, n):
        with self.lock:
            self.values[key] = self.values.get(key, 0) + n
            return self.values[key]
