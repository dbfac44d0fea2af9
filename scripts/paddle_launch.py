#!/usr/bin/env python
"""`python -m paddle.distributed.launch` as launch.sh runs it: the same launcher, with the HTTP client's INFO
lines (`HTTP Request: GET …/healthy`, one per poll while a node waits for the others, at Paddle's INFO logging)
kept out of the console; the launcher's own lines follow `--log_level` as before."""
import logging
import runpy
import sys

if __name__ == "__main__":
    logging.getLogger("httpx").setLevel(logging.WARNING)  # paddle/distributed/launch/utils/kv_client.py polls with httpx
    sys.argv[0] = "paddle.distributed.launch"
    runpy.run_module("paddle.distributed.launch", run_name="__main__", alter_sys=True)
