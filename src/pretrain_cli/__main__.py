"""`python -m pretrain_cli` is the same as the `pretrain-cli` console script."""
from pretrain_cli.cli import main

raise SystemExit(main())
