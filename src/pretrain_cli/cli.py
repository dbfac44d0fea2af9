"""`pretrain-cli` entry point: routes a subcommand to its module; no logic of its own.

Subcommand modules are imported only when chosen, and none imports Paddle at module level,
so `--help` and errors about the argument file answer without Paddle's ~2.5 s import.
User errors (`UserError`) become one line per problem on stderr and exit code 2 (a mistyped command line: its one
usage line first, `CommandParser`); an `OSError` the system
raises (disk full, permission denied) becomes one line and exit code 1; `--debug` also shows
the traceback. The collective library's error on a lost peer (gloo's, which the semi-auto
engine raises as an `OSError` without an errno) is no end of this rank's own: raised, and
not recorded, whatever its type. A character a strict stdout or stderr cannot encode prints as a `\\uXXXX` escape
(`_printable_streams`).
"""
from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from pretrain_cli.errors import UserError, os_error_line
from pretrain_cli.runtime import PEER_LOST, collective_failure

# name -> (module, one-line help, takes an argument file + --key value overrides)
COMMANDS = {
    "train": ("pretrain_cli.commands.train", "train from a PaddleNLP-style JSON (or YAML) argument file", True),
    "check": ("pretrain_cli.commands.check", "validate an argument file and print the resolved run, without "
                                             "training", True),
    "plan": ("pretrain_cli.commands.plan", "memory, FLOPs and time before any GPU time; --fit: the fastest layout that "
                                           "fits", True),
    "train-tokenizer": ("pretrain_cli.commands.train_tokenizer", "train a byte-level BPE tokenizer on jsonl/txt "
                                                                 "files", False),
    "preprocess": ("pretrain_cli.commands.preprocess", "tokenize jsonl/txt into .bin/.idx token files", False),
    "inspect-data": ("pretrain_cli.commands.inspect_data", "validate and summarise a .bin/.idx token file pair", False),
    "merge-data": ("pretrain_cli.commands.merge_data", "join .bin/.idx token files into one pair", False),
    "eval": ("pretrain_cli.commands.eval", "loss and perplexity of a model on a token file", False),
    "generate": ("pretrain_cli.commands.generate", "generate text from a checkpoint or HF model directory", False),
    "export": ("pretrain_cli.commands.export", "any checkpoint-N (any layout) or final directory to a Hugging Face "
                                               "directory", False),
}

USAGE = """usage: pretrain-cli [--debug] <command> [options]

commands:
{commands}

Run `pretrain-cli <command> --help` for a command's options; `--debug` shows tracebacks.
"""


