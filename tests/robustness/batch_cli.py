"""Run many failing CLI calls in ONE interpreter, so Paddle is imported once instead of per case.

Usage: python batch_cli.py CASES.json RESULTS.json, where CASES.json is a list of
{"id", "argv", "cwd"}. Each call goes through `pretrain_cli.cli.main(argv)` exactly as
`python -m pretrain_cli` would, with file descriptors 1 and 2 redirected to per-case files (so
C-level output is captured too). An exception escaping `main` is printed as the interpreter
would print it (a traceback) and counts as exit code 1, like an uncaught exception in a process.
"""
import json
import os
import sys
import tempfile
import traceback


def run_one(argv, cwd):
    from pretrain_cli import cli

    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    saved = os.dup(1), os.dup(2)
    old_cwd = os.getcwd()
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    try:
        os.chdir(cwd)
        try:
            rc = cli.main(list(argv))
        except SystemExit as e:  # argparse
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            rc = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        os.chdir(old_cwd)
    out.seek(0)
    err.seek(0)
    return {"rc": rc, "stdout": out.read(), "stderr": err.read()}


def main():
    cases = json.load(open(sys.argv[1]))
    results = {c["id"]: run_one(c["argv"], c["cwd"]) for c in cases}
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
