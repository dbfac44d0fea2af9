#!/usr/bin/env python
"""`python -m paddle.distributed.launch` as launch.sh runs it: the same launcher, with the HTTP client's INFO
lines (`HTTP Request: GET …/healthy`, one per poll while a node waits for the others, at Paddle's INFO logging)
kept out of the console; the launcher's own lines follow `--log_level` as before.

Its exit code on a signal, too: Paddle's launcher stops its ranks and exits with the signal's number (2 for
SIGINT, 15 for SIGTERM), which collides with a usage error (2) and reads as a failure to retry (15); here it
becomes the shell's 130 / 143, which `job.py decide` stops on. A Ctrl-C while Paddle is still being imported (which
Paddle re-raises as an ImportError from the KeyboardInterrupt) is `error: interrupted`, 130, as the CLI's own, not a
traceback.

Several nodes (`--master ip:port --nnodes N`): the wait for the other nodes is limited to RENDEZVOUS_TIMEOUT seconds
(default 600) and said after 10 s (`distributed/launcher/rendezvous.py`); Paddle's own waits for ever, silently."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

if __name__ == "__main__":
    try:
        import logging
        import runpy
        import signal

        received = set()
        _install = signal.signal

        def _noting(signum, handler):
            """The launcher's handlers, noting which signal arrived before they run."""
            if signum in (signal.SIGINT, signal.SIGTERM) and callable(handler):
                def noted(num, frame, _handler=handler):
                    received.add(num)
                    return _handler(num, frame)

                return _install(signum, noted)
            return _install(signum, handler)

        signal.signal = _noting
        logging.getLogger("httpx").setLevel(logging.WARNING)  # paddle/distributed/launch/utils/kv_client.py polls
        sys.argv[0] = "paddle.distributed.launch"
        from pretrain_cli.distributed.launcher import rendezvous

        rendezvous.guard()
        try:
            runpy.run_module("paddle.distributed.launch", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            if isinstance(e.code, int) and e.code in received:
                sys.exit(128 + e.code)
            raise
    except Exception as e:  # Paddle's import turns a KeyboardInterrupt into an ImportError raised from it
        cause = e
        while cause is not None and not isinstance(cause, KeyboardInterrupt):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
