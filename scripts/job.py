#!/usr/bin/env python
"""launch.sh's helper: `job.py ports -- CMD...` runs CMD holding a block of rendezvous ports;
`job.py decide DIR LAUNCHER_RC` prints the job's exit code and what to do next (`distributed/launcher/job.py`)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from pretrain_cli.distributed.launcher.job import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
