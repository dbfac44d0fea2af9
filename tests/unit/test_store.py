"""The TCP store clients without Paddle's two fixed waits (`distributed.comms.store`): a rank tries rank 0's port
until it listens (Paddle's client sleeps 3 s after a refused connect), and every client socket of a store is found
and sent without Nagle's delay (~40 ms a request otherwise)."""
from __future__ import annotations

import errno
import os
import socket

from pretrain_cli import runtime
from pretrain_cli.distributed.comms import store

paddle = runtime.import_paddle()


def _nodelay(sock) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_delay_finds_the_sockets_connected_to_the_store_and_only_those():
    with socket.socket() as server, socket.socket() as other:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        other.bind(("127.0.0.1", 0))
        other.listen(4)
        port = server.getsockname()[1]
        mine, elsewhere = socket.create_connection(("127.0.0.1", port)), socket.create_connection(other.getsockname())
        with mine, elsewhere:
            assert _nodelay(mine) == 0 and _nodelay(elsewhere) == 0  # Python's default, as Paddle's client's
            assert store.no_delay("127.0.0.1", port) == 1
            assert _nodelay(mine) == 1 and _nodelay(elsewhere) == 0
            mine.sendall(b"x")  # the socket is still open and usable: only a second descriptor of it was closed


def test_paddles_store_clients_are_found_and_still_answer():
    port = _free_port()
    core = paddle.base.core
    served = core.TCPStore("127.0.0.1", port, True, 0, 60)  # its own client connects too
    client = core.TCPStore("127.0.0.1", port, False, 0, 60)
    assert store.no_delay("127.0.0.1", port) == 2
    served.set("key", b"value")
    assert bytes(client.get("key")) == b"value"


def test_a_default_socket_timeout_leaves_every_socket_blocking():
    """A second descriptor shares the socket's O_NONBLOCK: Python's socket made from it under a default timeout set
    it on every socket of the process, and Paddle's blocking client then failed ("Resource temporarily unavailable")."""
    port, before = _free_port(), socket.getdefaulttimeout()
    core = paddle.base.core
    served = core.TCPStore("127.0.0.1", port, True, 0, 60)
    client = core.TCPStore("127.0.0.1", port, False, 0, 60)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        elsewhere = socket.create_connection(other.getsockname())
        try:
            socket.setdefaulttimeout(5.0)  # (some library's, or a user's sitecustomize)
            assert store.no_delay("127.0.0.1", port) == 2
        finally:
            socket.setdefaulttimeout(before)
        with elsewhere:
            assert os.get_blocking(elsewhere.fileno())  # not the store's: its flags untouched
    for key in range(20):  # each reply read by a blocking recv
        served.set(f"key{key}", b"value")
        assert bytes(client.get(f"key{key}")) == b"value"


def test_a_descriptor_reused_for_a_file_meanwhile_is_passed_over_and_left_open(monkeypatch, tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"kept")
    fd = os.open(path, os.O_RDONLY)
    readlink = os.readlink
    # /proc said a socket; by the time it is looked at, the number is a file's (another thread closed and opened)
    monkeypatch.setattr(store.os, "readlink", lambda p: "socket:[1]" if p == f"/proc/self/fd/{fd}" else readlink(p))
    try:
        assert store.no_delay("127.0.0.1", _free_port()) == 0
        assert os.pread(fd, 4, 0) == b"kept"  # only the second descriptor was closed
    finally:
        os.close(fd)


def test_a_rank_tries_the_port_until_it_listens(monkeypatch):
    port, pauses, listener = _free_port(), [], socket.socket()

    def sleep(seconds):  # the port starts listening during the third pause
        pauses.append(seconds)
        if len(pauses) == 3:
            listener.bind(("127.0.0.1", port))
            listener.listen(1)

    monkeypatch.setattr(store.time, "sleep", sleep)
    with listener:
        store.await_listening("127.0.0.1", port)
        assert pauses == [0.002, 0.004, 0.008]
        listener.settimeout(5)
        probe, _ = listener.accept()  # the probe that found it listening (closed again at once)
        probe.close()


