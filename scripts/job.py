#!/usr/bin/env python
"""launch.sh's helper: `job.py ports -- CMD...` runs CMD holding a block of rendezvous ports;
`job.py decide DIR LAUNCHER_RC` prints the job's exit code and what to do next (`distributed/launcher/job.py`);
`job.py verdicts PID` makes the verdict directory of launch.sh (process PID) and prints it, removing those of launches
killed with SIGKILL first (`distributed/launcher/tempdirs.py`);
`job.py held OUTPUT_DIR` exits 2 with the run lock's refusal line when a live run holds OUTPUT_DIR
(`training/run_lock.py`: a layer the launcher's own module does not reach into); `job.py output_dir FILE` prints the
argument file's output_dir (empty when it has none or cannot be read: the ranks then name the file's problem), read
as the run reads it (`config/parser.py`: JSON or YAML by its name)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from pretrain_cli.distributed.launcher.job import main  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "output_dir":
        from pretrain_cli.config.parser import read_argument_file
        from pretrain_cli.errors import UserError

        try:
            print(read_argument_file(sys.argv[2]).get("output_dir") or "")
        except UserError:
            pass
        raise SystemExit(0)
    if len(sys.argv) == 3 and sys.argv[1] == "held":
        from pretrain_cli.training.run_lock import refusal

        line = refusal(sys.argv[2])
        if line:
            print(f"error: {line}", file=sys.stderr)
        raise SystemExit(2 if line else 0)
    raise SystemExit(main(sys.argv[1:]))
