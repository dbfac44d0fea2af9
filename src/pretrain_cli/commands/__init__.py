"""One module per `pretrain-cli` subcommand: its options and its `main`, nothing else.

Commands are the top layer: they call `config` to turn user input into a resolved run and hand
it to `training`, `planning` or `data`. None imports Paddle at module level, so `--help` and
input errors answer without Paddle's ~2.5 s import.
"""