def _top_help() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, help_, _) in COMMANDS.items()]
    return USAGE.format(commands="\n".join(lines))


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser. Its usage is one line (the options are in `--help`), and a usage error is that line
    plus one `error:` line with exit 2 (`fail`, a `UserError`), the shape of every other input error; argparse's
    own `error` prints the whole usage block, which for most commands buries the one line that matters."""

    def finish(self) -> None:
        """Set the one-line usage (a module's own `usage` wins): positionals, required options, `[options]`."""
        if self.usage is not None:
            return
        words, optional = [self.prog], False
        for a in self._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            if a.option_strings and not a.required:
                optional = True
                continue
            value = a.metavar or a.dest.upper()
            value = {"+": f"{value}...", "*": f"[{value}...]", "?": f"[{value}]"}.get(a.nargs, value)
            words.append(f"{a.option_strings[0]} {value}" if a.option_strings else value)
        self.usage = " ".join(words + ["[options]"] * optional)

    def fail(self, message: str):
        """The usage line on stderr, then `message` as the `error:` line (cli._main prints it; exit 2)."""
        self.print_usage(sys.stderr)
        raise UserError(message)

    def error(self, message: str):  # argparse's hook for a missing, unknown or badly typed option
        self.fail(f"{message}; `{self.prog} --help` lists the options")

    def option_names(self) -> list[str]:
        return [s for a in self._actions for s in a.option_strings if s.startswith("--")]


def build_parser(name: str, prog: str | None = None) -> tuple[CommandParser, object, bool]:
    """The subcommand's parser; `prog`: the command as the user typed it, where it is not `pretrain-cli <name>`
    (`python scripts/run_pretrain.py` is `train`: its usage and errors name the script the user ran)."""
    module_name, help_, takes_config = COMMANDS[name]
    module = importlib.import_module(module_name)
    prog = prog or f"pretrain-cli {name}"
    usage = f"{prog} [config.json|config.yaml] [--key value ...]" if takes_config else None
    parser = CommandParser(prog=prog, description=help_, usage=usage, allow_abbrev=False)
    module.add_arguments(parser)
    parser.finish()
    return parser, module, takes_config


def _run(argv: list[str], prog: str | None = None) -> int:
    if argv and argv[0] in ("-h", "--help", "help"):
        print(_top_help())
        return 0
    if not argv:  # a usage error like any other: `pretrain-cli --help` describes the commands
        print(USAGE.splitlines()[0], file=sys.stderr)
        raise UserError(f"no command given; one of {', '.join(COMMANDS)} (`pretrain-cli --help` says what each does)")
    if argv[0] in ("-V", "--version"):
        from pretrain_cli import __version__

        print(f"pretrain-cli {__version__}")
        return 0
    name, tail = argv[0], argv[1:]
    if name not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"; did you mean `{close[0]}`?" if close else f"; commands: {', '.join(COMMANDS)}"
        raise UserError(f"unknown command {name!r}{hint}")
    parser, module, takes_config = build_parser(name, prog)
    _misspelt_options(parser, tail, takes_config or getattr(module, "TAKES_RUN_OVERRIDES", False))
    if takes_config:
        config = tail[0] if tail and not tail[0].startswith("-") else None
        rest = tail[1:] if config is not None else tail
        ns, overrides = parser.parse_known_args(rest)
        ns.config, ns.overrides = config, overrides
        listing = getattr(ns, "list_models", False) or getattr(ns, "help_keys", False)  # (check's, train's lists)
        if config is None and not overrides and not listing:  # a list needs no file
            parser.fail(f"no argument file given: `{parser.prog}` needs a JSON or YAML argument "
                        f"file (configs/demo_cpu.json, for one) or its keys as --key value")
    else:
        ns, overrides = parser.parse_known_args(tail)
        if overrides and not getattr(module, "TAKES_RUN_OVERRIDES", False):
            _no_training_keys(parser, overrides)
            parser.error(f"unrecognized arguments: {' '.join(overrides)}")
        ns.overrides = overrides
    if overrides:  # a misspelt option of the command is suggested as that, not as the nearest training key
        from pretrain_cli.config.parser import check_override_keys

        check_override_keys(overrides, parser.option_names())
    return int(module.main(ns) or 0)


def _misspelt_options(parser: CommandParser, tail: list[str], takes_keys: bool) -> None:
    """An unknown `--name` nearest one of the command's own options (`preprocess --input`, `--append-eos`), as
    `config.parser` names one among the training keys, before argparse answers "the following arguments are
    required: --input_path" or "unrecognized arguments" without the option meant. Training keys are left to the
    checks after parsing; a command that takes them (`takes_keys`) weighs them as candidates too."""
    import difflib

    from pretrain_cli.config.keys import KEYS
    from pretrain_cli.config.megatron_names import command_hint
    from pretrain_cli.config.paddlenlp_keys import ALIASES, IGNORED

    spelt = parser.option_names()  # every spelling the command takes (`--list-models` and `--list_models`)
    own = {o[2:].replace("-", "_"): o for o in spelt}
    # Megatron-LM's flags for what one of the command's own arguments says (`preprocess --vocab-file`: --tokenizer;
    # `inspect-data --data-path`: its positional prefix), before their nearest spelling (`--data_ranks`)
    flags = [t.split("=", 1)[0] for t in tail if t.startswith("--")]
    said = command_hint([f[2:] for f in flags if f not in spelt], own,
                        [a.dest for a in parser._actions if not a.option_strings], parser.prog)
    if said:
        raise UserError(f"command line: {said}")
    for token in tail:
        typed = token.split("=", 1)[0]
        key = typed[2:].replace("-", "_")
        if not typed.startswith("--") or typed in spelt or key in KEYS or key in ALIASES or key in IGNORED:
            continue
        names = [*own, *KEYS] if takes_keys else list(own)
        begun = [name for name in names if name.startswith(key)]
        close = begun if len(begun) == 1 else difflib.get_close_matches(key, names, n=1, cutoff=0.6)
        if close and close[0] in own:
            raise UserError(f"command line: unknown option `{typed}`; did you mean `{own[close[0]]}`?")


def _no_training_keys(parser: CommandParser, overrides: list[str]) -> None:
    """A training key on the command line of a command that takes none (`export`, `inspect-data`, ...) is named as
    one, as `eval` and `generate` name the training keys that change nothing they compute: `--learning_rate 3` is
    no typo of an option of the command, and the user may think it matters."""
    from pretrain_cli.config.keys import KEYS
    from pretrain_cli.config.paddlenlp_keys import IGNORED
    from pretrain_cli.config.parser import override_keys

    try:
        keys = [typed for typed, ours in override_keys(overrides) if ours in KEYS or ours in IGNORED]
    except UserError:  # (a value before any --key: argparse's own line)
        return
    if keys:
        one = len(keys) == 1
        parser.fail(f"{', '.join('--' + k for k in keys)}: {'a training key' if one else 'training keys'}, which "
                    f"`{parser.prog}` does not take (it changes nothing {parser.prog.split()[-1]} does); drop "
                    f"{'it' if one else 'them'} (`{parser.prog} --help` lists the options)")


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the command line `argv` (default: sys.argv's); `prog`: what the user ran, where it is not `pretrain-cli
    <command>` (scripts/run_pretrain.py: `python scripts/run_pretrain.py`, which runs `train`)."""
    _printable_streams()
    code = _main(argv, prog)
    from pretrain_cli import runtime

    if runtime.process_group_up():  # a launched rank: its exit code, without the teardown that can crash it
        runtime.end_process(code)
    return code


U_ESCAPE = "pretrain_cli.u_escape"  # the errors handler `_printable_streams` gives a strict stdout or stderr
# ... and a surrogateescape one: its escaped bytes written back as they were, every other character as U_ESCAPE does
U_ESCAPE_BYTES = "pretrain_cli.u_escape_bytes"


def _printable_streams() -> None:
    """A stream whose encoding cannot spell every character (`PYTHONIOENCODING=latin-1`, a legacy code page) would
    end a finished command in a UnicodeEncodeError traceback at the first such character printed (a prompt or a
    generated text in another script, a path): it prints as `\\u65e5` instead. A `surrogateescape` stream (a UTF-8
    locale's, PYTHONUTF8's, but also `PYTHONIOENCODING=ascii:surrogateescape` or the C locale's ASCII) keeps writing
    a path's undecodable bytes back as they were and escapes the rest the same way (it raised on 東京 in ASCII).
    stderr's own `backslashreplace` prints everything, but a path's undecodable bytes as `\\udce6` escapes (under the
    C locale every non-ASCII byte of a path is one): it gets U_ESCAPE_BYTES too, so an error line names the path as
    its bytes are."""
    import codecs

    codecs.register_error(U_ESCAPE, _u_escapes)
    codecs.register_error(U_ESCAPE_BYTES, _u_escapes_but_bytes)
    for stream in (sys.stdout, sys.stderr):
        # (a TextIOWrapper; a replaced stream may not be one)
        errors = getattr(stream, "errors", None) if hasattr(stream, "reconfigure") else None
        if errors in ("strict", "surrogateescape", "backslashreplace"):
            stream.reconfigure(errors=U_ESCAPE if errors == "strict" else U_ESCAPE_BYTES)


def _u_escapes_but_bytes(e: UnicodeError) -> tuple[str | bytes, int]:
    """`surrogateescape` for U+DC80..U+DCFF (a byte a path held that did not decode: written back as that byte),
    `_u_escapes` for the rest; one run of either kind at a time (the codec calls again for what is left)."""
    if not isinstance(e, UnicodeEncodeError):
        raise e
    text, end = e.object, e.start
    escaped = 0xDC80 <= ord(text[end]) <= 0xDCFF
    while end < e.end and (0xDC80 <= ord(text[end]) <= 0xDCFF) == escaped:
        end += 1
    if escaped:
        return bytes(ord(ch) - 0xDC00 for ch in text[e.start:end]), end
    return _u_escapes(UnicodeEncodeError(e.encoding, text, e.start, end, e.reason))


def _u_escapes(e: UnicodeError) -> tuple[str, int]:
    """What cannot be encoded as JSON's `\\uXXXX` escapes (a character above U+FFFF as its surrogate pair): still
    valid JSON where `--json` prints it inside a string (`ensure_ascii=False`), and readable in text, where Python's
    `backslashreplace` writes `\\U0001f680` and `\\xfc`, which JSON does not have."""
    if not isinstance(e, UnicodeEncodeError):
        raise e
    out = []
    for ch in e.object[e.start:e.end]:
        c = ord(ch)
        if c > 0xFFFF:  # UTF-16's surrogate pair
            c -= 0x10000
            out.append(f"\\u{0xD800 + (c >> 10):04x}\\u{0xDC00 + (c & 0x3FF):04x}")
        else:
            out.append(f"\\u{c:04x}")
    return "".join(out), e.end


def _main(argv: list[str] | None, prog: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        return _run(argv, prog)
    except UserError as e:
        if debug:
            traceback.print_exc()
        for line in e.lines:  # one line per problem (`check` reports every problem at once)
            print(f"error: {line}", file=sys.stderr)
        return _verdict(e.exit_code, e.kind, e.lines[0])
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return _verdict(130, "interrupted", "interrupted")
    except BrokenPipeError:
        return 0
    except OSError as e:  # the system refused (disk full, permissions, ...): not a bug, not the user's input
        if e.errno is None and _peer_lost(e):  # gloo's reaction to a lost peer (Paddle's `(External)` OSError,
            raise  # no errno): as the branch below says it, not as this rank's own end
        if debug:
            traceback.print_exc()
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        return _verdict(OS_ERROR_EXIT_CODE, "system", os_error_line(e))
    except Exception as e:  # a bug (its traceback follows), or the collective library giving up on a lost peer
        if not collective_failure(e):  # (a rank on another host: its watcher says so, from no record of this one's)
            line = next(iter(str(e).strip().splitlines()), "")
            _verdict(1, "crashed", f"{type(e).__name__}: {line}".rstrip(": ")[:300])
        raise


def _peer_lost(e: OSError) -> bool:
    """Whether an OSError without an errno is the collective library's word that a peer is gone (Paddle raises
    gloo's `Connection reset by peer` so under the semi-auto engine), a narrower test than `collective_failure`."""
    text = str(e).lower()
    return any(words in text for words in PEER_LOST)


def _verdict(code: int, kind: str, line: str) -> int:
    """A rank launched by scripts/launch.sh records how it ended, for the job's exit code
    (`distributed.launcher.job`)."""
    from pretrain_cli.distributed.launcher import job, launch

    job.record(launch.rank(), code, kind, line)
    return code


OS_ERROR_EXIT_CODE = 1


if __name__ == "__main__":
    raise SystemExit(main())
