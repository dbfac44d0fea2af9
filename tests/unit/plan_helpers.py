"""`plan`'s entry points as the tests read them: `plan --json`'s object and `plan --fit`'s result."""
from pretrain_cli.commands.plan import fitted, planned_run


def plan(*args, **kwargs) -> dict:
    """What `plan --json` prints (`commands.plan.planned_run(...).to_json()`)."""
    return planned_run(*args, **kwargs).to_json()


def fit(*args, **kwargs) -> dict:
    """What `plan --fit --json` prints (`commands.plan.fitted(...)`'s result)."""
    return fitted(*args, **kwargs)[1]
