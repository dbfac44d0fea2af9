"""One module per `pretrain-cli` subcommand: its options and its `main`, nothing else.

Commands are the top layer: they call `config` to turn user input into a resolved run and hand
it to `training`, `planning` or `data`. None imports Paddle at module level, so `--help` and
input errors answer without Paddle's ~2.5 s import.
"""


def check_counts(ns, *names: str, minimum: int = 1) -> None:
    """Refuse an option below `minimum`, before any file is read: argparse checks only that it is an int, and a
    0 the user typed must never pass as "not given" (the way `ns.x or default` reads it) or reach a loop as a
    batch of nothing. An option left out (None) is not checked: its default applies."""
    from pretrain_cli.errors import UserError

    for name in names:
        value = getattr(ns, name)
        if value is not None and value < minimum:
            raise UserError(f"--{name}: must be >= {minimum}, got {value}")
