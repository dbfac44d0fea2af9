"""The product's log lines as its logger ("pretrain_cli") emits them, caught by a handler of its own: what reaches the
root through propagation is counted twice in the full suite, where an earlier test of the worker left the logger
chain holding a capture handler."""
from __future__ import annotations

import contextlib
import logging


@contextlib.contextmanager
def product_log_lines():
    """The list the product's INFO-and-above messages are appended to while inside."""
    logger, lines = logging.getLogger("pretrain_cli"), []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