def test_pauses_grow_to_a_tenth_of_a_second(monkeypatch):
    port, pauses, listener = _free_port(), [], socket.socket()

    def sleep(seconds):
        pauses.append(seconds)
        if len(pauses) == 9:
            listener.bind(("127.0.0.1", port))
            listener.listen(1)

    monkeypatch.setattr(store.time, "sleep", sleep)
    with listener:
        store.await_listening("127.0.0.1", port)
    assert pauses[-1] == store.LAST_PAUSE and max(pauses) == store.LAST_PAUSE and pauses[5] == 0.064


def test_a_rank_says_where_it_waits_as_paddles_client_did(monkeypatch, capsys):
    """Paddle's client wrote "Retry to connect to <host:port> ..." at each try: the one word in a rank's log of a
    store it cannot reach. The probe says so after SAY_AFTER s, then at doubling intervals."""
    port, clock, listener = _free_port(), [0.0], socket.socket()

    def sleep(seconds):  # the port starts listening 45 s in
        clock[0] += seconds
        if clock[0] >= 45 and listener.getsockname()[1] == 0:
            listener.bind(("127.0.0.1", port))
            listener.listen(1)

    monkeypatch.setattr(store.time, "sleep", sleep)
    monkeypatch.setattr(store.time, "monotonic", lambda: clock[0])
    with listener:
        store.await_listening("127.0.0.1", port)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("(")[1].split(" s ")[0] for line in lines] == ["10", "20", "40"]
    assert lines[0] == store.waiting_line("127.0.0.1", port, 10.0, errno.ECONNREFUSED)
    assert f"127.0.0.1:{port}" in lines[0] and "Connection refused" in lines[0]


def test_a_log_that_cannot_be_written_does_not_end_the_wait(monkeypatch):
    port, clock, listener = _free_port(), [0.0], socket.socket()

    class Gone:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")  # (launch.sh's reader of the rank's output gone)

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    def sleep(seconds):  # the port starts listening 15 s in, after the first line (10 s)
        clock[0] += seconds
        if clock[0] >= 15 and listener.getsockname()[1] == 0:
            listener.bind(("127.0.0.1", port))
            listener.listen(1)

    monkeypatch.setattr(store.sys, "stderr", Gone())
    monkeypatch.setattr(store.time, "sleep", sleep)
    monkeypatch.setattr(store.time, "monotonic", lambda: clock[0])
    with listener:
        store.await_listening("127.0.0.1", port)  # returns once it listens, as it would have said it waits
        assert clock[0] >= 15


def test_a_host_that_does_not_resolve_is_left_to_paddle(monkeypatch):
    def unresolved(*args, **kwargs):
        raise socket.gaierror("Name or service not known")

    monkeypatch.setattr(store.socket, "getaddrinfo", unresolved)
    monkeypatch.setattr(store.time, "sleep", lambda s: (_ for _ in ()).throw(AssertionError("waited")))
    store.await_listening("node0", 1234)  # returns at once: Paddle's own connect reports the name


def test_the_master_address_is_read_as_paddle_reads_it(monkeypatch):
    monkeypatch.setenv("PADDLE_TRAINER_ENDPOINTS", "10.0.0.2:6170,10.0.0.3:6170")
    monkeypatch.setenv("PADDLE_MASTER", "10.0.0.1:6000")
    assert store.master() == ("10.0.0.1", 6000)
    monkeypatch.setenv("PADDLE_MASTER", "")  # set, empty: Paddle's join refuses it (no endpoint to probe for ever)
    assert store.master() is None
    monkeypatch.delenv("PADDLE_MASTER")
    assert store.master() == ("10.0.0.2", 6170)
    monkeypatch.delenv("PADDLE_TRAINER_ENDPOINTS")
    assert store.master() is None


def test_without_an_address_the_join_is_left_to_paddle(monkeypatch):
    monkeypatch.delenv("PADDLE_MASTER", raising=False)
    monkeypatch.delenv("PADDLE_TRAINER_ENDPOINTS", raising=False)
    monkeypatch.setattr(store, "await_listening", lambda *a: (_ for _ in ()).throw(AssertionError("probed")))
    assert store.join_global(1) is None
