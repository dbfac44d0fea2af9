"""Under the semi-auto engine (ZeRO-3), a peer's death reaches a survivor as an `OSError` without an errno (Paddle's
`(External) RuntimeError: ... Connection reset by peer`). `cli.main` took it for the system's refusal (disk full):
one `error:` line, a "system" record of this rank's own end and exit 1 at once, so a `kill -9` of rank 3 under
Paddle's launcher run directly could show `Container rank 1 ... code 1` with no named cause, and launch.sh named the
survivor. It is the collective library's reaction to a lost peer, as a `RuntimeError` of gloo's is: no record of
its own (its host's watcher names the rank that died), raised as such. A system error that merely names gloo (a
path) is still the system's."""
import errno
import json

import pytest

from pretrain_cli import cli

RESET = ("(External) RuntimeError: [/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:576] Read error "
         "[127.0.0.1]:7073: Connection reset by peer")


def _main_raising(monkeypatch, tmp_path, error):
    monkeypatch.setenv("PRETRAIN_CLI_VERDICTS", str(tmp_path))

    def run(*args, **kwargs):
        raise error

    monkeypatch.setattr(cli, "_run", run)
    return lambda: cli.main(["train", "x.json"])


NCCL_LOST = ("(External) NCCL error(6), remote process exited or there was a network error. Detail: "
             "[Hint: 'ncclRemoteError'. A call failed possibly due to a network error or a remote process exiting "
             "prematurely.]")


@pytest.mark.parametrize("text", [RESET, NCCL_LOST], ids=["gloo-reset", "nccl-remote"])
def test_a_collective_error_raised_as_an_os_error_is_not_this_ranks_system_end(monkeypatch, tmp_path, capsys, text):
    """NCCL's words for a lost peer too (a GPU job's survivor), not only gloo's."""
    main = _main_raising(monkeypatch, tmp_path, OSError(text))
    with pytest.raises(OSError):
        main()
    assert not (tmp_path / "rank-0.json").exists()
    assert "error: system:" not in capsys.readouterr().err


def test_a_system_error_that_names_gloo_is_still_the_systems(monkeypatch, tmp_path, capsys):
    full = OSError(errno.ENOSPC, "No space left on device", "/data/gloo_corpus/out/checkpoint-4")
    assert _main_raising(monkeypatch, tmp_path, full)() == cli.OS_ERROR_EXIT_CODE
    rec = json.loads((tmp_path / "rank-0.json").read_text())
    assert (rec["kind"], rec["exit"]) == ("system", 1)
    assert "error: /data/gloo_corpus/out/checkpoint-4: No space left on device" in capsys.readouterr().err


NCCL_SETUP = ("(External) NCCL error(2), unhandled system error (run with NCCL_DEBUG=INFO for details). Detail: Error "
              "while creating shared memory segment /dev/shm/nccl-x (size 9637888)")


@pytest.mark.parametrize("error", [OSError(NCCL_SETUP), TimeoutError("timed out")], ids=["nccl-setup", "timeout"])
def test_an_os_error_without_peer_loss_words_is_this_ranks_system_end(monkeypatch, tmp_path, capsys, error):
    """Only a lost peer's words (reset or closed by peer, a broken pipe, gloo's tcp transport) make an errno-less
    OSError the collective library's: an NCCL setup failure on this rank (/dev/shm full) or a socket's timeout was
    raised unrecorded, with a traceback, since 4c7293b5 matched every 'nccl' and 'timed out'."""
    assert _main_raising(monkeypatch, tmp_path, error)() == cli.OS_ERROR_EXIT_CODE
    rec = json.loads((tmp_path / "rank-0.json").read_text())
    assert (rec["kind"], rec["exit"]) == ("system", 1)
    assert "error: " in capsys.readouterr().err
