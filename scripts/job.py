#!/usr/bin/env python
"""launch.sh's helper: `job.py ports -- CMD...` runs CMD holding a block of rendezvous ports
(`distributed/launcher/ports.py`); `job.py decide DIR LAUNCHER_RC` prints the job's exit code and what to do next
(`distributed/launcher/job.py`); `job.py cause DIR [LOG_DIR [FILE ARGS...]]` prints the console's account of the job's
end, once (`distributed/launcher/account.py`; the user's arguments give the output settings its re-run advice needs
where the launcher recorded a lone rank's death: `failure_report`);
`job.py verdicts PID` makes the verdict directory of launch.sh (process PID) and prints it, removing those of launches
killed with SIGKILL first (`distributed/launcher/tempdirs.py`);
`job.py held OUTPUT_DIR` exits 2 with the run lock's refusal line when a live run holds OUTPUT_DIR
(`training/run_lock.py`: a layer the launcher's own module does not reach into); `job.py output_dir FILE` prints the
argument file's output_dir (empty when it has none or cannot be read: the ranks then name the file's problem), read
as the run reads it (`config/parser.py`: JSON or YAML by its name); `job.py checkpoints OUTPUT_DIR [FILE ARGS...]`
prints each checkpoint-N output_dir holds, as name:inode:ctime (`rerun.identity`: launch.sh asks before its first
attempt, under MAX_RESTART; an overwrite's own checkpoint-8 is not the one of that name it removed); `job.py
restart OUTPUT_DIR BEFORE [FILE ARGS...]` prints the checkpoint a MAX_RESTART restart passes as resume_from_checkpoint
(an empty line: none), then what it starts from (`distributed/launcher/rerun.py`: it said "resuming from the newest
checkpoint" when output_dir held none), then the user's own output settings, which the restart's ranks name in their
re-run advice (`rerun.as_set`), then `keep-overwrite` where the restart keeps the user's overwrite_output_dir: true
(this job has written no checkpoint yet), else an empty line (launch.sh passes `--overwrite_output_dir false`). Both
read the user's arguments as the run does (`config/parser.parse_config`: `--resume_from_checkpoint null`,
`--resume-from-checkpoint`), output_dir from them over OUTPUT_DIR."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from pretrain_cli.distributed.launcher import account, job, ports  # noqa: E402

KEEP_OVERWRITE = "keep-overwrite"  # `restart`'s fourth line: launch.sh passes no `--overwrite_output_dir false`


def main(argv: list[str]) -> int:
    """`ports -- CMD...` (exec CMD holding a block of ports) | `decide DIR LAUNCHER_RC` (prints `CODE ACTION`) |
    `cause DIR [LOG_DIR [FILE ARGS...]]` (prints the account of the job's end) | `verdicts PID` (prints a new verdict
    directory for launch.sh, process PID: `tempdirs`) | `held OUTPUT_DIR` (exit 2 with the run lock's refusal) |
    `output_dir FILE` | `checkpoints OUTPUT_DIR [FILE ARGS...]` | `restart OUTPUT_DIR BEFORE [FILE ARGS...]` (module
    docstring)."""
    if argv[:2] == ["ports", "--"] and len(argv) > 2:
        try:
            ports.exec_with_ports(argv[2:])
        except OSError as e:  # no free block on this host, or the command cannot be run
            print(f"launch.sh: cannot start {argv[2]} holding a block of rendezvous ports: {e.strerror or e}; "
                  f"free ports in {ports.LOW}-{ports.HIGH} or their locks in {ports.lock_dir()}", file=sys.stderr)
            return 1
    if len(argv) == 2 and argv[0] == "output_dir":  # (empty when the file has none or cannot be read)
        from pretrain_cli.config.parser import read_argument_file
        from pretrain_cli.errors import UserError

        try:
            print(read_argument_file(argv[1]).get("output_dir") or "")
        except UserError:
            pass
        return 0
    if len(argv) >= 3 and argv[0] == "restart":
        resume, then, own, keep = _restart(argv[1], set(argv[2].split()), argv[3:])
        print(resume or "")
        print(then)
        print(own)
        print(KEEP_OVERWRITE if keep else "")
        return 0
    if len(argv) >= 2 and argv[0] == "checkpoints":
        from pretrain_cli.distributed.launcher.rerun import identities

        output_dir = _output_dir(argv[1], _arguments(argv[2:]))
        print(" ".join(identities(output_dir)) if output_dir else "")
        return 0
    if len(argv) == 2 and argv[0] == "held":
        from pretrain_cli.training.run_lock import refusal

        line = refusal(argv[1])
        if line:
            print(f"error: {line}", file=sys.stderr)
        return 2 if line else 0
    if len(argv) == 2 and argv[0] == "verdicts" and argv[1].isdigit():
        from pretrain_cli.distributed.launcher import tempdirs

        try:
            print(tempdirs.create(tempdirs.VERDICTS, int(argv[1])))
        except OSError as e:
            print(f"launch.sh: cannot make the job's verdict directory in TMPDIR ({tempfile.gettempdir()}): "
                  f"{e.strerror or e}; set TMPDIR to a writable directory", file=sys.stderr)
            return 1
        return 0
    if len(argv) == 3 and argv[0] == "decide":
        job.wait_for_watchers(argv[1])
        code, action = job.decide(argv[1], int(argv[2]))
        print(code, action)
        return 0
    if len(argv) >= 2 and argv[0] == "cause":
        line = account.cause(argv[1], argv[2] if len(argv) >= 3 else None, _settings(argv[3:]) if argv[3:] else None)
        if line:
            print(line)
        return 0
    print("usage: job.py ports -- CMD... | decide DIR LAUNCHER_RC | cause DIR [LOG_DIR [FILE ARGS...]] | verdicts PID "
          "| held OUTPUT_DIR | output_dir FILE | checkpoints OUTPUT_DIR [FILE ARGS...] "
          "| restart OUTPUT_DIR BEFORE [FILE ARGS...]", file=sys.stderr)
    return 2


def _arguments(args: list[str]):
    """The user's arguments (the argument file, then `--key value` overrides) as the run reads them
    (`config.parser.parse_config`, the record of a run's args.json as `train` takes it), or None where they do not
    parse (then the ranks said why, exit 2: no restart follows)."""
    from pretrain_cli.config.parser import parse_config

    args = [a for a in args if a != "--debug"]  # (the CLI's own option, taken out before the arguments are read)
    config = args[0] if args and not args[0].startswith("-") else None  # (as cli.main takes a command's file)
    try:
        return parse_config(config, args[1:] if config is not None else args, "user_arguments")
    except Exception:  # noqa: BLE001 (a UserError, or one the ranks met too)
        return None


def _settings(args: list[str]) -> tuple | None:
    """(output_dir, overwrite_output_dir, resume_from_checkpoint) of the user's arguments, for `cause`'s re-run advice;
    None where they do not parse."""
    arguments = _arguments(args)
    return None if arguments is None else (_output_dir("", arguments), *_output_settings(arguments))


def _output_settings(arguments) -> tuple[bool, str | None]:
    """(overwrite_output_dir is true, resume_from_checkpoint or None) of the user's parsed `arguments`: one reading
    for `cause`'s advice (`_settings`) and a restart's (`_restart`)."""
    named = arguments.get("resume_from_checkpoint")
    return arguments.get("overwrite_output_dir") is True, str(named) if named else None


def _output_dir(given: str, arguments) -> str | None:
    return (str(arguments.get("output_dir")) if arguments is not None and arguments.get("output_dir") else
            given or None)


def _restart(output_dir: str, before: set, args: list[str]) -> tuple[str | None, str, str, bool]:
    """(what a MAX_RESTART restart passes as resume_from_checkpoint, or None; what follows "restart k of N, to"; the
    user's own overwrite_output_dir and resume_from_checkpoint as JSON, for the ranks' re-run advice: `rerun.as_set`,
    empty where the arguments do not parse; whether it keeps the user's overwrite_output_dir: true): it
    runs with `--overwrite_output_dir false`, so it resumes from the checkpoint resume_from_checkpoint names, or from
    the newest of output_dir this job wrote past it (none of `before`, the checkpoint directories output_dir held
    when launch.sh began, by `rerun.identity`), else from output_dir's newest complete one, else starts from step 0;
    under the user's overwrite_output_dir: true, until this job wrote a checkpoint, it runs the user's command as
    typed, which starts over with the overwrite as the first attempt did (`rerun.restart`)."""
    from pretrain_cli.distributed.launcher import rerun

    import json

    arguments = _arguments(args)
    overwrite, named = _output_settings(arguments) if arguments is not None else (False, None)
    own = "" if arguments is None else json.dumps({"overwrite": overwrite, "resume_from": named})
    resume, then, keep = rerun.restart(_output_dir(output_dir, arguments), named, before, overwrite)
    return resume, then, own, keep


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
